"""The Python side of the C boundary (native/include/coacto.h): cffi's ``ffi`` and ``lib``, native
status codes as coacto exceptions (``check``), layer descriptions, and the coacto_graph and
coacto_runtime handles (NativeGraph, NativeRuntime).

NativeInference (coacto.inference) and Runtime (coacto.runtime) are built on this module, and
Runtime on NativeInference: the imports run one way, runtime -> inference -> native.
"""
from __future__ import annotations

import os
import platform
import weakref

import numpy as np

from . import ir
from .errors import CoactoError, InferenceCancelled, InferenceTimeout, NativeError
from .tilegraph import TileGraph

try:
    from ._native import ffi, lib
except ImportError as e:  # pragma: no cover - only without a build
    raise CoactoError(
        "coacto's native runtime is not built; install the package with "
        "`pip install -e .` (it compiles native/ through cffi)") from e

_STATUS_NAMES = {
    lib.COACTO_ERR_INVALID_ARGUMENT: "invalid argument",
    lib.COACTO_ERR_OUT_OF_MEMORY: "out of memory",
    lib.COACTO_ERR_INVALID_GRAPH: "invalid tile graph",
    lib.COACTO_ERR_TIMEOUT: "timeout",
    lib.COACTO_ERR_CANCELLED: "cancelled",
    lib.COACTO_ERR_DUPLICATE: "duplicate",
    lib.COACTO_ERR_THREAD: "thread",
    lib.COACTO_ERR_STATE: "state",
}


def check(status: int, what: str, detail: str = "") -> None:
    """The one place a native status becomes a typed coacto exception."""
    if status == lib.COACTO_OK:
        return
    text = ffi.string(lib.coacto_status_string(status)).decode()
    msg = f"{what}: {text}" + (f" ({detail})" if detail else "")
    if status == lib.COACTO_ERR_TIMEOUT:
        raise InferenceTimeout(msg + "; raise the timeout or use more threads", status)
    if status == lib.COACTO_ERR_CANCELLED:
        raise InferenceCancelled(msg + " by Runtime.cancel(); the Runtime is ready for the next "
                                 "run", status)
    if status == lib.COACTO_ERR_OUT_OF_MEMORY:
        raise NativeError(msg + "; free memory or use a smaller model / batch", status)
    raise NativeError(msg, status)


#: COACTO_ISA's values per architecture: the instruction sets of the GEMM micro-kernels
ISA_CHOICES = {"x86_64": ("scalar", "avx2", "avx512"), "aarch64": ("scalar", "neon")}


def _arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def check_isa(env=None) -> str | None:
    """COACTO_ISA as the native side will read it (None: no cap), refused with the values this
    CPU's architecture takes when it names none of them. Checked before the first native call:
    the C side caps at the first kernel selection and cannot say what it did not understand."""
    value = (os.environ if env is None else env).get("COACTO_ISA")
    if not value:
        return None
    choices = ISA_CHOICES.get(_arch(), ("scalar",))
    if value not in choices:
        raise CoactoError(f"COACTO_ISA={value!r}: on this {_arch()} CPU use one of "
                          f"{', '.join(choices)} (a cap on the GEMM kernels; unset it for the "
                          f"best this CPU runs)")
    return value


check_isa()


def gemm_kernel_name() -> str:
    return ffi.string(lib.coacto_gemm_kernel_name()).decode()


def gemm_kernels_available() -> list[str]:
    """Every GEMM micro-kernel this CPU runs, best first (COACTO_ISA aside)."""
    return ffi.string(lib.coacto_gemm_kernels_available()).decode().split(",")


def gemm_blocking() -> dict:
    """The GEMM blocking the runtime derived from this machine's caches (coacto_gemm_blocking):
    {"block_k", "block_m", "l1d_bytes", "l2_bytes", "cache_source"}."""
    b = ffi.new("coacto_blocking *")
    lib.coacto_gemm_blocking(b)
    return {"block_k": int(b.block_k), "block_m": int(b.block_m), "l1d_bytes": int(b.l1d_bytes),
            "l2_bytes": int(b.l2_bytes), "cache_source": ffi.string(b.cache_source).decode()}


