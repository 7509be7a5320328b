"""The server's model store: ONNX models by hash, compiled tile graphs by graph_id, both bounded.

Models come from the operator (``--models DIR``: ``.onnx`` files, hashed on load, and ``.ctg`` tile
graph files) or from devices (MODEL_UPLOAD, verified against the hash the device claims). A tile
graph is compiled on demand for the partition parameters a device asks for and kept in an LRU
cache; the operator's models and graphs are pinned and never evicted.

Methods are thread-safe: the server's I/O thread looks graphs up while its compile worker adds them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import protocol as P
from ..errors import CoactoError
from ..partition import PARTITIONER_VERSION
from ..tilegraph import TileGraph

log = logging.getLogger(__name__)

#: Partition parameters a device may ask for (the keys of TileGraph.params).
PARAM_KEYS = frozenset({"tiles_per_layer", "input_shapes", "min_column_blocks", "layer_tiles",
                        "threads"})
#: Bounds on what a device may ask the server to compile (a hostile request must not exhaust it).
MAX_TILES_PER_LAYER = 4096
MAX_LAYER_TILES_ENTRIES = 1 << 16
MAX_INPUT_RANK = 8
MAX_INPUT_ELEMENTS = 1 << 26   # 256 MiB of float32 per input
MAX_GRAPH_TILES = 1 << 20

_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class StoreError(CoactoError):
    """A model request the store refuses; ``code`` is the protocol error code to answer with,
    ``limit`` the server limit that refused it (docs/SECURITY.md), if one did."""

    def __init__(self, code: int, message: str, limit: str | None = None):
        super().__init__(message)
        self.code = code
        self.limit = limit


def is_hash(value) -> bool:
    """A sha256 hex digest (lower case), as model_hash and graph_id are."""
    return isinstance(value, str) and _HASH_RE.match(value) is not None


def check_params(params) -> dict:
    """Partition parameters from a device -> keyword arguments for coacto.compile."""
    if not isinstance(params, dict):
        raise StoreError(P.E_BAD_MESSAGE, "params must be a map like TileGraph.params "
                                          "{tiles_per_layer, input_shapes, min_column_blocks, "
                                          "layer_tiles, threads}")
    unknown = sorted(str(k) for k in params if k not in PARAM_KEYS)
    if unknown:
        raise StoreError(P.E_BAD_MESSAGE, f"unknown partition parameter(s) {unknown}; this server "
                                          f"knows {sorted(PARAM_KEYS)}")
    tiles = params.get("tiles_per_layer")
    if tiles is not None and (type(tiles) is not int or not 1 <= tiles <= MAX_TILES_PER_LAYER):
        raise StoreError(P.E_BAD_MESSAGE, f"tiles_per_layer must be null or an integer from 1 to "
                                          f"{MAX_TILES_PER_LAYER}, got {tiles!r}")
    shapes = params.get("input_shapes") or {}
    if not isinstance(shapes, dict):
        raise StoreError(P.E_BAD_MESSAGE, "input_shapes must be a map {input name: [dims]}")
    out = {}
    for name, dims in shapes.items():
        if (not isinstance(name, str) or not isinstance(dims, (list, tuple))
                or not 1 <= len(dims) <= MAX_INPUT_RANK
                or any(type(d) is not int or d < 1 for d in dims)
                or int(np.prod([float(d) for d in dims])) > MAX_INPUT_ELEMENTS):
            raise StoreError(P.E_BAD_MESSAGE, f"input_shapes[{str(name)[:64]!r}] must be 1 to "
                                              f"{MAX_INPUT_RANK} positive integers with at most "
                                              f"{MAX_INPUT_ELEMENTS} elements in all")
        out[name] = tuple(dims)
    blocks = params.get("min_column_blocks", 0)
    if type(blocks) is not int or not 0 <= blocks <= MAX_TILES_PER_LAYER:
        raise StoreError(P.E_BAD_MESSAGE, f"min_column_blocks must be an integer from 0 to "
                                          f"{MAX_TILES_PER_LAYER}, got {blocks!r}")
    layer_tiles = params.get("layer_tiles") or {}
    if not isinstance(layer_tiles, dict) or len(layer_tiles) > MAX_LAYER_TILES_ENTRIES or any(
            not isinstance(k, str) or not k.isdigit() or len(k) > 6 or type(v) is not int
            or not 1 <= v <= MAX_TILES_PER_LAYER for k, v in layer_tiles.items()):
        raise StoreError(P.E_BAD_MESSAGE, f"layer_tiles must be a map {{layer index (decimal "
                                          f"string): tiles from 1 to {MAX_TILES_PER_LAYER}}} "
                                          f"with at most {MAX_LAYER_TILES_ENTRIES} entries")
    threads = params.get("threads")
    if threads is not None and (type(threads) is not int or not 1 <= threads <= MAX_TILES_PER_LAYER):
        raise StoreError(P.E_BAD_MESSAGE, f"threads must be null or an integer from 1 to "
                                          f"{MAX_TILES_PER_LAYER}, got {threads!r}")
    return {"tiles_per_layer": tiles, "input_shapes": out or None, "min_column_blocks": blocks,
            "layer_tiles": {int(k): v for k, v in layer_tiles.items()} or None,
            "threads": threads}


#: Per-tile state of one inference, native (state, parents left, worker) and the server's
#: bookkeeping (sent, inputs seen, output and input masks), rounded up.
INFERENCE_BYTES_PER_TILE = 32


def activation_bytes(graph) -> int:
    """What one inference's activations may hold: every layer's float32 buffer at once (the
    runtime frees a layer when its last consumer is done, but the order tiles run in depends on
    the threads: this bound holds for any order) and one copy of the outputs on their way to the
    device. Known from the imported graph, before it is partitioned."""
    acts = sum(int(np.prod(layer.shape, dtype=np.int64)) for layer in graph.layers)
    outs = sum(int(np.prod(graph.layers[li].shape, dtype=np.int64))
               for li in set(graph.outputs.values()))
    return 4 * (acts + outs)


#: The partitioner maps every (output column, window tap) pair of a layer to its input column
#: with int64 index arrays and their temporaries: about this many bytes per pair at its peak
#: (measured: 77 bytes per column for a 1x1 convolution, 575 for 3x3, 3,123 for 7x7).
PARTITION_BYTES_PER_TAP = 64


def partition_bytes(graph) -> int:
    """A bound on what partitioning the imported graph allocates at its peak: the largest
    layer's (column, window tap) pairs."""
    worst = 0
    for layer in graph.layers:
        taps = int(layer.attrs.get("kh", 1)) * int(layer.attrs.get("kw", 1)) \
            if layer.op in ("CONV", "POOL") else 1
        worst = max(worst, layer.columns * max(1, taps))
    return PARTITION_BYTES_PER_TAP * worst


