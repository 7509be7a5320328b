/* AVX-512F GEMM micro-kernel: 14 rows x 32 channels (two ZMM vectors), 28 accumulators.
 *
 * Per reduction step: two aligned loads of the packed panel, 14 scalar broadcasts of A, 28 FMAs.
 * 14 rows fit the spatial sizes of CNN stages (7x7, 14x14, 28x28, 56x56 are multiples of 7), and
 * every row count of 4 or more keeps at least 8 FMA chains in flight (two FMA ports x latency 4).
 * Each row count gets its own fully unrolled body, so partial row blocks cost only their rows;
 * partial channel blocks use masked loads and stores, never touching C outside the block.
 *
 * The function carries target("avx512f") rather than the file being built with -mavx512f: the
 * package is built with one set of flags and must load on CPUs without AVX-512. */
#if defined(__x86_64__) || defined(_M_X64)
#include <assert.h>
#include <immintrin.h>

#include "kernels/gemm.h"

#define MR 14
#define NR 32

#if defined(__GNUC__) || defined(__clang__)
#define TARGET_AVX512 __attribute__((target("avx512f")))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define TARGET_AVX512
#define ALWAYS_INLINE __forceinline
#endif

#define UNROLL _Pragma("GCC unroll 16")

/* Address of A's row i at the current reduction step. x86 addresses base + index * {1,2,4,8}
 * directly, so two bases (rows 0 and 5) and three strides (1, 3 and 5 rows) reach all 14 rows:
 * five registers instead of one pointer per row, which leaves enough general registers for the
 * loop to run without spills. i is a constant after unrolling, so the switch disappears. */
static ALWAYS_INLINE const float *row_at(size_t i, const char *a0, const char *a5, size_t s1,
                                         size_t s3, size_t s5)
{
    switch (i) {
    case 0: return (const float *)a0;
    case 1: return (const float *)(a0 + s1);
    case 2: return (const float *)(a0 + 2 * s1);
    case 3: return (const float *)(a0 + s3);
    case 4: return (const float *)(a0 + 4 * s1);
    case 5: return (const float *)a5;
    case 6: return (const float *)(a0 + 2 * s3);
    case 7: return (const float *)(a5 + 2 * s1);
    case 8: return (const float *)(a0 + 8 * s1);
    case 9: return (const float *)(a5 + 4 * s1);
    case 10: return (const float *)(a0 + 2 * s5);
    case 11: return (const float *)(a5 + 2 * s3);
    case 12: return (const float *)(a0 + 4 * s3);
    default: return (const float *)(a5 + 8 * s1);
    }
}

#if defined(__GNUC__) || defined(__clang__)
#define HAVE_ASM_LOOP 1
/* Reductions shorter than this take the compiler's loop, whose accumulators stay in registers
 * into the epilogue: the assembly loop stores its 28 to memory and the epilogue loads them back,
 * which a 16- to 32-deep 1x1 convolution felt (MobileNetV2's 16 -> 96 at 112 x 112 and
 * 24 -> 144 at 56 x 56 7-13% faster; 64 or 128 here made no difference to ResNet-50). */
#define ASM_MIN_KC 64
/* The reduction of a full 14-row block, written out: acc[2i], acc[2i + 1] = row i's two vectors
 * over kc steps (the packed panel b; rows of A from a, lda floats apart). The compiler's loop
 * ran out of general registers for fourteen row addresses and reloaded two from the stack every
 * step, which with the pointer updates left the multiply-adds at 208 GFLOP/s of the core's 240;
 * here rows are reached by base + stride x {1, 2, 4, 8} from two bases and three strides, steps
 * go in pairs, and the loop reaches 218. Prefetch of b_next (see gemm_ukernel_fn): none, the
 * whole slice (two lines a step), or a quarter of it (one line a pair of steps); each is its own
 * loop, so no branch in it depends on the step (a countdown to the next prefetch, mispredicted
 * once per prefetch, cost 6% on warm shapes). */