def kernel_summary() -> str:
    """The GEMM kernel in use, what capped it and the caches: one line for benchmarks and
    profiles ("gemm_f32_6x16__avx2 (COACTO_ISA=avx2; this CPU also runs ...); L1d 48 KiB, ...")."""
    from .machine import cache_sizes, format_caches

    name = gemm_kernel_name()
    others = [k for k in gemm_kernels_available() if k != name]
    cap = check_isa()
    why = [f"COACTO_ISA={cap}"] if cap else []
    if os.environ.get("COACTO_FORCE_SCALAR", "0") not in ("", "0"):
        why.append("COACTO_FORCE_SCALAR")
    notes = why + ([f"this CPU also runs {', '.join(others)}"] if others else [])
    b = gemm_blocking()
    blocking = f"blocking K {b['block_k']} x M {b['block_m']}"
    if b["cache_source"] == "environment":
        blocking += (f" for L1d {b['l1d_bytes'] >> 10} KiB, L2 {b['l2_bytes'] >> 10} KiB "
                     "(COACTO_L1D_BYTES / COACTO_L2_BYTES)")
    elif b["cache_source"] == "assumed":
        blocking += " for assumed caches (none could be read)"
    return name + (f" ({'; '.join(notes)})" if notes else "") + \
        f"; caches {format_caches(cache_sizes())}; {blocking}"


# ---------------------------------------------------------------------------- descriptions

class NativeGraph:
    """A coacto_graph handle (weights packed once), shared by every Runtime of a TileGraph.
    ``weights``: the native graph of the same model cut into other tiles, whose packed weights
    this one runs on (TileGraph.retiled)."""

    def __init__(self, tg: TileGraph, weights: "NativeGraph | None" = None):
        g, plan = tg.graph, tg.plan
        n = len(g.layers)
        descs = ffi.new("coacto_layer_desc[]", n)
        outputs = set(g.outputs.values())
        for li, (layer, specs) in enumerate(zip(g.layers, tg.arrays)):
            d = descs[li]
            d.op = ir.OP_CODES[layer.op]
            d.n_inputs = len(layer.inputs)
            for i, p in enumerate(layer.inputs):
                d.inputs[i] = p
            d.n, d.c, d.h, d.w = (int(v) for v in layer.shape)
            ip, fp = ir.OPS[layer.op].pack(layer)
            for i, v in enumerate(ip):
                d.iparams[i] = int(v)
            for i, v in enumerate(fp):
                d.fparams[i] = float(v)
            for i, s in enumerate(specs):
                d.array_offset[i] = s.offset
                d.array_size[i] = s.size
            d.flags = lib.COACTO_LAYER_KEEP if li in outputs else 0
        keep = [np.ascontiguousarray(plan.tile_layer, np.int32),
                np.ascontiguousarray(plan.tile_bounds, np.int32).reshape(-1),
                np.ascontiguousarray(plan.parent_offsets, np.int32),
                np.ascontiguousarray(plan.parents, np.int32)]
        desc = ffi.new("coacto_graph_desc *")
        desc.n_layers = n
        desc.layers = descs
        desc.n_tiles = plan.n_tiles
        desc.tile_layer = ffi.from_buffer("int32_t[]", keep[0])
        desc.tile_bounds = ffi.from_buffer("int32_t[]", keep[1])
        desc.parent_offsets = ffi.from_buffer("int32_t[]", keep[2])
        desc.parents = ffi.from_buffer("int32_t[]", keep[3]) if keep[3].size else ffi.NULL
        out = ffi.new("coacto_graph **")
        err = ffi.new("char[512]")
        if weights is not None:  # the blob is not read: the layers are weights's, packed
            desc.blob, desc.blob_size, desc.blob_reclaimable = ffi.NULL, 0, 0
            status = lib.coacto_graph_create_sharing(desc, weights.handle, out, err, 512)
        else:
            blob = tg.blob if tg.blob else b"\0"
            desc.blob = ffi.from_buffer("uint8_t[]", blob)
            desc.blob_size = len(tg.blob)
            desc.blob_reclaimable = 1 if tg.blob_is_mapped else 0
            status = lib.coacto_graph_create(desc, out, err, 512)
        check(status, "loading the tile graph into the native runtime", ffi.string(err).decode())
        self.handle = out[0]
        # The runtime packed its own copy of the weights: a file-mapped blob's pages can go.
        if weights is None:
            tg.release_blob_pages()
        self.layer_floats = [int(np.prod(layer.shape)) for layer in g.layers]
        self._work_set = False
        self._finalizer = weakref.finalize(self, lib.coacto_graph_destroy, self.handle)

    def set_profiling(self, enable: bool) -> None:
        """Per-layer timing on the computing threads (two clock reads per tile); enabling
        resets the totals."""
        check(lib.coacto_graph_set_profiling(self.handle, 1 if enable else 0), "setting profiling")

    def release_buffers(self) -> int:
        """Gives the activation arena's memory no running inference holds back to the system;
        the bytes given back."""
        return int(lib.coacto_graph_release_buffers(self.handle))

    def arena_bytes(self) -> tuple[int, int]:
        """(reserved, touched): the activation arena's address space and the part of it ever
        written."""
        reserved = ffi.new("int64_t *")
        touched = ffi.new("int64_t *")
        check(lib.coacto_graph_arena_bytes(self.handle, reserved, touched), "arena_bytes")
        return int(reserved[0]), int(touched[0])

    def arena_prefault(self, nbytes: int) -> int:
        """Makes the first ``nbytes`` of the activation arena resident (free blocks only; see
        coacto_graph_arena_prefault); the bytes of free blocks covered."""
        return int(lib.coacto_graph_arena_prefault(self.handle, int(nbytes)))

    def layer_seconds(self) -> np.ndarray:
        """Seconds the computing threads spent in each layer's tiles since profiling was enabled."""
        n = len(self.layer_floats)
        out = np.zeros(n, dtype=np.float64)
        check(lib.coacto_graph_layer_seconds(self.handle, ffi.from_buffer("double[]", out), n),
              "reading the layer profile")
        return out

    def tile_trace(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, worker) of every tile in the last profiled inference; worker -1 for tiles
        not computed here. Times are seconds of a monotonic clock."""
        n = int(lib.coacto_graph_tile_count(self.handle))
        return read_tile_trace(lib.coacto_graph_tile_trace, self.handle, n, "reading the tile trace")

    def ensure_work(self, work: np.ndarray) -> None:
        """Gives the runtime each tile's work (FLOPs from the inputs) for send decisions, once."""
        if not self._work_set:
            w = np.ascontiguousarray(work, dtype=np.float64)
            check(lib.coacto_graph_set_work(self.handle, ffi.from_buffer("double[]", w), w.size),
                  "setting tile costs")
            self._work_set = True


