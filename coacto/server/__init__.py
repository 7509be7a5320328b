"""The server side of coacto's offloading: ``Server`` (one ROUTER socket, many devices, one shared
native runtime), its model store and the ``coacto-server`` command. Protocol: docs/PROTOCOL.md."""
from __future__ import annotations

from .server import Server, ServerError
from .store import ModelStore, StoreError

__all__ = ["Server", "ServerError", "ModelStore", "StoreError"]
