"""coacto's version: the one place it is written. pyproject.toml reads it from here (setuptools'
dynamic version), the package root re-exports it, and the commands and the wire's hello import it
from here, so no submodule needs the package root."""
__version__ = "0.1.0"
