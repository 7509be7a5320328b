"""ONNX operator handlers by family; importing a module records its handlers in
coacto.frontend.registry. Convolution-family ops read and write the channels layout; elementwise
ops follow their input's; matrix products, layer normalisation and softmax over the last axis keep
it as rows (layout "last": a (B, S, D) tensor is stored as ONNX lays it out; coacto.ir).
"""
from . import conv, elementwise, indexing, matmul, reduce  # noqa: F401
