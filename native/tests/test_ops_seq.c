/* Tile executors of the sequence-model operators against naive oracles (harness.h): MATMUL in
 * every operand layout, output arrangement, causal form and mask form, with every GEMM kernel the
 * CPU supports; ATTENTION likewise, in every layout of the values; LAYERNORM, ROW_REDUCE, WHERE,
 * EMBED; the comparison / power / max / min kinds of BINARY; GATHER with constant values. A second part checks that op_prepare rejects corrupt
 * parameters of these ops.
 *
 * Usage: test_ops_seq [seed] */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

/* ---- MATMUL ---------------------------------------------------------------------------------- */

/* Operand layouts in their producer's storage. */
enum {
    A_PLAIN = 0, /* (B0, B1, M, K) row-major */
    A_HEADS = 1, /* (B0, M, B1, K): a projection's (B, S, h*dh) read per head */
};
enum {
    B_PLAIN = 0,      /* (B0, B1, K, N): contiguous along j */
    B_KEYS = 1,       /* (B0, N, B1, K): keys of a projection, contiguous along k */
    B_VALUES = 2,     /* (B0, K, B1, N): values of a projection, contiguous along j */
    B_BROADCAST0 = 3, /* (B1, K, N) shared by every b0 */
};
enum { M_NONE = 0, M_PADDING = 1 /* (B0, 1, 1, N) */, M_FULL = 2 /* (B0, B1, M, N) */,
       M_ROW = 3 /* (B0, B1, M, 1): one value per row */ };

typedef struct matmul_case {
    const char *name;
    int b0, b1, m, n, k;
    int a_layout, b_layout, mask, out_mode, causal, offset;
    float scale;
    int extra; /* leading elements before the operands in their producers (offsets) */
} matmul_case;

static void matmul_strides_a(const matmul_case *mc, int32_t *p) {
    int64_t o = mc->extra;
    if (mc->a_layout == A_PLAIN) {
        p[5] = (int32_t)o, p[6] = mc->b1 * mc->m * mc->k, p[7] = mc->m * mc->k, p[8] = mc->k;
    } else {
        p[5] = (int32_t)o, p[6] = mc->m * mc->b1 * mc->k, p[7] = mc->k, p[8] = mc->b1 * mc->k;
    }
}

static void matmul_strides_b(const matmul_case *mc, int32_t *p) {
    int32_t o = mc->extra;
    switch (mc->b_layout) {
    case B_PLAIN:
        p[9] = o, p[10] = mc->b1 * mc->k * mc->n, p[11] = mc->k * mc->n, p[12] = mc->n, p[13] = 1;
        break;
    case B_KEYS:
        p[9] = o, p[10] = mc->n * mc->b1 * mc->k, p[11] = mc->k, p[12] = 1, p[13] = mc->b1 * mc->k;
        break;
    case B_VALUES:
        p[9] = o, p[10] = mc->k * mc->b1 * mc->n, p[11] = mc->n, p[12] = mc->b1 * mc->n, p[13] = 1;
        break;
    default:
        p[9] = o, p[10] = 0, p[11] = mc->k * mc->n, p[12] = mc->n, p[13] = 1;
        break;
    }
}

/* The case's mask (none: an empty tensor), its parameters set in p. */
static tensor matmul_mask(const matmul_case *mc, int32_t *p) {
    int b0 = mc->b0, b1 = mc->b1, m = mc->m, n = mc->n;
    tensor mk_ = {0, 0, 0, 0, NULL};
    if (mc->mask == M_NONE) return mk_;
    int count = mc->mask == M_PADDING ? b0 * n : mc->mask == M_ROW ? b0 * b1 * m : b0 * b1 * m * n;
    mk_ = t_rand(1, mc->extra + count, 1, 1, -2, 0);
    p[17] = 1, p[18] = mc->extra;
    if (mc->mask == M_PADDING) p[19] = n, p[20] = 0, p[21] = 0, p[22] = 1;
    else if (mc->mask == M_ROW) p[19] = b1 * m, p[20] = m, p[21] = 1, p[22] = 0;
    else p[19] = b1 * m * n, p[20] = m * n, p[21] = n, p[22] = 1;
    return mk_;
}

