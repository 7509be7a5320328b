/* Tiles of the operators sequence models (transformers) add: matrix products of two activations
 * (attention scores and contexts), layer normalisation, reductions over a column's rows, and
 * embedding lookups.
 *
 * MATMUL reads its operands through strides straight from the producers' storage, so the head
 * split of a projection ((B, S, h*dh) read as (B, h, S, dh)) and the transposed keys of Q.K^T cost
 * no copy. A tile is decomposed into blocks of one batch (b0, b1), a run of rows i and a range of
 * columns j; each block packs its part of B (scaled) into GEMM panels in scratch and runs the
 * GEMM micro-kernels on A in place. */
#include <string.h>

#include "kernels/vec.h"
#include "ops_internal.h"

/* ---- MATMUL ---------------------------------------------------------------------------------- */

typedef struct matmul_params {
    int64_t b0, b1, m, n, k;
    int64_t a_off, a_s0, a_s1, a_si;
    int64_t b_off, b_s0, b_s1, b_sk, b_sj;
    int64_t out_mode, causal, offset;
    int64_t has_mask, m_off, m_s0, m_s1, m_si, m_sj;
    float scale, fill;
} matmul_params;

static matmul_params matmul_params_of(const layer *l) {
    const int32_t *p = l->iparams;
    matmul_params q = {
        .b0 = p[0], .b1 = p[1], .m = p[2], .n = p[3], .k = p[4],
        .a_off = p[5], .a_s0 = p[6], .a_s1 = p[7], .a_si = p[8],
        .b_off = p[9], .b_s0 = p[10], .b_s1 = p[11], .b_sk = p[12], .b_sj = p[13],
        .out_mode = p[14], .causal = p[15], .offset = p[16],
        .has_mask = p[17], .m_off = p[18], .m_s0 = p[19], .m_s1 = p[20], .m_si = p[21],
        .m_sj = p[22], .scale = l->fparams[0], .fill = l->fparams[1],
    };
    return q;
}

/* Columns of B packed per block: the packed panels (k x this) stay near 4 MiB at most. */
#define MATMUL_PACK_FLOATS ((size_t)1 << 20)
#define MATMUL_MAX_BLOCK_N 512

static size_t matmul_block_n(const gemm_kernel *kern, int64_t n, int64_t k) {
    size_t nr = kern->nr, jb = MATMUL_PACK_FLOATS / (size_t)k;
    if (jb > MATMUL_MAX_BLOCK_N) jb = MATMUL_MAX_BLOCK_N;
    if (jb > (size_t)n) jb = (size_t)n;
    jb = jb / nr * nr;
    return jb ? jb : nr;
}

/* Largest element index an operand reads: off + sum (dim - 1) * stride (all terms >= 0). */
static int64_t last_index(int64_t off, const int64_t *dims, const int64_t *strides, int count) {
    int64_t last = off;
    for (int i = 0; i < count; i++) {
        int64_t t = ops_mul(dims[i] - 1, strides[i]);
        if (t < 0 || last > OPS_MAX_ELEMENTS - t) return -1;
        last += t;
    }
    return last;
}

static int64_t input_elements(const layer *l, int i) {
    return ops_mul(ops_mul(ops_mul(l->in_n[i], l->in_c[i]), l->in_h[i]), l->in_w[i]);
}

/* What MATMUL and ATTENTION check alike: the output arrangement (out_n columns of a batch's
 * output: MATMUL's N, ATTENTION's DV), the inputs (A, B, then the mask at input mask_in), the
 * strides and offsets of A, B and the mask, and that each stays inside its input. */
