"""How fast a running inference stops: Runtime.cancel, Ctrl-C (SIGINT) during Runtime.run, and
Client.cancel / Ctrl-C during Client.infer, local and offloaded to an in-process server.

Each trial starts a long inference, stops it after a random delay (10-50% of a run) and
measures from the call (cancel(), or the signal sent) until the caller has its exception
("raised"; for Runtime.run that includes waiting for the piece of work each computing thread is
in) and until the work is gone ("settled": a client's native inference destroyed, which it does
on another thread after raising, or the server's inference freed after its CANCEL); for `coacto
run` (mode cli) from SIGINT until the process has exited with code 130. After each
mode one more inference runs to completion and is compared with the first. The peer printed
beside the latencies is the longest tile of the model: what a cancel checked only between tiles
would have to wait for.

    python experiments/bench_cancel.py                       # 3x3 convs, one tile per layer
    python experiments/bench_cancel.py --model vgg16 --trials 30
    python experiments/bench_cancel.py --modes run,sigint --threads 2 --json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import coacto

MODES = ("run", "sigint", "client", "client-sigint", "cloud", "cloud-sigint", "cli")


def long_model(layers: int = 2, channels: int = 512, side: int = 128, seed: int = 0):
    """3x3 convolutions (3 -> channels, then ``layers`` of channels -> channels) with ReLU,
    averaged to one value per channel: seconds of work on one thread behind a small input and
    output (an offloaded run moves 200 kB). Cut with one tile per layer, each big layer's tile
    is tens of GFLOP."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x, cin = [], [], "input", 3
    for i in range(layers + 1):
        w = rng.standard_normal((channels, cin, 3, 3)) / np.sqrt(9 * cin)
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"conv{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]))
        x, cin = f"relu{i}", channels
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["output"]))
    graph = helper.make_graph(
        nodes, "conv_stack",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, channels, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def interrupt_main_thread() -> None:
    """Ctrl-C as the terminal sends it, to this process's main thread."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def stop_after(delay: float, action) -> dict:
    """Runs ``action`` on a timer thread after ``delay`` s; the returned dict gets its time."""
    box: dict = {}

    def fire():
        box["t"] = time.perf_counter()
        action()

    timer = threading.Timer(delay, fire)
    timer.start()
    box["timer"] = timer
    return box


def trial(call, action, delay: float, expect, settle=None) -> tuple[float, float]:
    """Seconds from the stop (timer) to ``call`` raising ``expect``, and to ``settle()``
    returning after that (the work is gone: the native inference destroyed, the server's
    inference freed); the same when there is no ``settle``."""
    box = stop_after(delay, action)
    try:
        call()
    except expect:
        t = time.perf_counter()
    else:
        box["timer"].cancel()
        raise RuntimeError(f"the inference finished before it was stopped ({delay:.2f} s)")
    if settle is not None:
        settle()
    settled = time.perf_counter()
    box["timer"].join()
    return t - box["t"], settled - box["t"]


def summary(samples: list[tuple[float, float]]) -> dict:
    out = {"n": len(samples)}
    for i, name in enumerate(("raised", "settled")):
        s = sorted(x[i] for x in samples)
        out[name] = {"median_ms": statistics.median(s) * 1e3,
                     "p90_ms": s[min(len(s) - 1, int(0.9 * len(s)))] * 1e3, "max_ms": s[-1] * 1e3}
    return out


def client_settled(client):
    """Returns once the client has destroyed its cancelled native inferences (they are closed
    on its reaper thread, which waits for the piece of work each computing thread is in)."""
    return lambda: client._engine._reaper.submit(lambda: None).result()


def server_settled(server):
    def wait():
        while server.stats()["inferences"]:
            time.sleep(0.0005)
    return wait


def computing(pid: int) -> bool:
    """Whether a thread of process ``pid`` other than its main one has used 20 ms of CPU: its
    computing threads are running inferences (they start before the weights are packed, and
    idle threads sleep after a millisecond)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            if int(tid) != pid:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[11]) + int(fields[12]) >= 2:  # utime + stime, in 10 ms ticks
                    return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def cli_trial(ctg: str, threads: int, delay: float) -> tuple[float, float]:
    """`coacto run` on a .ctg, SIGINT ``delay`` s after its computing threads began to run:
    seconds from the signal to its exit (both columns), which must be code 130."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "coacto.cli", "run", ctg, "--random",
                             "--threads", str(threads), "--repeat", "100000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        while not computing(proc.pid):
            if proc.poll() is not None:
                raise RuntimeError(f"coacto run ended: {proc.stderr.read().decode()}")
            time.sleep(0.005)
        time.sleep(delay)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        took = time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    if proc.returncode != 130 or "Traceback" in err:
        raise RuntimeError(f"coacto run exited {proc.returncode}: {err}")
    return took, took


def max_tile_seconds(rt, feeds) -> float:
    trace = rt.trace(feeds, runs=1)
    return max(e["dur_us"] for e in trace["events"]) * 1e-6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="convs",
                   help="convs (long_model, default) or a zoo model name (e.g. vgg16)")
    p.add_argument("--layers", type=int, default=2, help="convs: 512-channel layers (default 2)")
    p.add_argument("--tiles", type=int, default=None,
                   help="tiles per layer (default: 1 for convs, the partitioner's for zoo models)")
    p.add_argument("--threads", type=int, default=1, help="computing threads (default 1)")
    p.add_argument("--trials", type=int, default=20, help="stops per mode (default 20)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    rnd = random.Random(args.seed)

    if args.model == "convs":
        model = long_model(args.layers)
        tiles = 1 if args.tiles is None else args.tiles
    else:
        model = coacto.zoo.build(args.model)
        tiles = args.tiles
    data = model.SerializeToString()
    tg = coacto.compile(data, tiles_per_layer=tiles)
    feeds = coacto.zoo.input_feeds(model, seed=1)
    rt = coacto.Runtime(tg, threads=args.threads)
    rt.run(feeds)  # packs the weights, warms the buffers
    t0 = time.perf_counter()
    ref = rt.run(feeds)
    run_s = time.perf_counter() - t0
    longest = max_tile_seconds(rt, feeds)
    info = {"model": args.model, "tiles": tg.n_tiles, "threads": args.threads,
            "gflop": tg.total_flops / 1e9, "run_s": run_s, "longest_tile_ms": longest * 1e3}
    if not args.json:
        print(f"{args.model}: {tg.n_tiles} tiles, {tg.total_flops / 1e9:.0f} GFLOP, one run "
              f"{run_s:.2f} s on {args.threads} thread(s); longest tile {longest * 1e3:.1f} ms",
              file=sys.stderr)

    def delay() -> float:
        return run_s * rnd.uniform(0.1, 0.5)

    results, wrong = {}, []
    server = client = cloud = None
    try:
        for mode in modes:
            samples = []
            if mode == "cli":
                with tempfile.TemporaryDirectory() as tmp:
                    ctg = os.path.join(tmp, "model.ctg")
                    tg.save(ctg)
                    samples = [cli_trial(ctg, args.threads, delay()) for _ in range(args.trials)]
                check = ref
            elif mode in ("run", "sigint"):
                action = rt.cancel if mode == "run" else interrupt_main_thread
                expect = coacto.InferenceCancelled if mode == "run" else KeyboardInterrupt
                for _ in range(args.trials):
                    samples.append(trial(lambda: rt.run(feeds), action, delay(), expect))
                check = rt.run(feeds)
            else:
                if mode.startswith("cloud"):
                    if server is None:
                        server = coacto.Server("tcp://127.0.0.1:0", threads=args.threads).start()
                        cloud = coacto.Client(server.address, tg, threads=args.threads,
                                              policy="cloud", model_bytes=data, timeout=30)
                        cloud.connect()
                        cloud.infer(feeds)
                    c = cloud
                else:
                    if client is None:
                        client = coacto.Client(None, tg, threads=args.threads, policy="local")
                        client.infer(feeds)
                    c = client
                settle = server_settled(server) if mode.startswith("cloud") else \
                    client_settled(c)
                for _ in range(args.trials):
                    if mode.endswith("sigint"):
                        samples.append(trial(lambda: c.infer(feeds), interrupt_main_thread,
                                             delay(), KeyboardInterrupt, settle))
                    else:
                        box: dict = {}

                        def run_async(c=c, box=box):
                            box["future"] = c.infer_async(feeds)
                            box["future"].result()

                        samples.append(trial(run_async, lambda: c.cancel(box["future"]),
                                             delay(), coacto.InferenceCancelled, settle))
                check = c.infer(feeds)
            if not all(np.allclose(check[k], ref[k], rtol=1e-4, atol=1e-5) for k in ref):
                wrong.append(mode)
            results[mode] = summary(samples)
            if not args.json:
                r = results[mode]
                for name in ("raised", "settled"):
                    q = r[name]
                    print(f"{mode:14s} {name:8s} n={r['n']:3d}  median {q['median_ms']:7.2f} ms  "
                          f"p90 {q['p90_ms']:7.2f} ms  max {q['max_ms']:7.2f} ms  "
                          f"(max / longest tile {q['max_ms'] / (longest * 1e3):.3f})")
    finally:
        for c in (client, cloud):
            if c is not None:
                c.close()
        if server is not None:
            server.stop()
        rt.close()
    if args.json:
        print(json.dumps({**info, "modes": results, "wrong_after_stop": wrong}))
    elif wrong:
        print(f"WRONG outputs after a stop: {wrong}", file=sys.stderr)
    else:
        print("every run after a stop matched the first run", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
