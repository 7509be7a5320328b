"""The `coacto` command: compile, run, bench, demo.

Exit codes: 0 success; 1 a coacto error (message on stderr); 2 bad usage; 3 outputs disagree
with onnxruntime."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from . import benchmark
from .errors import CoactoError, InputError

log = logging.getLogger("coacto.cli")

EXIT_MISMATCH = 3

EPILOG_MAIN = """\
examples:
  coacto demo                                   build a ResNet-50, compile, run, compare
  coacto compile model.onnx -o model.ctg        ONNX -> tile graph file
  coacto run model.onnx --input data=img.npy --threads 2
  coacto run model.ctg --random --output out.npz --json
  coacto bench resnet50 --threads 2             coacto vs onnxruntime, same threads
"""


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ model loading

def resolve_model(spec: str, tiles_per_layer=None, input_shapes=None, image_size=None):
    """A .ctg file, an .onnx file, or the name of a zoo model -> (TileGraph, onnx bytes or None)."""
    import coacto

    path = Path(spec)
    if path.suffix == ".ctg":
        return coacto.load(path), None
    if path.exists() or path.suffix == ".onnx":
        t0 = time.perf_counter()
        tg = coacto.compile(str(path), tiles_per_layer=tiles_per_layer, input_shapes=input_shapes)
        _progress(f"compiled {path.name}: {tg.n_layers} layers, {tg.n_tiles} tiles "
                  f"in {time.perf_counter() - t0:.2f} s")
        return tg, path.read_bytes()
    from . import zoo

    if spec in zoo.MODELS:
        kw = {"image_size": image_size} if image_size else {}
        _progress(f"building zoo model {spec} ...")
        model = zoo.build(spec, **kw)
        data = model.SerializeToString()
        t0 = time.perf_counter()
        tg = coacto.compile(model, tiles_per_layer=tiles_per_layer, input_shapes=input_shapes)
        _progress(f"compiled {spec}: {tg.n_layers} layers, {tg.n_tiles} tiles "
                  f"in {time.perf_counter() - t0:.2f} s")
        return tg, data
    raise CoactoError(f"{spec}: no such file, and not a zoo model (zoo: {', '.join(zoo.MODELS)})")


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
            raise InputError(f"--shape {item!r}: write NAME=1,3,224,224") from None
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

def cmd_compile(args) -> int:
    tg, _ = resolve_model(args.model, args.tiles, parse_shapes(args.shape), args.image_size)
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


def cmd_run(args) -> int:
    from .runtime import Runtime

    tg, _ = resolve_model(args.model, args.tiles, parse_shapes(args.shape), args.image_size)
    feeds = load_inputs(args.input, tg, args.random, args.seed)
    with Runtime(tg, threads=args.threads) as rt:
        times = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            outputs = rt.run(feeds, timeout=args.timeout)
            times.append(time.perf_counter() - t0)
        stats = rt.last_stats
    if args.output:
        np.savez(args.output, **outputs)
    result = {
        "latency_s": float(np.median(times)), "repeat": len(times), "threads": rt.threads,
        "tiles": tg.n_tiles, "outputs": {k: list(v.shape) for k, v in outputs.items()},
        "peak_activation_bytes": stats.get("peak_activation_bytes"),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in outputs.items():
            flat = value.reshape(-1)
            top = np.argsort(flat)[::-1][:5] if flat.size <= 100000 else []
            print(f"{name}: shape {tuple(value.shape)}, mean {flat.mean():.5g}, "
                  f"max {flat.max():.5g} at {list(top)[:5]}")
        print(f"latency {result['latency_s'] * 1e3:.2f} ms (median of {len(times)}), "
              f"{rt.threads} threads, {tg.n_tiles} tiles")
        if args.output:
            print(f"outputs written to {args.output}")
    return 0


def cmd_bench(args) -> int:
    rows = []
    for spec in args.models.split(",") if args.models else [args.model]:
        tg, onnx_bytes = resolve_model(spec, args.tiles, parse_shapes(args.shape), args.image_size)
        for threads in (int(t) for t in str(args.threads).split(",")):
            _progress(f"benchmarking {spec} at {threads} thread(s), {args.repeat} interleaved runs ...")
            rows.append(benchmark.compare(tg, onnx_bytes, threads, args.repeat, name=spec))
    if args.json:
        print(json.dumps(rows))
    else:
        print(benchmark.format_table(rows))
    return EXIT_MISMATCH if any(r.get("match") is False for r in rows) else 0


def cmd_demo(args) -> int:
    from . import zoo
    from .runtime import Runtime, gemm_kernel_name

    name = args.model
    _progress(f"building {name} from coacto's zoo (seeded random weights, no download) ...")
    t0 = time.perf_counter()
    model = zoo.build(name, **({"image_size": args.image_size} if args.image_size else {}))
    onnx_bytes = model.SerializeToString()
    _progress(f"  {len(onnx_bytes) / 1e6:.1f} MB ONNX in {time.perf_counter() - t0:.2f} s")
    import coacto

    t0 = time.perf_counter()
    tg = coacto.compile(model, tiles_per_layer=args.tiles)
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
    import coacto

    from . import benchmark as bm

    policies = ["local", "cloud", "split", "fl", "dynamic"]
    bandwidths = [b.strip() for b in args.bandwidths.split(",") if b.strip()]
    print("\ncollaborative offloading: a coacto server on loopback (in this process), the device's "
          "link capped by its own shaper; device and server share this machine's cores, so this "
          "shows the policies working, not a slow device (see experiments/offload_bandwidth.py)")
    rows, worst = {}, 0.0
    with coacto.Server("tcp://127.0.0.1:0", threads=args.threads or 1).start() as server:
        for bw in bandwidths:
            for policy in policies:
                _progress(f"  {policy} at {bw} ...")
                with coacto.Client(server.address, model, threads=args.threads or 1, policy=policy,
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


# ------------------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coacto", description="Run ONNX models as fine-grained tile dataflow graphs.",
        epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log what coacto does")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def model_args(sp, tiles_help=True):
        sp.add_argument("--tiles", type=int, default=None, metavar="T",
                        help="tiles per layer (default: a FLOP-based heuristic)")
        sp.add_argument("--shape", action="append", metavar="NAME=D0,D1,..",
                        help="static shape for an input with dynamic dimensions (repeatable)")
        sp.add_argument("--image-size", type=int, default=None,
                        help="image size when MODEL is a zoo name")

    c = sub.add_parser("compile", help="ONNX -> tile graph file (.ctg)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example:\n  coacto compile resnet50.onnx -o resnet50.ctg --tiles 16")
    c.add_argument("model", help="an .onnx file or a zoo model name")
    c.add_argument("-o", "--output", help="output file (default: MODEL.ctg in this folder)")
    c.add_argument("--json", action="store_true", help="print a JSON summary")
    model_args(c)
    c.set_defaults(func=cmd_compile)

    r = sub.add_parser("run", help="run a model on the tile runtime",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  coacto run model.onnx --input data=img.npy --threads 2\n"
                              "  coacto run model.ctg --input inputs.npz --output out.npz --json\n"
                              "  coacto run squeezenet --random --repeat 10")
    r.add_argument("model", help="an .onnx or .ctg file, or a zoo model name")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy|FILE.npz",
                   help="an input array (repeatable); a .npz holds several by name")
    r.add_argument("--random", action="store_true", help="fill missing inputs with seeded noise")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=None, help="computing threads (default: all CPUs)")
    r.add_argument("--repeat", type=int, default=1, help="run this many times, report the median")
    r.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    r.add_argument("--output", help="write the outputs (ONNX names) to this .npz")
    r.add_argument("--json", action="store_true", help="print a JSON result")
    model_args(r)
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="coacto vs onnxruntime, same threads, interleaved runs",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  coacto bench resnet50 --threads 1,2\n"
                              "  coacto bench model.onnx --threads 2 --repeat 30 --json\n"
                              "  coacto bench --models resnet50,mobilenetv2 --threads 2")
    b.add_argument("model", nargs="?", default="resnet50", help="an .onnx file or zoo model name")
    b.add_argument("--models", help="comma-separated list instead of MODEL")
    b.add_argument("--threads", default="2", help="comma-separated thread counts")
    b.add_argument("--repeat", type=int, default=20)
    b.add_argument("--json", action="store_true")
    model_args(b)
    b.set_defaults(func=cmd_bench)

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
                   help="link caps for the offloading part ('' skips it)")
    d.set_defaults(func=cmd_demo)
    return p


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
    except CoactoError as e:
        print(f"coacto: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
