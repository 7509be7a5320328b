"""experiments/testbed.py: namespaces, veths, tbf shaping, the device cgroup, pinning, cleanup."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def load():
    spec = importlib.util.spec_from_file_location("testbed", EXPERIMENTS / "testbed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


testbed = load()
CPUS = sorted(os.sched_getaffinity(0))
DEVICE_CPU, SERVER_CPU = str(CPUS[0]), str(CPUS[-1])


@pytest.fixture
def name():
    # Unique per test, so a test never touches a real run's "coacto" setup or another test's.
    return "cxt" + uuid.uuid4().hex[:7]


def leftovers(name: str) -> list[str]:
    found = []
    if shutil.which("ip"):
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found += [line for line in netns.splitlines() if line.startswith(f"{name}-")]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        found += [f"link {i}" for i in (f"{name}s0", f"{name}d0") if f" {i}" in links]
    found += [str(p) for p in testbed._cgroup_dirs(name) if p.exists()]
    return found


@pytest.fixture
def netns_name(name):
    """A name for a netns-mode testbed; skips where namespaces cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("netns mode needs root (network namespaces, tc, cgroups)")
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("netns mode needs iproute2's `ip` and `tc`")
    probe = subprocess.run(["ip", "netns", "add", f"{name}-srv"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"`ip netns add` does not work here: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", f"{name}-srv"], check=True)
    yield name
    left = leftovers(name)
    testbed.remove_setup(name)  # whatever a failing test left behind
    assert not left, f"left behind: {left}"


def netns_testbed(name, **kw):
    kw.setdefault("server_cpus", SERVER_CPU)
    kw.setdefault("device_cpu", DEVICE_CPU)
    return testbed.Testbed(mode="netns", name=name, **kw)


def ns_run(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                          check=True).stdout


