"""The server over real ZeroMQ on 127.0.0.1, driven by a raw DEALER that speaks the protocol by hand
(docs/PROTOCOL.md): handshake, model store, cloud inferences checked against onnxruntime, hostile
input, tenant isolation, vanished devices, several devices at once, and the coacto-server command.
Every wait is bounded: nothing here can hang."""
from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

import coacto
from coacto import ir, zoo
from coacto import protocol as P
from coacto.server import Server, ServerError
from coacto.tilegraph import graph_identity

TILES = 3
MAX_MODEL_BYTES = 6 << 20  # the test model is about 5 MB


# ------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def model():
    import onnxruntime as ort

    proto = zoo.build("squeezenet", image_size=32)
    data = proto.SerializeToString()
    tg = coacto.compile(data, tiles_per_layer=TILES)
    feeds = zoo.input_feeds(proto, seed=0)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, feeds)))
    return {"data": data, "tg": tg, "feeds": feeds, "ref": ref,
            "tiles": input_tiles(tg, feeds)}


@pytest.fixture(scope="module")
def server():
    with Server("tcp://127.0.0.1:0", threads=2, max_model_bytes=MAX_MODEL_BYTES,
                heartbeat_timeout=5.0, max_inferences_per_device=4, server_flops=1e10) as s:
        yield s


@pytest.fixture
def device(ctx, server, model):
    """A device that said hello and made sure the test model is on the server."""
    d = Device(ctx, server.address)
    assert d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
    ensure_model(d, model["tg"], model["data"])
    yield d
    d.close()


# ------------------------------------------------------------------------------ a raw device

class Device:
    """``curve``: (server public, own public, own secret) keys for a server with keys."""

    def __init__(self, ctx, address, identity: bytes | None = None, curve=None):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        if curve is not None:
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = curve
        self.sock.connect(address)

    def send(self, header, *frames):
        self.sock.send_multipart(P.pack(header, *frames) if isinstance(header, dict)
                                 else [header, *frames])

    def recv(self, timeout=10.0):
        assert self.sock.poll(int(timeout * 1000)), "no reply from the server"
        return P.unpack(self.sock.recv_multipart())

    def rpc(self, header, *frames, timeout=10.0):
        self.send(header, *frames)
        return self.recv(timeout)

    def error(self, header, *frames) -> dict:
        h, _ = self.rpc(header, *frames)
        assert h["t"] == P.ERROR, h
        return h

    def silent(self, timeout=0.2) -> bool:
        return not self.sock.poll(int(timeout * 1000))

    def close(self):
        self.sock.close(0)


def ensure_model(dev: Device, tg, data):
    q = {"graph_id": tg.graph_id, "model_hash": tg.model_hash, "params": tg.params}
    h, _ = dev.rpc({"t": P.MODEL_QUERY, **q})
    if h["t"] == P.MODEL_MISSING:
        h, _ = dev.rpc({"t": P.MODEL_UPLOAD, **q}, data)
    assert h["t"] == P.MODEL_READY, h


def input_tiles(tg, feeds) -> list[tuple[int, np.ndarray]]:
    """(tile id, data) of every input tile: the tile's columns, each with its rows."""
    out = []
    b, first = tg.plan.tile_bounds, tg.plan.layer_first_tile
    for name, li in tg.graph.inputs.items():
        layer = tg.graph.layers[li]
        x = ir.to_storage(feeds[name]).reshape(-1, layer.shape[1])
        for t in range(first[li], first[li + 1]):
            c0, c1, r0, r1 = b[t]
            out.append((t, np.ascontiguousarray(x[c0:c1, r0:r1]).ravel()))
    return out


def tiles_message(inf, tiles, batch=0):
    ids = np.asarray([t for t, _ in tiles], dtype="<i4")
    data = np.concatenate([d for _, d in tiles]).astype("<f4")
    return {"t": P.TILES, "inf": inf, "batch": batch, "t_send": time.monotonic()}, \
        ids.tobytes(), data.tobytes()


def np_encode(enc: str, x: np.ndarray) -> bytes:
    """One tile in a transfer encoding (docs/PROTOCOL.md §2), written from the text in numpy."""
    x = np.asarray(x, np.float32)
    n = x.size
    nz = x.view(np.uint32) != 0
    head = b""
    if enc == "f16":
        vals = x.astype(np.float16)
    elif enc == "int8":
        scale = np.float32(np.abs(x).max() / 127)
        head = scale.tobytes()
        vals = np.clip(np.rint(x / scale if scale else x * 0), -127, 127).astype(np.int8)
    else:
        vals = x
    dense = head + vals.tobytes()
    masked = head + np.packbits(nz, bitorder="little").tobytes() + vals[nz].tobytes()
    return masked if enc != "raw" and len(masked) < len(dense) else dense