static void test_matmul(const matmul_case *mc, const gemm_kernel *kern) {
    int b0 = mc->b0, b1 = mc->b1, m = mc->m, n = mc->n, k = mc->k;
    int32_t p[32] = {b0, b1, m, n, k};
    matmul_strides_a(mc, p);
    matmul_strides_b(mc, p);
    p[14] = mc->out_mode, p[15] = mc->causal, p[16] = mc->offset;
    int a_size = mc->extra + b0 * b1 * m * k;
    int b_size = mc->extra + (mc->b_layout == B_BROADCAST0 ? 1 : b0) * b1 * k * n;
    tensor a = t_rand(1, a_size, 1, 1, -1, 1), b = t_rand(1, b_size, 1, 1, -1, 1);
    tensor mk_ = matmul_mask(mc, p);
    int cols = mc->out_mode ? b0 * m : b0 * b1 * m, rows = mc->out_mode ? b1 * n : n;
    layer l = mk(COACTO_OP_MATMUL, cols, rows, 1, 1);
    memcpy(l.iparams, p, sizeof p);
    l.fparams[0] = mc->scale;
    l.fparams[1] = -1e4f;
    l.kern = kern;
    set_input(&l, 0, &a);
    set_input(&l, 1, &b);
    if (mc->mask != M_NONE) set_input(&l, 2, &mk_);
    expected e = e_new(&l);
    for (int x0 = 0; x0 < b0; x0++)
        for (int x1 = 0; x1 < b1; x1++)
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double acc = 0, mag = 0;
                    for (int kk = 0; kk < k; kk++) {
                        if (mc->causal == 2 && kk > i + mc->offset) break;
                        double va = a.d[p[5] + x0 * p[6] + x1 * p[7] + i * p[8] + kk];
                        double vb = b.d[p[9] + x0 * p[10] + x1 * p[11] + kk * p[12] + j * p[13]];
                        acc += va * vb;
                        mag += fabs(va * vb);
                    }
                    double v = mc->scale * acc;
                    if (mc->causal == 1 && j > i + mc->offset) v = -1e4, mag = 0;
                    if (mc->mask != M_NONE)
                        v += mk_.d[p[18] + x0 * p[19] + x1 * p[20] + i * p[21] + j * p[22]];
                    size_t col = mc->out_mode ? (size_t)x0 * m + i : ((size_t)x0 * b1 + x1) * m + i;
                    size_t row = mc->out_mode ? (size_t)x1 * n + j : (size_t)j;
                    e.v[col * rows + row] = v;
                    e.mag[col * rows + row] = fabs(mc->scale) * mag;
                }
    char name[160];
    snprintf(name, sizeof name, "matmul %s [%s]", mc->name, kern->name);
    const float *in[3] = {a.d, b.d, mk_.d};
    check_tiles(name, &l, in, &e, 2e-6, 1);
    e_free(&e);
    free(a.d), free(b.d), free(mk_.d);
}

