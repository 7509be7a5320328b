/* Tile data on the wire (PROTOCOL.md §2, "Transfer encodings"): a tile of n floats is sent dense
 * or as a bitmap of its non-zero values followed by those values, whichever is smaller, in one
 * of three value formats (float32: lossless; float16; int8 with a per-tile scale).
 *
 * Why a zero mask of our own and not a general codec: tiles cut after ReLU are 25-75% zeros and
 * the rest are float mantissas no byte-level codec shrinks much; measured on the zoo's ResNet-50,
 * MobileNetV2 and VGG-16 activations the mask is within 3% of zstd level 1 and smaller than LZ4,
 * at memory speed, and the encoded size follows from the non-zero count alone, so the send rule
 * prices every tile at the bytes it will really take before anything is copied. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_internal.h"

static int64_t value_bytes(int32_t mode) {
    switch (mode) {
    case COACTO_TRANSFER_RAW:
    case COACTO_TRANSFER_LOSSLESS: return 4;
    case COACTO_TRANSFER_F16: return 2;
    case COACTO_TRANSFER_INT8: return 1;
    default: return 0;
    }
}

static int64_t header_bytes(int32_t mode) { return mode == COACTO_TRANSFER_INT8 ? 4 : 0; }

int64_t wire_size_from_nnz(int32_t mode, int64_t n, int64_t nnz) {
    int64_t vb = value_bytes(mode);
    if (!vb || n < 1) return 0;
    int64_t dense = header_bytes(mode) + vb * n;
    if (mode == COACTO_TRANSFER_RAW) return dense;
    int64_t masked = header_bytes(mode) + (n + 7) / 8 + vb * nnz;
    return masked < dense ? masked : dense;
}

/* Non-zero by bit pattern: -0.0 and NaN payloads survive the lossless mode exactly. */
static int64_t count_nonzero(const float *x, int64_t n) {
    const uint32_t *u = (const uint32_t *)(const void *)x;
    int64_t nnz = 0;
    for (int64_t i = 0; i < n; i++) nnz += u[i] != 0;
    return nnz;
}

int64_t wire_tile_nnz(const coacto_graph *g, int32_t tile, const float *layer_buf) {
    const int32_t *b = &g->tile_bounds[4 * (size_t)tile];
    size_t rows = (size_t)(b[3] - b[2]), c = (size_t)g->layers[g->tile_layer[tile]].c;
    int64_t nnz = 0;
    for (int32_t col = b[0]; col < b[1]; col++)
        nnz += count_nonzero(layer_buf + (size_t)col * c + (size_t)b[2], (int64_t)rows);
    return nnz;
}

int64_t coacto_wire_size(int32_t mode, const float *x, int64_t n) {
    if (!x || n < 1 || !value_bytes(mode)) return 0;
    return wire_size_from_nnz(mode, n, mode == COACTO_TRANSFER_RAW ? n : count_nonzero(x, n));
}

/* float <-> IEEE half, round to nearest even; overflow goes to infinity, NaN stays NaN. */
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
    if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds above 65504 */
    if (mag < 0x38800000u) {                                   /* a half subnormal or zero */
        if (mag < 0x33000000u) return (uint16_t)sign;          /* below half the smallest */
        uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((mag - 0x38000000u) >> 13), rem = mag & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e) {
        u = sign | ((e + 112) << 23) | (m << 13);
    } else if (m) { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* int8: scale = max |finite x| / 127; infinities clamp to +-127, NaN becomes 0. */
static float int8_scale(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m && isfinite(a)) m = a;
    }
    return m / 127.0f;
}

static int8_t to_int8(float v, float inv) {
    if (v != v) return 0;
    float q = v * inv;
    if (q > 127.0f) return 127;
    if (q < -127.0f) return -127;
    return (int8_t)lrintf(q);
}

static void put_value(int32_t mode, uint8_t *out, float v, float inv) {
    if (mode == COACTO_TRANSFER_F16) {
        uint16_t h = f32_to_f16(v);
        memcpy(out, &h, 2);
    } else if (mode == COACTO_TRANSFER_INT8) {
        *out = (uint8_t)to_int8(v, inv);
    } else {
        memcpy(out, &v, 4);
    }
}