#define ASM_ZERO \
    "vpxord %%zmm0, %%zmm0, %%zmm0\n\t" \
    "vpxord %%zmm1, %%zmm1, %%zmm1\n\t" \
    "vpxord %%zmm2, %%zmm2, %%zmm2\n\t" \
    "vpxord %%zmm3, %%zmm3, %%zmm3\n\t" \
    "vpxord %%zmm4, %%zmm4, %%zmm4\n\t" \
    "vpxord %%zmm5, %%zmm5, %%zmm5\n\t" \
    "vpxord %%zmm6, %%zmm6, %%zmm6\n\t" \
    "vpxord %%zmm7, %%zmm7, %%zmm7\n\t" \
    "vpxord %%zmm8, %%zmm8, %%zmm8\n\t" \
    "vpxord %%zmm9, %%zmm9, %%zmm9\n\t" \
    "vpxord %%zmm10, %%zmm10, %%zmm10\n\t" \
    "vpxord %%zmm11, %%zmm11, %%zmm11\n\t" \
    "vpxord %%zmm12, %%zmm12, %%zmm12\n\t" \
    "vpxord %%zmm13, %%zmm13, %%zmm13\n\t" \
    "vpxord %%zmm14, %%zmm14, %%zmm14\n\t" \
    "vpxord %%zmm15, %%zmm15, %%zmm15\n\t" \
    "vpxord %%zmm16, %%zmm16, %%zmm16\n\t" \
    "vpxord %%zmm17, %%zmm17, %%zmm17\n\t" \
    "vpxord %%zmm18, %%zmm18, %%zmm18\n\t" \
    "vpxord %%zmm19, %%zmm19, %%zmm19\n\t" \
    "vpxord %%zmm20, %%zmm20, %%zmm20\n\t" \
    "vpxord %%zmm21, %%zmm21, %%zmm21\n\t" \
    "vpxord %%zmm22, %%zmm22, %%zmm22\n\t" \
    "vpxord %%zmm23, %%zmm23, %%zmm23\n\t" \
    "vpxord %%zmm24, %%zmm24, %%zmm24\n\t" \
    "vpxord %%zmm25, %%zmm25, %%zmm25\n\t" \
    "vpxord %%zmm26, %%zmm26, %%zmm26\n\t" \
    "vpxord %%zmm27, %%zmm27, %%zmm27\n\t"
#define ASM_STEP0 \
    "vmovaps (%[b]), %%zmm28\n\t" \
    "vmovaps 64(%[b]), %%zmm29\n\t" \
    "vbroadcastss (%[a0]), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm0\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm1\n\t" \
    "vbroadcastss (%[a0],%[s1],1), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm2\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm3\n\t" \
    "vbroadcastss (%[a0],%[s1],2), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm4\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm5\n\t" \
    "vbroadcastss (%[a0],%[s3],1), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm6\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm7\n\t" \
    "vbroadcastss (%[a0],%[s1],4), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm8\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm9\n\t" \
    "vbroadcastss (%[a5]), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm10\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm11\n\t" \
    "vbroadcastss (%[a0],%[s3],2), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm12\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm13\n\t" \
    "vbroadcastss (%[a5],%[s1],2), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm14\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm15\n\t" \
    "vbroadcastss (%[a0],%[s1],8), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm16\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm17\n\t" \
    "vbroadcastss (%[a5],%[s1],4), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm18\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm19\n\t" \
    "vbroadcastss (%[a0],%[s5],2), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm20\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm21\n\t" \
    "vbroadcastss (%[a5],%[s3],2), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm22\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm23\n\t" \
    "vbroadcastss (%[a0],%[s3],4), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm24\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm25\n\t" \
    "vbroadcastss (%[a5],%[s1],8), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm26\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm27\n\t"
