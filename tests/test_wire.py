"""Tile transfer encodings (docs/PROTOCOL.md §2) against numpy oracles: lossless is bit-exact and
takes the bitmap-or-dense size, f16 equals numpy's float16 rounding bit for bit, int8 stays within
half a step of its per-tile scale; the decoder refuses every length, bitmap and scale that does not
describe the tile, and a batch with one bad tile applies none."""
from __future__ import annotations

import numpy as np
import pytest

import coacto
from coacto import protocol as P
from coacto.errors import InputError
from coacto.inference import NativeInference, wire_ratios
from coacto.runtime import NativeRuntime, ffi, lib

from conftest import zoo_model

MODES = P.TRANSFER_MODES


def encode(mode: str, x) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    size = lib.coacto_wire_size(MODES[mode], ffi.from_buffer("float[]", x), x.size)
    out = np.zeros(size, np.uint8)
    written = lib.coacto_wire_encode(MODES[mode], ffi.from_buffer("float[]", x), x.size,
                                     ffi.from_buffer("uint8_t[]", out))
    assert written == size
    return out


def decode(mode: str, b, n: int):
    b = np.ascontiguousarray(b, np.uint8)
    out = np.full(n, 7.0, np.float32)
    st = lib.coacto_wire_decode(MODES[mode], ffi.from_buffer("uint8_t[]", b) if b.size else
                                ffi.NULL, b.size, ffi.from_buffer("float[]", out), n)
    return st, out


def expected_size(mode: str, x: np.ndarray) -> int:
    n = x.size
    nnz = int(np.count_nonzero(x.view(np.uint32)))
    vb, hdr = {"raw": (4, 0), "lossless": (4, 0), "f16": (2, 0), "int8": (1, 4)}[mode]
    dense = hdr + vb * n
    return dense if mode == "raw" else min(dense, hdr + (n + 7) // 8 + vb * nnz)


def relu_like(rng, n, zeros=0.5):
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < zeros] = 0.0
    return x


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 63, 64, 65, 1000])
@pytest.mark.parametrize("zeros", [0.0, 0.5, 0.97, 1.0])
def test_lossless_is_bit_exact_at_the_smaller_size(n, zeros):
    rng = np.random.default_rng(n)
    x = relu_like(rng, n, zeros)
    for mode in ("raw", "lossless"):
        b = encode(mode, x)
        assert b.size == expected_size(mode, x)
        st, y = decode(mode, b, n)
        assert st == lib.COACTO_OK
        assert np.array_equal(y.view(np.uint32), x.view(np.uint32))


def test_lossless_keeps_negative_zero_nan_payloads_and_infinities():
    x = np.array([0.0, -0.0, np.inf, -np.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1e-45],
                 np.float32)
    x = np.concatenate([x, np.frombuffer(np.uint32(0x7fc01234).tobytes(), np.float32)])
    b = encode("lossless", x)
    assert b.size < 4 * x.size  # the mask pays: 6 of 12 are +0.0
    st, y = decode("lossless", b, x.size)
    assert st == lib.COACTO_OK and np.array_equal(y.view(np.uint32), x.view(np.uint32))


def test_f16_rounds_as_numpy_does_bit_for_bit():
    rng = np.random.default_rng(1)
    mags = 10.0 ** rng.uniform(-9, 6, 200_000)
    x = (rng.choice([-1, 1], mags.size) * mags).astype(np.float32)
    edges = [65504, 65519.99, 65520, 1e6, 6.1e-5, 6.09e-5, 5.96e-8, 2.98e-8, 2.9802322e-08,
             1e-8, np.inf, -np.inf, np.nan, 0.0, -0.0]
    x = np.concatenate([x, np.asarray(edges, np.float32), np.zeros(50_000, np.float32)])
    b = encode("f16", x)
    assert b.size == expected_size("f16", x)
    st, y = decode("f16", b, x.size)
    assert st == lib.COACTO_OK
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    same = (y.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(y) & np.isnan(ref))
    assert same.all(), (x[~same][:5], y[~same][:5], ref[~same][:5])


@pytest.mark.parametrize("zeros", [0.0, 0.6, 1.0])
def test_int8_stays_within_half_a_step_of_its_scale(zeros):
    rng = np.random.default_rng(2)
    x = relu_like(rng, 4099, zeros) * 3.0
    b = encode("int8", x)
    assert b.size == expected_size("int8", x)
    scale = float(np.abs(x).max()) / 127
    assert np.frombuffer(b[:4].tobytes(), np.float32)[0] == pytest.approx(scale, rel=1e-6)
    st, y = decode("int8", b, x.size)
    assert st == lib.COACTO_OK
    assert np.abs(y - x).max() <= 0.5 * scale * (1 + 1e-5) + 1e-30
    assert (y[x == 0] == 0).all()


