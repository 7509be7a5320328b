"""What every figure script shares: models with their onnxruntime references, a coacto server and
a device process on the testbed, progress with an ETA, and CSV / settings / PNG output.

A figure script does roughly:

    with Testbed(quota=0.25) as tb, Workdir() as wd:
        case = wd.model("resnet50")
        with Server(tb, wd, [case], threads=1) as srv, Device(tb, srv, case) as dev:
            tb.set_link(20)
            r = dev.run("dynamic", repeat=3, bandwidth=tb.client_link_args())
        write_table(out, "bandwidth", rows, settings)

Everything runs as real processes: `coacto-server` in the server namespace pinned to its core(s),
`experiments/device_driver.py` (a `coacto.Client`) in the device namespace inside the CPU quota.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
log = logging.getLogger("experiments")

#: The four zoo models of the figures (CoActo's Fig. 9 uses ResNet-50, VGG-16 and BERT-base).
FIGURE_MODELS = ("resnet50", "vgg16", "mobilenetv2", "bert")
POLICIES = ("local", "cloud", "split", "fl", "dynamic")
#: one color per policy in every figure
POLICY_COLORS = {"local": "#555555", "cloud": "#1f77b4", "split": "#2ca02c", "fl": "#9467bd",
                 "dynamic": "#d62728"}


class ExperimentError(RuntimeError):
    """A process of the experiment failed; the message quotes its log."""


def bin_path(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise ExperimentError(f"{name} is not installed: run `pip install -e .` first")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- progress

class Progress:
    """A one-line progress bar with an ETA on stderr, by units of expected work (seconds, say)."""

    def __init__(self, total: float, label: str = "", stream=sys.stderr):
        self.total = max(float(total), 1e-9)
        self.done = 0.0
        self.label = label
        self.t0 = time.monotonic()
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def step(self, units: float = 1.0, what: str = "") -> None:
        self.done = min(self.total, self.done + units)
        elapsed = time.monotonic() - self.t0
        frac = self.done / self.total
        eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        msg = (f"{self.label} [{bar}] {100 * frac:5.1f}%  elapsed {fmt_s(elapsed)}  "
               f"eta {fmt_s(eta)}  {what}")
        if self.tty:
            self.stream.write("\r" + msg[:160].ljust(160))
        else:
            self.stream.write(msg + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def fmt_s(s: float) -> str:
    if s != s:
        return "?"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# ----------------------------------------------------------------------------- models

def model_file(spec: str) -> Path | None:
    """``spec`` as an ONNX file of the user's (a path ending in .onnx), else None (a zoo name)."""
    return Path(spec) if spec.lower().endswith(".onnx") else None


#: The experiment's own ONNX files by the name they go by (their stem; resolve_common fills it).
MODEL_FILES: dict[str, Path] = {}


class ModelCase:
    """A zoo model, or one of the user's ONNX files (MODEL_FILES), saved as ONNX with random
    inputs and onnxruntime's outputs."""

    def __init__(self, name: str, folder: Path, **kw):
        import onnx
        import onnxruntime as ort

        from coacto import zoo

        self.name = name
        model = onnx.load(str(MODEL_FILES[name])) if name in MODEL_FILES else \
            zoo.build(name, **kw)
        self.path = folder / "models" / f"{name}.onnx"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(model.SerializeToString())
        feeds = zoo.input_feeds(model)
        self.inputs = folder / f"{name}.inputs.npz"
        np.savez(self.inputs, **feeds)
        sess = ort.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
        self.reference = folder / f"{name}.reference.npz"
        np.savez(self.reference, **{o.name: v for o, v in zip(sess.get_outputs(), outs)})
        self.flops = None


