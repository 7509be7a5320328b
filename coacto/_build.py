"""cffi builder for the native tile runtime: compiled by `pip install` through setup.py.

The declarations come from native/include/coacto.h itself (its preprocessor lines dropped), so
the header stays the one description of the C boundary."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
HEADER = NATIVE / "include" / "coacto.h"


def cdef_source(header: Path = HEADER) -> str:
    """The header as cffi reads it: no comments, no preprocessor lines, no C++ guard."""
    text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
    lines = [ln for ln in text.splitlines() if not ln.strip().startswith("#")]
    return _balanced("\n".join(lines).replace('extern "C" {', ""))


def _sources() -> list[str]:
    files = sorted((NATIVE / "src").glob("*.c")) + sorted((NATIVE / "src" / "kernels").glob("*.c"))
    return [os.path.relpath(f, ROOT) for f in files]


def _compile_args() -> list[str]:
    # -ffp-contract=fast: ISO C mode would forbid fusing a * b + c into one FMA instruction, which
    # the vectorised element-wise kernels (e^x, erf, layer norm) rely on where the CPU has it.
    args = ["-O3", "-std=c11", "-ffp-contract=fast", "-pthread", "-fno-math-errno",
            "-Wno-unused-parameter"]
    if platform.machine().lower() in ("aarch64", "arm64"):
        args.append("-march=armv8-a")
    return args


def _balanced(text: str) -> str:
    """Drop closing braces that have no opening one (left over from the C++ guard)."""
    out, depth = [], 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                continue
            depth -= 1
        out.append(ch)
    return "".join(out)


ffibuilder = FFI()
ffibuilder.cdef(cdef_source())
ffibuilder.set_source(
    "coacto._native",
    '#include "coacto.h"',
    sources=_sources(),
    include_dirs=[os.path.relpath(NATIVE / "include", ROOT), os.path.relpath(NATIVE / "src", ROOT)],
    extra_compile_args=_compile_args(),
    extra_link_args=["-pthread"],
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
