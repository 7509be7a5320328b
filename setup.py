"""Builds the native tile runtime (native/) into coacto._native through cffi (API mode)."""
import sys
import sysconfig

from cffi.recompiler import USE_LIMITED_API
from setuptools import setup

# cffi compiles the extension against CPython's stable ABI (coacto/_native.abi3.so) unless the
# interpreter is a debug or free-threaded build; the wheel's tag then says so, from the oldest
# Python the project supports, so one wheel serves 3.11 and every later CPython.
options = {}
if USE_LIMITED_API and not hasattr(sys, "gettotalrefcount") and \
        not sysconfig.get_config_var("Py_GIL_DISABLED"):
    options["bdist_wheel"] = {"py_limited_api": "cp311"}

setup(cffi_modules=["coacto/_build.py:ffibuilder"], options=options)
