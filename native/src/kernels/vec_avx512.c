/* Softmax rows with AVX-512F (vec.h): sixteen floats a vector where ops_vec.c's portable form
 * computes eight, and masked loads and stores for a row's tail where it loops over elements.
 * ViT's 197-key attention rows ran at 2.4x onnxruntime's time in the portable form.
 *
 * The same e^x as ops_vec.c's exp8 (Cephes' polynomial, 2^n from its bits, x clamped to
 * [-88, 88] so that e^-88 and below are exactly 0), so both forms agree to a few roundings.
 * The functions carry target("avx512f"): the package is built with one set of flags and must
 * load on CPUs without AVX-512. */
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels/vec.h"

#include <immintrin.h>
#include <math.h>

#define TARGET_AVX512 __attribute__((target("avx512f")))

static TARGET_AVX512 inline __m512 exp16(__m512 x)
{
    /* max(lo, x) and min(hi, x) return x when it is NaN: NaN propagates */
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-88.0f), x));
    const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23: adding it rounds */
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic),
                                   magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(1.9875691500e-4f), _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i bits =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

static inline __mmask16 tail_mask(size_t left) { return (__mmask16)((1u << left) - 1u); }

TARGET_AVX512 float vec_softmax_exp_avx512(const float *restrict x, float *restrict e, size_t n,
                                           float *max_out)
{
    /* The maximum, NaN when any element is NaN (max_ps alone would drop it). */
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    if (i < n) {
        const __mmask16 k = tail_mask(n - i);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
        nan |= _mm512_mask_cmp_ps_mask(k, v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    const float mx = nan ? NAN : _mm512_reduce_max_ps(m);
    *max_out = mx;
    const __m512 mv = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m512 v = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(e + i, v);
        acc = _mm512_add_ps(acc, v);
    }
    if (i < n) {
        const __mmask16 k = tail_mask(n - i);
        const __m512 v = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv));
        _mm512_mask_storeu_ps(e + i, k, v);
        acc = _mm512_mask_add_ps(acc, k, acc, v);
    }
    return _mm512_reduce_add_ps(acc);
}

/* erf(u) for u clamped to [-4, 4]: ops_vec.c's rational polynomial, one pass. */
static TARGET_AVX512 inline __m512 erf16(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(4.0f), _mm512_max_ps(_mm512_set1_ps(-4.0f), x));
    const __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.77068142495902e-08f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.10102402082508e-06f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-5.69250639462346e-05f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-7.34990630326855e-04f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.95459980854025e-03f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.60960333262415e-02f));
    __m512 q = _mm512_set1_ps(-1.45660718464996e-05f);
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-2.13374055278905e-04f));
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.68282697438203e-03f));
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-7.37332916720468e-03f));
    q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.42647390514189e-02f));
    return _mm512_div_ps(_mm512_mul_ps(x, p), q);
}

TARGET_AVX512 void vec_erf_family_avx512(float *x, size_t n, int gelu)
{
    const __m512 k = _mm512_set1_ps(gelu ? 0.70710678118654752f : 1.0f);
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 e = erf16(_mm512_mul_ps(v, k));
        _mm512_storeu_ps(x + i, gelu ? _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e)) : e);
    }
    if (i < n) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __m512 e = erf16(_mm512_mul_ps(v, k));
        _mm512_mask_storeu_ps(x + i, m,
                              gelu ? _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e)) : e);
    }
}

TARGET_AVX512 void vec_layernorm_avx512(const float *restrict x, float *restrict o, size_t c,
                                        size_t row0, size_t row1, const float *restrict scale,
                                        const float *restrict shift, float eps)
{
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= c; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
    if (i < c) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(tail_mask(c - i), x + i));
    const float mean = _mm512_reduce_add_ps(acc) / (float)c;
    const __m512 mv = _mm512_set1_ps(mean);
    acc = _mm512_setzero_ps();
    for (i = 0; i + 16 <= c; i += 16) {
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), mv);
        acc = _mm512_fmadd_ps(d, d, acc);
    }
    if (i < c) {
        const __mmask16 k = tail_mask(c - i);
        const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + i), mv);
        acc = _mm512_fmadd_ps(d, d, acc);
    }
    const float var = _mm512_reduce_add_ps(acc) / (float)c;
    const __m512 rstd = _mm512_set1_ps(1.0f / sqrtf(var + eps));
    for (i = row0; i + 16 <= row1; i += 16) {
        const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv), rstd);
        _mm512_storeu_ps(o + i, _mm512_fmadd_ps(d, _mm512_loadu_ps(scale + i), _mm512_loadu_ps(shift + i)));
    }
    if (i < row1) {
        const __mmask16 k = tail_mask(row1 - i);
        const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv), rstd);
        _mm512_mask_storeu_ps(o + i, k, _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(k, scale + i),
                                                         _mm512_maskz_loadu_ps(k, shift + i)));
    }
}

TARGET_AVX512 void vec_scale_avx512(const float *restrict x, float *restrict o, size_t n, float s)
{
    const __m512 sv = _mm512_set1_ps(s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), sv));
    if (i < n) {
        const __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv));
    }
}
#endif