static float get_value(int32_t mode, const uint8_t *in, float scale) {
    if (mode == COACTO_TRANSFER_F16) {
        uint16_t h;
        memcpy(&h, in, 2);
        return f16_to_f32(h);
    }
    if (mode == COACTO_TRANSFER_INT8) return (float)(int8_t)*in * scale;
    float v;
    memcpy(&v, in, 4);
    return v;
}

int64_t coacto_wire_encode(int32_t mode, const float *x, int64_t n, uint8_t *out) {
    int64_t vb = value_bytes(mode);
    if (!x || !out || n < 1 || !vb) return 0;
    int64_t nnz = mode == COACTO_TRANSFER_RAW ? n : count_nonzero(x, n);
    int64_t size = wire_size_from_nnz(mode, n, nnz), hdr = header_bytes(mode);
    float inv = 0.0f;
    if (mode == COACTO_TRANSFER_INT8) {
        float scale = int8_scale(x, n);
        memcpy(out, &scale, 4);
        inv = scale > 0 ? 1.0f / scale : 0.0f;
    }
    uint8_t *p = out + hdr;
    if (size == hdr + vb * n) { /* dense */
        if (mode == COACTO_TRANSFER_RAW || mode == COACTO_TRANSFER_LOSSLESS) {
            memcpy(p, x, (size_t)n * 4);
        } else {
            for (int64_t i = 0; i < n; i++) put_value(mode, p + i * vb, x[i], inv);
        }
        return size;
    }
    const uint32_t *u = (const uint32_t *)(const void *)x;
    int64_t nb = (n + 7) / 8;
    uint8_t *v = p + nb;
    memset(p, 0, (size_t)nb);
    for (int64_t i = 0; i < n; i++) {
        if (!u[i]) continue;
        p[i >> 3] |= (uint8_t)(1u << (i & 7));
        put_value(mode, v, x[i], inv);
        v += vb;
    }
    return size;
}

static int popcount8(uint8_t b) { return __builtin_popcount(b); }

/* Checks one encoded tile and, when out is not NULL, decodes it. */
static coacto_status wire_parse(int32_t mode, const uint8_t *in, int64_t len, float *out,
                                int64_t n) {
    int64_t vb = value_bytes(mode), hdr = header_bytes(mode);
    if (!in || n < 1 || !vb || len < hdr) return COACTO_ERR_INVALID_ARGUMENT;
    float scale = 0.0f;
    if (mode == COACTO_TRANSFER_INT8) {
        memcpy(&scale, in, 4);
        if (!(scale >= 0.0f) || !isfinite(scale)) return COACTO_ERR_INVALID_ARGUMENT;
    }
    const uint8_t *p = in + hdr;
    if (len == hdr + vb * n) {
        if (!out) return COACTO_OK;
        if (vb == 4) {
            memcpy(out, p, (size_t)n * 4);
        } else {
            for (int64_t i = 0; i < n; i++) out[i] = get_value(mode, p + i * vb, scale);
        }
        return COACTO_OK;
    }
    if (mode == COACTO_TRANSFER_RAW) return COACTO_ERR_INVALID_ARGUMENT;
    int64_t nb = (n + 7) / 8, body = len - hdr - nb;
    if (body < 0 || body % vb) return COACTO_ERR_INVALID_ARGUMENT;
    int64_t k = body / vb, ones = 0;
    for (int64_t i = 0; i < nb; i++) ones += popcount8(p[i]);
    /* bits past the n-th must be clear: a bitmap says exactly which values follow */
    if ((n & 7) && (p[nb - 1] >> (n & 7))) return COACTO_ERR_INVALID_ARGUMENT;
    if (ones != k) return COACTO_ERR_INVALID_ARGUMENT;
    if (!out) return COACTO_OK;
    const uint8_t *v = p + nb;
    for (int64_t i = 0; i < n; i++) {
        if (p[i >> 3] & (1u << (i & 7))) {
            out[i] = get_value(mode, v, scale);
            v += vb;
        } else {
            out[i] = 0.0f;
        }
    }
    return COACTO_OK;
}

