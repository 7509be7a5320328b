"""The measuring commands: `coacto bench` (coacto vs onnxruntime), `coacto tune` (tile counts for
this machine) and `coacto profile` (this machine's costs for the simulator)."""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from .. import benchmark
from ..cli_common import EXIT_MISMATCH, UsageError, exit_codes_help, positive, warn
from ..errors import CoactoError
from .shared import (ignored_model_flags, int_list, model_args, para, progress, resolve_model,
                     tuned_arg)


def cmd_bench(args) -> int:
    specs = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else [args.model]
    if not specs:
        raise UsageError("--models is empty: name models separated by commas, e.g. resnet50,vgg16")
    threads = int_list(args.threads, "--threads")
    positive(args.repeat, "--repeat")
    positive(args.memory_runs, "--memory-runs")
    positive(args.tiles, "--tiles")
    positive(args.image_size, "--image-size")
    positive(args.pause, "--pause", 0)
    positive(args.traffic_mb, "--traffic-mb", 0)
    if args.mode != "app":
        for flag, value in (("--pause", args.pause), ("--traffic-mb", args.traffic_mb)):
            if value is not None:
                warn("coacto", f"{flag} is ignored: it sets the conditions of --mode app")
    app = {"mode": args.mode,
           "pause": benchmark.APP_PAUSE_S if args.pause is None else args.pause,
           "traffic_mb": benchmark.APP_TRAFFIC_MB if args.traffic_mb is None else args.traffic_mb}
    for spec in specs:
        for message in ignored_model_flags(spec, args.tiles, None, args.image_size,
                                           args.no_tuned):
            warn("coacto", message)
    if len(specs) == 1 and specs[0].endswith(".ctg"):
        tg, _ = resolve_model(specs[0])
        rows = []
        for t in threads:
            progress(f"benchmarking {specs[0]} at {t} thread(s) (no ONNX model: coacto only) ...")
            rows.append(benchmark.compare(tg, None, t, args.repeat, name=specs[0], **app))
    else:
        if args.shape:
            raise UsageError("--shape is not supported by bench: give the ONNX model static shapes")
        rows = benchmark.bench_models(specs, threads, args.repeat, tiles=args.tiles,
                                      image_size=args.image_size, use_tuned=not args.no_tuned,
                                      memory=args.memory, memory_runs=args.memory_runs,
                                      progress=progress, **app)
    if args.json:
        print(json.dumps(rows))
    else:
        print(benchmark.format_table(rows))
        from ..native import kernel_summary

        print(f"kernel: {kernel_summary()}")
    if any(r.get("match") is False for r in rows):
        return EXIT_MISMATCH
    return 1 if all("status" in r for r in rows) else 0


def cmd_tune(args) -> int:
    from .. import tune
    from ..runtime import default_threads

    positive(args.threads, "--threads")
    positive(args.budget, "--budget", 0)
    positive(args.runs, "--runs")
    for message in ignored_model_flags(args.model, image_size=args.image_size):
        warn("coacto", message)
    threads = args.threads or default_threads()
    path = Path(args.model)
    if path.exists() or path.suffix == ".onnx":
        if not path.exists():
            raise CoactoError(f"{args.model}: no such file")
        data, feeds = path.read_bytes(), None
    else:
        from .. import zoo

        if args.model not in zoo.MODELS:
            raise CoactoError(f"{args.model}: no such file, and not a zoo model "
                              f"(zoo: {', '.join(zoo.MODELS)})")
        model = zoo.build(args.model, **({"image_size": args.image_size} if args.image_size else {}))
        data, feeds = model.SerializeToString(), zoo.input_feeds(model)
    model_hash = hashlib.sha256(data).hexdigest()
    existing = tune.load_profile(model_hash, threads)
    if existing and not args.force:
        msg = (f"{tune.profile_path(model_hash, threads)} already holds tile counts for this "
               f"model at {threads} threads (tuned {existing['tuned_ms']:.2f} ms vs default "
               f"{existing['default_ms']:.2f} ms, {existing['ratio']:.2f}x); --force tunes again")
        print(json.dumps(existing) if args.json else msg)
        return 0
    result = tune.tune(data, threads, feeds=feeds, budget_s=args.budget, rounds=args.rounds,
                       runs=args.runs, noise=args.noise, final_rounds=args.final_rounds,
                       progress=progress, save=not args.no_save)
    if args.json:
        print(json.dumps(dict(result.profile, path=str(result.path) if result.path else None)))
        return 0
    changed = len(result.layer_tiles)
    plural = "s" if threads != 1 else ""
    print(f"tuned: {result.tuned_ms:.2f} ms, default: {result.default_ms:.2f} ms -> "
          f"{result.ratio:.2f}x the default's latency ({threads} thread{plural}, measured "
          f"interleaved, {args.final_rounds} rounds)")
    if changed:
        print(f"{changed} layer{'s' if changed != 1 else ''} changed from the default tile counts; "
              f"{result.profile['tuned_tiles']} tiles (default {result.profile['default_tiles']})")
    else:
        print("the default tile counts are the best measured: no change beat them beyond the "
              "noise")
    if result.path:
        print(f"profile written to {result.path}; coacto compile / run / bench use it "
              f"(--no-tuned ignores it)")
    return 0


