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
from .partition import PARTITIONER_VERSION, TilePlan

MAGIC = b"COACTOTG"
FORMAT_VERSION = 3  # 3: CONV layers carry four array slots (a pointwise prologue's two)
_ALIGN = 64
_PREFIX = struct.Struct("<8sIIQ")

#: Each op's weight keys in its native array slots' order (coacto.ir.OPS).
ARRAY_SLOTS = {c.name: c.arrays for c in ir.OPS.values() if c.arrays}


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
    #: the graph (cut into other tiles) whose native graph packs the weights this one runs on
    _weights_of: object = field(default=None, repr=False, compare=False)

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
        """Inputs to run the graph on: standard normal values for float inputs; for integer
        inputs valid ids below their table size (index_limit), else ones (attention masks)."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for name, shape in self.inputs.items():
            layer = self.graph.layers[self.graph.inputs[name]]
            if not ir.integer_input(layer):
                dtype = ir.FLOAT_NUMPY_TYPES.get(layer.attrs.get("dtype"), np.float32)
                feeds[name] = rng.standard_normal(shape).astype(dtype)
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

    def retiled(self, plan: TilePlan, params: dict) -> "TileGraph":
        """The same model cut into other tiles (``plan``, made by coacto.partition from this
        graph's ``graph``; ``params`` name it, so it has a graph id of its own). The weight blob is
        shared, not copied, and the native runtime packs the weights once for both graphs
        (coacto_graph_create_sharing): a device keeps one graph for offloading and one for local
        speed at the memory of one."""
        if len(plan.layer_first_tile) != len(self.plan.layer_first_tile):
            raise ValueError("the plan is not one of this graph's layers")
        tg = TileGraph(graph=self.graph, plan=plan, params=params,
                       graph_id=graph_identity(self.model_hash, params), blob=self.blob,
                       arrays=self.arrays, _mapping=self._mapping)
        tg._weights_of = self._weights_of if self._weights_of is not None else self
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
            "inputs": g.inputs, "outputs": g.outputs, "output_dtypes": g.output_dtypes,
            "layers": layers,
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
        prefix, pad = _framing(header, len(self.blob))
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
        stays a view of `data`, not a copy). Raises GraphFileError for anything but a well-formed
        file: its header is checked against everything later code indexes with (ops, layer and
        tile references, array slots, sizes) before anything is allocated from it."""
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
        except Exception as e:  # a header that passed the checksum but does not parse
            raise GraphFileError(f"{origin} has an unreadable header ({e}){redo}") from None
        try:
            return cls._from_header(h, memoryview(data)[blob_start:end])
        except GraphFileError as e:
            raise GraphFileError(f"{origin} is inconsistent: {e}{redo}") from None
        except Exception as e:  # a check above is missing: still the file's fault, not a crash
            err = GraphFileError(f"{origin} is inconsistent (internal error: "
                                 f"{type(e).__name__}: {e}){redo}")
            err.internal = True
            raise err from e

    @classmethod
    def _from_header(cls, h: dict, blob: bytes) -> "TileGraph":
        check_header(h, len(blob))
        layers, arrays = [], []
        for ld in h["layers"]:
            layers.append(ir.Layer(
                name=ld["name"], op=ld["op"], inputs=list(ld["inputs"]), shape=tuple(ld["shape"]),
                attrs=dict(ld["attrs"]),
                onnx_shape=tuple(ld["onnx_shape"]) if ld.get("onnx_shape") is not None else None,
                layout=ld.get("layout", ir.LAYOUT_CHANNELS)))
            arrays.append([ArraySpec(a[0], a[1], tuple(a[2]), int(a[3]), int(a[4]))
                           for a in ld["arrays"]])
        graph = ir.Graph(layers=layers, inputs=dict(h["inputs"]), outputs=dict(h["outputs"]),
                         model_hash=h["model_hash"], output_dtypes=dict(h.get("output_dtypes", {})))
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


def _framing(header: bytes, blob_size: int) -> tuple[bytes, bytes]:
    """The prefix before a .ctg header and the padding after it."""
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header), blob_size)
    return prefix, b"\0" * ((-(len(prefix) + len(header))) % _ALIGN)


