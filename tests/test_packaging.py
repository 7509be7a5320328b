"""What an installed coacto promises besides its API: the commands as modules, the license, the
typing marker, the metadata and the stable-ABI extension. Building a wheel is too slow for a test;
these are the parts that can be read from the source tree and the installed distribution."""
from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import coacto

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("module, prog", [("coacto", "coacto"), ("coacto.server", "coacto-server"),
                                          ("coacto.mobile", "coacto-client")])
def test_python_m_runs_the_command(module, prog):
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {prog} ")


def test_python_m_coacto_passes_the_exit_code():
    r = subprocess.run([sys.executable, "-m", "coacto"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "usage: coacto" in r.stdout


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert re.match(r"\s*Apache License\s+Version 2\.0, January 2004", text)
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_package_is_marked_typed():
    assert importlib.resources.files("coacto").joinpath("py.typed").is_file()


def test_installed_metadata():
    meta = importlib.metadata.metadata("coacto")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    classifiers = set(meta.get_all("Classifier") or [])
    for expected in ("Development Status :: 3 - Alpha",
                     "Programming Language :: Python :: 3.11",
                     "Programming Language :: Python :: 3.12",
                     "Programming Language :: Python :: 3.13",
                     "Programming Language :: C",
                     "Operating System :: POSIX :: Linux",
                     "Topic :: Scientific/Engineering :: Artificial Intelligence"):
        assert expected in classifiers, expected
    # PEP 639: the expression replaces license classifiers; setuptools refuses both together.
    assert not any(c.startswith("License ::") for c in classifiers)


def test_version_is_written_once():
    """pyproject.toml reads the version from coacto/_version.py; the installed metadata, the
    package and the module agree."""
    from coacto import _version

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "coacto._version.__version__"}
    assert importlib.metadata.version("coacto") == coacto.__version__ == _version.__version__


def test_wheel_tag_matches_the_extension():
    """The extension is built for the stable ABI, and the wheel's abi3 tag starts at the oldest
    Python the project supports."""
    from coacto import _native

    if hasattr(sys, "gettotalrefcount"):
        pytest.skip("a debug interpreter builds the extension for its own ABI")
    assert _native.__file__.endswith(".abi3.so")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    oldest = re.fullmatch(r">=3\.(\d+)", pyproject["project"]["requires-python"]).group(1)
    assert f'"py_limited_api": "cp3{oldest}"' in (ROOT / "setup.py").read_text()


def test_every_package_is_in_the_wheel():
    """pyproject.toml lists coacto's packages one by one: one missing there is missing from the
    wheel, and an installed coacto fails to import it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "coacto").rglob("__init__.py")}
    assert found == set(pyproject["tool"]["setuptools"]["packages"])
