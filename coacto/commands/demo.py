"""`coacto demo`: a zoo model compiled, run and checked against onnxruntime, then every offloading
policy against a server on loopback."""
from __future__ import annotations

import argparse
import time

import numpy as np

from .. import benchmark, compiler
from ..cli_common import EXIT_MISMATCH, exit_codes_help, positive, rate_schedule
from .shared import progress


def cmd_demo(args) -> int:
    from .. import zoo
    from ..mobile.shaper import describe_schedule
    from ..native import kernel_summary
    from ..runtime import Runtime

    positive(args.repeat, "--repeat")
    positive(args.threads, "--threads")
    positive(args.tiles, "--tiles")
    positive(args.image_size, "--image-size")
    for bw in (b.strip() for b in args.bandwidths.split(",") if b.strip()):
        # each cap as read, in bits and bytes, before minutes of work
        progress(f"link cap {bw}: {describe_schedule(rate_schedule(bw, '--bandwidths'))}")
    name = args.model
    progress(f"building {name} from coacto's zoo (seeded random weights, no download) ...")
    t0 = time.perf_counter()
    model = zoo.build(name, **({"image_size": args.image_size} if args.image_size else {}))
    onnx_bytes = model.SerializeToString()
    progress(f"  {len(onnx_bytes) / 1e6:.1f} MB ONNX in {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    tg = compiler.compile(model, tiles_per_layer=args.tiles)
    compile_s = time.perf_counter() - t0
    s = tg.summary()
    print(f"tile graph: {s['layers']} layers, {s['tiles']} tiles, {s['dependencies']} "
          f"dependencies, {s['gflops']:.2f} GFLOP (compiled in {compile_s:.2f} s)")
    print(f"GEMM kernel: {kernel_summary()}")
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
    from .. import benchmark as bm
    from ..mobile.client import Client
    from ..server import Server

    policies = ["local", "cloud", "split", "fl", "dynamic"]
    bandwidths = [b.strip() for b in args.bandwidths.split(",") if b.strip()]
    print("\ncollaborative offloading: a coacto server on loopback (in this process), the device's "
          "link capped by its own shaper; device and server share this machine's cores, so this "
          "shows the policies working, not a slow device (see experiments/fig_bandwidth.py)")
    rows, worst = {}, 0.0
    with Server("tcp://127.0.0.1:0", threads=args.threads or 1).start() as server:
        for bw in bandwidths:
            for policy in policies:
                progress(f"  {policy} at {bw} ...")
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


def add_demo_parser(sub) -> None:
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
    d.epilog += "\n\n" + exit_codes_help("3 an output differs from onnxruntime's")
