"""What a server lets its tenants hold, in one place (docs/SECURITY.md lists them with their
defaults and the error each answers with).

Every limit is checked before anything is allocated for the request it answers: a hostile or
broken device gets an ERROR naming the limit (the header's ``limit`` field), never the server's
memory."""
from __future__ import annotations

from dataclasses import dataclass, fields

#: Default server memory budget: this share of the machine's RAM.
DEFAULT_MEMORY_FRACTION = 0.5
#: Defaults derived from the budget: one inference may use at most this share of it, and the
#: model store (ONNX files, compiled graphs) each at most this share.
INFERENCE_SHARE = 0.25
STORE_SHARE = 0.25


def machine_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


@dataclass
class Limits:
    """``memory``: bytes the server's tenants may hold in all: activations of inferences in
    flight (an upper bound from the tile plan, GraphInfo.inference_bytes), results queued for
    devices, the model store. ``inference_memory``: one inference's bound (larger models are
    refused when they are compiled). ``results_per_device``: result bytes queued for one
    connection that the device has not read; beyond it its results are dropped and its
    inference ends with E_RESULTS_DROPPED. ``sessions_per_owner``: connections one device (one
    key; without keys, one IP address) may hold. ``uploads_per_owner``: models one device has
    uploaded that the store keeps (MODEL_UPLOAD beyond: E_BUSY until some are evicted).
    ``inferences_per_device``: in flight per connection; ``inferences_per_owner``: over all of
    one device's connections; ``owner_memory_share``: the share of ``memory`` one device's
    inferences in flight may hold (one tenant cannot take the whole budget).
    ``idle_expiry_s``: without keys, a connection that has not begun an inference is forgotten
    after this long (a session-table flood then costs the flooder, not the devices at work)."""

    memory: int
    inference_memory: int
    results_per_device: int = 256 << 20
    sessions: int = 1024
    sessions_per_owner: int = 16
    uploads_per_owner: int = 8
    inferences_per_device: int = 8
    inferences_per_owner: int = 64
    owner_memory_share: float = 0.5
    idle_expiry_s: float | None = None

    @classmethod
    def default(cls, memory: int | None = None, **overrides) -> "Limits":
        memory = int(machine_memory() * DEFAULT_MEMORY_FRACTION) if memory is None else int(memory)
        out = cls(memory=memory, inference_memory=int(memory * INFERENCE_SHARE))
        for k, v in overrides.items():
            if v is not None:
                setattr(out, k, v)
        out.check()
        return out

    def check(self) -> None:
        from .security import ServerError

        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "idle_expiry_s" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ServerError(f"limit {f.name} must be a positive number, got {v!r}")
        if self.owner_memory_share > 1:
            raise ServerError(f"owner_memory_share is a share of the memory limit (at most 1), "
                              f"got {self.owner_memory_share!r}")
        if self.inference_memory > self.memory:
            raise ServerError(f"the per-inference memory limit ({self.inference_memory} bytes) "
                              f"exceeds the server's memory limit ({self.memory} bytes)")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
