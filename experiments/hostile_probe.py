"""What a hostile or broken device can do to a running coacto-server, tried on loopback: the
probes of docs/SECURITY.md "Limits", each against a fresh server process, with the server's
resident memory before, at its peak and after.

    python experiments/hostile_probe.py            # every probe, a table on stdout
    python experiments/hostile_probe.py --json     # one JSON object per probe
    python experiments/hostile_probe.py --only results-unread,flood

Each probe prints what the server answered and whether it kept serving: after every probe a
well-behaved device (hello, upload, one inference checked against the local runtime) must be
served. The server runs as `coacto-server` in its own process with its default limits (memory:
half the RAM) unless a probe says otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import zmq
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import coacto  # noqa: E402
from coacto import ir  # noqa: E402
from coacto import protocol as P  # noqa: E402


def conv_model(channels: int, size: int, seed: int = 0, dims=None) -> bytes:
    """1x1 Conv 3 -> channels + ReLU, as PyTorch exports it (small file, large activations)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((channels, 3, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], name="/conv/Conv",
                              kernel_size=[1, 1]),
             helper.make_node("Relu", ["c"], ["output"], name="/relu/Relu")]
    dims = dims or [1, 3, size, size]
    g = helper.make_graph(nodes, "torch_jit",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                             producer_name="pytorch").SerializeToString()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProc:
    def __init__(self, extra=(), models: Path | None = None):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        argv = [shutil.which("coacto-server") or "coacto-server", "--bind", self.address,
                "--threads", "1", "--server-flops", "1e10", "--stats-every", "1", *extra]
        if models is not None:
            argv += ["--models", str(models)]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="hostile-server-", suffix=".log")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "ready:" in self.text() or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.peak = self.rss()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stats(self) -> dict:
        """The server's last logged counters."""
        lines = [ln for ln in self.text().splitlines() if " stats {" in ln]
        return json.loads(lines[-1].split(" stats ", 1)[1]) if lines else {}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        try:
            return self.ps.memory_info().rss
        except psutil.Error:
            return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.rss())

    def close(self) -> None:
        self._stop.set()
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class Raw:
    """A device that speaks the protocol by hand."""

    def __init__(self, ctx, address, identity=None, rcvbuf=None):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        if rcvbuf is not None:
            self.sock.setsockopt(zmq.RCVBUF, rcvbuf)
            self.sock.setsockopt(zmq.RCVHWM, 2)
        self.sock.connect(address)

    def send(self, header, *frames):
        self.sock.send_multipart(P.pack(header, *frames))

    def recv(self, timeout=10.0):
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return P.unpack(self.sock.recv_multipart())[0]

    def rpc(self, header, *frames, timeout=10.0):
        self.send(header, *frames)
        return self.recv(timeout)

    def drain(self, timeout=0.5) -> list[dict]:
        out = []
        while self.sock.poll(int(timeout * 1000)):
            out.append(P.unpack(self.sock.recv_multipart())[0])
        return out

    def close(self):
        self.sock.close(0)


def query(tg) -> dict:
    return {"graph_id": tg.graph_id, "model_hash": tg.model_hash, "params": tg.params}


def upload(dev: Raw, tg, data: bytes, timeout=120.0) -> dict | None:
    h = dev.rpc({"t": P.MODEL_QUERY, **query(tg)})
    if h is not None and h["t"] == P.MODEL_MISSING:
        h = dev.rpc({"t": P.MODEL_UPLOAD, **query(tg)}, data, timeout=timeout)
    return h


def input_tiles(tg, feeds):
    ids, parts = [], []
    b, first = tg.plan.tile_bounds, tg.plan.layer_first_tile
    for name, li in tg.graph.inputs.items():
        x = ir.to_storage(feeds[name]).reshape(-1, tg.graph.layers[li].shape[1])
        for t in range(first[li], first[li + 1]):
            c0, c1, r0, r1 = b[t]
            ids.append(t)
            parts.append(np.ascontiguousarray(x[c0:c1, r0:r1]).ravel())
    return np.asarray(ids, "<i4").tobytes(), np.concatenate(parts).astype("<f4").tobytes()


def served(ctx, srv: ServerProc) -> bool:
    """A well-behaved device is served: one cloud inference, not a fallback, equal to local."""
    from coacto.mobile import Client

    data = conv_model(8, 16, seed=99)
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 16, 16), np.float32)}
    with Client(srv.address, data, threads=1, policy="cloud", tiles_per_layer=2,
                timeout=10) as c:
        ref = c._runtime.run(feeds)["output"]
        out = c.infer(feeds)["output"]
        return not c.last_stats["fallback"] and bool(
            np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max())


