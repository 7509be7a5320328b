"""Builds the native tile runtime (native/) into coacto._native through cffi (API mode)."""
from setuptools import setup

setup(cffi_modules=["coacto/_build.py:ffibuilder"])