class Workdir:
    """A temporary folder (readable by the namespaced processes) removed at exit."""

    def __init__(self, image_size: int | None = None):
        self.image_size = image_size

    def __enter__(self) -> "Workdir":
        self.path = Path(tempfile.mkdtemp(prefix="coacto-exp-"))
        os.chmod(self.path, 0o755)
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def model(self, name: str, **kw) -> ModelCase:
        from coacto import zoo

        if name in MODEL_FILES:
            if self.image_size:
                log.warning("--image-size leaves %s as its file has it", name)
        elif self.image_size and name not in zoo.TRANSFORMERS:
            kw.setdefault("image_size", self.image_size)
        return ModelCase(name, self.path, **kw)


# ----------------------------------------------------------------------------- processes

def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Server:
    """`coacto-server` in the testbed's server namespace, on its cores, serving ``cases``."""

    def __init__(self, tb, wd: Workdir, cases, threads: int = 1, extra: list[str] | None = None):
        self.tb, self.wd, self.threads = tb, wd, threads
        # a folder of its own (id() of a collected object comes back: not a name)
        self.models = Path(tempfile.mkdtemp(prefix="server-models-", dir=wd.path))
        os.chmod(self.models, 0o755)
        for c in cases:  # a hard link: VGG-16's file is over 500 MB
            try:
                os.link(c.path, self.models / c.path.name)
            except OSError:
                shutil.copy(c.path, self.models)
        self.port = free_port()
        self.log = wd.path / f"server-{self.port}.log"
        self.extra = extra or []
        self.address = f"tcp://{tb.server_addr}:{self.port}"

    def __enter__(self) -> "Server":
        bind = f"tcp://{self.tb.server_addr}:{self.port}"
        # --insecure: the server's address lives in the testbed's own network namespace, which
        # nothing outside this experiment can reach (keys would add CurveZMQ's encryption to
        # every tile, which the peers compared here do not pay)
        argv = [bin_path("coacto-server"), "--bind", bind, "--insecure", "--threads",
                str(self.threads), "--models", str(self.models), *self.extra]
        self._logf = open(self.log, "w")
        self.proc = subprocess.Popen(self.tb.server_cmd(argv), stdout=self._logf,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300  # compiling VGG-16 on one core takes a while
        while time.monotonic() < deadline:
            if "ready:" in _tail(self.log, 100000):
                return self
            if self.proc.poll() is not None:
                raise ExperimentError(f"coacto-server exited ({self.proc.returncode}):\n{_tail(self.log)}")
            time.sleep(0.2)
        self.__exit__()
        raise ExperimentError(f"coacto-server was not ready within 300 s:\n{_tail(self.log)}")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()


#: The devices' tile encoding (--transfer; resolve_common sets it for the whole experiment).
TRANSFER = "lossless"


class Device:
    """experiments/device_driver.py for one model, in the device namespace and CPU quota."""

    def __init__(self, tb, server: Server | None, case: ModelCase, threads: int = 1,
                 tiles: int | None = None, timeout: float = 5.0, slot: int | None = None,
                 cpus: str | None = None):
        # slot: one of several devices at once, each in a CPU quota of its own; cpus: pinned
        # there rather than on the testbed's device CPU
        self.tb, self.case, self.slot, self.cpus = tb, case, slot, cpus
        address = server.address if server is not None else "tcp://127.0.0.1:9"
        argv = [sys.executable, str(HERE / "device_driver.py"), "--server", address,
                "--model", str(case.path), "--inputs", str(case.inputs),
                "--reference", str(case.reference), "--threads", str(threads),
                "--timeout", str(timeout), "--transfer", TRANSFER]
        if tiles:
            argv += ["--tiles", str(tiles)]
        self.argv = argv
        fd, log_path = tempfile.mkstemp(prefix=f"device-{case.name}-", suffix=".log",
                                        dir=server.wd.path if server else case.path.parent)
        os.close(fd)
        self.log = Path(log_path)

    def __enter__(self) -> "Device":
        self._logf = open(self.log, "w")
        cmd = self.tb.device_cmd(self.argv, slot=self.slot, cpus=self.cpus)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._logf, text=True,
                                     start_new_session=True)
        return self

    def command(self, cmd: dict, timeout: float = 900) -> dict:
        cmd = {**cmd, "rtt_ms": getattr(self.tb, "added_rtt_ms", 0.0)}  # the client adds it
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0]:
            self.__exit__()
            raise ExperimentError(f"the device process gave no answer to {cmd} "
                                  f"(exit {self.proc.poll()}):\n{_tail(self.log)}")
        reply = json.loads(line[0])
        if "error" in reply:
            raise ExperimentError(f"device: {reply['error']}\n{_tail(self.log, 600)}")
        return reply

    def calibrate(self, bandwidth=None) -> float:
        return self.command({"cmd": "calibrate", "bandwidth": bandwidth})["device_flops"]

    def fresh_client(self, bandwidth=None) -> None:
        self.command({"cmd": "client", "bandwidth": bandwidth})

    def probe(self, runs: int = 2) -> list[float]:
        """Latencies (s) of ``runs`` local inferences (after one more, left out): the device's
        speed in its quota now."""
        return self.command({"cmd": "probe", "runs": runs})["latencies_s"]

    def set_bandwidth(self, bandwidth: str) -> None:
        """The client's own link (shaper mode) changes to ``bandwidth`` now, for good."""
        self.command({"cmd": "set_bandwidth", "bandwidth": bandwidth})

    def learn(self, bandwidth=None, max_inferences: int = 10) -> dict:
        """Dynamic inferences until the link's goodput was measured (see device_driver.py)."""
        return self.command({"cmd": "learn", "max": max_inferences, "bandwidth": bandwidth})

    def run(self, policy: str, repeat: int, warmup: int = 1, bandwidth=None, trace=None,
            change: dict | None = None) -> dict:
        cmd = {"cmd": "run", "policy": policy, "repeat": repeat, "warmup": warmup,
               "bandwidth": bandwidth, "trace": trace}
        if change:
            cmd["change"] = change
        r = self.command(cmd)
        if r["max_rel_error"] > 1e-4 and TRANSFER in ("lossless", "raw"):
            raise ExperimentError(f"{self.case.name} {policy}: outputs differ from onnxruntime's "
                                  f"(max relative error {r['max_rel_error']:.2e})")
        return r

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._logf.close()


