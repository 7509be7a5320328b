/* GEMM for tiles: C[i, j] = clamp(sum_k A[i, k] * B[k, j] + bias[j] + R[i, j], lo, hi).
 *
 * In tile terms i is a column (an output position), j an output channel, k the reduction index:
 * A row i is an im2col row (or the NHWC input itself for 1x1 convolutions), B the layer's weights,
 * packed once at graph load by gemm_pack_b into panels of kernel->nr channels.
 *
 * Packed layout: panel p holds channels [p*nr, p*nr + nr) for all k: element (k, j) of the panel is
 * at packed[p * k_total * nr + k * nr + (j - p*nr)]; channels beyond n are zero.
 *
 * Kernel names read contract__implementation (gemm_f32_6x16__avx2). Every SIMD kernel is tested
 * against the scalar one (native/tests/test_gemm.c). */
#ifndef COACTO_GEMM_H
#define COACTO_GEMM_H
#include <stddef.h>

typedef struct gemm_epilogue {
    const float *bias;     /* [n] indexed by absolute channel j, or NULL */
    const float *residual; /* R, same indexing as C with leading dimension ld_residual, or NULL */
    size_t ld_residual;
    float lo, hi;          /* clamp bounds: -INFINITY/INFINITY for none, 0/INFINITY for ReLU */
} gemm_epilogue;

/* Micro-kernel: the mr x nr block (mr <= MR, nr <= NR) of C at c (row stride ldc) from a (row
 * stride lda, kc values per row) and one packed panel (kc x NR). accumulate != 0 adds to C
 * instead of overwriting; ep != NULL applies the epilogue after accumulating (bias/residual
 * pointers already offset to the block's first row/channel). b_next, when not NULL, is the
 * panel slice (kc x NR floats) the driver uses next, or with pf_quarter != 0 the quarter of it
 * that starts there: the kernel prefetches it towards L2, spread over its steps, so that weights
 * that come from memory (a layer's weights are read once per tile and are cold) arrive while the
 * current slice is in use. The driver gives a panel's first four row blocks a quarter each when
 * it has that many: one call fetching a whole slice kept more lines in flight than the core has
 * fill buffers, and the stalled prefetches held up its multiply-adds. It is a hint; it is never
 * dereferenced. */
typedef void (*gemm_ukernel_fn)(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                                const float *b_panel, float *c, size_t ldc, int accumulate,
                                const gemm_epilogue *ep, const float *b_next, int pf_quarter);

/* A two-vector micro-kernel's dispatch on the block's row count r: its ukernel_rows(rows, wide,
 * ...) body for that count, wide (both vectors computed) when the block has more than half of
 * NR channels, else the first vector alone. Expands inside the kernel function, whose parameters
 * it names. */
#define GEMM_TWO_VECTOR_ROWS_CASE(r)                                                        \
    case r:                                                                                 \
        if (nr > NR / 2)                                                                    \
            ukernel_rows(r, 1, nr, kc, a, lda, b_panel, c, ldc, accumulate, ep, b_next,     \
                         pf_quarter);                                                       \
        else                                                                                \
            ukernel_rows(r, 0, nr, kc, a, lda, b_panel, c, ldc, accumulate, ep, b_next,     \
                         pf_quarter);                                                       \
        break;

typedef struct gemm_kernel {
    const char *name;
    size_t mr, nr;
    gemm_ukernel_fn ukernel;
    int rank; /* the instruction-set level it needs: 0 scalar, 1 AVX2 / NEON, 2 AVX-512 */
} gemm_kernel;

/* The best kernel this CPU and OS support (CPUID and XCR0 on x86-64; NEON on aarch64) up to the
 * cap COACTO_ISA sets in the environment (scalar, avx2, avx512, neon; COACTO_FORCE_SCALAR=1
 * means scalar). Chosen once, thread-safe. */
const gemm_kernel *gemm_select(void);
/* Every kernel compiled in and usable on this CPU, best first, NULL-terminated (for tests). */
const gemm_kernel *const *gemm_available(void);

/* Floats needed to pack a k x n matrix for kernel kern. */
size_t gemm_packed_size(const gemm_kernel *kern, size_t k, size_t n);
/* Packs B (k x n, row stride ldb: B[k, j] = b[k*ldb + j]) for kern. */
void gemm_pack_b(const gemm_kernel *kern, size_t k, size_t n, const float *b, size_t ldb,
                 float *packed);

