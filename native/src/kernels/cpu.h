/* CPU features that decide which kernels may run. Detected once (thread-safe) on first use.
 *
 * On x86-64 an instruction set counts only when both the CPU reports it (CPUID) and the operating
 * system saves its register state on context switches (XCR0): a CPU with AVX-512 under an OS or
 * hypervisor that does not enable the ZMM state must not run AVX-512 code. */
#ifndef COACTO_CPU_H
#define COACTO_CPU_H

typedef struct cpu_features {
    int avx2_fma; /* AVX2 + FMA3, YMM state enabled */
    int avx512f;  /* AVX-512F, opmask + ZMM state enabled */
    int neon;     /* AArch64 Advanced SIMD (always present there) */
} cpu_features;

const cpu_features *cpu_get_features(void);

#endif
