"""Soak: several devices run thousands of inferences against one authenticated `coacto-server`,
each with a random policy, on a link whose rate changes under them, while the server is
restarted half-way. Passes when no answer is wrong, no request is lost, the server's RSS grows
less than 5% from the end of each incarnation's warm-up to its end, and its open file
descriptors do not grow.

    python experiments/soak.py                          # 4 devices x 2000 inferences
    python experiments/soak.py --quick                  # 4 x 50: a smoke run (about a minute)
    python experiments/soak.py --devices 2 --inferences 10 --out /tmp/s --json

What runs:
- `coacto-server --threads 1` on tcp://127.0.0.1:PORT with CurveZMQ keys (`coacto keygen`: one
  pair for the server, one per device, the devices' public keys in an allowed-keys folder). It
  gets no models: each device uploads its own, and again after the restart.
- One process per device (a real device is its own process, with its own ZeroMQ identity,
  engine thread and runtime; threads in one interpreter would share the GIL and measure the
  harness as much as the server), each a `coacto.Client` with one computing thread on a
  distinct small model (`DEVICE_MODELS`). Each inference: a random policy (local, cloud, split,
  fl, dynamic), a random input from a seeded RNG, and now and then a new link rate
  (`Client.set_bandwidth`: 5, 20, 100 Mbit/s or unlimited), set before the inference or while it
  is in flight. Every output is checked against onnxruntime on the same input (max |error| over
  max |reference| <= 1e-4 per output): a *wrong* answer otherwise; a *lost* request is one that
  raised, timed out or missed an output. A fallback (the device finished alone because the
  server was away) is neither: that is the design, and it is counted apart.
- After half of all inferences the server gets SIGTERM and, once it has exited, starts again on
  the same port with the same keys; the devices are not told and carry on.
- The server's RSS and open file descriptors are sampled every `--sample-every` s (psutil). Per
  incarnation, the warm-up ends once `--warmup` of all inferences have finished after it was
  ready; its RSS there and at its end are the medians of the samples over the next (last) 2% of
  all inferences, so a single burst of activations does not decide.

Writes soak.csv (one row per inference), soak.samples.csv (the server's samples) and soak.json
(the summary, the settings, the machine) under --out. Exit status: 0 when every criterion holds,
1 when one fails (the summary says which), 2 when the soak could not run.
"""
from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as H  # noqa: E402

POLICIES = ("local", "cloud", "split", "fl", "dynamic")
#: Mbit/s; None: no cap
BANDWIDTHS = (5, 20, 100, None)
#: (zoo model, image size or None for its own): distinct models, each a few ms on one core, so
#: the soak's time goes into the offloading paths rather than into computing
DEVICE_MODELS = (("mobilenetv2", 64), ("squeezenet", 64), ("shufflenet_unit", None),
                 ("densenet_block", None), ("mobilenetv3_block", None), ("inception_block", None),
                 ("resnet18", 32))
REL_BOUND = 1e-4
RSS_GROWTH_LIMIT = 0.05
#: the share of all inferences over which the RSS at warm-up end and at the end is a median
RSS_WINDOW = 0.02
#: an incarnation with fewer samples after its warm-up is too short to judge its RSS and fds
MIN_JUDGED_SAMPLES = 20
#: chances, per inference, of a new link rate before it starts and while it is in flight
P_RATE_BEFORE, P_RATE_DURING = 0.10, 0.05
#: a device process records its own RSS and fds every this many inferences
USAGE_EVERY = 50


# ----------------------------------------------------------------------------- device process

def rel_error(got: dict, ref: dict) -> float:
    import numpy as np

    worst = 0.0
    for name, r in ref.items():
        g = np.asarray(got[name], dtype=np.float64)
        scale = max(float(np.abs(r).max()), 1e-12)
        worst = max(worst, float(np.abs(g - r).max()) / scale)
    return worst


