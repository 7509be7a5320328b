"""The `coacto` command: compile, run, bench, tune, demo, profile, keygen.

Exit codes (coacto.cli_common): 0 success; 1 an error (message on stderr); 2 bad usage; 3 outputs
disagree with onnxruntime (run --check, bench, demo)."""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from . import benchmark, compiler
from ._version import __version__
from .cli_common import (EXIT_MISMATCH, UsageError, exit_codes_help, positive,
                         rate_schedule, usage_error, warn)
from .errors import CoactoError, InputError

log = logging.getLogger("coacto.cli")

EPILOG_MAIN = """\
examples:
  coacto demo                                   build a ResNet-50, compile, run, compare
  coacto compile model.onnx -o model.ctg        ONNX -> tile graph file
  coacto run model.onnx --input data=img.npy --threads 2
  coacto run model.ctg --random --output out.npz --json
  coacto bench resnet50 --threads 2             coacto vs onnxruntime, same threads
  coacto bench --models resnet50,vgg16,mobilenetv2 --threads 1,2
  coacto tune model.onnx --threads 2            tile counts measured for this machine
  coacto profile --name my-laptop               this machine's profile for the simulator

{exit_codes}.
""".format(exit_codes=exit_codes_help("3 outputs differ from onnxruntime (run --check, bench, "
                                     "demo)"))


def _para(text: str) -> str:
    """Help text wrapped for the terminal (the raw formatters keep line breaks as written)."""
    return textwrap.fill(text, 79)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ model loading

def resolve_model(spec: str, tiles_per_layer=None, input_shapes=None, image_size=None,
                  threads: int | None = None, use_tuned: bool = True, min_column_blocks: int = 0):
    """A .ctg file, an .onnx file, or the name of a zoo model -> (TileGraph, onnx bytes or None).

    An ONNX model is compiled with the tile counts of the profile `coacto tune` stored for it on
    this machine and thread count, when there is one, use_tuned is set, and neither --tiles nor
    --shape overrides the partition. ``min_column_blocks``: see coacto.compile (graphs for
    offloading)."""
    path = Path(spec)
    if path.suffix == ".ctg":
        return compiler.load(path), None
    if path.exists() or path.suffix == ".onnx":
        if not path.exists():
            raise CoactoError(f"{spec}: no such file")
        data = path.read_bytes()
        label = path.name
    else:
        from . import zoo

        if spec not in zoo.MODELS:
            raise CoactoError(f"{spec}: no such file, and not a zoo model "
                              f"(zoo: {', '.join(zoo.MODELS)})")
        kw = {"image_size": image_size} if image_size else {}
        _progress(f"building zoo model {spec} ...")
        data = zoo.build(spec, **kw).SerializeToString()
        label = spec
    layer_tiles = None
    if use_tuned and tiles_per_layer is None and not input_shapes:
        from . import tune
        from .runtime import default_threads

        t = threads or default_threads()
        model_hash = hashlib.sha256(data).hexdigest()
        prof = tune.load_profile(model_hash, t)
        layer_tiles = tune.layer_tiles_of(prof)
        if layer_tiles:
            _progress(f"using the tuned tile counts of {tune.profile_path(model_hash, t)} "
                      f"(measured {prof['ratio']:.2f}x the default's latency at {t} threads; "
                      f"--no-tuned ignores it)")
    t0 = time.perf_counter()
    tg = compiler.compile(data, tiles_per_layer=tiles_per_layer, input_shapes=input_shapes,
                        layer_tiles=layer_tiles, min_column_blocks=min_column_blocks)
    _progress(f"compiled {label}: {tg.n_layers} layers, {tg.n_tiles} tiles "
              f"in {time.perf_counter() - t0:.2f} s")
    return tg, data


