"""``coacto profile --engine``: what the communication engines cost in CPU on this machine.

The simulator charges the device's communication engine (coacto.mobile.engine: planning, taking
tiles out of the runtime, msgpack, ZeroMQ, the kernel's TCP) and the server's I/O thread
(coacto.server: receiving TILES, put_tiles, ACKs, RESULTs) to the CPU they run on: on a device
in a CPU quota every millisecond the engine spends is a millisecond its computing thread waits
(docs/SIMULATOR.md). This module measures those costs with the real code:

* a real ``coacto.server.Server`` in a child process (one computing thread, pinned to the last
  usable CPU when there are two or more), and a real ``coacto.Client`` in this process (one
  computing thread, pinned to the first CPU), over loopback, run every policy of a zoo model
  with the client's own token bucket at a few bandwidths (batches of different sizes);
* on each side the engine's handlers are wrapped to read the thread's CPU clock
  (``time.thread_time_ns``) around each call: the device's inference start (``Engine._admit``:
  planning, the native inference, its inputs), every message handed to the link (``Link.pump``),
  every message taken in (``Engine._handle``, by kind), the runtime's reports (a tile queued for
  sending, an inference done: ``Engine._on_reports``); the server's messages taken in
  (``Server._dispatch``, by kind: BEGIN, TILES with their ACK, HEARTBEAT with its STATS, CANCEL)
  and its reports (RESULTs and DONE sent: ``Server._drain_reports``);
* what the engine thread spent outside those handlers (polling, timers) is spread over the
  handled events, and what the processes' other threads spent (ZeroMQ's I/O thread: the
  kernel's TCP send and receive; the client's reaper) is fitted per message and per byte;
* per-message costs are medians over calls; per-byte costs are least-squares slopes over calls of
  different sizes (never negative).

Everything is CPU time at this machine's full speed; the simulator's CPU model maps it to wall
time (a quota, its CFS period, the computing threads it competes with). Nothing here looks at
latencies.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ..errors import CoactoError

log = logging.getLogger(__name__)

#: Policies every measurement runs (each makes messages of other kinds and sizes).
POLICIES = ("local", "cloud", "split", "fl", "dynamic")
#: Client token-bucket caps, Mbit/s: batches of 16 kB (the minimum) to 256 kB (the maximum);
#: 0: unshaped (the loop as a kernel-shaped link leaves it, see loop_per_event).
CAPS_MBPS = (0.0, 20.0, 100.0, 400.0)
#: Message kinds the simulator charges separately on each side.
DEVICE_RECV_KINDS = ("ack", "result", "stats", "done")      # coacto.protocol's names
SERVER_RECV_KINDS = ("begin", "tiles", "heartbeat", "cancel")


def thread_cpu_ns(pid: int, tid: int) -> int:
    """CPU nanoseconds thread ``tid`` of process ``pid`` has run (schedstat)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def thread_ids(pid: int | None = None) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid or os.getpid()}/task")}
    except OSError:
        return set()


def _kind(frames) -> str:
    from .. import protocol as P

    try:
        return P.unpack(frames[:1])[0]["t"]
    except Exception:
        return "?"


def _nbytes(frames) -> int:
    return int(sum(len(f) if not hasattr(f, "nbytes") else f.nbytes for f in frames))