def cmd_profile(args) -> int:
    from ..sim.measure import DEFAULT_MODELS, run_profile

    threads = int_list(args.threads, "--threads") if args.threads else None
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models \
        else list(DEFAULT_MODELS)
    only = [w.strip() for w in args.only.split(",") if w.strip()] if args.only else []
    quota_models = [m.strip() for m in args.models.split(",") if m.strip()] \
        if args.models and only else None
    prof, path = run_profile(args.name, threads, models, args.runs, args.server,
                             args.link_inferences, args.output, progress=progress,
                             engine=args.engine, only=only, engine_model=args.engine_model,
                             quota=args.quota, period_ms=args.period_ms,
                             quota_models=quota_models)
    if args.json:
        print(json.dumps(dict(prof, path=str(path))))
        return 0
    if prof.get("engine"):
        dev, srv = prof["engine"]["device"], prof["engine"]["server"]
        print(f"device engine: {1e6 * dev['send_msg_s']:.0f} us per message sent + "
              f"{1e9 * dev['send_byte_s']:.2f} ns/byte, ACK "
              f"{1e6 * dev['recv_msg_s'].get('ack', 0):.0f} us, start "
              f"{1e6 * max(dev['start_s'].values(), default=0):.0f} us at most, "
              f"{1e6 * dev['loop_s']:.0f} us of loop per event; server: TILES "
              f"{1e6 * srv['recv_msg_s'].get('tiles', 0):.0f} us + "
              f"{1e9 * srv['recv_byte_s']:.2f} ns/byte, RESULT "
              f"{1e6 * srv['send_msg_s'].get('result', 0):.0f} us")
    for k, q in (prof.get("quota") or {}).items():
        print(f"inside a {k} quota: {q['slowdown']:.2f}x slower than the quota alone says ("
              + ", ".join(f"{m} {v['slowdown']:.2f}" for m, v in q["models"].items()) + ")")
    if only:
        print(f"{' and '.join(only)} written to {path}")
        return 0
    for t, rates in prof["gflops"].items():
        print(f"{t:>3} thread(s): " + ", ".join(f"{c} {r:.1f}" for c, r in rates.items())
              + " GFLOP/s")
    print(f"per-tile overhead {prof['tile_overhead_us']:.2f} us"
          + (f"; link {prof['link']['goodput_mbps']:.1f} Mbit/s, RTT {prof['link']['rtt_ms']:.2f} ms"
             if prof.get("link") else ""))
    from ..native import kernel_summary

    print(f"kernel: {kernel_summary()}")
    print(f"profile written to {path} (python -m coacto.sim --device {args.name} ...)")
    return 0