def ignored_model_flags(spec: str, tiles=None, shape=None, image_size=None,
                        no_tuned: bool = False) -> list[str]:
    """Why each model flag given goes unused with this model, one sentence per flag: a .ctg's
    tiles and shapes were fixed when it was compiled, and only zoo models are built at a size."""
    path = Path(spec)
    if path.suffix == ".ctg":
        given = [flag for flag, value in (("--tiles", tiles), ("--shape", shape),
                                          ("--image-size", image_size)) if value]
        given += ["--no-tuned"] if no_tuned else []
        return [f"{flag} is ignored with {spec}: a .ctg's tiles and input shapes were fixed when "
                f"it was compiled (`coacto compile` takes {flag})" for flag in given]
    if image_size and (path.exists() or path.suffix == ".onnx"):
        return [f"--image-size is ignored with {spec}: it sizes zoo models only (an ONNX file "
                "with dynamic dimensions takes --shape NAME=1,3,H,W)"]
    return []


def parse_shapes(items) -> dict | None:
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name] = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            raise UsageError(f"--shape {item!r}: write NAME=1,3,224,224") from None
    return out


def load_inputs(items, graph, random: bool, seed: int = 0) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep:
            file, name = item, None
        p = Path(file)
        if not p.exists():
            raise InputError(f"--input {item}: {file} does not exist")
        try:
            loaded = np.load(p, allow_pickle=False)
        except Exception as e:
            raise InputError(f"--input {item}: cannot read {file} as .npy/.npz ({e})") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            feeds.update({k: loaded[k] for k in loaded.files})
        else:
            if name is None:
                if len(graph.inputs) != 1:
                    raise InputError(f"--input {file}: the model has inputs {list(graph.inputs)}; "
                                     f"write NAME={file}")
                name = next(iter(graph.inputs))
            feeds[name] = loaded
    if random:
        for name, value in graph.example_feeds(seed).items():
            feeds.setdefault(name, value)
    if not feeds:
        raise InputError("no input given: pass --input NAME=FILE.npy (or FILE.npz), or --random "
                         f"(the model's inputs: {dict(graph.inputs)})")
    return feeds


# ------------------------------------------------------------------------------ commands

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
                   f"{r['name']}")
    return "\n".join(out)


def cmd_compile(args) -> int:
    _check_model_flags(args)
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


def _check_model_flags(args, shapes_allowed: bool = True) -> None:
    """The model flags every command shares: values, and a warning for each one unused."""
    positive(getattr(args, "threads", None), "--threads")
    positive(getattr(args, "tiles", None), "--tiles")
    positive(getattr(args, "image_size", None), "--image-size")
    for message in ignored_model_flags(args.model, getattr(args, "tiles", None),
                                       getattr(args, "shape", None),
                                       getattr(args, "image_size", None),
                                       getattr(args, "no_tuned", False)):
        warn("coacto", message)


def check_reference(onnx_bytes: bytes | None, tg, reference: str | None) -> bytes:
    """The ONNX model run --check compares against: the one the model came from, or --reference
    (which must be the ONNX the tile graph was compiled from: its sha256 is in the graph)."""
    if reference is None:
        return onnx_bytes
    if not Path(reference).is_file():
        raise CoactoError(f"--reference {reference}: no such file")
    data = Path(reference).read_bytes()
    if hashlib.sha256(data).hexdigest() != tg.model_hash:
        raise CoactoError(f"--reference {reference} is not the ONNX model this tile graph was "
                          "compiled from (sha256 differs); pass that same .onnx file")
    return data


def compare_outputs(outputs: dict, reference: dict) -> dict:
    """Each output against onnxruntime's: max |error| within 1e-4 of max |reference|."""
    rows = {}
    for name, value in outputs.items():
        err, scale = benchmark.max_error(value, reference[name])
        rows[name] = {"max_error": err, "max_reference": scale, "match": bool(err <= 1e-4 * scale)}
    return rows