def own_usage() -> dict:
    import psutil

    p = psutil.Process()
    return {"rss_mb": p.memory_info().rss / 2**20, "fds": p.num_fds(), "threads": p.num_threads()}


def device_main(d: int, spec: dict, results, start) -> None:
    """One device: a Client on its model, ``spec["n"]`` inferences, a row each on ``results``."""
    import logging

    logging.basicConfig(filename=spec["log"], level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import numpy as np
        import onnxruntime as ort

        import coacto
        from coacto.mobile.shaper import UNCAPPED

        rng = np.random.default_rng([spec["seed"], d])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        oracle = ort.InferenceSession(spec["model"], opts, providers=["CPUExecutionProvider"])
        inputs = [(i.name, i.shape) for i in oracle.get_inputs()]
        out_names = [o.name for o in oracle.get_outputs()]

        def rate_arg(mbps):
            return f"{mbps}mbit" if mbps else 8 * UNCAPPED

        device_flops = None
        if spec["slowdown"] != 1:
            with coacto.Client(None, spec["model"], threads=1, policy="local") as probe:
                device_flops = probe.calibrate() / spec["slowdown"]
        mbps = BANDWIDTHS[rng.integers(len(BANDWIDTHS))]
        client = coacto.Client(spec["server"], spec["model"], threads=1, policy="dynamic",
                               device_flops=device_flops,
                               bandwidth=rate_arg(mbps) if mbps else None,
                               timeout=spec["timeout"], server_key=spec["server_key"],
                               client_key=spec["client_key"], name=f"soak-device{d}")
        client.connect(timeout=120)  # handshake and upload before the clock starts
        results.put(("ready", d, None))
        start.wait()
        usage_warm = None
        for i in range(spec["n"]):
            if spec["think_ms"] > 0:
                time.sleep(float(rng.exponential(spec["think_ms"] / 1e3)))
            policy = POLICIES[rng.integers(len(POLICIES))]
            feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs}
            change = ""
            if rng.random() < P_RATE_BEFORE:
                mbps = BANDWIDTHS[rng.integers(len(BANDWIDTHS))]
                client.set_bandwidth(rate_arg(mbps))
                change = "before"
            during = rng.random() < P_RATE_DURING
            new_mbps = BANDWIDTHS[rng.integers(len(BANDWIDTHS))] if during else mbps
            delay = float(rng.uniform(0, 0.03)) if during else 0.0
            row = {"device": d, "model": spec["name"], "i": i, "policy": policy,
                   "bandwidth_mbps": mbps or "unlimited", "rate_change": change,
                   "latency_ms": "", "fallback": "", "finished_by": "", "reconnects": "",
                   "rel_error": "", "ok": False, "lost": False, "error": ""}
            t0 = time.monotonic()
            try:
                fut = client.infer_async(feeds, policy)
                if during:
                    time.sleep(delay)
                    client.set_bandwidth(rate_arg(new_mbps))
                    row["rate_change"] = (change + "+during").lstrip("+")
                    mbps = new_mbps
                out = fut.result(timeout=spec["lost_after"])
                row["t"] = time.time()  # which server answered: by when it finished
                stats = getattr(fut, "stats", None) or {}
                row["latency_ms"] = 1e3 * stats.get("latency_s", time.monotonic() - t0)
                row["fallback"] = bool(stats.get("fallback"))
                row["fallback_reason"] = stats.get("fallback_reason") or ""
                row["finished_by"] = stats.get("finished_by", "")
                row["reconnects"] = stats.get("reconnects", "")
                missing = [n for n in out_names if n not in out]
                if missing:
                    row["lost"], row["error"] = True, f"missing outputs {missing}"
                else:
                    ref = dict(zip(out_names, oracle.run(out_names, feeds)))
                    err = rel_error(out, ref)
                    row["rel_error"] = err
                    row["ok"] = err <= REL_BOUND
            except Exception as e:  # a lost request: counted, reported, and the soak goes on
                row["lost"], row["error"] = True, f"{type(e).__name__}: {e}"[:300]
                row["latency_ms"] = 1e3 * (time.monotonic() - t0)
            row.setdefault("t", time.time())
            if i % USAGE_EVERY == 0 or i + 1 == spec["n"]:
                usage = own_usage()
                row["device_rss_mb"], row["device_fds"] = usage["rss_mb"], usage["fds"]
            results.put(("row", d, row))
            if i + 1 == max(1, int(spec["n"] * spec["warmup"])):
                usage_warm = own_usage()
        info = {"usage_warm": usage_warm, "usage_end": own_usage(),
                "server_info": {k: client.server_info.get(k) for k in ("connects", "reconnects",
                                                                      "uploads", "last_error")}}
        client.close()
        results.put(("done", d, info))
    except BaseException:
        results.put(("error", d, traceback.format_exc()))