def wait_exec(pid: int, comm: str) -> None:
    """Until the wrappers (sh, ip netns exec, taskset) have exec'd into ``comm``."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/comm").read_text().strip() != comm:
        assert time.monotonic() < deadline, f"pid {pid} never became {comm}"
        time.sleep(0.01)


def test_netns_setup_and_teardown(netns_name):
    with netns_testbed(netns_name, quota=0.25) as tb:
        assert tb.mode == "netns" and tb.server_addr == "10.203.0.1"
        srv, dev = f"{netns_name}-srv", f"{netns_name}-dev"
        assert {srv, dev} <= testbed._netns_names()
        assert "10.203.0.1/30" in ns_run(srv, "ip", "-o", "addr", "show", f"{netns_name}s0")
        assert "10.203.0.2/30" in ns_run(dev, "ip", "-o", "addr", "show", f"{netns_name}d0")
        assert ",UP" in ns_run(srv, "ip", "-o", "link", "show", "lo")
        d = tb.describe()
        assert d["cgroup"] in ("v1", "v2") and d["cfs_period_us"] == 4000
        assert d["cfs_quota_us"] == 1000 and d["quota"] == 0.25
        if d["cgroup"] == "v1":
            assert (tb.cgroup_dir / "cpu.cfs_period_us").read_text().strip() == "4000"
            assert (tb.cgroup_dir / "cpu.cfs_quota_us").read_text().strip() == "1000"
        assert d["shaping"] == "none" and d["kernel"] and d["cpu_model"]
        assert leftovers(netns_name)
    assert leftovers(netns_name) == []
    tb.close()  # idempotent
    with pytest.raises(testbed.TestbedError, match="closed"):
        tb.set_link(5)


def qdisc(tb, side: str) -> str:
    ns, ifname = (tb._srv_ns, tb._srv_if) if side == "srv" else (tb._dev_ns, tb._dev_if)
    return subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", ifname], capture_output=True,
                          text=True, check=True).stdout


def test_shaping_limits_goodput_and_changes_in_place(netns_name):
    with netns_testbed(netns_name, quota=None) as tb:
        tb.set_link(8)
        before = qdisc(tb, "srv")
        assert "tbf" in before and "rate 8Mbit" in before and "rate 8Mbit" in qdisc(tb, "dev")
        slow = tb.measure_link(1.0)
        for way in ("goodput_up_mbps", "goodput_down_mbps"):
            assert 0.6 * 8 <= slow[way] <= 1.1 * 8, slow
        assert 0 < slow["rtt_ms"] < 50 and slow["rtt_samples"] == 20
        tb.set_link(40)
        after = qdisc(tb, "srv")
        assert "rate 40Mbit" in after and "rate 40Mbit" in qdisc(tb, "dev")
        assert after.split()[2] == before.split()[2]  # same qdisc handle: changed, not recreated
        fast = tb.measure_link(0.5)
        for way in ("goodput_up_mbps", "goodput_down_mbps"):
            assert 2.5 * slow[way] < fast[way] <= 1.1 * 40, (slow, fast)
        assert tb.describe()["shaping"] == "tbf both directions"
        tb.set_link(None)
        assert "tbf" not in qdisc(tb, "srv") and tb.client_link_args() == []


def test_device_and_server_commands_are_confined(netns_name):
    with netns_testbed(netns_name, quota=0.25) as tb:
        device = subprocess.Popen(tb.device_cmd(["sleep", "30"]))
        second = subprocess.Popen(tb.device_cmd(["sleep", "30"], slot=1))
        server = subprocess.Popen(tb.server_cmd(["sleep", "30"]))
        try:
            for proc in (device, second, server):
                wait_exec(proc.pid, "sleep")
            cgroups = [Path(f"/proc/{p.pid}/cgroup").read_text() for p in (device, second, server)]
            assert f"/{netns_name}-device\n" in cgroups[0]
            assert f"/{netns_name}-device-1\n" in cgroups[1]  # a quota of its own
            assert f"/{netns_name}-device" not in cgroups[2]
            assert os.sched_getaffinity(device.pid) == os.sched_getaffinity(second.pid) \
                == {int(DEVICE_CPU)}
            assert os.sched_getaffinity(server.pid) == {int(SERVER_CPU)}
            for proc, ns in ((device, "dev"), (second, "dev"), (server, "srv")):
                assert os.stat(f"/proc/{proc.pid}/ns/net").st_ino == \
                    os.stat(f"/run/netns/{netns_name}-{ns}").st_ino
        finally:
            for proc in (device, second, server):
                proc.kill()
                proc.wait()
        if tb.cgroup == "v1":
            # A busy process really is throttled: every thread and child inherits the quota.
            busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.2: pass"
            subprocess.run(tb.device_cmd([sys.executable, "-c", busy]), check=True, timeout=30)
            stat = dict(line.split() for line in
                        (tb.cgroup_dir / "cpu.stat").read_text().splitlines())
            assert int(stat["nr_throttled"]) > 0, stat


def test_exception_in_with_block_cleans_up(netns_name):
    with pytest.raises(ZeroDivisionError):
        with netns_testbed(netns_name) as tb:
            tb.set_link(5)
            1 / 0
    assert leftovers(netns_name) == []


def test_stale_setup_is_removed(netns_name):
    subprocess.run(["ip", "netns", "add", f"{netns_name}-srv"], check=True)
    subprocess.run(["ip", "link", "add", f"{netns_name}s0", "type", "veth", "peer", "name",
                    f"{netns_name}d0"], check=True)
    stale_cgroup = testbed.CGROUP_V1_CPU / f"{netns_name}-device"
    if testbed.CGROUP_V1_CPU.joinpath("cgroup.procs").exists():
        stale_cgroup.mkdir()
        stale_cgroup.with_name(f"{netns_name}-device-3").mkdir()  # a device slot's group
    orphan = subprocess.Popen(["ip", "netns", "exec", f"{netns_name}-srv", "sleep", "30"])
    try:
        wait_exec(orphan.pid, "sleep")
        with netns_testbed(netns_name) as tb:
            assert orphan.wait(timeout=5) != 0  # a process of the crashed run, ended
            tb.set_link(20)
            assert tb.measure_link(0.2)["goodput_up_mbps"] > 5
    finally:
        orphan.kill()
        orphan.wait()
    assert leftovers(netns_name) == []


def test_a_live_setup_is_not_taken_for_a_stale_one(netns_name):
    with netns_testbed(netns_name) as tb:
        with pytest.raises(testbed.TestbedError, match="in use by another experiment"):
            netns_testbed(netns_name)
        clean = subprocess.run([sys.executable, str(EXPERIMENTS / "testbed.py"), "clean", "--name",
                                netns_name], capture_output=True, text=True)
        assert clean.returncode != 0 and "in use" in clean.stderr
        tb.set_link(20)  # still ours, still working
        assert tb.measure_link(0.2)["goodput_up_mbps"] > 5
    with netns_testbed(netns_name):  # free again once the first is closed
        pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_cleans_up(netns_name, sig):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(EXPERIMENTS)!r})
        import testbed
        tb = testbed.Testbed(mode="netns", name={netns_name!r}, server_cpus={SERVER_CPU!r},
                             device_cpu={DEVICE_CPU!r})
        tb.set_link(10)
        print("ready", flush=True)
        time.sleep(30)
    """)
    # a shell that started this run in the background may have left SIGINT ignored, which the
    # child would inherit (and the testbed rightly leaves alone): undo that for the child
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        assert leftovers(netns_name)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert leftovers(netns_name) == [], err
    if sig == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM and "Traceback" not in err, err