def testbed_settings(tb, shaping: str | None = None) -> dict:
    """The testbed's description for a settings file: how the link is shaped in general (the rate
    and the measured link are per row, so the description taken at one moment does not say them)."""
    d = tb.describe()
    for k in ("nominal_mbps", "measured_link"):
        d.pop(k, None)
    d["transfer"] = TRANSFER
    d["shaping"] = shaping or ("tc tbf on both veth ends at each row's nominal_mbps"
                               if tb.mode == "netns" else
                               "coacto-client's token bucket at each row's nominal_mbps (loopback)")
    return d


def bandwidth_arg(tb, mbps: float | None):
    """What the device driver's Client gets: the cap in shaper mode, nothing with kernel shaping
    (the device must measure the link as a real one would)."""
    args = tb.client_link_args()
    return args[args.index("--bandwidth") + 1] if "--bandwidth" in args else None


def summarize(lat_s: list[float]) -> dict:
    xs = sorted(lat_s)
    p95 = xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]
    return {"median_ms": 1e3 * statistics.median(xs), "p95_ms": 1e3 * p95,
            "min_ms": 1e3 * xs[0], "max_ms": 1e3 * xs[-1], "n": len(xs)}


# ----------------------------------------------------------------------------- output

def machine() -> dict:
    from coacto.runtime import gemm_kernel_name
    from coacto.machine import cpu_model

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else platform.machine()
    return {"cpu": cpu_model(), "isa": isa, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "coacto_kernel": gemm_kernel_name()}