# ------------------------------------------------------------------------------ probes

def probe_default_bind(ctx, tmp):
    p = subprocess.run([shutil.which("coacto-server") or "coacto-server", "--help"],
                       capture_output=True, text=True, timeout=60)
    default = [w.strip("();,") for w in p.stdout.split() if w.startswith("tcp://127")]
    p = subprocess.run([shutil.which("coacto-server") or "coacto-server", "--bind", "tcp://*:0",
                        "--server-flops", "1e9", "--threads", "1"], capture_output=True,
                       text=True, timeout=60)
    return {"what": "default bind; tcp://*:0 without keys",
            "result": f"default {default[0] if default else '?'}; wildcard without keys exits "
                      f"{p.returncode}: "
                      f"{p.stderr.strip().splitlines()[-1].split(': ', 1)[-1][:110]}"}


def probe_results_unread(ctx, tmp):
    """A 196 KB model (1x1 conv 3 -> 16384 channels) and 4 inferences of a 49 KB input, the
    results never read."""
    srv = ServerProc()
    try:
        data = conv_model(16384, 64)
        tg = coacto.compile(data)
        d = Raw(ctx, srv.address, rcvbuf=64 << 10)
        before = srv.rss()
        h = upload(d, tg, data)
        time.sleep(0.5)
        loaded = srv.rss()
        feeds = {"input": np.ones((1, 3, 64, 64), np.float32)}
        tiles = input_tiles(tg, feeds)
        for i in range(4):
            d.send({"t": P.BEGIN, "inf": i, "graph_id": tg.graph_id})
            d.send({"t": P.TILES, "inf": i, "batch": 0}, *tiles)
        time.sleep(20)  # the device reads nothing meanwhile
        during = srv.rss()
        replies = d.drain(1.0)
        d.close()
        time.sleep(3)
        after = srv.rss()
        st = srv.stats()
        errs = sorted({(r.get("code"), r.get("limit")) for r in replies if r["t"] == P.ERROR})
        return {"what": f"{len(data) // 1000} KB model, 3->16384 channels, 4 x 49 KB inferences, "
                        f"results unread",
                "result": f"upload {h['t'] if h else None}; errors {errs}",
                "rss_before_mb": before / 1e6, "rss_loaded_mb": loaded / 1e6,
                "rss_peak_mb": srv.peak / 1e6,
                "rss_during_mb": during / 1e6, "rss_after_mb": after / 1e6,
                "stats": {k: st.get(k) for k in ("inferences", "devices", "unsent_bytes",
                                                 "inference_bytes", "results_dropped", "trims")},
                "served_after": served(ctx, srv), "alive": srv.alive()}
    finally:
        srv.close()


def probe_huge_input(ctx, tmp):
    srv = ServerProc()
    try:
        d = Raw(ctx, srv.address)
        out = []
        for dims in ([1, 3, 100000, 100000], [1, 3, 8000, 8000]):
            data = conv_model(4, 0, dims=dims)
            digest = hashlib.sha256(data).hexdigest()
            h = d.rpc({"t": P.MODEL_UPLOAD, "graph_id": "0" * 64, "model_hash": digest,
                       "params": {}}, data, timeout=120)
            out.append(f"{dims[2]}x{dims[3]}: {h['t'] if h else None} "
                       f"{h.get('code') if h else ''} {(h or {}).get('text', '')[:70]}")
        d.close()
        time.sleep(1.5)
        return {"what": "declared input 1e5 x 1e5 and 8000 x 8000", "result": "; ".join(out),
                "rss_peak_mb": srv.peak / 1e6, "rss_after_mb": srv.rss() / 1e6, "served_after": served(ctx, srv),
                "alive": srv.alive(), "traceback_in_log": "Traceback" in srv.text()}
    finally:
        srv.close()


def probe_garbage_uploads(ctx, tmp):
    srv = ServerProc()
    try:
        d = Raw(ctx, srv.address)
        codes = []
        for _ in range(3):
            junk = os.urandom(7 << 20)
            h = d.rpc({"t": P.MODEL_UPLOAD, "graph_id": "0" * 64,
                       "model_hash": hashlib.sha256(junk).hexdigest(), "params": {}}, junk)
            codes.append(h.get("code") if h else None)
        d.close()
        time.sleep(1.5)
        return {"what": "three 7 MiB garbage uploads with the right hash",
                "result": f"codes {codes}", "rss_after_mb": srv.rss() / 1e6,
                "rss_peak_mb": srv.peak / 1e6, "served_after": served(ctx, srv),
                "alive": srv.alive()}
    finally:
        srv.close()