def native_graph(tg: TileGraph) -> NativeGraph:
    if tg._native is None:
        owner = tg._weights_of
        tg._native = NativeGraph(tg, native_graph(owner) if owner is not None else None)
    return tg._native


class NativeRuntime:
    """The computing threads and ready pool (coacto_runtime)."""

    def __init__(self, threads: int):
        out = ffi.new("coacto_runtime **")
        check(lib.coacto_runtime_create(int(threads), out), f"starting {threads} computing threads")
        self.handle = out[0]
        self.threads = int(threads)
        self._finalizer = weakref.finalize(self, lib.coacto_runtime_destroy, self.handle)

    def set_worker_nice(self, nice: int) -> None:
        """Lowers (or raises) the computing threads' scheduling priority (nice -20..19)."""
        check(lib.coacto_runtime_set_worker_nice(self.handle, int(nice)),
              f"setting the computing threads' priority to nice {nice}")

    def heads_up(self) -> None:
        """Work is coming: sleeping computing threads wake now (coacto_runtime_heads_up)."""
        lib.coacto_runtime_heads_up(self.handle)

    def close(self) -> None:
        self._finalizer()


def read_tile_trace(fn, handle, n: int, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, worker) arrays of n tiles from a native trace call (graph or inference)."""
    t0, t1 = np.zeros(n), np.zeros(n)
    worker = np.full(n, -1, dtype=np.int32)
    check(fn(handle, ffi.from_buffer("double[]", t0), ffi.from_buffer("double[]", t1),
             ffi.from_buffer("int32_t[]", worker), n), what)
    return t0, t1, worker