def test_int8_non_finite_values():
    x = np.array([1.0, -2.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    st, y = decode("int8", encode("int8", x), x.size)
    assert st == lib.COACTO_OK
    s = 2.0 / 127
    assert y.tolist() == pytest.approx([round(1 / s) * s, -2.0, 0.0, 2.0, -2.0, 0.0], rel=1e-6)


def test_the_decoder_refuses_what_does_not_describe_the_tile():
    rng = np.random.default_rng(3)
    x = relu_like(rng, 20, 0.5)
    bad = lib.COACTO_ERR_INVALID_ARGUMENT
    for mode in ("lossless", "f16", "int8"):
        b = encode(mode, x)
        assert decode(mode, b, 20)[0] == lib.COACTO_OK
        assert decode(mode, b[:-1], 20)[0] == bad                   # a value short
        assert decode(mode, np.concatenate([b, b[-1:]]), 21)[0] == bad  # a value too many
        flipped = b.copy()
        hdr = 4 if mode == "int8" else 0
        byte = int(flipped[hdr])
        flipped[hdr] = byte & (byte - 1) if byte else 1  # one bit more or less: a count off
        assert decode(mode, flipped, 20)[0] == bad
        padded = b.copy()
        padded[hdr + 2] |= 0x80  # bit 23 of a 20-value bitmap: past the tile
        assert decode(mode, padded, 20)[0] == bad
        assert decode(mode, np.zeros(0, np.uint8), 20)[0] == bad
    # int8 scales that are no scale
    b = encode("int8", x)
    for scale in (-1.0, np.nan, np.inf):
        c = b.copy()
        c[:4] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)
        assert decode("int8", c, 20)[0] == bad
    # raw has no masked form; a bad mode is refused
    assert decode("raw", encode("lossless", x), 20)[0] == bad
    assert lib.coacto_wire_size(9, ffi.from_buffer("float[]", x), 20) == 0


@pytest.fixture(scope="module")
def squeeze_tg():
    from coacto import zoo

    model = zoo_model("squeezenet")
    return coacto.compile(model, tiles_per_layer=4), zoo.input_feeds(model, seed=0)


def test_a_batch_with_one_bad_tile_applies_none(squeeze_tg):
    tg, feeds = squeeze_tg
    rt = NativeRuntime(1)
    with NativeInference(rt, tg) as src, NativeInference(rt, tg) as dst:
        src.set_transfer("lossless", measure=True)
        src.set_inputs(feeds)
        src.wait()
        out_layer = next(iter(tg.graph.outputs.values()))
        first = tg.plan.layer_first_tile
        ids = np.arange(first[out_layer], first[out_layer + 1], dtype=np.int32)
        lens, data = src.get_tiles_encoded("lossless", ids)
        assert lens.sum() == data.size
        broken = lens.copy()
        broken[-1] -= 1
        with pytest.raises(InputError, match="lengths, bitmaps or scales"):
            dst.put_tiles_encoded("lossless", ids, broken, data[:-1])
        with pytest.raises(InputError):
            dst.put_tiles_encoded("lossless", ids, lens, data[:-1])  # the sum does not match
        assert all(dst.tile_state(int(t)) != src.tile_state(int(t)) for t in ids)
        assert dst.put_tiles_encoded("lossless", ids, lens, data) == (ids.size, 0)
        assert np.array_equal(dst.get_tiles(ids), src.get_tiles(ids))
        # the same tile three times, as a bitmap of zeros (32x smaller than its floats: decoded
        # one tile at a time, never the whole batch at once): one applied, two duplicates
        with NativeInference(rt, tg) as fresh:
            t0 = int(ids[0])
            zeros = encode("lossless", np.zeros(int(tg.plan.tile_bytes[t0]) // 4, np.float32))
            three = np.full(3, t0, np.int32)
            got = fresh.put_tiles_encoded("lossless", three, np.full(3, zeros.size, np.int32),
                                          np.concatenate([zeros] * 3))
            assert got == (1, 2)
            assert not fresh.get_tiles([t0]).any()
        # a tile id out of range, a negative length, an unknown encoding
        with pytest.raises(InputError):
            dst.put_tiles_encoded("lossless", np.array([tg.n_tiles], np.int32), lens[:1],
                                  data[:lens[0]])
        with pytest.raises(InputError):
            dst.put_tiles_encoded("lossless", ids[:1], np.array([-4], np.int32), data[:0])
        with pytest.raises(InputError, match="unknown transfer"):
            dst.put_tiles_encoded("zip", ids[:1], lens[:1], data[:lens[0]])


def test_measured_wire_sizes_are_the_encoded_sizes_of_every_layer(squeeze_tg):
    tg, feeds = squeeze_tg
    ratio = wire_ratios(tg, "lossless", feeds)
    with NativeInference(NativeRuntime(1), tg) as ni:
        ni.set_transfer("lossless", measure=True)
        ni.set_inputs(feeds)
        ni.wait()
        raw, enc = ni.wire_bytes()
        # the oracle: the output layer's tiles read back and sized tile by tile in numpy
        out_layer = next(iter(tg.graph.outputs.values()))
        first = tg.plan.layer_first_tile
        sizes = []
        for t in range(first[out_layer], first[out_layer + 1]):
            sizes.append(expected_size("lossless", ni.get_tiles([t])))
    assert enc[out_layer] == sum(sizes)
    assert np.array_equal(raw, [int(np.prod(layer.shape)) * 4 for layer in tg.graph.layers])
    assert (enc <= raw).all() and (enc < raw).sum() >= len(raw) // 3  # ReLU outputs shrink
    assert np.allclose(ratio, enc / raw)
    assert wire_ratios(tg, "f16", feeds).max() <= 0.5 + 1e-9
    assert wire_ratios(tg, "int8", feeds).max() < 0.3
