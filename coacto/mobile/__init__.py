"""The device side of coacto's offloading: ``Client`` and the ``coacto-client`` command.

    import coacto
    with coacto.Client("tcp://server:5555", "model.onnx", policy="dynamic") as client:
        outputs = client.infer({"data": image})

Modules: ``client`` (the API), ``engine`` (the communication thread), ``policies`` (local, cloud,
split, fl, dynamic plans), ``estimates`` (goodput, RTT, server and device rates), ``shaper`` (the
``--bandwidth`` token bucket), ``cli`` (``coacto-client``).
"""
from __future__ import annotations

from .client import Client, ServerUnavailable, ServerVersionError
from .policies import POLICIES, Plan, PolicyError, make_plan
from .shaper import RateError, TokenBucket, parse_rate

__all__ = ["Client", "ServerUnavailable", "ServerVersionError", "POLICIES", "Plan", "PolicyError",
           "make_plan", "RateError", "TokenBucket", "parse_rate"]
