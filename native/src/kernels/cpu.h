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

/* The data caches the blocking is sized for: the level-1 data cache and the level-2 cache of one
 * core, in bytes. Read once from Linux's sysfs (/sys/devices/system/cpu/cpu0/cache), else from
 * sysconf, else assumed (32 KiB, 512 KiB: the smallest of the machines coacto is for);
 * COACTO_L1D_BYTES / COACTO_L2_BYTES in the environment override either (to try the blocking of
 * another machine). source says which: "sysfs", "sysconf", "assumed" or "environment".
 * l1d_ways: the L1 data cache's associativity (sysfs, sysconf, else 8; COACTO_L1D_WAYS
 * overrides): rows of A a power-of-two stride apart can fall in one set (gemm.c). */
typedef struct cpu_caches {
    long l1d_bytes, l2_bytes, l1d_ways;
    const char *source;
} cpu_caches;

const cpu_caches *cpu_get_caches(void);

#endif
