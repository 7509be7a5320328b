/* AArch64 NEON GEMM micro-kernel: 6 rows x 16 channels (four Q vectors), 24 accumulators.
 *
 * Per reduction step: four loads of the packed panel, 6 broadcast loads of A (ld1r), 24 FMAs;
 * 24 accumulators + 4 panel vectors + 2 broadcasts stay within the 32 vector registers. Each row
 * count gets its own unrolled body. A partial channel block runs the same full-width body on a
 * small stack copy (C, bias and residual padded to 16) and copies back only its mr x nr values,
 * so C outside the block is never touched; it computes only the vectors its channels reach (the
 * last 8 of a layer of 24: two of four), the others staying zero. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "kernels/gemm.h"

#define MR 6
#define NR 16

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* nq: the Q vectors computed (1 to 4); the rest of the accumulators stay zero. */
static ALWAYS_INLINE void ukernel_rows(const size_t rows, const int nq, size_t kc, const float *a,
                                       size_t lda, const float *b, float *c, size_t ldc,
                                       int accumulate, const gemm_epilogue *ep,
                                       const float *b_next, int pf_quarter)
{
    float32x4_t acc[MR][4];
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = vdupq_n_f32(0.0f);
    }
    if (ep && ep->residual) {
        /* The next row block's residual rows, read by the driver's next call: see the AVX-512
         * kernel. */
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const float *r = ep->residual + (i + MR) * ep->ld_residual;
            __builtin_prefetch(r, 0, 3);
            __builtin_prefetch(r + NR - 1, 0, 3);
        }
    }
    /* The next slice (one line a step) or a quarter of it (one line every fourth step). */
    const char *pf = (const char *)b_next;
    const size_t skip = pf_quarter ? 3 : 0; /* steps whose low bits are set do not prefetch */
    for (size_t p = 0; p < kc; p++) {
        if (pf && (p & skip) == 0) {
            __builtin_prefetch(pf, 0, 2);
            pf += NR * sizeof(float);
        }
        const float32x4_t b0 = vld1q_f32(b);
        const float32x4_t b1 = nq > 1 ? vld1q_f32(b + 4) : b0;
        const float32x4_t b2 = nq > 2 ? vld1q_f32(b + 8) : b0;
        const float32x4_t b3 = nq > 3 ? vld1q_f32(b + 12) : b0;
        b += NR;
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const float32x4_t ai = vld1q_dup_f32(a + i * lda + p);
            acc[i][0] = vfmaq_f32(acc[i][0], b0, ai);
            if (nq > 1) acc[i][1] = vfmaq_f32(acc[i][1], b1, ai);
            if (nq > 2) acc[i][2] = vfmaq_f32(acc[i][2], b2, ai);
            if (nq > 3) acc[i][3] = vfmaq_f32(acc[i][3], b3, ai);
        }
    }
    if (accumulate) {
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const float *cr = c + i * ldc;
            for (int q = 0; q < 4; q++) acc[i][q] = vaddq_f32(acc[i][q], vld1q_f32(cr + 4 * q));
        }
    }
    if (ep) {
        if (ep->bias) {
            float32x4_t bias[4];
            for (int q = 0; q < 4; q++) bias[q] = vld1q_f32(ep->bias + 4 * q);
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                for (int q = 0; q < 4; q++) acc[i][q] = vaddq_f32(acc[i][q], bias[q]);
            }
        }
        if (ep->residual) {
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                const float *r = ep->residual + i * ep->ld_residual;
                for (int q = 0; q < 4; q++) acc[i][q] = vaddq_f32(acc[i][q], vld1q_f32(r + 4 * q));
            }
        }
        /* FMAX/FMIN return NaN when either input is NaN: NaN propagates like in the oracle. */
        const float32x4_t lo = vdupq_n_f32(ep->lo), hi = vdupq_n_f32(ep->hi);
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            for (int q = 0; q < 4; q++) acc[i][q] = vminq_f32(hi, vmaxq_f32(lo, acc[i][q]));
        }
    }
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        float *cr = c + i * ldc;
        for (int q = 0; q < 4; q++) vst1q_f32(cr + 4 * q, acc[i][q]);
    }
}

#define ROWS_NQ(r, nq)                                                                      \
    ukernel_rows(r, nq, kc, a, lda, b, c, ldc, accumulate, ep, b_next, pf_quarter)
#define ROWS_CASE(r)                                                                        \
    case r:                                                                                 \
        if (nq == 4) ROWS_NQ(r, 4);                                                         \
        else if (nq == 3) ROWS_NQ(r, 3);                                                    \
        else if (nq == 2) ROWS_NQ(r, 2);                                                    \
        else ROWS_NQ(r, 1);                                                                 \
        break;

static ALWAYS_INLINE void ukernel_any_rows(size_t mr, int nq, size_t kc, const float *a,
                                           size_t lda, const float *b, float *c, size_t ldc,
                                           int accumulate, const gemm_epilogue *ep,
                                           const float *b_next, int pf_quarter)
{
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6)
    default: break;
    }
}

void gemm_f32_6x16__neon(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                         const float *b_panel, float *c, size_t ldc, int accumulate,
                         const gemm_epilogue *ep, const float *b_next, int pf_quarter)
{
    assert(mr <= MR && nr <= NR);
    if (nr == NR) {
        ukernel_any_rows(mr, 4, kc, a, lda, b_panel, c, ldc, accumulate, ep, b_next, pf_quarter);
        return;
    }
    float tmp_c[MR * NR], tmp_bias[NR], tmp_res[MR * NR];
    memset(tmp_c, 0, sizeof(tmp_c));
    if (accumulate)
        for (size_t i = 0; i < mr; i++) memcpy(tmp_c + i * NR, c + i * ldc, nr * sizeof(float));
    gemm_epilogue tmp_ep;
    if (ep) {
        tmp_ep = *ep;
        if (ep->bias) {
            memset(tmp_bias, 0, sizeof(tmp_bias));
            memcpy(tmp_bias, ep->bias, nr * sizeof(float));
            tmp_ep.bias = tmp_bias;
        }
        if (ep->residual) {
            memset(tmp_res, 0, sizeof(tmp_res));
            for (size_t i = 0; i < mr; i++)
                memcpy(tmp_res + i * NR, ep->residual + i * ep->ld_residual, nr * sizeof(float));
            tmp_ep.residual = tmp_res;
            tmp_ep.ld_residual = NR;
        }
    }
    ukernel_any_rows(mr, (int)(nr + 3) / 4, kc, a, lda, b_panel, tmp_c, NR, accumulate,
                     ep ? &tmp_ep : NULL, b_next, pf_quarter);
    for (size_t i = 0; i < mr; i++) memcpy(c + i * ldc, tmp_c + i * NR, nr * sizeof(float));
}

#endif
