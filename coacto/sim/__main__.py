"""``python -m coacto.sim``: simulate devices offloading to a server (see coacto.sim).

Exit codes: 0 done; 1 a coacto error (message on stderr); 2 bad usage."""
from __future__ import annotations

import argparse
import json
import logging
import sys

from ..errors import CoactoError
from ..mobile.policies import POLICIES
from ..cli_common import EXIT_ERROR, UsageError, exit_codes_help, usage_error
from ..mobile.shaper import RateError, parse_rate

EPILOG = """\
examples:
  python -m coacto.sim --model resnet50 --policy dynamic --bandwidth 20 \\
      --device raspberry-pi-4 --server threadripper-3990x --server-cores 64 --devices 4
  python -m coacto.sim --model resnet50 --policy all --bandwidth 5,20,100 \\
      --device epyc-avx512-2core --device-threads 1 --device-cpus 1 --quota 0.25 \\
      --period-ms 4 --server epyc-avx512-2core --server-cores 1 --rtt 0.06
  python -m coacto.sim --model vgg16 --policy dynamic --bandwidth 20 \\
      --device-costs epyc-avx512-2core --device-costs-scale 5 \\
      --server-costs epyc-avx512-2core
  python -m coacto.sim --model mobilenetv2 --policy cloud --trace lte --inferences 50 --json
  python -m coacto.sim --model vgg16 --policy dynamic --bandwidth 50 --schedule gantt.json

profiles: names in profiles/ (raspberry-pi-4, jetson-agx-xavier-cpu, threadripper-3990x are
derived from public figures; others measured by `coacto profile`) or paths to JSON files.
The simulator was checked against real runs on the 2-core EPYC (experiments/sim_vs_real.py;
docs/SIMULATOR.md has the table and what remains approximate).

""" + exit_codes_help() + "\n"


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise UsageError(f"{what} {text!r}: write numbers separated by commas, e.g. 5,20,100")
    return values


