"""Wire protocol between coacto-client (ZeroMQ DEALER) and coacto-server (ROUTER): constants and
the two helpers that build and parse messages. The full specification is docs/PROTOCOL.md.

A message is a multipart ZeroMQ message: frame 0 is a msgpack map (the header, always with "t",
the message type); further frames are raw bytes (tile ids as little-endian int32, tile data as
little-endian float32, an ONNX model). Nothing is ever pickled. The ROUTER side sees the DEALER's
identity frame in front.
"""
from __future__ import annotations

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# Message types (header "t").
HELLO = "hello"              # c->s {v, client, device?}             s->c HELLO_OK or ERROR
HELLO_OK = "hello_ok"        # s->c {v, server_flops, threads, max_model_bytes, heartbeat_s}
MODEL_QUERY = "model_query"  # c->s {graph_id, model_hash, params}   s->c MODEL_READY | MODEL_MISSING
MODEL_MISSING = "model_missing"  # s->c {graph_id, model_hash}
MODEL_UPLOAD = "model_upload"    # c->s {graph_id, model_hash, params} + [onnx bytes]
MODEL_READY = "model_ready"  # s->c {graph_id, tiles}
BEGIN = "begin"              # c->s {inf, graph_id, trace?}          (no reply; errors as ERROR)
TILES = "tiles"              # c->s {inf, batch, t_send, enc?} + [ids int32] + [lens int32, when
                             #   enc] + [data: float32, or tiles encoded as enc says]
ACK = "ack"                  # s->c {inf, batch, bytes, t_send, t_server}: one per TILES
RESULT = "result"            # s->c {inf, ts?, enc?} + [ids int32] + [lens int32, when enc] + [data]
CANCEL = "cancel"            # c->s {inf}: free the server's state for this inference
DONE = "done"                # s->c {inf}: every exit tile was sent
HEARTBEAT = "heartbeat"      # c->s {t_send}                         s->c STATS
STATS = "stats"              # s->c {t_send, t_server, alpha, inferences, devices, threads,
#                                    others?}
BYE = "bye"                  # c->s {}: the client is closing; no reply
ERROR = "error"              # s->c {code, text, inf?}
TRACE = "trace"              # s->c {inf, rows, ...} + [ids int32] + [t0 f64] + [t1 f64] + [worker
                             #   int32]: the server's side of an inference BEGIN asked to trace

MESSAGE_TYPES = frozenset({HELLO, HELLO_OK, MODEL_QUERY, MODEL_MISSING, MODEL_UPLOAD, MODEL_READY,
                           BEGIN, TILES, ACK, RESULT, CANCEL, DONE, HEARTBEAT, STATS, ERROR,
                           TRACE, BYE})

# Error codes (ERROR "code").
E_BAD_MESSAGE = 1        # malformed header or frames
E_VERSION = 2            # protocol version not spoken
E_UNKNOWN_MODEL = 3      # graph_id not loaded (query / upload first)
E_MODEL_TOO_LARGE = 4    # upload over the server's limit
E_MODEL_INVALID = 5      # upload does not hash to model_hash, or does not compile to graph_id
E_UNKNOWN_INFERENCE = 6  # inf not begun (or already freed)
E_BAD_TILES = 7          # unknown tile ids or sizes that do not match
E_BUSY = 8               # too many inferences in flight for this device
E_INTERNAL = 9
E_RESULTS_DROPPED = 10   # the device left too many results unread: this inference was dropped

#: Transfer encodings of tile data (docs/PROTOCOL.md §2): the wire name -> the runtime's mode.
#: "raw" is what a TILES or RESULT without `enc` carries; a server lists the others it reads in
#: HELLO_OK `transfer`.
TRANSFER_MODES = {"raw": 0, "lossless": 1, "f16": 2, "int8": 3}
LOSSY_TRANSFERS = frozenset({"f16", "int8"})

#: Frames at least this large are sent without copying (pyzmq zero-copy has a fixed cost).
ZERO_COPY_MIN_BYTES = 64 * 1024
#: Header frames larger than this are refused unparsed (by both sides: no header of this protocol
#: comes near it).
MAX_HEADER_BYTES = 64 * 1024
#: HELLO's optional ``device``: a token the client's process draws, naming the device behind
#: its connections (the server counts devices sharing it by it).
MAX_DEVICE_TOKEN_CHARS = 64