/* C[0:m, j0:j1] for channels j0 <= j < j1 (j0 a multiple of kern->nr). a: m rows, stride lda;
 * packed: the whole packed B (k x n_total); c points at C[0, 0] (row stride ldc), so the block
 * written starts at c + j0; ep->bias and ep->residual likewise index absolute channels and rows.
 * Blocks over k internally so panels stay in cache. */
void gemm_run(const gemm_kernel *kern, size_t m, size_t j0, size_t j1, size_t k, const float *a,
              size_t lda, const float *packed, float *c, size_t ldc, const gemm_epilogue *ep);
/* The share of gemm_run over reduction indices [k0, k1) of the k in total (k0 < k1 <= k, or
 * k0 == k1 == k == 0): a points at A[0, k0]; C is overwritten when k0 == 0 and accumulated into
 * otherwise; the epilogue is applied when k1 == k. Calling it for consecutive ranges equals one
 * gemm_run: callers that build A piece by piece (im2col) keep only one piece at a time. */
void gemm_run_k(const gemm_kernel *kern, size_t m, size_t j0, size_t j1, size_t k, size_t k0,
                size_t k1, const float *a, size_t lda, const float *packed, float *c, size_t ldc,
                const gemm_epilogue *ep);

/* A run of consecutive rows for gemm_run_k_rows: m rows of A from a (at the call's reduction
 * index k0), of C from c, and of the residual from `residual` (NULL: none), each with the
 * call's row stride (lda, ldc, ep->ld_residual); c and residual index absolute channels. */
typedef struct gemm_rows {
    const float *a;
    float *c;
    const float *residual;
    size_t m;
} gemm_rows;

/* gemm_run_k for several row runs as one block of rows (a few hundred in all: the A they read
 * should stay in L2): per K block, each panel slice is read once and used by the row blocks of
 * every run. Each run's residual stands in for ep->residual. Callers whose rows of A are not
 * equally spaced (the output rows of a convolution read in place) use it. */
void gemm_run_k_rows(const gemm_kernel *kern, const gemm_rows *runs, size_t n_runs, size_t j0,
                     size_t j1, size_t k, size_t k0, size_t k1, size_t lda, const float *packed,
                     size_t ldc, const gemm_epilogue *ep);

/* Notes for callers (additions to the contract above):
 * - packed must be 64-byte aligned (the SIMD kernels use aligned loads on it); so is then every
 *   panel (packed + p * nr * k) for the SIMD kernels, whose nr is 16 or more. a, c, bias and
 *   residual need only float alignment. ep may be NULL in gemm_run (plain product).
 * - Clamping propagates NaN (max(lo, v), min(hi, v) with v returned when unordered).
 * - The block the ukernel writes is exactly mr x nr: neighbouring parts of C may be written by
 *   other threads at the same time.
 * - With a residual, the SIMD kernels prefetch the residual rows of the next row block (MR rows
 *   further, same stride), which the driver reads next; a prefetch never faults, so rows past the
 *   matrix's end are harmless. */

/* Reduction depth gemm_run hands to one ukernel call (tests sweep k around it). */
size_t gemm_block_k(const gemm_kernel *kern);
size_t gemm_block_m(const gemm_kernel *kern);
/* The deepest reduction gemm_run_k computes in one K block: C written once, after the last
 * multiply-add (a deeper one goes in blocks of equal depth, C read back between them) -- except
 * for the AVX-512 kernel with at least MR rows whose A fits in half of L2 (at most 512 KiB),
 * which takes any reduction in one block (gemm.c, block_k_rows). */
size_t gemm_one_pass_k(const gemm_kernel *kern);

/* The micro-kernels (each compiled in only where its instruction set exists). */
void gemm_f32_4x8__scalar(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                          const float *b_panel, float *c, size_t ldc, int accumulate,
                          const gemm_epilogue *ep, const float *b_next, int pf_quarter);
void gemm_f32_6x16__avx2(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                         const float *b_panel, float *c, size_t ldc, int accumulate,
                         const gemm_epilogue *ep, const float *b_next, int pf_quarter);
void gemm_f32_14x32__avx512f(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                             const float *b_panel, float *c, size_t ldc, int accumulate,
                             const gemm_epilogue *ep, const float *b_next, int pf_quarter);
void gemm_f32_6x16__neon(size_t mr, size_t nr, size_t kc, const float *a, size_t lda,
                         const float *b_panel, float *c, size_t ldc, int accumulate,
                         const gemm_epilogue *ep, const float *b_next, int pf_quarter);

#endif