def write_table(out: Path, name: str, rows: list[dict], settings: dict) -> Path:
    """NAME.csv (one row per measurement) and NAME.settings.json (how it was measured, where)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.csv"
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    meta = {"figure": name, "written": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(),
            **settings}
    if MODEL_FILES:  # the names in the rows that are files, not zoo models (sim_vs_real reads it)
        meta.setdefault("model_files", {k: str(v) for k, v in MODEL_FILES.items()})
    (out / f"{name}.settings.json").write_text(json.dumps(meta, indent=2, default=str))
    return path


def read_table(path: Path) -> list[dict]:
    """A table write_table wrote, numbers as floats again (empty cells stay "")."""
    def value(v: str):
        try:
            return float(v)
        except ValueError:
            return v

    with open(path, newline="") as f:
        return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]


def settings_note(settings: dict, width: int = 150) -> str:
    """The settings as a few lines of text for a figure's footer."""
    parts = [f"{k}={v}" for k, v in settings.items() if not isinstance(v, (dict, list))]
    lines, cur = [], ""
    for p in parts:
        if len(cur) + len(p) + 2 > width:
            lines.append(cur)
            cur = ""
        cur += ("; " if cur else "") + p
    if cur:
        lines.append(cur)
    return "\n".join(lines)


def save_figure(fig, out: Path, name: str, settings: dict, bottom: float = 0.06,
                top: float = 0.95) -> Path:
    """NAME.png with the settings in its footer."""
    import matplotlib.pyplot as plt

    fig.text(0.01, 0.005, settings_note(settings), fontsize=6, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, bottom, 1, top))
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pyplot():
    """matplotlib's pyplot without a display; a clear error when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ExperimentError("the figures need matplotlib: pip install -e '.[experiments]'") from e
    return plt


# ----------------------------------------------------------------------------- command line

def add_common_args(ap, models=FIGURE_MODELS, quick_models=None) -> None:
    ap.add_argument("--out", default="experiments/results", metavar="DIR",
                    help="folder for NAME.csv, NAME.settings.json and NAME.png (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="a reduced sweep (fewer settings and repeats) for CI and a first look")
    quick_note = f"; --quick: {','.join(quick_models)}" if quick_models else ""
    ap.add_argument("--models", default=None, metavar="M,M",
                    help=f"zoo models or ONNX files (paths ending in .onnx, named in the "
                         f"results by their stem; inputs random, outputs checked against "
                         f"onnxruntime's) (default: {','.join(models)}{quick_note})")
    ap.set_defaults(default_models=models, quick_models=quick_models or models)
    ap.add_argument("--quota", type=float, default=0.25,
                    help="the device's CPU share of one core (cgroup quota): 0.25 makes it 4x "
                         "slower than the server's core (default: %(default)s)")
    ap.add_argument("--mode", choices=("auto", "netns", "shaper"), default="auto",
                    help="netns: kernel shaping between two network namespaces (root); shaper: "
                         "the client's own token bucket on loopback; auto: netns when possible")
    ap.add_argument("--repeat", type=int, default=None, metavar="R",
                    help="measured inferences per setting (default: 2 with --quick, else 5)")
    ap.add_argument("--rounds", type=int, default=None, metavar="N",
                    help="passes over all settings, interleaved (default: 1 with --quick, else 2)")
    ap.add_argument("--testbed-name", default="coacto", metavar="NAME",
                    help="prefix of the namespaces, veths and cgroups (default: %(default)s); two "
                         "experiments at once need different names (and share the 2 cores)")
    ap.add_argument("--image-size", type=int, default=None, metavar="PX",
                    help="build the zoo's image models at this size (default: their own, 224): "
                         "for a fast look or a test, not for figures to compare with the papers'")
    ap.add_argument("--transfer", default="lossless", choices=("lossless", "f16", "int8", "raw"),
                    help="the devices' tile encoding (default: %(default)s, coacto's own default; "
                         "raw: float32, as before encodings existed)")
    ap.add_argument("--verbose", "-v", action="store_true")


def add_reference_args(ap) -> None:
    """The CoActo reference's options, for the figures where it runs beside coacto."""
    ap.add_argument("--no-ref", action="store_true", help="leave out the CoActo reference's rows")
    ap.add_argument("--ref-repeat", type=int, default=None,
                    help="inferences per reference run (default: 3 with --quick, else 6)")


