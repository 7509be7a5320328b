"""The server's model store: ONNX models by hash, compiled tile graphs by graph_id, both bounded.

Models come from the operator (``--models DIR``: ``.onnx`` files, hashed on load, and ``.ctg`` tile
graph files) or from devices (MODEL_UPLOAD, verified against the hash the device claims). A tile
graph is compiled on demand for the partition parameters a device asks for and kept in an LRU
cache; the operator's models and graphs are pinned and never evicted.

Methods are thread-safe: the server's I/O thread looks graphs up while its compile worker adds them.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import protocol as P
from ..errors import CoactoError
from ..tilegraph import PARTITIONER_VERSION, TileGraph

log = logging.getLogger(__name__)

#: Partition parameters a device may ask for (the keys of TileGraph.params).
PARAM_KEYS = frozenset({"tiles_per_layer", "input_shapes", "min_column_blocks", "layer_tiles"})
#: Bounds on what a device may ask the server to compile (a hostile request must not exhaust it).
MAX_TILES_PER_LAYER = 4096
MAX_LAYER_TILES_ENTRIES = 1 << 16
MAX_INPUT_RANK = 8
MAX_INPUT_ELEMENTS = 1 << 26   # 256 MiB of float32 per input
MAX_GRAPH_TILES = 1 << 20

_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class StoreError(CoactoError):
    """A model request the store refuses; ``code`` is the protocol error code to answer with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def is_hash(value) -> bool:
    """A sha256 hex digest (lower case), as model_hash and graph_id are."""
    return isinstance(value, str) and _HASH_RE.match(value) is not None


def check_params(params) -> dict:
    """Partition parameters from a device -> keyword arguments for coacto.compile."""
    if not isinstance(params, dict):
        raise StoreError(P.E_BAD_MESSAGE, "params must be a map like TileGraph.params "
                                          "{tiles_per_layer, input_shapes, min_column_blocks, layer_tiles}")
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
    return {"tiles_per_layer": tiles, "input_shapes": out or None, "min_column_blocks": blocks,
            "layer_tiles": {int(k): v for k, v in layer_tiles.items()} or None}


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


class GraphEntry:
    def __init__(self, tg: TileGraph, pinned: bool):
        self.tg = tg
        self.info = GraphInfo(tg)
        self.pinned = pinned
        self.nbytes = len(tg.blob) + int(tg.plan.parents.nbytes) + 16 * tg.n_tiles
        self.flops = None  # measured FLOP/s of whole inferences of this graph on this server (EWMA)


