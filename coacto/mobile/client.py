"""coacto.Client: run a model on this device together with a coacto server.

    import coacto
    with coacto.Client("tcp://server:5555", "model.onnx", policy="dynamic") as client:
        outputs = client.infer({"data": image})      # {output name: array}, as onnxruntime's
        print(client.last_stats["latency_s"], client.last_stats["tiles_from_server"])

The device always holds the whole tile graph and can always finish alone: a server that is down,
stalls, errs or sits behind a collapsed link costs at most ``timeout`` seconds of waiting, never a
lost inference (the stats then say ``fallback: true``).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future

import numpy as np

from .. import protocol as P
from ..errors import CoactoError, ModelError
from ..inference import now
from ..partition import OFFLOAD_MIN_COLUMN_BLOCKS
from ..runtime import NodeArg, Runtime, graph_inputs, graph_outputs, output_selection, \
    select_outputs
from ..tilegraph import MAGIC, TileGraph
from . import policies
from .engine import Engine
from .estimates import Estimates
from .jobs import Job
from .trace import TraceRecord
from .shaper import UNCAPPED, TokenBucket, parse_rate, parse_schedule

log = logging.getLogger(__name__)


class ServerUnavailable(CoactoError):
    """No usable server (unreachable, not answering, or unable to run this model) when one was
    required (Client.connect). Inferences never raise it: they finish on the device."""


class ServerVersionError(ServerUnavailable):
    """The server speaks another protocol version; install matching coacto versions."""


def _recorder(client_ref):
    def record(stats: dict) -> None:
        client = client_ref()
        if client is not None:
            client.last_stats = stats
    return record


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _release(engine, runtime, local_runtime) -> None:
    engine.close()
    runtime.close()
    local_runtime.close()


def normalize_address(server: str) -> str:
    """'host:port' or a ZeroMQ endpoint -> a ZeroMQ endpoint. A tcp port must lie in 1..65535:
    libzmq would connect to port 99999 modulo 65536 (34463) without a word."""
    if not isinstance(server, str) or not server.strip():
        raise CoactoError(f"the server address must be a string like tcp://host:5555, "
                          f"got {server!r}")
    server = server.strip()
    scheme, sep, rest = server.partition("://")
    if sep and scheme != "tcp":
        return server  # ipc://, inproc://, ...: no port to check
    host, colon, port = (rest if sep else server).rpartition(":")
    if not colon or not host or not port.isdigit():
        raise CoactoError(f"cannot read server address {server!r}: write tcp://host:5555 or "
                          "host:5555 (a port number after the last ':')")
    if not 1 <= int(port) <= 65535:
        raise CoactoError(f"server address {server!r}: port {port} is not from 1 to 65535")
    return f"tcp://{host}:{int(port)}"


def resolve_model(model, tiles_per_layer=None, input_shapes=None, model_bytes=None,
                  min_column_blocks: int = OFFLOAD_MIN_COLUMN_BLOCKS):
    """(TileGraph, ONNX bytes or None) from an ONNX path/bytes/ModelProto, a TileGraph or a .ctg."""
    from ..compiler import compile as compile_model
    from ..frontend import load_model

    def onnx_bytes(src):
        return None if src is None else load_model(src)[1]

    if isinstance(model, TileGraph):
        tg, data = model, onnx_bytes(model_bytes)
    elif isinstance(model, (str, os.PathLike)) and str(model).endswith(".ctg") or \
            isinstance(model, (bytes, bytearray)) and bytes(model[:8]) == MAGIC:
        tg = TileGraph.load(model) if not isinstance(model, (bytes, bytearray)) else \
            TileGraph.from_bytes(bytes(model))
        data = onnx_bytes(model_bytes)
    else:
        _, data = load_model(model)
        # A graph for offloading: image layers keep enough column blocks for the server to start
        # on the first rows of the input while the rest is on the way.
        tg = compile_model(data, tiles_per_layer=tiles_per_layer, input_shapes=input_shapes,
                           min_column_blocks=min_column_blocks)
        return tg, data
    if data is not None:
        import hashlib

        if hashlib.sha256(data).hexdigest() != tg.model_hash:
            raise ModelError("model_bytes is not the ONNX model this tile graph was compiled from "
                             "(sha256 differs); pass the same .onnx file")
    return tg, data


def local_graph_of(tg: TileGraph, threads: int) -> TileGraph:
    """The graph a device computes alone on: ``tg``'s model cut as coacto.compile cuts it for
    ``threads`` local threads (no minimum of column blocks; the tile counts a user gave ``tg``
    kept), on ``tg``'s packed weights."""
    from ..compiler import repartition

    layer_tiles = tg.params.get("layer_tiles")
    return repartition(tg, tiles_per_layer=tg.params.get("tiles_per_layer"),
                       layer_tiles={int(k): int(v) for k, v in layer_tiles.items()}
                       if layer_tiles else None, threads=threads)


