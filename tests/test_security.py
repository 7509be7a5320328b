"""A server you can put on a network (docs/SECURITY.md), tried over real ZeroMQ on 127.0.0.1 with
real CurveZMQ keys: who is served, who is refused, that no device can reach another's work or
models, and that every tenant limit answers with its error before the server allocates. Every
wait is bounded."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq
from onnx import TensorProto, helper, numpy_helper

import coacto
from coacto import keys as K
from coacto import protocol as P
from coacto.mobile import Client
from coacto.mobile.client import ServerUnavailable
from coacto.server import Server, ServerError
from coacto.server.limits import Limits
from test_server import Device, assert_matches, collect, input_tiles, tiles_message


def conv_model(channels: int, size: int = 64, seed: int = 0) -> bytes:
    """A 1x1 convolution 3 -> ``channels`` + ReLU as PyTorch exports it: its output (and its
    memory per inference) grows with ``channels`` while the model stays small."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((channels, 3, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], name="/conv/Conv",
                              kernel_size=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["output"], name="/relu/Relu")]
    g = helper.make_graph(nodes, "torch_jit", [
        helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, channels, size, size])],
        [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="pytorch", producer_version="2.1.0")
    return m.SerializeToString()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    allowed = d / "allowed"
    allowed.mkdir()
    out = {"dir": d, "allowed": allowed}
    for name in ("server", "dev1", "dev2", "stranger"):
        pub, sec = K.generate(d, name)
        out[name] = (K.load_public(pub), K.load_pair(sec), pub, sec)
    for name in ("dev1", "dev2"):
        shutil.copy(out[name][2], allowed / f"{name}.key")
    return out


def curve(keys, name):
    return keys["server"][0], *keys[name][1]


@pytest.fixture(scope="module")
def secure(keys):
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e10, heartbeat_timeout=5.0,
                secret_key=keys["server"][3], allowed_keys=keys["allowed"]) as s:
        yield s


