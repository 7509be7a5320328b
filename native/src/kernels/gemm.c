/* GEMM driver: kernel selection, B packing, the blocked loop around the micro-kernels, and the
 * benchmark hook of the public API. */
#define _POSIX_C_SOURCE 200809L
#include "kernels/gemm.h"

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coacto.h"
#include "kernels/cpu.h"
#include "kernels/vec.h"

/* rank: the instruction-set level a kernel needs, for COACTO_ISA's cap (scalar 0; AVX2 and
 * NEON 1; AVX-512 2) */
static const gemm_kernel kernel_scalar = {"gemm_f32_4x8__scalar", 4, 8, gemm_f32_4x8__scalar, 0};
#if defined(__x86_64__) || defined(_M_X64)
static const gemm_kernel kernel_avx2 = {"gemm_f32_6x16__avx2", 6, 16, gemm_f32_6x16__avx2, 1};
static const gemm_kernel kernel_avx512f = {"gemm_f32_14x32__avx512f", 14, 32,
                                           gemm_f32_14x32__avx512f, 2};
#endif
#if defined(__aarch64__)
static const gemm_kernel kernel_neon = {"gemm_f32_6x16__neon", 6, 16, gemm_f32_6x16__neon, 1};
#endif

/* Best first, NULL-terminated; room for every kernel plus the terminator. */
static const gemm_kernel *available[5];
static const gemm_kernel *selected;
static pthread_once_t select_once = PTHREAD_ONCE_INIT;
static char available_names[160];

/* The highest rank COACTO_ISA allows (2: no cap). COACTO_FORCE_SCALAR=1 is the older spelling
 * of COACTO_ISA=scalar. An unknown value caps nothing here: the Python loader refuses it
 * (coacto.native.check_isa) before the first call, with the values this CPU takes. */
static int isa_cap(void)
{
    const char *force = getenv("COACTO_FORCE_SCALAR");
    if (force != NULL && force[0] != '\0' && strcmp(force, "0") != 0) return 0;
    const char *isa = getenv("COACTO_ISA");
    if (isa == NULL) return 2;
    if (strcmp(isa, "scalar") == 0) return 0;
    if (strcmp(isa, "avx2") == 0 || strcmp(isa, "neon") == 0) return 1;
    return 2;
}

static void init_kernels(void)
{
    const cpu_features *cpu = cpu_get_features();
    size_t n = 0;
#if defined(__x86_64__) || defined(_M_X64)
    if (cpu->avx512f) available[n++] = &kernel_avx512f;
    if (cpu->avx2_fma) available[n++] = &kernel_avx2;
#endif
#if defined(__aarch64__)
    if (cpu->neon) available[n++] = &kernel_neon;
#endif
    (void)cpu;
    available[n++] = &kernel_scalar;
    available[n] = NULL;
    const int cap = isa_cap();
    selected = &kernel_scalar;
    for (size_t i = 0; i < n; i++) {
        if (available[i]->rank <= cap) {
            selected = available[i];
            break;
        }
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(available_names + len, sizeof available_names - len, "%s%s",
                         i ? "," : "", available[i]->name);
        if (w < 0 || (size_t)w >= sizeof available_names - len) break;
        len += (size_t)w;
    }
}

const gemm_kernel *gemm_select(void)
{
    pthread_once(&select_once, init_kernels);
    return selected;
}

const gemm_kernel *const *gemm_available(void)
{
    pthread_once(&select_once, init_kernels);
    return available;
}

const char *coacto_gemm_kernel_name(void) { return gemm_select()->name; }

int vec_avx512_usable(void) { return gemm_select()->rank >= 2; }

const char *coacto_gemm_kernels_available(void)
{
    pthread_once(&select_once, init_kernels);
    return available_names;
}

