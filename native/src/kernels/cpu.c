#include "kernels/cpu.h"

#include <pthread.h>

#if defined(__x86_64__) || defined(_M_X64)
#if defined(_MSC_VER) && !defined(__clang__)
#include <immintrin.h>
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#include <stdint.h>

static void cpuid(uint32_t leaf, uint32_t subleaf, uint32_t r[4])
{
#if defined(_MSC_VER) && !defined(__clang__)
    int regs[4];
    __cpuidex(regs, (int)leaf, (int)subleaf);
    for (int i = 0; i < 4; i++) r[i] = (uint32_t)regs[i];
#else
    __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]);
#endif
}

/* XCR0: which register states the OS saves. Only valid when CPUID.1:ECX.OSXSAVE is set. */
static uint64_t read_xcr0(void)
{
#if defined(_MSC_VER) && !defined(__clang__)
    return _xgetbv(0);
#else
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#endif
}

#define XCR0_SSE (1u << 1)
#define XCR0_AVX (1u << 2)
#define XCR0_OPMASK (1u << 5)
#define XCR0_ZMM_HI256 (1u << 6)
#define XCR0_HI16_ZMM (1u << 7)

static void detect(cpu_features *f)
{
    uint32_t r[4];
    cpuid(0, 0, r);
    const uint32_t max_leaf = r[0];
    if (max_leaf < 1) return;
    cpuid(1, 0, r);
    const uint32_t ecx1 = r[2];
    const int fma = (ecx1 >> 12) & 1, osxsave = (ecx1 >> 27) & 1, avx = (ecx1 >> 28) & 1;
    if (!osxsave || !avx) return;
    const uint64_t xcr0 = read_xcr0();
    const uint64_t ymm_state = XCR0_SSE | XCR0_AVX;
    const uint64_t zmm_state = ymm_state | XCR0_OPMASK | XCR0_ZMM_HI256 | XCR0_HI16_ZMM;
    if ((xcr0 & ymm_state) != ymm_state || max_leaf < 7) return;
    cpuid(7, 0, r);
    const uint32_t ebx7 = r[1];
    const int avx2 = (ebx7 >> 5) & 1, avx512f = (ebx7 >> 16) & 1;
    f->avx2_fma = avx2 && fma;
    f->avx512f = f->avx2_fma && avx512f && (xcr0 & zmm_state) == zmm_state;
}

#elif defined(__aarch64__)

static void detect(cpu_features *f) { f->neon = 1; }

#else

static void detect(cpu_features *f) { (void)f; }

#endif

static cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static void init_features(void) { detect(&features); }

const cpu_features *cpu_get_features(void)
{
    pthread_once(&features_once, init_features);
    return &features;
}
