"""Shared fixtures: zoo models built once per session at test-friendly sizes."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from coacto import zoo

#: Image sizes that keep the suite fast on 2 cores while keeping every layer of the architecture.
TEST_SIZES = {"resnet18": 64, "resnet50": 64, "vgg16": 32, "mobilenetv2": 64, "squeezenet": 64}


@functools.lru_cache(maxsize=None)
def zoo_model(name: str, **kw):
    if name in TEST_SIZES and "image_size" not in kw:
        kw["image_size"] = TEST_SIZES[name]
    return zoo.build(name, **kw)


@functools.lru_cache(maxsize=None)
def onnxruntime_outputs(name: str):
    import onnxruntime as ort

    model = zoo_model(name)
    feeds = zoo.input_feeds(model, seed=0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(names, sess.run(names, feeds)))


def assert_close(got: dict, ref: dict, rel: float = 1e-4) -> None:
    assert set(got) == set(ref), (sorted(got), sorted(ref))
    for k in ref:
        assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
        scale = float(np.abs(ref[k]).max())
        err = float(np.abs(got[k].astype(np.float64) - ref[k]).max())
        assert err <= rel * scale, f"{k}: max |error| {err:.3g} > {rel} * max |ref| {scale:.3g}"


def assert_native_matches(model, feeds: dict, ref: dict, tiles, threads, label: str = "",
                          timeout: float = 120) -> None:
    """The model compiled at every tile count and run at every thread count equals ``ref``."""
    import coacto

    for t in tiles:
        tg = coacto.compile(model, tiles_per_layer=t)
        for th in threads:
            with coacto.Runtime(tg, threads=th) as rt:
                got = rt.run(feeds, timeout=timeout)
            try:
                assert_close(got, ref)
            except AssertionError as e:
                raise AssertionError(f"{label} tiles={t} threads={th}: {e}") from None


@pytest.fixture(scope="session")
def squeezenet():
    return zoo_model("squeezenet")


def onnx_ops(model) -> set[str]:
    """The op types of an ONNX model's nodes."""
    return {n.op_type for n in model.graph.node}


def onnx_attrs(node) -> dict:
    """An ONNX node's attributes as Python values."""
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def onnx_producers(model) -> dict:
    """Tensor name -> the node that produces it."""
    return {o: n for n in model.graph.node for o in n.output}


@pytest.fixture(scope="module")
def ctx():
    """A ZeroMQ context for the raw devices of a test module (tests/test_server.py's Device)."""
    import zmq

    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def assert_native_refuses(tg, mutate, what: str) -> None:
    """A copy of tile graph ``tg`` changed by ``mutate`` (a header that passes the Python checks
    but lies) is refused by the native runtime with a message naming ``what``."""
    import copy

    import coacto
    from coacto.errors import NativeError

    bad = copy.copy(tg)
    bad.plan = copy.deepcopy(tg.plan)
    bad.graph = copy.deepcopy(tg.graph)
    bad.arrays = copy.deepcopy(tg.arrays)
    bad._native = None
    mutate(bad)
    with pytest.raises(NativeError, match="invalid tile graph") as e:
        coacto.Runtime(bad, threads=1)
    assert what in str(e.value), (what, str(e.value))
