/* The tile harness shared by the executor tests (test_ops.c, test_ops_seq.c): random tensors in
 * NHWC storage, expected outputs computed in double, and check_tiles, which runs a prepared layer
 * as tiles of three tilings (one tile; random column x row cuts; column cuts x row cuts at GEMM
 * panel boundaries), each tile on a sentinel-filled buffer (its rectangle must match, nothing
 * outside it may change), then the random tiling on three threads into one shared buffer. Scratch
 * is allocated at exactly the declared size so the sanitizers see any overrun. */
#ifndef COACTO_TEST_HARNESS_H
#define COACTO_TEST_HARNESS_H
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ops_internal.h"

static int passed, failed;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static inline uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static inline int irand(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }
static inline float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f; }

/* ---- tensors (NHWC storage) ------------------------------------------------------------------ */

typedef struct tensor {
    int n, c, h, w;
    float *d;
} tensor;

static inline tensor t_rand(int n, int c, int h, int w, float lo, float hi) {
    tensor t = {n, c, h, w, malloc(sizeof(float) * (size_t)n * c * h * w)};
    for (size_t i = 0; i < (size_t)n * c * h * w; i++) t.d[i] = frand(lo, hi);
    return t;
}
static inline size_t t_size(const tensor *t) { return (size_t)t->n * t->c * t->h * t->w; }
static inline size_t idx(int c, int h, int w, int ni, int ci, int y, int x) {
    return (((size_t)ni * h + y) * w + x) * c + ci;
}
static inline float t_at(const tensor *t, int ni, int ci, int y, int x) {
    return t->d[idx(t->c, t->h, t->w, ni, ci, y, x)];
}

/* Expected output: values and magnitudes (sum of |terms|, scales the tolerance), NHWC order. */
typedef struct expected {
    double *v, *mag;
} expected;

static inline expected e_new(const layer *l) {
    size_t n = (size_t)l->n * l->c * l->h * l->w;
    expected e = {calloc(n, sizeof(double)), calloc(n, sizeof(double))};
    return e;
}
static inline void e_free(expected *e) {
    free(e->v);
    free(e->mag);
}

static inline layer mk(int op, int n, int c, int h, int w) {
    layer l;
    memset(&l, 0, sizeof l);
    l.op = op;
    l.n = n;
    l.c = c;
    l.h = h;
    l.w = w;
    return l;
}
static inline void set_input(layer *l, int i, const tensor *t) {
    l->in_n[i] = t->n;
    l->in_c[i] = t->c;
    l->in_h[i] = t->h;
    l->in_w[i] = t->w;
    if (l->n_inputs < i + 1) l->n_inputs = i + 1;
}
static inline void set_array(layer *l, int i, const void *p, size_t bytes) {
    l->arrays[i] = p;
    l->array_bytes[i] = (int64_t)bytes;
}

/* 64-byte aligned copy of an array, as the graph's blob holds it. */
static inline void *blob_copy(const void *p, size_t bytes) {
    void *q = NULL;
    if (posix_memalign(&q, 64, bytes ? bytes : 64)) abort();
    memcpy(q, p, bytes);
    return q;
}