static size_t clamp_size(size_t v, size_t lo, size_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The panel slice one ukernel call reads (kc x nr floats) stays in L1 while the row blocks walk
 * over it: half the L1 data cache, the rest for the rows of A and C the calls touch. A multiple
 * of 16 (whole cache lines of A per row), 64 to 512. */
size_t gemm_block_k(const gemm_kernel *kern)
{
    const size_t l1 = (size_t)cpu_get_caches()->l1d_bytes;
    return clamp_size(l1 / 2 / (kern->nr * sizeof(float)) / 16 * 16, 64, 512);
}

/* A third deeper than gemm_block_k: a reduction this deep goes in one K block. */
size_t gemm_one_pass_k(const gemm_kernel *kern)
{
    const size_t kc = gemm_block_k(kern);
    return kc + kc / 3;
}

/* Rows per pass over the panels: their A block (mc x kc floats) stays in L2 while every panel
 * of the channel range reuses it, in a quarter of L2 (the panels stream through the rest). A
 * multiple of the kernel's MR, 4 MR to 1024. */
size_t gemm_block_m(const gemm_kernel *kern)
{
    const size_t l2 = (size_t)cpu_get_caches()->l2_bytes;
    const size_t mc = l2 / 4 / (gemm_block_k(kern) * sizeof(float));
    return clamp_size(mc, 4 * kern->mr, 1024) / kern->mr * kern->mr;
}

void coacto_gemm_blocking(coacto_blocking *out)
{
    if (!out) return;
    const cpu_caches *c = cpu_get_caches();
    const gemm_kernel *kern = gemm_select();
    out->l1d_bytes = c->l1d_bytes;
    out->l2_bytes = c->l2_bytes;
    out->block_k = (int64_t)gemm_block_k(kern);
    out->block_m = (int64_t)gemm_block_m(kern);
    out->cache_source = c->source;
}
/* The row-outer loop order below: reductions this short (a panel of 16 KiB at most, read from
 * L2 by every row block), whose packed weights fit in this many bytes. */
#define SMALL_K 128
#define SMALL_B_BYTES (256 * 1024)
/* The short-reduction path prefetches, for writing, the rows of C this many row blocks ahead. Its
 * work per output value is small (MobileNetV2's 16 -> 96 expansion: 16 multiply-adds a value), so
 * a row block that waits for its C lines to be fetched before it can write them (write-allocate)
 * runs at the speed of memory, not of the kernel; the hardware prefetchers did not fetch them in
 * time where C was cold (docs/PERFORMANCE.md). */
#define PREFETCH_BLOCKS 2

size_t gemm_packed_size(const gemm_kernel *kern, size_t k, size_t n)
{
    const size_t panels = (n + kern->nr - 1) / kern->nr;
    return panels * kern->nr * k;
}

void gemm_pack_b(const gemm_kernel *kern, size_t k, size_t n, const float *b, size_t ldb,
                 float *packed)
{
    const size_t nr = kern->nr;
    /* Row by row: each row of B is read once, contiguously, and scattered to every panel. */
    for (size_t p = 0; p < k; p++) {
        const float *src = b + p * ldb;
        for (size_t j0 = 0; j0 < n; j0 += nr) {
            const size_t w = n - j0 < nr ? n - j0 : nr;
            float *dst = packed + j0 * k + p * nr;
            memcpy(dst, src + j0, w * sizeof(float));
            for (size_t j = w; j < nr; j++) dst[j] = 0.0f;
        }
    }
}

void gemm_run(const gemm_kernel *kern, size_t m, size_t j0, size_t j1, size_t k, const float *a,
              size_t lda, const float *packed, float *c, size_t ldc, const gemm_epilogue *ep)
{
    gemm_run_k(kern, m, j0, j1, k, 0, k, a, lda, packed, c, ldc, ep);
}

/* ep with its bias and residual offset to the block at row i, channel j (in *out), or NULL. */
static const gemm_epilogue *block_epilogue(const gemm_epilogue *ep, size_t i, size_t j,
                                           gemm_epilogue *out)
{
    if (!ep) return NULL;
    *out = *ep;
    if (ep->bias) out->bias = ep->bias + j;
    if (ep->residual) out->residual = ep->residual + i * ep->ld_residual + j;
    return out;
}

/* Reduction values per K block for a range of `len`: blocks of at most gemm_one_pass_k, as few
 * as that allows, of equal depth in whole cache lines of A. Every K block after the first reads
 * its part of C back and writes it again, and a layer's C is back in L2 or beyond by then
 * (ResNet-50's 256 -> 1024 expansions, K = 256, ran as 192 + 64 and read their 800 KB of C a
 * second time for 64 steps). */
static size_t even_block_k(const gemm_kernel *kern, size_t len)
{
    const size_t most = gemm_one_pass_k(kern);
    if (len <= most) return len;
    const size_t blocks = (len + most - 1) / most;
    return ((len + blocks - 1) / blocks + 15) / 16 * 16;
}

/* The rows of A that block_k_rows takes in one K block: half of L2, at most this many bytes. */
#define ONE_PASS_A_MAX_BYTES ((size_t)512 << 10)

/* The K block of a product of `m` rows over a reduction of `len`: the whole reduction when the
 * rows of A (m x len floats) fit in half of L2 (at most ONE_PASS_A_MAX_BYTES), else
 * even_block_k. With few rows and deep K blocks of even_block_k, each K block after the first
 * read C back and wrote it again, and a wide tile's C had left L2 by then: a 64 x 3136 tile of
 * GPT-2's language-model head holds 800 KB of C, which went out and back four times. In one
 * block C is written once; the panel slice (K x NR, beyond L1) is read from L2 by each of the
 * few row blocks, and their rows of A come from L2 once per panel. (Measured: docs/PERFORMANCE.md,
 * Zen 4 section.) Half of L2, not a quarter: ViT's 98-token tiles of its 768-deep products
 * (294 KiB of A) went in five K blocks and ran 4-5% slower on the 1 MiB L2 of the Zen 4; the
 * cap keeps the 2 MiB L2 of the Emerald Rapids Xeon at the quarter it had (A of up to 1 MiB in
 * one pass: ResNet-50 2% slower there, ViT and BERT 1-2% faster, within that machine's noise;
 * larger L2s are unmeasured and get less than a quarter). A product of fewer rows than the
 * kernel's block (a classifier's one row) reads each panel once anyway. Only for the AVX-512
 * kernel, where it was measured faster: the AVX2 kernel on the same core ran as fast either
 * way, and the NEON one, whose cores have less L2 bandwidth, is unmeasured. */
static size_t block_k_rows(const gemm_kernel *kern, size_t m, size_t len)
{
    const size_t l2 = (size_t)cpu_get_caches()->l2_bytes;
    const size_t most = l2 / 2 < ONE_PASS_A_MAX_BYTES ? l2 / 2 : ONE_PASS_A_MAX_BYTES;
    if (kern->rank >= 2 && m >= kern->mr && m * len * sizeof(float) <= most) return len;
    return even_block_k(kern, len);
}

/* Rows of the next row block with `left` rows to go: MR, except that a last block of fewer
 * than MR / 2 rows shares the last MR + r rows evenly with the block before it. Few rows keep
 * too few multiply-add chains in flight to hide the FMA latency (a 1-row block of the 14 x 32
 * kernel runs 2 chains, a quarter of the core's rate, for as many steps as a full one), and
 * 197-token transformer tiles of 99 rows ended in one. The row blocks are as many as before. */
static size_t block_rows(size_t left, size_t mr_max)
{
    if (left <= mr_max) return left;
    if (left < mr_max + mr_max / 2) return (left + 1) / 2;
    return mr_max;
}

/* Prefetches for writing the rows of C PREFETCH_BLOCKS row blocks after row i of the run,
 * channels [j0, j1). */
static void prefetch_c_rows(const gemm_rows *run, size_t i, size_t mr_max, size_t j0, size_t j1,
                            size_t ldc)
{
    const size_t line = 64 / sizeof(float);
    const size_t ahead = i + PREFETCH_BLOCKS * mr_max;
    if (ahead >= run->m) return;
    const size_t rows = run->m - ahead < mr_max ? run->m - ahead : mr_max;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = j0; j < j1; j += line)
            __builtin_prefetch(run->c + (ahead + r) * ldc + j, 1, 3);
}