class GraphInfo:
    """What the server needs per tile graph, computed once: output tiles, input tiles, sizes."""

    def __init__(self, tg: TileGraph):
        plan, g = tg.plan, tg.graph
        first = plan.layer_first_tile
        n = plan.n_tiles
        self.output_mask = np.zeros(n, np.uint8)
        for li in set(g.outputs.values()):
            self.output_mask[first[li]:first[li + 1]] = 1
        self.n_outputs = int(self.output_mask.sum())
        self.is_input = np.zeros(n, bool)
        for li in set(g.inputs.values()):
            self.is_input[first[li]:first[li + 1]] = True
        self.n_inputs = int(self.is_input.sum())
        b = plan.tile_bounds.astype(np.int64)
        self.sizes = (b[:, 1] - b[:, 0]) * (b[:, 3] - b[:, 2])
        self.total_flops = float(tg.total_flops)
        self.inference_bytes = activation_bytes(g) + INFERENCE_BYTES_PER_TILE * n


class GraphEntry:
    def __init__(self, tg: TileGraph, pinned: bool, owners: set | None = None):
        self.tg = tg
        self.info = GraphInfo(tg)
        self.pinned = pinned
        # who may use it: None, everyone (preloaded, or compiled from a preloaded model); else the
        # owners (Session.owner) of the devices that uploaded its model
        self.owners = owners
        self.nbytes = len(tg.blob) + int(tg.plan.parents.nbytes) + 16 * tg.n_tiles
        self.flops = None  # measured FLOP/s of this graph on this server (EWMA; FlopEstimate)

    def usable_by(self, owner: str | None) -> bool:
        return self.owners is None or owner is None or owner in self.owners