def add_bench_parser(sub) -> None:
    b = sub.add_parser(
        "bench", help="coacto vs onnxruntime (and OpenVINO): latency, speedup and peak memory, "
                      "one table",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=para("Benchmarks models against onnxruntime on this machine. Latency: the "
                    "runtimes in this process, same inputs and thread count, medians; outputs "
                    "are checked against onnxruntime. --mode back-to-back (the default): runs "
                    "interleaved in blocks of warm-up and timed runs, each runtime's steady "
                    "state. --mode app: as an app runs a model between other work: per round, "
                    "each runtime runs one inference (the order rotating from round to round), "
                    "each after a pause (--pause) and other memory traffic (--traffic-mb); the "
                    "first inference after loading is reported on its own, and the spread (10th "
                    "to 90th percentile). In app mode OpenVINO is a second peer when it is "
                    "installed (pip install openvino, or pip install -e '.[peers]'; float32, "
                    "latency hint, the same thread count; its outputs are checked against "
                    "onnxruntime's too), and the ratio is coacto's over the fastest peer's. "
                    "Speedup: the latency at 1 thread over the latency at this thread count "
                    "(needs 1 in --threads). Memory: the peak resident memory of a fresh process "
                    "that loads the model and runs it, minus that process's size after "
                    "importing the libraries (coacto's and onnxruntime's own). A model that "
                    "cannot run (not in the zoo, an unsupported operator) becomes a row that "
                    "says why."),
        epilog="examples:\n"
               "  coacto bench resnet50 --threads 1,2\n"
               "  coacto bench --models resnet50,vgg16,mobilenetv2,bert,gpt2,vit --threads 1,2\n"
               "  coacto bench model.onnx --threads 2 --repeat 30 --json\n"
               "  coacto bench --models squeezenet --memory off        # latency only\n"
               "  coacto bench --models resnet50 --memory onnx         # coacto compiles in the "
               "measured process\n"
               "  coacto bench mobilenetv2 --mode app --threads 1,2 --memory off\n"
               "                                  # as an app runs it; OpenVINO too if installed\n"
               "\n" + exit_codes_help("3 an output differs from onnxruntime's (a model that "
                                      "cannot run is a row that says why; 1 when none could)"))
    b.add_argument("model", nargs="?", default="resnet50",
                   help="an .onnx or .ctg file or a zoo model name (default resnet50)")
    b.add_argument("--models", help="comma-separated models instead of MODEL (files or zoo names)")
    b.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    b.add_argument("--repeat", type=int, default=20,
                   help="timed runs per runtime and thread count (default 20; --mode app: "
                        "rounds, one run of each runtime per round)")
    b.add_argument("--mode", choices=benchmark.MODES, default="back-to-back",
                   help="back-to-back (default): each runtime's steady state, runs in blocks; "
                        "app: one inference per runtime and round, after a pause and other "
                        "memory traffic, OpenVINO as a second peer when installed")
    b.add_argument("--pause", type=float, default=None,
                   help=f"--mode app: seconds of pause before each inference (default "
                        f"{benchmark.APP_PAUSE_S:g})")
    b.add_argument("--traffic-mb", type=float, default=None,
                   help=f"--mode app: megabytes of other memory traffic (a buffer written, then "
                        f"read) before each inference (default {benchmark.APP_TRAFFIC_MB:g}; 0: "
                        f"none)")
    b.add_argument("--memory", choices=benchmark.MEMORY_MODES, default="ctg",
                   help="peak memory: coacto runs the compiled .ctg (ctg, default: what a device "
                        "runs), or compiles the .onnx in the measured process (onnx), or skip (off)")
    b.add_argument("--memory-runs", type=int, default=5,
                   help="inferences the memory processes run (default 5)")
    b.add_argument("--json", action="store_true", help="print the rows as JSON")
    model_args(b)
    tuned_arg(b)
    b.set_defaults(func=cmd_bench)


