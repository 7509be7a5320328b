"""`coacto compile` and `coacto run`: a model to a tile graph file, and a model on the tile runtime
(latency, outputs, --check against onnxruntime, per-layer profile, trace)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ..cli_common import EXIT_MISMATCH, UsageError, exit_codes_help, positive, warn
from .shared import (check_model_flags, check_reference, compare_outputs, load_inputs,
                     model_args, onnxruntime_reference, para, parse_shapes, resolve_model,
                     tuned_arg)


def format_layer_profile(layers: list[dict], runs: int, top: int = 20) -> str:
    """The most expensive layers of a Runtime.profile, and the time per op."""
    by_op: dict[str, float] = {}
    for r in layers:
        by_op[r["op"]] = by_op.get(r["op"], 0.0) + r["seconds"]
    total = sum(by_op.values()) or 1.0
    out = [f"per-layer busy time (mean of {runs} runs, summed over threads): "
           f"{total * 1e3:.2f} ms",
           "  " + ", ".join(f"{op} {t * 1e3:.2f} ms ({t / total:.0%})"
                            for op, t in sorted(by_op.items(), key=lambda kv: -kv[1]))]
    out.append(f"  {'layer':>5}  {'op':<12}{'output (NCHW)':<22}{'tiles':>6}{'ms':>9}{'share':>7}"
               f"{'GFLOP/s':>9}  name")
    for r in sorted(layers, key=lambda r: -r["seconds"])[:top]:
        rate = r["flops"] / r["seconds"] / 1e9 if r["seconds"] > 0 else 0.0
        out.append(f"  {r['layer']:>5}  {r['op']:<12}{'x'.join(map(str, r['shape'])):<22}"
                   f"{r['tiles']:>6}{r['seconds'] * 1e3:>9.3f}{r['share']:>7.1%}{rate:>9.1f}  "
                   f"{r['name']}{' (with its 1x1 prologue)' if r.get('prologue') else ''}")
    return "\n".join(out)


def cmd_compile(args) -> int:
    check_model_flags(args)
    tg, _ = resolve_model(args.model, args.tiles, parse_shapes(args.shape), args.image_size,
                          args.threads, not args.no_tuned)
    out = Path(args.output) if args.output else Path(Path(args.model).stem + ".ctg")
    tg.save(out)
    info = dict(tg.summary(), file=str(out), bytes=out.stat().st_size)
    if args.json:
        print(json.dumps(info))
    else:
        print(f"wrote {out}: {info['layers']} layers, {info['tiles']} tiles, "
              f"{info['dependencies']} dependencies, {info['gflops']:.2f} GFLOP, "
              f"{info['bytes'] / 1e6:.1f} MB\ngraph id {tg.graph_id}")
    return 0


def format_trace_summary(trace: dict, path: str, top: int = 8) -> str:
    """How busy each computing thread was in the fastest traced inference, and where they waited."""
    wall = trace["wall_us"]
    busy = ", ".join(f"{b / wall:.0%}" for b in trace["busy_us"])
    lines = [f"trace of the fastest of {trace['runs']} inferences: {wall / 1e3:.2f} ms, threads busy {busy}; "
             f"written to {path} (open in chrome://tracing or ui.perfetto.dev)"]
    waits = [w for w in trace["waits"] if w["idle_us"] > 0][:top]
    if waits:
        lines.append("idle time, by the layer whose tile ended the wait:")
        lines += [f"  {w['idle_us'] / 1e3:8.3f} ms  {w['op']:<10} {w['layer']}" for w in waits]
    return "\n".join(lines)


def cmd_run(args) -> int:
    from ..runtime import Runtime

    positive(args.repeat, "--repeat")
    positive(args.warmup, "--warmup", 0)
    positive(args.profile, "--profile", 0)
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be positive (seconds)")
    check_model_flags(args)
    if args.reference is not None and not args.check:
        warn("coacto", "--reference is ignored without --check")
    if args.seed and not args.random:
        warn("coacto", "--seed is ignored without --random")
    shapes = parse_shapes(args.shape)
    if args.check and args.reference is None and Path(args.model).suffix == ".ctg":
        raise UsageError("--check with a .ctg model needs --reference MODEL.onnx, the ONNX file "
                         "it was compiled from (a .ctg holds no ONNX model for onnxruntime)")
    tg, onnx_bytes = resolve_model(args.model, args.tiles, shapes, args.image_size,
                                   args.threads, not args.no_tuned)
    reference_model = check_reference(onnx_bytes, tg, args.reference) if args.check else None
    feeds = load_inputs(args.input, tg, args.random, args.seed)
    with Runtime(tg, threads=args.threads) as rt:
        # The first runs pay for page faults, cold caches and threads waking up: they are run
        # but not reported, so the latency is what a serving loop sees.
        for _ in range(args.warmup):
            rt.run(feeds, timeout=args.timeout)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            outputs = rt.run(feeds, timeout=args.timeout)
            times.append(time.perf_counter() - t0)
        stats = rt.last_stats
        layers = rt.profile(feeds, args.profile) if args.profile else None
        trace = rt.trace(feeds) if args.trace else None
    check = None
    if reference_model is not None:
        check = compare_outputs(outputs, onnxruntime_reference(reference_model, feeds, rt))
    if trace is not None:
        from ..runtime import chrome_trace

        Path(args.trace).write_text(json.dumps(chrome_trace(trace)))
    if args.output:
        np.savez(args.output, **outputs)
    result = {
        "latency_s": float(np.median(times)), "latency_min_s": min(times),
        "latency_max_s": max(times), "repeat": len(times), "warmup": args.warmup,
        "threads": rt.threads, "tiles": tg.n_tiles,
        "outputs": {k: list(v.shape) for k, v in outputs.items()},
        "peak_activation_bytes": stats.get("peak_activation_bytes"),
    }
    if check is not None:
        result["check"] = {"match": all(c["match"] for c in check.values()), "outputs": check}
    if layers is not None:
        result["layers"] = layers
    if trace is not None:
        result["trace"] = {"file": args.trace, "wall_s": trace["wall_us"] * 1e-6,
                           "busy_s": [b * 1e-6 for b in trace["busy_us"]],
                           "waits": trace["waits"][:10]}
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in outputs.items():
            flat = value.reshape(-1)
            top = np.argsort(flat)[::-1][:5] if flat.size <= 100000 else []
            print(f"{name}: shape {tuple(value.shape)}, mean {flat.mean():.5g}, "
                  f"max {flat.max():.5g} at {[int(i) for i in top[:5]]}")
        warm = f"after {args.warmup} warm-up run{'s' if args.warmup != 1 else ''}"
        print(f"latency {result['latency_s'] * 1e3:.2f} ms median of {len(times)} "
              f"({warm}; min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f} ms), "
              f"{rt.threads} threads, {tg.n_tiles} tiles")
        for name, c in (check or {}).items():
            print(f"output {name}: max |error| {c['max_error']:.3g} vs max |reference| "
                  f"{c['max_reference']:.3g} -> "
                  f"{'matches onnxruntime' if c['match'] else 'MISMATCH with onnxruntime'}")
        if layers is not None:
            from ..native import kernel_summary

            print(format_layer_profile(layers, args.profile))
            print(f"kernel: {kernel_summary()}")
        if trace is not None:
            print(format_trace_summary(trace, args.trace))
        if args.output:
            print(f"outputs written to {args.output}")
    if check is not None and not result["check"]["match"]:
        return EXIT_MISMATCH
    return 0


def add_compile_parser(sub) -> None:
    c = sub.add_parser("compile", help="ONNX -> tile graph file (.ctg)",
                       description="Compiles a model into a tile graph file for a local "
                                   "Runtime (coacto run, coacto.load):\npartitioned for "
                                   "--threads, with 1x1 expansions computed inside the\n"
                                   "depthwise layers after them. To offload, give coacto-client "
                                   "the .onnx file:\nthe device and the server then compile the "
                                   "same graph.",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  coacto compile resnet50.onnx -o resnet50.ctg --tiles 16\n"
                              "  coacto compile resnet50.onnx --threads 2   # a tuned profile for 2 "
                              "threads, if any")
    c.add_argument("model", help="an .onnx file or a zoo model name")
    c.add_argument("-o", "--output", help="output file (default: MODEL.ctg in this folder)")
    c.add_argument("--threads", type=int, default=None,
                   help="the thread count the graph is for: its tuned profile, and with 1 "
                        "cheap layers run whole (default: all CPUs; the .ctg records it)")
    c.add_argument("--json", action="store_true", help="print a JSON summary")
    model_args(c)
    tuned_arg(c)
    c.set_defaults(func=cmd_compile)
    c.epilog += "\n\n" + exit_codes_help()


def add_run_parser(sub) -> None:
    r = sub.add_parser(
        "run", help="run a model on the tile runtime",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=para("Runs a model on the tile runtime and reports its latency: the median "
                          "of --repeat timed runs after --warmup untimed ones (the first runs pay "
                          "for page faults and cold caches), with the fastest and slowest. "
                          "--check compares the outputs with onnxruntime's. Flags the model does "
                          "not use (--tiles with a .ctg, --image-size with an ONNX file) are "
                          "named in a warning."),
        epilog="examples:\n  coacto run model.onnx --input data=img.npy --threads 2\n"
               "  coacto run model.ctg --input inputs.npz --output out.npz --json\n"
               "  coacto run squeezenet --random --repeat 20 --warmup 3\n"
               "  coacto run model.onnx --random --check        # outputs vs onnxruntime\n"
               "  coacto run model.ctg --random --check --reference model.onnx\n"
               "  coacto run resnet50 --random --threads 1 --profile 20   # where the time goes\n"
               "  coacto run bert --random --threads 2 --trace bert.json   # idle threads, tile "
               "by tile\n\n"
               + exit_codes_help("3 with --check: an output differs from onnxruntime's by more "
                                 "than 1e-4 of its largest value"))
    r.add_argument("model", help="an .onnx or .ctg file, or a zoo model name")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy|FILE.npz",
                   help="an input array (repeatable); a .npz holds several by name")
    r.add_argument("--random", action="store_true", help="fill missing inputs with seeded noise")
    r.add_argument("--seed", type=int, default=0, help="the noise's seed (with --random)")
    r.add_argument("--threads", type=int, default=None, help="computing threads (default: all CPUs)")
    r.add_argument("--repeat", type=int, default=5, metavar="N",
                   help="timed runs; the latency reported is their median (default 5)")
    r.add_argument("--warmup", type=int, default=1, metavar="K",
                   help="untimed runs before them (default 1)")
    r.add_argument("--check", action="store_true",
                   help="compare the outputs with onnxruntime's (needs onnxruntime); exit 3 when "
                        "one differs by more than 1e-4 of its largest value")
    r.add_argument("--reference", metavar="MODEL.onnx",
                   help="with --check and a .ctg model: the ONNX file it was compiled from")
    r.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    r.add_argument("--output", help="write the outputs (ONNX names) to this .npz")
    r.add_argument("--profile", type=int, default=0, metavar="RUNS",
                   help="then run RUNS more times timing every layer, and show where the time "
                        "goes (the most expensive layers)")
    r.add_argument("--trace", metavar="FILE.json",
                   help="then trace 5 inferences and write the fastest's timeline (every tile: "
                        "thread, start, duration) as a Chrome trace; prints how busy the threads "
                        "were and which layers they waited for")
    r.add_argument("--json", action="store_true", help="print a JSON result")
    model_args(r)
    tuned_arg(r)
    r.set_defaults(func=cmd_run)