static coacto_status check_products(const layer *l, const matmul_params *q, const char *op,
                                    int64_t out_n, int mask_in, char *err, size_t err_size) {
    OPS_REQUIRE(q->out_mode == 0 || q->out_mode == 1, "%s out_mode %lld must be 0 or 1", op,
                (long long)q->out_mode);
    OPS_REQUIRE(q->has_mask == 0 || q->has_mask == 1, "%s has_mask must be 0 or 1", op);
    OPS_REQUIRE(l->n_inputs == mask_in + q->has_mask, "%s with has_mask %lld takes %lld inputs, "
                "got %d", op, (long long)q->has_mask, (long long)(mask_in + q->has_mask),
                l->n_inputs);
    int64_t cols = (int64_t)l->n * l->h * l->w;
    int64_t want_cols = q->out_mode ? ops_mul(q->b0, q->m) : ops_mul(ops_mul(q->b0, q->b1), q->m);
    int64_t want_rows = q->out_mode ? ops_mul(q->b1, out_n) : out_n;
    OPS_REQUIRE(cols == want_cols && l->c == want_rows,
                "%s output has %lld columns x %d rows, its dims and out_mode give %lld x %lld", op,
                (long long)cols, l->c, (long long)want_cols, (long long)want_rows);
    int64_t strides[] = {q->a_s0, q->a_s1, q->a_si, q->b_s0, q->b_s1, q->b_sk, q->b_sj,
                         q->m_s0, q->m_s1, q->m_si, q->m_sj, q->a_off, q->b_off, q->m_off};
    for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++)
        OPS_REQUIRE(strides[i] >= 0, "%s strides and offsets must be >= 0", op);
    OPS_REQUIRE(q->b_sk == 1 || q->b_sj == 1, "%s needs B contiguous along k or j (b_sk %lld, "
                "b_sj %lld)", op, (long long)q->b_sk, (long long)q->b_sj);
    int64_t a_dims[] = {q->b0, q->b1, q->m, q->k}, a_str[] = {q->a_s0, q->a_s1, q->a_si, 1};
    int64_t b_dims[] = {q->b0, q->b1, q->k, q->n}, b_str[] = {q->b_s0, q->b_s1, q->b_sk, q->b_sj};
    int64_t a_last = last_index(q->a_off, a_dims, a_str, 4);
    int64_t b_last = last_index(q->b_off, b_dims, b_str, 4);
    OPS_REQUIRE(a_last >= 0 && a_last < input_elements(l, 0),
                "%s reads A up to element %lld of an input of %lld", op, (long long)a_last,
                (long long)input_elements(l, 0));
    OPS_REQUIRE(b_last >= 0 && b_last < input_elements(l, 1),
                "%s reads B up to element %lld of an input of %lld", op, (long long)b_last,
                (long long)input_elements(l, 1));
    if (q->has_mask) {
        OPS_REQUIRE(q->m_sj == 0 || q->m_sj == 1, "%s mask stride along j must be 0 or 1", op);
        int64_t m_dims[] = {q->b0, q->b1, q->m, q->n};
        int64_t m_str[] = {q->m_s0, q->m_s1, q->m_si, q->m_sj};
        int64_t m_last = last_index(q->m_off, m_dims, m_str, 4);
        OPS_REQUIRE(m_last >= 0 && m_last < input_elements(l, mask_in),
                    "%s reads the mask up to element %lld of an input of %lld", op,
                    (long long)m_last, (long long)input_elements(l, mask_in));
    }
    return COACTO_OK;
}

coacto_status matmul_prepare(layer *l, char *err, size_t err_size) {
    matmul_params q = matmul_params_of(l);
    OPS_REQUIRE(q.b0 >= 1 && q.b1 >= 1 && q.m >= 1 && q.n >= 1 && q.k >= 1,
                "MATMUL dims %lldx%lldx%lldx%lldx%lld (B0, B1, M, N, K) must be positive",
                (long long)q.b0, (long long)q.b1, (long long)q.m, (long long)q.n, (long long)q.k);
    OPS_REQUIRE(q.causal >= 0 && q.causal <= 2, "MATMUL causal %lld must be 0, 1 or 2",
                (long long)q.causal);
    coacto_status st = check_products(l, &q, "MATMUL", q.n, 2, err, err_size);
    if (st != COACTO_OK) return st;
    const gemm_kernel *kern = l->kern ? l->kern : gemm_select();
    l->kern = kern;
    size_t jb = matmul_block_n(kern, q.n, q.k);
    l->scratch_fixed = ops_round_up((size_t)q.k * jb, 16);
    /* causal 2 copies the block's A rows with zeros past each row's last k. */
    l->scratch_per_col = q.causal == 2 ? (size_t)q.k : 0;
    return COACTO_OK;
}