def add_tune_parser(sub) -> None:
    t = sub.add_parser(
        "tune", help="measure and store the best tile counts per layer group for this machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=para("ASPEN's tuning loop: starting from the default tile counts, halve or double "
                    "the tiles of one group of layers (one op at one feature-map size) at a time, "
                    "measure it interleaved with the best so far, keep it when it is faster by "
                    "more than the measured noise (at most --noise). At the end the tuned and the "
                    "default configuration are measured against each other once more and that "
                    "ratio is reported and stored. The profile (JSON) goes to "
                    "$COACTO_PROFILE_DIR or ~/.cache/coacto/profiles, keyed by the model's hash, "
                    "this machine and the thread count; compile, run and bench use it."),
        epilog="examples:\n"
               "  coacto tune model.onnx --threads 2\n"
               "  coacto tune resnet50 --threads 1 --budget 60\n"
               "  coacto tune model.onnx --force --json     # tune again, print the profile\n"
               "  COACTO_PROFILE_DIR=./profiles coacto tune mobilenetv2")
    t.add_argument("model", help="an .onnx file or a zoo model name")
    t.add_argument("--threads", type=int, default=None, help="computing threads (default: all CPUs)")
    t.add_argument("--budget", type=float, default=120.0,
                   help="seconds for the search, before the final check (default 120)")
    t.add_argument("--rounds", type=int, default=7,
                   help="interleaved rounds per comparison (default 7, at least 3)")
    t.add_argument("--runs", type=int, default=3, help="timed runs per round (default 3)")
    t.add_argument("--final-rounds", type=int, default=15,
                   help="rounds of the final tuned-vs-default check (default 15)")
    t.add_argument("--noise", type=float, default=0.05,
                   help="largest noise band: a change must win by more than the measured noise, "
                        "capped at this fraction (default 0.05)")
    t.add_argument("--force", action="store_true", help="tune again even if a profile exists")
    t.add_argument("--no-save", action="store_true", help="report only; store no profile")
    t.add_argument("--image-size", type=int, default=None, help="image size when MODEL is a zoo name")
    t.add_argument("--json", action="store_true", help="print the profile as JSON")
    t.set_defaults(func=cmd_tune)
    t.epilog += "\n\n" + exit_codes_help()


def add_profile_parser(sub) -> None:
    pr = sub.add_parser(
        "profile", help="measure this machine (and its link to a server) for the simulator",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=para("Runs zoo models with per-layer timing at each thread count and "
                          "writes profiles/NAME.json: sustained GFLOP/s per op class (conv, "
                          "gemm, depthwise, elementwise, other) and thread count, and the "
                          "runtime's per-tile overhead; with --server, the goodput and RTT a "
                          "client measures to that server. `python -m coacto.sim --device NAME` "
                          "reads it."),
        epilog="examples:\n"
               "  coacto profile --name my-laptop\n"
               "  coacto profile --name pi --threads 1,2,4 --runs 10\n"
               "  coacto profile --name pi-wifi --server tcp://192.168.1.5:5555\n"
               "  coacto profile --name my-laptop --only engine   # add the engine costs\n"
               "  coacto profile --name here --only quota --quota 0.25 --period-ms 4\n"
               "  coacto profile --name here --only local --models resnet50,mobilenetv2\n"
               "  coacto profile --name quick --models squeezenet,mobilenetv3_block --json")
    pr.add_argument("--name", required=True, help="profile name: the file is profiles/NAME.json")
    pr.add_argument("--threads", default=None,
                    help="comma-separated thread counts (default: 1 up to the usable CPUs)")
    pr.add_argument("--models", default=None,
                    help="comma-separated zoo models (default: resnet50, mobilenetv2, "
                         "densenet_block, mobilenetv3_block: every op class)")
    pr.add_argument("--runs", type=int, default=5, help="timed runs per model (default 5)")
    pr.add_argument("--server", default=None, metavar="ADDR",
                    help="also measure the link to this coacto-server (tcp://host:port)")
    pr.add_argument("--link-inferences", type=int, default=5,
                    help="cloud inferences for the link measurement (default 5)")
    pr.add_argument("--engine", action="store_true",
                    help="also measure the communication engines' CPU cost per message and "
                         "byte (a client and a server on loopback; the simulator charges them)")
    pr.add_argument("--quota", type=float, default=None, metavar="CORES",
                    help="also measure how much slower models run inside this CPU quota (a "
                         "cgroup, as the experiments' testbed; needs root), e.g. 0.25")
    pr.add_argument("--period-ms", type=float, default=None,
                    help="the quota's CFS period in ms (the testbed's: 4 at a 0.25 quota)")
    pr.add_argument("--only", default=None, metavar="engine,quota,local",
                    help="measure only these sections and add them to the existing profile "
                         "(local: how much faster each model runs on the graph a client cuts "
                         "for its own work than on the offloading graph; --models picks them)")
    pr.add_argument("--engine-model", default="resnet50",
                    help="zoo model the engine costs are measured with (default resnet50)")
    pr.add_argument("-o", "--output", default=None, help="write here instead of profiles/NAME.json")
    pr.add_argument("--json", action="store_true", help="print the profile as JSON")
    pr.set_defaults(func=cmd_profile)
    pr.epilog += "\n\n" + exit_codes_help()
