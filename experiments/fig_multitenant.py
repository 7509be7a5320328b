"""Several devices with distinct models on one server (CoActo's Fig. 11): per-device p50 / p95
latency and the system's throughput, per policy, for 1, 2, 4 and 8 devices.

Each device is its own process (its own ZeroMQ identity, runtime and link) in the testbed's
device namespace, all pinned to CPU 0; each gets its own CPU quota (`--quota` of a core) while
the devices' quotas sum to at most one core — beyond that (8 devices at 25%) the core is shared
and each device is slower than its quota, which the CSV's `device_quota` column says. On a
machine with more cores, `--device-cpus` gives each device a core of its own (its quota then
the only limit, as on a real device). Each device
has its own link: the client's token bucket at `--bandwidth` (a real device has its own radio
link; the veth between the namespaces is left unshaped). The server: one thread on CPU 1.
All devices start together and each runs `--repeat` inferences back to back; throughput is all
inferences over the wall time from the first start to the last finish.

The devices and the server share one chip here (its L3 cache, its memory): a device whose
inferences the server computes slows the others' own work. A device's `local` p95 from rounds
where every device computes alone is therefore not what it would see beside devices that
offload. `--control` adds, per round, one sub-round per device in which that device runs
`local` while the others run `dynamic` (policy `local-among-dynamic` in the CSV, that
device's row only): its `dynamic` p95 over that p95 is the effect of its own policy, the
server's load held as under `dynamic`.

    python experiments/fig_multitenant.py --out results/
    python experiments/fig_multitenant.py --quick --devices 1,2,4
    python experiments/fig_multitenant.py --devices 4 --policies local,dynamic --control
    python experiments/fig_multitenant.py --devices 4 --policies local,dynamic \
        --server-cpus 1 --device-cpus 2,3,4,5
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

#: Distinct models, lightest first, so that N devices run the first N.
TENANT_MODELS = ("mobilenetv2", "resnet18", "squeezenet", "resnet50", "bert", "mobilenetv3_block",
                 "inception_block", "densenet_block")
POLICIES = ("local", "cloud", "split", "fl", "dynamic")
#: --control's rows: one device computing alone while the others run dynamic
CONTROL = "local-among-dynamic"


def run_round(devs, policy, repeat: int, bw: str) -> tuple[list[dict], float]:
    """Every device runs ``repeat`` inferences at once, each with ``policy`` (one for all, or a
    list with one per device)."""
    policies = [policy] * len(devs) if isinstance(policy, str) else list(policy)
    results: list = [None] * len(devs)

    def one(i):
        try:
            results[i] = devs[i].run(policies[i], repeat=repeat, warmup=0, bandwidth=bw)
        except Exception as e:  # reported below with the device's number
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(devs))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    for i, r in enumerate(results):
        if isinstance(r, Exception):
            raise H.ExperimentError(f"device {i} ({devs[i].case.name}) {policies[i]}: {r}")
    return results, wall


def merge(acc: dict, results: list[dict], wall: float) -> None:
    """One chunk's per-device results added to a setting's (latencies and stats in order)."""
    if "results" not in acc:
        acc.update(results=[None] * len(results), inferences=0, wall_s=0.0)
    acc["results"] = [H.merge_run(mine, r) for mine, r in zip(acc["results"], results)]
    acc["inferences"] += sum(len(r["latencies_s"]) for r in results)
    acc["wall_s"] += wall


def device_row(n: int, i: int, dev, policy: str, rnd: int, r: dict, throughput: float,
               args) -> dict:
    return {"devices": n, "device": i, "model": dev.case.name, "policy": policy, "round": rnd,
            "nominal_mbps": args.bandwidth, "device_quota": args.quota,
            "quota_share_of_core": n * args.quota, **H.summarize(r["latencies_s"]),
            "latencies_ms": " ".join(f"{x * 1e3:.1f}" for x in r["latencies_s"]),
            "throughput_inf_s": throughput,
            "fallbacks": sum(bool(s["fallback"]) for s in r["stats"]),
            # per inference, what ran: the plan (dynamic's frontier, else the policy) and who
            # finished it
            "plans": " ".join(
                f"{s.get('frontier', s['policy'])}:{s['finished_by']}"
                f"{':kept' if s.get('kept_work') else ''}"
                f"{':explored' if s.get('explored') else ''}".replace(" ", "_")
                for s in r["stats"]),
            # per inference, the device process's CPU time
            "cpu_ms": " ".join(
                "{:.1f}".format(s["device_process"]["user_ms"] + s["device_process"]["sys_ms"])
                for s in r["stats"]),
            "max_rel_error": r["max_rel_error"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    H.add_common_args(ap, models=TENANT_MODELS)
    ap.add_argument("--devices", default=None, metavar="N,N",
                    help="device counts (default: 1,2,4,8; --quick: 1,2,4)")
    ap.add_argument("--bandwidth", type=float, default=100, help="each device's Mbit/s (default: %(default)s)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--chunk", type=int, default=None, metavar="K",
                    help="run each setting's --repeat inferences K at a time, the settings "
                         "taking turns (default: all at once): a machine whose speed drifts "
                         "over seconds then slows every setting alike, where whole runs would "
                         "give one setting the slow spell and its p95; the throughput then "
                         "sums each chunk's time to its slowest device, a barrier every K "
                         "inferences, so compare it only with runs of the same K")
    ap.add_argument("--server-cpus", default="1", metavar="CPUS",
                    help="the server's CPU (taskset list; default: %(default)s)")
    ap.add_argument("--device-cpus", default=None, metavar="C,C",
                    help="one CPU per device, in device order (default: all on CPU 0, their "
                         "quotas sharing it): on a machine with cores to spare, '2,3,4,5' gives "
                         "each of four devices a core of its own, as real devices have")
    ap.add_argument("--control", action="store_true",
                    help=f"per round and device, a sub-round with that device on local and the "
                         f"others on dynamic (rows '{CONTROL}'): a device's dynamic p95 over "
                         f"that one is the effect of its own policy, the server as busy as "
                         f"under dynamic")
    args = ap.parse_args(argv)
    H.resolve_common(args)
    args.policies = args.policies.split(",")
    if args.control and "dynamic" not in args.policies:
        ap.error("--control compares each device's dynamic runs with its runs alone among "
                 "dynamic devices: add dynamic to --policies")
    counts = [int(x) for x in args.devices.split(",")] if args.devices else \
        ([1, 2, 4] if args.quick else [1, 2, 4, 8])
    device_cpus = [c for c in args.device_cpus.split(",") if c] if args.device_cpus else None
    if device_cpus is not None and len(device_cpus) < max(counts):
        ap.error(f"--device-cpus names {len(device_cpus)} CPUs for {max(counts)} devices: "
                 "give one per device")
    if max(counts) > len(args.models):
        raise SystemExit(f"{max(counts)} devices need {max(counts)} distinct models; --models "
                         f"gives {len(args.models)}")
    bw = f"{args.bandwidth:g}mbit"
    if args.chunk is not None and args.chunk < 1:
        ap.error("--chunk: give a number of inferences >= 1")
    if args.repeat < 1:
        ap.error("--repeat: give a number of inferences >= 1")
    if device_cpus is not None:
        from testbed import TestbedError, _parse_cpus

        try:  # the testbed's own check, now rather than when the devices start
            for c in device_cpus:
                _parse_cpus(c, "--device-cpus")
        except TestbedError as e:
            ap.error(str(e))
        # the testbed's own device CPU (its settings, its overlap check) is the first device's
        args.device_cpu = device_cpus[0]
    steps = sum(counts) * len(args.policies) + \
        (sum(n * n for n in counts if n > 1) if args.control else 0)
    progress = H.Progress(steps * args.rounds, "multitenant")
    rows: list[dict] = []
    with H.testbed(args) as tb, H.Workdir(args.image_size) as wd:
        tb.set_link(None)
        described = H.testbed_settings(
            tb, f"each device: coacto-client's token bucket at {args.bandwidth:g} Mbit/s both ways; "
                "the veth between the namespaces unshaped")
        cases = [wd.model(m) for m in args.models[:max(counts)]]
        for n in counts:
            with H.Server(tb, wd, cases[:n], threads=1) as srv:
                devs = [H.Device(tb, srv, c, slot=i,
                                 cpus=device_cpus[i] if device_cpus else None)
                        for i, c in enumerate(cases[:n])]
                entered = []
                try:
                    for d in devs:
                        d.__enter__()
                        entered.append(d)
                    for d in devs:
                        d.calibrate(bw)
                        d.run("dynamic", repeat=0, warmup=1, bandwidth=bw)
                    for rnd in range(args.rounds):
                        # (label, the policy of each device, the device whose row it is or None)
                        setups = [(p, p, None) for p in H.rotation(args.policies, rnd)]
                        setups += [(CONTROL, ["dynamic"] * i + ["local"] +
                                       ["dynamic"] * (n - i - 1), i)
                                      for i in range(n if args.control and n > 1 else 0)]
                        got: dict = {}
                        for c, k in enumerate(H.chunk_sizes(args.repeat, args.chunk)):
                            for label, policy, only in H.turn_order(setups, c):
                                results, wall = run_round(devs, policy, k, bw)
                                merge(got.setdefault((label, only), {}), results, wall)
                                progress.step(n * k / args.repeat,
                                              f"{n} devices {label}"
                                              + (f" (device {only})" if only is not None else ""))
                        for label, _, only in setups:
                            acc = got[(label, only)]
                            thr = acc["inferences"] / acc["wall_s"]
                            rows += [device_row(n, i, devs[i], label, rnd, r, thr, args)
                                     for i, r in enumerate(acc["results"])
                                     if only is None or i == only]
                finally:
                    for d in entered:
                        d.__exit__()
    progress.close()
    settings = {"quota_per_device": args.quota, "bandwidth_mbps_per_device": args.bandwidth,
                "repeat": args.repeat, "rounds": args.rounds, "control": args.control,
                "chunk": args.chunk,
                "server_threads": 1,
                "device_threads": 1, "models": args.models[:max(counts)],
                "device_cpus": device_cpus or ["shared: the testbed's device CPU"],
                "testbed": described}
    H.write_table(args.out, "multitenant", rows, settings)
    png = plot(args.out, rows, {k: v for k, v in settings.items() if k != "testbed"})
    for n in counts:
        for p in args.policies:
            sel = [r for r in rows if r["devices"] == n and r["policy"] == p]
            if sel:
                p50 = sorted(r["median_ms"] for r in sel)[len(sel) // 2]
                p95 = max(r["p95_ms"] for r in sel)
                thr = sorted(r["throughput_inf_s"] for r in sel)[len(sel) // 2]
                print(f"{n} devices {p:8s} p50 {p50:7.0f} ms  worst p95 {p95:7.0f} ms  {thr:5.2f} inf/s")
    if "local" in args.policies and "dynamic" in args.policies:
        # the scheduler's promise with a shared server: each device's dynamic p95 (all rounds)
        # no worse than its own local p95
        for n, dev, model, ratio in dynamic_over_local_p95(rows):
            print(f"{n} devices, device {dev} ({model}): dynamic p95 / local p95 = {ratio:.2f}")
    if args.control and "dynamic" in args.policies:
        for n, dev, model, ratio in dynamic_over_local_p95(rows, CONTROL):
            print(f"{n} devices, device {dev} ({model}): dynamic p95 / p95 alone while the "
                  f"others run dynamic = {ratio:.2f}")
    print(f"wrote {args.out / 'multitenant.csv'}, {png}")
    return 0


def dynamic_over_local_p95(rows: list[dict], local: str = "local") -> list[tuple]:
    """(devices, device, model, dynamic p95 / ``local`` p95) per device, each p95 over every
    round's latencies pooled (``local``: the rows of that policy, CONTROL's for instance)."""
    pooled: dict = {}
    for r in rows:
        key = (r["devices"], r["device"], r["model"])
        xs = [float(x) for x in str(r.get("latencies_ms", "")).split()]
        pooled.setdefault(key, {}).setdefault(r["policy"], []).extend(xs)
    out = []
    for key, by in sorted(pooled.items()):
        if by.get(local) and by.get("dynamic"):
            p95 = {p: H.summarize([x / 1e3 for x in by[p]])["p95_ms"] for p in (local, "dynamic")}
            out.append((*key, p95["dynamic"] / p95[local]))
    return out


def plot(out: Path, rows: list[dict], settings: dict) -> Path:
    plt = H.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    pols = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    for p in pols:
        sel = [r for r in rows if r["policy"] == p]
        counts = sorted({r["devices"] for r in sel})
        p50 = [H.medians_by(sel, "devices")[n] for n in counts]
        p95 = [max(r["p95_ms"] for r in sel if r["devices"] == n) for n in counts]
        thr = [H.medians_by(sel, "devices", "throughput_inf_s")[n] for n in counts]
        kw = {"label": p, "lw": 2 if p == "dynamic" else 1, "color": H.POLICY_COLORS.get(p)}
        axes[0].plot(counts, p50, "-o", **kw)
        axes[1].plot(counts, p95, "-o", **kw)
        axes[2].plot(counts, thr, "-o", **kw)
    for ax, title in zip(axes, ("p50 latency per device (ms, median over devices)",
                                "worst device's p95 latency (ms)", "throughput (inferences/s)")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("devices")
        ax.set_xscale("log", base=2)
        counts = sorted({r["devices"] for r in rows})
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Several devices with distinct models on a one-core server")
    return H.save_figure(fig, out, "multitenant", settings, bottom=0.07, top=0.95)


if __name__ == "__main__":
    sys.exit(main())
