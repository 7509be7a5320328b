"""Reading an ONNX model: the file, its external data, the checks made before importing it."""
from __future__ import annotations

import os

import onnx
from onnx import external_data_helper

from ..errors import ModelError


def load_model(model) -> tuple[onnx.ModelProto, bytes]:
    """Reads an ONNX model (path, serialized bytes or ModelProto) with its external data.

    Returns the model and the bytes that identify it (the file, or the serialized model when its
    weights were stored in external files, so the bytes are self-contained)."""
    if isinstance(model, onnx.ModelProto):
        proto, where = model, "the given ModelProto"
        if _uses_external_data(proto):
            raise ModelError("the given ModelProto refers to external data files that are not "
                             "loaded; pass the model's file path instead")
        try:
            data = proto.SerializeToString()
        except Exception as e:  # protobuf refuses models over 2 GiB
            raise ModelError(f"cannot serialize the given ModelProto: {e}") from e
    elif isinstance(model, (bytes, bytearray, memoryview)):
        data, where = bytes(model), "the given model bytes"
        proto = _parse(data, where)
        if _uses_external_data(proto):
            raise ModelError("the model bytes refer to external data files; pass the model's "
                             "file path instead so the data can be found next to it")
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        where = repr(path)
        if not os.path.isfile(path):
            raise ModelError(f"ONNX model file not found: {path!r}; check the path")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ModelError(f"cannot read the ONNX model {path!r}: {e}") from e
        proto = _parse(data, where)
        if _uses_external_data(proto):
            base = os.path.dirname(os.path.abspath(path))
            try:
                external_data_helper.load_external_data_for_model(proto, base)
            except (OSError, ValueError) as e:
                raise ModelError(f"cannot load the external data of {path!r}: {e}; keep the data "
                                 "files next to the model, complete and unchanged") from e
            try:
                data = proto.SerializeToString()
            except Exception as e:
                raise ModelError(f"{path!r} is too large to be handled in one piece: {e}") from e
    else:
        raise TypeError("model must be a path, bytes or onnx.ModelProto, not "
                        f"{type(model).__name__}")
    if not proto.HasField("graph") or not proto.graph.output or proto.ir_version <= 0:
        raise ModelError(f"{where} does not contain an ONNX graph (truncated or not an ONNX file); "
                         "export or download it again")
    if not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        raise ModelError(f"{where} declares no version of the standard ONNX operator set; "
                         "export it with an opset between 9 and 18")
    return proto, data


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise ModelError(f"{where} is not a valid ONNX model (truncated or corrupt: {e}); "
                         "export or download it again") from e
    return proto


def _uses_external_data(proto: onnx.ModelProto) -> bool:
    attr_tensors = (a.t for node in proto.graph.node for a in node.attribute
                    if a.type == onnx.AttributeProto.TENSOR)
    return any(external_data_helper.uses_external_data(t)
               for t in (*proto.graph.initializer, *attr_tensors))


def check_names(graph) -> None:
    """Every name the importer matches on is text: protobuf hands a string field that is not valid
    UTF-8 back as bytes, which no name or operator type compares equal to."""
    for i, node in enumerate(graph.node):
        names = (node.op_type, node.domain, node.name, *node.input, *node.output,
                 *(a.name for a in node.attribute))
        if not all(isinstance(x, str) for x in names):
            raise ModelError(f"node {i} ({node.op_type!r}) has a name, operator type or "
                             f"attribute name that is not valid UTF-8; the file is corrupt")
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if not isinstance(vi.name, str):
            raise ModelError(f"graph input/output {vi.name!r} has a name that is not valid "
                             f"UTF-8; the file is corrupt")
    for t in graph.initializer:
        if not isinstance(t.name, str):
            raise ModelError(f"initializer {t.name!r} has a name that is not valid UTF-8; the "
                             f"file is corrupt")
