"""The CoActo paper's reference implementation as a peer, on the same testbed as coacto.

The reference lives read-only in ``peers/coacto-ref/`` (its own ``README.md`` says what it is). It
is never copied into this repository: ``build()`` runs that folder's ``build.sh`` into a cache
folder outside the repository, and ``run()`` starts one reference server and one reference client
through the same command prefixes (network namespaces, CPU-quota cgroup, CPU pinning) that the
coacto runs use, and returns the client's per-inference latencies.

What to know when reading its numbers:

- Its compute threads (``--dse_num``) and its send thread busy-wait, so each process wants
  ``threads + 1`` cores to itself. On this 2-core machine the stock build slows itself down; the
  ``-yield`` build (a ``sched_yield()`` in those loops) is therefore the default. Every result says
  which build it used (``label``).
- It measures the link's bandwidth and RTT once, at start-up, and never again: shape the link
  *before* calling ``run()``.
- Its weights are random (its real ones are not distributable); compare latencies of the same
  architecture and batch size, random weights on both sides.
- It prints no outputs, so there is no correctness check, only latencies: the client's
  ``Time measurement run_aspen (i): T - ELAPSED`` lines, one per inference. Its ``local`` policy
  prints no such line, only a mean (``Time taken: X seconds``), so ``run()`` starts it once per
  inference to get one latency each.
- ``fl`` (its fused-layer program ``main_fl``) works for resnet50 and vgg16 only; on bert_base
  it never finishes, so ``run()`` refuses it.
- Ports: the server listens on ``port + 9`` (control) and ``port`` (tiles); ``main_fl`` on
  ``port + 1`` and ``port``. ``port=None`` picks a free block.

The CLI runs on loopback with the server pinned to CPU 1 and the client to CPU 0
(``--server-cpus`` / ``--client-cpus``; '' for no pinning). Examples::

    python experiments/peer_coacto_ref.py build
    python experiments/peer_coacto_ref.py run --policy dynamic --model resnet50 -n 3
    python experiments/peer_coacto_ref.py run --policy cloud --model bert -n 5 --json
    python experiments/peer_coacto_ref.py run --policy fl --model vgg16 -n 3 --stock

From Python::

    from peer_coacto_ref import build, run
    b = build()
    lat = run(b, "dynamic", "resnet50", 5,
              server_cmd=lambda a: ["taskset", "-c", "1", *a],
              device_cmd=lambda a: ["taskset", "-c", "0", *a])
    print(lat, lat.label, lat.nasm)
"""

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from coacto.machine import cpu_model

log = logging.getLogger("coacto.peer.coacto_ref")

_REPO = Path(__file__).resolve().parents[1]

#: Where the reference's folder is looked for (the first that exists), unless $COACTO_REF_SRC.
_SRC_CANDIDATES = (_REPO.parent / "shared" / "peers" / "coacto-ref", Path("/work/shared/peers/coacto-ref"))

#: The reference's ``SCHEDULE_MAX_DEVICES``: its server listens for control on ``port + 9``.
_MAX_DEVICES = 9

#: coacto's policy names (and the reference's own) -> the reference's ``--schedule_policy``.
#: ``fl`` is not a policy of the ``coacto`` binary but its separate fused-layer program ``main_fl``.
POLICY_MAP = {
    "dynamic": "dynamic",
    "local": "local",
    "conventional": "conventional",
    "cloud": "conventional",
    "spinn": "spinn",
    "split": "spinn",
    "fl": "main_fl",
    "main_fl": "main_fl",
}

#: coacto zoo names (and the reference's own) -> the reference's model names.
MODEL_MAP = {
    "resnet50": "resnet50",
    "vgg16": "vgg16",
    "bert": "bert_base",
    "bert_base": "bert_base",
}

_LATENCY_RE = re.compile(r"run_aspen \((\d+)\): ([0-9.]+) - ([0-9.]+)")
_MEAN_RE = re.compile(r"Time taken: ([0-9.]+) seconds")
_NASM_RE = re.compile(r"^(?P<model>.+)_B1_T(?P<tiles>\d+)\.nasm$")


class RefError(RuntimeError):
    """The reference failed to build or to run; the message quotes the relevant log tails."""


