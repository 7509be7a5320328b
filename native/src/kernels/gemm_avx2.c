/* AVX2 + FMA3 GEMM micro-kernel: 6 rows x 16 channels (two YMM vectors), 12 accumulators.
 *
 * Per reduction step: two aligned loads of the packed panel, 6 scalar broadcasts of A, 12 FMAs;
 * 12 accumulators + 2 panel vectors + 1 broadcast fit the 16 YMM registers. Each row count gets
 * its own fully unrolled body; partial channel blocks use masked loads and stores (vmaskmovps),
 * which never touch memory outside the mask.
 *
 * The functions carry target("avx2,fma") rather than the file being built with -mavx2: the
 * package is built with one set of flags and must load on CPUs without AVX2. */
#if defined(__x86_64__) || defined(_M_X64)
#include <assert.h>
#include <immintrin.h>

#include "kernels/gemm.h"

#define MR 6
#define NR 16

#if defined(__GNUC__) || defined(__clang__)
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define TARGET_AVX2
#define ALWAYS_INLINE __forceinline
#endif

#define UNROLL _Pragma("GCC unroll 8")

/* Lane j of the mask is set when j < n (n may be negative or above 8). */
static TARGET_AVX2 ALWAYS_INLINE __m256i lanes_below(long n)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const long clamped = n < 0 ? 0 : n > 8 ? 8 : n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)clamped), lane);
}

/* wide: the block has more than 8 channels; a narrower one (the last 8 of a layer of 24)
 * computes its first vector only, as in the AVX-512 kernel. */
static TARGET_AVX2 ALWAYS_INLINE void ukernel_rows(const size_t rows, const int wide, size_t nr,
                                                   size_t kc, const float *a, size_t lda,
                                                   const float *b, float *c, size_t ldc,
                                                   int accumulate, const gemm_epilogue *ep,
                                                   const float *b_next, int pf_quarter)
{
    __m256 acc0[MR], acc1[MR];
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        acc0[i] = _mm256_setzero_ps();
        acc1[i] = _mm256_setzero_ps();
    }
    if (ep && ep->residual) {
        /* The next row block's residual rows, read by the driver's next call: see the AVX-512
         * kernel. */
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const float *r = ep->residual + (i + MR) * ep->ld_residual;
            _mm_prefetch((const char *)r, _MM_HINT_T0);
            _mm_prefetch((const char *)(r + NR - 1), _MM_HINT_T0);
        }
    }
    /* The next slice (one line a step) or a quarter of it (one line every fourth step). */
    const char *pf = (const char *)b_next;
    const size_t skip = pf_quarter ? 3 : 0; /* steps whose low bits are set do not prefetch */
    for (size_t p = 0; p < kc; p++) {
        if (pf && (p & skip) == 0) {
            _mm_prefetch(pf, _MM_HINT_T1);
            pf += NR * sizeof(float);
        }
        const __m256 b0 = _mm256_load_ps(b);
        const __m256 b1 = wide ? _mm256_load_ps(b + 8) : b0;
        b += NR;
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const __m256 ai = _mm256_broadcast_ss(a + i * lda + p);
            acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
            if (wide) acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
        }
    }

    const int full = nr == NR;
    const __m256i m0 = lanes_below((long)nr), m1 = lanes_below((long)nr - 8);
    if (accumulate) {
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const float *cr = c + i * ldc;
            acc0[i] = _mm256_add_ps(acc0[i], full ? _mm256_loadu_ps(cr) : _mm256_maskload_ps(cr, m0));
            if (wide)
                acc1[i] = _mm256_add_ps(acc1[i], full ? _mm256_loadu_ps(cr + 8)
                                                      : _mm256_maskload_ps(cr + 8, m1));
        }
    }
    if (ep) {
        if (ep->bias) {
            const float *bias = ep->bias;
            const __m256 bias0 = full ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, m0);
            const __m256 bias1 = !wide ? bias0
                                 : full ? _mm256_loadu_ps(bias + 8)
                                        : _mm256_maskload_ps(bias + 8, m1);
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                acc0[i] = _mm256_add_ps(acc0[i], bias0);
                if (wide) acc1[i] = _mm256_add_ps(acc1[i], bias1);
            }
        }
        if (ep->residual) {
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                const float *r = ep->residual + i * ep->ld_residual;
                acc0[i] = _mm256_add_ps(acc0[i], full ? _mm256_loadu_ps(r) : _mm256_maskload_ps(r, m0));
                if (wide)
                    acc1[i] = _mm256_add_ps(acc1[i], full ? _mm256_loadu_ps(r + 8)
                                                          : _mm256_maskload_ps(r + 8, m1));
            }
        }
        /* max(lo, v) / min(hi, v) return v when v is NaN: NaN propagates like in the oracle. */
        const __m256 lo = _mm256_set1_ps(ep->lo), hi = _mm256_set1_ps(ep->hi);
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            acc0[i] = _mm256_min_ps(hi, _mm256_max_ps(lo, acc0[i]));
            if (wide) acc1[i] = _mm256_min_ps(hi, _mm256_max_ps(lo, acc1[i]));
        }
    }
    if (full) {
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            _mm256_storeu_ps(c + i * ldc, acc0[i]);
            _mm256_storeu_ps(c + i * ldc + 8, acc1[i]);
        }
    } else {
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            _mm256_maskstore_ps(c + i * ldc, m0, acc0[i]);
            if (wide) _mm256_maskstore_ps(c + i * ldc + 8, m1, acc1[i]);
        }
    }
}

#define ROWS_CASE(r) GEMM_TWO_VECTOR_ROWS_CASE(r)

TARGET_AVX2 void gemm_f32_6x16__avx2(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                                     const float *b_panel, float *c, size_t ldc, int accumulate,
                                     const gemm_epilogue *ep, const float *b_next, int pf_quarter)
{
    assert(mr <= MR && nr <= NR);
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6)
    default:
        break;
    }
}

#endif
