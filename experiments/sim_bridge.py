"""The simulator (coacto.sim) set up as the testbed runs: what sim_vs_real.py compares with real
rows and what fig_server_cores.py extends beyond this machine's two cores.

The device and the server are this machine as `coacto profile` measured it (profiles/
epyc-avx512-2core.json by default: per-layer times of the figure models, per-class rates, the
per-tile overhead, and the communication engines' CPU costs per message and byte, `coacto
profile --engine`). Nothing here is fitted to the rows it is compared with. From a real row and
its settings file the simulation takes what the real run had: the link's measured goodput and
RTT (and, under kernel shaping, tbf's burst), the CPU quota and its CFS period, one device core
and one computing thread (the testbed pins the device to one CPU), the server's threads and
CPUs, the device's own FLOP-rate estimate (the row's device_gflops: Client.calibrate's median
of three runs on zeros at the session's start; each fresh Client of the device driver measures
again and learns from its local runs, which the simulated one does not), the device's
latency in its quota measured beside the session (device_probe_ms; simulate's quota_latency_s)
and, in rows that
record it, the server's rate the client was told (server_gflops); without it, what the
simulated server announces (its calibration, then what it measured, session after session).
Each fresh client runs what run_policies runs: its warm-up dynamic inferences (the rows'
warmup_inferences), then the policies in the round's rotated order, ``repeat`` inferences
each, its estimates carrying over.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

#: The profile of the machine the shipped results were measured on (device and server);
#: run_all.py measures another when this machine is not that kind (profile_fits).
PROFILE = "epyc-avx512-2core"


def profile_fits(profile: str = PROFILE) -> tuple[bool, str]:
    """Whether ``profile`` was measured on a machine of this kind: the same CPU model, core
    count, GEMM micro-kernel and caches (its layer times and engine costs then hold here); and
    why not. The caches tell apart virtual machines whose CPUs share one name: a Zen 4 and a Zen
    5 EPYC here both read "AMD EPYC", and the profile of the second was twice as fast as the
    first (ResNet-50 at one thread 39 against 79 ms)."""
    import os

    from coacto import sim
    from coacto.native import gemm_kernel_name
    from coacto.machine import cache_sizes, cpu_model

    try:
        prof = sim.load_profile(profile)
    except Exception as e:  # noqa: BLE001 - a missing or unreadable profile does not fit
        return False, f"cannot read profile {profile}: {e}"
    cpu = prof.raw.get("cpu") or {}
    here = {"model": cpu_model(), "cores": os.cpu_count(), "kernel": gemm_kernel_name(),
            "caches": cache_sizes()}
    there = {"model": cpu.get("model"), "cores": cpu.get("cores"),
             "kernel": prof.raw.get("gemm_kernel"), "caches": cpu.get("caches")}
    missing = [k for k in ("layers", "engine", "quota", "server_calibration", "local_speedup")
               if not prof.raw.get(k)]
    if missing:
        return False, f"profile {profile} lacks {', '.join(missing)}"
    if here != there:
        diff = ", ".join(f"{k} {there[k]!r} there, {here[k]!r} here" for k in here
                         if here[k] != there[k])
        return False, f"profile {profile} is of another machine ({diff})"
    return True, f"profile {profile} was measured on a machine of this kind ({here['model']}, " \
                 f"{here['cores']} CPUs, {here['kernel']}, caches {here['caches']})"
#: The client's goodput estimate before it measures one when no --bandwidth is given
#: (coacto.mobile.estimates.DEFAULT_BANDWIDTH), in Mbit/s.
CLIENT_DEFAULT_MBPS = 10.0


def _num(v, default=None):
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def testbed_kwargs(settings: dict, nominal_mbps: float | None, profile: str = PROFILE) -> dict:
    """simulate() keywords for the testbed a settings file describes (one link setting)."""
    tb = settings.get("testbed") or {}
    if isinstance(tb, dict) and all(isinstance(v, dict) for v in tb.values()) and tb:
        tb = next(iter(tb.values()))  # fig_server_cores: one description per server thread count
    quota = settings.get("quota", tb.get("quota"))
    if tb.get("cgroup") == "none" or quota is None or quota >= 1:
        quota = None
    period_us = tb.get("cfs_period_us")
    kernel = tb.get("mode") == "netns"
    burst = 0.0
    if kernel and nominal_mbps:
        from testbed import tbf_params

        burst = float(tbf_params(float(nominal_mbps))["burst_bytes"])
    return {
        "device": profile, "server": profile,
        "device_threads": int(settings.get("device_threads", 1)),
        "server_cores": int(settings.get("server_threads", 1)),
        "device_cpus": 1, "server_cpus": len(str(tb.get("server_cpus", "1")).split(",")),
        "quota": quota,
        "quota_period_ms": period_us / 1e3 if quota is not None and period_us else None,
        # kernel shaping: the client is given no bandwidth, it starts from its default and
        # probes; the client's own shaper: it starts from the cap it was given
        "initial_goodput_mbps": CLIENT_DEFAULT_MBPS if kernel else nominal_mbps,
        "probe": kernel, "burst_bytes": burst,
        # the devices' tile encoding (results from before encodings existed sent raw floats)
        "transfer": tb.get("transfer", "raw"),
    }


def session(policies, repeat: int, rnd: int, warmup: int = 1,
            cuts: dict | None = None, probe: int = 0, alternate: bool = True,
            chunk: int | None = None) -> list[tuple]:
    """What H.run_policies runs on one fresh client: ``warmup`` dynamic inferences (the device
    driver's `learn`: until one offloaded and measured the goodput; the rows say how many),
    then every policy ``repeat`` times, in the harness's order for the round (H.rotation;
    ``alternate``: see there), ``chunk`` inferences at a time in turns (None: all of each
    policy's at once; H.chunk_sizes, H.turn_order). ``cuts``: {"split": [layer
    per inference]}: those inferences are planned at the given cuts (Client's split_layer
    option) instead of from the simulated client's estimates, and {"dynamic": [frontier per
    inference]} runs those plans (policies.plan_dynamic's frontier). ``probe``: local inferences
    before and after the policies (the device's speed measured beside them, H.PROBE_RUNS; rows
    from before the probe existed had none)."""
    order = H.rotation(policies, rnd, alternate)
    seq: list[tuple] = [("dynamic", max(1, int(warmup)))]
    if probe:
        seq.append(("local", probe))
    done = 0
    for turn, k in enumerate(H.chunk_sizes(repeat, chunk)):
        for p in H.turn_order(order, turn):
            plans = (cuts or {}).get(p)
            if plans and len(plans) == repeat:
                key = "frontier" if p == "dynamic" else "split_layer"
                seq += [(p, 1, {key: c}) for c in plans[done:done + k]]
            else:
                seq.append((p, k))
        done += k
    if probe:
        seq.append(("local", probe))
    return seq


def real_cuts(rows: list[dict]) -> dict[str, list]:
    """{policy: the plan of each inference} from the real rows: split's cut (the `cuts`
    column) and dynamic's frontier (`frontiers`: the device alone, the inputs, a cut or a
    share; its per-tile decisions at run time stay the simulated client's own). fl's stack is
    fixed by the model and never replayed."""
    out: dict[str, list] = {}
    for r in rows:
        text = (r.get("cuts") or "").split()
        if r.get("policy") == "split" and text and all(t.lstrip("-").isdigit() for t in text):
            out["split"] = [int(t) for t in text]
        plans = [f for f in (r.get("frontiers") or "").split(";") if f]
        if r.get("policy") == "dynamic" and plans and "None" not in plans:
            out["dynamic"] = plans
    return out


_SLOWDOWNS: dict = {}


def _local_slowdown(tg, latency_s: float, kw: dict) -> float:
    """sim.local_slowdown, once per graph, latency and device settings."""
    keep = ("device", "server", "device_threads", "device_cpus", "quota", "quota_period_ms",
            "device_flops", "transfer", "bandwidth_mbps", "rtt_ms")
    key = (tg.graph_id, round(latency_s, 6), tuple(str(kw.get(k)) for k in keep))
    if key not in _SLOWDOWNS:
        from coacto import sim

        _SLOWDOWNS[key] = sim.local_slowdown(tg, latency_s, **{k: kw[k] for k in keep if k in kw})
    return _SLOWDOWNS[key]


def _without_probe(result, probe: int):
    """``result`` without the probe's ``probe`` local inferences before and after the policies
    (the real rows leave them out too)."""
    if not probe:
        return result
    return dataclasses.replace(result, measured=result.measured[probe:len(result.measured) - probe])


def simulate_session(tg, settings: dict, row: dict, policies, repeat: int, rnd: int,
                     profile: str = PROFILE, cuts: dict | None = None,
                     measured_device: bool = True, **extra):
    """One fresh client of the real run (row: its link and device columns) simulated; returns
    the SimResult (warm-up left out of the statistics). The client plans with the row's own
    estimates of the device (device_gflops) and, when the row has it, of the server
    (server_gflops: what the server announced to this client); ``cuts``: see session();
    ``extra`` overrides."""
    from coacto import sim

    nominal = _num(row.get("nominal_mbps"))
    kw = testbed_kwargs(settings, nominal, profile)
    srv = _num(row.get("server_gflops"))
    if srv:
        kw["server_flops"] = srv * 1e9
    kw.update(extra)
    if srv and extra.get("server_flops") is not None:
        kw["server_flops"] = srv * 1e9  # the real client's own estimate beats a simulated one
    up = _num(row.get("measured_up_mbps")) or nominal
    rtt = _num(row.get("measured_rtt_ms"), 0.1)
    dev = _num(row.get("device_gflops"))
    warm = int(_num(row.get("warmup_inferences"), 1) or 1)
    probe_ms = _num(row.get("device_probe_ms"))
    # each probe: one local inference left out, then the measured ones
    probe_runs = len((row.get("device_probe_ms_each") or "").split()) // 2
    probe_runs += 1 if probe_runs else 0
    common = dict(kw, bandwidth_mbps=up, rtt_ms=rtt, device_flops=dev * 1e9 if dev else None)
    if probe_ms and measured_device and kw.get("quota") and kw.get("quota_period_ms") \
            and "quota_slowdown" not in extra:
        # the device's speed in its quota as measured beside this session, not the profile's
        common["quota_slowdown"] = _local_slowdown(tg, probe_ms / 1e3, common)
    seq = session(policies, repeat, rnd, warm, cuts, probe=probe_runs,
                  alternate=settings.get("rotation") == "alternate",
                  chunk=settings.get("chunk"))
    r = sim.simulate(tg, seq, warmup=warm, **common)
    return _without_probe(r, probe_runs)


def session_order(groups, settings: dict) -> list[tuple]:
    """The (model, nominal Mbit/s, round) keys of ``groups`` in the order fig_bandwidth.py ran
    them: model by model (one server each), rounds in turn, the bandwidths ascending in even
    rounds and descending in odd ones."""
    listed = [float(b) for b in settings.get("bandwidths_mbps") or []]
    models = []
    for m, _, _ in groups:
        if m not in models:
            models.append(m)
    keys = []
    for m in models:
        rounds = sorted({r for mm, _, r in groups if mm == m})
        for rnd in rounds:
            bws = sorted({b for mm, b, r in groups if mm == m and r == rnd},
                         key=lambda b: (listed.index(b) if b in listed else len(listed), b))
            keys += [(m, b, rnd) for b in (bws if rnd % 2 == 0 else reversed(bws))]
    return keys


def by_policy(result) -> dict[str, list]:
    out: dict[str, list] = {}
    for inf in result.measured:
        out.setdefault(inf.policy, []).append(inf)
    return out


def graph(model: str, image_size: int | None = None, files: dict | None = None):
    """The tile graph the device driver compiles for ``model`` (zoo, offloading partition);
    ``files``: models that are ONNX files, by the name the rows give them (a settings file's
    ``model_files``)."""
    from coacto import sim, zoo

    if files and model in files:
        return sim.resolve_graph(str(files[model]))
    if image_size and model not in zoo.TRANSFORMERS:
        return sim.resolve_graph(zoo.build(model, image_size=image_size))
    return sim.resolve_graph(model)


def server_cores_rows(args, real_rows: list[dict]) -> list[dict]:
    """fig_server_cores.py's simulated rows: per model, policy and server thread count in
    ``args.sim_cores``, the testbed's device (this machine's profile in the same quota, one
    thread, the device rate the real rows measured) against a server of N cores of this
    machine's per-core speed (its profile, per-thread rates beyond its two cores as at two), on
    the link the real rows measured at ``args.bandwidth``. Rows: source=sim, model, policy,
    server_threads, nominal_mbps, median_ms, p95_ms."""
    from coacto import sim

    rows = []
    profile = getattr(args, "profile", None) or PROFILE
    base = sim.load_profile(profile)
    cores = max(list(args.sim_cores) + [base.cores])
    server = dict(base.raw, cores=cores, name=f"{base.name} x{cores} cores")
    settings = {"quota": args.quota, "device_threads": 1,
                "testbed": _testbed_of(args, real_rows)}
    n = max(5, int(getattr(args, "repeat", 5) or 5))
    for model in args.models:
        real = [r for r in real_rows if r.get("model") == model and r.get("source") == "real"]
        ref = dict(real[0]) if real else {"nominal_mbps": args.bandwidth}
        for key in ("measured_up_mbps", "measured_rtt_ms", "device_gflops"):
            xs = [_num(r.get(key)) for r in real if _num(r.get(key))]
            if xs:
                ref[key] = statistics.median(xs)
        ref["nominal_mbps"] = args.bandwidth
        tg = graph(model, getattr(args, "image_size", None), H.MODEL_FILES)
        for threads in args.sim_cores:
            kw = testbed_kwargs(dict(settings, server_threads=threads), args.bandwidth,
                                profile)
            kw.update(server=server, server_cores=threads, server_cpus=threads)
            up = _num(ref.get("measured_up_mbps")) or float(args.bandwidth)
            dev = _num(ref.get("device_gflops"))
            for policy in args.policies:
                r = sim.simulate(tg, [("dynamic", 1), (policy, n)], bandwidth_mbps=up,
                                 rtt_ms=_num(ref.get("measured_rtt_ms"), 0.1),
                                 device_flops=dev * 1e9 if dev else None, warmup=1, **kw)
                lat = [i.latency_s * 1e3 for i in r.measured if i.policy == policy]
                rows.append({"source": "sim", "model": model, "policy": policy,
                             "server_threads": threads, "nominal_mbps": args.bandwidth,
                             **H.summarize([x / 1e3 for x in lat]),
                             "sim_profile": str(profile)})
    return rows


def _testbed_of(args, real_rows) -> dict:
    """The testbed's description for the simulation: the real run's period and pinning (the
    Testbed's defaults for the quota) when nothing better is at hand."""
    import os

    period = max(1000, round(1000 / args.quota)) if getattr(args, "quota", None) else None
    mode = getattr(args, "mode", "auto")
    if mode == "auto":
        mode = "netns" if os.geteuid() == 0 else "shaper"
    return {"mode": mode, "quota": getattr(args, "quota", None), "cfs_period_us": period,
            "cgroup": "v1" if period and mode == "netns" else "none", "server_cpus": "1"}