def np_decode(enc: str, b: np.ndarray, n: int) -> np.ndarray:
    b = np.asarray(b, np.uint8)
    head, scale = (4, np.frombuffer(b[:4].tobytes(), np.float32)[0]) if enc == "int8" else (0, 1)
    dt = {"lossless": np.float32, "raw": np.float32, "f16": np.float16, "int8": np.int8}[enc]
    vb = np.dtype(dt).itemsize
    body = b[head:]
    if body.size == vb * n:
        vals = np.frombuffer(body.tobytes(), dt).astype(np.float32)
    else:
        nb = (n + 7) // 8
        nz = np.unpackbits(body[:nb], bitorder="little")[:n].astype(bool)
        vals = np.zeros(n, np.float32)
        vals[nz] = np.frombuffer(body[nb:].tobytes(), dt).astype(np.float32)
    return vals * scale if enc == "int8" else vals


class Results:
    """Assembles the output layers from RESULT tiles."""

    def __init__(self, tg):
        self.tg = tg
        self.store = {li: np.full((int(np.prod(tg.graph.layers[li].shape)) //
                                   tg.graph.layers[li].shape[1], tg.graph.layers[li].shape[1]),
                                  np.nan, np.float32) for li in set(tg.graph.outputs.values())}
        self.tiles = []

    def add(self, frames, enc=None):
        ids = np.frombuffer(frames[0], "<i4")
        b, layer_of = self.tg.plan.tile_bounds, self.tg.plan.tile_layer
        if enc is None:
            data = np.frombuffer(frames[1], "<f4")
        else:  # decoded by the numpy oracle below, not the runtime
            lens = np.frombuffer(frames[1], "<i4")
            assert len(frames) == 3 and lens.size == ids.size and lens.sum() == len(frames[2])
            raw, at = np.frombuffer(frames[2], np.uint8), 0
            parts = []
            for t, ln in zip(ids.tolist(), lens.tolist()):
                c0, c1, r0, r1 = b[t]
                parts.append(np_decode(enc, raw[at:at + ln], (c1 - c0) * (r1 - r0)))
                at += ln
            data = np.concatenate(parts)
        pos = 0
        for t in ids.tolist():
            c0, c1, r0, r1 = b[t]
            n = (c1 - c0) * (r1 - r0)
            self.store[layer_of[t]][c0:c1, r0:r1] = data[pos:pos + n].reshape(c1 - c0, r1 - r0)
            pos += n
        assert pos == data.size
        self.tiles += ids.tolist()

    def outputs(self):
        g = self.tg.graph
        return {name: ir.from_storage(self.store[li], g.layers[li].shape, g.layers[li].onnx_shape)
                for name, li in g.outputs.items()}


def collect(dev: Device, tg, inf, timeout=20.0, heartbeat=None):
    """Reads until DONE for `inf`: (outputs, acks, done header, other messages)."""
    res, acks, others = Results(tg), [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if heartbeat:
            dev.send({"t": P.HEARTBEAT, "t_send": time.monotonic()})
        if not dev.sock.poll(100):
            continue
        h, frames = P.unpack(dev.sock.recv_multipart())
        if h["t"] == P.RESULT and h["inf"] == inf:
            res.add(frames, h.get("enc"))
        elif h["t"] == P.ACK:
            acks.append(h)
        elif h["t"] == P.DONE and h["inf"] == inf:
            return res, acks, h, others
        else:
            others.append(h)
    raise AssertionError(f"inference {inf!r} did not finish within {timeout} s")


def assert_matches(got: dict, ref: dict):
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].shape == ref[k].shape
        scale = float(np.abs(ref[k]).max())
        err = float(np.abs(got[k].astype(np.float64) - ref[k]).max())
        assert err <= 1e-4 * scale, f"{k}: max |error| {err:.3g} > 1e-4 * {scale:.3g}"


def cloud_inference(dev, model, inf, order=None, duplicate=False, per_message=None):
    tg = model["tg"]
    dev.send({"t": P.BEGIN, "inf": inf, "graph_id": tg.graph_id})
    tiles = [model["tiles"][i] for i in (order or range(len(model["tiles"])))]
    if duplicate:  # every tile but the last twice, before the last: the inference cannot have
        tiles = tiles[:-1] + tiles[:-1][::-1] + tiles[-1:]  # finished (and been freed) yet
    step = per_message or len(tiles)
    for i in range(0, len(tiles), step):
        dev.send(*tiles_message(inf, tiles[i:i + step], batch=i))
    res, acks, done, others = collect(dev, tg, inf)
    assert not [h for h in others if h["t"] == P.ERROR], others
    assert_matches(res.outputs(), model["ref"])
    assert sorted(res.tiles) == sorted(set(res.tiles)), "an output tile came twice"
    return res, acks, done


# ------------------------------------------------------------------------------ handshake

def test_hello(ctx, server):
    d = Device(ctx, server.address)
    try:
        h, _ = d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION, "client": "test"})
        assert h["t"] == P.HELLO_OK and h["v"] == P.PROTOCOL_VERSION
        assert h["threads"] == 2 and h["max_model_bytes"] == MAX_MODEL_BYTES
        assert h["server_flops"] > 0 and 0 < h["heartbeat_s"] < 5.0
        e = d.error({"t": P.HELLO, "v": 99})
        assert e["code"] == P.E_VERSION
        assert "99" in e["text"] and str(P.PROTOCOL_VERSION) in e["text"]
        assert d.error({"t": P.HELLO})["code"] == P.E_BAD_MESSAGE
    finally:
        d.close()