@pytest.fixture(scope="module")
def small():
    data = conv_model(8, size=16)
    tg = coacto.compile(data, tiles_per_layer=2)
    feeds = {"input": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    ref = coacto.Runtime(tg, threads=1).run(feeds)
    return {"data": data, "tg": tg, "feeds": feeds, "ref": ref, "tiles": input_tiles(tg, feeds)}


@contextlib.contextmanager
def socket_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def query(tg):
    return {"graph_id": tg.graph_id, "model_hash": tg.model_hash, "params": tg.params}


def upload(dev, tg, data) -> dict:
    h, _ = dev.rpc({"t": P.MODEL_QUERY, **query(tg)})
    if h["t"] == P.MODEL_MISSING:
        h, _ = dev.rpc({"t": P.MODEL_UPLOAD, **query(tg)}, data)
    return h


# ------------------------------------------------------------------------------ keys

def test_keygen_writes_a_private_pair_and_refuses_to_overwrite(tmp_path):
    r = subprocess.run([sys.executable, "-m", "coacto.cli", "keygen", "--out", str(tmp_path),
                        "edge"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pub, sec = tmp_path / "edge.key", tmp_path / "edge.key_secret"
    assert oct(sec.stat().st_mode & 0o777) == "0o600"
    key = K.load_public(pub).decode()
    assert key in r.stdout and K.load_pair(sec)[0].decode() == key
    r = subprocess.run([sys.executable, "-m", "coacto.cli", "keygen", "--out", str(tmp_path),
                        "edge"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--force" in r.stderr
    with pytest.raises(K.KeyFileError, match="public key file"):
        K.load_pair(pub)
    (tmp_path / "junk.key").write_text("not a certificate")
    with pytest.raises(K.KeyFileError, match="no public key|not a key file"):
        K.load_public(tmp_path / "junk.key")


def test_non_loopback_needs_keys_or_insecure(keys):
    with pytest.raises(ServerError, match="coacto keygen"):
        Server("tcp://*:0", threads=1, server_flops=1e9)
    with pytest.raises(ServerError, match="or neither"):
        Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, secret_key=keys["server"][3])
    with pytest.raises(coacto.CoactoError, match="public key file"):
        Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, secret_key=keys["server"][2],
               allowed_keys=keys["allowed"])
    assert Server().bind == "tcp://127.0.0.1:5555"  # the default: loopback


def test_insecure_server_warns_in_every_hello(ctx):
    with Server("tcp://0.0.0.0:0", threads=1, server_flops=1e9, insecure=True) as srv:
        assert srv.security == "none (insecure)"
        d = Device(ctx, srv.address)
        try:
            h, _ = d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
            assert h["t"] == P.HELLO_OK and "WITHOUT authentication" in h["warning"]
            assert h["security"] == "none (insecure)"
        finally:
            d.close()


# ------------------------------------------------------------------------------ who is served

def test_an_allowed_device_is_served_encrypted(secure, keys, small):
    with Client(secure.address, small["data"], threads=1, policy="cloud", tiles_per_layer=2,
                server_key=keys["server"][2], client_key=keys["dev1"][3], timeout=10) as c:
        c.connect()
        assert c.server_info["security"] == "curve"
        for _ in range(2):
            out = c.infer(small["feeds"])
            assert not c.last_stats["fallback"], c.last_stats
            assert_matches(out, small["ref"])
    # the server key as its Z85 text, the client key from the environment
    env = {K.ENV_CLIENT_KEY: str(keys["dev2"][3])}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with Client(secure.address, small["data"], threads=1, policy="cloud", tiles_per_layer=2,
                    server_key=secure.public_key, timeout=10) as c:
            assert_matches(c.infer(small["feeds"]), small["ref"])
            assert not c.last_stats["fallback"]
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.parametrize("who", ["stranger", "no keys", "wrong server key"])
def test_others_are_refused_and_leave_no_state(secure, keys, small, who):
    before = secure.stats()
    kw = {"stranger": dict(server_key=keys["server"][2], client_key=keys["stranger"][3]),
          "no keys": {},
          "wrong server key": dict(server_key=keys["dev2"][2], client_key=keys["dev1"][3])}[who]
    with Client(secure.address, small["data"], threads=1, policy="cloud", tiles_per_layer=2,
                timeout=1.5, **kw) as c:
        with pytest.raises(ServerUnavailable) as e:
            c.connect(timeout=3)
        if who == "stranger":
            assert "refused this device's key" in str(e.value)
        out = c.infer(small["feeds"])  # the device still finishes alone
        assert c.last_stats["fallback"]
        assert_matches(out, small["ref"])
    assert secure.stats()["messages"] == before["messages"]  # not one message got through


def test_a_key_added_while_running_is_served(keys, ctx, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, secret_key=keys["server"][3],
                allowed_keys=allowed) as srv:
        d = Device(ctx, srv.address, curve=curve(keys, "stranger"))
        try:
            d.send({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
            assert d.silent(0.5)
        finally:
            d.close()
        shutil.copy(keys["stranger"][2], allowed / "stranger.key")
        time.sleep(K.RELOAD_EVERY_S + 0.1)
        d = Device(ctx, srv.address, curve=curve(keys, "stranger"))
        try:
            assert d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
        finally:
            d.close()


# ------------------------------------------------------------------------------ isolation

def test_a_stolen_routing_id_reaches_nothing(secure, keys, ctx, small):
    """A peer that connects with a routing id in use (another allowed device, or no keys at
    all) is ignored: it cannot cancel the inference or receive its results."""
    tg = small["tg"]
    victim = Device(ctx, secure.address, identity=b"victim-1", curve=curve(keys, "dev1"))
    thieves = []
    try:
        assert victim.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
        # the thief connects once the id is in use: connected at the same time, whichever
        # handshake ends first owns the id, and the "victim" would be the one left out
        thieves.append(Device(ctx, secure.address, identity=b"victim-1",
                              curve=curve(keys, "dev2")))
        assert upload(victim, tg, small["data"])["t"] == P.MODEL_READY
        victim.send({"t": P.BEGIN, "inf": 7, "graph_id": tg.graph_id})
        time.sleep(0.2)
        for thief in thieves:
            thief.send({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
            thief.send({"t": P.CANCEL, "inf": 7})
        time.sleep(0.3)
        victim.send(*tiles_message(7, small["tiles"]))
        res, _acks, done, others = collect(victim, tg, 7)
        assert not [h for h in others if h["t"] == P.ERROR], others
        assert_matches(res.outputs(), small["ref"])
        assert all(t.silent(0.3) for t in thieves)
    finally:
        victim.close()
        for t in thieves:
            t.close()


def test_models_are_bound_to_the_device_that_uploaded_them(secure, keys, ctx):
    data = conv_model(4, size=8, seed=5)  # a model no other test uploads
    tg = coacto.compile(data, tiles_per_layer=2)
    owner = Device(ctx, secure.address, curve=curve(keys, "dev1"))
    other = Device(ctx, secure.address, curve=curve(keys, "dev2"))
    try:
        assert upload(owner, tg, data)["t"] == P.MODEL_READY
        # knowing the hashes is not enough: the other device must show it has the model
        assert other.rpc({"t": P.MODEL_QUERY, **query(tg)})[0]["t"] == P.MODEL_MISSING
        e = other.error({"t": P.BEGIN, "inf": 1, "graph_id": tg.graph_id})
        assert e["code"] == P.E_UNKNOWN_MODEL
        h, _ = other.rpc({"t": P.MODEL_UPLOAD, **query(tg)}, data)
        assert h["t"] == P.MODEL_READY
        assert secure.store.stats()["compiled"] >= 1
    finally:
        owner.close()
        other.close()


# ------------------------------------------------------------------------------ limits

def test_memory_budget_is_checked_before_allocation(ctx):
    data = conv_model(64, size=32)
    tg = coacto.compile(data, tiles_per_layer=2)
    from coacto.server.store import GraphInfo

    need = GraphInfo(tg).inference_bytes
    limits = Limits(memory=64 << 20, inference_memory=need, owner_memory_share=1.0)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, limits=limits) as srv:
        d = Device(ctx, srv.address)
        try:
            assert upload(d, tg, data)["t"] == P.MODEL_READY
            limits.memory = srv.store.nbytes() + int(need * 1.5)  # room for one inference
            d.send({"t": P.BEGIN, "inf": 1, "graph_id": tg.graph_id})
            e = d.error({"t": P.BEGIN, "inf": 2, "graph_id": tg.graph_id})
            assert e["code"] == P.E_BUSY and e["limit"] == "memory" and e["inf"] == 2
            d.send({"t": P.CANCEL, "inf": 1})
            d.send({"t": P.BEGIN, "inf": 2, "graph_id": tg.graph_id})
            assert d.silent(0.3)  # admitted now
            assert srv.stats()["memory_refused"] == 1
            # a model one inference of which needs more than a whole inference may have
            big = conv_model(256, size=32)
            btg = coacto.compile(big, tiles_per_layer=2)
            h = upload(d, btg, big)
            assert h["t"] == P.ERROR and h["code"] == P.E_MODEL_TOO_LARGE, h
            assert "per inference" in h["text"]
            st = srv.store.stats()
            assert st["refused"] == 1 and st["models"] == 1  # the refused bytes are not kept
        finally:
            d.close()


def test_garbage_uploads_are_not_kept(ctx):
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9) as srv:
        d = Device(ctx, srv.address)
        try:
            for i in range(3):
                junk = os.urandom(64 << 10)
                digest = hashlib.sha256(junk).hexdigest()
                e = d.error({"t": P.MODEL_UPLOAD, "graph_id": "0" * 64, "model_hash": digest,
                             "params": {}}, junk)
                assert e["code"] == P.E_MODEL_INVALID
            st = srv.store.stats()
            assert st["models"] == 0 and st["model_bytes"] == 0 and st["refused"] == 3
        finally:
            d.close()


def test_uploads_per_device(ctx):
    limits = Limits.default(1 << 30, uploads_per_owner=1)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, limits=limits) as srv:
        d = Device(ctx, srv.address)
        try:
            a, b = conv_model(4, 8, seed=1), conv_model(4, 8, seed=2)
            assert upload(d, coacto.compile(a, tiles_per_layer=2), a)["t"] == P.MODEL_READY
            h = upload(d, coacto.compile(b, tiles_per_layer=2), b)
            assert h["t"] == P.ERROR and h["code"] == P.E_BUSY
            assert h["limit"] == "uploads_per_owner"
            assert srv.stats()["uploads_refused"] == 1
        finally:
            d.close()


def test_a_device_that_does_not_read_gets_its_results_dropped(ctx):
    data = conv_model(256, size=64)  # 4 MiB of output per inference
    tg = coacto.compile(data, tiles_per_layer=4)
    feeds = {"input": np.ones((1, 3, 64, 64), np.float32)}
    limits = Limits.default(2 << 30, results_per_device=1 << 20)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, limits=limits) as srv:
        d = Device(ctx, srv.address)
        d.sock.setsockopt(zmq.RCVBUF, 64 << 10)
        d.sock.setsockopt(zmq.RCVHWM, 2)
        try:
            assert upload(d, tg, data)["t"] == P.MODEL_READY
            tiles = input_tiles(tg, feeds)
            for inf in range(6):
                d.send({"t": P.BEGIN, "inf": inf, "graph_id": tg.graph_id})
                d.send(*tiles_message(inf, tiles))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # the device reads nothing meanwhile
                st = srv.stats()
                if st["results_dropped"] + st["inferences_done"] == 6:
                    break
                time.sleep(0.05)
            st = srv.stats()
            assert st["inferences"] == 0 and st["results_dropped"] >= 1, st
            queued = st["unsent_bytes"]
            assert queued <= limits.results_per_device + 4 * 4 * 64 * 64 * 256, st
            errors = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and d.sock.poll(500):
                h, _ = P.unpack(d.sock.recv_multipart())
                if h["t"] == P.ERROR:
                    errors.append(h)
            assert any(e["code"] == P.E_RESULTS_DROPPED and "read RESULT" in e["text"]
                       for e in errors), errors
            # the server still serves it once it reads
            d.send({"t": P.BEGIN, "inf": 99, "graph_id": tg.graph_id})
            d.send(*tiles_message(99, tiles))
            _res, _acks, done, _ = collect(d, tg, 99)
            assert done["t"] == P.DONE
        finally:
            d.close()


def test_a_flood_of_connections_does_not_lock_devices_out(ctx, small):
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, max_devices=32,
                heartbeat_timeout=30) as srv:
        flood = [Device(ctx, srv.address) for _ in range(100)]
        try:
            for f in flood:
                f.send({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
            for f in flood:
                f.recv()
            st = srv.stats()
            assert st["devices"] <= 32 and st["sessions_evicted"] >= 68, st
            d = Device(ctx, srv.address)
            try:
                assert d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
                assert upload(d, small["tg"], small["data"])["t"] == P.MODEL_READY
                d.send({"t": P.BEGIN, "inf": 1, "graph_id": small["tg"].graph_id})
                # a device with work in flight is never evicted by newcomers
                for f in flood:
                    f.send({"t": P.HEARTBEAT, "t_send": 0.0})
                d.send(*tiles_message(1, small["tiles"]))
                res, _acks, _done, others = collect(d, small["tg"], 1)
                assert not [h for h in others if h["t"] == P.ERROR], others
                assert_matches(res.outputs(), small["ref"])
            finally:
                d.close()
        finally:
            for f in flood:
                f.close()


def test_insecure_sessions_that_never_begin_expire_fast(ctx):
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, heartbeat_timeout=30) as srv:
        assert srv.limits.idle_expiry_s == 15.0
    limits = Limits.default(1 << 30, idle_expiry_s=0.3)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, heartbeat_timeout=30,
                limits=limits) as srv:
        ds = [Device(ctx, srv.address) for _ in range(5)]
        try:
            for d in ds:
                assert d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
            assert srv.stats()["devices"] == 5
            deadline = time.monotonic() + 5
            while srv.stats()["devices"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.stats()["sessions_expired_idle"] == 5
            # forgetting them is invisible to a device that comes back
            assert ds[0].rpc({"t": P.HEARTBEAT, "t_send": 0.0})[0]["t"] == P.STATS
        finally:
            for d in ds:
                d.close()


def test_sessions_per_key(secure, keys, ctx):
    n = secure.limits.sessions_per_owner
    ds = [Device(ctx, secure.address, curve=curve(keys, "dev2")) for _ in range(n + 4)]
    try:
        for d in ds:
            assert d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
        owners = secure.tenants.by_owner
        assert len(owners[keys["dev2"][0].decode()]) == n
    finally:
        for d in ds:
            d.close()


def test_heap_goes_back_to_the_os_after_a_burst(ctx, small):
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9) as srv:
        d = Device(ctx, srv.address)
        try:
            assert upload(d, small["tg"], small["data"])["t"] == P.MODEL_READY
            for inf in range(3):
                d.send({"t": P.BEGIN, "inf": inf, "graph_id": small["tg"].graph_id})
                d.send(*tiles_message(inf, small["tiles"]))
                collect(d, small["tg"], inf)
            deadline = time.monotonic() + 5
            while not srv.stats()["trims"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert srv.stats()["trims"] == 1
        finally:
            d.close()


# ------------------------------------------------------------------------------ the commands

def test_the_commands_with_keys_as_the_readme_says(tmp_path, small):
    """coacto keygen, coacto-server and coacto-client as separate processes, keys from files and
    from the environment; a device whose key is not in the folder runs alone (fallback)."""
    def run(*argv, env=None):
        return subprocess.run([*argv], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    exe = {n: shutil.which(n) for n in ("coacto", "coacto-server", "coacto-client")}
    if not all(exe.values()):
        pytest.fail(f"the console scripts are not installed: {exe}; pip install -e .")
    keys_dir, allowed = tmp_path / "keys", tmp_path / "allowed"
    for name in ("server", "phone1", "phone2"):
        assert run(exe["coacto"], "keygen", "--out", str(keys_dir), name).returncode == 0
    allowed.mkdir()
    shutil.copy(keys_dir / "phone1.key", allowed)
    (tmp_path / "m.onnx").write_bytes(small["data"])
    with socket_port() as port:
        pass
    srv = subprocess.Popen([exe["coacto-server"], "--bind", f"tcp://*:{port}", "--threads", "1",
                            "--server-flops", "1e9"], stderr=subprocess.PIPE, text=True,
                           env={**os.environ, K.ENV_SECRET_KEY: str(keys_dir / "server.key_secret"),
                                K.ENV_ALLOWED_KEYS: str(allowed)})
    try:
        seen = []
        guard = threading.Timer(60, srv.kill)  # a server that hangs before ready ends the read
        guard.start()
        for line in srv.stderr:  # until the server says it is ready (or exits)
            seen.append(line)
            if "ready: " in line:
                break
        guard.cancel()
        assert seen and "curve" in seen[-1], "".join(seen)
        threading.Thread(target=srv.stderr.read, daemon=True).start()  # never a full pipe
        base = [exe["coacto-client"], "--server", f"tcp://127.0.0.1:{port}", "--model",
                str(tmp_path / "m.onnx"), "--tiles", "2", "--random", "--policy", "cloud",
                "--json", "--timeout", "3"]
        ok = run(*base, "--server-key", str(keys_dir / "server.key"),
                 "--client-key", str(keys_dir / "phone1.key_secret"))
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout.splitlines()[0])["fallback"] is False, ok.stdout
        env = {K.ENV_SERVER_KEY: str(keys_dir / "server.key"),
               K.ENV_CLIENT_KEY: str(keys_dir / "phone2.key_secret")}
        refused = run(*base, env=env)
        assert refused.returncode == 0, refused.stderr
        row = json.loads(refused.stdout.splitlines()[0])
        assert row["fallback"] is True and "refused this device's key" in row["fallback_reason"]
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            assert srv.wait(15) == 0
        finally:
            if srv.poll() is None:
                srv.kill()
            srv.stderr.close()


def test_a_model_too_costly_to_partition_is_refused_before_partitioning(ctx):
    """A 7x7 convolution over a large image: small activations for its FLOPs, but the
    partitioner's per-tap tables would be about 3 KB per column; refused from the imported
    graph's shapes, before any of them is built."""
    from coacto.server.store import partition_bytes
    from coacto.frontend import import_model

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((2, 3, 7, 7)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["output"], name="/stem/Conv",
                          kernel_shape=[7, 7], pads=[3, 3, 3, 3])], "torch_jit",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 512, 512])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, 512, 512])], [w])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    work = partition_bytes(import_model(data))
    assert work == 64 * 49 * 512 * 512
    limits = Limits(memory=1 << 30, inference_memory=work // 2, owner_memory_share=1.0)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, limits=limits) as srv:
        d = Device(ctx, srv.address)
        try:
            digest = hashlib.sha256(data).hexdigest()
            e = d.error({"t": P.MODEL_UPLOAD, "graph_id": "0" * 64, "model_hash": digest,
                         "params": {}}, data)
            assert e["code"] == P.E_MODEL_TOO_LARGE and "partitioning" in e["text"], e
            assert srv.store.stats()["models"] == 0
        finally:
            d.close()


def test_a_graph_id_with_another_models_hash_reaches_nothing(keys, ctx, tmp_path):
    """A device that names a private graph's id with the hash of a model it may use (a preloaded
    one) is not given the graph: the hash must be the graph's own."""
    public = conv_model(4, size=8, seed=11)
    (tmp_path / "public.onnx").write_bytes(public)
    private = conv_model(4, size=8, seed=12)
    ptg = coacto.compile(private, tiles_per_layer=2)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, models=tmp_path,
                secret_key=keys["server"][3], allowed_keys=keys["allowed"]) as srv:
        owner = Device(ctx, srv.address, curve=curve(keys, "dev1"))
        thief = Device(ctx, srv.address, curve=curve(keys, "dev2"))
        try:
            assert upload(owner, ptg, private)["t"] == P.MODEL_READY
            forged = {**query(ptg), "model_hash": hashlib.sha256(public).hexdigest()}
            h, _ = thief.rpc({"t": P.MODEL_QUERY, **forged})
            assert h["t"] == P.ERROR and h["code"] == P.E_MODEL_INVALID, h
            h, _ = thief.rpc({"t": P.MODEL_UPLOAD, **forged}, public)
            assert h["t"] == P.ERROR and h["code"] == P.E_MODEL_INVALID, h
            e = thief.error({"t": P.BEGIN, "inf": 1, "graph_id": ptg.graph_id})
            assert e["code"] == P.E_UNKNOWN_MODEL
        finally:
            owner.close()
            thief.close()