static void matmul_cases(void) {
    static const matmul_case cases[] = {
        {"plain", 2, 3, 7, 13, 9, A_PLAIN, B_PLAIN, M_NONE, 0, 0, 0, 1.0f, 0},
        {"scores: heads x keys, scaled", 2, 3, 11, 11, 8, A_HEADS, B_KEYS, M_NONE, 0, 0, 0, 0.35f, 0},
        {"scores + padding mask", 1, 4, 9, 9, 16, A_HEADS, B_KEYS, M_PADDING, 0, 0, 0, 0.25f, 5},
        {"context: heads merged", 2, 3, 10, 8, 10, A_PLAIN, B_VALUES, M_NONE, 1, 0, 0, 1.0f, 3},
        {"causal scores", 1, 2, 37, 37, 8, A_HEADS, B_KEYS, M_NONE, 0, 1, 0, 0.5f, 0},
        {"causal scores offset 3 + mask", 2, 2, 9, 12, 5, A_HEADS, B_KEYS, M_PADDING, 0, 1, 3,
         1.0f, 0},
        {"causal scores negative offset, full mask", 1, 2, 12, 12, 7, A_PLAIN, B_KEYS, M_FULL, 0,
         1, -2, 1.0f, 0},
        {"causal context", 1, 3, 29, 8, 29, A_PLAIN, B_VALUES, M_NONE, 1, 2, 0, 1.0f, 0},
        {"causal context offset -3", 2, 1, 11, 6, 11, A_PLAIN, B_VALUES, M_NONE, 0, 2, -3, 1.0f, 1},
        {"row mask", 1, 2, 6, 10, 4, A_PLAIN, B_PLAIN, M_ROW, 0, 0, 0, 1.0f, 0},
        {"causal + row mask", 1, 2, 6, 10, 4, A_PLAIN, B_PLAIN, M_ROW, 0, 1, 1, 1.0f, 0},
        {"broadcast batch", 3, 2, 5, 19, 6, A_PLAIN, B_BROADCAST0, M_NONE, 0, 0, 0, 1.0f, 0},
        {"deep k (blocked)", 1, 1, 20, 35, 300, A_PLAIN, B_PLAIN, M_NONE, 0, 0, 0, 1.0f, 0},
        {"deep k transposed", 1, 1, 9, 40, 270, A_PLAIN, B_KEYS, M_NONE, 0, 0, 0, 1.0f, 0},
        {"wide n (blocked)", 1, 1, 5, 1100, 3, A_PLAIN, B_PLAIN, M_NONE, 0, 0, 0, 1.0f, 0},
        {"vectors", 2, 1, 1, 1, 7, A_PLAIN, B_PLAIN, M_NONE, 0, 0, 0, 1.0f, 0},
    };
    for (const gemm_kernel *const *k = gemm_available(); *k; k++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_matmul(&cases[i], *k);
}

/* ---- ATTENTION ------------------------------------------------------------------------------- */

/* Values in their producer's storage. */
enum {
    V_PLAIN = 0, /* (B0, B1, N, DV): contiguous along d */
    V_HEADS = 1, /* (B0, N, B1, DV): a projection's (B, S, h*dv) read per head */
    V_KEYS = 2,  /* (B0, B1, DV, N): contiguous along the keys */
    V_BROADCAST0 = 3, /* (B1, N, DV) shared by every b0 */
};

typedef struct attention_case {
    matmul_case s; /* the scores: n keys of depth k; out_mode for the context */
    int dv, v_layout;
} attention_case;

static void test_attention(const attention_case *ac, const gemm_kernel *kern) {
    const matmul_case *mc = &ac->s;
    int b0 = mc->b0, b1 = mc->b1, m = mc->m, n = mc->n, k = mc->k, dv = ac->dv;
    int32_t p[32] = {b0, b1, m, n, k};
    matmul_strides_a(mc, p);
    matmul_strides_b(mc, p);
    p[14] = mc->out_mode, p[15] = mc->causal, p[16] = mc->offset;
    int32_t *v = p + 23, o = mc->extra;
    v[0] = dv;
    switch (ac->v_layout) {
    case V_PLAIN: v[1] = o, v[2] = b1 * n * dv, v[3] = n * dv, v[4] = dv, v[5] = 1; break;
    case V_HEADS: v[1] = o, v[2] = n * b1 * dv, v[3] = dv, v[4] = b1 * dv, v[5] = 1; break;
    case V_KEYS: v[1] = o, v[2] = b1 * dv * n, v[3] = dv * n, v[4] = 1, v[5] = n; break;
    default: v[1] = o, v[2] = 0, v[3] = n * dv, v[4] = dv, v[5] = 1; break;
    }
    int a_size = o + b0 * b1 * m * k;
    int b_size = o + (mc->b_layout == B_BROADCAST0 ? 1 : b0) * b1 * k * n;
    int v_size = o + (ac->v_layout == V_BROADCAST0 ? 1 : b0) * b1 * n * dv;
    tensor a = t_rand(1, a_size, 1, 1, -1, 1), b = t_rand(1, b_size, 1, 1, -1, 1);
    tensor vt = t_rand(1, v_size, 1, 1, -1, 1);
    tensor mk_ = matmul_mask(mc, p);
    int cols = mc->out_mode ? b0 * m : b0 * b1 * m, rows = mc->out_mode ? b1 * dv : dv;
    layer l = mk(COACTO_OP_ATTENTION, cols, rows, 1, 1);
    memcpy(l.iparams, p, sizeof p);
    l.fparams[0] = mc->scale;
    l.kern = kern;
    set_input(&l, 0, &a);
    set_input(&l, 1, &b);
    set_input(&l, 2, &vt);
    if (mc->mask != M_NONE) set_input(&l, 3, &mk_);
    expected e = e_new(&l);
    double *sc = malloc(sizeof(double) * (size_t)n * 2), *err = sc + n;
    for (int x0 = 0; x0 < b0; x0++)
        for (int x1 = 0; x1 < b1; x1++)
            for (int i = 0; i < m; i++) {
                int keep = mc->causal && i + mc->offset + 1 < n ? i + mc->offset + 1 : n;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < keep; j++) {
                    double acc = 0, mag = 0;
                    for (int kk = 0; kk < k; kk++) {
                        double va = a.d[p[5] + x0 * p[6] + x1 * p[7] + i * p[8] + kk];
                        double vb = b.d[p[9] + x0 * p[10] + x1 * p[11] + kk * p[12] + j * p[13]];
                        acc += va * vb;
                        mag += fabs(va * vb);
                    }
                    sc[j] = mc->scale * acc;
                    if (mc->mask != M_NONE)
                        sc[j] += mk_.d[p[18] + x0 * p[19] + x1 * p[20] + i * p[21] + j * p[22]];
                    err[j] = 1.0 + fabs(mc->scale) * mag; /* the score's rounding, in units */
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < keep; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < dv; d++) {
                    double y = 0, mag = 0;
                    for (int j = 0; j < keep; j++) {
                        double vv = vt.d[v[1] + x0 * v[2] + x1 * v[3] + j * v[4] + d * v[5]];
                        y += sc[j] / sum * vv;
                        mag += sc[j] / sum * fabs(vv) * err[j];
                    }
                    size_t col = mc->out_mode ? (size_t)x0 * m + i : ((size_t)x0 * b1 + x1) * m + i;
                    size_t row = mc->out_mode ? (size_t)x1 * dv + d : (size_t)d;
                    e.v[col * rows + row] = y;
                    e.mag[col * rows + row] = mag;
                }
            }
    free(sc);
    char name[160];
    snprintf(name, sizeof name, "attention %s [%s]", mc->name, kern->name);
    const float *in[4] = {a.d, b.d, vt.d, mk_.d};
    check_tiles(name, &l, in, &e, 2e-6, 1);
    e_free(&e);
    free(a.d), free(b.d), free(vt.d), free(mk_.d);
}