def test_address_resolves_the_port(server):
    assert server.address.startswith("tcp://127.0.0.1:")
    assert int(server.address.rsplit(":", 1)[1]) > 0


def test_bad_bind_address():
    with pytest.raises(ServerError, match="cannot bind"):
        Server("tcp://256.0.0.1:99999", threads=1, server_flops=1e9, insecure=True).start()
    with pytest.raises(ServerError, match="port 99999 is not from 0 to 65535"):
        Server("tcp://127.0.0.1:99999", threads=1, server_flops=1e9).start()


# ------------------------------------------------------------------------------ model store

def test_model_query_and_upload(ctx, model, tmp_path):
    tg, data = model["tg"], model["data"]
    q = {"graph_id": tg.graph_id, "model_hash": tg.model_hash, "params": tg.params}
    with Server("tcp://127.0.0.1:0", threads=1, max_model_bytes=MAX_MODEL_BYTES,
                server_flops=1e9, cache_dir=tmp_path) as srv:
        d = Device(ctx, srv.address)
        try:
            h, _ = d.rpc({"t": P.MODEL_QUERY, **q})
            assert h == {"t": P.MODEL_MISSING, "graph_id": tg.graph_id, "model_hash": tg.model_hash}
            # bytes that do not hash to model_hash
            e = d.error({"t": P.MODEL_UPLOAD, **q}, data[:-1] + b"\0")
            assert e["code"] == P.E_MODEL_INVALID and e["graph_id"] == tg.graph_id
            # too large: refused before hashing or compiling
            e = d.error({"t": P.MODEL_UPLOAD, **q}, b"\0" * (MAX_MODEL_BYTES + 1))
            assert e["code"] == P.E_MODEL_TOO_LARGE
            # the right model with params that do not give the claimed graph
            bad = dict(q, params={"tiles_per_layer": TILES + 1, "input_shapes": {}})
            e = d.error({"t": P.MODEL_UPLOAD, **bad}, data)
            assert e["code"] == P.E_MODEL_INVALID and "compiles to" in e["text"]
            h, _ = d.rpc({"t": P.MODEL_UPLOAD, **q}, data)
            assert h["t"] == P.MODEL_READY and h["tiles"] == tg.n_tiles
            h, _ = d.rpc({"t": P.MODEL_QUERY, **q})
            assert h["t"] == P.MODEL_READY and h["graph_id"] == tg.graph_id
            # other partition parameters: compiled from the stored ONNX, no upload needed
            params2 = {"tiles_per_layer": 2, "input_shapes": {}}
            gid2 = graph_identity(tg.model_hash, params2)
            h, _ = d.rpc({"t": P.MODEL_QUERY, "graph_id": gid2, "model_hash": tg.model_hash,
                          "params": params2})
            assert h["t"] == P.MODEL_READY and h["graph_id"] == gid2
            assert (tmp_path / f"{tg.model_hash}.onnx").read_bytes() == data
            assert srv.stats()["store"]["graphs"] == 2
        finally:
            d.close()
    # the cache folder survives a restart
    with Server("tcp://127.0.0.1:0", threads=1, server_flops=1e9, cache_dir=tmp_path) as srv:
        d = Device(ctx, srv.address)
        try:
            assert d.rpc({"t": P.MODEL_QUERY, **q})[0]["t"] == P.MODEL_READY
        finally:
            d.close()


def test_preloaded_models(ctx, model, tmp_path):
    tg = model["tg"]
    (tmp_path / "squeezenet.onnx").write_bytes(model["data"])
    tg2 = coacto.compile(model["data"], tiles_per_layer=2)
    tg2.save(tmp_path / "squeezenet2.ctg")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    with Server("tcp://127.0.0.1:0", threads=1, models=tmp_path, server_flops=1e9) as srv:
        kinds = {m["file"]: m for m in srv.loaded_models}
        assert kinds["squeezenet.onnx"]["model_hash"] == hashlib.sha256(model["data"]).hexdigest()
        assert kinds["squeezenet2.ctg"]["graph_id"] == tg2.graph_id
        assert "broken.onnx" not in kinds
        d = Device(ctx, srv.address)
        try:
            for g in (tg, tg2):
                h, _ = d.rpc({"t": P.MODEL_QUERY, "graph_id": g.graph_id,
                              "model_hash": g.model_hash, "params": g.params})
                assert h["t"] == P.MODEL_READY, h
        finally:
            d.close()
    with pytest.raises(coacto.CoactoError, match="does not exist"):
        Server("tcp://127.0.0.1:0", threads=1, models=tmp_path / "nope", server_flops=1e9).start()


# ------------------------------------------------------------------------------ inferences

