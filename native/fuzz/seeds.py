#!/usr/bin/env python3
"""Writes the graph fuzzer's seed corpus (native/fuzz/corpus/): small valid graphs, one or two per
op, in the byte layout graph_decode.h reads. A seed that decodes to a graph the validator accepts
lets the fuzzer start from deep inside each op's checks instead of finding the layout first.

    python3 native/fuzz/seeds.py            # rewrites native/fuzz/corpus/
    COACTO_FUZZ_VERBOSE=1 native/build/host/test_fuzz_graph native/fuzz/corpus   # each verdict
"""
from __future__ import annotations

import struct
from pathlib import Path

OPS = dict(INPUT=0, CONV=1, POOL=2, GLOBAL_POOL=3, BINARY=4, AFFINE=5, CONCAT=6, GATHER=7, LRN=8,
           SOFTMAX=9, NOP=10, MATMUL=11, LAYERNORM=12, ROW_REDUCE=13, WHERE=14, EMBED=15,
           ATTENTION=16)


def small(v: int) -> bytes:
    return bytes([v + 16]) if -16 <= v < 0xf0 - 16 else b"\xff" + struct.pack("<i", v)


def dim(v: int) -> bytes:
    return bytes([v]) if 0 <= v <= 16 else b"\xff" + small(v)


def real(v: float) -> bytes:
    b = v * 16 + 128
    return bytes([int(b)]) if b == int(b) and 0 <= b < 0xfd else b"\xff" + struct.pack("<f", v)