def frame(header: bytes, blob: bytes = b"") -> bytes:
    """The bytes of a .ctg file around a packed header and a blob (prefix, padding, checksum):
    what save writes, in memory. Tests and fuzzers use it to build files with crafted headers."""
    prefix, pad = _framing(header, len(blob))
    body = b"".join((prefix, header, pad, bytes(blob)))
    return body + hashlib.sha256(body).digest()


# ---------------------------------------------------------------------------- header checks

#: Attributes a layer of each op must carry: what the runtime's layer descriptions and the FLOP
#: counts read (the native validator checks their values).
_REQUIRED_ATTRS = {
    "CONV": ("kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr", "group"),
    "POOL": ("kh", "kw", "sh", "sw", "pt", "pl", "pb", "pr", "kind"),
    "GLOBAL_POOL": ("kind",), "BINARY": ("kind",), "LRN": ("size", "alpha", "beta", "bias"),
    "LAYERNORM": ("eps",), "ROW_REDUCE": ("kind",), "WHERE": ("operands",),
    "MATMUL": ("batch0", "batch1", "m", "n", "k"),
    "ATTENTION": ("batch0", "batch1", "m", "n", "k", "dv"),
}
#: Attributes the runtime reads as floats (coacto_layer_desc.fparams); every other one is one of
#: its int32 parameters.
_FLOAT_ATTRS = frozenset({"alpha", "beta", "bias", "eps", "scale", "fill", "pre_alpha",
                          "pre_beta"})
#: ONNX element types inputs and outputs may declare besides float32 (coacto.ir).
_IO_DTYPES = (*ir.INTEGER_NUMPY_TYPES, *ir.FLOAT_NUMPY_TYPES)
#: The native runtime's limits (native/src/graph.c): a file beyond them is refused here, before
#: the tile arrays are allocated.
MAX_LAYERS = 1 << 20
MAX_TILES = 1 << 26
_MAX_INPUTS = 8  # COACTO_MAX_INPUTS
_INT32_MAX = (1 << 31) - 1


def _need(d: dict, key: str, kind, where: str):
    if key not in d:
        raise GraphFileError(f"{where} has no {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise GraphFileError(f"{where}: {key!r} is a {type(v).__name__}, not a "
                             f"{getattr(kind, '__name__', 'value of the expected type')}")
    return v


def _ints(v, where: str, lo: int, hi: int = _INT32_MAX) -> list[int]:
    if not isinstance(v, (list, tuple)) or not all(type(x) is int for x in v):
        raise GraphFileError(f"{where} must be a list of integers")
    if any(not lo <= x <= hi for x in v):
        raise GraphFileError(f"{where} = {list(v)[:8]} has a value outside {lo}..{hi}")
    return list(v)


def _bounds(b, total: int, where: str) -> int:
    """The number of blocks of a split stored as int64 bytes, checking that
    0 = b[0] < ... < b[-1] = total."""
    if not isinstance(b, bytes) or len(b) % 8 or len(b) < 16:
        raise GraphFileError(f"{where} must hold at least two int64 values")
    a = np.frombuffer(b, "<i8")
    if a[0] != 0 or a[-1] != total or (np.diff(a) <= 0).any():
        raise GraphFileError(f"{where} must rise strictly from 0 to {total}")
    return len(a) - 1


