/* Tile executors: the checks every op shares, dispatch, activations. The op families live in
 * ops_conv.c, ops_pool.c and ops_misc.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_internal.h"

coacto_status ops_fail(char *err, size_t err_size, const char *fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return COACTO_ERR_INVALID_GRAPH;
}

int64_t ops_mul(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return -1;
    if (a == 0 || b == 0) return 0;
    if (a > OPS_MAX_ELEMENTS / b) return -1;
    return a * b;
}

coacto_status ops_check_array(const layer *l, int index, int64_t bytes, const char *what,
                              char *err, size_t err_size) {
    int64_t have = l->array_bytes[index];
    if (bytes == 0) {
        OPS_REQUIRE(have == 0, "array %d (%s) must be absent, has %lld bytes", index, what,
                    (long long)have);
        return COACTO_OK;
    }
    OPS_REQUIRE(have == bytes, "array %d (%s) has %lld bytes, expected %lld", index, what,
                (long long)have, (long long)bytes);
    OPS_REQUIRE(l->arrays[index] != NULL && (uintptr_t)l->arrays[index] % sizeof(float) == 0,
                "array %d (%s) is missing or misaligned", index, what);
    return COACTO_OK;
}

coacto_status ops_check_same_dims(const layer *l, int i, char *err, size_t err_size) {
    OPS_REQUIRE(l->in_n[i] == l->n && l->in_c[i] == l->c && l->in_h[i] == l->h &&
                    l->in_w[i] == l->w,
                "input %d is %dx%dx%dx%d (NCHW), the output %dx%dx%dx%d: they must be equal", i,
                l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i], l->n, l->c, l->h, l->w);
    return COACTO_OK;
}

float *ops_alloc_floats(size_t floats) {
    size_t bytes = ops_round_up((floats ? floats : 1) * sizeof(float), 64);
    return aligned_alloc(64, bytes);
}

/* Tensor size with every product checked; -1 when out of range. */
static int64_t elements(int32_t n, int32_t c, int32_t h, int32_t w) {
    return ops_mul(ops_mul(ops_mul(n, c), h), w);
}

/* Number of inputs each op takes: [min, max]. */
static void input_range(int32_t op, int *lo, int *hi) {
    *lo = 1;
    *hi = 1;
    switch (op) {
    case COACTO_OP_INPUT: *lo = *hi = 0; break;
    case COACTO_OP_CONV:
    case COACTO_OP_BINARY: *hi = 2; break;
    case COACTO_OP_CONCAT:
    case COACTO_OP_GATHER: *hi = COACTO_MAX_INPUTS; break;
    case COACTO_OP_NOP: *lo = 0; *hi = COACTO_MAX_INPUTS; break;
    default: break;
    }
}

/* A kernel the caller picked (tests sweep every one) is kept when it is one of gemm_available(). */
static const gemm_kernel *known_kernel(const gemm_kernel *k) {
    if (k)
        for (const gemm_kernel *const *a = gemm_available(); *a; a++)
            if (*a == k) return k;
    return NULL;
}

coacto_status op_prepare(layer *l, char *err, size_t err_size) {
    l->kern = known_kernel(l->kern);
    l->packed = NULL;
    l->packed_group_stride = 0;
    l->scratch_per_col = 0;
    l->scratch_fixed = 0;
    l->variant = 0;
    l->block_cols = 0;
    l->arrays_consumed = 0;
    if (err && err_size) err[0] = '\0';

    OPS_REQUIRE(l->op >= 0 && l->op < COACTO_OP_COUNT, "unknown op code %d", l->op);
    int lo, hi;
    input_range(l->op, &lo, &hi);
    OPS_REQUIRE(l->n_inputs >= lo && l->n_inputs <= hi, "op %d takes %d to %d inputs, got %d",
                l->op, lo, hi, l->n_inputs);
    OPS_REQUIRE(elements(l->n, l->c, l->h, l->w) > 0 && (int64_t)l->n * l->h * l->w <= INT32_MAX,
                "output dims %dx%dx%dx%d (NCHW) are out of range", l->n, l->c, l->h, l->w);
    for (int i = 0; i < l->n_inputs; i++)
        OPS_REQUIRE(elements(l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i]) > 0,
                    "input %d dims %dx%dx%dx%d (NCHW) are out of range", i, l->in_n[i],
                    l->in_c[i], l->in_h[i], l->in_w[i]);
    if (l->op != COACTO_OP_NOP) {
        /* Arrays an op does not use must be absent; ops check the ones they use themselves. */
        static const int used[COACTO_OP_COUNT] = {
            [COACTO_OP_CONV] = 2, [COACTO_OP_BINARY] = 1, [COACTO_OP_AFFINE] = 2,
            [COACTO_OP_GATHER] = 1,
        };
        for (int a = used[l->op]; a < 4; a++)
            OPS_REQUIRE(l->array_bytes[a] == 0, "array %d must be absent for op %d", a, l->op);
    }

    switch (l->op) {
    case COACTO_OP_CONV: return conv_prepare(l, err, err_size);
    case COACTO_OP_POOL: return pool_prepare(l, err, err_size);
    case COACTO_OP_GLOBAL_POOL: return global_pool_prepare(l, err, err_size);
    case COACTO_OP_BINARY: return binary_prepare(l, err, err_size);
    case COACTO_OP_AFFINE: return affine_prepare(l, err, err_size);
    case COACTO_OP_CONCAT: return concat_prepare(l, err, err_size);
    case COACTO_OP_GATHER: return gather_prepare(l, err, err_size);
    case COACTO_OP_LRN: return lrn_prepare(l, err, err_size);
    case COACTO_OP_SOFTMAX: return softmax_prepare(l, err, err_size);
    default: return COACTO_OK; /* INPUT, NOP */
    }
}

