"""The tile graph: operator graph + tiles + exact dependencies + packed weights, and its file.

File format (``.ctg``), little-endian:

    offset 0   magic  b"COACTOTG"
           8   u32    format version (FORMAT_VERSION)
          12   u32    header length H
          16   u64    blob length B
          24   H      msgpack header (model identity, inputs, outputs, layers, tiles)
               pad    zeros up to a multiple of 64
               B      blob: every weight array, each at a 64-byte aligned offset
               32     sha256 of everything before it

The identity of a tile graph (``graph_id``) is the sha256 of the ONNX model's bytes and the
partition parameters: a device and a server that compile the same model with the same parameters
derive the same tiles with the same ids, and the id proves it.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np

from . import ir
from .errors import GraphFileError
from .partition import TilePlan

MAGIC = b"COACTOTG"
FORMAT_VERSION = 2
#: Bumped whenever partitioning changes the tiles it derives for the same parameters.
PARTITIONER_VERSION = 5
_ALIGN = 64
_PREFIX = struct.Struct("<8sIIQ")

# Weight array slots per op, in the order of coacto_layer_desc.arrays (native/src/ops.h).
ARRAY_SLOTS = {
    "CONV": ("w", "b"),
    "BINARY": ("k",),
    "AFFINE": ("scale", "shift"),
    "GATHER": ("index", "const"),
    "LAYERNORM": ("scale", "shift"),
    "WHERE": ("cond", "x", "y"),
    "EMBED": ("table",),
}


def graph_identity(model_hash: str, params: dict) -> str:
    canon = json.dumps({"model": model_hash, "params": params,
                        "partitioner": PARTITIONER_VERSION}, sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()


@dataclass
class ArraySpec:
    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    size: int


@dataclass
class TileGraph:
    """A compiled model: what coacto.compile returns and coacto.load reads back."""

    graph: ir.Graph
    plan: TilePlan
    params: dict
    graph_id: str
    blob: bytes | bytearray | memoryview  # every weight array, 64-byte aligned offsets
    arrays: list[list[ArraySpec]]  # per layer, in ARRAY_SLOTS order
    _native: object = field(default=None, repr=False, compare=False)
    _mapping: object = field(default=None, repr=False, compare=False)  # mmap behind blob, if any

    # -------------------------------------------------------------- properties

    @property
    def model_hash(self) -> str:
        return self.graph.model_hash

    @property
    def n_tiles(self) -> int:
        return self.plan.n_tiles

    @property
    def n_layers(self) -> int:
        return len(self.graph.layers)

    @property
    def inputs(self) -> dict[str, tuple[int, ...]]:
        """Input name -> ONNX shape."""
        return {name: tuple(self.graph.layers[li].onnx_shape) for name, li in self.graph.inputs.items()}

    @property
    def outputs(self) -> dict[str, tuple[int, ...]]:
        """Output name -> ONNX shape."""
        return {name: tuple(self.graph.layers[li].onnx_shape) for name, li in self.graph.outputs.items()}

    def example_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs to run the graph on: standard normal float32 for float inputs; for integer
        inputs valid ids below their table size (index_limit), else ones (attention masks)."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for name, shape in self.inputs.items():
            layer = self.graph.layers[self.graph.inputs[name]]
            if layer.attrs.get("dtype") is None:
                feeds[name] = rng.standard_normal(shape).astype(np.float32)
            else:
                from onnx import helper

                dtype = helper.tensor_dtype_to_np_dtype(int(layer.attrs["dtype"]))
                limit = layer.attrs.get("index_limit")
                values = rng.integers(0, limit, shape) if limit is not None else np.ones(shape)
                feeds[name] = values.astype(dtype)
        return feeds

    @property
    def total_flops(self) -> float:
        return float(self.plan.tile_flops.sum())

    def dependencies(self, tile: int) -> np.ndarray:
        """Parent tile ids of a tile."""
        return self.plan.dependencies(tile)

    def summary(self) -> dict:
        return {
            "graph_id": self.graph_id, "model_hash": self.model_hash, "layers": self.n_layers,
            "tiles": self.n_tiles, "dependencies": int(self.plan.parents.shape[0]),
            "gflops": self.total_flops / 1e9, "weights_mb": len(self.blob) / 1e6,
            "params": self.params,
        }

    # -------------------------------------------------------------- build

    @classmethod
    def build(cls, graph: ir.Graph, plan: TilePlan, params: dict) -> "TileGraph":
        """Lay the weights out in one aligned blob; layer weights become views of it.

        Each array is copied once, straight into its place (the blob is allocated first): a
        model's weights are never held three times over while the blob is built."""
        offset = 0
        arrays: list[list[ArraySpec]] = []
        for layer in graph.layers:
            specs = []
            for key in ARRAY_SLOTS.get(layer.op, ()):
                if key not in layer.weights:
                    specs.append(ArraySpec(key, "float32", (0,), 0, 0))
                    continue
                dtype = np.dtype(np.int32 if key == "index" else np.float32)
                shape = tuple(np.shape(layer.weights[key]))
                size = math.prod(shape) * dtype.itemsize
                specs.append(ArraySpec(key, dtype.name, shape, offset, size))
                offset += size + (-size) % _ALIGN
            arrays.append(specs)
        blob = bytearray(offset)
        for layer, specs in zip(graph.layers, arrays):
            for s in specs:
                if s.size:
                    dst = np.frombuffer(blob, dtype=s.dtype, offset=s.offset,
                                        count=s.size // np.dtype(s.dtype).itemsize)
                    dst[...] = np.asarray(layer.weights[s.key]).reshape(-1)
        tg = cls(graph=graph, plan=plan, params=params,
                 graph_id=graph_identity(graph.model_hash, params), blob=blob, arrays=arrays)
        tg._attach_weights()
        return tg

    def _attach_weights(self) -> None:
        for layer, specs in zip(self.graph.layers, self.arrays):
            for s in specs:
                if s.size:
                    layer.weights[s.key] = np.frombuffer(
                        self.blob, dtype=s.dtype, count=s.size // np.dtype(s.dtype).itemsize,
                        offset=s.offset).reshape(s.shape)

    # -------------------------------------------------------------- file

    def _header(self) -> dict:
        g, p = self.graph, self.plan
        layers = []
        for layer, specs in zip(g.layers, self.arrays):
            layers.append({
                "name": layer.name, "op": layer.op, "inputs": list(layer.inputs),
                "shape": list(layer.shape),
                "onnx_shape": list(layer.onnx_shape) if layer.onnx_shape is not None else None,
                "layout": layer.layout,
                "attrs": {k: (float(v) if isinstance(v, float) else int(v))
                          for k, v in layer.attrs.items()},
                "arrays": [[s.key, s.dtype, list(s.shape), s.offset, s.size] for s in specs],
            })
        return {
            "format": FORMAT_VERSION, "graph_id": self.graph_id, "model_hash": g.model_hash,
            "params": self.params,
            "inputs": g.inputs, "outputs": g.outputs, "layers": layers,
            "tiles": {
                "col_bounds": [b.astype("<i8").tobytes() for b in p.col_bounds],
                "row_bounds": [b.astype("<i8").tobytes() for b in p.row_bounds],
                "parent_offsets": p.parent_offsets.astype("<i4").tobytes(),
                "parents": p.parents.astype("<i4").tobytes(),
                "flops": p.tile_flops.astype("<f8").tobytes(),
            },
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tile graph file (written to a temporary name, then renamed)."""
        path = Path(path)
        header = msgpack.packb(self._header(), use_bin_type=True)
        prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header), len(self.blob))
        pad = b"\0" * ((-(len(prefix) + len(header))) % _ALIGN)
        digest = hashlib.sha256()
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as f:
            for part in (prefix, header, pad, self.blob):
                digest.update(part)
                f.write(part)
            f.write(digest.digest())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TileGraph":
        """Read a tile graph file. The file is mapped, not copied: once the native runtime has
        packed the weights (NativeGraph), release_blob_pages() hands the mapped pages back, so a
        running model holds its weights once (packed), and the blob is read again from the file
        only if something asks for it (save, another native load). So the file must not be
        rewritten in place while the graph is in use; coacto itself replaces files by renaming
        (save), which leaves a mapped file intact."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                try:
                    mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
                    data = memoryview(mapping) if mapping is not None else b""
                except (OSError, ValueError):  # a file system that cannot map: read it
                    mapping, data = None, f.read()
        except FileNotFoundError:
            raise GraphFileError(f"{path}: no such tile graph file; create one with "
                                 f"`coacto compile MODEL.onnx -o {path.name}`") from None
        except OSError as e:
            raise GraphFileError(f"{path}: cannot read it ({e.strerror or e})") from None
        tg = cls.from_bytes(data, str(path))
        tg._mapping = mapping
        tg.release_blob_pages()  # the checksum read every page; packing reads them again
        return tg

    @property
    def blob_is_mapped(self) -> bool:
        """The blob is a read-only file mapping (load), not memory of this process."""
        return self._mapping is not None

    def release_blob_pages(self) -> None:
        """Drops the resident pages of a file-mapped blob (a no-op for blobs in memory): they
        are reloaded from the file on the next access. Called once the weights are packed."""
        if self._mapping is not None and hasattr(self._mapping, "madvise"):
            try:
                self._mapping.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError, AttributeError):
                pass

    @classmethod
    def from_bytes(cls, data, origin: str = "<bytes>") -> "TileGraph":
        """A tile graph from the bytes of a .ctg file (bytes, bytearray or memoryview; the blob
        stays a view of `data`, not a copy)."""
        redo = f"; compile the model again with `coacto compile` to replace {origin}"
        if len(data) < _PREFIX.size + 32 or data[:8] != MAGIC:
            raise GraphFileError(f"{origin} is not a coacto tile graph file (bad magic){redo}")
        _, version, hlen, blen = _PREFIX.unpack_from(data)
        if version != FORMAT_VERSION:
            raise GraphFileError(f"{origin} has tile graph format {version}, this coacto reads "
                                 f"format {FORMAT_VERSION}{redo}")
        body_start = _PREFIX.size + hlen
        blob_start = body_start + ((-body_start) % _ALIGN)
        end = blob_start + blen
        if end + 32 != len(data):
            raise GraphFileError(f"{origin} is truncated or has trailing bytes "
                                 f"({len(data)} bytes, expected {end + 32}){redo}")
        if hashlib.sha256(memoryview(data)[:end]).digest() != data[end:]:
            raise GraphFileError(f"{origin} is corrupt (checksum mismatch){redo}")
        try:
            h = msgpack.unpackb(data[_PREFIX.size:body_start], raw=False, strict_map_key=False)
            return cls._from_header(h, memoryview(data)[blob_start:end])
        except GraphFileError:
            raise
        except Exception as e:  # a header that passed the checksum but does not parse
            raise GraphFileError(f"{origin} has an unreadable header ({e}){redo}") from None

    @classmethod
    def _from_header(cls, h: dict, blob: bytes) -> "TileGraph":
        layers, arrays = [], []
        for ld in h["layers"]:
            layers.append(ir.Layer(
                name=ld["name"], op=ld["op"], inputs=list(ld["inputs"]), shape=tuple(ld["shape"]),
                attrs=dict(ld["attrs"]),
                onnx_shape=tuple(ld["onnx_shape"]) if ld["onnx_shape"] is not None else None,
                layout=ld.get("layout", ir.LAYOUT_CHANNELS)))
            arrays.append([ArraySpec(a[0], a[1], tuple(a[2]), int(a[3]), int(a[4]))
                           for a in ld["arrays"]])
        for specs in arrays:
            for s in specs:
                if s.size and (s.offset < 0 or s.offset + s.size > len(blob)
                               or s.dtype not in ("float32", "int32")):
                    raise GraphFileError(f"weight array {s.key} lies outside the file's blob")
        graph = ir.Graph(layers=layers, inputs=dict(h["inputs"]), outputs=dict(h["outputs"]),
                         model_hash=h["model_hash"])
        t = h["tiles"]
        col_bounds = [np.frombuffer(b, "<i8").astype(np.int64) for b in t["col_bounds"]]
        row_bounds = [np.frombuffer(b, "<i8").astype(np.int64) for b in t["row_bounds"]]
        plan = plan_from_bounds(col_bounds, row_bounds,
                                np.frombuffer(t["parent_offsets"], "<i4").astype(np.int32),
                                np.frombuffer(t["parents"], "<i4").astype(np.int32),
                                np.frombuffer(t["flops"], "<f8").astype(np.float64))
        tg = cls(graph=graph, plan=plan, params=dict(h["params"]), graph_id=h["graph_id"],
                 blob=blob, arrays=arrays)
        tg._attach_weights()
        return tg


def plan_from_bounds(col_bounds, row_bounds, parent_offsets, parents, flops) -> TilePlan:
    counts = np.asarray([(len(c) - 1) * (len(r) - 1) for c, r in zip(col_bounds, row_bounds)])
    first = np.zeros(len(counts) + 1, dtype=np.int64)
    first[1:] = np.cumsum(counts)
    n_tiles = int(first[-1])
    if parent_offsets.shape[0] != n_tiles + 1 or flops.shape[0] != n_tiles:
        raise GraphFileError("tile arrays disagree with the layer splits")
    bounds = np.zeros((n_tiles, 4), dtype=np.int32)
    for li, (cb, rb) in enumerate(zip(col_bounds, row_bounds)):
        s = slice(first[li], first[li + 1])
        bounds[s, 0] = np.repeat(cb[:-1], len(rb) - 1)
        bounds[s, 1] = np.repeat(cb[1:], len(rb) - 1)
        bounds[s, 2] = np.tile(rb[:-1], len(cb) - 1)
        bounds[s, 3] = np.tile(rb[1:], len(cb) - 1)
    tile_bytes = (bounds[:, 1] - bounds[:, 0]).astype(np.int64) * (bounds[:, 3] - bounds[:, 2]) * 4
    return TilePlan(col_bounds=list(col_bounds), row_bounds=list(row_bounds), layer_first_tile=first,
                    tile_layer=np.repeat(np.arange(len(counts), dtype=np.int32), counts),
                    tile_bounds=bounds, parent_offsets=parent_offsets, parents=parents,
                    tile_flops=flops, tile_bytes=tile_bytes)
