"""The ONNX frontend: ONNX model -> operator graph (coacto.ir); docs/ARCHITECTURE.md §2.1.

``loader`` reads the model, ``importer`` walks its live nodes once in topological order keeping one
value per tensor name (``values``: constants, activations, views) and hands each node to its
handlers (``registry``; in ``folding`` and ``ops/``), which work on a ``context`` (the handler
API). Everything computable from initializers and static shapes is folded with numpy, so PyTorch's
Shape -> Gather -> Unsqueeze -> Concat -> Reshape subgraphs vanish; index mappings (Reshape,
Transpose, Slice, Pad, ...) stay views until a real op reads them. ``fuse`` and ``fuse_sequence``
run on the layer list afterwards.
"""
from .importer import import_model
from .loader import load_model

__all__ = ["load_model", "import_model"]
