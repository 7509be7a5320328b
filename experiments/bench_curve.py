"""What CurveZMQ's encryption costs: the same cloud inference through a server with keys and one
without, runs interleaved, on loopback (no bandwidth cap: the link is as fast as the CPU can
encrypt, the worst case for the cipher's share), and raw ZeroMQ throughput of 1 MiB messages
with and without CURVE.

    python experiments/bench_curve.py                 # zoo MobileNetV2 at 224, 15 runs each
    python experiments/bench_curve.py --model resnet50 --runs 9
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import coacto  # noqa: E402
from coacto import keys as K  # noqa: E402
from coacto import zoo  # noqa: E402
from coacto.mobile import Client  # noqa: E402
from coacto.server import Server  # noqa: E402


def raw_throughput(curve: bool, mib: int = 256) -> float:
    """MiB/s of 1 MiB messages DEALER -> ROUTER over loopback TCP."""
    ctx = zmq.Context()
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    if curve:
        spub, ssec = zmq.curve_keypair()
        cpub, csec = zmq.curve_keypair()
        r.curve_server, r.curve_secretkey, r.curve_publickey = True, ssec, spub
        d.curve_serverkey, d.curve_publickey, d.curve_secretkey = spub, cpub, csec
    port = r.bind_to_random_port("tcp://127.0.0.1")
    d.connect(f"tcp://127.0.0.1:{port}")
    msg = np.ones(1 << 20, np.uint8).tobytes()
    d.send(msg)
    r.recv_multipart()
    t0 = time.perf_counter()
    for _ in range(mib):
        d.send(msg, copy=False)
        r.recv_multipart(copy=False)
    rate = mib / (time.perf_counter() - t0)
    ctx.destroy(0)
    return rate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenetv2", help="a zoo model (default mobilenetv2)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--threads", type=int, default=1, help="server and device threads")
    args = p.parse_args(argv)

    proto = zoo.build(args.model, image_size=args.image_size)
    data = proto.SerializeToString()
    feeds = zoo.input_feeds(proto, seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-curve-"))
    (tmp / "allowed").mkdir()
    K.generate(tmp, "server")
    dev_pub, dev_sec = K.generate(tmp, "device")
    (tmp / "allowed" / "device.key").write_bytes(dev_pub.read_bytes())
    secure = Server("tcp://127.0.0.1:0", threads=args.threads, server_flops=1e10,
                    secret_key=tmp / "server.key_secret", allowed_keys=tmp / "allowed").start()
    plain = Server("tcp://127.0.0.1:0", threads=args.threads, server_flops=1e10).start()
    times = {"plain": [], "curve": []}
    try:
        clients = {
            "plain": Client(plain.address, data, threads=args.threads, policy="cloud"),
            "curve": Client(secure.address, data, threads=args.threads, policy="cloud",
                            server_key=tmp / "server.key", client_key=dev_sec)}
        for c in clients.values():
            c.connect(120)
            c.infer(feeds)  # warm-up: the server's first inference packs its buffers
        for i in range(args.runs):
            for name in (("plain", "curve") if i % 2 else ("curve", "plain")):
                time.sleep(0.05)
                clients[name].infer(feeds)
                st = clients[name].last_stats
                assert not st["fallback"], st
                times[name].append(st["latency_s"])
        sent = clients["plain"].last_stats.get("bytes_sent", 0)
        for c in clients.values():
            c.close()
    finally:
        secure.stop()
        plain.stop()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{args.model} {args.image_size}px cloud, {args.runs} interleaved runs, "
          f"{sent / 1e3:.0f} kB sent per inference, {args.threads} thread(s)")
    for k in times:
        print(f"  {k:6s} median {med[k]:7.2f} ms  (min {min(times[k]) * 1e3:.2f}, "
              f"max {max(times[k]) * 1e3:.2f})")
    print(f"  curve / plain: {med['curve'] / med['plain']:.3f}")
    plain_rate, curve_rate = raw_throughput(False), raw_throughput(True)
    print(f"raw ZeroMQ, 1 MiB messages on loopback: plain {plain_rate:.0f} MiB/s, CURVE "
          f"{curve_rate:.0f} MiB/s ({curve_rate / plain_rate:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