def _onnxruntime_reference(model: bytes, feeds: dict, rt) -> dict:
    """onnxruntime's outputs for ``feeds``, each cast to the type the model declares (coacto
    takes any integer type for an int64 input; onnxruntime only the declared one)."""
    typed = {a.name: np.asarray(feeds[a.name]).astype(a.dtype, copy=False)
             for a in rt.get_inputs() if a.name in feeds}
    try:
        ref, _ = benchmark.onnxruntime_run(model, typed, rt.threads, 0)
    except CoactoError:
        raise
    except Exception as e:  # onnxruntime's own errors: the reference cannot run, say why
        raise CoactoError(f"--check: onnxruntime cannot run the reference model: "
                          f"{type(e).__name__}: {str(e)[:300]}") from None
    return ref


def cmd_run(args) -> int:
    from .runtime import Runtime

    positive(args.repeat, "--repeat")
    positive(args.warmup, "--warmup", 0)
    positive(args.profile, "--profile", 0)
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be positive (seconds)")
    _check_model_flags(args)
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
        check = compare_outputs(outputs, _onnxruntime_reference(reference_model, feeds, rt))
    if trace is not None:
        from .runtime import chrome_trace

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
            print(format_layer_profile(layers, args.profile))
        if trace is not None:
            print(format_trace_summary(trace, args.trace))
        if args.output:
            print(f"outputs written to {args.output}")
    if check is not None and not result["check"]["match"]:
        return EXIT_MISMATCH
    return 0


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"{what} {text!r}: write positive integers separated by commas, e.g. 1,2")
    return values


def cmd_bench(args) -> int:
    specs = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else [args.model]
    if not specs:
        raise UsageError("--models is empty: name models separated by commas, e.g. resnet50,vgg16")
    threads = _int_list(args.threads, "--threads")
    positive(args.repeat, "--repeat")
    positive(args.memory_runs, "--memory-runs")
    positive(args.tiles, "--tiles")
    positive(args.image_size, "--image-size")
    for spec in specs:
        for message in ignored_model_flags(spec, args.tiles, None, args.image_size,
                                           args.no_tuned):
            warn("coacto", message)
    if len(specs) == 1 and specs[0].endswith(".ctg"):
        tg, _ = resolve_model(specs[0])
        rows = []
        for t in threads:
            _progress(f"benchmarking {specs[0]} at {t} thread(s) (no ONNX model: coacto only) ...")
            rows.append(benchmark.compare(tg, None, t, args.repeat, name=specs[0]))
    else:
        if args.shape:
            raise UsageError("--shape is not supported by bench: give the ONNX model static shapes")
        rows = benchmark.bench_models(specs, threads, args.repeat, tiles=args.tiles,
                                      image_size=args.image_size, use_tuned=not args.no_tuned,
                                      memory=args.memory, memory_runs=args.memory_runs,
                                      progress=_progress)
    if args.json:
        print(json.dumps(rows))
    else:
        print(benchmark.format_table(rows))
    if any(r.get("match") is False for r in rows):
        return EXIT_MISMATCH
    return 1 if all("status" in r for r in rows) else 0


def cmd_tune(args) -> int:
    from . import tune
    from .runtime import default_threads

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
        from . import zoo

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
                       progress=_progress, save=not args.no_save)
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