def test_a_routing_id_reused_by_another_device_gets_a_fresh_session(secure, keys, ctx, small):
    """The victim's connection is gone but its session has not expired yet; another allowed
    device that connects with the same routing id reaches none of its state."""
    tg = small["tg"]
    victim = Device(ctx, secure.address, identity=b"reused-1", curve=curve(keys, "dev1"))
    assert upload(victim, tg, small["data"])["t"] == P.MODEL_READY
    victim.send({"t": P.BEGIN, "inf": 5, "graph_id": tg.graph_id})
    assert victim.silent(0.3)
    victim.close()
    time.sleep(0.3)
    thief = Device(ctx, secure.address, identity=b"reused-1", curve=curve(keys, "dev2"))
    try:
        e = thief.error(*tiles_message(5, small["tiles"]))
        assert e["code"] == P.E_UNKNOWN_INFERENCE, e
        assert secure.tenants.sessions[b"reused-1"].owner == keys["dev2"][0].decode()
    finally:
        thief.close()


def test_inferences_in_flight_per_device_over_its_connections(ctx, small):
    limits = Limits.default(1 << 30, inferences_per_owner=2)
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, limits=limits) as srv:
        a, b = Device(ctx, srv.address), Device(ctx, srv.address)  # one device: one address
        try:
            assert upload(a, small["tg"], small["data"])["t"] == P.MODEL_READY
            for inf in (1, 2):
                a.send({"t": P.BEGIN, "inf": inf, "graph_id": small["tg"].graph_id})
            assert a.silent(0.3)
            e = b.error({"t": P.BEGIN, "inf": 3, "graph_id": small["tg"].graph_id})
            assert e["code"] == P.E_BUSY and e["limit"] == "inferences_per_owner", e
        finally:
            a.close()
            b.close()
