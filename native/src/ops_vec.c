/* The vector maths the op families share: e^x, softmax's exponentials, sums and maxima, and the
 * activations, on eight-float vectors (OPS_F32X8) with an x86-64-v3 clone (OPS_CLONES). */
#include <math.h>
#include <string.h>

#include "kernels/vec.h"
#include "ops_internal.h"

/* e^x, relative error below 1e-7, for x clamped to [-88, 88] (exp8 clamps): round n = x / ln 2, reduce
 * r = x - n ln 2 (two-part constant), Cephes' polynomial for e^r, and 2^n built from its bits.
 * At -88, n = -127 and 2^n's bits are those of +0, so e^x is exactly 0 below float's normal range
 * (from about -87.3 on, a computing thread, which flushes subnormals, gets 0 too): a softmax over
 * masked scores gives masked keys a probability of 0, not a subnormal that slows every later
 * multiplication by it (BERT with padding: its attention products took 7x longer).
 *
 * Written on eight-float vectors: the compilers do not vectorize the scalar form (the integer to
 * float bit copy of 2^n stops them), and a scalar e^x made softmax 4x slower than onnxruntime's. */
typedef int32_t ops_i32x8 __attribute__((vector_size(32)));

static inline ops_f32x8 clamp8(ops_f32x8 x, float lo, float hi) {
    ops_f32x8 vlo = {lo, lo, lo, lo, lo, lo, lo, lo}, vhi = {hi, hi, hi, hi, hi, hi, hi, hi};
    ops_i32x8 below = x < vlo, above = x > vhi;
    x = (ops_f32x8)(((ops_i32x8)vlo & below) | ((ops_i32x8)x & ~below));
    return (ops_f32x8)(((ops_i32x8)vhi & above) | ((ops_i32x8)x & ~above));
}

static inline ops_f32x8 exp8(ops_f32x8 x) {
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    x = clamp8(x, -88.0f, 88.0f);
    ops_f32x8 t = x * 1.44269504088896341f + round_magic;
    ops_f32x8 n = t - round_magic;
    ops_f32x8 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    ops_f32x8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    ops_i32x8 bits = (__builtin_convertvector(n, ops_i32x8) + 127) << 23;
    return p * (ops_f32x8)bits;
}

/* The n < 8 floats at x as one vector (zeros after them), and back. */
static inline ops_f32x8 load_tail8(const float *x, size_t n) {
    ops_f32x8 v = {0};
    for (size_t j = 0; j < n; j++) v[j] = x[j];
    return v;
}

static inline void store_tail8(float *x, ops_f32x8 v, size_t n) {
    for (size_t j = 0; j < n; j++) x[j] = v[j];
}

OPS_CLONES void ops_exp(float *restrict x, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) OPS_F32X8(x + i) = exp8(OPS_F32X8(x + i));
    if (i < n) store_tail8(x + i, exp8(load_tail8(x + i, n - i)), n - i);
}

/* One softmax row: e = e^(x - max x) (x and e may not overlap); returns the sum of e and stores
 * max x. One pass for the maximum, one that subtracts, exponentiates, stores and sums in vectors
 * (the row stays in L1). */
OPS_CLONES float ops_softmax_exp(const float *restrict x, float *restrict e, size_t n,
                                 float *max_out) {
    float m = ops_max(x, n);
    *max_out = m;
    ops_f32x8 acc = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        ops_f32x8 v = exp8(OPS_F32X8(x + i) - m);
        OPS_F32X8(e + i) = v;
        acc += v;
    }
    if (i < n) {
        store_tail8(e + i, exp8(load_tail8(x + i, n - i) - m), n - i);
        acc[0] += ops_sum(e + i, n - i);
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* o[i] = x[i] * s. */
OPS_CLONES void ops_scale(const float *restrict x, float *restrict o, size_t n, float s) {
    for (size_t i = 0; i < n; i++) o[i] = x[i] * s;
}

/* Eight partial sums, combined pairwise: the loop vectorizes without reassociation flags and the
 * rounding error grows with n / 8 only. */
OPS_CLONES float ops_sum(const float *restrict x, size_t n) {
    ops_f32x8 acc = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc += OPS_F32X8(x + i);
    float tail = 0.0f;
    for (; i < n; i++) tail += x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

/* Eight running maxima (selects through integer masks: C has no vector ?:); NaN is the result when
 * any element is NaN. */
OPS_CLONES float ops_max(const float *restrict x, size_t n) {
    typedef int32_t i32x8 __attribute__((vector_size(32)));
    float m = x[0];
    size_t i = 0;
    int any_nan = 0;
    if (n >= 8) {
        ops_f32x8 acc = OPS_F32X8(x);
        i32x8 nan = acc != acc;
        for (i = 8; i + 8 <= n; i += 8) {
            ops_f32x8 v = OPS_F32X8(x + i);
            i32x8 gt = v > acc;
            acc = (ops_f32x8)(((i32x8)v & gt) | ((i32x8)acc & ~gt));
            nan |= v != v;
        }
        m = acc[0];
        for (int l = 0; l < 8; l++) {
            m = acc[l] > m ? acc[l] : m;
            any_nan |= nan[l];
        }
    }
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        any_nan |= x[i] != x[i];
    }
    return any_nan ? NAN : m;
}

/* erf(u) in place for u already clamped to [-4, 4], absolute error below 5e-7: an odd over an even
 * polynomial (the rational form of Eigen's and XLA's fast erf). The clamp lives in the callers'
 * separate loops: inside, the compiler branches and stops vectorizing (as for ops_exp). */
static inline void erf_clamped(float *restrict u, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = u[i], x2 = x * x;
        float p = -2.72614225801306e-10f;
        p = p * x2 + 2.77068142495902e-08f;
        p = p * x2 + -2.10102402082508e-06f;
        p = p * x2 + -5.69250639462346e-05f;
        p = p * x2 + -7.34990630326855e-04f;
        p = p * x2 + -2.95459980854025e-03f;
        p = p * x2 + -1.60960333262415e-02f;
        float q = -1.45660718464996e-05f;
        q = q * x2 + -2.13374055278905e-04f;
        q = q * x2 + -1.68282697438203e-03f;
        q = q * x2 + -7.37332916720468e-03f;
        q = q * x2 + -1.42647390514189e-02f;
        u[i] = x * p / q;
    }
}

