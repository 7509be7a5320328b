"""coacto: deep neural networks as fine-grained tile dataflow graphs, run on a device alone or
together with a server.

    import coacto
    graph = coacto.compile("model.onnx")            # ONNX -> tile graph
    with coacto.Runtime(graph, threads=2) as rt:
        outputs = rt.run({"data": image})            # {output name: numpy array}
        probs, = rt.run(None, {"data": image})       # onnxruntime's form: [numpy array, ...]
"""
from __future__ import annotations

from ._version import __version__
from .compiler import compile, load, partition_graph
from .errors import (CoactoError, GraphFileError, InferenceCancelled, InferenceTimeout,
                     InputError, ModelError, NativeError, ShapeError, UnsupportedOperatorError)
from .tilegraph import TileGraph


def __getattr__(name):
    if name == "Runtime":
        from .runtime import Runtime
        return Runtime
    if name == "NodeArg":
        from .runtime import NodeArg
        return NodeArg
    if name == "Client":
        from .mobile.client import Client
        return Client
    if name == "Server":
        from .server import Server
        return Server
    if name == "zoo":
        import importlib

        return importlib.import_module(".zoo", __name__)
    raise AttributeError(f"module 'coacto' has no attribute {name!r}")


__all__ = [
    "compile", "load", "Runtime", "NodeArg", "Client", "Server", "TileGraph", "CoactoError",
    "ModelError", "UnsupportedOperatorError", "ShapeError", "GraphFileError", "InputError",
    "NativeError", "InferenceTimeout", "InferenceCancelled",
]