# TRACE rows: what the server did with one tile of a traced inference (the "worker" column).
TRACE_RECEIVED = -1   # arrived from the device: t0..t1 the server took in its TILES batch
TRACE_RETURNED = -2   # sent back: t0..t1 the server read it and handed its RESULT to the socket
#: TRACE rows at most per tile of the graph (a tile is computed once, returned once, and may be
#: received more than once); a server stops recording received tiles beyond this.
TRACE_ROWS_PER_TILE = 3


class ProtocolError(ValueError):
    """A message that does not follow this protocol."""


def pack(header: dict, *frames) -> list:
    """Header map + raw frames -> the frames of one multipart message."""
    return [msgpack.packb(header, use_bin_type=True), *frames]


def send(sock, frames: list, flags: int = 0, track: bool = False):
    """Sends one multipart message (for a ROUTER, the peer's identity first). Frames of
    ZERO_COPY_MIN_BYTES or more go without a copy; with ``track`` the last one always does, and
    the returned MessageTracker says when ZeroMQ is done with it (the parts leave in order, so
    with the whole message). Raises zmq.ZMQError (e.g. zmq.Again with DONTWAIT)."""
    import zmq

    last = len(frames) - 1
    tracker = None
    for i, part in enumerate(frames):
        more = zmq.SNDMORE if i < last else 0
        if track and i == last:
            tracker = sock.send(part, flags | more, copy=False, track=True)
        else:
            size = part.nbytes if isinstance(part, np.ndarray) else len(part)
            sock.send(part, flags | more, copy=size < ZERO_COPY_MIN_BYTES)
    return tracker


# ---------------------------------------------------------------------------- tile frames
# TILES and RESULT carry tiles the same way (docs/PROTOCOL.md §2): without `enc`, two frames
# (ids int32, data float32: each tile's values, tile after tile); with `enc`, three (ids int32,
# lens int32: each tile's encoded bytes, the encoded tiles one after the other).

def tile_frames(ids: np.ndarray, data: np.ndarray | None = None, lens: np.ndarray | None = None,
                encoded=None) -> list:
    """The raw frames of a TILES or RESULT message: (ids, data) plain, or (ids, lens, encoded)
    when the header carries `enc`."""
    ids = np.ascontiguousarray(ids, "<i4")
    if lens is None:
        return [ids, np.ascontiguousarray(data, "<f4")]
    return [ids, np.ascontiguousarray(lens, "<i4"), encoded]


class TileFrames:
    """Tile frames read and checked: ``ids`` (int32), then ``data`` (float32, aligned) when
    plain, or ``lens`` (int32) and ``encoded`` (a buffer) with ``enc``."""

    __slots__ = ("enc", "ids", "data", "lens", "encoded", "nbytes")

    def __init__(self, enc, ids, data, lens, encoded, nbytes):
        self.enc, self.ids, self.data, self.lens, self.encoded = enc, ids, data, lens, encoded
        self.nbytes = nbytes


def _buffer(frame):
    return getattr(frame, "buffer", frame)