/* Packs scale * B[0:k, j0:j1) of one batch (b points at B[0, 0]) into GEMM panels: panel p holds
 * columns j0 + p*nr .. + nr for every k (kernels/gemm.h), zeros past j1. */
static void matmul_pack_b(const gemm_kernel *kern, const matmul_params *q, const float *b,
                          int64_t k, int64_t j0, int64_t j1, float *restrict packed) {
    size_t nr = kern->nr;
    float s = q->scale;
    for (int64_t jp = j0; jp < j1; jp += (int64_t)nr) {
        int64_t w = j1 - jp < (int64_t)nr ? j1 - jp : (int64_t)nr;
        float *panel = packed + (size_t)((jp - j0) / (int64_t)nr) * (size_t)k * nr;
        if (q->b_sj == 1) { /* rows of B contiguous along j */
            for (int64_t kk = 0; kk < k; kk++) {
                const float *src = b + kk * q->b_sk + jp;
                float *dst = panel + (size_t)kk * nr;
                for (int64_t j = 0; j < w; j++) dst[j] = s * src[j];
                for (size_t j = (size_t)w; j < nr; j++) dst[j] = 0.0f;
            }
        } else { /* columns of B contiguous along k (B^T stored row by row, as keys are): each
                  * panel row written whole from the w columns side by side, whose lines stay in
                  * L1 for 16 steps (column by column, every write went to another line, and
                  * packing ViT's keys took twice as long) */
            const float *src = b + jp * q->b_sj;
            for (int64_t kk = 0; kk < k; kk++) {
                float *dst = panel + (size_t)kk * nr;
                for (int64_t j = 0; j < w; j++) dst[j] = s * src[j * q->b_sj + kk];
                for (size_t j = (size_t)w; j < nr; j++) dst[j] = 0.0f;
            }
        }
    }
}

/* Rows [i0, i1) x columns [j0, j1) of batch (b0, b1); c points at the output of (i, j) = (0, 0)
 * of this batch (row i at c + i*ldc). */
