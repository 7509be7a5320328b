"""Fuzz target: the ONNX importer, through coacto's public loading path (coacto.compile: parse
with onnx, import, partition, build the tile graph) and the native graph validator.

``check(data)`` returns when the bytes compile or are refused with a CoactoError; anything else
propagates (a bug). Size limits are lowered while it runs, so one input cannot take seconds.

    python fuzz/fuzz_onnx.py /tmp/onnx-corpus fuzz/corpus/onnx -max_total_time=120

(libFuzzer writes new inputs into the first folder: give it a scratch copy, not the committed
seeds.) A crash is saved as ./crash-<sha1>: minimise it (-minimize_crash=1), fix the importer,
and keep the input as tests/fuzz_crashes/onnx/<name>.
"""
from __future__ import annotations

import logging
import sys

#: Size limits while fuzzing (coacto.ir's are 2^28 and 2^31).
TENSOR_LIMIT = 1 << 16
TOTAL_LIMIT = 1 << 20


def check(data: bytes) -> None:
    import coacto
    from coacto import ir
    from coacto.runtime import native_graph

    limits = ir.MAX_TENSOR_ELEMENTS, ir.MAX_TOTAL_ELEMENTS
    ir.MAX_TENSOR_ELEMENTS, ir.MAX_TOTAL_ELEMENTS = TENSOR_LIMIT, TOTAL_LIMIT
    try:
        native_graph(coacto.compile(bytes(data)))
    except coacto.CoactoError as e:
        if e.internal:  # refused, but only by a safety net: a check is missing
            raise
    finally:
        ir.MAX_TENSOR_ELEMENTS, ir.MAX_TOTAL_ELEMENTS = limits


if __name__ == "__main__":
    import atheris

    logging.disable(logging.WARNING)  # opset warnings on every other input
    with atheris.instrument_imports(include=["coacto"]):
        import coacto  # noqa: F401
        import coacto.frontend  # noqa: F401
        import coacto.partition  # noqa: F401
        import coacto.runtime  # noqa: F401
    atheris.Setup(sys.argv, lambda d: check(d))
    atheris.Fuzz()