#define ASM_STEP1 \
    "vmovaps 128(%[b]), %%zmm28\n\t" \
    "vmovaps 192(%[b]), %%zmm29\n\t" \
    "vbroadcastss 4(%[a0]), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm0\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm1\n\t" \
    "vbroadcastss 4(%[a0],%[s1],1), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm2\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm3\n\t" \
    "vbroadcastss 4(%[a0],%[s1],2), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm4\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm5\n\t" \
    "vbroadcastss 4(%[a0],%[s3],1), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm6\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm7\n\t" \
    "vbroadcastss 4(%[a0],%[s1],4), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm8\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm9\n\t" \
    "vbroadcastss 4(%[a5]), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm10\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm11\n\t" \
    "vbroadcastss 4(%[a0],%[s3],2), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm12\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm13\n\t" \
    "vbroadcastss 4(%[a5],%[s1],2), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm14\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm15\n\t" \
    "vbroadcastss 4(%[a0],%[s1],8), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm16\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm17\n\t" \
    "vbroadcastss 4(%[a5],%[s1],4), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm18\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm19\n\t" \
    "vbroadcastss 4(%[a0],%[s5],2), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm20\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm21\n\t" \
    "vbroadcastss 4(%[a5],%[s3],2), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm22\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm23\n\t" \
    "vbroadcastss 4(%[a0],%[s3],4), %%zmm30\n\t" \
    "vfmadd231ps %%zmm28, %%zmm30, %%zmm24\n\t" \
    "vfmadd231ps %%zmm29, %%zmm30, %%zmm25\n\t" \
    "vbroadcastss 4(%[a5],%[s1],8), %%zmm31\n\t" \
    "vfmadd231ps %%zmm28, %%zmm31, %%zmm26\n\t" \
    "vfmadd231ps %%zmm29, %%zmm31, %%zmm27\n\t"
#define ASM_NEXT_PAIR \
    "add $256, %[b]\n\t" \
    "add $8, %[a0]\n\t" \
    "add $8, %[a5]\n\t"
#define ASM_PREFETCH_STEP \
    "prefetcht1 (%[pf])\n\t" \
    "prefetcht1 64(%[pf])\n\t" \
    "add $128, %[pf]\n\t"
#define ASM_STORE \
    "vmovaps %%zmm0, (%[acc])\n\t" \
    "vmovaps %%zmm1, 64(%[acc])\n\t" \
    "vmovaps %%zmm2, 128(%[acc])\n\t" \
    "vmovaps %%zmm3, 192(%[acc])\n\t" \
    "vmovaps %%zmm4, 256(%[acc])\n\t" \
    "vmovaps %%zmm5, 320(%[acc])\n\t" \
    "vmovaps %%zmm6, 384(%[acc])\n\t" \
    "vmovaps %%zmm7, 448(%[acc])\n\t" \
    "vmovaps %%zmm8, 512(%[acc])\n\t" \
    "vmovaps %%zmm9, 576(%[acc])\n\t" \
    "vmovaps %%zmm10, 640(%[acc])\n\t" \
    "vmovaps %%zmm11, 704(%[acc])\n\t" \
    "vmovaps %%zmm12, 768(%[acc])\n\t" \
    "vmovaps %%zmm13, 832(%[acc])\n\t" \
    "vmovaps %%zmm14, 896(%[acc])\n\t" \
    "vmovaps %%zmm15, 960(%[acc])\n\t" \
    "vmovaps %%zmm16, 1024(%[acc])\n\t" \
    "vmovaps %%zmm17, 1088(%[acc])\n\t" \
    "vmovaps %%zmm18, 1152(%[acc])\n\t" \
    "vmovaps %%zmm19, 1216(%[acc])\n\t" \
    "vmovaps %%zmm20, 1280(%[acc])\n\t" \
    "vmovaps %%zmm21, 1344(%[acc])\n\t" \
    "vmovaps %%zmm22, 1408(%[acc])\n\t" \
    "vmovaps %%zmm23, 1472(%[acc])\n\t" \
    "vmovaps %%zmm24, 1536(%[acc])\n\t" \
    "vmovaps %%zmm25, 1600(%[acc])\n\t" \
    "vmovaps %%zmm26, 1664(%[acc])\n\t" \
    "vmovaps %%zmm27, 1728(%[acc])\n\t"
