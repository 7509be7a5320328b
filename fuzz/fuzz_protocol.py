"""Fuzz target: the wire protocol as the server reads it. Each input is a sequence of messages
handed to a real ``coacto.server.Server``'s dispatch path, with no sockets in between: the header
decoder (``protocol.unpack``), the header field checks (``tenants.parse_inf_id``, hashes, params,
encodings), the TILES frame checks and the native tile intake, inferences begun and computed on
a tiny preloaded model, and ``protocol.unpack_trace_rows`` on every message that says it is a
TRACE (the device's side of that decoder).

``check(data)`` returns when the server answered every message as the protocol says (a reply, an
ERROR with a code, or a silent drop); it raises when the server hit an unexpected exception (it
logs one and answers E_INTERNAL: the exception is raised again here) or a decoder raised
something other than ProtocolError.

Input encoding (several frames, several messages, in one byte string):

    input   := message*
    message := u8 control, then (control & 7) frames: the header frame first, then raw frames
               (0 frames: a bare identity, which the server ignores); control bit 3 set: the
               message comes from a second device
    frame   := u32 little-endian length L, then L bytes (fewer where the input ends first)

In every frame, the 64 bytes ``g`` * 64 become the preloaded model's graph_id and ``h`` * 64
its model hash (same lengths, so a msgpack header stays valid): seeds reach the model by name
without depending on how it compiles. The seeds (fuzz/corpus/protocol/) are written by

    python fuzz/fuzz_protocol.py --write-seeds

and a run is

    python fuzz/fuzz_protocol.py /tmp/protocol-corpus fuzz/corpus/protocol -max_total_time=120

(libFuzzer writes new inputs into the first folder: give it a scratch copy, not the committed
seeds; fuzz/run does). A crash is saved as ./crash-<sha1>: keep it as
tests/fuzz_crashes/protocol/<name> once fixed.
"""
from __future__ import annotations

import logging
import struct
import sys
import tempfile
import time
from pathlib import Path

GRAPH_TOKEN = b"g" * 64
MODEL_TOKEN = b"h" * 64
SECOND_DEVICE = 0x08
#: A tile graph's tile count for unpack_trace_rows when no model says otherwise.
TRACE_TILES = 16

_server = None


def frames_of(data: bytes) -> list[tuple[bool, list[bytes]]]:
    """The input's messages: (from the second device, frames)."""
    messages, i = [], 0
    while i < len(data):
        control = data[i]
        i += 1
        frames = []
        for _ in range(control & 7):
            n = int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little")
            i += 4
            frames.append(data[i:i + n])
            i += n
        messages.append((bool(control & SECOND_DEVICE), frames))
    return messages


def encode(messages: list[tuple[bool, list[bytes]]]) -> bytes:
    """The inverse of frames_of (for the seeds)."""
    out = bytearray()
    for second, frames in messages:
        assert len(frames) < 8
        out.append(len(frames) | (SECOND_DEVICE if second else 0))
        for f in frames:
            out += struct.pack("<I", len(f)) + f
    return bytes(out)


def tiny_model() -> bytes:
    """A 1x1 convolution + ReLU on a 2x4x4 input: a few tiles, computed in microseconds."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
        "fuzz_tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _fuzz_server():
    """One server for the whole run (made on the first input): no I/O thread, replies kept in
    ``sent``, the tiny model preloaded."""
    global _server
    if _server is not None:
        return _server
    from coacto.server import Server

    class InlineServer(Server):
        """The caller hands messages to _dispatch and drives reports and compile jobs itself."""

        def _loop(self) -> None:
            return  # the I/O thread ends at once: nothing runs beside the fuzzer

        def _send(self, identity, header, *frames, track=False):
            import msgpack

            msgpack.packb(header, use_bin_type=True)  # a reply that cannot be sent is a bug too
            self.sent.append((identity, header, frames))
            return None

    import coacto

    # the ONNX bytes (MODEL_QUERY by hash compiles them) and a tile graph of them (BEGIN)
    models = Path(tempfile.mkdtemp(prefix="coacto-fuzz-"))
    (models / "tiny.onnx").write_bytes(tiny_model())
    coacto.compile(tiny_model(), tiles_per_layer=2).save(models / "tiny.ctg")
    srv = InlineServer("inproc://coacto-fuzz-protocol", threads=1, models=models,
                       server_flops=1e9, max_model_bytes=1 << 20, heartbeat_timeout=60.0)
    srv.sent = []
    srv.start()
    srv._thread.join()
    import hashlib

    loaded = next(m for m in srv.loaded_models if m["kind"] == "ctg")
    srv.fuzz_graph_id = loaded["graph_id"].encode()
    srv.fuzz_model_hash = hashlib.sha256((models / "tiny.onnx").read_bytes()).hexdigest().encode()
    srv.fuzz_errors = _ErrorLog()
    logging.getLogger("coacto").addHandler(srv.fuzz_errors)
    _server = srv
    return srv


class _ErrorLog(logging.Handler):
    """Keeps the records of level ERROR and above: the server logs every unexpected exception."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _check_trace(frames: list[bytes]) -> None:
    from coacto import protocol as P

    try:
        header, raw = P.unpack(frames)
    except P.ProtocolError:
        return
    if header["t"] == P.TRACE:
        try:
            P.unpack_trace_rows(header, raw, TRACE_TILES)
        except P.ProtocolError:
            pass