def resolve_common(args) -> None:
    if args.models is None:
        args.models = ",".join(args.quick_models if args.quick else args.default_models)
    args.models = [m for m in args.models.split(",") if m]
    if args.repeat is None:
        args.repeat = 2 if args.quick else 5
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    args.out = Path(args.out)
    global TRANSFER
    TRANSFER = getattr(args, "transfer", TRANSFER)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(message)s", stream=sys.stderr)
    from coacto import zoo

    files = [model_file(m) for m in args.models if model_file(m) is not None]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"no such ONNX file: {', '.join(missing)}")
    stems = [f.stem for f in files] + [m for m in args.models if model_file(m) is None]
    clash = sorted({f.stem for f in files} & set(zoo.MODELS))
    if clash:
        raise SystemExit(f"the file {clash[0]}.onnx would go by the name of the zoo's "
                         f"{clash[0]} in the results: rename the file")
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise SystemExit(f"two models would be named {', '.join(twice)} in the results (a file "
                         "is named by its stem): rename one")
    unknown = [m for m in args.models if model_file(m) is None and m not in zoo.MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(sorted(zoo.MODELS))}, or give an ONNX file (a path "
                         "ending in .onnx)")
    # from here on every model goes by its name: a file by its stem
    MODEL_FILES.update({f.stem: f.resolve() for f in files})
    args.models = [model_file(m).stem if model_file(m) is not None else m for m in args.models]


def testbed(args):
    sys.path.insert(0, str(HERE))
    from testbed import Testbed

    return Testbed(quota=args.quota, mode=args.mode, name=args.testbed_name,
                   server_cpus=getattr(args, "server_cpus", "1"),
                   device_cpu=getattr(args, "device_cpu", "0"))


# ----------------------------------------------------------------------------- measurements

def link_columns(link: dict) -> dict:
    return {"measured_up_mbps": link["goodput_up_mbps"], "measured_down_mbps": link["goodput_down_mbps"],
            "measured_rtt_ms": link["rtt_ms"]}


def rotation(policies, rnd: int, alternate: bool = True) -> list:
    """The order of round ``rnd``: rotated by the round number, and with three policies or more
    reversed on odd rounds, so that each policy follows a different one from round to round
    (rotation alone always ran dynamic right after fl, whose last inferences leave the server's
    caches and the link in their own state; two policies alternate by rotation alone).
    ``alternate=False``: rotation alone, the order of results recorded before (their settings
    have no "rotation")."""
    k = rnd % len(policies)
    order = list(policies[k:]) + list(policies[:k])
    return order[::-1] if alternate and rnd % 2 and len(order) > 2 else order