#define ASM_OPERANDS                                                                        \
    : [a0] "+r"(a0), [a5] "+r"(a5), [b] "+r"(b), [pairs] "+r"(pairs), [pf] "+r"(pf)            \
    : [s1] "r"(s1), [s3] "r"(s3), [s5] "r"(s5), [acc] "r"(acc), [odd] "r"(odd)                 \
    : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",           \
      "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17",   \
      "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", \
      "xmm28", "xmm29", "xmm30", "xmm31"
/* The pairs loop with PF before each step (PF2 before the second), the odd step, the store. */
#define ASM_LOOP(PF, PF2)                                                                   \
    __asm__ volatile(ASM_ZERO "test %[pairs], %[pairs]\n\t"                                 \
                     "jz 3f\n\t"                                                            \
                     "1:\n\t" PF ASM_STEP0 PF2 ASM_STEP1 ASM_NEXT_PAIR "dec %[pairs]\n\t"   \
                     "jnz 1b\n\t"                                                           \
                     "3:\n\t"                                                               \
                     "test %[odd], %[odd]\n\t"                                              \
                     "jz 2f\n\t" PF ASM_STEP0 "2:\n\t" ASM_STORE ASM_OPERANDS)

static TARGET_AVX512 void reduce_14x32(size_t kc, const float *a, size_t lda, const float *b,
                                       const float *b_next, int quarter, __m512 *acc)
{
    const char *a0 = (const char *)a;
    const size_t s1 = lda * sizeof(float), s3 = 3 * s1, s5 = 5 * s1;
    const char *a5 = a0 + s5;
    const char *pf = (const char *)b_next;
    size_t pairs = kc / 2;
    const size_t odd = kc & 1;
    if (!pf)
        ASM_LOOP("", "");
    else if (quarter)
        ASM_LOOP("prefetcht1 (%[pf])\n\t"
                 "add $64, %[pf]\n\t",
                 "");
    else
        ASM_LOOP(ASM_PREFETCH_STEP, ASM_PREFETCH_STEP);
}
#endif

/* wide: the block has more than 16 channels. A narrow one (a layer of 16 or fewer, or the last
 * 16 of a layer of 48) computes its first vector only: half the multiply-adds, where both
 * vectors were computed and the second thrown away (MobileNetV2's 32 -> 16 projection at
 * 112x112 ran at half the speed of onnxruntime's). */
static TARGET_AVX512 ALWAYS_INLINE void ukernel_rows(const size_t rows, const int wide, size_t nr,
                                                     size_t kc, const float *a, size_t lda,
                                                     const float *b, float *c, size_t ldc,
                                                     int accumulate, const gemm_epilogue *ep,
                                                     const float *b_next, int pf_quarter)
{
    __m512 acc0[MR], acc1[MR];
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        acc0[i] = _mm512_setzero_ps();
        acc1[i] = _mm512_setzero_ps();
    }
    const size_t s1 = lda * sizeof(float), s3 = 3 * s1, s5 = 5 * s1;
    const char *a0 = (const char *)a;
    const char *a5 = rows > 5 ? a0 + s5 : a0;
    if (ep && ep->residual) {
        /* The residual is cold (written layers ago) and read only at the end, where nothing
         * hides its latency: fetch the rows of the next row block, which the driver's next call
         * reads, now (prefetches never fault, past the matrix's end included). */
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const char *r = (const char *)(ep->residual + (i + MR) * ep->ld_residual);
            _mm_prefetch(r, _MM_HINT_T0);
            _mm_prefetch(r + 64, _MM_HINT_T0);
        }
    }