static inline double act_ref(double v, int act, double alpha, double beta) {
    switch (act) {
    case COACTO_ACT_RELU: return v < 0 ? 0 : v;
    case COACTO_ACT_CLIP: return fmin(fmax(v, alpha), beta);
    case COACTO_ACT_LEAKY: return v < 0 ? alpha * v : v;
    case COACTO_ACT_SIGMOID: return 1.0 / (1.0 + exp(-v));
    case COACTO_ACT_HARDSIGMOID: return fmax(0.0, fmin(1.0, alpha * v + beta));
    case COACTO_ACT_HARDSWISH: return v * fmax(0.0, fmin(1.0, v / 6.0 + 0.5));
    case COACTO_ACT_TANH: return tanh(v);
    case COACTO_ACT_SQRT: return sqrt(v);
    case COACTO_ACT_ERF: return erf(v);
    case COACTO_ACT_GELU: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case COACTO_ACT_GELU_TANH:
        return 0.5 * v * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
    case COACTO_ACT_RECIPROCAL: return 1.0 / v;
    case COACTO_ACT_EXP: return exp(v);
    case COACTO_ACT_ISNAN: return v != v ? 1.0 : 0.0;
    case COACTO_ACT_ELU: return v > 0 ? v : alpha * expm1(v);
    case COACTO_ACT_SELU: return beta * (v > 0 ? v : alpha * expm1(v));
    case COACTO_ACT_CELU: return v > 0 ? v : alpha * expm1(v / alpha);
    case COACTO_ACT_SOFTPLUS: return v > 0 ? v + log1p(exp(-v)) : log1p(exp(v));
    case COACTO_ACT_SOFTSIGN: return v / (1.0 + fabs(v));
    case COACTO_ACT_THRESHOLDED_RELU: return v > alpha ? v : 0.0;
    case COACTO_ACT_ABS: return fabs(v);
    case COACTO_ACT_FLOOR: return floor(v);
    case COACTO_ACT_CEIL: return ceil(v);
    case COACTO_ACT_ROUND: return nearbyint(v); /* the default mode: halves to even */
    case COACTO_ACT_SIGN: return v > 0 ? 1.0 : v < 0 ? -1.0 : v;
    case COACTO_ACT_LOG: return log(v);
    default: return v;
    }
}

/* ---- the tile harness ------------------------------------------------------------------------ */

#define SENTINEL 0x7fc0dead

static inline int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Cuts of [0, total): 0 = c[0] < c[1] < ... < c[k] = total. step > 0 puts inner cuts on its
 * multiples. Returns k. */
static inline int cuts(int total, int max_tiles, int step, int *c) {
    int k = 1;
    c[0] = 0;
    int want = irand(1, max_tiles);
    int inner[64], m = 0;
    for (int i = 1; i < want && m < 62; i++) {
        int v = step > 0 ? step * irand(1, (total - 1) / step > 0 ? (total - 1) / step : 1)
                         : irand(1, total - 1 > 1 ? total - 1 : 1);
        if (v > 0 && v < total) inner[m++] = v;
    }
    qsort(inner, (size_t)m, sizeof(int), cmp_int);
    for (int i = 0; i < m; i++)
        if (inner[i] != c[k - 1]) c[k++] = inner[i];
    c[k] = total;
    return k;
}

/* Runs one tile on a sentinel-filled buffer and compares; returns the number of mismatches. */
static inline int run_tile(const char *name, const layer *l, const float *const *in, const expected *e,
                    double rtol, int col0, int col1, int row0, int row1) {
    size_t total = (size_t)l->n * l->c * l->h * l->w;
    float *out = malloc(total * sizeof(float));
    uint32_t s = SENTINEL;
    for (size_t i = 0; i < total; i++) memcpy(&out[i], &s, 4);
    size_t need = l->scratch_fixed + l->scratch_per_col * (size_t)(col1 - col0);
    float *scratch = NULL;
    if (need && posix_memalign((void **)&scratch, 64, need * sizeof(float))) abort();
    op_execute(l, in, out, col0, col1, row0, row1, scratch);
    int bad = 0;
    for (size_t i = 0; i < total && bad < 5; i++) {
        int64_t col = (int64_t)(i / (size_t)l->c), row = (int64_t)(i % (size_t)l->c);
        int inside = col >= col0 && col < col1 && row >= row0 && row < row1;
        uint32_t bits;
        memcpy(&bits, &out[i], 4);
        if (!inside) {
            if (bits != SENTINEL) {
                fprintf(stderr, "%s: tile [%d,%d)x[%d,%d) wrote column %lld row %lld outside\n",
                        name, col0, col1, row0, row1, (long long)col, (long long)row);
                bad++;
            }
            continue;
        }
        double ref = e->v[i], tol = rtol * (1.0 + e->mag[i] + fabs(ref));
        if (!(fabs((double)out[i] - ref) <= tol) && !(isnan(ref) && isnan(out[i]))) {
            fprintf(stderr, "%s: tile [%d,%d)x[%d,%d) column %lld row %lld: got %.7g expected %.7g\n",
                    name, col0, col1, row0, row1, (long long)col, (long long)row, out[i], ref);
            bad++;
        }
    }
    free(scratch);
    free(out);
    return bad;
}