def probe_flood(ctx, tmp):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # 1,100 sockets here
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    srv = ServerProc()
    try:
        fctx = zmq.Context()
        fctx.MAX_SOCKETS = 4096
        flood = [Raw(fctx, srv.address) for _ in range(1100)]
        for f in flood:
            f.send({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
        answered = sum(1 for f in flood if f.recv(5) is not None)
        ok = served(ctx, srv)
        for f in flood:
            f.close()
        fctx.term()
        return {"what": "1,100 identities x hello", "result": f"{answered} answered",
                "served_after": ok, "alive": srv.alive()}
    finally:
        srv.close()


def probe_takeover(ctx, tmp):
    srv = ServerProc()
    try:
        data = conv_model(8, 16, seed=3)
        tg = coacto.compile(data, tiles_per_layer=2)
        victim = Raw(ctx, srv.address, identity=b"\x00\x00\x00\x00\x01")
        victim.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
        upload(victim, tg, data)
        victim.send({"t": P.BEGIN, "inf": 1, "graph_id": tg.graph_id})
        time.sleep(0.2)
        thief = Raw(ctx, srv.address, identity=b"\x00\x00\x00\x00\x01")
        thief.send({"t": P.CANCEL, "inf": 1})
        thief_got = thief.recv(1.0)
        feeds = {"input": np.ones((1, 3, 16, 16), np.float32)}
        victim.send({"t": P.TILES, "inf": 1, "batch": 0}, *input_tiles(tg, feeds))
        kinds = [h["t"] for h in victim.drain(1.0)]
        victim.close()
        thief.close()
        return {"what": "a peer sets another device's routing id and cancels its inference",
                "result": f"thief answered: {thief_got is not None}; victim got "
                          f"{'DONE' if P.DONE in kinds else 'no DONE'}",
                "served_after": served(ctx, srv), "alive": srv.alive()}
    finally:
        srv.close()


def probe_bad_files(ctx, tmp):
    models = Path(tmp) / "models"
    models.mkdir()
    good = conv_model(8, 16, seed=4)
    (models / "good.onnx").write_bytes(good)
    tg = coacto.compile(good, tiles_per_layer=2)
    tg.save(Path(tmp) / "good.ctg")
    blob = (Path(tmp) / "good.ctg").read_bytes()
    (models / "truncated.ctg").write_bytes(blob[: len(blob) // 2])
    (models / "garbage.onnx").write_bytes(os.urandom(4096))
    (models / "huge-dims.onnx").write_bytes(conv_model(4, 0, dims=[1, 3, 10**9, 10**9]))
    srv = ServerProc(models=models)
    try:
        lines = [ln for ln in srv.text().splitlines() if "skipping" in ln]
        return {"what": "--models with a truncated .ctg, garbage and 1e9-dim ONNX beside a good "
                        "one", "result": f"{len(lines)} skipped, good one served; "
                                         f"alive {srv.alive()}",
                "served_after": served(ctx, srv), "alive": srv.alive()}
    finally:
        srv.close()


PROBES = {"default-bind": probe_default_bind, "results-unread": probe_results_unread,
          "huge-input": probe_huge_input, "garbage-uploads": probe_garbage_uploads,
          "flood": probe_flood, "takeover": probe_takeover, "bad-files": probe_bad_files}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help=f"comma-separated probes of: {', '.join(PROBES)}")
    p.add_argument("--json", action="store_true", help="one JSON object per probe")
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else list(PROBES)
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        p.error(f"unknown probe(s) {unknown}; choose from {', '.join(PROBES)}")
    ctx = zmq.Context()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.monotonic()
            row = {"probe": name, **PROBES[name](ctx, tmp), "seconds": time.monotonic() - t0}
            bad += row.get("served_after") is False or row.get("alive") is False
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                mem = " ".join(f"{k[4:]} {v:.0f} MB" for k, v in row.items()
                               if k.startswith("rss_"))
                print(f"{name:16s} {row['what']}\n{'':16s} -> {row['result']}"
                      f"{'; ' + mem if mem else ''}; served after: {row.get('served_after')}",
                      flush=True)
    ctx.destroy(linger=0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
