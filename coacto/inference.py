"""One native inference with its offloading plan: the handle the communication engines drive.

Runtime.run covers local inference; a device's Client and the Server use NativeInference directly:
they set a per-tile plan, feed tiles that arrive from the network, take the tiles the runtime
decided to send, and learn of completions through the runtime's report queue (a file descriptor
zmq.Poller can wait on alongside the sockets).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from . import ir
from . import protocol as P
from .errors import CoactoError, InputError
from .native import NativeRuntime, check, ffi, lib, native_graph, read_tile_trace
from .tilegraph import TileGraph

SEND_NEVER = lib.COACTO_SEND_NEVER
SEND_ALWAYS = lib.COACTO_SEND_ALWAYS
SEND_DECIDE = lib.COACTO_SEND_DECIDE
REPORT_SEND = lib.COACTO_REPORT_SEND
REPORT_TILE = lib.COACTO_REPORT_TILE
REPORT_DONE = lib.COACTO_REPORT_DONE
#: The main thread's wait for an inference wakes this often to let Python run signal handlers:
#: Ctrl-C is seen within this much (plus the piece of work each computing thread is in); each
#: wake-up costs a few microseconds.
WAIT_SLICE_S = 0.01


def now() -> float:
    """The runtime's clock (seconds): the one offload parameters are expressed in."""
    return lib.coacto_now_seconds()


def tile_work(tg: TileGraph) -> np.ndarray:
    """FLOPs needed to produce each tile from the inputs (TilePlan.tile_work)."""
    return tg.plan.tile_work()


_MODE_NAMES = {v: k for k, v in P.TRANSFER_MODES.items()}


def wire_ratios(tg: TileGraph, mode: str, feeds: dict | None = None) -> np.ndarray:
    """Per layer: the bytes its tiles take encoded in ``mode`` per raw byte, from one local
    inference on ``feeds`` (default: the graph's example inputs; cached per mode then). What a
    client learns from its own inferences; the simulator prices tiles with it."""
    cache = tg.plan.memoised("wire_ratios", dict)
    if feeds is None and mode in cache:
        return cache[mode]
    with NativeInference(NativeRuntime(1), tg) as ni:
        ni.set_transfer(mode, measure=True)
        ni.set_inputs(feeds if feeds is not None else tg.example_feeds())
        ni.wait()
        raw, enc = ni.wire_bytes()
    ratio = np.where(raw > 0, enc / np.maximum(raw, 1), 1.0)
    if feeds is None:
        cache[mode] = ratio
    return ratio


class ReportQueue:
    """The runtime's report queue: poll `fd`, then `take()` the reports."""

    def __init__(self, rt: NativeRuntime):
        self._rt = rt
        self.fd = lib.coacto_runtime_report_fd(rt.handle)
        self._buf = ffi.new("coacto_report[]", 1024)

    def take(self) -> list[tuple[int, int, int]]:
        """Pending reports as (tag, kind, tile) tuples (tile -1 for REPORT_DONE)."""
        out = []
        while True:
            n = lib.coacto_runtime_take_reports(self._rt.handle, self._buf, 1024)
            out.extend((int(self._buf[i].tag), int(self._buf[i].kind), int(self._buf[i].tile))
                       for i in range(n))
            if n < 1024:
                return out