def check_header(h, blob_size: int) -> None:
    """Raises GraphFileError unless a .ctg header is consistent: every op known, every layer,
    tile and array reference in range, every size within MAX_TENSOR_ELEMENTS,
    MAX_TOTAL_ELEMENTS, MAX_LAYERS and MAX_TILES. Costs one pass over the header."""
    if not isinstance(h, dict):
        raise GraphFileError("the header is not a map")
    for key in ("graph_id", "model_hash"):
        _need(h, key, str, "the header")
    _need(h, "params", dict, "the header")
    layers = _need(h, "layers", list, "the header")
    if not 1 <= len(layers) <= MAX_LAYERS:
        raise GraphFileError(f"the header has {len(layers)} layers (1..{MAX_LAYERS} allowed)")
    total = 0
    for li, ld in enumerate(layers):
        where = f"layer {li}"
        if not isinstance(ld, dict):
            raise GraphFileError(f"{where} is not a map")
        name = _need(ld, "name", str, where)
        where = f"layer {li} ({name!r})"
        op = _need(ld, "op", str, where)
        if op not in ir.OP_CODES:
            raise GraphFileError(f"{where} has unknown op {op!r}; this coacto runs "
                                 f"{', '.join(sorted(ir.OP_CODES))} (a newer coacto wrote it?)")
        inputs = _ints(_need(ld, "inputs", list, where), f"{where}: inputs", 0, li - 1)
        if len(inputs) > _MAX_INPUTS or (op == "INPUT") != (not inputs):
            raise GraphFileError(f"{where}: a {op} layer with {len(inputs)} inputs")
        shape = _ints(_need(ld, "shape", list, where), f"{where}: shape", 1)
        if len(shape) != 4:
            raise GraphFileError(f"{where}: shape {shape} is not (N, C, H, W)")
        size = ir.check_elements(shape, where, GraphFileError, hint="")
        if shape[0] * shape[2] * shape[3] > _INT32_MAX:
            raise GraphFileError(f"{where}: {shape} has more than 2^31 columns")
        total += size
        onnx_shape = ld.get("onnx_shape")
        if onnx_shape is not None:
            onnx_shape = _ints(onnx_shape, f"{where}: onnx_shape", 1)
            if len(onnx_shape) > ir.MAX_RANK or math.prod(onnx_shape) != size:
                raise GraphFileError(f"{where}: onnx_shape {onnx_shape} does not hold the "
                                     f"{size} values of shape {shape}")
        if ld.get("layout", ir.LAYOUT_CHANNELS) not in (ir.LAYOUT_CHANNELS, ir.LAYOUT_LAST):
            raise GraphFileError(f"{where}: unknown layout {ld.get('layout')!r}")
        attrs = _need(ld, "attrs", dict, where)
        for k, v in attrs.items():
            if not isinstance(k, str) or type(v) not in (int, float):
                raise GraphFileError(f"{where}: attribute {k!r} = {v!r} is not a number")
            if k not in _FLOAT_ATTRS and (type(v) is not int or not -_INT32_MAX <= v <= _INT32_MAX):
                raise GraphFileError(f"{where}: attribute {k!r} = {v!r} is not a 32-bit integer")
        if op == "INPUT" and (attrs.get("dtype", _IO_DTYPES[0]) not in _IO_DTYPES
                              or attrs.get("index_limit", 1) < 1):
            raise GraphFileError(f"{where}: input element type {attrs.get('dtype')} / index "
                                 f"limit {attrs.get('index_limit')} (one of the ONNX types "
                                 f"{_IO_DTYPES} and a positive table size expected)")
        missing = [k for k in _REQUIRED_ATTRS.get(op, ()) if k not in attrs]
        if missing:
            raise GraphFileError(f"{where}: a {op} layer without attributes {missing}")
        if op == "CONV" and (type(attrs["group"]) is not int or attrs["group"] < 1):
            raise GraphFileError(f"{where}: group {attrs['group']} (must be at least 1)")
        _check_arrays(_need(ld, "arrays", list, where), op, blob_size, where)
    if total > ir.MAX_TOTAL_ELEMENTS:
        raise GraphFileError(f"the layers hold {total} values together, more than "
                             f"{ir.MAX_TOTAL_ELEMENTS} (coacto.ir.MAX_TOTAL_ELEMENTS)")
    for key in ("inputs", "outputs"):
        for name, li in _need(h, key, dict, "the header").items():
            if not isinstance(name, str) or type(li) is not int or not 0 <= li < len(layers):
                raise GraphFileError(f"{key[:-1]} {name!r} refers to layer {li!r}; the file has "
                                     f"layers 0..{len(layers) - 1}")
            if key == "inputs" and layers[li]["op"] != "INPUT":
                raise GraphFileError(f"input {name!r} refers to layer {li}, a "
                                     f"{layers[li]['op']} layer, not an INPUT")
            if layers[li].get("onnx_shape") is None:  # what callers feed and are given back
                raise GraphFileError(f"{key[:-1]} {name!r}: layer {li} has no onnx_shape")
    if not h["outputs"]:
        raise GraphFileError("the graph has no outputs")
    dtypes = h.get("output_dtypes", {})
    if not isinstance(dtypes, dict) or any(
            name not in h["outputs"] or elem not in _IO_DTYPES for name, elem in dtypes.items()):
        raise GraphFileError(f"output_dtypes {dtypes!r}: each must name an output and one of "
                             f"the ONNX types {_IO_DTYPES}")
    _check_tiles(_need(h, "tiles", dict, "the header"), layers)


