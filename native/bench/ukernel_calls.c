/* Calls the selected GEMM micro-kernel CALLS times on one full MR x NR block with a reduction of
 * KC: the program experiments/ukernel_instructions.py runs under qemu (one instruction per
 * translation block, every execution logged) to count the instructions a kernel spends per
 * multiply-add, beside a run with CALLS = 0 that counts the rest of the program.
 *
 *     ukernel_calls CALLS [KC]       (COACTO_ISA picks the kernel, as in the runtime) */
#define _ISOC11_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "kernels/gemm.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CALLS [KC]\n", argv[0]);
        return 2;
    }
    const long calls = atol(argv[1]);
    const long kc = argc > 2 ? atol(argv[2]) : 256;
    if (calls < 0 || kc < 1 || kc > 4096) {
        fprintf(stderr, "CALLS must be >= 0 and KC in [1, 4096]\n");
        return 2;
    }
    const gemm_kernel *k = gemm_select();
    const size_t mr = k->mr, nr = k->nr;
    /* 64-byte aligned, as the runtime's packed panels and buffers are */
    float *a = aligned_alloc(64, (sizeof(float) * mr * (size_t)kc + 63) / 64 * 64);
    float *b = aligned_alloc(64, (sizeof(float) * nr * (size_t)kc + 63) / 64 * 64);
    float *c = aligned_alloc(64, (sizeof(float) * mr * nr + 63) / 64 * 64);
    if (!a || !b || !c) return 1;
    for (size_t i = 0; i < mr * (size_t)kc; i++) a[i] = (float)(i % 7) * 0.25f;
    for (size_t i = 0; i < nr * (size_t)kc; i++) b[i] = (float)(i % 5) * 0.5f;
    for (size_t i = 0; i < mr * nr; i++) c[i] = 0.0f;
    for (long i = 0; i < calls; i++)
        k->ukernel(mr, nr, (size_t)kc, a, (size_t)kc, b, c, nr, 1, NULL, NULL, 0);
    printf("%s %zu %zu %ld %ld %g\n", k->name, mr, nr, kc, calls, (double)c[0]);
    free(a);
    free(b);
    free(c);
    return 0;
}
