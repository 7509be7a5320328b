"""docs/PROTOCOL.md is checked against coacto.protocol, which encodes every message: the same
message types, error codes and header limit, and tile frames that round-trip and are refused
when malformed."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from coacto import protocol as P

DOC = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md").read_text()


def test_every_message_type_has_its_section():
    documented = {m.group(1).lower() for m in re.finditer(r"^### ([A-Z_]+) \(", DOC, re.M)}
    assert documented == set(P.MESSAGE_TYPES)


def test_error_codes_agree():
    documented = {m.group(2): int(m.group(1))
                  for m in re.finditer(r"^\| (\d+) \| `(E_[A-Z_]+)` \|", DOC, re.M)}
    in_code = {name: getattr(P, name) for name in dir(P) if name.startswith("E_")}
    assert documented == in_code


def test_header_limit_agrees():
    assert P.MAX_HEADER_BYTES == 64 * 1024
    assert "header over 64 KiB" in DOC and "| header frame | 64 KiB |" in DOC


def test_tile_frames_round_trip_and_refusals():
    ids = np.array([3, 1], np.int32)
    sizes = np.array([0, 2, 0, 3], np.int64)
    data = np.arange(5, dtype=np.float32)
    frames = [bytes(np.asarray(f)) for f in P.tile_frames(ids, data)]
    got = P.read_tile_frames({}, frames, 4, sizes)
    assert got.enc is None and got.ids.tolist() == [3, 1] and got.data.tolist() == data.tolist()
    lens = np.array([7, 5], np.int32)
    frames = [bytes(np.asarray(f)) for f in P.tile_frames(ids, lens=lens, encoded=b"x" * 12)]
    got = P.read_tile_frames({"enc": "lossless"}, frames, 4)
    assert got.enc == "lossless" and got.lens.tolist() == [7, 5] and bytes(got.encoded) == b"x" * 12
    bad = [({}, [ids.tobytes()], "two frames"),
           ({"enc": "zip"}, [ids.tobytes(), b"", b""], "'enc' must be one of"),
           ({}, [b"", b""], "non-empty"),
           ({}, [np.array([4], np.int32).tobytes(), data[:3].tobytes()], "from 0 to 3"),
           ({}, [ids.tobytes(), data[:4].tobytes()], "holds 4 floats; these 2 tiles take 5"),
           ({"enc": "lossless"}, [ids.tobytes(), lens[:1].tobytes(), b""], "one length per id")]
    for header, frames, text in bad:
        with pytest.raises(P.ProtocolError, match=text):
            P.read_tile_frames(header, frames, 4, sizes)