#: Scheduling priority of the device's computing threads, below the communication engine's.
WORKER_NICE = 10


def curve_keys(server_key, client_key):
    """(server public, own public, own secret) Z85 keys for the client's socket, from the
    arguments or the environment; None when neither is given (a server without keys)."""
    from .. import keys as K

    server_key = server_key if server_key is not None else K.from_env(K.ENV_SERVER_KEY)
    client_key = client_key if client_key is not None else K.from_env(K.ENV_CLIENT_KEY)
    if server_key is None and client_key is None:
        return None
    if server_key is None or client_key is None:
        raise CoactoError("a server with keys needs both the server's public key (server_key, "
                          "--server-key, $COACTO_SERVER_KEY) and this device's secret key "
                          "(client_key, --client-key, $COACTO_CLIENT_KEY); "
                          + K.HOW_TO_MAKE)
    own_public, own_secret = K.load_pair(client_key, "device's secret key (client_key)")
    return K.load_public(server_key, "server's public key (server_key)"), own_public, own_secret


class Client:
    """A device-side handle on a model, offloading to ``server`` (None: local only).

    ``model``: an ONNX file path, bytes or ModelProto (compiled with ``tiles_per_layer`` and
    ``input_shapes``), or a TileGraph / .ctg file (then ``model_bytes``, the ONNX file, is needed
    only if the server must be sent the model). ``threads``: computing threads here (default: the
    CPUs this process may use). ``policy``: local, cloud, split, fl or dynamic (see
    coacto.mobile.policies). ``bandwidth``: cap this client's link (``"20mbit"``,
    ``"2.5MB/s"``: see shaper.parse_rate; a number is bits/s; inference traffic only, not the
    one-time model upload); it is also the goodput assumed until one is measured (else 10 Mbit/s, see estimates.py). A schedule
    (``"100mbit,5mbit@2.5"``: 5 Mbit/s from 2.5 s after the client is made) changes the cap over
    time, as does ``set_bandwidth`` (the estimates are not told: they measure it). ``rtt_ms``: add
    this round-trip delay to the link (half each way, after the cap; the experiments' stand-in
    for a kernel without `netem`). ``timeout``: seconds
    of silence after which the device stops waiting for the server. ``device_flops``: this device's
    FLOP/s on the model, fixed (default: measured by local runs when a policy first needs it,
    or by ``calibrate``, and learnt from every inference the device computes whole).
    With a server the model is held as two tile graphs on one copy of the packed weights:
    ``graph`` for offloading and ``local_graph``, cut for local speed on ``threads``, for what
    the device computes alone (docs/SCHEDULER.md, "Two graphs").
    ``split_layer`` / ``fl_layer`` / ``device_share``: fix the split point or the fused stack
    instead of choosing them from the estimates. ``trace``: a path; every inference then writes a
    merged trace of both sides there (see ``infer_async``). ``transfer``: how tile data travels to
    the server: ``"lossless"`` (default: the zeros of each tile masked out, bit-exact),
    ``"f16"`` or ``"int8"`` (lossy: half floats, or bytes with a scale per tile; the outputs
    then differ from onnxruntime's by what the rounding of the sent tiles causes) or ``"raw"``
    (float32 as computed). Results come back lossless. The scheduler prices every tile at the
    bytes it will really take. ``server_key`` (the server's public key: its .key file or the
    40-character Z85 text) and ``client_key`` (this device's .key_secret file from
    ``coacto keygen``) encrypt and authenticate the connection with CurveZMQ; the environment
    variables COACTO_SERVER_KEY and COACTO_CLIENT_KEY stand in for them (docs/SECURITY.md).
    """

    def __init__(self, server, model, threads: int | None = None, policy: str = "dynamic",
                 bandwidth=None, timeout: float = 5.0, tiles_per_layer: int | None = None,
                 input_shapes: dict | None = None, *, model_bytes=None,
                 device_flops: float | None = None, split_layer: int | None = None,
                 fl_layer: int | None = None, device_share: float | None = None, name=None,
                 trace=None, rtt_ms: float = 0.0, transfer: str = "lossless",
                 server_key=None, client_key=None):
        self.policy = self._check_policy(policy)
        curve = curve_keys(server_key, client_key) if server is not None else None
        if not isinstance(transfer, str) or transfer not in P.TRANSFER_MODES:
            raise CoactoError(f"transfer must be one of {', '.join(P.TRANSFER_MODES)}, got "
                              f"{transfer!r}")
        self.transfer = transfer
        self.trace = self._check_trace(trace)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise CoactoError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        steps = parse_schedule(bandwidth) if bandwidth is not None else []
        rate = steps[0][1] if steps else None
        self.bandwidth = rate
        if not (isinstance(rtt_ms, (int, float)) and 0 <= rtt_ms < 60_000):
            raise CoactoError(f"rtt_ms must be a number of milliseconds from 0 to 60000, got "
                              f"{rtt_ms!r}")
        self.rtt_ms = float(rtt_ms)
        address = normalize_address(server) if server is not None else None
        if address is None and self.policy != "local":
            raise CoactoError(f"policy {self.policy!r} needs a server address; pass server=None "
                              "only with policy='local'")
        self.server = address
        # without a server, the partition for local speed
        self.graph, self.model_bytes = resolve_model(
            model, tiles_per_layer, input_shapes, model_bytes,
            OFFLOAD_MIN_COLUMN_BLOCKS if address is not None else 0)
        if address is not None:
            from ..compiler import check_offloadable

            check_offloadable(self.graph, ModelError)
        before = _thread_ids()
        self._runtime = Runtime(self.graph, threads)
        # Computing never delays the communication engine: on a device whose CPU is the
        # bottleneck a tile sent or a result taken a few ms late costs more than a tile
        # computed a few ms late (the engine's thread keeps the default priority).
        try:
            self._runtime._rt.set_worker_nice(WORKER_NICE)
        except CoactoError as e:  # e.g. a sandbox that forbids it: run at equal priority
            log.debug("computing threads keep their priority: %s", e)
        #: OS thread ids of this client's computing threads (Linux; empty elsewhere): experiments
        #: that emulate a slower device throttle these alone (see coacto-client --compute-cgroup)
        self.compute_threads = sorted(_thread_ids() - before)
        self.threads = self._runtime.threads
        #: What the device computes alone (policy local, dynamic's gate, a fallback before
        #: the start) runs on a graph cut for local speed on this many threads, not on the
        #: offloading graph's 32 column blocks a layer: the same packed weights, no more memory
        #: but its activation buffers (docs/SCHEDULER.md, "Two graphs").
        self.local_graph = self.graph if address is None else local_graph_of(self.graph,
                                                                             self.threads)
        self._local_runtime = self._runtime if self.local_graph is self.graph else \
            Runtime(self.local_graph, share=self._runtime)
        self._options = {"split_layer": split_layer, "fl_layer": fl_layer,
                         "device_share": device_share}
        self._estimates = Estimates(rate, device_flops)
        self._estimates.set_transfer(transfer, len(self.graph.graph.layers))
        self._ids = itertools.count(1)
        self._calibrate_lock = threading.Lock()
        self._closed = False
        self.last_stats: dict = {}
        self._engine = Engine(
            address=address, tg=self.graph, model_bytes=self.model_bytes,
            runtime=self._runtime._rt, estimates=self._estimates, timeout=self.timeout,
            local_tg=self.local_graph,
            uplink=self._emulated_link(rate), downlink=self._emulated_link(rate),
            on_finish=_recorder(weakref.ref(self)), name=name, transfer=transfer, curve=curve)
        t0 = now()
        self._engine.schedule_rates([(t0 + t, r) for t, r in steps[1:]])
        self._engine.start(connect=self.policy != "local")
        # a Client dropped without close() still stops its thread and releases its runtime
        self._finalizer = weakref.finalize(self, _release, self._engine, self._runtime,
                                           self._local_runtime)

    def set_bandwidth(self, bandwidth) -> None:
        """Changes this client's emulated link to ``bandwidth`` now (a rate as shaper.parse_rate
        reads it; what ``tc change`` does to a real link): the part of each frame not yet across
        takes the new rate. Without an emulated link so far, one is made (the link was uncapped)."""
        rate = parse_rate(bandwidth)
        if self._closed:
            raise CoactoError("this Client is closed; create a new one")
        self.bandwidth = rate
        self._engine.set_link_rate(rate)

    def _emulated_link(self, rate):
        """The cap and the added propagation delay (half the added round trip each way), or None
        when neither is asked for."""
        if not rate and not self.rtt_ms:
            return None
        return TokenBucket(rate or UNCAPPED, delay=self.rtt_ms / 2e3)

    @staticmethod
    def _check_policy(policy) -> str:
        if policy not in policies.POLICIES:
            raise policies.PolicyError(f"unknown policy {policy!r}; choose one of "
                                       + ", ".join(policies.POLICIES))
        return policy

    @staticmethod
    def _check_trace(trace):
        if trace is None or isinstance(trace, bool):
            return trace
        if not isinstance(trace, (str, os.PathLike)):
            raise CoactoError(f"trace must be a file path (or True / False), got {trace!r}")
        folder = os.path.dirname(os.path.abspath(os.fspath(trace)))
        if not os.path.isdir(folder):
            raise CoactoError(f"cannot write the trace {os.fspath(trace)!r}: folder {folder!r} "
                              "does not exist; create it or choose another path")
        return trace

    # ------------------------------------------------------------------ inference

    def infer(self, feeds: dict, policy: str | None = None, trace=None) -> dict[str, np.ndarray]:
        """One inference: {input name: array (float32; integers for token ids and masks)} ->
        {output name: array} (ONNX names). ``trace``: see ``infer_async``. Ctrl-C while it runs
        raises KeyboardInterrupt and stops the inference as ``cancel`` does; so does any other
        exception raised in this thread while it waits."""
        future = self.infer_async(feeds, policy, trace)
        try:
            return future.result()
        except BaseException:
            if not future.done():  # interrupted while waiting: nobody wants the result
                self._engine.cancel(future)
            raise

    def run(self, output_names: list[str] | None, feeds: dict) -> list[np.ndarray]:
        """onnxruntime's ``run``: ``infer(feeds)`` with the outputs as a list in the order of
        ``output_names`` (None: every output in the model's order); an unknown name raises
        InputError before anything is sent. Unlike ``Runtime.run``, the dict form is ``infer``."""
        names = output_selection(self.graph, output_names)
        return select_outputs(self.infer(feeds), names)

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs (name, shape, type), as onnxruntime's InferenceSession has them."""
        return graph_inputs(self.graph)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs (name, shape, type), as onnxruntime's InferenceSession has them."""
        return graph_outputs(self.graph)

    async def ainfer(self, feeds: dict, policy: str | None = None,
                     trace=None) -> dict[str, np.ndarray]:
        """``infer`` for asyncio: awaits the inference without blocking the event loop, so any
        number may be awaited together (``asyncio.gather``). Cancelling the awaiting task stops
        the inference as ``cancel(future)`` does (the server is told, the client stays usable),
        and the task raises CancelledError."""
        if self._closed:
            raise CoactoError("this Client is closed; create a new one")
        self._runtime._check_feeds(feeds)
        policy = self.policy if policy is None else self._check_policy(policy)
        if policy in ("split", "fl", "dynamic") and self._estimates.device_flops is None:
            # the first such inference measures the device with local runs: not on the loop
            await asyncio.get_running_loop().run_in_executor(None, self.calibrate)
        future = self.infer_async(feeds, policy, trace)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # wrap_future cancels the Future itself only before the engine took it; a running
            # inference stops through the engine
            self.cancel(future)
            raise

    #: the id of the last inference submitted (cancel() without a Future stops it and older ones)
    _last_id = 0

    def cancel(self, future: Future | None = None) -> None:
        """Stops the inference of ``future`` (from ``infer_async``), or with no argument every
        inference submitted so far that has not finished: each Future raises InferenceCancelled.
        The device's computing threads drop its work within milliseconds, and a server working
        on it is sent CANCEL and frees what it holds. From any thread, or a signal handler; it
        does not wait. The client stays usable; a finished or unknown Future is left alone."""
        if self._closed:
            return
        if future is not None and not isinstance(future, Future):
            raise CoactoError(f"cancel() takes a Future from infer_async, got "
                              f"{type(future).__name__}")
        self._engine.cancel(future, upto=self._last_id)

    def infer_async(self, feeds: dict, policy: str | None = None, trace=None) -> Future:
        """Submits an inference; the Future's result is the outputs, its ``stats`` attribute the
        inference's statistics once done. Any number may be in flight. The Future is a
        concurrent.futures one: asyncio code awaits ``ainfer`` instead.

        ``trace`` (default: the client's): a path to write a Chrome trace-event JSON of this
        inference to (a ``{n}`` in it becomes the inference's number), True to keep it only as
        the Future's ``trace`` attribute, False for none. The trace holds both sides (the tiles
        each computed, the frames between them, the scheduler's decisions) on this device's
        clock: coacto.mobile.trace describes it. The Future then completes once the server's
        side has come back too (at most a couple of seconds later; ``latency_s`` is unaffected)."""
        if self._closed:
            raise CoactoError("this Client is closed; create a new one")
        policy = self.policy if policy is None else self._check_policy(policy)
        trace = self.trace if trace is None else self._check_trace(trace)
        self._runtime._check_feeds(feeds)
        if policy in ("split", "fl", "dynamic") and self._estimates.device_flops is None:
            self.calibrate()
        feeds = {k: np.array(v, dtype=np.float32, copy=True) for k, v in feeds.items()}
        keys = {"split": ("split_layer",), "fl": ("fl_layer", "device_share")}.get(policy, ())
        options = {k: self._options[k] for k in keys if self._options[k] is not None}
        record = TraceRecord(None if trace is True else trace) if trace else None
        job = Job(next(self._ids), feeds, policy, options, now(), trace=record)
        self._last_id = job.id
        self._engine.submit(job)
        return job.future

    def calibrate(self, repeats: int = 3) -> float:
        """Measures this device's FLOP/s on the model: the median of ``repeats`` local runs on
        zeros, on the offloading graph (the planners' rate) and the local graph (the gate's),
        their runs interleaved so that a slow spell of the device slows both. The median, not
        the best: the gate compares it with offloaded plans' predictions corrected by their
        outcomes, and the best of four in a 25% CPU quota (MobileNetV2: 16.0 ms, where its
        local runs took 19.6) kept work on the device that `split` did 20% faster."""
        with self._calibrate_lock:
            if self._estimates.device_flops is not None:
                return self._estimates.device_flops
            zeros = {k: np.zeros_like(v) for k, v in self.graph.example_feeds(0).items()}
            runtimes = [self._runtime] if self._local_runtime is self._runtime else \
                [self._runtime, self._local_runtime]
            times: list[list[float]] = [[] for _ in runtimes]
            for _ in range(max(1, repeats)):
                for i, rt in enumerate(runtimes):
                    t0 = time.perf_counter()
                    rt.run(zeros)
                    times[i].append(time.perf_counter() - t0)
            typical = [float(np.median(t)) for t in times]
            self._estimates.on_local_run(self.graph.total_flops, typical[0])
            if len(typical) > 1:
                self._estimates.on_local_run(self.local_graph.total_flops, typical[1],
                                             local_graph=True)
                # later local-graph runs keep the planners' rate current through this ratio
                self._estimates.graph_ratio = typical[1] / typical[0]
            log.info("device rate on this model: %.3g GFLOP/s (%.2f ms per inference; %.2f ms "
                     "on the local graph)", self.graph.total_flops / typical[0] / 1e9,
                     typical[0] * 1e3, typical[-1] * 1e3)
            return self._estimates.device_flops

    # ------------------------------------------------------------------ connection

    @property
    def connected(self) -> bool:
        """True while the server is ready for this model."""
        return self._engine.session.ready

    def connect(self, timeout: float | None = None) -> "Client":
        """Waits until the server is ready for this model (handshake and, once, the upload);
        raises ServerVersionError / ServerUnavailable if it is not within ``timeout`` (default:
        the client's timeout, extended while a model upload is under way)."""
        if self.server is None:
            raise ServerUnavailable("this client has no server address")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            if self._engine.wait_ready(max(0.0, min(left, 0.25))):
                return self
            session = self._engine.session
            if session.version_error:
                raise ServerVersionError(session.version_error)
            if left <= 0 and not (timeout is None and session.state == "upload"):
                break
        raise ServerUnavailable(f"server {self.server} is not available: "
                                f"{session.last_error or 'no answer'}")

    @property
    def server_info(self) -> dict:
        """What the server said at hello (its FLOP/s, threads, limits) plus connection counters."""
        s = self._engine.session
        return {**s.server_info, "state": s.state, "uploads": s.uploads, "connects": s.connects,
                "reconnects": s.reconnects, "last_error": s.last_error}

    @property
    def estimates(self) -> dict:
        """The current goodput, RTT, server and device estimates."""
        return self._estimates.snapshot()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stops the communication engine (inferences still in flight fail with CoactoError) and
        releases the computing threads."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Client(server={self.server!r}, policy={self.policy!r}, threads={self.threads}, "
                f"tiles={self.graph.n_tiles})")
