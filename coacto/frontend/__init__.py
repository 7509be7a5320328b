"""The ONNX frontend: ONNX model -> operator graph (coacto.ir). docs/ARCHITECTURE.md §2.1 describes
its modules: ``loader``, ``importer`` (the graph walk), ``registry``, ``context`` (the handler
API), ``values``, ``folding``, ``ops/`` (handlers by family), ``fuse``.
"""
from .importer import import_model
from .loader import load_model

__all__ = ["load_model", "import_model"]
