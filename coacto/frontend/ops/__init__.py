"""ONNX operator handlers by family (their layouts: docs/ARCHITECTURE.md §2.1); importing a
module records its handlers in coacto.frontend.registry."""
from . import conv, elementwise, indexing, matmul, reduce  # noqa: F401