/* Rows of A that the L1 data cache cannot hold together. A row block reads MR rows lda floats
 * apart, each line of each row for 16 consecutive steps; rows whose first lines fall in one set,
 * as many as the cache has ways or more, evict each other at every step (with the panel slice in
 * L1 too) and every broadcast goes to L2. A stride that is a multiple of the way span (4 KiB for
 * 32 KiB and 8 ways, or 48 KiB and 12) puts all MR rows in one set: a 1x1 convolution of 1024
 * or 2048 input channels, a transformer's 3072-wide feed-forward output. In practice only the
 * AVX-512 kernel's 14-row blocks meet it (6 or 4 rows fit 8 ways). Remembered per thread
 * for the last stride and kernel asked (callers ask with the same ones for a whole layer). */
static int a_rows_conflict(const gemm_kernel *kern, size_t lda)
{
    static _Thread_local size_t memo_lda = 0, memo_mr = 0;
    static _Thread_local int memo = 0;
    if (lda == memo_lda && kern->mr == memo_mr) return memo;
    const cpu_caches *c = cpu_get_caches();
    const size_t line = 64, ways = (size_t)c->l1d_ways;
    const size_t sets = (size_t)c->l1d_bytes / (line * ways);
    const size_t stride = lda * sizeof(float);
    size_t worst = 0; /* the most distinct lines (rows' first lines) in one set */
    for (size_t i = 0; sets > 0 && i < kern->mr; i++) {
        size_t same = 0;
        for (size_t r = 0; r < kern->mr; r++) {
            const size_t l = r * stride / line;
            same += l % sets == (i * stride / line) % sets && (r == 0 || l != (r - 1) * stride / line);
        }
        if (same > worst) worst = same;
    }
    memo_lda = lda;
    memo_mr = kern->mr;
    memo = worst >= ways;
    return memo;
}

