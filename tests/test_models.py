"""Every zoo architecture as a tile graph equals onnxruntime, for every tile count and thread count:
max |error| <= 1e-4 * max |reference| for every output."""
from __future__ import annotations

import pytest

import coacto
from coacto import zoo

from conftest import assert_close, assert_native_matches, onnxruntime_outputs, zoo_model

TILES = (1, 7, 64)
THREADS = (1, 2, 4)


@pytest.mark.parametrize("name", [n for n in zoo.MODELS if n not in zoo.TRANSFORMERS])
def test_zoo_model_matches_onnxruntime(name):
    feeds, ref = onnxruntime_outputs(name)
    assert_native_matches(zoo_model(name), feeds, ref, TILES, THREADS, name)


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_default_heuristic_matches_onnxruntime(name):
    feeds, ref = onnxruntime_outputs(name)
    with coacto.Runtime(coacto.compile(zoo_model(name)), threads=2) as rt:
        assert_close(rt.run(feeds, timeout=120), ref)


@pytest.mark.parametrize("style,name,opset", [
    ("zoo", "resnet18", 9), ("preact", "resnet18", 13), ("default", "resnet18", 9),
    ("default", "resnet18", 11), ("default", "mobilenetv2", 18), ("default", "squeezenet", 9),
    ("zoo", "squeezenet", 9), ("default", "shufflenet_unit", 17), ("default", "inception_block", 11),
])
def test_exporter_styles_and_opsets(style, name, opset):
    import onnxruntime as ort

    kw = {"image_size": 32} if name in ("resnet18", "mobilenetv2", "squeezenet") else {}
    model = zoo.build(name, opset=opset, style=style, **kw)
    feeds = zoo.input_feeds(model, seed=1)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    with coacto.Runtime(coacto.compile(model, tiles_per_layer=7), threads=2) as rt:
        assert_close(rt.run(feeds, timeout=120), ref)