def chunk_sizes(repeat: int, chunk: int | None) -> list[int]:
    """``repeat`` inferences per setting in runs of at most ``chunk`` (None: one run)."""
    if not chunk or chunk >= repeat:
        return [repeat]
    return [chunk] * (repeat // chunk) + ([repeat % chunk] if repeat % chunk else [])


def turn_order(order, turn: int) -> list:
    """The order of the settings in turn ``turn`` of a chunked run (chunk_sizes): the round's
    own first, then a permutation of it drawn for each turn (seeded by the turn, so that a
    simulation of the run repeats it). Rotating the order would not do: it keeps each setting
    behind the same one but at the turn's seam, and the one behind a slow link's idle device
    would pay for that idleness every time."""
    order = list(order)
    return order if turn == 0 else random.Random(turn).sample(order, len(order))


def merge_run(acc: dict | None, r: dict) -> dict:
    """Device.run's result ``r`` appended to ``acc`` (the same policy's earlier chunks, or
    None): latencies and stats in order, the worst error, the latest estimates."""
    if acc is None:
        return dict(r, latencies_s=list(r["latencies_s"]), stats=list(r["stats"]))
    acc["latencies_s"] += r["latencies_s"]
    acc["stats"] += r["stats"]
    acc["max_rel_error"] = max(acc["max_rel_error"], r["max_rel_error"])
    if "estimates" in r:
        acc["estimates"] = r["estimates"]
    return acc


def run_policies(dev: Device, policies, repeat: int, rnd: int, bw_arg, base: dict,
                 progress: Progress | None = None, warmup: bool = True,
                 chunk: int | None = None) -> list[dict]:
    """A fresh Client; warm-up inferences until it has measured the link (a device that just
    joined a network starts from a guess of its goodput); then every policy ``repeat`` times, the
    order of ``rotation``, in turns of ``chunk`` inferences each (None: all of a policy's at
    once); one row per policy."""
    dev.fresh_client(bw_arg)
    learned = dev.learn(bw_arg) if warmup else {"inferences": 0}
    rows = []
    # The device's speed is measured beside the policies, before and after them, as the link's
    # goodput is beside every setting: its quota's share of a core shared with the rest of the
    # host computes 10-30% slower for seconds at a time (sim_vs_real takes it from here)
    probe = dev.probe(PROBE_RUNS)
    order = rotation(policies, rnd)
    runs: dict = {}
    shown = ("nominal_mbps", "server_threads", "tiles_per_layer")
    for turn, k in enumerate(chunk_sizes(repeat, chunk)):
        for policy in turn_order(order, turn):
            runs[policy] = merge_run(runs.get(policy),
                                     dev.run(policy, repeat=k, warmup=0, bandwidth=bw_arg))
            if progress:
                progress.step(k / repeat, f"{base.get('model', '')} {policy} " +
                              " ".join(f"{key}={base[key]}" for key in shown if key in base))
    for policy in order:
        r = runs[policy]
        st = r["stats"]
        rows.append({
            "system": "coacto", **base, "policy": policy, "round": rnd,
            **summarize(r["latencies_s"]),
            "latencies_ms": " ".join(f"{1e3 * x:.1f}" for x in r["latencies_s"]),
            "client_goodput_mbps": r["estimates"]["bandwidth_est_mbps"],
            "client_rtt_ms": r["estimates"]["rtt_est_ms"],
            "client_downlink_mbps": r["estimates"].get("downlink_est_mbps"),
            "offload_error_ms": r["estimates"].get("offload_error_ms"),
            "alpha": r["estimates"]["alpha"],
            "server_gflops": (r["estimates"]["server_flops"] or 0) / 1e9,
            "warmup_inferences": learned["inferences"],
            "tiles_sent": statistics.median(s["tiles_sent"] for s in st),
            "tiles_from_server": statistics.median(s["tiles_from_server"] for s in st),
            "bytes_sent": statistics.median(s["bytes_sent"] for s in st),
            "transfer": TRANSFER,
            "tile_bytes_raw": statistics.median(s.get("tile_bytes_raw", 0) for s in st),
            "tile_bytes_wire": statistics.median(s.get("tile_bytes_wire", 0) for s in st),
            "fallbacks": sum(bool(s["fallback"]) for s in st),
            "offloaded": sum(bool(s.get("offloaded")) for s in st),
            # how long after BEGIN the server held every input (offloaded inferences)
            "inputs_at_server_ms": statistics.median(
                [s["inputs_at_server_s"] * 1e3 for s in st if s.get("inputs_at_server_s")]
                or [float("nan")]),
            # inferences that computed everything from the start: the server was shared
            "kept_work": sum(bool(s.get("kept_work")) for s in st),
            "server_skipped": next((s["server_skipped"] for s in st if s.get("server_skipped")), ""),
            "goodput_samples": r["estimates"].get("goodput_samples"),
            "finished_by": ",".join(sorted({s["finished_by"] for s in st})),
            "frontier": ",".join(sorted({str(s.get("frontier")) for s in st if s.get("frontier")})),
            # the cut each split / fl inference was planned with (what sim_vs_real replays)
            "cuts": " ".join(str(s.get("split_layer")) for s in st)
            if policy in ("split", "fl") else "",
            # dynamic's plan of each inference, in order (what sim_vs_real replays)
            "frontiers": ";".join(str(s.get("frontier")) for s in st)
            if policy == "dynamic" else "",
            # ... and what its cost model predicted for it (before the per-kind correction):
            # with the latencies, what each kind's error was learnt from
            "predicted_ms": " ".join(f"{1e3 * s['predicted_s']:.1f}" if s.get("predicted_s")
                                     else "-" for s in st) if policy == "dynamic" else "",
            "warmup_ms": " ".join(f"{1e3 * x:.1f}" for x in learned.get("latencies_s", ())),
            "warmup_predicted_ms": " ".join(f"{1e3 * x:.1f}" if x else "-"
                                            for x in learned.get("predicted_s", ())),
            "max_rel_error": r["max_rel_error"],
            "device_cpu_ms": statistics.median(
                s["device_process"]["user_ms"] + s["device_process"]["sys_ms"] for s in st),
        })
    probe += dev.probe(PROBE_RUNS)
    for row in rows:
        row["device_probe_ms"] = 1e3 * statistics.median(probe)
        row["device_probe_ms_each"] = " ".join(f"{1e3 * x:.1f}" for x in probe)
    return rows


#: local inferences before and after each fresh client's policies (Device.probe)
PROBE_RUNS = 2

#: zoo name -> the CoActo reference's model name (it ships these three)
REF_MODELS = {"resnet50": "resnet50", "vgg16": "vgg16", "bert": "bert_base"}
#: the tile graphs it ships: ResNet-50 and VGG-16 at 20-200 tiles per layer, BERT at 20 and 50
REF_TILES = {"resnet50": (20, 50, 100, 200), "vgg16": (20, 50, 100, 200), "bert": (20, 50)}


def reference_row(tb, model: str, policy: str, n: int, base: dict, tiles: int | None = None,
                  server_threads: int = 1) -> dict:
    """One run of the CoActo reference (peer_coacto_ref.py) on the testbed: a row like
    run_policies' (its failure recorded in `error`, not raised: it asserts on network errors)."""
    import peer_coacto_ref as ref

    build = ref.build()
    tiles = tiles or (100 if 100 in REF_TILES[model] else REF_TILES[model][-1])
    try:
        lat = ref.run(build, policy, REF_MODELS[model], n, tiles=tiles,
                      server_threads=server_threads, server_cmd=tb.server_cmd,
                      device_cmd=tb.device_cmd, server_ip=tb.server_addr)
        err = ""
    except Exception as e:
        lat, err = [], str(e).splitlines()[0][:200]
    row = {"system": build.label, **base, "policy": policy, "ref_tiles_per_layer": tiles,
           "error": err}
    if lat:
        # its first inference loads and warms like ours; drop it when there are more
        row.update(summarize(lat[1:] if len(lat) > 2 else lat))
        row["latencies_ms"] = " ".join(f"{1e3 * x:.1f}" for x in lat)
    return row


def medians_by(rows: list[dict], key: str, value: str = "median_ms", **where) -> dict:
    """{row[key]: median of row[value]} over the rows matching ``where``."""
    groups: dict = {}
    for r in rows:
        if all(r.get(k) == v for k, v in where.items()) and r.get(value) not in (None, ""):
            groups.setdefault(r[key], []).append(float(r[value]))
    return {k: statistics.median(v) for k, v in sorted(groups.items())}