class ModelStore:
    """ONNX bytes by model_hash and compiled graphs by graph_id, each an LRU bounded in bytes.

    Models are bound to who uploaded them: a device sees a graph only if it (its ``owner``,
    Session.owner) uploaded the model, or the model was preloaded. Knowing a model's hash is not
    enough to use it: a device that did not upload it is told MODEL_MISSING and must send the
    bytes (the hash is checked), which proves it has the model."""

    def __init__(self, max_model_bytes: int = 512 << 20, max_graphs: int = 32,
                 max_graph_bytes: int = 4 << 30, max_onnx_bytes: int = 4 << 30,
                 cache_dir: str | os.PathLike | None = None,
                 max_inference_bytes: int | None = None):
        self.max_model_bytes = int(max_model_bytes)
        self.max_graphs = int(max_graphs)
        self.max_graph_bytes = int(max_graph_bytes)
        self.max_onnx_bytes = int(max_onnx_bytes)
        self.max_inference_bytes = max_inference_bytes
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._graphs: OrderedDict[str, GraphEntry] = OrderedDict()
        self._onnx: OrderedDict[str, bytes] = OrderedDict()
        self._pinned_onnx: set[str] = set()
        self._owners: dict[str, set] = {}  # model_hash -> owners (absent: pinned, or nobody yet)
        self.compiled = 0
        self.evicted = 0
        self.refused = 0  # uploads that did not compile or were too large to run: not kept

    # -------------------------------------------------------------- preload

    def preload(self, directory: str | os.PathLike) -> list[dict]:
        """Loads every .onnx (hashed) and .ctg file of a folder, pinned and usable by every
        device; returns what was loaded. Raises CoactoError if the folder is missing; a file that
        does not load is logged in one line and skipped."""
        from ..frontend import load_model

        folder = Path(directory)
        if not folder.is_dir():
            raise CoactoError(f"models folder {str(folder)!r} does not exist or is not a folder")
        loaded = []
        for path in sorted(folder.iterdir()):
            suffix = path.suffix.lower()
            try:
                if suffix == ".onnx":
                    _proto, data = load_model(str(path))
                    digest = hashlib.sha256(data).hexdigest()
                    self.put_model(data, digest, pinned=True)
                    loaded.append({"file": path.name, "kind": "onnx", "model_hash": digest,
                                   "bytes": len(data)})
                elif suffix == ".ctg":
                    tg = TileGraph.load(path)
                    entry = self.add_graph(tg, pinned=True)
                    loaded.append({"file": path.name, "kind": "ctg", "graph_id": tg.graph_id,
                                   "model_hash": tg.model_hash, "tiles": tg.n_tiles,
                                   "params": tg.params,
                                   "inference_mb": entry.info.inference_bytes / 2**20})
            except (CoactoError, OSError, MemoryError) as e:
                log.warning("skipping %s: %s", path.name, e)
        return loaded

    # -------------------------------------------------------------- ONNX bytes

    def has_model(self, model_hash: str, owner: str | None = None) -> bool:
        """The model's bytes are here and ``owner`` may use them (None: anyone asks)."""
        if owner is not None and not self._may_use(model_hash, owner):
            return False
        with self._lock:
            if model_hash in self._onnx:
                return True
        return self._cache_path(model_hash) is not None and self._cache_path(model_hash).is_file()

    def _may_use(self, model_hash: str, owner: str) -> bool:
        with self._lock:
            if model_hash in self._pinned_onnx:
                return True
            owners = self._owners.get(model_hash)
            if owners is None:
                owners = self._read_owners(model_hash)
            return owner in owners

    def owned_models(self, owner: str) -> int:
        """How many models this owner has uploaded that the store still holds."""
        with self._lock:
            held = set(self._onnx) | {e.tg.model_hash for e in self._graphs.values()}
            return sum(1 for h, owners in self._owners.items() if owner in owners and h in held)

    def model_bytes(self, model_hash: str) -> bytes | None:
        with self._lock:
            data = self._onnx.get(model_hash)
            if data is not None:
                self._onnx.move_to_end(model_hash)
                return data
        path = self._cache_path(model_hash)
        if path is None or not path.is_file():
            return None
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != model_hash:
            log.warning("cached model %s does not match its hash; removing it", path)
            path.unlink(missing_ok=True)
            return None
        self.put_model(data, model_hash)
        return data

    def put_model(self, data: bytes, model_hash: str, pinned: bool = False,
                  owner: str | None = None) -> None:
        """Stores verified ONNX bytes (the caller checked sha256(data) == model_hash)."""
        with self._lock:
            self._onnx[model_hash] = data
            self._onnx.move_to_end(model_hash)
            if pinned:
                self._pinned_onnx.add(model_hash)
            if owner is not None:
                self._add_owner(model_hash, owner)
            self._evict_onnx()
        path = self._cache_path(model_hash)
        if path is not None and not pinned and not path.exists():
            tmp = path.with_suffix(".tmp")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError as e:
                log.warning("cannot write %s to the model cache: %s", path.name, e)

    def _add_owner(self, model_hash: str, owner: str) -> None:
        owners = self._owners.get(model_hash)
        if owners is None:
            owners = self._owners[model_hash] = set(self._read_owners(model_hash))
        if owner in owners:
            return
        owners.add(owner)
        for entry in self._graphs.values():
            if entry.tg.model_hash == model_hash and entry.owners is not None:
                entry.owners.add(owner)
        path = self._cache_path(model_hash)
        if path is not None:  # who may use a cached model survives a restart with it
            try:
                tmp = path.with_suffix(".owners.tmp")
                tmp.write_text(json.dumps(sorted(owners)))
                os.replace(tmp, path.with_suffix(".owners"))
            except OSError as e:
                log.warning("cannot write the owners of %s to the model cache: %s", path.name, e)

    def _read_owners(self, model_hash: str) -> set:
        path = self._cache_path(model_hash)
        if path is None:
            return set()
        try:
            owners = json.loads(path.with_suffix(".owners").read_text())
        except (OSError, ValueError):
            return set()
        return {o for o in owners if isinstance(o, str)} if isinstance(owners, list) else set()

    def _cache_path(self, model_hash: str) -> Path | None:
        if self.cache_dir is None or not is_hash(model_hash):  # never a path from a device
            return None
        return self.cache_dir / f"{model_hash}.onnx"

    def _evict_onnx(self) -> None:
        total = sum(len(v) for v in self._onnx.values())
        for h in list(self._onnx):
            if total <= self.max_onnx_bytes:
                break
            if h in self._pinned_onnx:
                continue
            total -= len(self._onnx.pop(h))
            self.evicted += 1

    # -------------------------------------------------------------- graphs

    def graph(self, graph_id: str, owner: str | None = None) -> GraphEntry | None:
        """The compiled graph, if ``owner`` may use it (None: whoever asks)."""
        with self._lock:
            entry = self._graphs.get(graph_id)
            if entry is None or not entry.usable_by(owner):
                return None
            self._graphs.move_to_end(graph_id)
            return entry

    def add_graph(self, tg: TileGraph, pinned: bool = False,
                  owners: set | None = None) -> GraphEntry:
        """Caches a tile graph, its weights packed for the native runtime (done here, off the I/O
        thread, so the first BEGIN does not pay for it)."""
        from ..native import native_graph

        native_graph(tg)
        entry = GraphEntry(tg, pinned, owners)
        with self._lock:
            old = self._graphs.get(tg.graph_id)
            if old is not None and old.owners is not None and owners is not None:
                entry.owners = old.owners | owners
            elif old is not None and old.owners is None:
                entry.owners = None
            self._graphs[tg.graph_id] = entry
            self._graphs.move_to_end(tg.graph_id)
            self._evict_graphs()
        return entry

    def _evict_graphs(self) -> None:
        # Evicting only forgets the graph: inferences that use it keep it alive until they end.
        total = sum(e.nbytes for e in self._graphs.values())
        for gid in list(self._graphs):
            if len(self._graphs) <= self.max_graphs and total <= self.max_graph_bytes:
                break
            entry = self._graphs[gid]
            if entry.pinned:
                continue
            del self._graphs[gid]
            total -= entry.nbytes
            self.evicted += 1
            log.info("evicted tile graph %s from the cache", gid[:12])

    def ensure_graph(self, graph_id: str, model_hash: str, params, data=None,
                     owner: str | None = None) -> GraphEntry | None:
        """The graph `graph_id`, compiled from the stored (or given) ONNX bytes if needed, and
        usable by ``owner`` from now on.

        Returns None when the model is not in the store for this owner (MODEL_MISSING). Raises
        StoreError when the upload is too large, does not hash to model_hash, does not compile
        to graph_id, or one inference of it would need more memory than the server allows;
        bytes that fail so are not kept. Slow (compiles): the server runs it on its worker
        thread."""
        entry = self.graph(graph_id, owner)
        if entry is not None:
            return entry
        kw = check_params(params)
        uploaded = data is not None
        if uploaded:
            if len(data) > self.max_model_bytes:
                raise StoreError(P.E_MODEL_TOO_LARGE, f"the model has {len(data)} bytes; the "
                                                      f"limit is {self.max_model_bytes}",
                                 limit="model_bytes")
            digest = hashlib.sha256(data).hexdigest()
            if digest != model_hash:
                raise StoreError(P.E_MODEL_INVALID, f"the uploaded bytes hash to {digest}, not "
                                                    f"the model_hash {model_hash}; upload the "
                                                    f"model file itself")
            data = bytes(data)
        else:
            if not self.has_model(model_hash, owner):
                return None
            data = self.model_bytes(model_hash)
            if data is None:
                return None
        with self._lock:
            public = model_hash in self._pinned_onnx
            existing = self._graphs.get(graph_id)
        # Compiled for another device: the bytes this one showed (or may use) are that model's,
        # so it may use the graph too. A graph of another model is never handed out this way:
        # its id is computable from a hash anyone may know.
        if existing is not None and existing.tg.model_hash == model_hash:
            if uploaded:
                self.put_model(data, model_hash, owner=owner)
            with self._lock:
                if existing.owners is not None and owner is not None:
                    existing.owners.add(owner)
            return existing
        from ..compiler import partition_graph
        from ..frontend import import_model

        try:
            graph = import_model(data, input_shapes=kw["input_shapes"])
            # checked before partitioning, whose own tables grow with the layers' columns
            need = activation_bytes(graph)
            work = partition_bytes(graph)
            if self.max_inference_bytes is not None and max(need, work) > self.max_inference_bytes:
                self.refused += uploaded
                what = (f"one inference of this model needs up to {need / 2**20:.0f} MiB of "
                        f"activations" if need >= work else
                        f"partitioning this model needs about {work / 2**20:.0f} MiB")
                raise StoreError(P.E_MODEL_TOO_LARGE, (
                    f"{what}; this server allows {self.max_inference_bytes / 2**20:.0f} MiB per "
                    f"inference (coacto-server --memory-limit); compute it on the device"),
                    limit="inference_memory")
            tg = partition_graph(graph, kw["tiles_per_layer"], kw["input_shapes"],
                                 kw["layer_tiles"], kw["min_column_blocks"], kw["threads"])
        except StoreError:
            raise
        except CoactoError as e:
            self.refused += uploaded
            raise StoreError(P.E_MODEL_INVALID, f"the model does not compile: {e}") from None
        except MemoryError:
            self.refused += uploaded
            raise StoreError(P.E_MODEL_TOO_LARGE, "compiling the model ran out of memory; "
                                                  "compute it on the device",
                             limit="inference_memory") from None
        if tg.graph_id != graph_id:
            self.refused += uploaded
            raise StoreError(P.E_MODEL_INVALID, (
                f"model {model_hash[:12]} with params {tg.params} compiles to graph "
                f"{tg.graph_id[:12]} here, not {str(graph_id)[:12]}; the device and this server "
                f"partition differently (this server's partitioner version is "
                f"{PARTITIONER_VERSION}) or the params differ"))
        if tg.n_tiles > MAX_GRAPH_TILES:
            self.refused += uploaded
            raise StoreError(P.E_MODEL_INVALID, f"the graph has {tg.n_tiles} tiles; this server "
                                                f"takes at most {MAX_GRAPH_TILES}")
        need += INFERENCE_BYTES_PER_TILE * tg.n_tiles  # GraphInfo.inference_bytes, now known
        if self.max_inference_bytes is not None and need > self.max_inference_bytes:
            self.refused += uploaded
            raise StoreError(P.E_MODEL_TOO_LARGE, (
                f"one inference of this model needs up to {need / 2**20:.0f} MiB of activations; "
                f"this server allows {self.max_inference_bytes / 2**20:.0f} MiB per inference "
                f"(coacto-server --memory-limit); compute it on the device"),
                limit="inference_memory")
        if uploaded:  # kept only now that it is known to be usable
            self.put_model(data, model_hash, owner=owner)
        elif owner is not None and not public:
            with self._lock:
                self._add_owner(model_hash, owner)
        self.compiled += 1
        log.info("compiled model %s into graph %s (%d tiles, %.3g GFLOP, %.0f MiB per "
                 "inference)", model_hash[:12], graph_id[:12], tg.n_tiles, tg.total_flops / 1e9,
                 need / 2**20)
        return self.add_graph(tg, owners=None if public or owner is None else {owner})

    def release_buffers(self) -> int:
        """Frees the activation buffers each compiled graph keeps for its next inferences;
        the bytes freed."""
        with self._lock:
            natives = [e.tg._native for e in self._graphs.values() if e.tg._native is not None]
        return sum(n.release_buffers() for n in natives)

    def nbytes(self) -> int:
        """Bytes the store holds: ONNX files and compiled graphs."""
        with self._lock:
            return (sum(len(v) for v in self._onnx.values())
                    + sum(e.nbytes for e in self._graphs.values()))

    # -------------------------------------------------------------- stats

    def stats(self) -> dict:
        with self._lock:
            return {"graphs": len(self._graphs), "models": len(self._onnx),
                    "graph_bytes": sum(e.nbytes for e in self._graphs.values()),
                    "model_bytes": sum(len(v) for v in self._onnx.values()),
                    "compiled": self.compiled, "evicted": self.evicted,
                    "refused": self.refused}