class Recorder:
    """Per-call CPU of wrapped methods, on the thread that calls them."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.polls = 0
        self._patched: list[tuple] = []
        self.sent: list[tuple[str, int]] | None = None

    def patch(self, owner, name: str, make) -> None:
        orig = getattr(owner, name)
        self._patched.append((owner, name, orig))
        setattr(owner, name, make(orig))

    def restore(self) -> None:
        for owner, name, orig in reversed(self._patched):
            setattr(owner, name, orig)
        self._patched.clear()


# ---------------------------------------------------------------------------- server side

def _serve(models: str, threads: int, cpu: int | None) -> int:
    """The child process: a Server with its handlers timed; commands on stdin (``dump``,
    ``quit``), one JSON line each on stdout."""
    import zmq

    from .. import protocol as P
    from ..native import NativeRuntime
    from ..server.server import Server

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    rec = Recorder()
    compute: set[int] = set()

    def make_rt(orig):
        def init(self, *a, **kw):
            before = thread_ids()
            orig(self, *a, **kw)
            compute.update(thread_ids() - before)
        return init

    def make_dispatch(orig):
        def dispatch(self, frames):
            kind = _kind(frames[1:])
            nbytes = _nbytes(frames[1:])
            c0 = time.thread_time_ns()
            orig(self, frames)
            rec.rows.append(("recv", kind, nbytes, time.thread_time_ns() - c0))
        return dispatch

    def make_reports(orig):
        def drain(self):
            rec.sent = []
            c0 = time.thread_time_ns()
            orig(self)
            c = time.thread_time_ns() - c0
            rec.rows.append(("reports", [k for k, _ in rec.sent], sum(n for _, n in rec.sent), c))
            rec.sent = None
        return drain

    def make_send(orig):
        def send(self, identity, header, *frames, **kw):
            if rec.sent is not None:
                rec.sent.append((header.get("t", "?"),
                                 len(P.pack(header)[0]) + _nbytes(frames)))
            return orig(self, identity, header, *frames, **kw)
        return send

    def make_poll(orig):
        def poll(self, *a, **kw):
            rec.polls += 1
            return orig(self, *a, **kw)
        return poll

    rec.patch(NativeRuntime, "__init__", make_rt)
    rec.patch(Server, "_dispatch", make_dispatch)
    rec.patch(Server, "_drain_reports", make_reports)
    rec.patch(Server, "_send", make_send)
    rec.patch(zmq.Poller, "poll", make_poll)
    pid = os.getpid()
    main_tid = threading.get_native_id()
    with Server("tcp://127.0.0.1:0", threads=threads, models=models) as srv:
        io_tid = srv._thread.native_id

        def totals():
            others = thread_ids() - compute - {io_tid, main_tid}
            return (thread_cpu_ns(pid, io_tid), sum(thread_cpu_ns(pid, t) for t in others),
                    sum(thread_cpu_ns(pid, t) for t in compute))

        last = totals()
        print(json.dumps({"address": srv.address}), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "dump":  # what was spent since the last dump
                now_ = totals()
                io, other, comp = (a - b for a, b in zip(now_, last))
                last = now_
                print(json.dumps({"rows": rec.rows, "polls": rec.polls, "io_cpu_ns": io,
                                  "other_cpu_ns": other, "compute_cpu_ns": comp}), flush=True)
                rec.rows, rec.polls = [], 0
            elif cmd == "quit":
                break
    return 0


class ServerProcess:
    """The measuring server as a child process."""

    def __init__(self, models_dir: Path, threads: int = 1, cpu: int | None = None):
        argv = [sys.executable, "-m", "coacto.sim.enginecost", "--serve", str(models_dir),
                "--threads", str(threads)]
        if cpu is not None:
            argv += ["--cpu", str(cpu)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise CoactoError(f"the measuring server did not start (exit {self.proc.poll()})")
        self.address = json.loads(line)["address"]
        self.pid = self.proc.pid

    def dump(self) -> dict:
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------- device side

class DeviceRecorder(Recorder):
    """Wraps the client's engine (coacto.mobile.engine.Engine, link.Link) in this process."""

    def __init__(self):
        super().__init__()
        from ..mobile import engine as E
        from ..mobile import link as L
        import zmq

        rec = self
        self.engine_tid: int | None = None

        def make_admit(orig):
            def admit(self, job):
                c0 = time.thread_time_ns()
                orig(self, job)
                rec.rows.append(("start", job.policy, 0, time.thread_time_ns() - c0))
            return admit

        def make_handle(orig):
            def handle(self, frames):
                kind, nbytes = _kind(frames), _nbytes(frames)
                c0 = time.thread_time_ns()
                orig(self, frames)
                rec.rows.append(("recv", kind, nbytes, time.thread_time_ns() - c0))
            return handle

        def make_reports(orig):
            def reports(self):
                before = {j.id: j.policy for j in self._jobs.values()}
                c0 = time.thread_time_ns()
                orig(self)
                c = time.thread_time_ns() - c0
                done = [p for i, p in before.items() if i not in self._jobs]
                rec.rows.append(("reports", len(done), done[0] if done else "", c))
            return reports

        def make_pump(orig):
            def pump(self, t, next_batch, on_sent):
                sent = []

                def counted(kind, frames, nbytes, job, t_booked):
                    ok = on_sent(kind, frames, nbytes, job, t_booked)
                    if ok:
                        sent.append((kind, nbytes))
                    return ok

                c0 = time.thread_time_ns()
                orig(self, t, next_batch, counted)
                c = time.thread_time_ns() - c0
                if sent:
                    rec.rows.append(("send", [k for k, _ in sent], sum(n for _, n in sent), c))
                else:
                    rec.rows.append(("pump", [], 0, c))
            return pump

        def make_poll(orig):
            def poll(self, *a, **kw):
                if threading.get_native_id() == rec.engine_tid:
                    rec.polls += 1
                return orig(self, *a, **kw)
            return poll

        self.patch(E.Engine, "_admit", make_admit)
        self.patch(E.Engine, "_handle", make_handle)
        self.patch(E.Engine, "_on_reports", make_reports)
        self.patch(L.Link, "pump", make_pump)
        self.patch(zmq.Poller, "poll", make_poll)