def layer(op: str, inputs=(), nchw=(1, 1, 1, 1), iparams=(), fparams=(), arrays=(),
          keep=False) -> bytes:
    """arrays: (byte offset, byte size) per array, in order."""
    out = bytes([OPS[op] + 1, len(inputs) + 1]) + bytes(i + 1 for i in inputs)
    out += b"".join(dim(d) for d in nchw)
    out += bytes([len(iparams)]) + b"".join(small(v) for v in iparams)
    out += bytes([len(fparams)]) + b"".join(real(v) for v in fparams)
    out += bytes([(1 << len(arrays)) - 1])
    for off, size in arrays:
        assert off % 64 == 0 and size % 4 == 0
        out += small(off // 64) + small(size // 4)
    return out + bytes([1 if keep else 0])


def graph(layers: list[bytes], blob_bytes=0, pattern=b"", grid=None) -> bytes:
    """grid: (column parts, row parts) per layer, default one tile each; parents: every tile of
    the layers read (tiles mode 0)."""
    grid = grid or [(1, 1)] * len(layers)
    out = bytes([len(layers) - 1]) + b"".join(layers)
    out += small(-(-blob_bytes // 64)) + bytes([len(pattern)]) + pattern
    out += bytes([0]) + b"".join(bytes([c - 1, r - 1]) for c, r in grid)
    return out + bytes([0])  # no corruptions


HALF = struct.pack("<f", 0.5)
ZERO_INDEX = struct.pack("<i", 0)


def seeds() -> dict[str, bytes]:
    x = layer("INPUT", nchw=(1, 4, 3, 3))
    return {
        "input_only": graph([layer("INPUT", nchw=(1, 4, 2, 2), keep=True)]),
        "affine": graph([x, layer("AFFINE", [0], (1, 4, 3, 3), [1], arrays=[(0, 16), (64, 16)],
                                  keep=True)], 128, HALF, grid=[(2, 2), (3, 2)]),
        "conv3x3": graph([x, layer("CONV", [0], (1, 8, 3, 3), [3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                                   arrays=[(0, 3 * 3 * 4 * 8 * 4), (1152, 32)], keep=True)],
                         1216, HALF, grid=[(1, 1), (3, 2)]),
        "conv_depthwise": graph([x, layer("CONV", [0], (1, 4, 3, 3),
                                          [3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 0],
                                          arrays=[(0, 3 * 3 * 4 * 4)], keep=True)], 192, HALF),
        "pool_max": graph([x, layer("POOL", [0], (1, 4, 2, 2), [2, 2, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0],
                                    keep=True)], grid=[(1, 1), (2, 2)]),
        "global_pool": graph([x, layer("GLOBAL_POOL", [0], (1, 4, 1, 1), [1], keep=True)]),
        "binary_add": graph([x, x, layer("BINARY", [0, 1], (1, 4, 3, 3), [0], keep=True)],
                            grid=[(2, 1), (1, 2), (3, 3)]),
        "binary_const": graph([x, layer("BINARY", [0], (1, 4, 3, 3), [2, 0, 0, 0, 1, 4, 1, 1],
                                        arrays=[(0, 16)], keep=True)], 64, HALF),
        "concat": graph([x, x, layer("CONCAT", [0, 1], (1, 8, 3, 3), keep=True)]),
        "gather": graph([x, layer("GATHER", [0], (1, 2, 3, 3), arrays=[(0, 18 * 4)], keep=True)],
                        128, ZERO_INDEX),
        "lrn": graph([x, layer("LRN", [0], (1, 4, 3, 3), [3], [0.5, 0.75, 1.0], keep=True)]),
        "softmax": graph([x, layer("SOFTMAX", [0], (1, 4, 3, 3), [0], keep=True)],
                         grid=[(1, 1), (3, 1)]),
        "nop": graph([x, layer("NOP", [0], (1, 4, 3, 3), keep=True)]),
        # A [1,1,3,4] x B [1,1,4,2]: a is 3 columns of 4, b 4 columns of 2 (b_sk 2, b_sj 1)
        "matmul": graph([layer("INPUT", nchw=(1, 4, 1, 3)), layer("INPUT", nchw=(1, 2, 1, 4)),
                         layer("MATMUL", [0, 1], (1, 2, 1, 3),
                               [1, 1, 3, 2, 4, 0, 0, 0, 4, 0, 0, 0, 2, 1, 0, 0, 0, 0],
                               [1.0, 0.0], keep=True)]),
        # x, 3 columns of 4, as the queries, keys (b_sk 1, b_sj 4) and values (v_sk 4, v_sj 1)
        "attention": graph([layer("INPUT", nchw=(1, 4, 1, 3)),
                            layer("ATTENTION", [0, 0, 0], (1, 4, 1, 3),
                                  [1, 1, 3, 3, 4, 0, 0, 0, 4, 0, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0,
                                   0, 0, 4, 0, 0, 0, 4, 1], [0.5], keep=True)]),
        "layernorm": graph([x, layer("LAYERNORM", [0], (1, 4, 3, 3), [], [0.0625],
                                     arrays=[(0, 16), (64, 16)], keep=True)], 128, HALF),
        "row_reduce": graph([x, layer("ROW_REDUCE", [0], (1, 1, 3, 3), [1], keep=True)]),
        "where": graph([x, x, x, layer("WHERE", [0, 1, 2], (1, 4, 3, 3), [7], keep=True)]),
        "embed": graph([layer("INPUT", nchw=(1, 1, 1, 5)),
                        layer("EMBED", [0], (1, 4, 1, 5), [6], arrays=[(0, 6 * 4 * 4)],
                              keep=True)], 128, HALF),
        "chain": graph([x, layer("AFFINE", [0], (1, 4, 3, 3), [1], arrays=[(0, 16), (64, 16)]),
                        layer("POOL", [1], (1, 4, 3, 3), [3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
                        layer("BINARY", [1, 2], (1, 4, 3, 3), [0, 1]),
                        layer("SOFTMAX", [3], (1, 4, 3, 3), [1], keep=True)], 128, HALF,
                       grid=[(2, 2), (3, 1), (2, 4), (1, 2), (3, 1)]),
    }


def main() -> None:
    out = Path(__file__).resolve().parent / "corpus"
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    for name, data in seeds().items():
        (out / name).write_bytes(data)
    print(f"{len(seeds())} seeds in {out}")


if __name__ == "__main__":
    main()
