"""Wire protocol between coacto-client (ZeroMQ DEALER) and coacto-server (ROUTER): constants and
the two helpers that build and parse messages. The full specification is docs/PROTOCOL.md.

A message is a multipart ZeroMQ message: frame 0 is a msgpack map (the header, always with "t",
the message type); further frames are raw bytes (tile ids as little-endian int32, tile data as
little-endian float32, an ONNX model). Nothing is ever pickled. The ROUTER side sees the DEALER's
identity frame in front.
"""
from __future__ import annotations

import msgpack

PROTOCOL_VERSION = 1

# Message types (header "t").
HELLO = "hello"              # c->s {v, client}                      s->c HELLO_OK or ERROR
HELLO_OK = "hello_ok"        # s->c {v, server_flops, threads, max_model_bytes, heartbeat_s}
MODEL_QUERY = "model_query"  # c->s {graph_id, model_hash, params}   s->c MODEL_READY | MODEL_MISSING
MODEL_MISSING = "model_missing"  # s->c {graph_id, model_hash}
MODEL_UPLOAD = "model_upload"    # c->s {graph_id, model_hash, params} + [onnx bytes]
MODEL_READY = "model_ready"  # s->c {graph_id, tiles}
BEGIN = "begin"              # c->s {inf, graph_id}                  (no reply; errors as ERROR)
TILES = "tiles"              # c->s {inf, batch, t_send} + [ids int32] + [data float32]
ACK = "ack"                  # s->c {inf, batch, bytes, t_send, t_server}: one per TILES
RESULT = "result"            # s->c {inf} + [ids int32] + [data float32]: exit tiles
CANCEL = "cancel"            # c->s {inf}: free the server's state for this inference
DONE = "done"                # s->c {inf}: every exit tile was sent
HEARTBEAT = "heartbeat"      # c->s {t_send}                         s->c STATS
STATS = "stats"              # s->c {t_send, t_server, alpha, inferences, devices, threads}
ERROR = "error"              # s->c {code, text, inf?}

MESSAGE_TYPES = frozenset({HELLO, HELLO_OK, MODEL_QUERY, MODEL_MISSING, MODEL_UPLOAD, MODEL_READY,
                           BEGIN, TILES, ACK, RESULT, CANCEL, DONE, HEARTBEAT, STATS, ERROR})

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

#: Frames at least this large are sent without copying (pyzmq zero-copy has a fixed cost).
ZERO_COPY_MIN_BYTES = 64 * 1024
#: Header frames larger than this are refused unparsed.
MAX_HEADER_BYTES = 1 << 20


class ProtocolError(ValueError):
    """A message that does not follow this protocol."""


def pack(header: dict, *frames) -> list:
    """Header map + raw frames -> the frames of one multipart message."""
    return [msgpack.packb(header, use_bin_type=True), *frames]


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