@dataclass(frozen=True)
class RefBuild:
    """A built reference: ``stock`` and ``yield_`` are the two build folders (binaries ``coacto``
    and ``main_fl``, shared ``data/`` with the random-weight models and the tile graphs)."""

    stock: Path
    yield_: Path
    commit: str

    def dir(self, yield_build: bool = True) -> Path:
        return self.yield_ if yield_build else self.stock

    def label_for(self, yield_build: bool = True) -> str:
        return f"coacto-ref {self.commit} (x86 AVX2 build, {'yield' if yield_build else 'stock'})"

    @property
    def label(self) -> str:
        """The label of the default (yield) build."""
        return self.label_for(True)

    @property
    def data(self) -> Path:
        return self.stock / "data"


class RefLatencies(list):
    """Per-inference client latencies in seconds (a plain ``list[float]``), with what produced
    them: the policy and model asked for and what they mapped to, the tile graph, the build."""

    def __init__(self, values: Iterable[float], **meta):
        super().__init__(values)
        self.meta = meta
        for k, v in meta.items():
            setattr(self, k, v)


# --------------------------------------------------------------------------------------------
# pure helpers (tested without a build)


def source_dir() -> Path:
    env = os.environ.get("COACTO_REF_SRC")
    if env:
        return Path(env)
    for p in _SRC_CANDIDATES:
        if (p / "build.sh").exists():
            return p
    raise RefError("the reference's folder (peers/coacto-ref with build.sh) was not found; "
                   "set $COACTO_REF_SRC")


def map_policy(policy: str) -> str:
    """The reference's name for ``policy`` (``main_fl`` for the fused-layer baseline)."""
    try:
        return POLICY_MAP[policy.lower()]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; one of {sorted(POLICY_MAP)}") from None


def map_model(model: str) -> str:
    try:
        return MODEL_MAP[model.lower()]
    except KeyError:
        raise ValueError(f"unknown model {model!r}; one of {sorted(MODEL_MAP)}") from None


def available_tiles(model: str, names: Iterable[str]) -> list[int]:
    """Tile counts of ``{model}_B1_T{n}.nasm`` among file ``names`` (batch 1 only), sorted."""
    out = set()
    for name in names:
        m = _NASM_RE.match(name)
        if m and m["model"] == model:
            out.add(int(m["tiles"]))
    return sorted(out)


def nearest_tiles(wanted: int, available: Sequence[int]) -> int:
    """The available tile count nearest ``wanted``; on a tie the larger (finer tiles are what the
    reference is built around)."""
    if not available:
        raise ValueError("no tile graph available")
    return min(available, key=lambda t: (abs(t - wanted), -t))


def parse_latencies(text: str) -> list[float]:
    """Per-inference latencies (s) from the ``run_aspen (i): T - ELAPSED`` lines, in order of i."""
    found = {int(i): float(el) for i, _, el in _LATENCY_RE.findall(text)}
    return [found[i] for i in sorted(found)]


def parse_mean(text: str) -> float | None:
    """The ``Time taken: X seconds`` mean that its ``local`` policy prints instead."""
    m = _MEAN_RE.findall(text)
    return float(m[-1]) if m else None


def _tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(lines[-n:]) if lines else "(empty)"


# --------------------------------------------------------------------------------------------
# build