def cmd_demo(args) -> int:
    from . import zoo
    from .mobile.shaper import describe_schedule
    from .native import gemm_kernel_name
    from .runtime import Runtime

    positive(args.repeat, "--repeat")
    positive(args.threads, "--threads")
    positive(args.tiles, "--tiles")
    positive(args.image_size, "--image-size")
    for bw in (b.strip() for b in args.bandwidths.split(",") if b.strip()):
        # each cap as read, in bits and bytes, before minutes of work
        _progress(f"link cap {bw}: {describe_schedule(rate_schedule(bw, '--bandwidths'))}")
    name = args.model
    _progress(f"building {name} from coacto's zoo (seeded random weights, no download) ...")
    t0 = time.perf_counter()
    model = zoo.build(name, **({"image_size": args.image_size} if args.image_size else {}))
    onnx_bytes = model.SerializeToString()
    _progress(f"  {len(onnx_bytes) / 1e6:.1f} MB ONNX in {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    tg = compiler.compile(model, tiles_per_layer=args.tiles)
    compile_s = time.perf_counter() - t0
    s = tg.summary()
    print(f"tile graph: {s['layers']} layers, {s['tiles']} tiles, {s['dependencies']} "
          f"dependencies, {s['gflops']:.2f} GFLOP (compiled in {compile_s:.2f} s)")
    print(f"GEMM kernel: {gemm_kernel_name()}")
    feeds = zoo.input_feeds(model, seed=0)
    with Runtime(tg, threads=args.threads) as rt:
        outputs = rt.run(feeds)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            outputs = rt.run(feeds)
            times.append(time.perf_counter() - t0)
    lat = float(np.median(times))
    print(f"coacto latency: {lat * 1e3:.1f} ms (median of {len(times)}, {rt.threads} threads)")
    status = 0
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime is not installed: skipping the comparison "
              "(pip install onnxruntime to check outputs)")
        return 0
    ref, ort_lat = benchmark.onnxruntime_run(onnx_bytes, feeds, rt.threads, args.repeat)
    for out_name, value in outputs.items():
        err, scale = benchmark.max_error(value, ref[out_name])
        ok = err <= 1e-4 * scale
        status = status if ok else EXIT_MISMATCH
        print(f"output {out_name} {tuple(value.shape)}: max |error| {err:.3g} vs max |reference| "
              f"{scale:.3g} -> {'matches onnxruntime' if ok else 'MISMATCH'}")
    print(f"onnxruntime latency: {ort_lat * 1e3:.1f} ms -> coacto / onnxruntime = {lat / ort_lat:.2f}x")
    if args.bandwidths:
        status = max(status, demo_offload(model, feeds, ref, args))
    return status