static void attention_cases(void) {
    static const attention_case cases[] = {
        {{"vit: heads merged, scaled", 1, 3, 11, 11, 8, A_HEADS, B_KEYS, M_NONE, 1, 0, 0, 0.35f,
          0}, 8, V_HEADS},
        {{"plain, heads apart", 2, 2, 7, 13, 9, A_PLAIN, B_PLAIN, M_NONE, 0, 0, 0, 1.0f, 2}, 5,
         V_PLAIN},
        {{"padding mask", 1, 4, 9, 9, 16, A_HEADS, B_KEYS, M_PADDING, 1, 0, 0, 0.25f, 5}, 16,
         V_HEADS},
        {{"causal", 1, 2, 37, 37, 8, A_HEADS, B_KEYS, M_NONE, 1, 1, 0, 0.5f, 0}, 8, V_HEADS},
        {{"causal offset 3 + mask", 2, 2, 9, 12, 5, A_HEADS, B_KEYS, M_PADDING, 0, 1, 3, 1.0f, 0},
         6, V_PLAIN},
        {{"causal + row mask", 1, 2, 6, 10, 4, A_PLAIN, B_PLAIN, M_ROW, 1, 1, 1, 1.0f, 0}, 3,
         V_PLAIN},
        {{"full mask, values along keys", 1, 2, 20, 35, 16, A_PLAIN, B_KEYS, M_FULL, 0, 0, 0,
          0.3f, 1}, 40, V_KEYS},
        {{"many keys", 1, 1, 20, 300, 64, A_PLAIN, B_KEYS, M_NONE, 1, 0, 0, 0.125f, 0}, 64,
         V_PLAIN},
        {{"broadcast batch", 3, 2, 5, 19, 6, A_PLAIN, B_BROADCAST0, M_NONE, 0, 0, 0, 1.0f, 0}, 4,
         V_BROADCAST0},
        {{"one query, one key", 2, 1, 1, 1, 7, A_PLAIN, B_PLAIN, M_NONE, 0, 0, 0, 1.0f, 0}, 3,
         V_PLAIN},
        /* several row blocks of queries, each keeping fewer keys than the block's last one
         * (the values' product over part of the packed keys) */
        {{"causal, many queries", 1, 1, 200, 200, 16, A_PLAIN, B_KEYS, M_NONE, 0, 1, 0, 0.25f,
          0}, 16, V_PLAIN},
        {{"causal offset 20, fewer queries than keys, full mask", 1, 1, 150, 170, 8, A_PLAIN,
          B_KEYS, M_FULL, 1, 1, 20, 0.5f, 2}, 33, V_KEYS},
        {{"causal offset 9, padding mask, wide values", 1, 2, 60, 69, 8, A_HEADS, B_KEYS,
          M_PADDING, 1, 1, 9, 0.5f, 0}, 70, V_HEADS},
    };
    for (const gemm_kernel *const *k = gemm_available(); *k; k++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention(&cases[i], *k);
}

/* ---- LAYERNORM / ROW_REDUCE ------------------------------------------------------------------ */

static void norm_cases(void) {
    static const int widths[] = {1, 7, 64, 77, 768};
    for (size_t s = 0; s < sizeof widths / sizeof widths[0]; s++) {
        int c = widths[s];
        /* Values far from zero: the variance must not come from E[x^2] - E[x]^2. */
        tensor x = t_rand(2, c, 1, 5, 99, 101);
        float *sc = malloc(sizeof(float) * (size_t)c), *sh = malloc(sizeof(float) * (size_t)c);
        for (int i = 0; i < c; i++) sc[i] = frand(0.5f, 1.5f), sh[i] = frand(-1, 1);
        layer l = mk(COACTO_OP_LAYERNORM, 2, c, 1, 5);
        set_input(&l, 0, &x);
        l.fparams[0] = 1e-5f;
        void *sb = blob_copy(sc, sizeof(float) * (size_t)c), *tb = blob_copy(sh, sizeof(float) * (size_t)c);
        set_array(&l, 0, sb, sizeof(float) * (size_t)c);
        set_array(&l, 1, tb, sizeof(float) * (size_t)c);
        expected e = e_new(&l);
        for (int col = 0; col < 10; col++) {
            double mean = 0, var = 0;
            for (int r = 0; r < c; r++) mean += x.d[col * c + r];
            mean /= c;
            for (int r = 0; r < c; r++) var += (x.d[col * c + r] - mean) * (x.d[col * c + r] - mean);
            var /= c;
            for (int r = 0; r < c; r++) {
                e.v[col * c + r] = (x.d[col * c + r] - mean) / sqrt(var + 1e-5) * sc[r] + sh[r];
                e.mag[col * c + r] = 4;
            }
        }
        char name[64];
        snprintf(name, sizeof name, "layernorm c=%d", c);
        const float *in[1] = {x.d};
        check_tiles(name, &l, in, &e, 2e-5, 1);
        e_free(&e);
        free(x.d), free(sc), free(sh), free(sb), free(tb);
    }
    for (int kind = 0; kind < 4; kind++) {
        tensor x = t_rand(2, 45, 3, 2, -3, 3);
        layer l = mk(COACTO_OP_ROW_REDUCE, 2, 1, 3, 2);
        set_input(&l, 0, &x);
        l.iparams[0] = kind;
        expected e = e_new(&l);
        for (int col = 0; col < 12; col++) {
            double v = kind == 0 ? -INFINITY : kind == 3 ? INFINITY : 0;
            for (int r = 0; r < 45; r++) {
                double xv = x.d[col * 45 + r];
                v = kind == 0 ? fmax(v, xv) : kind == 3 ? fmin(v, xv) : v + xv;
            }
            e.v[col] = kind == 1 ? v / 45 : v;
            e.mag[col] = 45 * 3;
        }
        char name[64];
        snprintf(name, sizeof name, "row reduce kind %d", kind);
        const float *in[1] = {x.d};
        check_tiles(name, &l, in, &e, 1e-6, 1);
        e_free(&e);
        free(x.d);
    }
}

/* ---- WHERE / BINARY kinds / GATHER constants / EMBED ----------------------------------------- */

static double bcast_at(const tensor *t, int ni, int ci, int y, int x) {
    return t_at(t, t->n > 1 ? ni : 0, t->c > 1 ? ci : 0, t->h > 1 ? y : 0, t->w > 1 ? x : 0);
}

/* NCHW copy of an NHWC tensor (constants are given NCHW). */
static float *nchw_of(const tensor *t) {
    float *k = malloc(t_size(t) * sizeof(float));
    for (int ni = 0; ni < t->n; ni++)
        for (int ci = 0; ci < t->c; ci++)
            for (int y = 0; y < t->h; y++)
                for (int x = 0; x < t->w; x++)
                    k[((ni * t->c + ci) * t->h + y) * t->w + x] = t_at(t, ni, ci, y, x);
    return k;
}

static void where_cases(void) {
    /* Output 2x6x3x4; operand shapes broadcast differently. */
    int dims[3][4] = {{2, 1, 3, 4}, {1, 6, 1, 4}, {2, 6, 3, 4}};
    for (int which = 1; which <= 7; which++) {
        tensor t[3];
        for (int o = 0; o < 3; o++) {
            t[o] = t_rand(dims[o][0], dims[o][1], dims[o][2], dims[o][3], -1, 1);
            if (o == 0)
                for (size_t i = 0; i < t_size(&t[0]); i++) t[0].d[i] = rnd() % 2 ? 1.0f : 0.0f;
        }
        layer l = mk(COACTO_OP_WHERE, 2, 6, 3, 4);
        l.iparams[0] = which;
        const float *in[3] = {NULL, NULL, NULL};
        void *blobs[3] = {NULL, NULL, NULL};
        for (int o = 0, next = 0; o < 3; o++) {
            if (which >> o & 1) {
                in[next] = t[o].d;
                set_input(&l, next++, &t[o]);
            } else {
                float *k = nchw_of(&t[o]);
                blobs[o] = blob_copy(k, t_size(&t[o]) * 4);
                free(k);
                set_array(&l, o, blobs[o], t_size(&t[o]) * 4);
                memcpy(&l.iparams[4 + 4 * o], dims[o], sizeof dims[o]);
            }
        }
        expected e = e_new(&l);
        for (int ni = 0; ni < 2; ni++)
            for (int ci = 0; ci < 6; ci++)
                for (int y = 0; y < 3; y++)
                    for (int x = 0; x < 4; x++)
                        e.v[idx(6, 3, 4, ni, ci, y, x)] = bcast_at(&t[0], ni, ci, y, x) != 0
                                                              ? bcast_at(&t[1], ni, ci, y, x)
                                                              : bcast_at(&t[2], ni, ci, y, x);
        char name[64];
        snprintf(name, sizeof name, "where operands %d", which);
        check_tiles(name, &l, in, &e, 0, 1);
        e_free(&e);
        for (int o = 0; o < 3; o++) free(t[o].d), free(blobs[o]);
    }
}

static double bin_ref(int kind, double a, double b) {
    switch (kind) {
    case 4: return a == b;
    case 5: return a < b;
    case 6: return a > b;
    case 7: return pow(a, b);
    case 8: return fmax(a, b);
    default: return fmin(a, b);
    }
}

static void binary_kind_cases(void) {
    for (int kind = 4; kind <= 9; kind++)
        for (int constant = 0; constant < 2; constant++) {
            tensor a = t_rand(2, 9, 2, 3, 0.5f, 2), b = t_rand(1, 9, 1, 3, -2, 2);
            /* Some equal pairs, so the comparisons give both answers. */
            for (int ni = 0; ni < 2; ni++)
                for (int ci = 0; ci < 9; ci++)
                    for (int y = 0; y < 2; y++)
                        for (int x = 0; x < 3; x++)
                            if ((ci + x + y) % 3 == 0)
                                a.d[idx(9, 2, 3, ni, ci, y, x)] = (float)bcast_at(&b, ni, ci, y, x);
            if (kind == 7) /* powers of positive bases */
                for (size_t i = 0; i < t_size(&a); i++) a.d[i] = fabsf(a.d[i]) + 0.5f;
            layer l = mk(COACTO_OP_BINARY, 2, 9, 2, 3);
            l.iparams[0] = kind;
            set_input(&l, 0, &a);
            void *kb = NULL;
            if (constant) {
                int32_t kd[4] = {1, 9, 1, 3};
                memcpy(&l.iparams[4], kd, sizeof kd);
                float *k = nchw_of(&b);
                kb = blob_copy(k, t_size(&b) * 4);
                free(k);
                set_array(&l, 0, kb, t_size(&b) * 4);
            } else {
                set_input(&l, 1, &b);
            }
            expected e = e_new(&l);
            for (int ni = 0; ni < 2; ni++)
                for (int ci = 0; ci < 9; ci++)
                    for (int y = 0; y < 2; y++)
                        for (int x = 0; x < 3; x++) {
                            size_t i = idx(9, 2, 3, ni, ci, y, x);
                            e.v[i] = bin_ref(kind, t_at(&a, ni, ci, y, x), bcast_at(&b, ni, ci, y, x));
                            e.mag[i] = 1;
                        }
            char name[64];
            snprintf(name, sizeof name, "binary kind %d%s", kind, constant ? " constant" : "");
            const float *in[2] = {a.d, b.d};
            check_tiles(name, &l, in, &e, 2e-6, 1);
            e_free(&e);
            free(a.d), free(b.d), free(kb);
        }
}

static void gather_constant_cases(void) {
    tensor x = t_rand(1, 4, 2, 3, -1, 1);
    float consts[5] = {10, 11, 12, 13, 14};
    layer l = mk(COACTO_OP_GATHER, 1, 6, 3, 2);
    set_input(&l, 0, &x);
    size_t count = 36;
    int32_t index[36];
    for (size_t i = 0; i < count; i++) index[i] = (int32_t)(rnd() % 30) - 1; /* -1 .. 28 */
    void *ib = blob_copy(index, sizeof index), *cb = blob_copy(consts, sizeof consts);
    set_array(&l, 0, ib, sizeof index);
    set_array(&l, 1, cb, sizeof consts);
    l.fparams[0] = -3.0f;
    expected e = e_new(&l);
    for (size_t i = 0; i < count; i++)
        e.v[i] = index[i] < 0 ? -3.0 : index[i] < 24 ? x.d[index[i]] : consts[index[i] - 24];
    const float *in[1] = {x.d};
    check_tiles("gather with constants", &l, in, &e, 0, 1);
    e_free(&e);
    free(x.d), free(ib), free(cb);
}

static void embed_cases(void) {
    int v = 11, c = 19, cols = 12;
    float *table = malloc(sizeof(float) * (size_t)(v * c));
    for (int i = 0; i < v * c; i++) table[i] = frand(-1, 1);
    /* ids as (2, 6): valid, negative, out of range, fractional, NaN */
    float ids[12] = {0, 10, -1, -11, 11, -12, 3.5f, 5, NAN, 7, 2, 1e9f};
    tensor t = {2, 6, 1, 1, ids};
    layer l = mk(COACTO_OP_EMBED, 2, c, 1, 6);
    set_input(&l, 0, &t);
    l.iparams[0] = v;
    void *tb = blob_copy(table, sizeof(float) * (size_t)(v * c));
    set_array(&l, 0, tb, sizeof(float) * (size_t)(v * c));
    expected e = e_new(&l);
    for (int col = 0; col < cols; col++) {
        float id = ids[col];
        int ok = id >= -v && id < v && id == floorf(id);
        int row = ok ? (int)id + (id < 0 ? v : 0) : -1;
        for (int r = 0; r < c; r++) e.v[col * c + r] = ok ? table[row * c + r] : 0.0;
    }
    const float *in[1] = {ids};
    check_tiles("embed", &l, in, &e, 0, 1);
    e_free(&e);
    free(table), free(tb);
}

/* ---- op_prepare rejections ------------------------------------------------------------------- */

static float zeros[8192] __attribute__((aligned(64)));

static void expect(const char *name, layer l, int accept) {
    char err[256] = {0};
    coacto_status st = op_prepare(&l, err, sizeof err);
    op_release(&l);
    int ok = accept ? st == COACTO_OK : st == COACTO_ERR_INVALID_GRAPH && err[0];
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "%s %s: status %d, message '%s'\n", accept ? "accept" : "reject", name, st,
                err);
    }
}