def _check_arrays(specs: list, op: str, blob_size: int, where: str) -> None:
    slots = ARRAY_SLOTS.get(op, ())
    if len(specs) != len(slots):
        raise GraphFileError(f"{where}: {len(specs)} weight arrays, a {op} layer has "
                             f"{len(slots)} ({', '.join(slots) or 'none'})")
    for slot, a in zip(slots, specs):
        if not isinstance(a, list) or len(a) != 5 or a[0] != slot:
            raise GraphFileError(f"{where}: weight array {a!r} is not [{slot!r}, dtype, shape, "
                                 "offset, size]")
        _, dtype, shape, offset, size = a
        if dtype not in ("float32", "int32"):
            raise GraphFileError(f"{where}: weight array {slot!r} has dtype {dtype!r}")
        shape = _ints(shape, f"{where}: weight array {slot!r} shape", 0)
        if type(offset) is not int or type(size) is not int or offset < 0 or size < 0:
            raise GraphFileError(f"{where}: weight array {slot!r} has offset {offset!r} and "
                                 f"size {size!r}")
        if size and (math.prod(shape) * 4 != size or offset % _ALIGN
                     or offset + size > blob_size):
            raise GraphFileError(f"weight array {slot!r} of {where} (shape {shape}, offset "
                                 f"{offset}, {size} bytes) lies outside the file's blob "
                                 f"({blob_size} bytes) or does not match its shape")
    if op == "EMBED" and not specs[0][4]:
        raise GraphFileError(f"{where}: an EMBED layer without its table")


def _check_tiles(t: dict, layers: list) -> None:
    cols, rows = (_need(t, k, list, "the tile table") for k in ("col_bounds", "row_bounds"))
    if len(cols) != len(layers) or len(rows) != len(layers):
        raise GraphFileError(f"the tile table splits {len(cols)} and {len(rows)} layers, the "
                             f"file has {len(layers)}")
    n_tiles = 0
    for li, (cb, rb, ld) in enumerate(zip(cols, rows, layers)):
        n, c, hh, w = ld["shape"]
        n_tiles += (_bounds(cb, n * hh * w, f"layer {li}'s column bounds")
                    * _bounds(rb, c, f"layer {li}'s row bounds"))
        if n_tiles > MAX_TILES:
            raise GraphFileError(f"the file has more than {MAX_TILES} tiles")
    offsets, parents, flops = (_need(t, k, bytes, "the tile table")
                               for k in ("parent_offsets", "parents", "flops"))
    if len(offsets) != 4 * (n_tiles + 1) or len(flops) != 8 * n_tiles or len(parents) % 4:
        raise GraphFileError(f"the tile arrays disagree with the layer splits ({n_tiles} tiles)")
    off = np.frombuffer(offsets, "<i4").astype(np.int64)
    par = np.frombuffer(parents, "<i4")
    if off[0] != 0 or off[-1] != par.size or (np.diff(off) < 0).any():
        raise GraphFileError("the parent offsets must rise from 0 to the number of parents")
    child = np.repeat(np.arange(n_tiles, dtype=np.int64), np.diff(off))
    if ((par < 0) | (par >= child)).any():
        raise GraphFileError("a tile names a parent that is not an earlier tile")


def plan_from_bounds(col_bounds, row_bounds, parent_offsets, parents, flops) -> TilePlan:
    counts = [(len(c) - 1) * (len(r) - 1) for c, r in zip(col_bounds, row_bounds)]
    n_tiles = int(sum(counts))
    if parent_offsets.shape[0] != n_tiles + 1 or flops.shape[0] != n_tiles:
        raise GraphFileError("tile arrays disagree with the layer splits")
    return TilePlan.from_splits(col_bounds, row_bounds, parent_offsets, parents, flops)