/* The per-thread buffer rows of A are copied to when a_rows_conflict: grown on demand, freed
 * when its thread ends (a runtime's workers end with the runtime). */
#define A_COPY_MAX_FLOATS ((size_t)1 << 19) /* 2 MiB: more would not stay in L2 anyway */
#define A_COPY_MAX_RUNS 64
static pthread_key_t a_copy_key;
static int a_copy_key_ok;
static pthread_once_t a_copy_once = PTHREAD_ONCE_INIT;
static _Thread_local float *a_copy;
static _Thread_local size_t a_copy_floats;

static void a_copy_free(void *p) { free(p); }
static void a_copy_key_init(void) { a_copy_key_ok = pthread_key_create(&a_copy_key, a_copy_free) == 0; }

static float *a_copy_buffer(size_t floats)
{
    if (floats <= a_copy_floats) return a_copy;
    if (floats > A_COPY_MAX_FLOATS) return NULL;
    pthread_once(&a_copy_once, a_copy_key_init);
    if (!a_copy_key_ok) return NULL; /* nothing would free it when the thread ends */
    float *p = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    if (!p) return NULL;
    free(a_copy);
    a_copy = p;
    a_copy_floats = floats;
    (void)pthread_setspecific(a_copy_key, p);
    return p;
}

/* Copies K block [aoff, aoff + kc) of every run's rows of A to the thread's buffer, rows an odd
 * number of cache lines apart (so that consecutive rows fall in different sets), and points
 * `out` at the copies; their stride in *lda_out. 0 when the buffer cannot be had (the caller
 * reads A where it is). */
static int copy_a_rows(const gemm_rows *runs, size_t n_runs, size_t aoff, size_t kc, size_t lda,
                       gemm_rows *out, size_t *lda_out)
{
    size_t ldp = (kc + 15) / 16 * 16;
    if ((ldp / 16) % 2 == 0) ldp += 16;
    size_t rows = 0;
    for (size_t s = 0; s < n_runs; s++) rows += runs[s].m;
    float *buf = n_runs <= A_COPY_MAX_RUNS ? a_copy_buffer(rows * ldp) : NULL;
    if (!buf) return 0;
    for (size_t s = 0; s < n_runs; s++) {
        out[s] = runs[s];
        out[s].a = buf;
        for (size_t i = 0; i < runs[s].m; i++, buf += ldp)
            memcpy(buf, runs[s].a + i * lda + aoff, kc * sizeof(float));
    }
    *lda_out = ldp;
    return 1;
}

/* K block [kb, kb + kc) of channels [j0, j1) for the row runs (A at reduction offset aoff of
 * each run's a), panels outer and every run's row blocks inner, so each panel slice is read once
 * for all of them; ep (NULL unless this is the last K block) with each run's residual rows. The
 * row blocks of each panel prefetch the slice read next (the next panel, or the first panel of
 * the next K block): the first four a quarter each, or the first all of it when there are
 * fewer, so that cold weights stream in while the current slice is being used. */