def test_cloud_inference_matches_onnxruntime(device, model, server):
    res, acks, done = cloud_inference(device, model, inf=1)
    tg = model["tg"]
    n_in = len(model["tiles"])
    assert len(acks) == 1 and acks[0]["accepted"] == n_in and acks[0]["duplicates"] == 0
    assert acks[0]["batch"] == 0 and acks[0]["bytes"] > 0 and acks[0]["t_server"] > 0
    assert done["tiles_external"] == n_in and done["tiles_computed"] == tg.n_tiles - n_in
    assert 0 < done["busy_s"] <= done["seconds"]
    # the measured rate of this graph refines what MODEL_READY announces, and DONE carries it
    h, _ = device.rpc({"t": P.MODEL_QUERY, "graph_id": tg.graph_id, "model_hash": tg.model_hash,
                       "params": tg.params})
    assert h["t"] == P.MODEL_READY and h["server_flops"] != 1e10
    assert h["server_flops"] == done["server_flops"]
    # the inference is freed: late tiles are refused cheaply, naming the batch
    e = device.error(*tiles_message(1, model["tiles"][:1], batch=42))
    assert e["code"] == P.E_UNKNOWN_INFERENCE and e["batch"] == 42 and e["inf"] == 1


def test_the_rate_counts_the_time_computing_not_the_wait_for_inputs(device, model):
    """Inputs that arrive in two halves 0.3 s apart: the server computes what the first half
    allows, waits, then the rest; its rate is its FLOPs over the time its threads were on the
    inference (busy_s), which the wait is not part of (a rate from the span would be 0.3 s too
    slow, one from the last input too fast)."""
    tg, tiles = model["tg"], model["tiles"]
    half = len(tiles) // 2
    device.send({"t": P.BEGIN, "inf": "gap", "graph_id": tg.graph_id})
    device.send(*tiles_message("gap", tiles[:half], batch=1))
    time.sleep(0.3)
    device.send(*tiles_message("gap", tiles[half:], batch=2))
    res, _acks, done, others = collect(device, tg, "gap")
    assert not [h for h in others if h["t"] == P.ERROR], others
    assert_matches(res.outputs(), model["ref"])
    assert done["seconds"] > 0.3 and 0 < done["busy_s"] < done["seconds"] - 0.25


def test_duplicated_and_out_of_order_tiles(device, model):
    n = len(model["tiles"])
    _, acks, done = cloud_inference(device, model, inf="dup", order=list(range(n))[::-1],
                                    duplicate=True, per_message=1)
    assert sum(a["accepted"] for a in acks) == n
    assert sum(a["duplicates"] for a in acks) == n - 1
    assert done["duplicates"] == n - 1


def test_stats_alpha_and_cancel(device, model, server):
    h, _ = device.rpc({"t": P.HEARTBEAT, "t_send": 12.5})
    assert h["t"] == P.STATS and h["t_send"] == 12.5 and h["alpha"] >= 1.0
    assert h["threads"] == 2 and h["devices"] >= 1 and h["t_server"] > 0
    gid = model["tg"].graph_id
    for i in range(4):
        device.send({"t": P.BEGIN, "inf": 100 + i, "graph_id": gid})
    e = device.error({"t": P.BEGIN, "inf": 104, "graph_id": gid})
    assert e["code"] == P.E_BUSY and e["inf"] == 104
    for i in range(4):
        device.send({"t": P.CANCEL, "inf": 100 + i})
    device.send({"t": P.CANCEL, "inf": 100})  # twice: not an error
    e = device.error(*tiles_message(100, model["tiles"][:1]))
    assert e["code"] == P.E_UNKNOWN_INFERENCE and "cancelled" in e["text"]
    cloud_inference(device, model, inf=104)  # room again


