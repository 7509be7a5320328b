/* Row kernels of the op families with an AVX-512 form (vec_avx512.c), picked at run time where
 * ops_vec.c's portable eight-float form is slower (vec_avx512_usable). */
#ifndef COACTO_VEC_H
#define COACTO_VEC_H
#include <stddef.h>

/* 1 when the AVX-512 forms may run: the CPU and OS support them and COACTO_ISA does not cap the
 * kernels below AVX-512 (the GEMM kernel selected is the AVX-512 one). */
int vec_avx512_usable(void);

#if defined(__x86_64__) || defined(_M_X64)
/* ops_softmax_exp: e = e^(x - max x), returns the sum of e and stores max x (NaN when any x is). */
float vec_softmax_exp_avx512(const float *x, float *e, size_t n, float *max_out);
/* erf (gelu 0) or GELU (gelu 1: x (1 + erf(x / sqrt 2)) / 2) of n floats in place. */
void vec_erf_family_avx512(float *x, size_t n, int gelu);
/* One LayerNorm column: mean and variance over x[0:c], then
 * o[r] = (x[r] - mean) / sqrt(var + eps) * scale[r] + shift[r] for row0 <= r < row1. */
void vec_layernorm_avx512(const float *x, float *o, size_t c, size_t row0, size_t row1,
                          const float *scale, const float *shift, float eps);
/* o[i] = x[i] * s. */
void vec_scale_avx512(const float *x, float *o, size_t n, float s);
#endif

#endif
