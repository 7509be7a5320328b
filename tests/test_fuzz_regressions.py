"""Every input a fuzzer once broke, and every seed of its corpus, through the fuzz target's own
``check`` (fuzz/fuzz_<target>.py): each must be accepted or refused properly again. Crashes are
kept in tests/fuzz_crashes/<target>/ (fuzz/run copies them there), seeds in fuzz/corpus/<target>/.
Needs no atheris: the targets import it only when run as fuzzers. The native graph validator's
inputs are replayed by native/tests/test_fuzz_graph.c instead."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("protocol", "ctg", "onnx")


def _inputs():
    for target in TARGETS:
        module = ROOT / "fuzz" / f"fuzz_{target}.py"
        if not module.exists():
            continue
        for kind, folder in (("crash", ROOT / "tests" / "fuzz_crashes" / target),
                             ("seed", ROOT / "fuzz" / "corpus" / target)):
            if folder.is_dir():
                for path in sorted(folder.iterdir()):
                    if path.is_file() and not path.name.startswith("."):
                        yield pytest.param(target, path, id=f"{target}-{kind}-{path.name}")


_modules: dict = {}


def _check(target: str):
    if target not in _modules:
        spec = importlib.util.spec_from_file_location(
            f"fuzz_{target}", ROOT / "fuzz" / f"fuzz_{target}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[target] = module
    return _modules[target].check


@pytest.mark.parametrize("target, path", list(_inputs()))
def test_fuzz_input_is_handled(target, path):
    _check(target)(path.read_bytes())


def test_every_target_has_seeds():
    for target in TARGETS:
        if (ROOT / "fuzz" / f"fuzz_{target}.py").exists():
            seeds = ROOT / "fuzz" / "corpus" / target
            assert seeds.is_dir() and any(seeds.iterdir()), f"fuzz/corpus/{target}/ is empty"
