/* AVX-512F GEMM micro-kernel: 14 rows x 32 channels (two ZMM vectors), 28 accumulators.
 *
 * Per reduction step: two aligned loads of the packed panel, 14 scalar broadcasts of A, 28 FMAs.
 * 14 rows fit the spatial sizes of CNN stages (7x7, 14x14, 28x28, 56x56 are multiples of 7), and
 * every row count of 4 or more keeps at least 8 FMA chains in flight (two FMA ports x latency 4).
 * Each row count gets its own fully unrolled body, so partial row blocks cost only their rows;
 * partial channel blocks use masked loads and stores, never touching C outside the block.
 *
 * The function carries target("avx512f") rather than the file being built with -mavx512f: the
 * package is built with one set of flags and must load on CPUs without AVX-512. */
#if defined(__x86_64__) || defined(_M_X64)
#include <assert.h>
#include <immintrin.h>

#include "kernels/gemm.h"

#define MR 14
#define NR 32

#if defined(__GNUC__) || defined(__clang__)
#define TARGET_AVX512 __attribute__((target("avx512f")))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define TARGET_AVX512
#define ALWAYS_INLINE __forceinline
#endif

#define UNROLL _Pragma("GCC unroll 16")

/* Address of A's row i at the current reduction step. x86 addresses base + index * {1,2,4,8}
 * directly, so two bases (rows 0 and 5) and three strides (1, 3 and 5 rows) reach all 14 rows:
 * five registers instead of one pointer per row, which leaves enough general registers for the
 * loop to run without spills. i is a constant after unrolling, so the switch disappears. */
static ALWAYS_INLINE const float *row_at(size_t i, const char *a0, const char *a5, size_t s1,
                                         size_t s3, size_t s5)
{
    switch (i) {
    case 0: return (const float *)a0;
    case 1: return (const float *)(a0 + s1);
    case 2: return (const float *)(a0 + 2 * s1);
    case 3: return (const float *)(a0 + s3);
    case 4: return (const float *)(a0 + 4 * s1);
    case 5: return (const float *)a5;
    case 6: return (const float *)(a0 + 2 * s3);
    case 7: return (const float *)(a5 + 2 * s1);
    case 8: return (const float *)(a0 + 8 * s1);
    case 9: return (const float *)(a5 + 4 * s1);
    case 10: return (const float *)(a0 + 2 * s5);
    case 11: return (const float *)(a5 + 2 * s3);
    case 12: return (const float *)(a0 + 4 * s3);
    default: return (const float *)(a5 + 8 * s1);
    }
}

static TARGET_AVX512 ALWAYS_INLINE void ukernel_rows(const size_t rows, size_t nr, size_t kc,
                                                     const float *a, size_t lda, const float *b,
                                                     float *c, size_t ldc, int accumulate,
                                                     const gemm_epilogue *ep,
                                                     const float *b_next)
{
    __m512 acc0[MR], acc1[MR];
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        acc0[i] = _mm512_setzero_ps();
        acc1[i] = _mm512_setzero_ps();
    }
    const size_t s1 = lda * sizeof(float), s3 = 3 * s1, s5 = 5 * s1;
    const char *a0 = (const char *)a;
    const char *a5 = rows > 5 ? a0 + s5 : a0;
    if (ep && ep->residual) {
        /* The residual is cold (written layers ago) and read only at the end, where nothing
         * hides its latency: fetch the rows of the next row block, which the driver's next call
         * reads, now (prefetches never fault, past the matrix's end included). */
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const char *r = (const char *)(ep->residual + (i + MR) * ep->ld_residual);
            _mm_prefetch(r, _MM_HINT_T0);
            _mm_prefetch(r + 64, _MM_HINT_T0);
        }
    }
    const char *pf = (const char *)b_next; /* the next slice's two 64-byte lines per step */
    for (size_t p = 0; p < kc; p++) {
        if (pf) {
            _mm_prefetch(pf, _MM_HINT_T1);
            _mm_prefetch(pf + 64, _MM_HINT_T1);
            pf += NR * sizeof(float);
        }
        const __m512 b0 = _mm512_load_ps(b);
        const __m512 b1 = _mm512_load_ps(b + 16);
        b += NR;
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const __m512 ai = _mm512_set1_ps(*row_at(i, a0, a5, s1, s3, s5));
            acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
            acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
        }
        a0 += sizeof(float);
        a5 += sizeof(float);
    }

    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    const __mmask16 m1 = nr >= 32   ? (__mmask16)0xFFFF
                         : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u)
                                   : (__mmask16)0;
    if (accumulate) {
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            acc0[i] = _mm512_add_ps(acc0[i], _mm512_maskz_loadu_ps(m0, c + i * ldc));
            acc1[i] = _mm512_add_ps(acc1[i], _mm512_maskz_loadu_ps(m1, c + i * ldc + 16));
        }
    }
    if (ep) {
        if (ep->bias) {
            const __m512 bias0 = _mm512_maskz_loadu_ps(m0, ep->bias);
            const __m512 bias1 = _mm512_maskz_loadu_ps(m1, ep->bias + 16);
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                acc0[i] = _mm512_add_ps(acc0[i], bias0);
                acc1[i] = _mm512_add_ps(acc1[i], bias1);
            }
        }
        if (ep->residual) {
            const float *r = ep->residual;
            const size_t ldr = ep->ld_residual;
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                acc0[i] = _mm512_add_ps(acc0[i], _mm512_maskz_loadu_ps(m0, r + i * ldr));
                acc1[i] = _mm512_add_ps(acc1[i], _mm512_maskz_loadu_ps(m1, r + i * ldr + 16));
            }
        }
        /* max(lo, v) / min(hi, v) return v when v is NaN: NaN propagates like in the oracle. */
        const __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            acc0[i] = _mm512_min_ps(hi, _mm512_max_ps(lo, acc0[i]));
            acc1[i] = _mm512_min_ps(hi, _mm512_max_ps(lo, acc1[i]));
        }
    }
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
        _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
    }
}

#define ROWS_CASE(r)                                                                  \
    case r:                                                                           \
        ukernel_rows(r, nr, kc, a, lda, b_panel, c, ldc, accumulate, ep, b_next);             \
        break;

TARGET_AVX512 void gemm_f32_14x32__avx512f(size_t mr, size_t nr, size_t kc, const float *a,
                                           size_t lda, const float *b_panel, float *c,
                                           size_t ldc, int accumulate, const gemm_epilogue *ep,
                                           const float *b_next)
{
    assert(mr <= MR && nr <= NR);
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7)
        ROWS_CASE(8) ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13)
        ROWS_CASE(14)
    default:
        break;
    }
}

#endif