class ModelStore:
    """ONNX bytes by model_hash and compiled graphs by graph_id, each an LRU bounded in bytes."""

    def __init__(self, max_model_bytes: int = 512 << 20, max_graphs: int = 32,
                 max_graph_bytes: int = 4 << 30, max_onnx_bytes: int = 4 << 30,
                 cache_dir: str | os.PathLike | None = None):
        self.max_model_bytes = int(max_model_bytes)
        self.max_graphs = int(max_graphs)
        self.max_graph_bytes = int(max_graph_bytes)
        self.max_onnx_bytes = int(max_onnx_bytes)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._graphs: OrderedDict[str, GraphEntry] = OrderedDict()
        self._onnx: OrderedDict[str, bytes] = OrderedDict()
        self._pinned_onnx: set[str] = set()
        self.compiled = 0
        self.evicted = 0

    # -------------------------------------------------------------- preload

    def preload(self, directory: str | os.PathLike) -> list[dict]:
        """Loads every .onnx (hashed) and .ctg file of a folder, pinned; returns what was loaded.
        Raises CoactoError if the folder is missing; a file that does not load is logged and
        skipped."""
        from ..onnx_import import load_model

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
                    self.add_graph(tg, pinned=True)
                    loaded.append({"file": path.name, "kind": "ctg", "graph_id": tg.graph_id,
                                   "model_hash": tg.model_hash, "tiles": tg.n_tiles,
                                   "params": tg.params})
            except CoactoError as e:
                log.warning("skipping %s: %s", path, e)
        return loaded

    # -------------------------------------------------------------- ONNX bytes

    def has_model(self, model_hash: str) -> bool:
        with self._lock:
            if model_hash in self._onnx:
                return True
        return self._cache_path(model_hash) is not None and self._cache_path(model_hash).is_file()

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

    def put_model(self, data: bytes, model_hash: str, pinned: bool = False) -> None:
        """Stores verified ONNX bytes (the caller checked sha256(data) == model_hash)."""
        with self._lock:
            self._onnx[model_hash] = data
            self._onnx.move_to_end(model_hash)
            if pinned:
                self._pinned_onnx.add(model_hash)
            self._evict_onnx()
        path = self._cache_path(model_hash)
        if path is not None and not pinned and not path.exists():
            tmp = path.with_suffix(".tmp")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError as e:
                log.warning("cannot write %s to the model cache: %s", path.name, e)

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

    def graph(self, graph_id: str) -> GraphEntry | None:
        with self._lock:
            entry = self._graphs.get(graph_id)
            if entry is not None:
                self._graphs.move_to_end(graph_id)
            return entry

    def add_graph(self, tg: TileGraph, pinned: bool = False) -> GraphEntry:
        """Caches a tile graph, its weights packed for the native runtime (done here, off the I/O
        thread, so the first BEGIN does not pay for it)."""
        from ..runtime import native_graph

        native_graph(tg)
        entry = GraphEntry(tg, pinned)
        with self._lock:
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

    def ensure_graph(self, graph_id: str, model_hash: str, params, data=None) -> GraphEntry | None:
        """The graph `graph_id`, compiled from the stored (or given) ONNX bytes if needed.

        Returns None when the model is not in the store (MODEL_MISSING). Raises StoreError when
        the upload is too large, does not hash to model_hash, or does not compile to graph_id.
        Slow (compiles): the server runs it on its worker thread."""
        entry = self.graph(graph_id)
        if entry is not None:
            return entry
        kw = check_params(params)
        if data is not None:
            if len(data) > self.max_model_bytes:
                raise StoreError(P.E_MODEL_TOO_LARGE, f"the model has {len(data)} bytes; the "
                                                      f"limit is {self.max_model_bytes}")
            digest = hashlib.sha256(data).hexdigest()
            if digest != model_hash:
                raise StoreError(P.E_MODEL_INVALID, f"the uploaded bytes hash to {digest}, not "
                                                    f"the model_hash {model_hash}; upload the "
                                                    f"model file itself")
            data = bytes(data)
            self.put_model(data, model_hash)
        else:
            data = self.model_bytes(model_hash)
            if data is None:
                return None
        from .. import compile as coacto_compile

        try:
            tg = coacto_compile(data, **kw)
        except CoactoError as e:
            raise StoreError(P.E_MODEL_INVALID, f"the model does not compile: {e}") from None
        if tg.graph_id != graph_id:
            raise StoreError(P.E_MODEL_INVALID, (
                f"model {model_hash[:12]} with params {tg.params} compiles to graph "
                f"{tg.graph_id[:12]} here, not {str(graph_id)[:12]}; the device and this server "
                f"partition differently (this server's partitioner version is "
                f"{PARTITIONER_VERSION}) or the params differ"))
        if tg.n_tiles > MAX_GRAPH_TILES:
            raise StoreError(P.E_MODEL_INVALID, f"the graph has {tg.n_tiles} tiles; this server "
                                                f"takes at most {MAX_GRAPH_TILES}")
        self.compiled += 1
        log.info("compiled model %s into graph %s (%d tiles, %.3g GFLOP)", model_hash[:12],
                 graph_id[:12], tg.n_tiles, tg.total_flops / 1e9)
        return self.add_graph(tg)

    # -------------------------------------------------------------- stats

    def stats(self) -> dict:
        with self._lock:
            return {"graphs": len(self._graphs), "models": len(self._onnx),
                    "graph_bytes": sum(e.nbytes for e in self._graphs.values()),
                    "model_bytes": sum(len(v) for v in self._onnx.values()),
                    "compiled": self.compiled, "evicted": self.evicted}
