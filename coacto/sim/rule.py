"""The send decision of SEND_DECIDE tiles: the runtime's own C function, called through cffi.

The formula lives in one place, ``coacto_send_rule`` in native/src/offload.c; the runtime calls it
when a tile completes and the simulator calls it here, with the parameters the device engine last
pushed (``OffloadParams``, what coacto_inference_set_offload_params holds) and the simulated
clock. Nothing here re-states the rule.
"""
from __future__ import annotations

from ..native import ffi, lib


class OffloadParams:
    """A coacto_offload_params the engine's pushes update (NativeInference.set_offload_params)."""

    __slots__ = ("c",)

    def __init__(self):
        self.c = ffi.new("coacto_offload_params *")
        # the runtime's defaults before the first push (coacto_inference_create)
        self.c.alpha = 1.0
        self.c.server_flops = 1.0

    def set(self, bandwidth: float, rtt: float, inputs_at_server: float, server_flops: float,
            alpha: float = 1.0) -> None:
        c = self.c
        c.bandwidth, c.rtt = float(bandwidth), float(rtt)
        c.inputs_at_server = float(inputs_at_server)
        c.server_flops, c.alpha = float(server_flops), max(1.0, float(alpha))

    def as_dict(self) -> dict:
        c = self.c
        return {"bandwidth": c.bandwidth, "rtt": c.rtt, "inputs_at_server": c.inputs_at_server,
                "server_flops": c.server_flops, "alpha": c.alpha}


_ect = ffi.new("double[2]")


def decide(params: OffloadParams, now: float, queued: float, nbytes: float, work: float
           ) -> tuple[bool, float, float]:
    """(send?, ECT offloaded, ECT server) for a tile of ``nbytes`` completed at ``now`` with
    ``queued`` bytes ahead of it in the send queue; ``work``: FLOPs the server needs to produce
    it from the inputs."""
    send = lib.coacto_send_rule(params.c, now, queued, nbytes, work, _ect, _ect + 1)
    return bool(send), _ect[0], _ect[1]