static void matmul_block(const layer *l, const matmul_params *q, const float *const *in,
                         int64_t b0, int64_t b1, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                         float *c, size_t ldc, float *scratch) {
    const gemm_kernel *kern = l->kern;
    const float *a = in[0] + q->a_off + b0 * q->a_s0 + b1 * q->a_s1;
    const float *b = in[1] + q->b_off + b0 * q->b_s0 + b1 * q->b_s1;
    const float *mask = q->has_mask ? in[2] + q->m_off + b0 * q->m_s0 + b1 * q->m_s1 : NULL;
    size_t jb_max = matmul_block_n(kern, q->n, q->k);
    float *packed = scratch;
    float *acopy = scratch + ops_round_up((size_t)q->k * jb_max, 16);
    size_t chunk = 2 * kern->mr; /* rows per causal step: the triangle's waste stays small */

    for (int64_t jb = j0; jb < j1; jb += (int64_t)jb_max) {
        int64_t je = j1 - jb < (int64_t)jb_max ? j1 : jb + (int64_t)jb_max;
        /* Columns computed: all, or (causal 1) those some row of the block keeps. */
        int64_t jc = je;
        if (q->causal == 1 && i1 - 1 + q->offset + 1 < jc) jc = i1 - 1 + q->offset + 1;
        /* Reduction depth: all of k, or (causal 2) what the block's last row sums over. */
        int64_t kd = q->k;
        if (q->causal == 2 && i1 - 1 + q->offset + 1 < kd) kd = i1 - 1 + q->offset + 1;
        if (jc > jb && kd > 0) matmul_pack_b(kern, q, b, kd, jb, jc, packed);
        if (q->causal == 2) {
            if (kd > 0) {
                /* A rows with zeros past each row's own last k. */
                for (int64_t i = i0; i < i1; i++) {
                    int64_t ki = i + q->offset + 1;
                    ki = ki < 0 ? 0 : ki > kd ? kd : ki;
                    float *dst = acopy + (size_t)(i - i0) * (size_t)kd;
                    memcpy(dst, a + i * q->a_si, (size_t)ki * sizeof(float));
                    memset(dst + ki, 0, (size_t)(kd - ki) * sizeof(float));
                }
            }
        }
        for (int64_t ia = i0; ia < i1;) {
            int64_t ib = q->causal == 1 ? (i1 - ia < (int64_t)chunk ? i1 : ia + (int64_t)chunk) : i1;
            int64_t jl = jc, first = ia;
            if (q->causal == 1) {
                if (ib - 1 + q->offset + 1 < jl) jl = ib - 1 + q->offset + 1;
                if (jb - q->offset > first) first = jb - q->offset; /* rows that keep nothing */
            }
            if (jl > jb && first < ib && kd > 0) {
                gemm_epilogue ep = {NULL, NULL, 0, -INFINITY, INFINITY};
                if (mask && q->m_sj == 1) {
                    ep.residual = mask + first * q->m_si + jb;
                    ep.ld_residual = (size_t)q->m_si;
                }
                const float *ap = q->causal == 2 ? acopy + (size_t)(first - i0) * (size_t)kd
                                                 : a + first * q->a_si;
                size_t lda = q->causal == 2 ? (size_t)kd : (size_t)q->a_si;
                gemm_run(kern, (size_t)(ib - first), 0, (size_t)(jl - jb), (size_t)kd, ap, lda,
                         packed, c + (size_t)first * ldc + (size_t)jb, ldc, &ep);
            }
            /* What the GEMM did not write: filled (causal 1) or zero sums; then the mask where the
             * epilogue did not add it. */
            for (int64_t i = ia; i < ib; i++) {
                float *ci = c + (size_t)i * ldc;
                const float *mi = mask ? mask + i * q->m_si : NULL;
                int64_t done_lo = jb, done_hi = jb; /* columns the GEMM wrote for row i */
                if (jl > jb && i >= first && kd > 0) done_hi = jl;
                for (int64_t j = done_hi; j < je; j++) {
                    int keep = q->causal != 1 || j <= i + q->offset;
                    float v = keep ? 0.0f : q->fill;
                    ci[j] = mi ? v + mi[j * q->m_sj] : v;
                }
                if (q->causal == 1)
                    for (int64_t j = done_lo > i + q->offset + 1 ? done_lo : i + q->offset + 1;
                         j < done_hi; j++)
                        ci[j] = mi ? q->fill + mi[j * q->m_sj] : q->fill;
                if (mi && q->m_sj == 0)
                    for (int64_t j = done_lo; j < done_hi; j++)
                        if (q->causal != 1 || j <= i + q->offset) ci[j] += mi[0];
            }
            ia = ib;
        }
    }
}

void matmul_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1, float *scratch) {
    matmul_params q = matmul_params_of(l);
    size_t ldc = (size_t)l->c;
    for (int64_t col = col0; col < col1;) {
        if (q.out_mode == 0) {
            int64_t bb = col / q.m, i0 = col % q.m;
            int64_t i1 = q.m - i0 < col1 - col ? q.m : i0 + (col1 - col);
            float *c = out + (col - i0) * (int64_t)ldc; /* row i = 0 of this batch */
            matmul_block(l, &q, in, bb / q.b1, bb % q.b1, i0, i1, row0, row1, c, ldc, scratch);
            col += i1 - i0;
        } else {
            int64_t b0 = col / q.m, i0 = col % q.m;
            int64_t i1 = q.m - i0 < col1 - col ? q.m : i0 + (col1 - col);
            for (int64_t b1 = row0 / q.n; b1 <= (row1 - 1) / q.n; b1++) {
                int64_t first = b1 * q.n;
                int64_t j0 = row0 > first ? row0 - first : 0;
                int64_t j1 = row1 < first + q.n ? row1 - first : q.n;
                float *c = out + (col - i0) * (int64_t)ldc + first;
                matmul_block(l, &q, in, b0, b1, i0, i1, j0, j1, c, ldc, scratch);
            }
            col += i1 - i0;
        }
    }
}

/* ---- ATTENTION ------------------------------------------------------------------------------- */

/* The scores of a MATMUL (iparams 0..22 as there; out_mode says how the context is written),
 * then the values V read through strides as MATMUL reads B. */
typedef struct attn_params {
    matmul_params s;
    int64_t dv, v_off, v_s0, v_s1, v_sk, v_sj;
} attn_params;