def default_cache_dir() -> Path:
    env = os.environ.get("COACTO_REF_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "coacto" / "coacto-ref-build"


def source_stamp(src: Path) -> str:
    """A hash of what the build depends on: build.sh and the patch (contents), upstream/'s file
    list with sizes and mtimes, and the CPU model."""
    h = hashlib.sha256()
    for name in ("build.sh", "x86-loopback.patch"):
        h.update(name.encode() + b"\0" + (src / name).read_bytes())
    up = src / "upstream"
    for p in sorted(up.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(up)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    # The reference compiles with -march=native: a build is only good for this kind of CPU.
    h.update(cpu_model().encode())
    return h.hexdigest()


def _commit(src: Path) -> str:
    try:
        m = re.search(r"commit ([0-9a-f]{7,40})", (src / "README.md").read_text())
    except OSError:
        m = None
    return m.group(1) if m else "unknown"


def _complete(d: Path, yd: Path) -> bool:
    need = [d / "coacto", d / "main_fl", yd / "coacto", yd / "main_fl", d / "data" / "batched_input_128.bin"]
    need += [d / "data" / f"{m}_base.aspen" for m in set(MODEL_MAP.values())]
    return all(p.exists() for p in need)


def build(cache_dir: Path | None = None, force: bool = False) -> RefBuild:
    """Build the reference (stock and yield) into ``cache_dir`` unless an up-to-date build is
    there. ``cache_dir`` defaults to $COACTO_REF_CACHE or ~/.cache/coacto/coacto-ref-build; the
    yield build goes to ``cache_dir``-yield and the build log to ``cache_dir``.log."""
    src = source_dir()
    d = Path(cache_dir) if cache_dir else default_cache_dir()
    d = d.expanduser().absolute()
    yd = d.with_name(d.name + "-yield")
    stamp_file = d / ".coacto-ref-stamp"
    stamp = source_stamp(src)
    result = RefBuild(stock=d, yield_=yd, commit=_commit(src))

    d.parent.mkdir(parents=True, exist_ok=True)
    # build.sh starts with `rm -rf DIR DIR-yield`: two builds into one folder at once would wreck
    # each other, so they take turns (and the second then finds the first's build up to date).
    with open(d.with_name(d.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (not force and stamp_file.exists() and stamp_file.read_text().strip() == stamp
                and _complete(d, yd)):
            log.info("reference build in %s is up to date", d)
            return result
        logf = d.with_name(d.name + ".log")
        print(f"building the CoActo reference ({src}) into {d} and {yd}: about 2 minutes and "
              f"1 GB; log in {logf}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with open(logf, "w") as out:
            rc = subprocess.call(["bash", str(src / "build.sh"), str(d)], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if rc != 0 or not _complete(d, yd):
            raise RefError(f"building the reference failed (exit {rc}); last lines of {logf}:\n"
                           f"{_tail(logf, 30)}")
        stamp_file.write_text(stamp + "\n")
        log.info("built the reference in %.0f s", time.monotonic() - t0)
        print(f"built in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return result


# --------------------------------------------------------------------------------------------
# run


def _ports_free(base: int, offsets: Iterable[int]) -> bool:
    for off in offsets:
        with socket.socket() as s:
            try:
                s.bind(("", base + off))
            except OSError:
                return False
    return True


def free_port_block(offsets: Sequence[int] = (0, _MAX_DEVICES)) -> int:
    """A base port such that ``base + o`` is free for every offset (the reference binds fixed
    offsets from its base port and asserts if one is taken)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("", 0))
            base = s.getsockname()[1]
        if base + max(offsets) < 65536 and _ports_free(base, offsets):
            return base
    raise RefError("no free block of ports found")


def _proc_tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo.extend(int(k) for k in kids)
        except OSError:
            pass
    return out


def _socket_inodes(pids: Iterable[int]) -> set[str] | None:
    """Inodes of the sockets the processes hold open; None if their fds cannot be read."""
    out, readable = set(), False
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        readable = True
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    return out if readable else None


def _listening(pid: int, port: int) -> bool:
    """Whether a process in ``pid``'s tree listens on ``port``. Read from /proc/PID/net/tcp, which
    shows that process's own network namespace (the server may run in another one), and without
    connecting: the reference would take a probe connection for its edge device. The table lists
    every socket of the namespace, so the socket's inode must be one the tree holds: another
    program on the port would otherwise pass for the server (which then dies on bind())."""
    want = f":{port:04X}"
    pids = _proc_tree(pid)
    inodes = _socket_inodes(pids)
    for p in pids:
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{p}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if (len(f) > 9 and f[1].endswith(want) and f[3] == "0A"
                        and (inodes is None or f[9] in inodes)):
                    return True
    return False


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End a process started in its own session, with everything it started (wrappers such as
    `timeout` or `ip netns exec` leave the real program as a child)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _stdbuf(argv: list[str]) -> list[str]:
    # Line-buffered stdout, so the log holds what it printed even when it dies on an assert or
    # is killed on a timeout (its printf output to a file is otherwise block-buffered).
    sb = shutil.which("stdbuf")
    return [sb, "-oL", "-eL", *argv] if sb else argv


def _start(argv: list[str], cwd: Path, logf: Path) -> subprocess.Popen:
    log.debug("starting %s (cwd %s)", " ".join(argv), cwd)
    with open(logf, "w") as out:
        return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _coacto_argv(b: Path, policy: str, model: str, nasm: str, n: int, threads: int, mode: int,
                 server_ip: str, port: int) -> list[str]:
    # Paths relative to the process's folder (run_dir/side/w), where ../../data links to the
    # build's data: its per-inference CSV logs then land in the run folder, not the shared build.
    return [str(b / "coacto"), f"--device_mode={mode}", f"--dse_num={threads}",
            f"--dirname=pair_{policy}", f"--prefix={model}",
            f"--target_dnn_dir=../../data/{model}_base.aspen",
            f"--target_nasm_dir=../../data/{nasm}.nasm",
            "--target_input=../../data/batched_input_128.bin",
            f"--server_ip={server_ip}", f"--server_port={port}", f"--schedule_policy={policy}",
            f"--inference_repeat_num={n}", "--num_edge_devices=1"]


def _fl_argv(b: Path, model: str, tiles: int, n: int, threads: int, mode: int, server_ip: str,
             port: int) -> list[str]:
    # main_fl's nine positional arguments: it then finds the fused-layer split itself (profiles
    # both sides and the link, brute-forces the paths). It reads ../../data/{model}_B1_T{tiles}.
    return [str(b / "main_fl"), "fl", model, "1", str(tiles), str(n), str(threads), str(mode),
            server_ip, str(port)]


def run(build: RefBuild, policy: str, model: str, n: int, *, tiles: int = 100,
        server_threads: int = 1, client_threads: int = 1, yield_build: bool = True,
        server_cmd: Callable[[list[str]], list[str]] = lambda argv: argv,
        device_cmd: Callable[[list[str]], list[str]] = lambda argv: argv,
        server_ip: str = "127.0.0.1", port: int | None = None, timeout: float = 600,
        log_dir: Path | None = None) -> RefLatencies:
    """Run ``n`` inferences of ``model`` with ``policy`` on one reference server and one client;
    return the client's per-inference latencies (s).

    ``policy``: dynamic | local | conventional | spinn, or coacto's cloud (-> conventional),
    split (-> spinn), fl (-> the ``main_fl`` fused-layer program). ``model``: resnet50 | vgg16 |
    bert_base (or coacto's ``bert``). ``tiles``: tiles per layer; the nearest tile graph shipped
    is used (``.tiles`` on the result). ``server_cmd`` / ``device_cmd`` wrap the server's and the
    client's argv (namespaces, cgroup, pinning); ``server_ip`` is the address the client dials.
    ``timeout`` bounds the whole run (s). Its console logs stay in ``log_dir`` (default a new
    temporary folder; ``.log_dir`` on the result); the per-tile CSVs it also writes (about 10 MB a
    run) are kept only when ``log_dir`` is given."""
    if n < 1:
        raise ValueError("n must be at least 1")
    ref_policy, ref_model = map_policy(policy), map_model(model)
    if ref_policy == "main_fl" and ref_model == "bert_base":
        # Both of its processes spin forever in the first inference (20 and 50 tiles alike): its
        # fused-layer paths are built for CNNs.
        raise ValueError("the reference's main_fl does not finish on bert_base; use resnet50 or vgg16")
    b = build.dir(yield_build)
    avail = available_tiles(ref_model, os.listdir(build.data))
    if not avail:
        raise RefError(f"no {ref_model}_B1_T*.nasm in {build.data}")
    t = nearest_tiles(tiles, avail)
    if t != tiles:
        log.warning("no %s tile graph with %d tiles per layer; using %d (shipped: %s)",
                    ref_model, tiles, t, avail)
    nasm = f"{ref_model}_B1_T{t}"
    if ref_policy != policy:
        log.info("policy %s is the reference's %s", policy, ref_policy)

    run_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="coacto-ref-run-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    link = run_dir / "data"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(build.data.resolve())
    for side in ("server", "client"):
        (run_dir / side / "w").mkdir(parents=True, exist_ok=True)

    deadline = time.monotonic() + timeout
    meta = dict(policy=ref_policy, policy_asked=policy, model=ref_model, model_asked=model,
                tiles=t, tiles_asked=tiles, nasm=nasm, build=str(b),
                label=build.label_for(yield_build), server_threads=server_threads,
                client_threads=client_threads, port=port, log_dir=str(run_dir))

    try:
        return _run_pair(b, ref_policy, ref_model, nasm, t, n, server_threads, client_threads,
                         server_cmd, device_cmd, server_ip, port, timeout, deadline, run_dir, meta)
    finally:
        if log_dir is None:
            for side in ("server", "client"):
                shutil.rmtree(run_dir / side / "w" / "logs", ignore_errors=True)


def _run_pair(b, ref_policy, ref_model, nasm, t, n, server_threads, client_threads, server_cmd,
              device_cmd, server_ip, port, timeout, deadline, run_dir, meta) -> RefLatencies:
    slog, clog = run_dir / "server.log", run_dir / "client.log"
    if ref_policy == "local":
        meta.update(server_threads=0, port=None)  # no server: the device alone
        lat = _run_local(b, ref_model, nasm, n, client_threads, device_cmd, run_dir, clog, deadline)
        return RefLatencies(lat, **meta)

    ctrl_off = 1 if ref_policy == "main_fl" else _MAX_DEVICES
    if port is None:
        port = meta["port"] = free_port_block((0, ctrl_off))

    def argv(mode: int, threads: int) -> list[str]:
        if ref_policy == "main_fl":
            return _fl_argv(b, ref_model, t, n, threads, mode, server_ip, port)
        return _coacto_argv(b, ref_policy, ref_model, nasm, n, threads, mode, server_ip, port)

    server = _start(server_cmd(_stdbuf(argv(0, server_threads))), run_dir / "server" / "w", slog)
    client = None
    try:
        _wait_listening(server, port + ctrl_off, slog, deadline)
        client = _start(device_cmd(_stdbuf(argv(1, client_threads))), run_dir / "client" / "w", clog)
        rc = _wait_client(client, server, deadline)
        if rc is None:
            _kill_group(client)
            raise RefError(_failure(f"the client did not finish within {timeout:.0f} s", slog, clog))
        if rc == "server":
            _kill_group(client)
            raise RefError(_failure(f"the server exited ({server.returncode}) while the client "
                                    f"was still running", slog, clog))
        lat = parse_latencies(clog.read_text(errors="replace"))
        if rc != 0 or len(lat) == 0:
            raise RefError(_failure(f"the client exited with {rc} and printed {len(lat)} latencies",
                                    slog, clog))
        if len(lat) != n:
            log.warning("asked for %d inferences, the client printed %d latencies", n, len(lat))
        # The server finishes on its own once the client is done; give it a moment before the
        # finally below ends it.
        try:
            server.wait(min(10.0, max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            log.debug("server still running after the client finished; ending it")
        return RefLatencies(lat, **meta)
    finally:
        if client is not None:
            _kill_group(client)
        _kill_group(server)


def _wait_client(client: subprocess.Popen, server: subprocess.Popen, deadline: float):
    """The client's exit status; None on the deadline; "server" if the server ended and the client
    did not follow within a grace period (it asserts on a closed connection, but a client still
    connecting or profiling would otherwise wait out the whole timeout)."""
    server_gone = None
    while True:
        rc = client.poll()
        if rc is not None:
            return rc
        now = time.monotonic()
        if now >= deadline:
            return None
        if server_gone is None and server.poll() is not None:
            server_gone = now
        if server_gone is not None and now - server_gone > 15.0:
            return "server"
        time.sleep(0.05)


def _wait_listening(server: subprocess.Popen, port: int, slog: Path, deadline: float) -> None:
    # It opens its control port before loading the model, so this takes well under a second; the
    # bound only guards a wrapper that hides the process tree (the client retries connecting).
    limit = min(deadline, time.monotonic() + 30.0)
    while time.monotonic() < limit:
        if server.poll() is not None:
            raise RefError(f"the server exited with {server.returncode} before listening on port "
                           f"{port}; last lines of {slog}:\n{_tail(slog)}")
        if _listening(server.pid, port):
            return
        time.sleep(0.05)
    log.warning("did not see the server listening on port %d; starting the client anyway", port)


def _run_local(b: Path, model: str, nasm: str, n: int, threads: int,
               device_cmd: Callable[[list[str]], list[str]], run_dir: Path, clog: Path,
               deadline: float) -> list[float]:
    # Its local policy prints only the mean over its inferences, so it runs once per inference.
    # Started as --device_mode=0 it first runs its computation-profiling pass (one whole
    # inference; as device 1 it skips it), so each timed inference is warm like the offloaded
    # modes' are: a cold first inference is ~15% slower (ResNet-50: 146 vs 125 ms). With the
    # local policy the mode only picks the device slot (0, the one an edge gets); nothing listens.
    out = []
    for i in range(n):
        argv = _coacto_argv(b, "local", model, nasm, 1, threads, 0, "127.0.0.1", 1)
        logi = clog.with_name(f"client.{i}.log")
        proc = _start(device_cmd(_stdbuf(argv)), run_dir / "client" / "w", logi)
        try:
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RefError(f"the local run {i} did not finish in time; last lines of {logi}:\n"
                           f"{_tail(logi)}")
        finally:
            _kill_group(proc)
        mean = parse_mean(logi.read_text(errors="replace"))
        if rc != 0 or mean is None:
            raise RefError(f"the local run {i} exited with {rc} and printed no latency; last "
                           f"lines of {logi}:\n{_tail(logi)}")
        out.append(mean)
    shutil.copyfile(clog.with_name("client.0.log"), clog)
    return out


def _failure(what: str, slog: Path, clog: Path) -> str:
    return (f"{what}.\n--- last lines of {clog}:\n{_tail(clog)}\n"
            f"--- last lines of {slog}:\n{_tail(slog)}")


# --------------------------------------------------------------------------------------------
# CLI


def _pin(cpus: str | None) -> Callable[[list[str]], list[str]]:
    if not cpus:
        return lambda argv: argv
    return lambda argv: ["taskset", "-c", cpus, *argv]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pb = sub.add_parser("build", help="build the reference (stock and yield) into the cache")
    pb.add_argument("--cache-dir", type=Path, default=None,
                    help="default $COACTO_REF_CACHE or ~/.cache/coacto/coacto-ref-build")
    pb.add_argument("--force", action="store_true", help="rebuild even if up to date")
    pr = sub.add_parser("run", help="run one server and one client on loopback; print latencies",
                        epilog="e.g. run --policy dynamic --model resnet50 -n 3 --json")
    pr.add_argument("--cache-dir", type=Path, default=None)
    pr.add_argument("--policy", default="dynamic", help=f"one of {sorted(POLICY_MAP)}")
    pr.add_argument("--model", default="resnet50", help=f"one of {sorted(MODEL_MAP)}")
    pr.add_argument("-n", type=int, default=3, help="inferences")
    pr.add_argument("--tiles", type=int, default=100, help="tiles per layer (nearest shipped graph)")
    pr.add_argument("--server-threads", type=int, default=1)
    pr.add_argument("--client-threads", type=int, default=1)
    pr.add_argument("--server-cpus", default="1", help="taskset list for the server ('' = none)")
    pr.add_argument("--client-cpus", default="0", help="taskset list for the client ('' = none)")
    pr.add_argument("--stock", action="store_true", help="the stock (busy-waiting) build")
    pr.add_argument("--server-ip", default="127.0.0.1")
    pr.add_argument("--port", type=int, default=None, help="base port (default: a free block)")
    pr.add_argument("--timeout", type=float, default=600)
    pr.add_argument("--log-dir", type=Path, default=None)
    pr.add_argument("--json", action="store_true", help="one JSON object on stdout")
    pr.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")

    b = build(args.cache_dir, force=getattr(args, "force", False))
    if args.cmd == "build":
        print(f"{b.label_for(False)}: {b.stock}\n{b.label_for(True)}: {b.yield_}")
        return 0
    try:
        lat = run(b, args.policy, args.model, args.n, tiles=args.tiles,
                  server_threads=args.server_threads, client_threads=args.client_threads,
                  yield_build=not args.stock, server_cmd=_pin(args.server_cpus),
                  device_cmd=_pin(args.client_cpus), server_ip=args.server_ip, port=args.port,
                  timeout=args.timeout, log_dir=args.log_dir)
    except (RefError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"latencies_s": list(lat), **lat.meta,
                          "server_cpus": args.server_cpus, "client_cpus": args.client_cpus}))
    else:
        print(lat.label)
        print(f"{lat.policy_asked} -> {lat.policy}, {lat.model_asked} -> {lat.nasm}, "
              f"threads server {lat.server_threads} / client {lat.client_threads}")
        for x in lat:
            print(f"latency_s {x:.6f}")
        print(f"mean {sum(lat) / len(lat) * 1e3:.1f} ms over {len(lat)}; logs in {lat.log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