def test_hostile_input_never_hurts(device, model, server):
    tg = model["tg"]
    gid = tg.graph_id
    rejected = server.stats()["rejected"]
    device.send({"t": P.BEGIN, "inf": 7, "graph_id": gid})
    tile0 = model["tiles"][0]
    header, ids, data = tiles_message(7, [tile0])
    bad = [
        [b"\xc1\xff garbage"],                                    # not msgpack
        [b""],                                                    # empty header
        [msgpack.packb([1, 2, 3])],                               # not a map
        [msgpack.packb({"t": "nope"})],                           # unknown type
        [msgpack.packb({"t": [1]})],                              # unhashable type
        [msgpack.packb({"t": None, "inf": 1})],
        [msgpack.packb({1: 2})],                                  # non-string keys
        [msgpack.packb({"t": P.HELLO_OK, "v": 1})],               # a server's message
        [msgpack.packb({"t": P.BEGIN})],                          # missing fields
        [msgpack.packb({"t": P.BEGIN, "inf": [1], "graph_id": gid})],      # wrong type
        [msgpack.packb({"t": P.BEGIN, "inf": True, "graph_id": gid})],
        [msgpack.packb({"t": P.BEGIN, "inf": 8, "graph_id": "../../etc/passwd"})],
        [msgpack.packb({"t": P.MODEL_QUERY, "graph_id": gid, "model_hash": 5, "params": {}})],
        [msgpack.packb({"t": P.MODEL_QUERY, "graph_id": "0" * 64, "model_hash": tg.model_hash,
                        "params": {"tiles_per_layer": 10 ** 9}})],
        [msgpack.packb({"t": P.MODEL_QUERY, "graph_id": "0" * 64, "model_hash": tg.model_hash,
                        "params": {"tiles_per_layer": float("nan")}})],
        [msgpack.packb({"t": P.MODEL_QUERY, "graph_id": "0" * 64, "model_hash": tg.model_hash,
                        "params": {"input_shapes": {"input": [-1, 3]}}})],
        [msgpack.packb({"t": P.MODEL_UPLOAD, "graph_id": gid, "model_hash": tg.model_hash,
                        "params": tg.params})],                   # no model frame
        [msgpack.packb({"t": P.TILES, "inf": 7, "pad": "x" * 100_000})],  # header too large
        [header],                                                 # no frames
        [header, ids],                                            # one frame
        [header, ids[:3], data],                                  # ids not a multiple of 4
        [header, ids, data[:-4]],                                 # data too short
        [header, ids, data + b"\0\0\0\0"],                        # data too long
        [header, ids, data[:-1]],                                 # not whole floats
        [header, np.asarray([tg.n_tiles], "<i4").tobytes(), data],        # unknown tile id
        [header, np.asarray([-1], "<i4").tobytes(), data],
        [header, np.asarray([2 ** 31 - 1], "<i4").tobytes(), data],
        [header, b"", b""],                                       # no tiles at all
        [msgpack.packb({"t": P.TILES, "inf": 999, "batch": 3}), ids, data],  # not begun
    ]
    codes = []
    for frames in bad:
        device.send(*frames)
        h, _ = device.recv()
        assert h["t"] == P.ERROR, (frames[0][:40], h)
        codes.append(h["code"])
    assert set(codes) <= {P.E_BAD_MESSAGE, P.E_BAD_TILES, P.E_UNKNOWN_INFERENCE,
                          P.E_UNKNOWN_MODEL}
    assert codes[-1] == P.E_UNKNOWN_INFERENCE
    assert server.stats()["rejected"] >= rejected + len(bad)
    # NaN data and timestamps are the device's own business: accepted, echoed
    nan_tile = [(tile0[0], np.full_like(tile0[1], np.nan))]
    h, _ = device.rpc({**tiles_message(7, nan_tile)[0], "t_send": float("nan")},
                      *tiles_message(7, nan_tile)[1:])
    assert h["t"] == P.ACK and h["accepted"] == 1 and np.isnan(h["t_send"])
    device.send({"t": P.CANCEL, "inf": 7})
    # nothing was harmed: a fresh inference on the same connection is exact
    cloud_inference(device, model, inf=8)


def test_other_device_cannot_touch_an_inference(ctx, device, model, server):
    tiles = model["tiles"]
    device.send({"t": P.BEGIN, "inf": 5, "graph_id": model["tg"].graph_id})
    device.send(*tiles_message(5, tiles[:1]))
    intruder = Device(ctx, server.address)
    try:
        garbage = [(t, np.full_like(d, 1e30)) for t, d in tiles]
        e = intruder.error(*tiles_message(5, garbage))
        assert e["code"] == P.E_UNKNOWN_INFERENCE
        intruder.send({"t": P.CANCEL, "inf": 5})
        intruder.send({"t": P.BEGIN, "inf": 5, "graph_id": model["tg"].graph_id})  # its own 5
        intruder.send(*tiles_message(5, garbage))
        assert intruder.recv()[0]["t"] == P.ACK
    finally:
        intruder.close()
    device.send(*tiles_message(5, tiles[1:], batch=1))
    res, acks, done, others = collect(device, model["tg"], 5)
    assert_matches(res.outputs(), model["ref"])


def test_vanished_device_is_freed(ctx, model):
    tg = model["tg"]
    with Server("tcp://127.0.0.1:0", threads=1, heartbeat_timeout=1.0, server_flops=1e9) as srv:
        gone, alive = Device(ctx, srv.address), Device(ctx, srv.address)
        try:
            for d in (gone, alive):
                ensure_model(d, tg, model["data"])
            gone.send({"t": P.BEGIN, "inf": 1, "graph_id": tg.graph_id})
            gone.send(*tiles_message(1, model["tiles"][:1]))
            assert gone.recv()[0]["t"] == P.ACK
            assert srv.stats()["inferences"] == 1
            gone.close()  # vanishes mid-inference
            alive.send({"t": P.BEGIN, "inf": 1, "graph_id": tg.graph_id})
            deadline = time.monotonic() + 5
            while srv.stats()["devices"] > 1 and time.monotonic() < deadline:
                alive.rpc({"t": P.HEARTBEAT, "t_send": 0.0})  # stays alive meanwhile
                time.sleep(0.1)
            st = srv.stats()
            assert st["devices"] == 1 and st["devices_expired"] == 1
            assert st["inferences_expired"] == 1 and st["inferences"] == 1  # only alive's
            alive.send(*tiles_message(1, model["tiles"]))
            res, _, _, _ = collect(alive, tg, 1, heartbeat=True)
            assert_matches(res.outputs(), model["ref"])
            deadline = time.monotonic() + 5  # freed right after DONE was sent
            while srv.stats()["inferences"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert srv.stats()["inferences"] == 0
        finally:
            gone.close()
            alive.close()


def test_several_devices_at_once(ctx, server, model):
    errors = []

    def run(k):
        try:
            d = Device(ctx, server.address, identity=f"device-{k}".encode())
            try:
                ensure_model(d, model["tg"], model["data"])
                for i in range(3):
                    cloud_inference(d, model, inf=i, per_message=1 + (k % 2))
                h, _ = d.rpc({"t": P.HEARTBEAT, "t_send": 0.0})
                assert h["alpha"] >= 1.0
            finally:
                d.close()
        except BaseException as e:  # reported by the main thread
            errors.append(f"device {k}: {e!r}")

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a device hung"
    assert not errors, errors


# ------------------------------------------------------------------------------ the command

def _server_command():
    exe = shutil.which("coacto-server")
    return [exe] if exe else [sys.executable, "-m", "coacto.server.cli"]


def test_cli_serves_and_stops_cleanly(ctx, model, tmp_path):
    (tmp_path / "squeezenet.onnx").write_bytes(model["data"])
    proc = subprocess.Popen(_server_command() + [
        "--bind", "tcp://127.0.0.1:0", "--threads", "1", "--models", str(tmp_path),
        "--heartbeat-timeout", "5", "--json-log"], stderr=subprocess.PIPE, text=True)
    lines: queue.SimpleQueue = queue.SimpleQueue()  # a reader thread: readline may block
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True)
    reader.start()
    try:
        address, seen = None, []
        deadline = time.monotonic() + 30
        while address is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append(line)
            msg = json.loads(line)["message"]
            if msg.startswith("ready: "):
                address = msg.split()[1].rstrip(",")
        assert address, "".join(seen)
        assert any(model["tg"].model_hash in ln for ln in seen)  # models logged with hashes
        d = Device(ctx, address)
        try:
            assert d.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})[0]["t"] == P.HELLO_OK
            ensure_model(d, model["tg"], model["data"])  # compiled from the preloaded file
            cloud_inference(d, model, inf=1)
        finally:
            d.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        reader.join(5)  # EOF once the server is gone
        proc.stderr.close()