static void rejections(void) {
    /* Scores of (1, 2 heads, 4 queries, 4 keys, 8 dims) from a (1, 4, 16) projection. */
    tensor q = {1, 16, 1, 4, NULL}, msk = {1, 4, 1, 1, NULL};
    layer mm = mk(COACTO_OP_MATMUL, 1, 4, 2, 4);
    set_input(&mm, 0, &q);
    set_input(&mm, 1, &q);
    int32_t p[23] = {1, 2, 4, 4, 8, 0, 64, 8, 16, 0, 64, 8, 1, 16, 0, 0, 0, 0};
    memcpy(mm.iparams, p, sizeof p);
    mm.fparams[0] = 1.0f;
    expect("matmul baseline", mm, 1);
    layer t;
#define MUTATE(name, stmt) \
    do {                   \
        t = mm;            \
        stmt;              \
        expect(name, t, 0); \
    } while (0)
    MUTATE("matmul k 0", t.iparams[4] = 0);
    MUTATE("matmul reads past A", t.iparams[8] = 17);
    MUTATE("matmul A offset past the end", t.iparams[5] = 1);
    MUTATE("matmul reads past B", t.iparams[13] = 17);
    MUTATE("matmul B not contiguous", (t.iparams[12] = 2, t.iparams[13] = 16));
    MUTATE("matmul negative stride", t.iparams[7] = -8);
    MUTATE("matmul output rows", t.c = 5);
    MUTATE("matmul output columns", t.w = 3);
    MUTATE("matmul out_mode 2", t.iparams[14] = 2);
    MUTATE("matmul causal 3", t.iparams[15] = 3);
    MUTATE("matmul mask flag without input", t.iparams[17] = 1);
    MUTATE("matmul one input", t.n_inputs = 1);
    MUTATE("matmul huge dims", (t.iparams[0] = INT32_MAX, t.iparams[6] = INT32_MAX));
    MUTATE("matmul array", set_array(&t, 0, zeros, 64));
    t = mm, t.iparams[14] = 1, t.c = 8, t.h = 1, expect("matmul heads merged", t, 1);
    t = mm, set_input(&t, 2, &msk), t.iparams[17] = 1, t.iparams[22] = 1;
    expect("matmul padding mask", t, 1);
    t.iparams[22] = 2, expect("matmul mask stride 2", t, 0);
    t.iparams[22] = 1, t.iparams[18] = 1, expect("matmul reads past the mask", t, 0);

    /* The same heads' attention, the projection as queries, keys and values: (1, 2, 4, 8). */
    layer at = mk(COACTO_OP_ATTENTION, 1, 8, 2, 4);
    set_input(&at, 0, &q);
    set_input(&at, 1, &q);
    set_input(&at, 2, &q);
    int32_t pa[29] = {1, 2, 4, 4, 8, 0, 64, 8, 16, 0, 64, 8, 1, 16, 0, 0, 0, 0,
                      0, 0, 0, 0, 0, 8, 0, 64, 8, 16, 1};
    memcpy(at.iparams, pa, sizeof pa);
    at.fparams[0] = 1.0f;
    expect("attention baseline", at, 1);
    mm = at;
    MUTATE("attention dv 0", t.iparams[23] = 0);
    MUTATE("attention reads past the values", t.iparams[27] = 17);
    MUTATE("attention values offset past the end", t.iparams[24] = 1);
    MUTATE("attention values not contiguous", (t.iparams[27] = 2, t.iparams[28] = 16));
    MUTATE("attention negative value stride", t.iparams[26] = -8);
    MUTATE("attention reads past the keys", t.iparams[13] = 17);
    MUTATE("attention output rows", t.c = 4);
    MUTATE("attention causal 2", t.iparams[15] = 2);
    MUTATE("attention causal, negative offset", (t.iparams[15] = 1, t.iparams[16] = -1));
    MUTATE("attention two inputs", t.n_inputs = 2);
    MUTATE("attention mask flag without input", t.iparams[17] = 1);
    MUTATE("attention huge keys", (t.iparams[3] = INT32_MAX / 2, t.iparams[12] = 0,
                                   t.iparams[13] = 0, t.iparams[27] = 0));
    t = at, t.iparams[15] = 1, t.iparams[16] = 2, expect("attention causal", t, 1);
    t = at, t.iparams[14] = 1, t.c = 16, t.h = 1, expect("attention heads merged", t, 1);
    t = at, set_input(&t, 3, &msk), t.iparams[17] = 1, t.iparams[22] = 1;
    expect("attention padding mask", t, 1);
    t.iparams[18] = 1, expect("attention reads past the mask", t, 0);
#undef MUTATE

    tensor x = {2, 8, 3, 3, NULL};
    layer ln = mk(COACTO_OP_LAYERNORM, 2, 8, 3, 3);
    set_input(&ln, 0, &x);
    set_array(&ln, 0, zeros, 32);
    set_array(&ln, 1, zeros, 32);
    ln.fparams[0] = 1e-5f;
    expect("layernorm baseline", ln, 1);
    t = ln, t.array_bytes[0] = 28, expect("layernorm scale bytes", t, 0);
    t = ln, set_array(&t, 1, NULL, 0), expect("layernorm shift missing", t, 0);
    t = ln, t.fparams[0] = NAN, expect("layernorm eps nan", t, 0);
    t = ln, t.in_c[0] = 9, expect("layernorm dims", t, 0);

    layer rr = mk(COACTO_OP_ROW_REDUCE, 2, 1, 3, 3);
    set_input(&rr, 0, &x);
    expect("row reduce baseline", rr, 1);
    t = rr, t.iparams[0] = 4, expect("row reduce kind", t, 0);
    t = rr, t.c = 2, expect("row reduce rows", t, 0);
    t = rr, t.h = 1, expect("row reduce columns", t, 0);

    layer wh = mk(COACTO_OP_WHERE, 2, 8, 3, 3);
    set_input(&wh, 0, &x);
    wh.iparams[0] = 1;
    int32_t kd[4] = {1, 8, 1, 1};
    memcpy(&wh.iparams[8], kd, sizeof kd);
    memcpy(&wh.iparams[12], kd, sizeof kd);
    set_array(&wh, 1, zeros, 32);
    set_array(&wh, 2, zeros, 32);
    expect("where baseline", wh, 1);
    t = wh, t.iparams[0] = 0, expect("where no input", t, 0);
    t = wh, t.iparams[0] = 3, expect("where mask names two inputs", t, 0);
    t = wh, t.array_bytes[2] = 28, expect("where constant bytes", t, 0);
    t = wh, t.iparams[13] = 3, expect("where constant dims", t, 0);
    t = wh, set_array(&t, 0, zeros, 32), expect("where constant for an input", t, 0);

    tensor ids = {1, 6, 1, 1, NULL};
    layer em = mk(COACTO_OP_EMBED, 1, 4, 1, 6);
    set_input(&em, 0, &ids);
    em.iparams[0] = 10;
    set_array(&em, 0, zeros, 10 * 4 * 4);
    expect("embed baseline", em, 1);
    t = em, t.iparams[0] = 0, expect("embed no rows", t, 0);
    t = em, t.array_bytes[0] -= 4, expect("embed table bytes", t, 0);
    t = em, t.w = 5, expect("embed ids for other columns", t, 0);
    t = em, t.iparams[0] = (1 << 24) + 1, expect("embed table beyond float ids", t, 0);

    layer ga = mk(COACTO_OP_GATHER, 1, 4, 1, 1);
    tensor g = {1, 2, 1, 1, NULL};
    set_input(&ga, 0, &g);
    static int32_t gi[4] __attribute__((aligned(64))) = {0, 1, 2, 3};
    set_array(&ga, 0, gi, sizeof gi);
    set_array(&ga, 1, zeros, 8);
    expect("gather constants baseline", ga, 1);
    t = ga, t.array_bytes[1] = 4, expect("gather index past the constants", t, 0);
    t = ga, t.array_bytes[1] = 6, expect("gather constants not whole floats", t, 0);
}

int main(int argc, char **argv) {
    if (argc > 1) rng = strtoull(argv[1], NULL, 0) | 1;
    printf("gemm kernel: %s\n", gemm_select()->name);
    matmul_cases();
    attention_cases();
    norm_cases();
    where_cases();
    binary_kind_cases();
    gather_constant_cases();
    embed_cases();
    rejections();
    printf("ops_seq: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