# ---------------------------------------------------------------------------- fitting

def _median(xs) -> float:
    return float(np.median(xs)) if len(xs) else 0.0


def fit_per_byte(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(per message, per byte) from (messages, bytes, seconds) rows by least squares, neither
    negative (a negative slope is refitted as zero)."""
    if not rows:
        return 0.0, 0.0
    a = np.array([[m, b] for m, b, _ in rows], dtype=np.float64)
    y = np.array([s for *_, s in rows], dtype=np.float64)
    if len({b for _, b, _ in rows}) < 2:
        return float(y.sum() / a[:, 0].sum()), 0.0
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if coef[1] < 0:
        return float(y.sum() / a[:, 0].sum()), 0.0
    if coef[0] < 0:
        return 0.0, float(y.sum() / a[:, 1].sum())
    return float(coef[0]), float(coef[1])


def loop_per_event(runs: list[tuple[int, float, float, bool]]) -> tuple[float, str]:
    """A thread's CPU outside its handlers per handled event, from runs of (events, thread CPU
    seconds, handlers' CPU seconds, shaped by the client's token bucket): from the unshaped runs
    when there are any (the client's shaper adds loop rounds of its own that a kernel-shaped
    link does not)."""
    use = [r for r in runs if not r[3]] or runs
    events = sum(r[0] for r in use)
    outside = sum(max(0.0, r[1] - r[2]) for r in use)
    how = "unshaped runs" if any(not r[3] for r in runs) else "all runs"
    return (outside / events if events else 0.0), how


def fit_device(rows: list[tuple], loop_runs: list, other_runs: list) -> dict:
    """The device's costs from its recorded calls (see the module text)."""
    start = {}
    for policy in POLICIES:
        xs = [c for kind, p, _, c in rows if kind == "start" and p == policy]
        if xs:
            start[policy] = _median(xs) * 1e-9
    send = [(len(k), n, c * 1e-9) for kind, k, n, c in rows if kind == "send"]
    send_msg, send_byte = fit_per_byte(send)
    recv = {}
    for k in DEVICE_RECV_KINDS:
        xs = [(1, n, c * 1e-9) for kind, kk, n, c in rows if kind == "recv" and kk == k]
        if xs:
            recv[k] = xs
    recv_msg = {k: _median([s for *_, s in xs]) for k, xs in recv.items()}
    _, recv_byte = fit_per_byte(recv.get("result", []))
    if "result" in recv and recv_byte > 0:
        recv_msg["result"] = fit_per_byte(recv["result"])[0]
    finish = {}
    for policy in POLICIES:
        xs = [c for kind, n, p, c in rows if kind == "reports" and n > 0 and p == policy]
        if xs:
            finish[policy] = _median(xs) * 1e-9
    wake = _median([c for kind, n, _, c in rows if kind == "reports" and n == 0]) * 1e-9
    loop_s, loop_how = loop_per_event(loop_runs)
    io_msg, io_byte = fit_per_byte(other_runs)
    return {
        "start_s": start, "send_msg_s": send_msg + io_msg, "send_byte_s": send_byte + io_byte,
        "recv_msg_s": {k: v + io_msg for k, v in recv_msg.items()},
        "recv_byte_s": recv_byte + io_byte, "finish_s": finish, "wake_s": wake,
        "loop_s": loop_s,
        "samples": {"calls": sum(1 for r in rows if r[0] != "pump"), "send": len(send),
                    "recv": {k: len(v) for k, v in recv.items()}, "runs": len(loop_runs)},
        "split": {"engine_send_msg_s": send_msg, "engine_send_byte_s": send_byte,
                  "io_thread_msg_s": io_msg, "io_thread_byte_s": io_byte,
                  "loop_s_from": loop_how},
    }