static attn_params attn_params_of(const layer *l) {
    const int32_t *p = l->iparams;
    attn_params q = {.s = matmul_params_of(l), .dv = p[23], .v_off = p[24], .v_s0 = p[25],
                     .v_s1 = p[26], .v_sk = p[27], .v_sj = p[28]};
    q.s.fill = 0.0f; /* keys past the diagonal are left out, not filled */
    return q;
}

/* Scratch: the keys packed (k x n), the values packed (n x dv), and the scores and their
 * exponentials for one row block. */
#define ATTN_MAX_SCRATCH_FLOATS ((size_t)1 << 26)
#define ATTN_MAX_ROWS 64 /* a row block's queries at most (their sums are kept) */
/* Rather than one micro-kernel row block (a GEMM call of a few hundred kFLOP per step): blocks
 * of 16, 64 and 128 KiB measured alike, within 3%, on ViT, BERT and GPT-2 (Zen 4, 1 MiB L2). */
#define ATTN_BLOCK_BYTES ((size_t)64 << 10)

/* Floats between rows of the scores block: whole cache lines, an odd number of them, so that the
 * rows the context product reads together fall in different sets (gemm.c, a_rows_conflict). */
static size_t attn_ld(int64_t n) {
    size_t ld = ((size_t)n + 15) / 16 * 16;
    return (ld / 16) % 2 ? ld : ld + 16;
}

static size_t round_to(size_t v, size_t m) { return (v + m - 1) / m * m; }

/* Queries per row block: its scores and their exponentials (2 x rows x ld floats) in about
 * ATTN_BLOCK_BYTES, in whole micro-kernel row blocks, at least one. */
static size_t attn_rows(const gemm_kernel *kern, int64_t n) {
    size_t rows = ATTN_BLOCK_BYTES / (2 * attn_ld(n) * sizeof(float)) / kern->mr * kern->mr;
    if (rows > ATTN_MAX_ROWS) rows = ATTN_MAX_ROWS / kern->mr * kern->mr;
    return rows < kern->mr ? kern->mr : rows;
}


coacto_status attention_prepare(layer *l, char *err, size_t err_size) {
    attn_params q = attn_params_of(l);
    const matmul_params *s = &q.s;
    OPS_REQUIRE(s->b0 >= 1 && s->b1 >= 1 && s->m >= 1 && s->n >= 1 && s->k >= 1 && q.dv >= 1,
                "ATTENTION dims %lldx%lldx%lldx%lldx%lldx%lld (B0, B1, M, N, K, DV) must be "
                "positive", (long long)s->b0, (long long)s->b1, (long long)s->m, (long long)s->n,
                (long long)s->k, (long long)q.dv);
    OPS_REQUIRE(s->causal == 0 || s->causal == 1, "ATTENTION causal %lld must be 0 or 1",
                (long long)s->causal);
    OPS_REQUIRE(!s->causal || s->offset >= 0,
                "ATTENTION causal offset %lld must be >= 0 (every query keeps a key)",
                (long long)s->offset);
    coacto_status st = check_products(l, s, "ATTENTION", q.dv, 3, err, err_size);
    if (st != COACTO_OK) return st;
    int64_t v_str[] = {q.v_s0, q.v_s1, q.v_sk, q.v_sj}, v_dims[] = {s->b0, s->b1, s->n, q.dv};
    OPS_REQUIRE(q.v_off >= 0 && q.v_s0 >= 0 && q.v_s1 >= 0 && q.v_sk >= 0 && q.v_sj >= 0,
                "ATTENTION value strides and offset must be >= 0");
    OPS_REQUIRE(q.v_sk == 1 || q.v_sj == 1, "ATTENTION needs the values contiguous along a key "
                "or a feature (v_sk %lld, v_sj %lld)", (long long)q.v_sk, (long long)q.v_sj);
    int64_t v_last = last_index(q.v_off, v_dims, v_str, 4);
    OPS_REQUIRE(v_last >= 0 && v_last < input_elements(l, 2),
                "ATTENTION reads the values up to element %lld of an input of %lld",
                (long long)v_last, (long long)input_elements(l, 2));
    const gemm_kernel *kern = l->kern ? l->kern : gemm_select();
    l->kern = kern;
    OPS_REQUIRE(kern->mr <= ATTN_MAX_ROWS, "kernel %s has more than %d rows", kern->name,
                ATTN_MAX_ROWS);
    /* the dims are below 2^31 each; in double, the products cannot overflow before the check */
    double floats = (double)s->k * (double)round_to((size_t)s->n, kern->nr) +
                    (double)s->n * (double)round_to((size_t)q.dv, kern->nr) +
                    2.0 * (double)ATTN_MAX_ROWS * (double)attn_ld(s->n) + 64.0;
    OPS_REQUIRE(floats <= (double)ATTN_MAX_SCRATCH_FLOATS,
                "ATTENTION keeps one head's keys and values packed: %.0f floats, more than %zu "
                "(fewer keys or a smaller head dimension)", floats, ATTN_MAX_SCRATCH_FLOATS);
    l->scratch_fixed = ops_round_up((size_t)s->k * round_to((size_t)s->n, kern->nr), 16) +
                       ops_round_up((size_t)s->n * round_to((size_t)q.dv, kern->nr), 16) +
                       2 * attn_rows(kern, s->n) * attn_ld(s->n);
    return COACTO_OK;
}