def demo_offload(model, feeds, ref, args) -> int:
    """Every policy against a server on loopback, at a few bandwidth caps of the client's link."""
    from . import benchmark as bm
    from .mobile.client import Client
    from .server import Server

    policies = ["local", "cloud", "split", "fl", "dynamic"]
    bandwidths = [b.strip() for b in args.bandwidths.split(",") if b.strip()]
    print("\ncollaborative offloading: a coacto server on loopback (in this process), the device's "
          "link capped by its own shaper; device and server share this machine's cores, so this "
          "shows the policies working, not a slow device (see experiments/fig_bandwidth.py)")
    rows, worst = {}, 0.0
    with Server("tcp://127.0.0.1:0", threads=args.threads or 1).start() as server:
        for bw in bandwidths:
            for policy in policies:
                _progress(f"  {policy} at {bw} ...")
                with Client(server.address, model, threads=args.threads or 1, policy=policy,
                                   bandwidth=bw) as client:
                    times = []
                    for _ in range(1 + max(1, args.repeat // 2)):
                        out = client.infer(feeds)
                        times.append(client.last_stats["latency_s"])
                    rows[bw, policy] = (float(np.median(times[1:])), client.last_stats)
                for name, value in out.items():
                    err, scale = bm.max_error(value, ref[name])
                    worst = max(worst, err / scale if scale else err)
    head = f"{'bandwidth':>10} " + "".join(f"{p:>10}" for p in policies) + "   (ms, median)"
    print(head)
    for bw in bandwidths:
        print(f"{bw:>10} " + "".join(f"{rows[bw, p][0] * 1e3:10.1f}" for p in policies))
    ok = worst <= 1e-4
    print(f"all {len(rows)} runs agree with onnxruntime (max relative error {worst:.2g})" if ok
          else f"MISMATCH: max relative error {worst:.2g}")
    return 0 if ok else EXIT_MISMATCH


def cmd_profile(args) -> int:
    from .sim.measure import DEFAULT_MODELS, run_profile

    threads = _int_list(args.threads, "--threads") if args.threads else None
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models \
        else list(DEFAULT_MODELS)
    only = [w.strip() for w in args.only.split(",") if w.strip()] if args.only else []
    quota_models = [m.strip() for m in args.models.split(",") if m.strip()] \
        if args.models and only else None
    prof, path = run_profile(args.name, threads, models, args.runs, args.server,
                             args.link_inferences, args.output, progress=_progress,
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
    print(f"profile written to {path} (python -m coacto.sim --device {args.name} ...)")
    return 0


# ------------------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coacto", description="Run ONNX models as fine-grained tile dataflow graphs.",
        epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log what coacto does")
    p.add_argument("--version", action="version", version=f"coacto {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def model_args(sp, tiles_help=True):
        sp.add_argument("--tiles", type=int, default=None, metavar="T",
                        help="tiles per layer (default: a FLOP-based heuristic)")
        sp.add_argument("--shape", action="append", metavar="NAME=D0,D1,..",
                        help="static shape for an input with dynamic dimensions (repeatable)")
        sp.add_argument("--image-size", type=int, default=None,
                        help="image size when MODEL is a zoo name")

    def tuned_arg(sp):
        sp.add_argument("--no-tuned", action="store_true",
                        help="ignore the tile counts `coacto tune` stored for this model, machine "
                             "and thread count (they are used by default when present)")

    c = sub.add_parser("compile", help="ONNX -> tile graph file (.ctg)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  coacto compile resnet50.onnx -o resnet50.ctg --tiles 16\n"
                              "  coacto compile resnet50.onnx --threads 2   # a tuned profile for 2 "
                              "threads, if any")
    c.add_argument("model", help="an .onnx file or a zoo model name")
    c.add_argument("-o", "--output", help="output file (default: MODEL.ctg in this folder)")
    c.add_argument("--threads", type=int, default=None,
                   help="the thread count whose tuned profile to use (default: all CPUs)")
    c.add_argument("--json", action="store_true", help="print a JSON summary")
    model_args(c)
    tuned_arg(c)
    c.set_defaults(func=cmd_compile)

    r = sub.add_parser(
        "run", help="run a model on the tile runtime",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_para("Runs a model on the tile runtime and reports its latency: the median "
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

    b = sub.add_parser(
        "bench", help="coacto vs onnxruntime: latency, speedup and peak memory, one table",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_para("Benchmarks models against onnxruntime on this machine. Latency: both "
                    "runtimes in this process, same inputs and thread count, runs interleaved "
                    "in blocks, medians; outputs are checked against onnxruntime. Speedup: the "
                    "latency at 1 thread over the latency at this thread count (needs 1 in "
                    "--threads). Memory: the peak resident memory of a fresh process that loads "
                    "the model and runs it, minus that process's size after importing the "
                    "libraries (coacto's and onnxruntime's own). A model that cannot run (not in "
                    "the zoo, an unsupported operator) becomes a row that says why."),
        epilog="examples:\n"
               "  coacto bench resnet50 --threads 1,2\n"
               "  coacto bench --models resnet50,vgg16,mobilenetv2,bert,gpt2,vit --threads 1,2\n"
               "  coacto bench model.onnx --threads 2 --repeat 30 --json\n"
               "  coacto bench --models squeezenet --memory off        # latency only\n"
               "  coacto bench --models resnet50 --memory onnx         # coacto compiles in the "
               "measured process\n"
               "\n" + exit_codes_help("3 an output differs from onnxruntime's (a model that "
                                      "cannot run is a row that says why; 1 when none could)"))
    b.add_argument("model", nargs="?", default="resnet50",
                   help="an .onnx or .ctg file or a zoo model name (default resnet50)")
    b.add_argument("--models", help="comma-separated models instead of MODEL (files or zoo names)")
    b.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    b.add_argument("--repeat", type=int, default=20,
                   help="timed runs per runtime and thread count (default 20)")
    b.add_argument("--memory", choices=benchmark.MEMORY_MODES, default="ctg",
                   help="peak memory: coacto runs the compiled .ctg (ctg, default: what a device "
                        "runs), or compiles the .onnx in the measured process (onnx), or skip (off)")
    b.add_argument("--memory-runs", type=int, default=5,
                   help="inferences the memory processes run (default 5)")
    b.add_argument("--json", action="store_true", help="print the rows as JSON")
    model_args(b)
    tuned_arg(b)
    b.set_defaults(func=cmd_bench)

    t = sub.add_parser(
        "tune", help="measure and store the best tile counts per layer group for this machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_para("ASPEN's tuning loop: starting from the default tile counts, halve or double "
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

    d = sub.add_parser("demo", help="a zoo ResNet-50: compile, run, check vs onnxruntime, then "
                                    "every offloading policy against a server on loopback",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  coacto demo --threads 2 --model mobilenetv2\n"
                              "  coacto demo --bandwidths 10mbit,1gbit\n"
                              "  coacto demo --bandwidths ''        # local part only")
    d.add_argument("--model", default="resnet50", help="zoo model (default resnet50)")
    d.add_argument("--image-size", type=int, default=None)
    d.add_argument("--tiles", type=int, default=None, help="tiles per layer")
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--repeat", type=int, default=5)
    d.add_argument("--bandwidths", default="5mbit,20mbit,100mbit",
                   help="link caps for the offloading part, comma-separated: bits as 20mbit, "
                        "bytes as 2.5MB/s (as coacto-client --bandwidth; '' skips it)")
    d.set_defaults(func=cmd_demo)

    pr = sub.add_parser(
        "profile", help="measure this machine (and its link to a server) for the simulator",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_para("Runs zoo models with per-layer timing at each thread count and "
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
    pr.add_argument("--only", default=None, metavar="engine,quota",
                    help="measure only these sections and add them to the existing profile")
    pr.add_argument("--engine-model", default="resnet50",
                    help="zoo model the engine costs are measured with (default resnet50)")
    pr.add_argument("-o", "--output", default=None, help="write here instead of profiles/NAME.json")
    pr.add_argument("--json", action="store_true", help="print the profile as JSON")
    pr.set_defaults(func=cmd_profile)

    k = sub.add_parser(
        "keygen", help="write a CurveZMQ key pair for a server or a device",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  coacto keygen --out keys/ server      # keys/server.key, keys/server.key_secret\n"
               "  coacto keygen --out keys/ phone1      # one pair per device\n"
               "then give the server keys/server.key_secret and a folder holding phone1.key\n"
               "(coacto-server --secret-key ... --allowed-keys DIR), and the device\n"
               "keys/server.key and keys/phone1.key_secret (coacto-client --server-key ...\n"
               "--client-key ...). NAME.key is public; NAME.key_secret stays where it was made\n"
               "(written with mode 0600). See docs/SECURITY.md.")
    k.add_argument("name", help="the pair's name: NAME.key and NAME.key_secret")
    k.add_argument("--out", default=".", metavar="DIR", help="folder to write to (default: here)")
    k.add_argument("--force", action="store_true", help="replace an existing pair of that name")
    k.set_defaults(func=cmd_keygen)
    for sp in (c, t, pr, k):
        sp.epilog += "\n\n" + exit_codes_help()
    d.epilog += "\n\n" + exit_codes_help("3 an output differs from onnxruntime's")
    return p


def cmd_keygen(args) -> int:
    from . import keys

    public, secret = keys.generate(args.out, args.name, force=args.force)
    key = keys.load_public(public).decode("ascii")
    print(f"public key {key}\n  {public}  (give it to the other side)\n  {secret}  (keep it "
          f"private)")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except UsageError as e:
        return usage_error("coacto", e, f"coacto {args.command}")
    except CoactoError as e:
        print(f"coacto: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file the command writes (--output, --trace, -o): say which and why
        where = f"{e.filename}: " if e.filename else ""
        print(f"coacto: error: {where}{e.strerror or e}; check the path and its permissions",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a run in flight was cancelled before this was raised
        print("coacto: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