coacto_status coacto_wire_decode(int32_t mode, const uint8_t *in, int64_t len, float *out,
                                 int64_t n) {
    if (!out) return COACTO_ERR_INVALID_ARGUMENT;
    return wire_parse(mode, in, len, out, n);
}

/* ------------------------------------------------------------- batches of one inference's tiles */

coacto_status coacto_inference_put_tiles_encoded(coacto_inference *inf, int32_t mode,
                                                 const int32_t *ids, const int32_t *lens, int32_t n,
                                                 const uint8_t *data, int64_t n_bytes,
                                                 int32_t *accepted, int32_t *duplicates) {
    if (accepted) *accepted = 0;
    if (duplicates) *duplicates = 0;
    if (!inf || n < 0 || (n > 0 && (!ids || !lens || !data)) || !value_bytes(mode))
        return COACTO_ERR_INVALID_ARGUMENT;
    if (inplace_active(inf)) return COACTO_ERR_STATE;
    if (n == 0) return n_bytes == 0 ? COACTO_OK : COACTO_ERR_INVALID_ARGUMENT;
    /* Every id and length is checked before anything is allocated or applied. */
    int64_t bytes = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= inf->g->n_tiles || lens[i] < 0) return COACTO_ERR_INVALID_ARGUMENT;
        int64_t size = tile_floats(inf->g, ids[i]);
        if (lens[i] > header_bytes(mode) + value_bytes(mode) * size) return COACTO_ERR_INVALID_ARGUMENT;
        bytes += lens[i];
    }
    if (bytes != n_bytes) return COACTO_ERR_INVALID_ARGUMENT;
    /* Every tile's encoding is checked before any is applied; then each is decoded into one
     * buffer of the largest tile's size and put in turn. A bitmap of zeros is 32 times smaller
     * than its floats: decoding the whole batch at once would let a small frame demand a large
     * allocation. */
    int64_t at = 0, largest = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t size = tile_floats(inf->g, ids[i]);
        coacto_status st = wire_parse(mode, data + at, lens[i], NULL, size);
        if (st != COACTO_OK) return st;
        if (size > largest) largest = size;
        at += lens[i];
    }
    float *plain = malloc(sizeof(float) * (size_t)(largest ? largest : 1));
    if (!plain) return COACTO_ERR_OUT_OF_MEMORY;
    at = 0;
    coacto_status st = COACTO_OK;
    for (int32_t i = 0; i < n && st == COACTO_OK; i++) {
        int64_t size = tile_floats(inf->g, ids[i]);
        wire_parse(mode, data + at, lens[i], plain, size);
        at += lens[i];
        int32_t one_accepted = 0, one_duplicate = 0;
        st = coacto_inference_put_tiles(inf, &ids[i], 1, plain, size, &one_accepted,
                                        &one_duplicate);
        if (accepted) *accepted += one_accepted;
        if (duplicates) *duplicates += one_duplicate;
    }
    free(plain);
    return st;
}

coacto_status coacto_inference_get_tiles_encoded(coacto_inference *inf, int32_t mode,
                                                 const int32_t *ids, int32_t n, int32_t *lens,
                                                 uint8_t *out, int64_t max_bytes, int64_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    if (!inf || n < 0 || (n > 0 && (!ids || !lens || !out)) || !value_bytes(mode))
        return COACTO_ERR_INVALID_ARGUMENT;
    int64_t largest = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= inf->g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
        int64_t size = tile_floats(inf->g, ids[i]);
        if (size > largest) largest = size;
    }
    float *plain = malloc(sizeof(float) * (size_t)(largest ? largest : 1));
    if (!plain) return COACTO_ERR_OUT_OF_MEMORY;
    int64_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t size = tile_floats(inf->g, ids[i]);
        coacto_status st = coacto_inference_get_tile(inf, ids[i], plain, size);
        if (st == COACTO_OK && at + coacto_wire_size(mode, plain, size) > max_bytes)
            st = COACTO_ERR_INVALID_ARGUMENT;
        if (st != COACTO_OK) {
            free(plain);
            return st;
        }
        lens[i] = (int32_t)coacto_wire_encode(mode, plain, size, out + at);
        at += lens[i];
    }
    free(plain);
    if (n_bytes) *n_bytes = at;
    return COACTO_OK;
}