/* e = exp(x - max x) over n values; returns their sum. */
static float attn_exp(const float *x, float *e, size_t n) {
    float max;
#if defined(__x86_64__) || defined(_M_X64)
    if (vec_avx512_usable()) return vec_softmax_exp_avx512(x, e, n, &max);
#endif
    return ops_softmax_exp(x, e, n, &max);
}

/* Queries [i0, i1) x features [d0, d1) of batch (b0, b1); c points at the output of (i, d) =
 * (0, 0) of this batch (query i at c + i*ldc). One row block at a time: its scores (a GEMM
 * against the packed keys) stay in L1, their exponentials are multiplied by the packed values
 * into the output, and each output row is divided by its sum. */
static void attn_block(const layer *l, const attn_params *q, const float *const *in, int64_t b0,
                       int64_t b1, int64_t i0, int64_t i1, int64_t d0, int64_t d1, float *c,
                       size_t ldc, float *scratch) {
    const gemm_kernel *kern = l->kern;
    const matmul_params *s = &q->s;
    const int64_t n = s->n, k = s->k, off = s->offset;
    const size_t ld = attn_ld(n), mr = kern->mr, rows = attn_rows(kern, n);
    const float *a = in[0] + s->a_off + b0 * s->a_s0 + b1 * s->a_s1;
    const float *b = in[1] + s->b_off + b0 * s->b_s0 + b1 * s->b_s1;
    const float *v = in[2] + q->v_off + b0 * q->v_s0 + b1 * q->v_s1;
    const float *mask = s->has_mask ? in[3] + s->m_off + b0 * s->m_s0 + b1 * s->m_s1 : NULL;
    float *packed_k = scratch;
    float *packed_v = packed_k + ops_round_up((size_t)k * round_to((size_t)n, kern->nr), 16);
    float *sbuf = packed_v + ops_round_up((size_t)n * round_to((size_t)q->dv, kern->nr), 16);
    float *ebuf = sbuf + rows * ld;

    /* keys the block's last query keeps */
    const int64_t jn = s->causal && i1 - 1 + off + 1 < n ? i1 - 1 + off + 1 : n;
    matmul_pack_b(kern, s, b, k, 0, jn, packed_k);
    matmul_params vp = {.b_sk = q->v_sk, .b_sj = q->v_sj, .scale = 1.0f};
    matmul_pack_b(kern, &vp, v, jn, d0, d1, packed_v);

    float inv[ATTN_MAX_ROWS];
    for (int64_t i = i0; i < i1;) {
        /* no last block of a few rows (gemm.c's block_rows shares them out within a block) */
        const int64_t left = i1 - i, full = (int64_t)rows;
        const int64_t r = left <= full ? left : left < full + (int64_t)mr ? left - (int64_t)mr : full;
        const int64_t jr = s->causal && i + r - 1 + off + 1 < n ? i + r - 1 + off + 1 : n;
        gemm_epilogue ep = {NULL, NULL, 0, -INFINITY, INFINITY};
        if (mask && s->m_sj == 1) {
            ep.residual = mask + i * s->m_si;
            ep.ld_residual = (size_t)s->m_si;
        }
        gemm_run(kern, (size_t)r, 0, (size_t)jr, (size_t)k, a + i * s->a_si, (size_t)s->a_si,
                 packed_k, sbuf, ld, &ep);
        for (int64_t t = 0; t < r; t++) {
            float *srow = sbuf + (size_t)t * ld, *erow = ebuf + (size_t)t * ld;
            if (mask && s->m_sj == 0) {
                const float mv = mask[(i + t) * s->m_si];
                for (int64_t j = 0; j < jr; j++) srow[j] += mv;
            }
            const int64_t keep = s->causal && i + t + off + 1 < jr ? i + t + off + 1 : jr;
            inv[t] = 1.0f / attn_exp(srow, erow, (size_t)keep);
            for (int64_t j = keep; j < jr; j++) erow[j] = 0.0f;
        }
        float *ci = c + (size_t)i * ldc + d0;
        gemm_run_k(kern, (size_t)r, 0, (size_t)(d1 - d0), (size_t)jn, 0, (size_t)jr, ebuf, ld,
                   packed_v, ci, ldc, NULL);
        for (int64_t t = 0; t < r; t++) {
            float *o = ci + (size_t)t * ldc;
            const float f = inv[t];
            for (int64_t d = 0; d < d1 - d0; d++) o[d] *= f;
        }
        i += r;
    }
}

