/* Portable GEMM micro-kernel: the oracle every SIMD kernel is tested against, and the kernel of
 * last resort on CPUs without a SIMD one (or with COACTO_FORCE_SCALAR set). */
#include <assert.h>

#include "kernels/gemm.h"

#define MR 4
#define NR 8

void gemm_f32_4x8__scalar(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                          const float *b_panel, float *c, size_t ldc, int accumulate,
                          const gemm_epilogue *ep, const float *b_next, int pf_quarter)
{
    (void)b_next; /* the oracle stays plain */
    (void)pf_quarter;
    assert(mr <= MR && nr <= NR);
    float acc[MR][NR] = {{0.0f}};
    for (size_t p = 0; p < kc; p++) {
        const float *b = b_panel + p * NR;
        for (size_t i = 0; i < mr; i++) {
            const float ai = a[i * lda + p];
            for (size_t j = 0; j < NR; j++) acc[i][j] += ai * b[j];
        }
    }
    for (size_t i = 0; i < mr; i++) {
        float *crow = c + i * ldc;
        for (size_t j = 0; j < nr; j++) {
            float v = acc[i][j];
            if (accumulate) v += crow[j];
            if (ep) {
                if (ep->bias) v += ep->bias[j];
                if (ep->residual) v += ep->residual[i * ep->ld_residual + j];
                /* Written so that NaN propagates, as the SIMD kernels' max/min operand order does. */
                v = ep->lo > v ? ep->lo : v;
                v = ep->hi < v ? ep->hi : v;
            }
            crow[j] = v;
        }
    }
}
