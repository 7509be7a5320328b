"""coacto.sim: a discrete-event simulator of devices offloading to a server (docs/ARCHITECTURE.md §8).

    from coacto import sim
    result = sim.simulate("resnet50", "dynamic", device="raspberry-pi-4",
                          server="threadripper-3990x", server_cores=64, devices=4,
                          bandwidth_mbps=20, inferences=10)
    print(result.p50, result.p95, result.throughput)

It drives the same tile graph, the same plans (coacto.mobile.policies), the same send rule (the
runtime's C function ``coacto_send_rule``) and the client's own estimator and engine decisions,
over profiles of devices, links and servers, with the communication engines' CPU and CPU
quotas (coacto.sim.cpu). What it models, what it does not, and how it compares with real runs
(experiments/sim_vs_real.py): docs/SIMULATOR.md.

``python -m coacto.sim --help`` runs it from the command line.
"""
from __future__ import annotations

from .link import BandwidthTrace, TraceError, lte_trace, wifi_trace
from .profiles import OP_CLASSES, MachineProfile, ProfileError, load_profile, op_class
from .rule import decide
from .simulate import (InferenceResult, SimError, SimResult, local_slowdown, resolve_graph,
                       simulate)

__all__ = [
    "simulate", "local_slowdown", "SimResult", "InferenceResult", "SimError", "BandwidthTrace", "TraceError",
    "lte_trace", "wifi_trace", "MachineProfile", "ProfileError", "load_profile", "OP_CLASSES",
    "op_class", "decide", "resolve_graph",
]
