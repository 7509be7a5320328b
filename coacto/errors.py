"""The one family of exceptions coacto raises. Messages say what to do next."""
from __future__ import annotations


class CoactoError(Exception):
    """Base of every error coacto raises. ``internal`` is True when a check coacto lacks let
    bad input reach code that failed on it: still reported as the input's fault, but a bug to
    fix (the fuzzers treat it as a crash)."""

    internal = False


class ModelError(CoactoError):
    """The ONNX model cannot be read (missing, truncated, corrupt) or is inconsistent."""


class UnsupportedOperatorError(ModelError):
    """The model uses operators (or operator forms) coacto cannot run. ``nodes`` lists them all."""

    def __init__(self, message: str, nodes: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.nodes = list(nodes or [])


class ShapeError(ModelError):
    """A tensor shape is unknown or inconsistent (e.g. a dynamic dimension without input_shapes)."""


class GraphFileError(CoactoError):
    """A tile graph file (.ctg) is missing, truncated, corrupt or of another version."""


class InputError(CoactoError):
    """Inputs given to run() do not match the model (name, shape or dtype)."""


class NativeError(CoactoError):
    """The native runtime reported an error. ``status`` is its status code."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class InferenceTimeout(NativeError):
    """An inference did not finish within its time limit."""


class InferenceCancelled(NativeError):
    """An inference was stopped by ``Runtime.cancel`` or ``Client.cancel`` before it finished.
    (Ctrl-C stops it too, but raises KeyboardInterrupt.) The Runtime or Client stays usable."""


__all__ = [
    "CoactoError", "ModelError", "UnsupportedOperatorError", "ShapeError", "GraphFileError",
    "InputError", "NativeError", "InferenceTimeout", "InferenceCancelled",
]