/* Concurrent run: threads take the tiles of one tiling in turn and write into one shared output,
 * as the runtime's computing threads do; the whole output must match. */
typedef struct shared_run {
    const layer *l;
    const float *const *in;
    float *out;
    const int *cc, *rc;
    int kc, kr, thread, threads;
} shared_run;

static inline void *shared_worker(void *arg) {
    const shared_run *s = arg;
    const layer *l = s->l;
    for (int t = s->thread; t < s->kc * s->kr; t += s->threads) {
        int i = t / s->kr, j = t % s->kr;
        size_t need = l->scratch_fixed + l->scratch_per_col * (size_t)(s->cc[i + 1] - s->cc[i]);
        float *scratch = NULL;
        if (need && posix_memalign((void **)&scratch, 64, need * sizeof(float))) abort();
        op_execute(l, s->in, s->out, s->cc[i], s->cc[i + 1], s->rc[j], s->rc[j + 1], scratch);
        free(scratch);
    }
    return NULL;
}

static inline int run_shared(const char *name, const layer *l, const float *const *in, const expected *e,
                      double rtol, const int *cc, int kc, const int *rc, int kr) {
    enum { THREADS = 3 };
    size_t total = (size_t)l->n * l->c * l->h * l->w;
    float *out = malloc(total * sizeof(float));
    shared_run runs[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        runs[t] = (shared_run){l, in, out, cc, rc, kc, kr, t, THREADS};
        if (pthread_create(&th[t], NULL, shared_worker, &runs[t])) abort();
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    int bad = 0;
    for (size_t i = 0; i < total && bad < 5; i++) {
        double tol = rtol * (1.0 + e->mag[i] + fabs(e->v[i]));
        if (!(fabs((double)out[i] - e->v[i]) <= tol) && !(isnan(e->v[i]) && isnan(out[i]))) {
            fprintf(stderr, "%s: threads: element %zu got %.7g expected %.7g\n", name, i, out[i],
                    e->v[i]);
            bad++;
        }
    }
    free(out);
    return bad;
}

/* Prepares l, runs every tiling, releases l. row_split = 0 keeps rows whole. */
static inline void check_tiles(const char *name, layer *l, const float *const *in, const expected *e,
                        double rtol, int row_split) {
    char err[256] = {0};
    coacto_status st = op_prepare(l, err, sizeof err);
    if (st != COACTO_OK) {
        fprintf(stderr, "%s: op_prepare failed (%d): %s\n", name, st, err);
        failed++;
        op_release(l);
        return;
    }
    int cols = l->n * l->h * l->w;
    int nr = l->kern ? (int)l->kern->nr : 16;
    int bad = 0;
    for (int tiling = 0; tiling < 3 && !bad; tiling++) {
        int cc[66], rc[66];
        int kc = tiling == 0 ? (cc[0] = 0, cc[1] = cols, 1) : cuts(cols, 6, 0, cc);
        int kr;
        if (tiling == 0 || !row_split)
            kr = (rc[0] = 0, rc[1] = l->c, 1);
        else
            kr = cuts(l->c, 5, tiling == 2 && l->c > nr ? nr : 0, rc);
        for (int i = 0; i < kc && !bad; i++)
            for (int j = 0; j < kr && !bad; j++)
                bad += run_tile(name, l, in, e, rtol, cc[i], cc[i + 1], rc[j], rc[j + 1]);
        if (tiling == 1 && !bad) bad += run_shared(name, l, in, e, rtol, cc, kc, rc, kr);
    }
    op_release(l);
    if (bad) failed++;
    else passed++;
}


#endif