static void run_block(const gemm_kernel *kern, const gemm_rows *runs, size_t n_runs, size_t j0,
                      size_t j1, size_t k, size_t kb, size_t kc, size_t aoff, size_t lda,
                      const float *packed, size_t ldc, const gemm_epilogue *ep)
{
    const size_t mr_max = kern->mr, nr_max = kern->nr;
    const size_t quarter = kc * nr_max / 4; /* floats of a quarter of the next slice */
    gemm_rows copies[A_COPY_MAX_RUNS];
    if (a_rows_conflict(kern, lda) && copy_a_rows(runs, n_runs, aoff, kc, lda, copies, &lda)) {
        runs = copies;
        aoff = 0;
    }
    size_t blocks = 0;
    for (size_t s = 0; s < n_runs; s++) blocks += (runs[s].m + mr_max - 1) / mr_max;
    gemm_epilogue run_ep, block_ep;
    for (size_t j = j0; j < j1; j += nr_max) {
        const size_t nr = j1 - j < nr_max ? j1 - j : nr_max;
        const float *panel = packed + j * k + kb * nr_max;
        const float *next = NULL;
        if (j + nr_max < j1)
            next = packed + (j + nr_max) * k + kb * nr_max;
        else if (kb + kc < k)
            next = packed + j0 * k + (kb + kc) * nr_max;
        const int spread = next && blocks >= 4; /* a quarter to each of four blocks */
        /* The first pass of a short reduction writes C: fetch its rows ahead for writing, as
         * the short-reduction path of gemm_run_k does (the in-place convolutions with few input
         * channels, whose passes are a window row of k x cin values each, meet the same cold
         * output). */
        const int prefetch_c = kb == 0 && kc <= SMALL_K;
        size_t r = 0;
        for (size_t s = 0; s < n_runs; s++) {
            const gemm_rows *run = &runs[s];
            if (ep) {
                run_ep = *ep;
                run_ep.residual = run->residual;
            }
            for (size_t i = 0, mr; i < run->m; i += mr, r++) {
                mr = block_rows(run->m - i, mr_max);
                if (prefetch_c && j == j0) prefetch_c_rows(run, i, mr_max, j0, j1, ldc);
                kern->ukernel(mr, nr, kc, run->a + i * lda + aoff, lda, panel,
                              run->c + i * ldc + j, ldc, kb > 0,
                              ep ? block_epilogue(&run_ep, i, j, &block_ep) : NULL,
                              spread ? (r < 4 ? next + r * quarter : NULL)
                                     : (r == 0 ? next : NULL),
                              spread);
            }
        }
    }
}

void gemm_run_k(const gemm_kernel *kern, size_t m, size_t j0, size_t j1, size_t k, size_t k0,
                size_t k1, const float *a, size_t lda, const float *packed, float *c, size_t ldc,
                const gemm_epilogue *ep)
{
    const size_t mr_max = kern->mr, nr_max = kern->nr;
    const size_t kc_max = block_k_rows(kern, m, k1 - k0);
    const size_t mc_max = gemm_block_m(kern);
    assert(j0 % nr_max == 0);
    assert(k0 <= k1 && k1 <= k && (k0 < k1 || k == 0));
    if (m == 0 || j1 <= j0) return;
    gemm_epilogue block_ep;
    /* A short reduction (SMALL_K at most) over few panels: rows outer, panels inner. Each row block
     * then writes its rows of C (and reads its residual rows) whole, line after line, while the
     * panels (at most SMALL_B_BYTES) and the row block of A stay in cache; panel by panel, the
     * rows of C were visited a few lines at a time, MR rows apart. */
    if (k0 == 0 && k1 == k && k <= SMALL_K &&
        (j1 - j0 + nr_max - 1) / nr_max * nr_max * k * sizeof(float) <= SMALL_B_BYTES) {
        const size_t line = 64 / sizeof(float); /* floats per cache line */
        for (size_t i = 0, mr; i < m; i += mr) {
            mr = block_rows(m - i, mr_max);
            const size_t ahead = i + PREFETCH_BLOCKS * mr_max;
            if (ahead < m) {
                const size_t rows = m - ahead < mr_max ? m - ahead : mr_max;
                for (size_t r = 0; r < rows; r++)
                    for (size_t j = j0; j < j1; j += line)
                        __builtin_prefetch(c + (ahead + r) * ldc + j, 1, 3);
            }
            for (size_t j = j0; j < j1; j += nr_max) {
                const size_t nr = j1 - j < nr_max ? j1 - j : nr_max;
                kern->ukernel(mr, nr, k, a + i * lda, lda, packed + j * k, c + i * ldc + j, ldc,
                              0, block_epilogue(ep, i, j, &block_ep), NULL, 0);
            }
        }
        return;
    }
    /* Loop order (BLIS): K blocks, then row chunks of gemm_block_m, then (run_block) panels, then MR
     * row blocks. Later K blocks accumulate into C; only the last applies the epilogue. k == 0
     * still runs once, so C = epilogue(0). */
    /* Row chunks of equal size in whole row blocks (337 rows went as 336 and 1) */
    const size_t chunks = (m + mc_max - 1) / mc_max;
    const size_t mc = ((m + chunks - 1) / chunks + mr_max - 1) / mr_max * mr_max;
    size_t kb = k0;
    do {
        const size_t kc = k1 - kb < kc_max ? k1 - kb : kc_max;
        const int last = kb + kc == k;
        for (size_t ib = 0; ib < m; ib += mc) {
            const size_t i_end = m - ib < mc ? m : ib + mc;
            const gemm_rows run = {a + ib * lda, c + ib * ldc,
                                   ep && ep->residual ? ep->residual + ib * ep->ld_residual : NULL,
                                   i_end - ib};
            run_block(kern, &run, 1, j0, j1, k, kb, kc, kb - k0, lda, packed, ldc,
                      last ? ep : NULL);
        }
        kb += kc;
    } while (kb < k1);
}