/* erf(x) or GELU(x) = x * (1 + erf(x / sqrt 2)) / 2 in place, in blocks that stay in L1 (one
 * pass in AVX-512 where the kernels may use it: ViT's 7.3 million GELUs took 2 ms a run here). */
OPS_CLONES static void ops_act_erf_family(float *restrict x, size_t n, int gelu) {
#if defined(__x86_64__) || defined(_M_X64)
    if (vec_avx512_usable()) {
        vec_erf_family_avx512(x, n, gelu);
        return;
    }
#endif
    float u[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t m = n - i0 < 256 ? n - i0 : 256;
        float *restrict v = x + i0;
        float k = gelu ? 0.70710678118654752f : 1.0f;
        for (size_t i = 0; i < m; i++) {
            float t = v[i] * k;
            t = t < -4.0f ? -4.0f : t;
            u[i] = t > 4.0f ? 4.0f : t;
        }
        erf_clamped(u, m);
        if (gelu)
            for (size_t i = 0; i < m; i++) v[i] = 0.5f * v[i] * (1.0f + u[i]);
        else
            for (size_t i = 0; i < m; i++) v[i] = u[i];
    }
}

/* In blocks that stay in L1: u = 2 sqrt(2/pi) (x + 0.044715 x^3), e^u, then the product. */
OPS_CLONES static void ops_act_gelu_tanh(float *restrict x, size_t n) {
    float u[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t m = n - i0 < 256 ? n - i0 : 256;
        float *restrict v = x + i0;
        for (size_t i = 0; i < m; i++)
            u[i] = 1.5957691216057308f * (v[i] + 0.044715f * v[i] * v[i] * v[i]);
        ops_exp(u, m);
        for (size_t i = 0; i < m; i++) v[i] = v[i] - v[i] / (1.0f + u[i]);
    }
}

/* e^x with ONNX's saturation: ops_exp clamps its argument, so the lanes beyond float range are
 * set afterwards (inf above, 0 below, NaN kept). */
OPS_CLONES static void ops_act_exp(float *restrict x, size_t n) {
    float keep[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t m = n - i0 < 256 ? n - i0 : 256;
        float *restrict v = x + i0;
        for (size_t i = 0; i < m; i++) keep[i] = v[i];
        ops_exp(v, m);
        for (size_t i = 0; i < m; i++) {
            float e = keep[i] > 88.72283f ? INFINITY : v[i];
            e = keep[i] < -103.97f ? 0.0f : e;
            v[i] = keep[i] != keep[i] ? keep[i] : e;
        }
    }
}

/* The exponential-linear family in place, in blocks that stay in L1:
 * gamma * (x > 0 ? x : alpha * (e^(x * inv) - 1)). ELU is gamma = inv = 1, SELU gamma = beta,
 * CELU inv = 1 / alpha. x is clamped to <= 0 before the exponent, so the positive lanes cannot
 * overflow and turn into NaN in the select (and a negative CELU alpha keeps its x < 0 lanes). */
OPS_CLONES static void ops_act_elu_family(float *restrict x, size_t n, float alpha, float gamma,
                                          float inv) {
    float u[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t m = n - i0 < 256 ? n - i0 : 256;
        float *restrict v = x + i0;
        for (size_t i = 0; i < m; i++) u[i] = (v[i] > 0.0f ? 0.0f : v[i]) * inv;
        ops_exp(u, m);
        for (size_t i = 0; i < m; i++) {
            float neg = alpha * (u[i] - 1.0f);
            v[i] = gamma * (v[i] > 0.0f ? v[i] : neg);
        }
    }
}

