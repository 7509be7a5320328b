"""The testbed every experiment runs on: a throttled link and a slower device, on one machine.

``mode="netns"`` (root): the server and the device live in two network namespaces joined by a veth
pair (10.203.0.1 server, 10.203.0.2 device); ``tc tbf`` on each veth end shapes both directions in
the kernel. There is no ``netem`` in this kernel, so the link adds no delay: the RTT is the veth's
(tens of microseconds) plus whatever queues in the tbf. The device's processes run inside a cgroup
CPU quota with a short CFS period and are pinned to one CPU; the server is pinned to the others.

``mode="shaper"`` (no root, or no namespaces): both ends talk over loopback and coacto-client's own
token bucket (``--bandwidth``, from :meth:`Testbed.client_link_args`) caps the link; the kernel
shapes nothing, so :meth:`Testbed.measure_link` reports loopback's speed.

    with Testbed(quota=0.25) as tb:
        tb.set_link(20)                                    # Mbit/s, both directions
        server = subprocess.Popen(tb.server_cmd(["coacto-server", "--bind", "tcp://*:5555",
                                                  "--insecure"]))
        client = tb.device_cmd(["coacto-client", "--server", f"{tb.server_addr}:5555", ...]
                               + tb.client_link_args())
        row = {**tb.describe(), **tb.measure_link()}

A run that crashes leaves namespaces behind; the next Testbed with the same name removes them, and
``python experiments/testbed.py clean`` does so by hand.
"""
from __future__ import annotations

import argparse
import atexit
import errno
import fcntl
import json
import logging
import math
import os
import platform
import re
import select
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from coacto.machine import cpu_model

__all__ = ["TestbedError", "Testbed", "remove_setup"]

log = logging.getLogger("testbed")

SERVER_IP = "10.203.0.1"
DEVICE_IP = "10.203.0.2"
LOOPBACK_IP = "127.0.0.1"
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))

#: The largest frame tbf sees on the veth (1500 MTU + Ethernet header).
FRAME_BYTES = 1514
#: Bytes the tbf queue holds at least: a 256 kB tile batch plus what TCP keeps in flight behind it.
#: A smaller queue drops the batch's tail at slow rates, and TCP then waits a retransmission timeout
#: (200 ms at least) that no real link of that rate would add.
MIN_QUEUE_BYTES = 512 * 1024
#: Above ~80 Mbit/s the queue is sized in time instead, so it stays a buffer, not a 0 ms bottleneck.
QUEUE_SECONDS = 0.05

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,12}$")  # + "s0" fits IFNAMSIZ (15)
_warned: set[str] = set()


class TestbedError(RuntimeError):
    """The testbed cannot be set up, used or taken down as asked; the message says what to do."""