def read_tile_frames(header: dict, frames: list, n_tiles: int,
                     tile_sizes: np.ndarray | None = None) -> TileFrames:
    """A TILES or RESULT message's raw frames, checked before anything is applied: a known `enc`,
    the frame count, sizes that hold whole int32 / float32 values (one length per id when
    encoded), ids in [0, n_tiles), and, plain and given ``tile_sizes`` (floats per tile), a data
    frame of exactly those tiles. What an encoded tile holds is checked where it is decoded (in
    C, before any tile is applied). Raises ProtocolError."""
    enc = header.get("enc")
    if enc is not None and (not isinstance(enc, str) or enc not in TRANSFER_MODES):
        raise ProtocolError(f"'enc' must be one of {', '.join(TRANSFER_MODES)}; got "
                            f"{str(enc)[:40]!r}")
    if len(frames) != (2 if enc is None else 3):
        raise ProtocolError("tiles travel as two frames after the header: tile ids (int32) and "
                            "tile data (float32); three with 'enc': ids, encoded lengths (int32) "
                            "and the encoded data")
    sizes = [len(f) for f in frames]
    if sizes[0] == 0 or sizes[0] % 4 or (enc is None and sizes[1] % 4) or \
            (enc is not None and sizes[1] != sizes[0]):
        raise ProtocolError(f"frame sizes {sizes} do not fit: ids are a non-empty multiple of 4 "
                            f"bytes" + (", float data too" if enc is None
                                        else ", one length per id"))
    ids = np.frombuffer(_buffer(frames[0]), dtype="<i4").astype(np.int32)
    if int(ids.min()) < 0 or int(ids.max()) >= n_tiles:
        raise ProtocolError(f"tile ids must be from 0 to {n_tiles - 1}")
    if enc is not None:
        lens = np.frombuffer(_buffer(frames[1]), dtype="<i4").astype(np.int32)
        return TileFrames(enc, ids, None, lens, _buffer(frames[2]), sum(sizes))
    if tile_sizes is not None:
        need = int(tile_sizes[ids].sum())
        if need * 4 != sizes[1]:
            raise ProtocolError(f"the data frame holds {sizes[1] // 4} floats; these {ids.size} "
                                f"tiles take {need}")
    data = np.frombuffer(_buffer(frames[1]), dtype="<f4")
    if data.ctypes.data % 4:
        data = data.copy()  # the runtime reads aligned floats
    return TileFrames(None, ids, data, None, None, sum(sizes))


def pack_trace_rows(ids, t0, t1, worker) -> list:
    """The four raw frames of a TRACE message: tile ids (int32), start and end times (float64,
    the server's clock) and worker (int32; TRACE_RECEIVED, TRACE_RETURNED or a thread index)."""
    return [np.ascontiguousarray(ids, "<i4"), np.ascontiguousarray(t0, "<f8"),
            np.ascontiguousarray(t1, "<f8"), np.ascontiguousarray(worker, "<i4")]


def unpack_trace_rows(header: dict, frames: list, n_tiles: int):
    """A TRACE message's frames -> (ids, t0, t1, worker) arrays, checked: four frames of matching
    lengths, ids in [0, n_tiles), finite times with t0 <= t1, workers >= TRACE_RETURNED, no more
    rows than TRACE_ROWS_PER_TILE per tile. Raises ProtocolError."""
    if len(frames) != 4:
        raise ProtocolError(f"TRACE carries 4 frames after the header, got {len(frames)}")
    sizes = [len(f) for f in frames]
    n, rem = divmod(sizes[0], 4)
    if rem or sizes != [4 * n, 8 * n, 8 * n, 4 * n]:
        raise ProtocolError(f"TRACE frames of {sizes} bytes do not hold the same number of rows "
                            "(int32, float64, float64, int32)")
    if header.get("rows") not in (None, n):
        raise ProtocolError(f"TRACE announces {header.get('rows')!r} rows and carries {n}")
    if n > TRACE_ROWS_PER_TILE * n_tiles:
        raise ProtocolError(f"TRACE of {n} rows for a graph of {n_tiles} tiles")
    ids, t0, t1, worker = (np.frombuffer(getattr(f, "buffer", f), dtype=d).copy()
                           for f, d in zip(frames, ("<i4", "<f8", "<f8", "<i4")))
    if n and (ids.min() < 0 or ids.max() >= n_tiles):
        raise ProtocolError(f"TRACE tile ids must be from 0 to {n_tiles - 1}")
    if not (np.isfinite(t0).all() and np.isfinite(t1).all() and (t1 >= t0).all()):
        raise ProtocolError("TRACE times must be finite, each end at or after its start")
    if n and worker.min() < TRACE_RETURNED:
        raise ProtocolError(f"TRACE worker {int(worker.min())} is not a thread index or a "
                            "TRACE_RECEIVED / TRACE_RETURNED row")
    return ids, t0, t1, worker


def unpack(frames: list) -> tuple[dict, list]:
    """Frames of one message (without the ROUTER identity) -> (header, raw frames)."""
    if not frames:
        raise ProtocolError("empty message")
    data = bytes(frames[0])
    if len(data) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header frame of {len(data)} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:
        raise ProtocolError(f"header is not msgpack: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str) \
            or header["t"] not in MESSAGE_TYPES:
        raise ProtocolError("header must be a map with a known 't'")
    return header, list(frames[1:])