/* log(1 + e^x) = max(x, 0) + log1p(e^-|x|), in blocks that stay in L1. With t = e^-|x| in
 * (0, 1], log1p(t) = 2 atanh(s) for s = t / (2 + t) in (0, 1/3]: the odd series of atanh to
 * s^15 is within 2e-8 relative of it, and is plain arithmetic the compiler vectorizes (there is
 * no vector log to call). NaN propagates through both terms. */
OPS_CLONES static void ops_act_softplus(float *restrict x, size_t n) {
    float u[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t m = n - i0 < 256 ? n - i0 : 256;
        float *restrict v = x + i0;
        for (size_t i = 0; i < m; i++) u[i] = v[i] > 0.0f ? -v[i] : v[i];
        ops_exp(u, m);
        for (size_t i = 0; i < m; i++) {
            float s = u[i] / (2.0f + u[i]), s2 = s * s;
            float p = 1.0f / 15.0f;
            p = p * s2 + 1.0f / 13.0f;
            p = p * s2 + 1.0f / 11.0f;
            p = p * s2 + 1.0f / 9.0f;
            p = p * s2 + 1.0f / 7.0f;
            p = p * s2 + 1.0f / 5.0f;
            p = p * s2 + 1.0f / 3.0f;
            p = p * s2 + 1.0f;
            float pos = v[i] > 0.0f ? v[i] : 0.0f;
            v[i] = pos + 2.0f * s * p;
        }
    }
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
    case COACTO_ACT_SQRT:
        for (size_t i = 0; i < n; i++) x[i] = sqrtf(x[i]);
        break;
    case COACTO_ACT_ERF:
        ops_act_erf_family(x, n, 0);
        break;
    case COACTO_ACT_GELU: /* x * (1 + erf(x / sqrt 2)) / 2 */
        ops_act_erf_family(x, n, 1);
        break;
    case COACTO_ACT_GELU_TANH: /* x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) / 2, with
                                  1 + tanh(u) = 2 - 2 / (1 + e^2u) */
        ops_act_gelu_tanh(x, n);
        break;
    case COACTO_ACT_RECIPROCAL:
        for (size_t i = 0; i < n; i++) x[i] = 1.0f / x[i];
        break;
    case COACTO_ACT_EXP:
        ops_act_exp(x, n);
        break;
    case COACTO_ACT_ISNAN:
        for (size_t i = 0; i < n; i++) x[i] = x[i] != x[i] ? 1.0f : 0.0f;
        break;
    case COACTO_ACT_ELU: /* x > 0 ? x : alpha (e^x - 1) */
        ops_act_elu_family(x, n, alpha, 1.0f, 1.0f);
        break;
    case COACTO_ACT_SELU: /* gamma (beta) times ELU */
        ops_act_elu_family(x, n, alpha, beta, 1.0f);
        break;
    case COACTO_ACT_CELU: /* x > 0 ? x : alpha (e^(x / alpha) - 1) */
        ops_act_elu_family(x, n, alpha, 1.0f, 1.0f / alpha);
        break;
    case COACTO_ACT_SOFTPLUS:
        ops_act_softplus(x, n);
        break;
    case COACTO_ACT_SOFTSIGN:
        for (size_t i = 0; i < n; i++) {
            float a = x[i] < 0.0f ? -x[i] : x[i];
            x[i] = x[i] / (1.0f + a);
        }
        break;
    case COACTO_ACT_THRESHOLDED_RELU: /* x > alpha ? x : 0 */
        for (size_t i = 0; i < n; i++) x[i] = x[i] > alpha ? x[i] : 0.0f;
        break;
    case COACTO_ACT_ABS:
        for (size_t i = 0; i < n; i++) x[i] = fabsf(x[i]);
        break;
    case COACTO_ACT_FLOOR:
        for (size_t i = 0; i < n; i++) x[i] = floorf(x[i]);
        break;
    case COACTO_ACT_CEIL:
        for (size_t i = 0; i < n; i++) x[i] = ceilf(x[i]);
        break;
    case COACTO_ACT_ROUND: /* ONNX rounds halves to even: the default rounding mode's rint, not
                              roundf (halves away from zero) */
        for (size_t i = 0; i < n; i++) x[i] = nearbyintf(x[i]);
        break;
    case COACTO_ACT_SIGN: /* 0 and NaN are their own sign */
        for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? 1.0f : x[i] < 0.0f ? -1.0f : x[i];
        break;
    case COACTO_ACT_LOG: /* libm's, element by element: within an ulp, -inf at 0 and NaN below.
                            Log is rare in the models coacto runs; exactness comes first */
        for (size_t i = 0; i < n; i++) x[i] = logf(x[i]);
        break;
    default: break; /* NONE */
    }
}