@pytest.mark.parametrize("args, text", [
    (["--bind", "tcp://nonsense", "--insecure"], "cannot bind"),
    (["--bind", "tcp://*:0"], "coacto keygen"),
    (["--bind", "tcp://127.0.0.1:0", "--models", "/nonexistent/models"], "does not exist"),
])
def test_cli_start_errors(args, text):
    r = subprocess.run(_server_command() + args + ["--server-flops", "1e9", "--threads", "1"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 1 and text in r.stderr, r.stderr


def test_cli_help_has_examples():
    r = subprocess.run(_server_command() + ["--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "examples:" in r.stdout and "--models" in r.stdout


# ------------------------------------------------------------------------------ pieces

def test_output_tiles_from_the_device_are_not_sent_back(device, model):
    from coacto.inference import NativeInference
    from coacto.runtime import NativeRuntime

    tg = model["tg"]
    li = tg.graph.outputs["output"]
    first = tg.plan.layer_first_tile
    mine = int(first[li])
    with NativeInference(NativeRuntime(1), tg) as local:
        local.set_inputs(model["feeds"])
        local.wait(10)
        own = local.get_tiles([mine])
    device.send({"t": P.BEGIN, "inf": "own", "graph_id": tg.graph_id})
    device.send(*tiles_message("own", [(mine, own)] + model["tiles"]))
    res, acks, done, _ = collect(device, tg, "own")
    assert mine not in res.tiles
    assert sorted(res.tiles + [mine]) == list(range(first[li], first[li + 1]))
    res.add([np.asarray([mine], "<i4").tobytes(), own.astype("<f4").tobytes()])
    assert_matches(res.outputs(), model["ref"])


def encoded_tiles_message(inf, tiles, enc, batch=0):
    ids = np.asarray([t for t, _ in tiles], dtype="<i4")
    parts = [np_encode(enc, d) for _, d in tiles]
    lens = np.asarray([len(p) for p in parts], dtype="<i4")
    return {"t": P.TILES, "inf": inf, "batch": batch, "t_send": time.monotonic(), "enc": enc}, \
        ids.tobytes(), lens.tobytes(), b"".join(parts)


@pytest.mark.parametrize("enc,rel", [("lossless", 1e-4), ("f16", 2e-2), ("int8", 0.2)])
def test_encoded_tiles_in_and_results_out(device, model, server, enc, rel):
    """A device that encodes its tiles as the protocol text says (numpy, not the runtime) and
    asks for lossless RESULTs gets onnxruntime's outputs (exactly, or within what the rounding
    of its own tiles costs), with fewer bytes than float32 would take."""
    tg = model["tg"]
    h, _ = device.rpc({"t": P.HELLO, "v": P.PROTOCOL_VERSION})
    assert set(h["transfer"]) == {"lossless", "f16", "int8"}
    inf = f"enc-{enc}"
    device.send({"t": P.BEGIN, "inf": inf, "graph_id": tg.graph_id, "result_enc": "lossless"})
    msg = encoded_tiles_message(inf, model["tiles"], enc)
    device.send(*msg)
    res, acks, done, others = collect(device, tg, inf)
    assert not [o for o in others if o["t"] == P.ERROR], others
    assert acks[0]["accepted"] == len(model["tiles"])
    raw_bytes = sum(d.nbytes for _, d in model["tiles"])
    # an image has no zeros: lossless sends it dense, the others at half and a quarter
    assert len(msg[3]) <= raw_bytes * {"lossless": 1.0, "f16": 0.5, "int8": 0.26}[enc]
    ref = model["ref"]
    got = res.outputs()
    for k in ref:
        scale = float(np.abs(ref[k]).max())
        assert float(np.abs(got[k] - ref[k]).max()) <= rel * scale, (k, enc)


def test_encoded_tiles_that_do_not_fit_are_refused_whole(device, model, server):
    tg = model["tg"]
    gid = tg.graph_id
    device.send({"t": P.BEGIN, "inf": "bad-enc", "graph_id": gid})
    header, ids, lens, data = encoded_tiles_message("bad-enc", model["tiles"][:2], "lossless")
    short = np.frombuffer(lens, "<i4").copy()
    short[0] -= 4
    bad = [
        [{**header, "enc": "zip"}, ids, lens, data],               # unknown encoding
        [{**header, "enc": 5}, ids, lens, data],
        [header, ids, data],                                       # no lengths frame
        [header, ids, lens[:-4], data],                            # a length short
        [header, ids, lens, data[:-1]],                            # data short of the lengths
        [header, ids, short.tobytes(), data[:-4]],                 # a tile short of its floats
        [header, ids, lens, data + b"\0"],
    ]
    for frames in bad:
        e = device.error(*frames)
        assert e["code"] == P.E_BAD_TILES and e["batch"] == 0, e
    e = device.error({"t": P.BEGIN, "inf": "bad-res", "graph_id": gid, "result_enc": "int8"})
    assert e["code"] == P.E_BAD_MESSAGE and "result_enc" in e["text"]
    # nothing of it was applied: the whole input, once, still makes an exact inference
    device.send(*tiles_message("bad-enc", model["tiles"]))
    res, acks, done, others = collect(device, tg, "bad-enc")
    assert acks[-1]["accepted"] == len(model["tiles"]) and acks[-1]["duplicates"] == 0
    assert_matches(res.outputs(), model["ref"])


def test_alpha_counts_other_devices_computing():
    from coacto.server.sessions import ALPHA_TAU, LoadAverage, alpha

    all_, mine, other = LoadAverage(0.0), LoadAverage(0.0), LoadAverage(0.0)
    assert alpha(all_, mine, 0.0) == 1.0
    all_.add(1, 0.0)
    mine.add(1, 0.0)        # only my own inference computes: no contention
    assert alpha(all_, mine, 10 * ALPHA_TAU) == pytest.approx(1.0)
    all_.add(2, 10 * ALPHA_TAU)
    other.add(2, 10 * ALPHA_TAU)  # two of another device's start computing
    a_soon = alpha(all_, mine, 10.5 * ALPHA_TAU)
    a_late = alpha(all_, mine, 30 * ALPHA_TAU)
    assert 1.0 < a_soon < a_late and a_late == pytest.approx(3.0, rel=1e-6)
    assert alpha(all_, other, 30 * ALPHA_TAU) == pytest.approx(2.0, rel=1e-6)


def test_stats_count_other_devices_that_began_inferences_and_bye_ends_a_session(
        ctx, server, model):
    """STATS' ``others``: devices other than the asker's that began an inference within
    SHARED_WINDOW_S (a device told its server is shared keeps its own work). HELLO's ``device``
    makes several connections one device; without it a connection counts alone. BYE drops the
    sender's session at once, and its device stops counting once no connection of it is left."""
    from types import SimpleNamespace

    from coacto.server.tenants import SHARED_WINDOW_S, Tenants

    names = ["one", "two", None, "one"]
    devs = [Device(ctx, server.address) for _ in names]
    try:
        for d, name in zip(devs, names):
            hello = {"t": P.HELLO, "v": P.PROTOCOL_VERSION, **({"device": name} if name else {})}
            assert d.rpc(hello)[0]["t"] == P.HELLO_OK
        for d in devs[:2]:
            ensure_model(d, model["tg"], model["data"])

        def others():
            return [d.rpc({"t": P.HEARTBEAT, "t_send": 1.0})[0]["others"] for d in devs]

        base = others()  # other tests' connections may have begun some
        cloud_inference(devs[0], model, inf="shared-0")
        cloud_inference(devs[1], model, inf="shared-1")
        cloud_inference(devs[1], model, inf="shared-2")  # one device, counted once
        assert [o - b for o, b in zip(others(), base)] == [1, 1, 2, 1]
        devices = server.stats()["devices"]
        devs[1].send({"t": P.BYE})
        assert devs[1].silent(), "BYE has no reply"
        assert server.stats()["devices"] == devices - 1
        devs.pop(1)
        base.pop(1)
        assert [o - b for o, b in zip(others(), base)] == [0, 1, 0]
        devs[0].send({"t": P.BYE})  # device "one" keeps a connection: still counted
        devs.pop(0)
        base.pop(0)
        assert [o - b for o, b in zip(others(), base)] == [1, 0]
    finally:
        for d in devs:
            d.close()
    # and a begin older than the window is forgotten
    t = SimpleNamespace(recent_begins={b"a": 0.0, b"b": 5.0, b"me": 6.0})
    me = SimpleNamespace(device_key=b"me")
    assert Tenants.others(t, me, 6.0) == 2
    assert Tenants.others(t, me, SHARED_WINDOW_S + 1.0) == 1
    assert list(t.recent_begins) == [b"b", b"me"]
    assert Tenants.others(t, me, SHARED_WINDOW_S + 10.0) == 0


def test_large_frames_both_ways(ctx, server):
    """Input and output tiles of hundreds of kB (zero-copy on the server's side)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1, "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["y"], ["z"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 32, 64, 64])], [w])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=8).SerializeToString()
    tg = coacto.compile(data, tiles_per_layer=2)
    feeds = {"x": rng.standard_normal((1, 16, 64, 64)).astype(np.float32)}
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ref = {"z": sess.run(["z"], feeds)[0]}
    model = {"tg": tg, "data": data, "feeds": feeds, "ref": ref, "tiles": input_tiles(tg, feeds)}
    assert min(d.nbytes for _, d in model["tiles"]) >= P.ZERO_COPY_MIN_BYTES
    d = Device(ctx, server.address)
    try:
        ensure_model(d, tg, data)
        cloud_inference(d, model, inf=1)
    finally:
        d.close()


def test_fuzzed_headers_never_crash(device, model, server):
    """Random field values of random types in every device message type: each answered with a
    proper error (never E_INTERNAL) or ignored, and the server keeps serving."""
    rng = np.random.default_rng(7)
    tg = model["tg"]
    pool = [None, True, False, -1, 0, 3, 2 ** 63, 2 ** 64 - 1, -2 ** 63, 1.5, float("nan"),
            float("inf"), "", "x" * 200, "0" * 64, tg.graph_id, tg.model_hash, [1, "a"],
            {"a": 1}, {"tiles_per_layer": "3"}, {"input_shapes": {"input": [1, 3, 0, 2]}},
            {"input_shapes": {"input": "abc"}}, b"\x00" * 8]
    fields = ["v", "client", "graph_id", "model_hash", "params", "inf", "batch", "t_send"]
    kinds = [P.HELLO, P.MODEL_QUERY, P.MODEL_UPLOAD, P.BEGIN, P.TILES, P.CANCEL, P.HEARTBEAT]
    frame_pool = [b"", b"\x01\x02\x03", np.asarray([0, 1], "<i4").tobytes(),
                  np.zeros(5, "<f4").tobytes()]
    for _ in range(300):
        h = {"t": kinds[rng.integers(len(kinds))]}
        for f in rng.choice(fields, size=rng.integers(0, 5), replace=False):
            h[str(f)] = pool[rng.integers(len(pool))]
        frames = [frame_pool[i] for i in rng.integers(len(frame_pool), size=rng.integers(0, 3))]
        device.send(h, *frames)
    device.send({"t": P.HEARTBEAT, "t_send": -7.0})
    codes = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        h, _ = device.recv()
        if h["t"] == P.ERROR:
            codes.append(h["code"])
            assert h["code"] != P.E_INTERNAL, h
        if h["t"] == P.STATS and h["t_send"] == -7.0:
            break
    else:
        raise AssertionError("the server stopped answering")
    assert len(codes) > 100
    for i in range(8):
        device.send({"t": P.CANCEL, "inf": i})
    for inf in (0, 3, -1, 2 ** 63, 2 ** 64 - 1, -2 ** 63, "0" * 64, tg.graph_id):
        device.send({"t": P.CANCEL, "inf": inf})
    cloud_inference(device, model, inf="after-fuzz")


def test_partition_params_a_device_may_ask_for():
    """The offloading partition (min_column_blocks), tuned profiles (layer_tiles) and graphs
    partitioned for a thread count (threads) compile on the server to the device's graph id; malformed values are refused with E_BAD_MESSAGE."""
    from coacto.server.store import ModelStore, StoreError, check_params

    model = zoo.build("squeezenet", image_size=32).SerializeToString()
    digest = hashlib.sha256(model).hexdigest()
    store = ModelStore()
    for kw in ({"min_column_blocks": 16}, {"layer_tiles": {3: 2, 5: 7}}, {"threads": 1}):
        tg = coacto.compile(model, **kw)
        entry = store.ensure_graph(tg.graph_id, digest, tg.params, data=model)
        assert entry is not None and entry.tg.graph_id == tg.graph_id
        assert entry.tg.n_tiles == tg.n_tiles
    assert check_params({"tiles_per_layer": None})["min_column_blocks"] == 0
    for bad in ({"min_column_blocks": -1}, {"min_column_blocks": "16"},
                {"layer_tiles": {"x": 2}}, {"layer_tiles": {"3": 0}}, {"layer_tiles": [1, 2]},
                {"layer_tiles": {"3": 1.5}}, {"threads": 0}, {"threads": 2.0}, {"threads": "1"}):
        with pytest.raises(StoreError) as e:
            check_params(bad)
        assert e.value.code == P.E_BAD_MESSAGE
    with pytest.raises(StoreError) as e:  # a layer the model does not have
        store.ensure_graph("0" * 64, digest, {"layer_tiles": {"999": 2}}, data=model)
    assert e.value.code == P.E_MODEL_INVALID
