"""The one table of ONNX operators: each op type's handlers (``fn(ctx, ins) -> outs``,
coacto.frontend.context) by kind, tried in the order docs/ARCHITECTURE.md §2.1 gives
(``Importer._dispatch``); ``indexing`` runs on index arrays of the ``data`` inputs. Handlers
register with ``@op("Conv")``, ``@op("Concat", kind="indexing", data="all")``, or
``register("compute", {"Relu": _activation(ir.ACT_RELU), ...})``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

KINDS = ("compute", "indexing", "fold", "shape", "pass_through")


@dataclass
class Handlers:
    """One op type's handlers (None where it has none of that kind)."""

    compute: Callable | None = None
    indexing: Callable | None = None
    fold: Callable | None = None
    shape: Callable | None = None
    pass_through: Callable | None = None
    data: tuple | str = (0,)  # indexing: the inputs that carry data


#: op type -> its handlers; filled when coacto.frontend.ops and coacto.frontend.folding load
OPS: dict[str, Handlers] = {}
NONE = Handlers()  # what an op coacto does not know has


def register(kind: str, handlers: dict[str, Callable], data: tuple | str = (0,)) -> None:
    """Records ``handlers`` ({op type: handler}) as their op types' handlers of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown handler kind {kind!r}; the kinds are {KINDS}")
    for op_type, fn in handlers.items():
        entry = OPS.setdefault(op_type, Handlers())
        if getattr(entry, kind) is not None:
            raise ValueError(f"{op_type} has two {kind} handlers")
        setattr(entry, kind, fn)
        if kind == "indexing":
            entry.data = data


def op(*op_types: str, kind: str = "compute", data: tuple | str = (0,)):
    """Decorator: the function is the ``kind`` handler of each of ``op_types``."""
    def decorate(fn):
        register(kind, dict.fromkeys(op_types, fn), data)
        return fn
    return decorate


def handlers(op_type: str) -> Handlers:
    return OPS.get(op_type, NONE)