class NativeInference:
    """A coacto_inference: created, planned, fed, waited on, read, destroyed (close)."""

    def __init__(self, rt: NativeRuntime, tg: TileGraph, tag: int = 0):
        self.handle = None
        self.tg = tg
        self.rt = rt  # keeps the threads alive while this inference exists
        self.native = native_graph(tg)
        self.tag = tag
        self.transfer = "raw"
        out = ffi.new("coacto_inference **")
        check(lib.coacto_inference_create(rt.handle, self.native.handle, out), "creating an inference")
        self.handle = out[0]

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        if self.handle is not None:
            lib.coacto_inference_destroy(self.handle)
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    # -------------------------------------------------------------- plan

    def set_plan(self, local=None, send=None, report=None) -> None:
        n = self.tg.n_tiles

        def mask(a):
            if a is None:
                return ffi.NULL, None
            arr = np.ascontiguousarray(a, dtype=np.uint8)
            if arr.shape != (n,):
                raise CoactoError(f"a tile plan needs {n} entries, got shape {arr.shape}")
            return ffi.from_buffer("uint8_t[]", arr), arr

        (lp, _l), (sp, _s), (rp, _r) = mask(local), mask(send), mask(report)
        if send is not None or local is not None:
            self.native.ensure_work(tile_work(self.tg))
        check(lib.coacto_inference_set_plan(self.handle, lp, sp, rp, self.tag), "setting the tile plan")

    def set_inplace(self, on: bool = True) -> None:
        """Layers the graph found safe for it write their output into their residual input's
        buffer (coacto_inference_set_inplace): less memory touched, as onnxruntime and OpenVINO
        do. Only for an inference computed entirely here: it then takes no tiles from outside."""
        check(lib.coacto_inference_set_inplace(self.handle, 1 if on else 0), "setting in-place residuals")

    def set_offload_params(self, bandwidth: float, rtt: float, inputs_at_server: float,
                           server_flops: float, alpha: float = 1.0) -> None:
        p = ffi.new("coacto_offload_params *")
        p.bandwidth, p.rtt, p.inputs_at_server = float(bandwidth), float(rtt), float(inputs_at_server)
        p.server_flops, p.alpha = float(server_flops), max(1.0, float(alpha))
        check(lib.coacto_inference_set_offload_params(self.handle, p), "setting offload parameters")

    def enable_trace(self) -> None:
        """Record every tile computed here (start, end, worker) and every send decision with its
        two completion times; before the first input is set."""
        check(lib.coacto_inference_enable_trace(self.handle), "enabling the inference's trace")

    def tile_trace(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, worker) per tile, seconds on ``now()``'s clock; worker -1: not computed here."""
        return read_tile_trace(lib.coacto_inference_tile_trace, self.handle, self.tg.n_tiles,
                               "reading the inference's trace (enable_trace first)")

    def decisions(self) -> list[dict]:
        """The send decisions in the order made: tile, sent, time and both completion times."""
        n = self.tg.n_tiles
        buf = ffi.new("coacto_decision[]", max(n, 1))
        k = lib.coacto_inference_decisions(self.handle, buf, n)
        return [{"tile": buf[i].tile, "sent": bool(buf[i].sent), "time": buf[i].time,
                 "ect_offloaded": buf[i].ect_offloaded, "ect_server": buf[i].ect_server}
                for i in range(k)]

    def compute_all(self, rest_last: bool = False) -> None:
        """Fallback: compute every remaining tile here. ``rest_last``: the tiles outside the
        plan's local set only when none of its own is ready (coacto_inference_compute_rest)."""
        fn = lib.coacto_inference_compute_rest if rest_last else lib.coacto_inference_compute_all
        check(fn(self.handle), "falling back to local computation")

    # -------------------------------------------------------------- data

    def set_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        """Gives the runtime the inputs in ONNX layout; it transposes them into its own (NHWC)
        while copying, faster than numpy's strided copy and without a temporary."""
        g = self.tg.graph
        for name in feeds:
            if name not in g.inputs:
                raise InputError(f"unknown input {name!r}")
        # in layer order, whatever the caller's: the inputs' tiles are queued to send as they
        # are set, and the cost model (policies.inputs_cost) prices them in that order
        for name in sorted(feeds, key=g.inputs.__getitem__):
            arr = feeds[name]
            layer = g.layers[g.inputs[name]]
            if layer.layout == ir.LAYOUT_CHANNELS:  # NCHW -> position-major storage, in C
                data = np.ascontiguousarray(arr, dtype=np.float32)
                st = lib.coacto_inference_set_input_nchw(self.handle, g.inputs[name],
                                                         ffi.from_buffer("float[]", data), data.size)
            else:  # rows on the last axis: the storage is the ONNX layout
                data = ir.to_storage(np.asarray(arr, dtype=np.float32), layer.layout)
                st = lib.coacto_inference_set_input(self.handle, g.inputs[name],
                                                    ffi.from_buffer("float[]", data), data.size)
            check(st, f"setting input {name!r}")

    def put_tiles(self, ids: np.ndarray, data: np.ndarray) -> tuple[int, int]:
        """Completes tiles from outside (one native call for the batch); returns (accepted,
        duplicates). Bad ids or sizes raise InputError and apply nothing."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        data = np.ascontiguousarray(data, dtype=np.float32).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.tg.n_tiles):
            raise InputError("tile ids out of range")
        need = self._floats(ids)
        if need != data.size:
            raise InputError(f"tile data has {data.size} floats, the tiles need {need}")
        counts = ffi.new("int32_t[2]")
        st = lib.coacto_inference_put_tiles(self.handle, ffi.from_buffer("int32_t[]", ids), ids.size,
                                            ffi.from_buffer("float[]", data) if data.size else ffi.NULL,
                                            data.size, counts, counts + 1)
        if st != lib.COACTO_ERR_CANCELLED:
            check(st, "completing tiles")
        return int(counts[0]), int(counts[1])

    def set_transfer(self, mode: str, measure: bool = False) -> None:
        """Encode sent tiles in `mode` (protocol.TRANSFER_MODES; the send rule prices each tile at
        its encoded size); `measure` also sums per layer the raw and encoded bytes of every tile
        completed here (wire_bytes). Before the first input is set."""
        code = P.TRANSFER_MODES.get(mode)
        if code is None:
            raise InputError(f"unknown transfer mode {mode!r}: use one of "
                             f"{', '.join(P.TRANSFER_MODES)}")
        check(lib.coacto_inference_set_transfer(self.handle, code, int(bool(measure))),
              "setting the transfer mode")
        if mode in P.LOSSY_TRANSFERS:  # integer inputs (token ids, masks) travel exact
            for li in self.tg.graph.inputs.values():
                if ir.integer_input(self.tg.graph.layers[li]):
                    check(lib.coacto_inference_set_layer_transfer(
                        self.handle, li, P.TRANSFER_MODES["lossless"]), "setting a layer's mode")
        self.transfer = mode

    def wire_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per layer: (raw, encoded) bytes of the tiles completed here (set_transfer measure)."""
        n = len(self.tg.graph.layers)
        raw, enc = np.zeros(n, np.int64), np.zeros(n, np.int64)
        check(lib.coacto_inference_wire_bytes(self.handle, ffi.from_buffer("int64_t[]", raw),
                                              ffi.from_buffer("int64_t[]", enc), n),
              "reading the wire sizes (set_transfer(measure=True) first)")
        return raw, enc

    def take_sends_encoded(self, max_bytes: int, max_tiles: int = 4096):
        """Queued tiles to send, encoded: (mode name, ids int32, lens int32, data uint8), up to
        max_bytes of data (one tile alone if it is larger), all of one mode (integer inputs go
        lossless under a lossy mode)."""
        ids = np.empty(max_tiles, dtype=np.int32)
        lens = np.empty(max_tiles, dtype=np.int32)
        data = np.empty(max(1, max_bytes), dtype=np.uint8)
        used = ffi.new("int64_t *")
        mode = ffi.new("int32_t *")
        take = lib.coacto_inference_take_sends_encoded
        n = take(self.handle, ffi.from_buffer("int32_t[]", ids), ffi.from_buffer("int32_t[]", lens),
                 max_tiles, ffi.from_buffer("uint8_t[]", data), data.size, used, mode)
        if n == 0 and self.queued_bytes() > max_bytes:  # the next tile alone is larger
            return self.take_sends_encoded(self.queued_bytes(), 1)
        return _MODE_NAMES[mode[0]], ids[:n], lens[:n], data[:used[0]]

    def put_tiles_encoded(self, mode: str, ids: np.ndarray, lens: np.ndarray, data) -> tuple[int, int]:
        """put_tiles from tiles encoded in `mode`; bad ids, lengths or bitmaps raise InputError
        and apply nothing."""
        code = P.TRANSFER_MODES.get(mode)
        if code is None:
            raise InputError(f"unknown transfer encoding {mode!r}")
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        lens = np.ascontiguousarray(lens, dtype=np.int32)
        data = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        if ids.shape != lens.shape:
            raise InputError(f"{ids.size} tile ids but {lens.size} lengths")
        counts = ffi.new("int32_t[2]")
        st = lib.coacto_inference_put_tiles_encoded(
            self.handle, code, ffi.from_buffer("int32_t[]", ids), ffi.from_buffer("int32_t[]", lens),
            ids.size, ffi.from_buffer("uint8_t[]", data) if data.size else ffi.NULL, data.size,
            counts, counts + 1)
        if st == lib.COACTO_ERR_INVALID_ARGUMENT:
            raise InputError("encoded tiles do not match their ids: lengths, bitmaps or scales")
        if st != lib.COACTO_ERR_CANCELLED:
            check(st, "completing tiles")
        return int(counts[0]), int(counts[1])

    def get_tiles_encoded(self, mode: str, ids) -> tuple[np.ndarray, np.ndarray]:
        """get_tiles encoded in `mode`: (lens int32, data uint8)."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        lens = np.empty(ids.size, dtype=np.int32)
        out = np.empty(4 * self._floats(ids) + 4 * ids.size + 1, dtype=np.uint8)
        used = ffi.new("int64_t *")
        if ids.size:
            check(lib.coacto_inference_get_tiles_encoded(
                self.handle, P.TRANSFER_MODES[mode], ffi.from_buffer("int32_t[]", ids), ids.size,
                ffi.from_buffer("int32_t[]", lens), ffi.from_buffer("uint8_t[]", out), out.size,
                used), "reading tiles")
        return lens, out[:used[0]]

    def take_sends(self, max_bytes: int = 1 << 20, max_tiles: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """Queued tiles to send (shallowest first): (ids int32, data float32)."""
        ids = np.empty(max_tiles, dtype=np.int32)
        data = np.empty(max(1, max_bytes // 4), dtype=np.float32)
        used = ffi.new("int64_t *")
        n = lib.coacto_inference_take_sends(self.handle, ffi.from_buffer("int32_t[]", ids), max_tiles,
                                            ffi.from_buffer("float[]", data), data.size, used)
        if n == 0 and self.queued_bytes() > max_bytes:  # the next tile alone is larger
            return self.take_sends(self.queued_bytes(), 1)
        return ids[:n], data[:used[0]]

    def queued_bytes(self) -> int:
        return int(lib.coacto_inference_queued_bytes(self.handle))

    def get_tiles(self, ids) -> np.ndarray:
        """The data of completed output tiles, concatenated in ids order (one native call)."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        out = np.empty(self._floats(ids), dtype=np.float32)
        if ids.size:
            check(lib.coacto_inference_get_tiles(self.handle, ffi.from_buffer("int32_t[]", ids),
                                                 ids.size, ffi.from_buffer("float[]", out), out.size),
                  "reading tiles")
        return out

    def _floats(self, ids: np.ndarray) -> int:
        """Floats of the given tiles together (the plan's output bytes / 4)."""
        return int(self.tg.plan.tile_bytes[ids].sum()) // 4

    def computed_mask(self) -> np.ndarray:
        """Which tiles this runtime's computing threads computed (bool per tile)."""
        n = self.tg.n_tiles
        out = np.zeros(n, np.uint8)
        check(lib.coacto_inference_computed_mask(self.handle, ffi.from_buffer("uint8_t[]", out),
                                                 n), "reading which tiles were computed")
        return out.astype(bool)

    def tile_state(self, tile: int) -> int:
        return int(lib.coacto_inference_tile_state(self.handle, tile))

    def wait(self, timeout: float | None = None) -> None:
        """Until the inference is done (raises its error, InferenceTimeout after ``timeout``
        seconds, InferenceCancelled once cancelled). On the main thread it waits in slices of
        WAIT_SLICE_S: Python runs signal handlers (Ctrl-C's KeyboardInterrupt) only between
        bytecodes, never inside one long native wait."""
        if threading.current_thread() is not threading.main_thread():
            forever = timeout is None
            check(lib.coacto_inference_wait(self.handle, -1.0 if forever else float(timeout)),
                  "running the inference")
            return
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S,
                                                             max(0.0, deadline - time.monotonic()))
            st = lib.coacto_inference_wait(self.handle, left)
            if st != lib.COACTO_ERR_TIMEOUT or (deadline is not None and left < WAIT_SLICE_S):
                check(st, "running the inference")
                return

    def failure(self) -> str | None:
        """Why the inference failed (out of memory, ...), or None while it is fine."""
        st = lib.coacto_inference_wait(self.handle, 0.0)
        if st in (lib.COACTO_OK, lib.COACTO_ERR_TIMEOUT, lib.COACTO_ERR_CANCELLED):
            return None
        return ffi.string(lib.coacto_status_string(st)).decode()

    def done(self) -> bool:
        return lib.coacto_inference_wait(self.handle, 0.0) == lib.COACTO_OK

    def cancel(self) -> None:
        lib.coacto_inference_cancel(self.handle)

    def outputs(self) -> dict[str, np.ndarray]:
        g = self.tg.graph
        results, fetched = {}, {}
        for name, li in g.outputs.items():
            if li not in fetched:
                layer = g.layers[li]
                buf = np.empty(self.native.layer_floats[li], dtype=np.float32)
                check(lib.coacto_inference_get_output(self.handle, li, ffi.from_buffer("float[]", buf),
                                                      buf.size), f"reading output {name!r}")
                fetched[li] = ir.from_storage(buf, layer.shape, layer.onnx_shape, layer.layout)
                results[name] = fetched[li]
            else:
                results[name] = fetched[li].copy()
            if name in g.output_dtypes:
                results[name] = ir.output_as(results[name], g.output_dtypes[name])
        return results

    def stats(self) -> dict:
        s = ffi.new("coacto_inference_stats *")
        lib.coacto_inference_get_stats(self.handle, s)
        return {"tiles_total": s.tiles_total, "tiles_computed": s.tiles_computed,
                "tiles_external": s.tiles_external, "tiles_dropped": s.tiles_dropped,
                "tiles_sent": s.tiles_sent, "bytes_sent": s.bytes_sent,
                "bytes_sent_raw": s.bytes_sent_raw, "seconds": s.seconds,
                "peak_activation_bytes": s.peak_bytes, "busy_seconds": s.busy_seconds}