#ifdef HAVE_ASM_LOOP
    if (rows == MR && wide && kc >= ASM_MIN_KC) {
        __m512 acc[2 * MR] __attribute__((aligned(64)));
        reduce_14x32(kc, a, lda, b, b_next, pf_quarter, acc);
        UNROLL for (size_t i = 0; i < MR; i++)
        {
            acc0[i] = acc[2 * i];
            acc1[i] = acc[2 * i + 1];
        }
        kc = 0; /* the loop below has nothing left to do */
    }
#endif
    const char *pf = (const char *)b_next;
    for (size_t p = 0; p < kc; p++) {
        if (pf && !pf_quarter) { /* the whole next slice: two lines a step */
            _mm_prefetch(pf, _MM_HINT_T1);
            _mm_prefetch(pf + 64, _MM_HINT_T1);
            pf += NR * sizeof(float);
        } else if (pf && (p & 1) == 0) { /* a quarter: one line every other step */
            _mm_prefetch(pf, _MM_HINT_T1);
            pf += 64;
        }
        const __m512 b0 = _mm512_load_ps(b);
        const __m512 b1 = wide ? _mm512_load_ps(b + 16) : b0;
        b += NR;
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            const __m512 ai = _mm512_set1_ps(*row_at(i, a0, a5, s1, s3, s5));
            acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
            if (wide) acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
        }
        a0 += sizeof(float);
        a5 += sizeof(float);
    }

    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    const __mmask16 m1 = nr >= 32   ? (__mmask16)0xFFFF
                         : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u)
                                   : (__mmask16)0;
    if (accumulate) {
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            acc0[i] = _mm512_add_ps(acc0[i], _mm512_maskz_loadu_ps(m0, c + i * ldc));
            if (wide)
                acc1[i] = _mm512_add_ps(acc1[i], _mm512_maskz_loadu_ps(m1, c + i * ldc + 16));
        }
    }
    if (ep) {
        if (ep->bias) {
            const __m512 bias0 = _mm512_maskz_loadu_ps(m0, ep->bias);
            const __m512 bias1 = wide ? _mm512_maskz_loadu_ps(m1, ep->bias + 16) : bias0;
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                acc0[i] = _mm512_add_ps(acc0[i], bias0);
                if (wide) acc1[i] = _mm512_add_ps(acc1[i], bias1);
            }
        }
        if (ep->residual) {
            const float *r = ep->residual;
            const size_t ldr = ep->ld_residual;
            UNROLL for (size_t i = 0; i < rows; i++)
            {
                acc0[i] = _mm512_add_ps(acc0[i], _mm512_maskz_loadu_ps(m0, r + i * ldr));
                if (wide)
                    acc1[i] = _mm512_add_ps(acc1[i],
                                            _mm512_maskz_loadu_ps(m1, r + i * ldr + 16));
            }
        }
        /* max(lo, v) / min(hi, v) return v when v is NaN: NaN propagates like in the oracle. */
        const __m512 lo = _mm512_set1_ps(ep->lo), hi = _mm512_set1_ps(ep->hi);
        UNROLL for (size_t i = 0; i < rows; i++)
        {
            acc0[i] = _mm512_min_ps(hi, _mm512_max_ps(lo, acc0[i]));
            if (wide) acc1[i] = _mm512_min_ps(hi, _mm512_max_ps(lo, acc1[i]));
        }
    }
    UNROLL for (size_t i = 0; i < rows; i++)
    {
        _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
        if (wide) _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
    }
}

#define ROWS_CASE(r) GEMM_TWO_VECTOR_ROWS_CASE(r)

TARGET_AVX512 void gemm_f32_14x32__avx512f(size_t mr, size_t nr, size_t kc, const float *a,
                                           size_t lda, const float *b_panel, float *c,
                                           size_t ldc, int accumulate, const gemm_epilogue *ep,
                                           const float *b_next, int pf_quarter)
{
    assert(mr <= MR && nr <= NR);
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7)
        ROWS_CASE(8) ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13)
        ROWS_CASE(14)
    default:
        break;
    }
}

#endif
