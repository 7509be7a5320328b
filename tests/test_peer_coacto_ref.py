"""experiments/peer_coacto_ref.py: the parts that need no build (log parsing, name mapping, the
choice of tile graph). Building and running the reference takes minutes, so it is not tested here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "peer_coacto_ref.py"

# What its client prints around inferences (shortened), with an unrelated timing line and a
# line that has no index.
CLIENT_LOG = """\
STAGE: INFERENCE
[Inference 1] inference: 1/3
\t[Edge Device 0]time_offset: -0.007117
[Inference 1] Running DSEs...
\t\tSignaling nasm completion...
Time measurement run_aspen (0): 0.802547 - 0.164164 secs elapsed since last measurement.
Networking: RX Command -19960930 received - RX stop signal received.
0.1,0.2,0.3,0.4,0.5,0.6,1447
Time measurement run_aspen (1): 1.151173 - 0.180631 secs elapsed since last measurement.
Time measurement load_dnn: 0.5 - 0.25 secs
Time measurement run_aspen (2): 1.488708 - 0.176956 secs elapsed since last measurement.
"""


def test_pure_parts():
    spec = importlib.util.spec_from_file_location("peer_coacto_ref", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    assert mod.parse_latencies(CLIENT_LOG) == [0.164164, 0.180631, 0.176956]
    assert mod.parse_latencies("STAGE: INFERENCE\n") == []
    assert mod.parse_mean("STAGE: INFERENCE\nTime taken: 0.125868 seconds\n") == 0.125868

    assert [mod.map_policy(p) for p in ("cloud", "split", "local", "dynamic", "spinn", "fl")] == \
        ["conventional", "spinn", "local", "dynamic", "spinn", "main_fl"]
    assert [mod.map_model(m) for m in ("resnet50", "vgg16", "bert", "bert_base")] == \
        ["resnet50", "vgg16", "bert_base", "bert_base"]
    with pytest.raises(ValueError):
        mod.map_policy("fastest")
    with pytest.raises(ValueError):
        mod.map_model("gpt2")

    listing = ["bert_base_B1_T20.nasm", "bert_base_B1_T50.nasm", "resnet50_B1_T100.nasm",
               "resnet50_B1_T20.nasm", "resnet50_B4_T50.nasm", "resnet50_base.aspen", "cfg"]
    assert mod.available_tiles("bert_base", listing) == [20, 50]
    assert mod.available_tiles("resnet50", listing) == [20, 100]  # batch 4 is not batch 1
    assert mod.nearest_tiles(100, [20, 50]) == 50
    assert mod.nearest_tiles(35, [20, 50]) == 50  # a tie goes to the finer graph
    assert mod.nearest_tiles(30, [20, 50, 100, 200]) == 20
    assert mod.nearest_tiles(100, [20, 50, 100, 200]) == 100
