"""Fuzz target: the .ctg tile graph loader (coacto.TileGraph.from_bytes) and the native graph
validator every loaded graph goes through before it runs (coacto.runtime.native_graph).

``check(data)`` returns when the bytes load or are refused with a CoactoError; anything else
propagates (a bug). Random bytes almost never pass the file's sha256, so each input is also tried
reframed: its header (one msgpack value) and what follows it as the blob, with the prefix and
checksum recomputed. Mutations then reach the header checks and the native validator.

    python fuzz/fuzz_ctg.py /tmp/ctg-corpus fuzz/corpus/ctg -max_total_time=120

(libFuzzer writes new inputs into the first folder: give it a scratch copy, not the committed
seeds.) A crash is saved as ./crash-<sha1>: minimise it (-minimize_crash=1), fix the loader, and
keep the input as tests/fuzz_crashes/ctg/<name>.
"""
from __future__ import annotations

import struct
import sys

#: Size limits while fuzzing (coacto.ir's are 2^28 and 2^31): an input that declares a large
#: graph is refused as it would be in production, without minutes spent building it.
TENSOR_LIMIT = 1 << 16
TOTAL_LIMIT = 1 << 20

_PREFIX = struct.Struct("<8sIIQ")  # coacto.tilegraph's file prefix


def _reframed(data: bytes) -> bytes | None:
    """The input as a well-framed file: the header ends where its msgpack value ends (so a
    mutation may grow or shrink it), the blob starts where the prefix put it, or right after
    the header if that is later, and ends before the last 32 bytes (the old checksum)."""
    import msgpack

    from coacto import tilegraph

    if len(data) < _PREFIX.size or data[:8] != tilegraph.MAGIC:
        return None
    hlen = _PREFIX.unpack_from(data)[2]
    body = data[_PREFIX.size:]
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(body)
    try:
        unpacker.skip()
        end = unpacker.tell()
    except Exception:  # not one msgpack value: keep the prefix's length
        end = min(hlen, len(body))
    blob_start = max(end, hlen + (-(_PREFIX.size + hlen)) % 64)
    rest = body[blob_start:]
    return tilegraph.frame(body[:end], rest[:-32] if len(rest) >= 32 else b"")


def check(data: bytes) -> None:
    from coacto import ir
    from coacto.errors import CoactoError
    from coacto.runtime import native_graph
    from coacto.tilegraph import TileGraph

    limits = ir.MAX_TENSOR_ELEMENTS, ir.MAX_TOTAL_ELEMENTS
    ir.MAX_TENSOR_ELEMENTS, ir.MAX_TOTAL_ELEMENTS = TENSOR_LIMIT, TOTAL_LIMIT
    try:
        for candidate in (data, _reframed(data)):
            if candidate is None:
                continue
            try:
                graph = TileGraph.from_bytes(candidate, "<fuzz input>")
                native_graph(graph)
                graph.summary(), graph.inputs, graph.outputs, graph.example_feeds()
            except CoactoError as e:
                if e.internal:  # refused, but only by a safety net: a check is missing
                    raise
    finally:
        ir.MAX_TENSOR_ELEMENTS, ir.MAX_TOTAL_ELEMENTS = limits


if __name__ == "__main__":
    import atheris

    with atheris.instrument_imports(include=["coacto"]):
        import coacto.runtime  # noqa: F401
        import coacto.tilegraph  # noqa: F401
    atheris.Setup(sys.argv, lambda d: check(d))
    atheris.Fuzz()