void attention_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                       int32_t col1, int32_t row0, int32_t row1, float *scratch) {
    attn_params q = attn_params_of(l);
    const int64_t m = q.s.m, dv = q.dv;
    size_t ldc = (size_t)l->c;
    for (int64_t col = col0; col < col1;) {
        int64_t i0 = col % m;
        int64_t i1 = m - i0 < col1 - col ? m : i0 + (col1 - col);
        float *c = out + (col - i0) * (int64_t)ldc; /* query i = 0 of this batch */
        if (q.s.out_mode == 0) {
            int64_t bb = col / m;
            attn_block(l, &q, in, bb / q.s.b1, bb % q.s.b1, i0, i1, row0, row1, c, ldc, scratch);
        } else {
            for (int64_t b1 = row0 / dv; b1 <= (row1 - 1) / dv; b1++) {
                int64_t first = b1 * dv;
                int64_t d0 = row0 > first ? row0 - first : 0;
                int64_t d1 = row1 < first + dv ? row1 - first : dv;
                attn_block(l, &q, in, col / m, b1, i0, i1, d0, d1, c + first, ldc, scratch);
            }
        }
        col += i1 - i0;
    }
}

/* ---- LAYERNORM ------------------------------------------------------------------------------- */

coacto_status layernorm_prepare(layer *l, char *err, size_t err_size) {
    OPS_REQUIRE(isfinite(l->fparams[0]) && l->fparams[0] >= 0.0f,
                "LAYERNORM epsilon %g must be finite and >= 0", (double)l->fparams[0]);
    coacto_status st = ops_check_same_dims(l, 0, err, err_size);
    if (st == COACTO_OK) st = ops_check_array(l, 0, (int64_t)l->c * 4, "scale", err, err_size);
    if (st == COACTO_OK) st = ops_check_array(l, 1, (int64_t)l->c * 4, "shift", err, err_size);
    return st;
}

/* Sum of (x - mean)^2 in eight lanes (see ops_sum). */
OPS_CLONES static float sum_sq_dev_lanes(const float *restrict x, size_t n, float mean) {
    ops_f32x8 acc = {0};
    ops_f32x8 mv = {mean, mean, mean, mean, mean, mean, mean, mean};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        ops_f32x8 d = OPS_F32X8(x + i) - mv;
        acc += d * d;
    }
    float tail = 0.0f;
    for (; i < n; i++) tail += (x[i] - mean) * (x[i] - mean);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

/* Two passes over each column (mean, then the variance around it: no cancellation), then the
 * tile's rows. */