# ----------------------------------------------------------------------------- server process

class ServerProcess:
    """`coacto-server` with keys on a fixed port; start() again after stop() is a restart."""

    def __init__(self, port: int, keys: Path, allowed: Path, workdir: Path, extra=()):
        self.address = f"tcp://127.0.0.1:{port}"
        self.argv = [H.bin_path("coacto-server"), "--bind", self.address, "--threads", "1",
                     "--secret-key", str(keys / "server.key_secret"), "--allowed-keys",
                     str(allowed), *extra]
        self.workdir = workdir
        self.incarnation = 0
        self.proc = None
        #: set from SIGTERM until the next start: a server closing its sockets is not sampled
        self.stopping = False

    def start(self, timeout: float = 120) -> float:
        self.incarnation += 1
        self.stopping = False
        self.log = self.workdir / f"server-{self.incarnation}.log"
        self._logf = open(self.log, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while time.monotonic() - t0 < timeout:
            if "ready:" in self.log.read_text(errors="replace"):
                return time.monotonic() - t0
            if self.proc.poll() is not None:
                raise H.ExperimentError(f"coacto-server exited ({self.proc.returncode}):\n"
                                        f"{self.log.read_text(errors='replace')[-1500:]}")
            time.sleep(0.05)
        raise H.ExperimentError(f"coacto-server was not ready within {timeout:.0f} s")

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then the exit status (None: it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.stopping = True
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self._logf.close()
        return rc

    def final_stats(self) -> list[dict]:
        """Each incarnation's counters as it logged them at exit."""
        out = []
        for k in range(1, self.incarnation + 1):
            text = (self.workdir / f"server-{k}.log").read_text(errors="replace")
            marker = "shutting down; stats "
            line = next((ln for ln in text.splitlines()[::-1] if marker in ln), None)
            try:
                out.append(json.loads(line.split(marker, 1)[1]) if line else {})
            except ValueError:
                out.append({})
        return out

    def log_problems(self) -> list[str]:
        lines = []
        for p in sorted(self.workdir.glob("server-*.log")):
            lines += [f"{p.name}: {ln}" for ln in p.read_text(errors="replace").splitlines()
                      if " ERROR " in ln or "Traceback" in ln or "CRITICAL" in ln]
        return lines


class Sampler(threading.Thread):
    """The server's RSS, open fds and threads every ``every`` s, with the inferences done so far."""

    def __init__(self, server: ServerProcess, done, every: float):
        super().__init__(daemon=True)
        self.server, self.done, self.every = server, done, every
        self.samples: list[dict] = []
        self.stopping = threading.Event()
        self.t0 = time.monotonic()

    def sample(self) -> None:
        import psutil

        proc = self.server.proc
        if proc is None or self.server.stopping or proc.poll() is not None:
            return
        try:
            p = psutil.Process(proc.pid)
            with p.oneshot():
                s = {"t_s": time.monotonic() - self.t0, "incarnation": self.server.incarnation,
                     "done": self.done(), "rss_mb": p.memory_info().rss / 2**20,
                     "fds": p.num_fds(), "threads": p.num_threads()}
        except psutil.Error:  # exiting between the poll and the read
            return
        self.samples.append(s)

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            self.sample()


# ----------------------------------------------------------------------------- the soak

def keygen(folder: Path, names) -> None:
    for name in names:
        subprocess.run([H.bin_path("coacto"), "keygen", "--out", str(folder), name], check=True,
                       capture_output=True)


def build_models(folder: Path, devices: int) -> list[tuple[str, Path]]:
    from coacto import zoo

    models = []
    for d in range(devices):
        name, size = DEVICE_MODELS[d % len(DEVICE_MODELS)]
        seed = d // len(DEVICE_MODELS)  # past the list: the same network, other weights
        kw = {"image_size": size} if size else {}
        label = f"{name}{'@' + str(size) if size else ''}" + (f"#{seed}" if seed else "")
        path = folder / f"device{d}-{name}.onnx"
        path.write_bytes(zoo.build(name, seed=seed, **kw).SerializeToString())
        models.append((label, path))
    return models


def window_median(samples: list[dict], lo: float, hi: float, key: str = "rss_mb"):
    """The median of ``key`` over samples with lo <= done <= hi, else the sample nearest lo."""
    xs = [s[key] for s in samples if lo <= s["done"] <= hi]
    if xs:
        return statistics.median_low(xs) if key == "fds" else statistics.median(xs)
    if not samples:
        return None
    return min(samples, key=lambda s: abs(s["done"] - lo))[key]


def incarnation_figures(samples: list[dict], begin: int, end: int, total: int,
                        warmup: float) -> dict:
    """RSS and fds of one incarnation that served inferences ``begin`` .. ``end`` (counts done)."""
    win = max(1, int(RSS_WINDOW * total))
    warm_at = min(end, begin + int(warmup * total))
    after = [s for s in samples if s["done"] >= warm_at] or samples[-1:]
    rss_warm = window_median(samples, warm_at, warm_at + win)
    rss_end = window_median(samples, max(warm_at, end - win), end)
    fds_warm = window_median(samples, warm_at, warm_at + win, "fds")
    fds_end = window_median(samples, max(warm_at, end - win), end, "fds")
    growth = (rss_end - rss_warm) / rss_warm if rss_warm else None
    return {"judged": sum(1 for s in after if s["done"] <= end) >= MIN_JUDGED_SAMPLES,
            "inferences_from": begin, "inferences_to": end, "warmup_end_at": warm_at,
            "samples": len(samples), "rss_start_mb": samples[0]["rss_mb"] if samples else None,
            "rss_warmup_mb": rss_warm, "rss_end_mb": rss_end,
            "rss_peak_after_warmup_mb": max((s["rss_mb"] for s in after), default=None),
            "rss_growth_pct": None if growth is None else 100 * growth,
            "fds_warmup": fds_warm, "fds_end": fds_end,
            "fds_min": min((s["fds"] for s in samples), default=None),
            "fds_max": max((s["fds"] for s in samples), default=None),
            "fds_min_after_warmup": min((s["fds"] for s in after), default=None),
            "fds_max_after_warmup": max((s["fds"] for s in after), default=None),
            "threads_max": max((s["threads"] for s in samples), default=None)}


def restart_server(server: ServerProcess, sampler: Sampler, restart: dict, starts: list,
                   done: list) -> None:
    sampler.sample()
    t0 = time.monotonic()
    restart["t_stop"] = time.time()
    restart["exit_status"] = server.stop()
    restart["down_after_s"] = time.monotonic() - t0
    try:
        t_ready = server.start()
    except H.ExperimentError as e:
        restart["error"] = str(e)
        return
    restart["downtime_s"] = time.monotonic() - t0
    starts.append({"incarnation": server.incarnation, "ready_after_s": t_ready,
                   "at_done": done[0], "t_ready": time.time()})


def server_state(t: float, starts: list, restart: dict | None):
    """Which server incarnation a row finished under, by its time; "restart" while none was up."""
    if restart and "t_stop" in restart and t >= restart["t_stop"]:
        return starts[1]["incarnation"] if len(starts) > 1 and t >= starts[1]["t_ready"] \
            else "restart"
    return 1


def run_soak(args) -> tuple[dict, list[dict], list[dict]]:
    """The soak: (summary, a row per inference, the server's samples)."""
    total = args.devices * args.inferences
    wd = Path(tempfile.mkdtemp(prefix="coacto-soak-"))
    keys, allowed = wd / "keys", wd / "allowed"
    allowed.mkdir()
    names = [f"device{d}" for d in range(args.devices)]
    keygen(keys, ["server", *names])
    for n in names:
        shutil.copy(keys / f"{n}.key", allowed)
    models = build_models(wd, args.devices)
    server = ServerProcess(H.free_port(), keys, allowed, wd,
                           ["--stats-every", "10"] + (["-v"] if args.server_verbose else []))
    done = [0]
    sampler = Sampler(server, lambda: done[0], args.sample_every)
    ctx = mp.get_context("spawn")  # the parent holds ZeroMQ and sampler threads: no fork
    results, start = ctx.Queue(), ctx.Event()
    procs = []
    t_ready = server.start()
    starts = [{"incarnation": 1, "ready_after_s": t_ready, "at_done": 0, "t_ready": time.time()}]
    sampler.start()
    try:
        for d, (label, path) in enumerate(models):
            spec = {"n": args.inferences, "seed": args.seed, "model": str(path), "name": label,
                    "server": server.address, "timeout": args.timeout,
                    "lost_after": args.lost_after, "warmup": args.warmup,
                    "slowdown": args.device_slowdown, "think_ms": args.think_ms,
                    "server_key": str(keys / "server.key"),
                    "client_key": str(keys / f"device{d}.key_secret"),
                    "log": str(wd / f"device{d}.log")}
            p = ctx.Process(target=device_main, args=(d, spec, results, start), daemon=True)
            p.start()
            procs.append(p)
        ready = set()
        while len(ready) < args.devices:
            kind, d, payload = results.get(timeout=300)
            if kind == "error":
                raise H.ExperimentError(f"device {d} could not start:\n{payload}")
            ready.add(d)
        rows, infos, errors = [], {}, {}
        progress = H.Progress(total, "soak")
        last_shown, t_start = 0.0, time.monotonic()
        restart, restarter = None, None
        start.set()
        while len(infos) + len(errors) < args.devices:
            try:
                kind, d, payload = results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if not p.is_alive()
                        and i not in infos and i not in errors]
                for i in dead:
                    errors[i] = f"device process exited ({procs[i].exitcode}) without a report"
                continue
            if kind == "row":
                rows.append(payload)
                done[0] += 1
            elif kind == "done":
                infos[d] = payload
            else:
                errors[d] = payload
            now = time.monotonic()
            if now - last_shown >= args.progress_every or done[0] == total:
                bad = sum(not r["ok"] for r in rows)
                progress.step(done[0] - progress.done,
                              f"{done[0]}/{total}  not ok {bad}  server #{server.incarnation}")
                last_shown = now
            if restart is None and args.restart_at < 1 and done[0] >= total * args.restart_at:
                # in a thread: the devices keep submitting while the server is away (that is
                # the point), and their rows keep being read meanwhile
                restart = {"at_done": done[0]}
                restarter = threading.Thread(target=restart_server,
                                             args=(server, sampler, restart, starts, done))
                restarter.start()
        if restarter is not None:
            restarter.join()
        progress.close()
        duration = time.monotonic() - t_start
        sampler.sample()
    finally:
        sampler.stopping.set()
        final_status = server.stop()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    summary = summarize(args, rows, infos, errors, sampler.samples, starts, restart,
                        final_status, duration, server.log_problems(), models, wd)
    counters = ("inferences_done", "inferences_cancelled", "inferences_expired", "rejected",
                "send_failed", "results_dropped", "memory_refused", "trims")
    for x, stats in zip(summary["server_incarnations"], server.final_stats()):
        x["counters"] = {k: stats.get(k) for k in counters}
    return summary, rows, sampler.samples


def summarize(args, rows, infos, errors, samples, starts, restart, final_status, duration,
              problems, models, wd) -> dict:
    total = args.devices * args.inferences
    for r in rows:
        r["server_incarnation"] = server_state(r["t"], starts, restart)
    wrong = sum(1 for r in rows if not r["lost"] and not r["ok"])
    lost = sum(1 for r in rows if r["lost"]) + (total - len(rows))
    fallbacks = sum(1 for r in rows if r["fallback"] is True)
    incarnations = []
    # each incarnation from the inferences done when it was ready to those done when it was
    # stopped
    stops = ([restart["at_done"]] if restart else []) + [len(rows)]
    for k, s in enumerate(starts):
        mine = [x for x in samples if x["incarnation"] == s["incarnation"]]
        figs = incarnation_figures(mine, s["at_done"], stops[k], total, args.warmup)
        incarnations.append({**s, **figs})
    checked = [x for x in incarnations if x["judged"]]
    growth = max((x["rss_growth_pct"] or 0.0 for x in checked), default=0.0)
    fds_grew = any((x["fds_end"] or 0) > (x["fds_warmup"] or 0) for x in checked)
    by_policy = {p: sum(1 for r in rows if r["policy"] == p) for p in POLICIES}
    lat = [float(r["latency_ms"]) for r in rows if r["latency_ms"] != ""]
    failures = []
    if wrong:
        failures.append(f"{wrong} wrong answers")
    if lost:
        failures.append(f"{lost} lost requests")
    if errors:
        failures.append(f"{len(errors)} device processes failed")
    if growth >= 100 * RSS_GROWTH_LIMIT:
        failures.append(f"server RSS grew {growth:.1f}% after warm-up")
    if fds_grew:
        failures.append("server file descriptors grew after warm-up")
    if restart is None and args.restart_at < 1:
        failures.append("the server was not restarted")
    elif restart and "error" in restart:
        failures.append(f"the server did not start again: {restart['error'][:300]}")
    summary = {
        "passed": not failures, "failures": failures,
        "devices": args.devices, "inferences_per_device": args.inferences,
        "inferences": total, "answered": len(rows), "wrong": wrong, "lost": lost,
        "fallbacks": fallbacks, "fallbacks_by_incarnation": {
            str(s["incarnation"]): sum(1 for r in rows if r["fallback"] is True
                                       and r["server_incarnation"] == s["incarnation"])
            for s in [*starts, {"incarnation": "restart"}]},
        "finished_by": {k: sum(1 for r in rows if r["finished_by"] == k)
                        for k in ("device", "server", "both")},
        "policies": by_policy,
        "rate_changes": {"before": sum("before" in r["rate_change"] for r in rows),
                         "during": sum("during" in r["rate_change"] for r in rows)},
        "max_rel_error": max((float(r["rel_error"]) for r in rows if r["rel_error"] != ""),
                             default=None),
        "latency_ms": H.summarize([x / 1e3 for x in lat]) if lat else None,
        "duration_s": duration, "restart": restart, "server_exit_status": final_status,
        "server_incarnations": incarnations, "server_rss_growth_pct_max": growth,
        "server_log_problems": problems[:50],
        "devices_detail": [{"device": d, "model": models[d][0], **infos.get(d, {}),
                            "error": errors.get(d)} for d in range(args.devices)],
        "lost_examples": [f"device {r['device']} #{r['i']} {r['policy']}: {r['error']}"
                          for r in rows if r["lost"]][:20],
        "workdir": str(wd),
    }
    return summary


ROW_FIELDS = ("device", "model", "i", "policy", "bandwidth_mbps", "rate_change", "latency_ms",
              "fallback", "fallback_reason", "finished_by", "reconnects", "server_incarnation",
              "rel_error", "ok", "lost", "error", "device_rss_mb", "device_fds", "t")


def write_csv(path: Path, rows: list[dict], fields) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and k != "t" else v)
                        for k, v in r.items()})


