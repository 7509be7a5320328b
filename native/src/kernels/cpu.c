#define _POSIX_C_SOURCE 200809L
#include "kernels/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* ------------------------------------------------------------------------------------ caches */

/* "48K", "1024K", "32M" or a plain byte count -> bytes; 0 if unreadable. */
static long parse_size(const char *text)
{
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || v <= 0) return 0;
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    return v;
}

static int read_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = '\0';
    return ok;
}

static void caches_from_sysfs(cpu_caches *c)
{
    for (int i = 0; i < 16; i++) {
        char path[96], level[16], type[32], size[32], ways[16];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!read_line(path, level, sizeof level)) break;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!read_line(path, type, sizeof type)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!read_line(path, size, sizeof size)) continue;
        long bytes = parse_size(size);
        if (strcmp(level, "1") == 0 && strcmp(type, "Data") == 0) {
            c->l1d_bytes = bytes;
            snprintf(path, sizeof path,
                     "/sys/devices/system/cpu/cpu0/cache/index%d/ways_of_associativity", i);
            if (read_line(path, ways, sizeof ways)) c->l1d_ways = parse_size(ways);
        }
        if (strcmp(level, "2") == 0 && strcmp(type, "Instruction") != 0) c->l2_bytes = bytes;
    }
}

static long env_bytes(const char *name)
{
    const char *v = getenv(name);
    return v ? parse_size(v) : 0;
}

static cpu_caches caches;
static pthread_once_t caches_once = PTHREAD_ONCE_INIT;

static void init_caches(void)
{
    caches_from_sysfs(&caches);
    caches.source = "sysfs";
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
#if defined(_SC_LEVEL1_DCACHE_ASSOC)
    if (caches.l1d_ways <= 0) {
        long w = sysconf(_SC_LEVEL1_DCACHE_ASSOC);
        if (w > 0) caches.l1d_ways = w;
    }
#endif
    if (caches.l1d_bytes <= 0 || caches.l2_bytes <= 0) {
        long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        if (caches.l1d_bytes <= 0 && l1 > 0) caches.l1d_bytes = l1;
        if (caches.l2_bytes <= 0 && l2 > 0) caches.l2_bytes = l2;
        caches.source = "sysconf";
    }
#endif
    if (caches.l1d_bytes <= 0 || caches.l2_bytes <= 0) caches.source = "assumed";
    if (caches.l1d_bytes <= 0) caches.l1d_bytes = 32L << 10;
    if (caches.l2_bytes <= 0) caches.l2_bytes = 512L << 10;
    long l1 = env_bytes("COACTO_L1D_BYTES"), l2 = env_bytes("COACTO_L2_BYTES");
    const char *ways_env = getenv("COACTO_L1D_WAYS");
    long ways = ways_env ? strtol(ways_env, NULL, 10) : 0; /* a count, not a size */
    if (l1 > 0) caches.l1d_bytes = l1;
    if (l2 > 0) caches.l2_bytes = l2;
    if (ways > 0) caches.l1d_ways = ways;
    if (l1 > 0 || l2 > 0 || ways > 0) caches.source = "environment";
    /* Unknown or nonsensical (fully associative reported as 0, more ways than lines): 8, the
     * associativity of most L1 data caches of 32 KiB and more. */
    if (caches.l1d_ways <= 0 || caches.l1d_ways > caches.l1d_bytes / 64) caches.l1d_ways = 8;
}

const cpu_caches *cpu_get_caches(void)
{
    pthread_once(&caches_once, init_caches);
    return &caches;
}