def fit_server(rows: list, loop_runs: list, other_runs: list) -> dict:
    recv = {}
    for k in SERVER_RECV_KINDS:
        xs = [(1, n, c * 1e-9) for kind, kk, n, c in rows if kind == "recv" and kk == k]
        if xs:
            recv[k] = xs
    recv_msg = {k: _median([s for *_, s in xs]) for k, xs in recv.items()}
    tiles_msg, recv_byte = fit_per_byte(recv.get("tiles", []))
    if recv_byte > 0:
        recv_msg["tiles"] = tiles_msg
    results = [(ks.count("result"), n, c * 1e-9) for kind, ks, n, c in rows
               if kind == "reports" and ks and set(ks) == {"result"}]
    result_msg, send_byte = fit_per_byte(results)
    done = [c * 1e-9 - result_msg * ks.count("result") - send_byte * n
            for kind, ks, n, c in rows if kind == "reports" and "done" in ks]
    loop_s, loop_how = loop_per_event(loop_runs)
    io_msg, io_byte = fit_per_byte(other_runs)
    return {
        "recv_msg_s": {k: v + io_msg for k, v in recv_msg.items()},
        "recv_byte_s": recv_byte + io_byte,
        "send_msg_s": {"result": result_msg + io_msg, "done": max(0.0, _median(done)) + io_msg},
        "send_byte_s": send_byte + io_byte, "loop_s": loop_s,
        "samples": {"calls": len(rows), "results": len(results),
                    "recv": {k: len(v) for k, v in recv.items()}, "runs": len(loop_runs)},
        "split": {"zmq_thread_msg_s": io_msg, "zmq_thread_byte_s": io_byte,
                  "loop_s_from": loop_how},
    }


# ---------------------------------------------------------------------------- the measurement