void gemm_run_k_rows(const gemm_kernel *kern, const gemm_rows *runs, size_t n_runs, size_t j0,
                     size_t j1, size_t k, size_t k0, size_t k1, size_t lda, const float *packed,
                     size_t ldc, const gemm_epilogue *ep)
{
    size_t rows = 0;
    for (size_t s = 0; s < n_runs; s++) rows += runs[s].m;
    const size_t kc_max = block_k_rows(kern, rows, k1 - k0);
    assert(j0 % kern->nr == 0);
    assert(k0 <= k1 && k1 <= k && (k0 < k1 || k == 0));
    if (n_runs == 0 || j1 <= j0) return;
    size_t kb = k0;
    do {
        const size_t kc = k1 - kb < kc_max ? k1 - kb : kc_max;
        run_block(kern, runs, n_runs, j0, j1, k, kb, kc, kb - k0, lda, packed, ldc,
                  kb + kc == k ? ep : NULL);
        kb += kc;
    } while (kb < k1);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *alloc_floats(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

double coacto_gemm_benchmark(int32_t m, int32_t n, int32_t k, int32_t repeats)
{
    if (m <= 0 || n <= 0 || k <= 0 || repeats <= 0) return -1.0;
    const gemm_kernel *kern = gemm_select();
    const size_t M = (size_t)m, N = (size_t)n, K = (size_t)k;
    float *a = alloc_floats(M * K), *b = alloc_floats(K * N), *c = alloc_floats(M * N);
    float *packed = alloc_floats(gemm_packed_size(kern, K, N));
    double best = -1.0;
    if (a && b && c && packed) {
        uint32_t state = 12345u;
        for (size_t i = 0; i < M * K; i++) {
            state = state * 1664525u + 1013904223u;
            a[i] = (float)(state >> 8) * (1.0f / 16777216.0f) - 0.5f;
        }
        for (size_t i = 0; i < K * N; i++) {
            state = state * 1664525u + 1013904223u;
            b[i] = (float)(state >> 8) * (1.0f / 16777216.0f) - 0.5f;
        }
        gemm_pack_b(kern, K, N, b, N, packed);
        gemm_run(kern, M, 0, N, K, a, K, packed, c, N, NULL); /* warm caches and pages */
        for (int32_t r = 0; r < repeats; r++) {
            const double t0 = now_seconds();
            gemm_run(kern, M, 0, N, K, a, K, packed, c, N, NULL);
            const double t = now_seconds() - t0;
            if (best < 0.0 || t < best) best = t;
        }
    }
    free(a);
    free(b);
    free(c);
    free(packed);
    return best;
}