def _mbits(text: str) -> list[float]:
    """--bandwidth's rates in Mbit/s: bare numbers are Mbit/s; a rate with a unit is read as
    every command reads one (coacto.mobile.shaper.parse_rate: '20mbit', '2.5MB/s')."""
    out = []
    for item in (v.strip() for v in text.split(",")):
        if not item:
            continue
        try:
            out.append(float(item))
        except ValueError:
            try:
                out.append(parse_rate(item) * 8 / 1e6)
            except RateError as e:
                raise UsageError(f"--bandwidth: {e}") from None
    if not out:
        raise UsageError(f"--bandwidth {text!r}: write rates separated by commas, e.g. 5,20,100 "
                          "(Mbit/s) or 20mbit,2.5MB/s")
    if not all(v > 0 and v != float("inf") for v in out):
        raise UsageError(f"--bandwidth {text!r}: every rate must be positive and finite")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m coacto.sim", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Discrete-event simulation of devices running a model together with a "
                    "server: the real plans, the runtime's send rule, profiles of devices, "
                    "links and servers. Prints p50 / p95 latency and throughput per setting.",
        epilog=EPILOG)
    p.add_argument("--model", default="resnet50", help="zoo model name or .onnx / .ctg file")
    p.add_argument("--tiles", type=int, default=None, help="tiles per layer when compiling")
    p.add_argument("--policy", default="dynamic",
                   help=f"{', '.join(POLICIES)}, comma-separated, or 'all'")
    p.add_argument("--bandwidth", default=None, metavar="RATES",
                   help="link bandwidth: a number is Mbit/s, or give the unit as the other "
                        "commands read it ('20mbit', '2.5MB/s'); comma-separated: one run each")
    p.add_argument("--trace", default=None,
                   help="instead of --bandwidth: 'lte' or 'wifi' (synthetic traces, seeded), or a "
                        "JSON file holding [[t_s, mbps], ...]")
    p.add_argument("--rtt", type=float, default=None, metavar="MS",
                   help="round-trip time in ms (default: the client's initial estimate, 10)")
    p.add_argument("--device", default="raspberry-pi-4", help="device profile")
    p.add_argument("--device-threads", type=int, default=None,
                   help="computing threads per device (default: the profile's cores)")
    p.add_argument("--quota", type=float, default=None,
                   help="the device's CPU quota in cores (0.25: a quarter of one core)")
    p.add_argument("--period-ms", type=float, default=None,
                   help="the quota's CFS period: throttled in periods as the kernel does "
                        "(default: a smooth share)")
    p.add_argument("--device-cpus", type=float, default=None,
                   help="cores the device's threads run on (default: its profile's)")
    p.add_argument("--device-costs", default=None, metavar="PROFILE|none",
                   help="the device engine's CPU costs: from this profile's engine section "
                        "(default: the device profile's, if measured); 'none' leaves them out")
    p.add_argument("--device-costs-scale", type=float, default=1.0,
                   help="multiply the device engine's costs (another machine's CPU)")
    p.add_argument("--server", default="threadripper-3990x", help="server profile")
    p.add_argument("--server-costs", default=None, metavar="PROFILE|none",
                   help="the server I/O thread's CPU costs (as --device-costs)")
    p.add_argument("--server-costs-scale", type=float, default=1.0)
    p.add_argument("--server-cores", default=None,
                   help="server computing threads (comma-separated: one run each; default: all)")
    p.add_argument("--devices", type=int, default=1, help="devices sharing the server")
    p.add_argument("--inferences", type=int, default=5, help="back-to-back inferences per device")
    p.add_argument("--warmup", type=int, default=1,
                   help="first inferences per device left out of the statistics (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jitter", type=float, default=0.0, metavar="S",
                   help="devices start at random times within this many seconds")
    p.add_argument("--schedule", default=None, metavar="FILE.json",
                   help="write the per-tile schedule (side, worker, start, end) of the last "
                        "setting's inferences, for a Gantt chart")
    p.add_argument("--json", action="store_true", help="print one JSON object per setting")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        return run(args)
    except UsageError as e:
        return usage_error("coacto.sim", e, "python -m coacto.sim")
    except CoactoError as e:
        print(f"coacto.sim: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def run(args) -> int:
    from .simulate import DEFAULT_RTT_MS, resolve_graph, simulate

    policies = list(POLICIES) if args.policy == "all" else \
        [s.strip() for s in args.policy.split(",") if s.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise UsageError(f"--policy {args.policy!r}: choose from {', '.join(POLICIES)}, "
                         "comma-separated, or 'all'")
    if args.bandwidth is None and args.trace is None:
        raise UsageError("give --bandwidth RATES or --trace lte|wifi|FILE.json")
    if args.bandwidth is not None and args.trace is not None:
        raise UsageError("give --bandwidth or --trace, not both")
    links = [("bandwidth_mbps", b) for b in _mbits(args.bandwidth)] \
        if args.bandwidth is not None else [("trace", _load_trace(args.trace))]
    cores = [int(c) for c in _floats(args.server_cores, "--server-cores")] \
        if args.server_cores else [None]
    print(f"compiling {args.model} ...", file=sys.stderr)
    tg = resolve_graph(args.model, args.tiles)
    rtt = DEFAULT_RTT_MS if args.rtt is None else args.rtt
    last = None
    if not args.json:
        print(f"{'policy':>8} {'link':>12} {'cores':>5}  {'p50 ms':>9} {'p95 ms':>9} "
              f"{'inf/s':>8} {'sent':>6} {'local':>6} {'server':>6} {'fallback':>8}")
    for n in cores:
        for key, value in links:
            for policy in policies:
                r = simulate(tg, policy, device=args.device, server=args.server, server_cores=n,
                             device_threads=args.device_threads, devices=args.devices,
                             rtt_ms=rtt, quota=args.quota, quota_period_ms=args.period_ms,
                             device_cpus=args.device_cpus,
                             device_costs=_costs(args.device_costs),
                             server_costs=_costs(args.server_costs),
                             device_costs_scale=args.device_costs_scale,
                             server_costs_scale=args.server_costs_scale,
                             inferences=args.inferences,
                             warmup=min(args.warmup, args.inferences - 1), seed=args.seed,
                             start_jitter_s=args.jitter, **{key: value})
                r.settings["model"] = args.model
                last = r
                s = r.summary()
                if args.json:
                    print(json.dumps({"settings": r.settings, "summary": s}), flush=True)
                    continue
                link = f"{value:g} Mbit/s" if key == "bandwidth_mbps" else str(args.trace)
                print(f"{policy:>8} {link:>12} {r.settings['server_cores']:>5}  "
                      f"{s['p50_ms']:9.1f} {s['p95_ms']:9.1f} {s['throughput_per_s']:8.2f} "
                      f"{s['tiles_sent']:6.0f} {s['tiles_local']:6.0f} {s['tiles_server']:6.0f} "
                      f"{s['fallbacks']:>8}", flush=True)
    if args.schedule and last is not None:
        with open(args.schedule, "w") as f:
            json.dump({"settings": last.settings,
                       "inferences": [dict(device=i.device, inference=i.index,
                                           latency_s=i.latency_s, t_submit=i.t_submit,
                                           schedule=[list(row) for row in i.schedule()])
                                      for i in last.inferences]}, f)
        print(f"schedule written to {args.schedule} (rows: tile, side, worker, start s, end s "
              f"from the inference's submission)", file=sys.stderr)
    return 0


def _costs(spec):
    if spec is None:
        return None
    return False if spec.lower() in ("none", "off", "no") else spec


def _load_trace(spec: str):
    if spec in ("lte", "wifi"):
        return spec
    try:
        with open(spec) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CoactoError(f"--trace {spec}: not 'lte' / 'wifi' and not a readable JSON file of "
                          f"[[t_s, mbps], ...] ({e})") from None


if __name__ == "__main__":
    sys.exit(main())