def test_shaper_mode_caps_in_the_client(name):
    from coacto.mobile.shaper import parse_rate

    with testbed.Testbed(mode="shaper", quota=None, name=name, server_cpus=SERVER_CPU,
                         device_cpu=DEVICE_CPU) as tb:
        assert tb.mode == "shaper" and tb.server_addr == "127.0.0.1"
        assert tb.client_link_args() == []
        tb.set_link(20)
        assert tb.client_link_args() == ["--bandwidth", "20mbit"]
        tb.set_link(2.5)
        assert parse_rate(tb.client_link_args()[1]) == 2.5e6 / 8
        d = tb.describe()
        assert d["shaping"] == "client token bucket" and "unshaped" in d["measured_link"]
        assert tb.server_cmd(["x"])[-1] == "x" and "netns" not in tb.server_cmd(["x"])
        m = tb.measure_link(0.1)
        assert m["goodput_up_mbps"] > 0 and m["rtt_ms"] > 0 and not m["kernel_shaped"]
        tb.set_link(None)
        assert tb.client_link_args() == []
        # no netem: an added round trip is the client's to emulate, in either mode
        tb.set_link(20, rtt_ms=40)
        assert tb.client_link_args() == ["--bandwidth", "20mbit", "--rtt-ms", "40"]
        assert tb.describe()["added_rtt_ms"] == 40
        tb.set_link(None, rtt_ms=10)
        assert tb.client_link_args() == ["--rtt-ms", "10"]
        with pytest.raises(testbed.TestbedError, match="rtt_ms"):
            tb.set_link(20, rtt_ms=-1)


def test_auto_without_root_falls_back_and_says_so(name, monkeypatch, caplog):
    monkeypatch.setattr(testbed, "_is_root", lambda: False)
    monkeypatch.setattr(testbed, "_warned", set())
    with testbed.Testbed(name=name, quota=0.25, server_cpus=SERVER_CPU,
                         device_cpu=DEVICE_CPU) as tb:
        assert tb.mode == "shaper" and tb.cgroup == "none"
        assert tb.describe()["cgroup_note"] == "not root" and tb.describe()["quota"] is None
        cmd = tb.device_cmd(["true"])
        assert cmd[-1] == "true" and "sh" not in cmd and "netns" not in cmd
    assert "falling back to mode 'shaper'" in caplog.text and "not root" in caplog.text
    with pytest.raises(testbed.TestbedError, match="needs root"):
        testbed.Testbed(name=name, mode="netns")


@pytest.mark.parametrize("kw, match", [
    ({"quota": 0}, "quota"), ({"quota": 1.5}, "quota"), ({"quota": "x"}, "quota"),
    ({"server_cpus": "4096"}, "cannot run on"), ({"device_cpu": "a"}, "CPU list"),
    ({"name": "n" * 14}, "1-13"), ({"name": "bad name"}, "1-13"), ({"mode": "tc"}, "mode"),
])
def test_arguments_are_checked(kw, match):
    kw = {"mode": "shaper", "quota": None, "name": "cxtargs", "server_cpus": SERVER_CPU,
          "device_cpu": DEVICE_CPU, **kw}
    with pytest.raises(testbed.TestbedError, match=match):
        testbed.Testbed(**kw)


def test_link_arguments_are_checked(name):
    with testbed.Testbed(mode="shaper", quota=1.0, name=name, server_cpus=SERVER_CPU,
                         device_cpu=DEVICE_CPU) as tb:
        assert tb.quota is None  # a whole CPU: no quota
        for bad in (0, -3, float("nan"), "20"):
            with pytest.raises(testbed.TestbedError, match="Mbit/s"):
                tb.set_link(bad)
        with pytest.raises(testbed.TestbedError, match="seconds"):
            tb.measure_link(0)


def test_cli_check_json(name, capsys):
    rc = testbed.main(["check", "--mode", "shaper", "--quota", "1", "--seconds", "0.1",
                       "--name", name, "--server-cpus", SERVER_CPU, "--device-cpu", DEVICE_CPU,
                       "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["testbed"]["mode"] == "shaper" and out["testbed"]["nominal_mbps"] == 20
    assert set(out["link"]) >= {"goodput_up_mbps", "goodput_down_mbps", "rtt_ms"}
    assert testbed.main(["check", "--quota", "2", "--mode", "shaper", "--name", name]) == 1


@pytest.mark.skipif(shutil.which("taskset") is None, reason="pinning needs taskset")
def test_a_device_can_be_pinned_to_a_cpu_of_its_own(name):
    with testbed.Testbed(mode="shaper", quota=None, name=name, server_cpus=SERVER_CPU,
                         device_cpu=DEVICE_CPU) as tb:
        cmd = tb.device_cmd(["true"])
        assert cmd[cmd.index("-c") + 1] == DEVICE_CPU
        cmd = tb.device_cmd(["true"], slot=1, cpus=SERVER_CPU)
        assert cmd[cmd.index("-c") + 1] == SERVER_CPU and cmd[-1] == "true"
        out = subprocess.run(tb.device_cmd([sys.executable, "-c",
                                            "import os; print(sorted(os.sched_getaffinity(0)))"],
                                           cpus=SERVER_CPU),
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == f"[{SERVER_CPU}]"
        with pytest.raises(testbed.TestbedError, match="cannot run on"):
            tb.device_cmd(["true"], cpus="4096")
        with pytest.raises(testbed.TestbedError, match="CPU list"):
            tb.device_cmd(["true"], cpus="two")