def _settle(srv, timeout: float = 2.0) -> None:
    """Waits (bounded) for the compile jobs and the computing inferences the input started, so
    their replies are checked with this input and nothing carries over to the next."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        srv._drain_wake()
        srv._drain_reports()
        if not srv._jobs_pending and not srv.tenants.computing:
            return
        time.sleep(0.001)


def check(data: bytes) -> None:
    import zmq

    from coacto import protocol as P

    srv = _fuzz_server()
    srv.sent.clear()
    srv.fuzz_errors.records.clear()
    identities = (b"\0fuzz-device-a", b"\0fuzz-device-b")
    try:
        for second, frames in frames_of(data):
            frames = [f.replace(GRAPH_TOKEN, srv.fuzz_graph_id).replace(MODEL_TOKEN,
                                                                        srv.fuzz_model_hash)
                      for f in frames]
            if frames:
                _check_trace(frames)
            srv._dispatch([zmq.Frame(identities[second])] + [zmq.Frame(f) for f in frames])
            srv._drain_reports()
        _settle(srv)
    finally:
        srv.tenants.drop_all("the fuzz input ended")
    for record in srv.fuzz_errors.records:
        if record.exc_info and record.exc_info[1] is not None:
            raise record.exc_info[1]
        raise AssertionError(f"the server logged an error: {record.getMessage()}")
    for _, header, _ in srv.sent:
        if header.get("t") == P.ERROR and header.get("code") == P.E_INTERNAL:
            raise AssertionError(f"the server answered E_INTERNAL: {header.get('text')}")


# ------------------------------------------------------------------------------ seeds

def seeds() -> dict[str, bytes]:
    """Valid conversations with the tiny model, and a few near misses."""
    import msgpack
    import numpy as np

    from coacto import protocol as P

    def h(**fields) -> bytes:
        return msgpack.packb(fields, use_bin_type=True)

    g, m = GRAPH_TOKEN.decode(), MODEL_TOKEN.decode()
    hello = [h(t=P.HELLO, v=P.PROTOCOL_VERSION, client="fuzz")]
    begin = [h(t=P.BEGIN, inf=1, graph_id=g)]
    # The tiny model's input layer: 4x4 positions of 2 channels, as one tile per id below; the
    # server answers E_BAD_TILES where the tiling differs, which is a fine seed too.
    ids = np.arange(2, dtype="<i4")
    data = np.linspace(-1, 1, 32, dtype="<f4")
    tiles = [h(t=P.TILES, inf=1, batch=0, t_send=0.0), ids.tobytes(), data.tobytes()]
    trace = [h(t=P.TRACE, inf=1, rows=2), np.array([0, 1], "<i4").tobytes(),
             np.zeros(2, "<f8").tobytes(), np.ones(2, "<f8").tobytes(),
             np.array([0, P.TRACE_RECEIVED], "<i4").tobytes()]
    return {
        "hello": encode([(False, hello)]),
        "hello_bad_version": encode([(False, [h(t=P.HELLO, v=99)])]),
        "model_query": encode([(False, hello), (False, [h(t=P.MODEL_QUERY, graph_id=g,
                                                          model_hash=m, params={})])]),
        # the right model under another graph_id: compiled on the worker thread, then refused
        "model_query_compile": encode([(False, [h(t=P.MODEL_QUERY, graph_id="0" * 64,
                                                  model_hash=m, params={"tiles_per_layer": 3})])]),
        "model_upload": encode([(False, [h(t=P.MODEL_UPLOAD, graph_id=g, model_hash=m,
                                           params={}), tiny_model()])]),
        "begin_tiles": encode([(False, hello), (False, begin), (False, tiles)]),
        "begin_tiles_traced": encode([(False, [h(t=P.BEGIN, inf="a", graph_id=g, trace=True,
                                                 result_enc="lossless")]),
                                      (False, [h(t=P.TILES, inf="a", batch="x", enc="lossless"),
                                               ids.tobytes(), np.array([64, 64], "<i4").tobytes(),
                                               data.tobytes()])]),
        "cancel_other_device": encode([(False, begin), (True, [h(t=P.CANCEL, inf=1)]),
                                       (False, [h(t=P.CANCEL, inf=1)])]),
        "heartbeat": encode([(False, [h(t=P.HEARTBEAT, t_send=1.5)])]),
        "trace_rows": encode([(False, trace)]),
        "not_msgpack": encode([(False, [b"\xc1garbage"]), (False, [])]),
    }


def write_seeds() -> None:
    out = Path(__file__).resolve().parent / "corpus" / "protocol"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    for name, data in seeds().items():
        (out / name).write_bytes(data)
    print(f"{len(seeds())} seeds in {out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-seeds"]:
        write_seeds()
        sys.exit(0)
    import atheris

    # coacto's modules only: instrumenting numpy, onnx and zmq costs seconds at every start and
    # slows each input for coverage of code that is not under test
    with atheris.instrument_imports(include=["coacto"]):
        import coacto.protocol  # noqa: F401
        import coacto.server.server  # noqa: F401
        import coacto.server.tenants  # noqa: F401
        import coacto.server.sessions  # noqa: F401
        import coacto.server.store  # noqa: F401
        import coacto.inference  # noqa: F401
    logging.disable(logging.WARNING)  # INFO chatter per input; ERROR still reaches check
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()