def measure_engine(model: str = "resnet50", inferences: int = 4, caps=CAPS_MBPS,
                   policies=POLICIES, progress=lambda msg: None) -> dict:
    """The engine-cost section of a profile (see the module text)."""
    from .. import zoo
    from ..mobile.client import Client

    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2
    client_cpu, server_cpu = (cpus[0], cpus[-1]) if pinned else (None, None)
    onnx_model = zoo.build(model)
    feeds = zoo.input_feeds(onnx_model)
    keep_affinity = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="coacto-enginecost-") as tmp:
        (Path(tmp) / f"{model}.onnx").write_bytes(onnx_model.SerializeToString())
        progress(f"engine costs: a measuring server for {model} ...")
        server = ServerProcess(Path(tmp), threads=1, cpu=server_cpu)
        dev = DeviceRecorder()
        dev_rows, srv_rows, dev_other, srv_other = [], [], [], []
        dev_loop, srv_loop = [], []
        try:
            if pinned:
                os.sched_setaffinity(0, {client_cpu})
            pid = os.getpid()
            for cap in caps:
                before = thread_ids()
                client = Client(server.address, onnx_model, threads=1, policy="local",
                                bandwidth=f"{cap:g}mbit" if cap else None)
                try:
                    client.connect(timeout=120)
                    dev.engine_tid = client._engine._thread.native_id
                    client.calibrate()
                    client.infer(feeds, policy="dynamic")  # warm-up: the estimates settle
                    server.dump()
                    dev.rows, dev.polls = [], 0
                    for policy in policies:
                        progress(f"engine costs: {model} {policy} at "
                                 f"{f'{cap:g} Mbit/s' if cap else 'full speed'} ...")
                        others = thread_ids() - before - set(client.compute_threads) \
                            - {dev.engine_tid}
                        e0 = thread_cpu_ns(pid, dev.engine_tid)
                        o0 = {t: thread_cpu_ns(pid, t) for t in others}
                        for _ in range(inferences):
                            client.infer(feeds, policy=policy)
                            st = client.last_stats
                            if policy == "cloud" and (st.get("fallback")
                                                      or st.get("finished_by") != "server"):
                                # costs measured on a failing exchange would be wrong, not
                                # merely noisy
                                raise CoactoError(
                                    f"the measuring server did not answer a cloud inference "
                                    f"({st.get('fallback_reason') or st.get('finished_by')}); "
                                    f"see its error above")
                        time.sleep(0.05)  # the reaper's close and the last ACKs
                        others = thread_ids() - before - set(client.compute_threads) \
                            - {dev.engine_tid}
                        other_cpu = sum(thread_cpu_ns(pid, t) - o0.get(t, 0) for t in others)
                        events = [r for r in dev.rows if r[0] != "pump"]
                        dev_loop.append((len(events),
                                         (thread_cpu_ns(pid, dev.engine_tid) - e0) * 1e-9,
                                         sum(r[-1] for r in events) * 1e-9, bool(cap)))
                        dev_rows += dev.rows
                        msgs = sum(len(r[1]) for r in dev.rows if r[0] == "send") + \
                            sum(1 for r in dev.rows if r[0] == "recv")
                        nbytes = sum(r[2] for r in dev.rows if r[0] in ("send", "recv"))
                        if msgs:
                            dev_other.append((msgs, nbytes, other_cpu * 1e-9))
                        dev.rows, dev.polls = [], 0
                        d = server.dump()
                        rows = [tuple(r) for r in d["rows"]]
                        srv_rows += rows
                        srv_loop.append((len(rows), d["io_cpu_ns"] * 1e-9,
                                         sum(r[-1] for r in rows) * 1e-9, bool(cap)))
                        smsgs = sum(1 for r in rows if r[0] == "recv") + \
                            sum(len(r[1]) for r in rows if r[0] == "reports")
                        sbytes = sum(r[2] for r in rows)
                        if smsgs:
                            srv_other.append((smsgs, sbytes, d["other_cpu_ns"] * 1e-9))
                finally:
                    client.close()
        finally:
            dev.restore()
            if pinned:
                os.sched_setaffinity(0, keep_affinity)
            server.close()
    device = fit_device(dev_rows, dev_loop, dev_other)
    srv = fit_server(srv_rows, srv_loop, srv_other)
    return {
        "device": device, "server": srv,
        "how": (f"measured on this machine by `coacto profile --engine` "
                f"({time.strftime('%Y-%m-%d')}): a coacto.Client (1 computing thread"
                f"{', CPU %d' % client_cpu if pinned else ''}) and a coacto.Server in a child "
                f"process (1 computing thread{', CPU %d' % server_cpu if pinned else ''}) on "
                f"loopback, {model}, policies {', '.join(policies)}, {inferences} inferences "
                f"each unshaped and at the client's token bucket of "
                f"{', '.join(f'{c:g}' for c in caps if c)} Mbit/s; per-call thread CPU time (time.thread_time_ns) of the engines' "
                f"handlers, medians per message kind, least-squares per-byte slopes; the "
                f"engine's time outside its handlers spread over the handled calls (unshaped runs); "
                f"the other "
                f"threads' CPU (ZeroMQ I/O, reaper; /proc schedstat) fitted per message and "
                f"byte. CPU seconds at full speed: the simulator applies quotas."),
        "model": model, "inferences": inferences, "caps_mbps": list(caps),
        "measured": time.strftime("%Y-%m-%d"),
    }


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m coacto.sim.enginecost",
                                 description="the measuring server of `coacto profile --engine` "
                                             "(--serve), or the measurement itself")
    ap.add_argument("--serve", metavar="MODELS_DIR", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=None)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--inferences", type=int, default=3)
    ap.add_argument("--caps", default=",".join(f"{c:g}" for c in CAPS_MBPS),
                    help="client token-bucket caps in Mbit/s (0: unshaped)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.serve:
        return _serve(args.serve, args.threads, args.cpu)
    out = measure_engine(args.model, args.inferences, [float(c) for c in args.caps.split(",")],
                         progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
