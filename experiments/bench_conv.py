#!/usr/bin/env python3
"""Kernel time of single convolution layers in coacto and onnxruntime, same run.

Each shape becomes a one-layer ONNX model (Conv with bias, then Relu, seeded random weights),
run by coacto's local runtime and by onnxruntime on the same input. The time of the convolution
itself comes from each runtime's own per-layer profiler (coacto: the layer's tiles; onnxruntime:
its Conv node), so input and output layout conversions, which a one-layer model would otherwise
be dominated by, stay out. Runs alternate between the two; the minimum of each is kept, which is
what a shared, noisy machine leaves comparable. The outputs are checked against each other.

Shapes are named (ResNet-50 and VGG-16 layers, see --list) or given as CIN,COUT,HW,K[,STRIDE].

Examples:
  python experiments/bench_conv.py
  python experiments/bench_conv.py --shapes r14 vgg28 256,256,14,3 --runs 30
  python experiments/bench_conv.py --threads 2 --json

Exit codes: 0 done, 1 outputs disagree, 2 bad arguments, 3 onnxruntime or coacto's native module
missing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

# name: (input channels, output channels, map height = width, kernel, stride)
NAMED = {
    "vgg224": (64, 64, 224, 3, 1),
    "vgg112": (128, 128, 112, 3, 1),
    "vgg56": (256, 256, 56, 3, 1),
    "vgg28": (512, 512, 28, 3, 1),
    "vgg14": (512, 512, 14, 3, 1),
    "r56": (64, 64, 56, 3, 1),
    "r28": (128, 128, 28, 3, 1),
    "r14": (256, 256, 14, 3, 1),
    "r7": (512, 512, 7, 3, 1),
    "r14-expand": (256, 1024, 14, 1, 1),
    "r14-reduce": (1024, 256, 14, 1, 1),
    "r7-expand": (512, 2048, 7, 1, 1),
    "r7-reduce": (2048, 512, 7, 1, 1),
    "r56-expand": (64, 256, 56, 1, 1),
    "r56-reduce": (256, 64, 56, 1, 1),
}
DEFAULT = ["vgg56", "vgg28", "r56", "r28", "r14", "r7", "r14-expand", "r14-reduce"]


def parse_shape(text: str) -> tuple[str, tuple[int, int, int, int, int]]:
    if text in NAMED:
        return text, NAMED[text]
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) not in (4, 5):
        raise argparse.ArgumentTypeError(
            f"shape {text!r}: a name ({', '.join(NAMED)}) or CIN,COUT,HW,K[,STRIDE]")
    if len(vals) == 4:
        vals.append(1)
    cin, cout, hw, k, stride = vals
    if min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"shape {text!r}: all values must be positive")
    return text, (cin, cout, hw, k, stride)


def conv_model(cin: int, cout: int, hw: int, k: int, stride: int, seed: int):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    out_hw = (hw + 2 * (k // 2) - k) // stride + 1
    w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[k // 2] * 4,
                              strides=[stride, stride]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out_hw, out_hw])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime release since 1.10 reads
    onnx.checker.check_model(model)
    return model


def measure(name, shape, threads: int, runs: int, seed: int) -> dict:
    import coacto
    from coacto.benchmark import max_error, onnxruntime_session

    cin, cout, hw, k, stride = shape
    model = conv_model(cin, cout, hw, k, stride, seed)
    x = np.random.default_rng(seed + 1).standard_normal((1, cin, hw, hw)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        sess = onnxruntime_session(model.SerializeToString(), threads,
                                   profile_prefix=os.path.join(tmp, "ort"))
        tg = coacto.compile(model)
        conv_layer = next(i for i, layer in enumerate(tg.graph.layers) if layer.op == "CONV")
        ours = []
        with coacto.Runtime(tg, threads=threads) as rt:
            err, ref_max = max_error(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0])
            for _ in range(runs):
                ours.append(rt.profile({"x": x}, 1)[conv_layer]["seconds"])
                sess.run(None, {"x": x})
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    theirs = [e["dur"] * 1e-6 for e in events
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
              and e.get("args", {}).get("op_name") == "Conv"][1:]  # the first run checked outputs
    if not theirs:
        raise RuntimeError("onnxruntime's profile has no Conv node (did it fuse the layer away?)")
    out_hw = (hw + 2 * (k // 2) - k) // stride + 1
    flops = 2.0 * cout * cin * k * k * out_hw * out_hw
    return {"shape": name, "cin": cin, "cout": cout, "hw": hw, "k": k, "stride": stride,
            "coacto_ms": min(ours) * 1e3, "onnxruntime_ms": min(theirs) * 1e3,
            "coacto_gflops": flops / min(ours) / 1e9, "onnxruntime_gflops": flops / min(theirs) / 1e9,
            "ratio": min(ours) / min(theirs), "max_rel_error": err / max(ref_max, 1e-30)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Shapes are"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, metavar="SHAPE",
                        help=f"names or CIN,COUT,HW,K[,STRIDE] (default: {' '.join(DEFAULT)})")
    parser.add_argument("--list", action="store_true", help="print the named shapes and exit")
    parser.add_argument("--threads", type=int, default=1, help="threads of both runtimes (1)")
    parser.add_argument("--runs", type=int, default=15,
                        help="alternating timed runs per shape, minimum kept (default 15)")
    parser.add_argument("--seed", type=int, default=0, help="weights and input seed (0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.list:
        for name, (cin, cout, hw, k, s) in NAMED.items():
            print(f"{name:<12} {cin:5d} -> {cout:5d} channels, {hw}x{hw}, {k}x{k} stride {s}")
        return 0
    if args.threads <= 0 or args.runs <= 0:
        parser.error("--threads and --runs must be positive")
    try:
        import onnxruntime  # noqa: F401

        import coacto.runtime  # noqa: F401
    except ImportError as exc:
        print(f"{exc}: install onnxruntime and coacto (`pip install -e \".[test]\"`)",
              file=sys.stderr)
        return 3

    shapes = args.shapes or [parse_shape(n) for n in DEFAULT]
    rows = []
    if not args.json:
        print(f"one convolution + ReLU per model, {args.threads} thread(s), minimum of "
              f"{args.runs} alternating runs (each runtime's own layer profiler)")
        print(f"{'shape':<12} {'coacto ms':>9} {'GFLOP/s':>8} {'ort ms':>8} {'GFLOP/s':>8} "
              f"{'ratio':>6}")
    for idx, (name, shape) in enumerate(shapes):
        if args.json:
            print(f"[{idx + 1}/{len(shapes)}] {name}", file=sys.stderr, flush=True)
        row = measure(name, shape, args.threads, args.runs, args.seed)
        rows.append(row)
        if not args.json:
            print(f"{name:<12} {row['coacto_ms']:9.3f} {row['coacto_gflops']:8.1f} "
                  f"{row['onnxruntime_ms']:8.3f} {row['onnxruntime_gflops']:8.1f} "
                  f"{row['ratio']:6.2f}", flush=True)
    bad = [r["shape"] for r in rows if r["max_rel_error"] > 1e-4]
    if args.json:
        print(json.dumps({"threads": args.threads, "runs": args.runs, "results": rows}, indent=2))
    if bad:
        print(f"outputs differ from onnxruntime's by more than 1e-4 of their largest value: "
              f"{', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