OPS_CLONES void layernorm_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                                  int32_t col1, int32_t row0, int32_t row1) {
    const float *restrict scale = l->arrays[0], *restrict shift = l->arrays[1];
    size_t c = (size_t)l->c;
    float eps = l->fparams[0];
#if defined(__x86_64__) || defined(_M_X64)
    if (vec_avx512_usable()) { /* ViT's 24 LayerNorms took 1.1 ms a run here, OpenVINO's 0.74 */
        for (int64_t col = col0; col < col1; col++)
            vec_layernorm_avx512(in[0] + (size_t)col * c, out + (size_t)col * c, c, (size_t)row0,
                                 (size_t)row1, scale, shift, eps);
        return;
    }
#endif
    for (int64_t col = col0; col < col1; col++) {
        const float *restrict x = in[0] + (size_t)col * c;
        float *restrict o = out + (size_t)col * c;
        float mean = ops_sum(x, c) / (float)c;
        float var = sum_sq_dev_lanes(x, c, mean) / (float)c;
        float rstd = 1.0f / sqrtf(var + eps);
        for (int64_t r = row0; r < row1; r++) o[r] = (x[r] - mean) * rstd * scale[r] + shift[r];
    }
}

/* ---- ROW_REDUCE ------------------------------------------------------------------------------ */

enum { REDUCE_MAX = 0, REDUCE_MEAN = 1, REDUCE_SUM = 2, REDUCE_MIN = 3 };

coacto_status row_reduce_prepare(layer *l, char *err, size_t err_size) {
    OPS_REQUIRE(l->iparams[0] >= REDUCE_MAX && l->iparams[0] <= REDUCE_MIN,
                "unknown reduction kind %d", l->iparams[0]);
    OPS_REQUIRE(l->c == 1, "ROW_REDUCE gives one row per column, not %d", l->c);
    OPS_REQUIRE(l->in_n[0] == l->n && l->in_h[0] == l->h && l->in_w[0] == l->w,
                "input %dx_x%dx%d (NCHW) and output %dx_x%dx%d differ in columns", l->in_n[0],
                l->in_h[0], l->in_w[0], l->n, l->h, l->w);
    return COACTO_OK;
}

void row_reduce_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                        int32_t col1, int32_t row0, int32_t row1) {
    size_t c = (size_t)l->in_c[0];
    int32_t kind = l->iparams[0];
    (void)row0, (void)row1; /* the one row */
    for (int64_t col = col0; col < col1; col++) {
        const float *x = in[0] + (size_t)col * c;
        float v;
        if (kind == REDUCE_MEAN || kind == REDUCE_SUM) {
            v = ops_sum(x, c);
            if (kind == REDUCE_MEAN) v /= (float)c;
        } else {
            v = x[0];
            for (size_t j = 1; j < c; j++) {
                int take = kind == REDUCE_MAX ? x[j] > v : x[j] < v;
                v = take || x[j] != x[j] ? x[j] : v;
                if (v != v) break; /* NaN wins, as in numpy */
            }
        }
        out[col] = v;
    }
}

/* ---- EMBED ----------------------------------------------------------------------------------- */

coacto_status embed_prepare(layer *l, char *err, size_t err_size) {
    int64_t v = l->iparams[0];
    OPS_REQUIRE(v >= 1 && v <= (1 << 24), "EMBED table of %lld rows (1..2^24: ids are floats)",
                (long long)v);
    int64_t cols = (int64_t)l->n * l->h * l->w;
    OPS_REQUIRE(input_elements(l, 0) == cols,
                "EMBED reads one id per output column: %lld ids for %lld columns",
                (long long)input_elements(l, 0), (long long)cols);
    int64_t bytes = ops_mul(ops_mul(v, l->c), 4);
    OPS_REQUIRE(bytes > 0, "EMBED table is too large");
    return ops_check_array(l, 0, bytes, "table", err, err_size);
}

void embed_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                   int32_t row0, int32_t row1) {
    const float *table = l->arrays[0];
    int64_t v = l->iparams[0], c = l->c;
    size_t bytes = (size_t)(row1 - row0) * sizeof(float);
    for (int64_t col = col0; col < col1; col++) {
        float id = in[0][col];
        float *o = out + col * c + row0;
        /* Ids arrive as floats (also from the network): anything but an integer in [-V, V)
         * selects no row. */
        if (!(id >= -(float)v && id < (float)v) || id != (float)(int64_t)id) {
            memset(o, 0, bytes);
            continue;
        }
        int64_t row = (int64_t)id;
        if (row < 0) row += v;
        memcpy(o, table + row * c + row0, bytes);
    }
}