void op_release(layer *l) {
    free(l->packed);
    l->packed = NULL;
}

void op_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                int32_t row0, int32_t row1, float *scratch) {
    if (col0 >= col1 || row0 >= row1) return;
    switch (l->op) {
    case COACTO_OP_CONV: conv_execute(l, in, out, col0, col1, row0, row1, scratch); break;
    case COACTO_OP_POOL: pool_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_GLOBAL_POOL: global_pool_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_BINARY: binary_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_AFFINE: affine_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_CONCAT: concat_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_GATHER: gather_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_LRN: lrn_execute(l, in, out, col0, col1, row0, row1); break;
    case COACTO_OP_SOFTMAX: softmax_execute(l, in, out, col0, col1, row0, row1, scratch); break;
    default: break; /* INPUT is never executed; NOP does nothing */
    }
}

/* e^x, relative error below 1e-7, for x already clamped to [-87, 88] (so 2^n stays a normal
 * float): round n = x / ln 2, reduce r = x - n ln 2 (two-part constant), Cephes' polynomial for
 * e^r, and 2^n built from its bits. The clamp lives in a separate loop on purpose: inside, the
 * compiler branches to the saturated constants and stops vectorizing. */
static inline float exp_clamped(float x) {
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + round_magic;
    float n = t - round_magic;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {((int32_t)n + 127) * (1 << 23)};
    return p * scale.f;
}

OPS_CLONES void ops_exp(float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i] < -87.0f ? -87.0f : x[i];
        x[i] = v > 88.0f ? 88.0f : v;
    }
    for (size_t i = 0; i < n; i++) x[i] = exp_clamped(x[i]);
}

/* One loop per activation, each written so that it vectorizes (min / max selects only; several
 * passes over a span that stays in L1 where an activation needs e^x). */
OPS_CLONES void ops_act_apply(float *restrict x, size_t n, int32_t act, float alpha, float beta) {
    switch (act) {
    case COACTO_ACT_RELU:
        for (size_t i = 0; i < n; i++) x[i] = x[i] < 0.0f ? 0.0f : x[i];
        break;
    case COACTO_ACT_CLIP:
        for (size_t i = 0; i < n; i++) {
            float v = x[i] < alpha ? alpha : x[i];
            x[i] = v > beta ? beta : v;
        }
        break;
    case COACTO_ACT_LEAKY:
        for (size_t i = 0; i < n; i++) {
            float pos = x[i] > 0.0f ? x[i] : 0.0f, neg = x[i] < 0.0f ? x[i] : 0.0f;
            x[i] = pos + alpha * neg;
        }
        break;
    case COACTO_ACT_SIGMOID: /* 1 / (1 + e^-x) */
        for (size_t i = 0; i < n; i++) x[i] = -x[i];
        ops_exp(x, n);
        for (size_t i = 0; i < n; i++) x[i] = 1.0f / (1.0f + x[i]);
        break;
    case COACTO_ACT_HARDSIGMOID:
        for (size_t i = 0; i < n; i++) {
            float v = alpha * x[i] + beta;
            v = v < 0.0f ? 0.0f : v;
            x[i] = v > 1.0f ? 1.0f : v;
        }
        break;
    case COACTO_ACT_HARDSWISH: /* x * clamp(x + 3, 0, 6) / 6: no product with an exact 1 that
                                  the compiler would fold into a branch */
        for (size_t i = 0; i < n; i++) {
            float v = x[i] + 3.0f;
            v = v < 0.0f ? 0.0f : v;
            v = v > 6.0f ? 6.0f : v;
            x[i] = x[i] * v * (1.0f / 6.0f);
        }
        break;
    case COACTO_ACT_TANH: /* 1 - 2 / (1 + e^2x): absolute error about 1e-7 near 0 */
        for (size_t i = 0; i < n; i++) x[i] *= 2.0f;
        ops_exp(x, n);
        for (size_t i = 0; i < n; i++) x[i] = 1.0f - 2.0f / (1.0f + x[i]);
        break;
    default: break; /* NONE */
    }
}