def _is_root() -> bool:
    return os.geteuid() == 0


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    log.debug("$ %s", shlex.join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise TestbedError(f"`{cmd[0]}` not found: install iproute2, or use mode 'shaper'") \
            from None
    if check and p.returncode != 0:
        raise TestbedError(f"`{shlex.join(cmd)}` failed (exit {p.returncode}): "
                           f"{p.stderr.strip() or p.stdout.strip()}")
    return p


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _parse_cpus(value, what: str) -> tuple[str, set[int]]:
    """A taskset CPU list ("1", "0-3,6") -> (the string, the set), each CPU checked to exist."""
    text = str(value).strip()
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            if lo_i < 0 or hi_i < lo_i:
                raise ValueError
            cpus.update(range(lo_i, hi_i + 1))
    except ValueError:
        raise TestbedError(f"{what} {value!r} is not a CPU list; write one like '1', '0-3' or "
                           "'0,2'") from None
    usable = os.sched_getaffinity(0)
    missing = sorted(cpus - usable)
    if missing:
        raise TestbedError(f"{what} {value!r} names CPU {missing[0]}, which this process cannot "
                           f"run on (usable: {_format_cpus(usable)}); pick from those")
    return text, cpus


def _format_cpus(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _netns_names() -> set[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return {line.split()[0] for line in p.stdout.splitlines() if line.strip()}


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _end_processes(pids: list[int], where: str) -> None:
    """SIGTERM, then SIGKILL after 2 s: processes left in a namespace would keep its veth alive."""
    if not pids:
        return
    log.warning("ending processes still in %s: %s", where, " ".join(map(str, pids)))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
            time.sleep(0.02)
        pids = [p for p in pids if _pid_alive(p)]
        if not pids:
            return


def _remove_netns(ns: str) -> None:
    pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split()]
    _end_processes(pids, f"namespace {ns}")
    _run(["ip", "netns", "del", ns])


def _remove_cgroup(path: Path) -> None:
    """Move what is left in the group to its parent (a populated group cannot be removed)."""
    procs, parent_procs = path / "cgroup.procs", path.parent / "cgroup.procs"
    for attempt in range(50):
        try:
            pids = procs.read_text().split()
        except FileNotFoundError:
            return
        if pids and attempt == 0:
            log.warning("processes %s are still in %s: moved to its parent (now unthrottled)",
                        " ".join(pids), path)
        for pid in pids:
            try:
                parent_procs.write_text(pid)
            except ProcessLookupError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise TestbedError(f"cannot remove cgroup {path}: {e.strerror}") from None
            time.sleep(0.02)  # an exiting task leaves the group a moment after it is reaped
    raise TestbedError(f"cgroup {path} stays busy; see `cat {procs}` and remove it with rmdir")


def _cgroup_dirs(name: str) -> list[Path]:
    """The device's group and the groups of its numbered slots, under every root we might use."""
    found = []
    for root in (CGROUP_V1_CPU, *CGROUP_V2_ROOTS):
        found.append(root / f"{name}-device")
        if root.is_dir():
            found += sorted(p for p in root.glob(f"{name}-device-*")
                            if p.name[len(name) + 8:].isdigit())
    return found


def lock_name(name: str) -> int:
    """Holds the name for this process (returns the lock's fd; closing it drops the lock): a
    second experiment started meanwhile under the same name would otherwise take our live setup
    for a stale one and tear it down. The kernel drops the lock when its holder dies, so a
    crashed run's leftovers are still cleaned up."""
    if not _NAME_RE.match(name):
        raise TestbedError(f"name {name!r}: use 1-13 letters, digits, '-' or '_'")
    folder = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(tempfile.gettempdir())
    fd = os.open(folder / f"coacto-testbed-{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise TestbedError(f"the testbed named {name!r} is in use by another experiment "
                           f"(pid {holder}): wait for it to finish, or give this one another "
                           "name (Testbed(name=...), --testbed-name)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def remove_setup(name: str = "coacto") -> list[str]:
    """Remove the namespaces, veths and cgroup a Testbed named ``name`` creates; returns what was
    found. Safe to call when nothing is there."""
    if not _NAME_RE.match(name):
        raise TestbedError(f"name {name!r}: use 1-13 letters, digits, '-' or '_'")
    removed = []
    if shutil.which("ip"):
        present = _netns_names()
        for ns in (f"{name}-srv", f"{name}-dev"):
            if ns in present:
                _remove_netns(ns)
                removed.append(f"netns {ns}")
        # A run killed between creating the veth and moving it leaves it in this namespace.
        for ifname in (f"{name}s0", f"{name}d0"):
            if Path("/sys/class/net", ifname).exists():
                _run(["ip", "link", "del", ifname])
                removed.append(f"link {ifname}")
    for path in reversed(_cgroup_dirs(name)):
        if path.is_dir() and (path / "cgroup.procs").exists():
            _remove_cgroup(path)
            removed.append(f"cgroup {path}")
    return removed


def tbf_params(mbps: float) -> dict:
    """tbf settings for ``mbps``: the burst lets the rate through at a 250 Hz timer (rate/250) and
    never less than two frames or 16 kB; the queue limit is :data:`MIN_QUEUE_BYTES` or
    :data:`QUEUE_SECONDS` of the rate, whichever is larger."""
    rate_bytes = mbps * 1e6 / 8
    burst = max(int(rate_bytes / 250), 2 * FRAME_BYTES, 16 * 1024)
    limit = max(MIN_QUEUE_BYTES, int(rate_bytes * QUEUE_SECONDS))
    return {"rate_bit": int(round(mbps * 1e6)), "burst_bytes": burst, "limit_bytes": limit,
            "queue_ms": round(limit / rate_bytes * 1e3, 1)}


class Testbed:
    """Namespaces, a shaped veth and a CPU-quota cgroup for one experiment; see the module doc."""

    def __init__(self, *, quota: float | None = 0.25, server_cpus: str = "1", device_cpu: str = "0",
                 mode: str = "auto", name: str = "coacto"):
        if mode not in ("auto", "netns", "shaper"):
            raise TestbedError(f"mode {mode!r}: use 'auto', 'netns' (needs root) or 'shaper'")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise TestbedError(f"name {name!r}: use 1-13 letters, digits, '-' or '_' (interface "
                               "names are <name>s0 and <name>d0, at most 15 characters)")
        if quota is not None:
            if isinstance(quota, bool) or not isinstance(quota, (int, float)) \
                    or not (0 < quota <= 1) or math.isnan(quota):
                raise TestbedError(f"quota {quota!r}: give the device's share of one CPU in (0, 1] "
                                   "(0.25: a device 4x slower than one core; 1 or None: no quota)")
            if quota >= 1.0:
                quota = None
        self.server_cpus, server_set = _parse_cpus(server_cpus, "server_cpus")
        self.device_cpu, device_set = _parse_cpus(device_cpu, "device_cpu")
        if server_set & device_set:
            log.warning("server and device share CPU %s: they compete for it, so the device's "
                        "speed is not the quota alone", _format_cpus(server_set & device_set))
        self.name = name
        self.quota = quota
        self.mode = ""
        self.server_addr = LOOPBACK_IP
        self.nominal_mbps: float | None = None
        self.added_rtt_ms = 0.0
        self.cgroup = "none"
        self.cgroup_dir: Path | None = None
        self._cgroup_root: Path | None = None
        self._slot_dirs: dict[int, Path] = {}
        self.cfs_period_us: int | None = None
        self.cfs_quota_us: int | None = None
        self._cgroup_note = "no quota asked for" if quota is None else ""
        self._srv_ns, self._dev_ns = f"{name}-srv", f"{name}-dev"
        self._srv_if, self._dev_if = f"{name}s0", f"{name}d0"
        self._taskset = shutil.which("taskset")
        self._closed = False
        self._owner_pid = os.getpid()
        self._prev_handlers: dict[int, object] = {}
        # Handlers first: a Ctrl-C during setup must still remove what setup made.
        self._install_signal_handlers()
        atexit.register(self.close)
        try:
            self._setup(mode)
        except BaseException:
            self.close()
            raise

    # ---- setup and teardown ---------------------------------------------------------------

    def _lock(self) -> None:
        self._lock_fd = lock_name(self.name)

    def _unlock(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)  # closing drops the flock

    def _setup(self, mode: str) -> None:
        root = _is_root()
        self._lock()
        if root:
            stale = remove_setup(self.name)
            if stale:
                log.warning("removed a stale setup named %r (a run that did not finish?): %s",
                            self.name, ", ".join(stale))
        if mode == "netns" and not root:
            raise TestbedError("mode 'netns' needs root (network namespaces, tc, cgroups): run as "
                               "root, or use mode 'shaper' (coacto-client's own token bucket)")
        if mode in ("netns", "auto") and root and not (shutil.which("ip") and shutil.which("tc")):
            if mode == "netns":
                raise TestbedError("mode 'netns' needs the `ip` and `tc` commands (iproute2); "
                                   "install it or use mode 'shaper'")
            reason = "`ip` or `tc` (iproute2) not found"
        elif mode == "auto" and not root:
            reason = "not root"
        else:
            reason = ""
        if mode == "netns" or (mode == "auto" and not reason):
            try:
                self._setup_netns()
                self.mode = "netns"
            except TestbedError as e:
                self._teardown_netns()
                if mode == "netns":
                    raise
                reason = str(e)
        if not self.mode:
            self.mode = "shaper"
            if mode == "auto":
                _warn_once(f"the testbed has no network namespaces ({reason}); falling back to "
                           "mode 'shaper': loopback, with coacto-client's --bandwidth token bucket "
                           "as the only cap (see client_link_args())")
        self._setup_cgroup(root)
        log.info("testbed %r up: mode %s, server at %s (CPUs %s), device on CPU %s, %s",
                 self.name, self.mode, self.server_addr, self.server_cpus, self.device_cpu,
                 f"quota {self.quota} ({self.cgroup}, period {self.cfs_period_us} us)"
                 if self.cgroup != "none" else f"no CPU quota ({self._cgroup_note})")

    def _setup_netns(self) -> None:
        log.info("creating namespaces %s, %s and veth %s <-> %s", self._srv_ns, self._dev_ns,
                 self._srv_if, self._dev_if)
        _run(["ip", "netns", "add", self._srv_ns])
        _run(["ip", "netns", "add", self._dev_ns])
        # Both ends are created inside their namespaces at once: nothing lands in this namespace.
        _run(["ip", "link", "add", "name", self._srv_if, "netns", self._srv_ns, "type", "veth",
              "peer", "name", self._dev_if, "netns", self._dev_ns])
        for ns, ifname, addr in ((self._srv_ns, self._srv_if, SERVER_IP),
                                 (self._dev_ns, self._dev_if, DEVICE_IP)):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", ifname])
            _run(["ip", "-n", ns, "link", "set", ifname, "up"])
            # Servers that bind 127.0.0.1 or probe themselves need loopback inside the namespace.
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # A kernel without sch_tbf fails here, while auto mode can still fall back.
        _run(["tc", "-n", self._srv_ns, "qdisc", "replace", "dev", self._srv_if, "root", "tbf",
              "rate", "1gbit", "burst", "65536", "limit", "65536"])
        _run(["tc", "-n", self._srv_ns, "qdisc", "del", "dev", self._srv_if, "root"])
        self.server_addr = SERVER_IP

    def _setup_cgroup(self, root: bool) -> None:
        if self.quota is None:
            return
        if not root:
            self._cgroup_note = "not root"
            _warn_once("the testbed is not root, so it sets no CPU quota: the device runs at "
                       "full speed")
            return
        # CFS throttles the whole group once its quota for the period is spent: at 25% of the
        # default 100 ms period the device (its network thread too) stops for 75 ms at a time,
        # which no slow CPU does. The shortest period whose quota is still the kernel's minimum
        # (1 ms) keeps those stalls to a few ms.
        self.cfs_period_us = max(1000, round(1000 / self.quota))
        self.cfs_quota_us = max(1000, round(self.cfs_period_us * self.quota))
        if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
            self.cgroup, self._cgroup_root = "v1", CGROUP_V1_CPU
        else:
            v2 = next((r for r in CGROUP_V2_ROOTS if "cpu" in _read(r / "cgroup.controllers")),
                      None)
            if v2 is not None:
                self.cgroup, self._cgroup_root = "v2", v2
        path = None
        try:
            if self._cgroup_root is None:
                raise OSError(errno.ENOENT, "no cgroup cpu controller (v1 cpu, or v2 with cpu) "
                                            "is mounted")
            if self.cgroup == "v2" and \
                    "cpu" not in _read(self._cgroup_root / "cgroup.subtree_control").split():
                (self._cgroup_root / "cgroup.subtree_control").write_text("+cpu")
            path = self._cgroup_root / f"{self.name}-device"
            self._make_cgroup(path)
            self.cgroup_dir = path
        except OSError as e:
            self.cgroup, self._cgroup_root = "none", None
            self.cfs_period_us = self.cfs_quota_us = None
            self._cgroup_note = (f"cannot set a quota in {path}: " if path else "") + e.strerror
            _warn_once(f"the testbed sets no CPU quota ({self._cgroup_note}): the device "
                       "runs at full speed")

    def _make_cgroup(self, path: Path) -> None:
        path.mkdir()
        try:
            if self.cgroup == "v1":
                (path / "cpu.cfs_quota_us").write_text("-1")  # a period below the quota is refused
                (path / "cpu.cfs_period_us").write_text(str(self.cfs_period_us))
                (path / "cpu.cfs_quota_us").write_text(str(self.cfs_quota_us))
            else:
                (path / "cpu.max").write_text(f"{self.cfs_quota_us} {self.cfs_period_us}")
        except OSError:
            path.rmdir()
            raise

    def _slot_cgroup(self, slot: int) -> Path:
        """A group of its own for device ``slot`` (several devices at once, each with the quota),
        made on first use."""
        path = self._slot_dirs.get(slot)
        if path is None:
            path = self._cgroup_root / f"{self.name}-device-{slot}"
            try:
                self._make_cgroup(path)
            except OSError as e:
                raise TestbedError(f"cannot make the cgroup {path} for device slot {slot}: "
                                   f"{e.strerror}") from None
            self._slot_dirs[slot] = path
        return path

    def _teardown_netns(self) -> None:
        present = _netns_names()
        for ns in (self._srv_ns, self._dev_ns):
            if ns in present:
                _remove_netns(ns)

    def close(self) -> None:
        """Remove the namespaces (ending processes left in them), the veths and the cgroup
        (moving processes left in it to its parent); restore the signal handlers. Idempotent."""
        # A forked child inherits atexit and the handlers, not the testbed: the parent owns it.
        if self._closed or os.getpid() != self._owner_pid:
            return
        self._closed = True
        in_main = threading.current_thread() is threading.main_thread()
        # A second Ctrl-C must not cut the teardown short; it is delivered once we are done, to
        # the handler that was there before us.
        if in_main:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        errors = []
        try:
            if getattr(self, "_lock_fd", None) is None:
                return  # refused at _lock: the setup under this name is another run's
            if self.mode != "shaper" and shutil.which("ip"):
                try:
                    self._teardown_netns()
                except TestbedError as e:
                    errors.append(str(e))
            for path in [*self._slot_dirs.values(), self.cgroup_dir]:
                if path is None:
                    continue
                try:
                    _remove_cgroup(path)
                except TestbedError as e:
                    errors.append(str(e))
            log.info("testbed %r down", self.name)
        finally:
            self._restore_signal_handlers()
            self._unlock()
            atexit.unregister(self.close)
            if in_main:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if errors:
            raise TestbedError("; ".join(errors) + f" (then `python {__file__} clean --name "
                               f"{self.name}`)")

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except TestbedError:
            if exc_type is None:
                raise
            log.exception("teardown failed while handling %s", exc_type.__name__)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.debug("not the main thread: no signal handlers; close() or atexit cleans up")
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN or prev is None:  # ignored, or set outside Python: leave it
                continue
            self._prev_handlers[sig] = prev
            signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, prev in self._prev_handlers.items():
            # A handler installed after ours (another Testbed) chains to ours; leave the chain.
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev)

    def _on_signal(self, signum, frame) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        try:
            self.close()
        except Exception:
            log.exception("teardown on signal %d failed", signum)
        if callable(prev):
            prev(signum, frame)  # Python's SIGINT handler raises KeyboardInterrupt
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ---- the link --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TestbedError(f"testbed {self.name!r} is closed; create a new Testbed")

    def set_link(self, mbps: float | None, rtt_ms: float = 0.0) -> None:
        """Shape both directions to ``mbps`` Mbit/s (None: unshaped). In netns mode this replaces
        the qdiscs in place, so it may change while processes run. ``rtt_ms``: a round-trip delay
        to add; this kernel has no `netem`, so the client adds it (half each way, after the
        cap: `coacto-client --rtt-ms`, see client_link_args) in either mode."""
        self._check_open()
        if isinstance(rtt_ms, bool) or not isinstance(rtt_ms, (int, float)) or \
                not (0 <= rtt_ms < 60_000):
            raise TestbedError(f"rtt_ms {rtt_ms!r}: give a delay from 0 to 60000 ms")
        self.added_rtt_ms = float(rtt_ms)
        if mbps is not None and (isinstance(mbps, bool) or not isinstance(mbps, (int, float))
                                 or not (0 < mbps < 1e6)):
            raise TestbedError(f"bandwidth {mbps!r} Mbit/s: give a positive number of Mbit/s "
                               "(e.g. 20) or None for an unshaped link")
        if self.mode == "netns":
            for ns, ifname in ((self._srv_ns, self._srv_if), (self._dev_ns, self._dev_if)):
                if mbps is None:
                    _run(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
                else:
                    p = tbf_params(mbps)
                    _run(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf",
                          "rate", f"{p['rate_bit']}bit", "burst", str(p["burst_bytes"]),
                          "limit", str(p["limit_bytes"])])
        self.nominal_mbps = None if mbps is None else float(mbps)
        log.info("link: %s", "unshaped" if mbps is None else f"{mbps:g} Mbit/s both directions "
                 + ("(tbf)" if self.mode == "netns" else "(coacto-client's token bucket)"))

    def client_link_args(self) -> list[str]:
        """coacto-client's arguments for this link: its own cap in shaper mode (none under kernel
        shaping), and the added round trip when one was asked for."""
        args = []
        if self.mode == "shaper" and self.nominal_mbps is not None:
            args += ["--bandwidth", f"{self.nominal_mbps:g}mbit"]
        if self.added_rtt_ms:
            args += ["--rtt-ms", f"{self.added_rtt_ms:g}"]
        return args

    def _pin(self, cpus: str, argv: list[str]) -> list[str]:
        return [self._taskset, "-c", cpus, *argv] if self._taskset else list(argv)

    def server_cmd(self, argv: list[str]) -> list[str]:
        """``argv`` run in the server namespace, pinned to ``server_cpus``."""
        self._check_open()
        if not argv:
            raise TestbedError("server_cmd needs a command to run")
        cmd = self._pin(self.server_cpus, list(argv))
        return ["ip", "netns", "exec", self._srv_ns, *cmd] if self.mode == "netns" else cmd

    def device_cmd(self, argv: list[str], *, slot: int | None = None,
                   cpus: str | None = None) -> list[str]:
        """``argv`` run in the device namespace, pinned to ``device_cpu``, inside the CPU quota
        (all its threads and children inherit it). ``slot`` (0, 1, ...): one of several devices
        run at once, in a quota of its own rather than sharing one. ``cpus``: pinned there
        instead of ``device_cpu`` (several devices on a machine with a core for each)."""
        self._check_open()
        if not argv:
            raise TestbedError("device_cmd needs a command to run")
        if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or slot < 0):
            raise TestbedError(f"slot {slot!r}: number the devices 0, 1, 2, ... (or None)")
        if cpus is None:
            cpus = self.device_cpu
        else:
            cpus, cpu_set = _parse_cpus(cpus, "the device's cpus")
            shared = cpu_set & _parse_cpus(self.server_cpus, "server_cpus")[1]
            if shared:
                log.warning("a device shares CPU %s with the server: they compete for it",
                            _format_cpus(shared))
        cmd = self._pin(cpus, list(argv))
        if self.mode == "netns":
            cmd = ["ip", "netns", "exec", self._dev_ns, *cmd]
        group = self.cgroup_dir if slot is None or self.cgroup_dir is None \
            else self._slot_cgroup(slot)
        if group is not None:
            # Joined before `ip netns exec`, which remounts /sys and so hides the cgroup tree.
            procs = shlex.quote(str(group / "cgroup.procs"))
            cmd = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]
        return cmd

    def measure_link(self, seconds: float = 1.0) -> dict:
        """Goodput each way (``seconds`` of bulk TCP each) and the median RTT of 20 small TCP round
        trips, measured between a process started by device_cmd and one started by server_cmd."""
        self._check_open()
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not (0.05 <= seconds <= 60):
            raise TestbedError(f"seconds {seconds!r}: measure for 0.05 to 60 s per direction")
        me = [sys.executable, os.path.abspath(__file__)]
        limit = 3 * seconds + 30  # two Python start-ups under the quota, and the transfers
        server = subprocess.Popen(self.server_cmd([*me, "_link-server", "--bind", self.server_addr,
                                                   "--seconds", str(seconds)]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([server.stdout], [], [], limit)
            line = server.stdout.readline() if ready else ""
            if not line.strip().isdigit():
                server.kill()
                _, err = server.communicate()
                raise TestbedError(f"the link probe's server did not start: {err.strip()[-500:]}")
            probe = subprocess.run(self.device_cmd([*me, "_link-probe", "--host", self.server_addr,
                                                    "--port", line.strip(),
                                                    "--seconds", str(seconds)]),
                                   capture_output=True, text=True, timeout=limit)
            out, err = server.communicate(timeout=limit)
            try:
                device_side, server_side = json.loads(probe.stdout), json.loads(out)
            except json.JSONDecodeError:
                raise TestbedError(f"the link probe failed (exit {probe.returncode}): "
                                   f"{(probe.stderr or err).strip()[-500:]}") from None
        except subprocess.TimeoutExpired:
            raise TestbedError(f"the link probe took over {limit:.0f} s; is the link up? "
                               f"(`python {__file__} check`)") from None
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        result = {"goodput_up_mbps": round(server_side["goodput_up_mbps"], 2),
                  "goodput_down_mbps": round(device_side["goodput_down_mbps"], 2),
                  "rtt_ms": round(device_side["rtt_ms"], 3),
                  "rtt_samples": len(device_side["rtt_samples_ms"]),
                  "seconds": seconds, "nominal_mbps": self.nominal_mbps,
                  "kernel_shaped": self.mode == "netns" and self.nominal_mbps is not None}
        log.info("measured: up %.2f Mbit/s, down %.2f Mbit/s, RTT %.3f ms (nominal %s)",
                 result["goodput_up_mbps"], result["goodput_down_mbps"], result["rtt_ms"],
                 "unshaped" if self.nominal_mbps is None else f"{self.nominal_mbps:g} Mbit/s")
        return result

    def describe(self) -> dict:
        """The settings, as a CSV row or a figure's note needs them."""
        netns = self.mode == "netns"
        shaped = self.nominal_mbps is not None
        d = {"name": self.name, "mode": self.mode, "nominal_mbps": self.nominal_mbps,
             "shaping": ("tbf both directions" if netns else "client token bucket")
             if shaped else "none",
             "measured_link": ("veth, tbf-shaped" if shaped else "veth, unshaped") if netns
             else "loopback, unshaped (the cap lives in coacto-client)",
             # no netem: a delay asked for is added by the client (client_link_args)
             "added_rtt_ms": self.added_rtt_ms,
             "server_addr": self.server_addr,
             "quota": self.quota if self.cgroup != "none" else None,
             "cfs_period_us": self.cfs_period_us, "cfs_quota_us": self.cfs_quota_us,
             "cgroup": self.cgroup}
        if self.cgroup == "none":
            d["cgroup_note"] = self._cgroup_note
        if netns and shaped:
            p = tbf_params(self.nominal_mbps)
            d.update(tbf_burst_bytes=p["burst_bytes"], tbf_limit_bytes=p["limit_bytes"],
                     tbf_queue_ms=p["queue_ms"])
        d.update(server_cpus=self.server_cpus, device_cpu=self.device_cpu,
                 pinning="taskset" if self._taskset else "none (taskset not found)",
                 kernel=platform.release(), cpu_model=cpu_model(), cpus=os.cpu_count())
        return d


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ---- the link probe: run as `testbed.py _link-server` / `_link-probe` in the two namespaces -----

_CHUNK = 64 * 1024


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = conn.recv(n - len(buf))
        if not part:
            raise ConnectionError("peer closed")
        buf += part
    return buf


def _receive_for(conn: socket.socket, seconds: float) -> float:
    """Goodput in Mbit/s: bytes received in ``seconds`` from the first byte on. Closing with data
    unread resets the connection, which stops the sender."""
    buf = bytearray(1 << 20)
    if conn.recv_into(buf) == 0:
        raise ConnectionError("sender sent nothing")
    start = last = time.perf_counter()
    total = 0
    while last - start < seconds:
        conn.settimeout(max(0.01, seconds - (last - start)))
        try:
            n = conn.recv_into(buf)
        except socket.timeout:
            break
        if n == 0:
            break
        total += n
        last = time.perf_counter()
    conn.close()
    return total * 8 / max(last - start, 1e-6) / 1e6


def _send_until_closed(conn: socket.socket, limit_s: float) -> None:
    payload = bytes(_CHUNK)
    conn.settimeout(limit_s)
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline:
            conn.sendall(payload)
    except OSError:  # the receiver's reset: its window is over
        pass


def _link_server(bind: str, seconds: float) -> int:
    with socket.create_server((bind, 0)) as srv:
        print(srv.getsockname()[1], flush=True)
        srv.settimeout(3 * seconds + 30)
        result = {}
        for _ in range(3):  # the probe's three connections: round trips, upload, download
            conn, _ = srv.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                what = _recv_exact(conn, 4)
                if what == b"RTT ":
                    while data := conn.recv(64):
                        conn.sendall(data)
                elif what == b"UP  ":
                    result["goodput_up_mbps"] = _receive_for(conn, seconds)
                elif what == b"DOWN":
                    _send_until_closed(conn, 3 * seconds + 5)
    print(json.dumps(result), flush=True)
    return 0


def _link_probe(host: str, port: int, seconds: float) -> int:
    samples = []
    with socket.create_connection((host, port), timeout=30) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sendall(b"RTT ")
        msg = bytes(32)
        for _ in range(21):  # the first round trip warms caches and is dropped
            t = time.perf_counter()
            c.sendall(msg)
            _recv_exact(c, len(msg))
            samples.append((time.perf_counter() - t) * 1e3)
    with socket.create_connection((host, port), timeout=30) as c:
        c.sendall(b"UP  ")
        _send_until_closed(c, 3 * seconds + 5)
    with socket.create_connection((host, port), timeout=30) as c:
        c.sendall(b"DOWN")
        down = _receive_for(c, seconds)
    print(json.dumps({"rtt_ms": statistics.median(samples[1:]), "rtt_samples_ms": samples[1:],
                      "goodput_down_mbps": down}))
    return 0


# ---- command line ------------------------------------------------------------------------------

def _mbps_arg(text: str) -> float | None:
    if text.lower() in ("none", "off", "unshaped"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of Mbit/s, or 'none'") from None
    if not (value > 0) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0 (or 'none' for unshaped)")
    return value


def _print_table(rows: dict) -> None:
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="testbed.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The experiments' testbed: a device and a server in two network namespaces "
                    "joined by a veth shaped with tc tbf both ways (no added delay: this kernel "
                    "has no netem), the device in a cgroup CPU quota with a short CFS period and "
                    "both pinned to CPUs. Without root: loopback, and coacto-client's own "
                    "--bandwidth cap.",
        epilog="examples:\n"
               "  # set up, measure the link at 20 Mbit/s with a 25% device, tear down\n"
               "  python experiments/testbed.py check\n"
               "  # does 5 Mbit/s really give ~5 Mbit/s? 2 s per direction\n"
               "  python experiments/testbed.py check --mbps 5 --seconds 2\n"
               "  # the bare veth, a full-speed device, as JSON for a script\n"
               "  python experiments/testbed.py check --mbps none --quota 1 --json\n"
               "  # after a crash: remove namespaces, veths and the cgroup named 'coacto'\n"
               "  python experiments/testbed.py clean\n"
               "\nexit status: 0 done, 1 the testbed failed (the message says why), 2 bad "
               "arguments, 130 interrupted")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{check,clean}")
    check = sub.add_parser("check", help="set up, measure the link, print the settings, tear down",
                           description="Set up a testbed, measure its link from the device side "
                                       "and print the settings beside the measurement.")
    check.add_argument("--mbps", type=_mbps_arg, default=20.0,
                       help="link rate in Mbit/s, both directions, or 'none' (default 20)")
    check.add_argument("--quota", type=float, default=0.25,
                       help="the device's share of one CPU, in (0, 1]; 1: no quota (default 0.25)")
    check.add_argument("--seconds", type=float, default=1.0,
                       help="bulk transfer per direction (default 1)")
    check.add_argument("--mode", choices=("auto", "netns", "shaper"), default="auto",
                       help="netns: kernel shaping (root); shaper: loopback + client cap; "
                            "auto: netns when it works (default)")
    check.add_argument("--server-cpus", default="1", help="CPUs of the server (default 1)")
    check.add_argument("--device-cpu", default="0", help="CPU of the device (default 0)")
    check.add_argument("--name", default="coacto",
                       help="prefix of namespaces, veths and cgroup (default coacto)")
    check.add_argument("--json", action="store_true", help="one JSON object on stdout")
    clean = sub.add_parser("clean", help="remove a stale setup (namespaces, veths, cgroup)")
    clean.add_argument("--name", default="coacto", help="prefix to remove (default coacto)")
    for hidden in ("_link-server", "_link-probe"):  # the link probe's two ends
        p = sub.add_parser(hidden)
        p.add_argument("--bind")
        p.add_argument("--host")
        p.add_argument("--port", type=int)
        p.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args(argv)

    if args.command == "_link-server":
        return _link_server(args.bind, args.seconds)
    if args.command == "_link-probe":
        return _link_probe(args.host, args.port, args.seconds)

    logging.basicConfig(level=logging.INFO, format="testbed: %(message)s", stream=sys.stderr)
    try:
        if args.command == "clean":
            if not _is_root():
                raise TestbedError("clean needs root (namespaces and cgroups belong to root)")
            fd = lock_name(args.name)  # never a live setup's
            try:
                removed = remove_setup(args.name)
            finally:
                os.close(fd)
            log.info("removed: %s", ", ".join(removed) or f"nothing named {args.name!r}")
            return 0
        with Testbed(quota=args.quota, server_cpus=args.server_cpus, device_cpu=args.device_cpu,
                     mode=args.mode, name=args.name) as tb:
            tb.set_link(args.mbps)
            log.info("measuring %g s each way...", args.seconds)
            measured = tb.measure_link(args.seconds)
            described = tb.describe()
        if args.json:
            print(json.dumps({"testbed": described, "link": measured}, indent=2))
        else:
            _print_table({**described, **{f"measured {k}": v for k, v in measured.items()}})
        return 0
    except TestbedError as e:
        log.error("%s", e)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted; the testbed was taken down")
        return 130


if __name__ == "__main__":
    sys.exit(main())