def print_table(s: dict) -> None:
    mix = ", ".join(f"{k} {v}" for k, v in s["policies"].items())
    print(f"\nsoak: {s['devices']} devices x {s['inferences_per_device']} inferences in "
          f"{H.fmt_s(s['duration_s'])}  ({mix})")
    lat = s["latency_ms"] or {}
    print(f"  answered {s['answered']}/{s['inferences']}   wrong {s['wrong']}   lost {s['lost']}   "
          f"fallbacks {s['fallbacks']} (by server incarnation: {s['fallbacks_by_incarnation']})   "
          f"max rel error {s['max_rel_error'] or 0:.2e}")
    if lat:
        print(f"  latency: median {lat['median_ms']:.1f} ms, p95 {lat['p95_ms']:.1f} ms, "
              f"max {lat['max_ms']:.1f} ms;  finished by {s['finished_by']};  rate changes "
              f"{s['rate_changes']}")
    if s["restart"]:
        r = s["restart"]
        print(f"  restart after {r['at_done']} inferences: exit status {r['exit_status']}, "
              f"down {r['downtime_s']:.1f} s until ready again")
    print(f"  {'server':8} {'inferences':>13} {'RSS start':>10} {'warm-up':>9} {'end':>9} "
          f"{'peak':>9} {'growth':>8} {'fds min/max':>12} {'fds warm/end':>13}")
    for x in s["server_incarnations"]:
        def mb(v):
            return f"{v:.1f}M" if v is not None else "-"
        growth = f"{x['rss_growth_pct']:+.2f}%" if x["rss_growth_pct"] is not None else "-"
        growth += "" if x["judged"] else "?"
        print(f"  #{x['incarnation']:<7} {x['inferences_from']:>6}-{x['inferences_to']:<6} "
              f"{mb(x['rss_start_mb']):>10} {mb(x['rss_warmup_mb']):>9} {mb(x['rss_end_mb']):>9} "
              f"{mb(x['rss_peak_after_warmup_mb']):>9} {growth:>8} "
              f"{str(x['fds_min']) + '/' + str(x['fds_max']):>12} "
              f"{str(x['fds_warmup']) + '/' + str(x['fds_end']):>13}")
    for dd in s["devices_detail"]:
        w, e = dd.get("usage_warm") or {}, dd.get("usage_end") or {}
        print(f"  device {dd['device']} {dd['model']:<18} RSS {w.get('rss_mb', 0):.0f}M -> "
              f"{e.get('rss_mb', 0):.0f}M, fds {w.get('fds', '-')} -> {e.get('fds', '-')}, "
              f"session {dd.get('server_info')}" + (f"  ERROR {dd['error'][-300:]}"
                                                    if dd.get("error") else ""))
    if not all(x["judged"] for x in s["server_incarnations"]):
        print(f"  ?: fewer than {MIN_JUDGED_SAMPLES} samples after warm-up: too short to judge "
              f"RSS and fds")
    for x in s["server_incarnations"]:
        print(f"  server #{x['incarnation']} counters: {x.get('counters')}")
    if s["server_log_problems"]:
        print(f"  server log: {len(s['server_log_problems'])} error lines, first: "
              f"{s['server_log_problems'][0][:200]}")
    for ex in s["lost_examples"][:5]:
        print(f"  lost: {ex}")
    print("  PASS" if s["passed"] else "  FAIL: " + "; ".join(s["failures"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="experiments/results", metavar="DIR",
                    help="folder for soak.csv, soak.samples.csv and soak.json "
                         "(default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="4 devices x 50 inferences")
    ap.add_argument("--devices", type=int, default=4,
                    help="device processes (default: %(default)s)")
    ap.add_argument("--inferences", type=int, default=None, metavar="N",
                    help="inferences per device (default: 2000; --quick: 50)")
    ap.add_argument("--seed", type=int, default=0, help="of policies, inputs and rates")
    ap.add_argument("--restart-at", type=float, default=0.5, metavar="F",
                    help="restart the server after this share of all inferences (1: never; "
                         "default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=0.1, metavar="F",
                    help="each incarnation's warm-up, as a share of all inferences "
                         "(default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="the clients' timeout: seconds of server silence before finishing "
                         "alone (default: %(default)s)")
    ap.add_argument("--think-ms", type=float, default=100.0, metavar="MS",
                    help="mean pause before each inference (exponential, from the seeded RNG): "
                         "a device that infers now and then rather than back to back, and a soak "
                         "long enough for the restart to be a moment of it (default: %(default)s)")
    ap.add_argument("--device-slowdown", type=float, default=4.0, metavar="X",
                    help="the clients plan as if their device were X times slower than measured "
                         "(as the figures' 25%% CPU quota makes it; 1: as measured). These small "
                         "models on an unthrottled core run faster here than anywhere else, and "
                         "split and dynamic would then keep them on the device: the server's paths "
                         "would see little of the soak (default: %(default)s)")
    ap.add_argument("--lost-after", type=float, default=120.0, metavar="S",
                    help="an inference not answered in S seconds is lost (default: %(default)s)")
    ap.add_argument("--sample-every", type=float, default=0.5, metavar="S",
                    help="server RSS / fd sampling period (default: %(default)s)")
    ap.add_argument("--progress-every", type=float, default=5.0, metavar="S",
                    help="seconds between progress lines (default: %(default)s)")
    ap.add_argument("--server-verbose", action="store_true",
                    help="the server logs at debug level (every rejected message)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, keys)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    args = ap.parse_args(argv)
    if args.inferences is None:
        args.inferences = 50 if args.quick else 2000
    if args.devices < 1 or args.inferences < 1:
        ap.error("--devices and --inferences must be at least 1")
    out = Path(args.out)
    try:
        s, rows, samples = run_soak(args)
    except (H.ExperimentError, queue.Empty, OSError, subprocess.CalledProcessError) as e:
        print(f"soak: cannot run: {e}", file=sys.stderr)
        return 2
    settings = {k: getattr(args, k) for k in ("devices", "inferences", "seed", "restart_at",
                                             "warmup", "timeout", "lost_after", "sample_every",
                                             "device_slowdown", "think_ms")}
    settings.update(server="coacto-server --threads 1, CurveZMQ keys, tcp://127.0.0.1",
                    client_threads=1, policies=POLICIES, bandwidths_mbps=BANDWIDTHS,
                    p_rate_before=P_RATE_BEFORE, p_rate_during=P_RATE_DURING,
                    rel_bound=REL_BOUND, rss_window=RSS_WINDOW, load_at_end=os.getloadavg())
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "soak.csv", rows, ROW_FIELDS)
    write_csv(out / "soak.samples.csv", samples,
              ("t_s", "incarnation", "done", "rss_mb", "fds", "threads"))
    wd = Path(s["workdir"])
    if s["passed"] and not args.keep:
        shutil.rmtree(wd, ignore_errors=True)
        s["workdir"] = None
    s.update(settings=settings, machine=H.machine(),
             written=time.strftime("%Y-%m-%d %H:%M:%S"))
    (out / "soak.json").write_text(json.dumps(s, indent=2, default=str))
    print_table(s)
    if s["workdir"]:
        print(f"  logs and keys kept in {s['workdir']}")
    if args.json:
        print(json.dumps(s, default=str))
    return 0 if s["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
