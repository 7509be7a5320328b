/* Random tile DAGs on the runtime: every tile runs exactly once, results equal a sequential run
 * and a direct computation, external completions race local ones safely, bad graphs are refused.
 *
 * Graphs: layers of equal shape (1 x C x 1 x COLS); layer i > 0 is AFFINE (y = 0.5 x + 1) of one
 * earlier layer or BINARY add/mul of two; every layer gets its own random grid of column and row
 * blocks, and a tile's parents are the input tiles its rectangle overlaps (elementwise reads). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coacto.h"
#include "runtime_internal.h" /* main_parent: the scheduler's affinity hint */

static int failures, checks;
#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        checks++;                                                                                \
        if (!(cond)) {                                                                           \
            failures++;                                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                        \
            fprintf(stderr, "\n");                                                               \
        }                                                                                        \
    } while (0)

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

typedef struct dag {
    int n_layers, cols, rows;
    coacto_layer_desc *layers;
    int n_tiles;
    int32_t *tile_layer, *bounds, *poff, *parents;
    uint8_t *blob;
    int64_t blob_size;
} dag;

static int random_cuts(int total, int max_parts, int32_t *cuts) {
    int parts = 1 + (int)(rnd() % (uint32_t)max_parts);
    if (parts > total) parts = total;
    cuts[0] = 0;
    for (int i = 1; i < parts; i++) cuts[i] = (int32_t)((int64_t)i * total / parts);
    /* jitter interior cuts so blocks of neighbouring layers do not align */
    for (int i = 1; i < parts; i++) {
        int lo = cuts[i - 1] + 1, hi = (i + 1 < parts ? (int)((int64_t)(i + 1) * total / parts) : total) - 1;
        if (hi >= lo) cuts[i] = lo + (int32_t)(rnd() % (uint32_t)(hi - lo + 1));
    }
    cuts[parts] = total;
    return parts;
}

static void dag_build(dag *d, int n_layers, int cols, int rows, int max_col_parts, int max_row_parts) {
    memset(d, 0, sizeof *d);
    d->n_layers = n_layers;
    d->cols = cols;
    d->rows = rows;
    d->layers = calloc((size_t)n_layers, sizeof(coacto_layer_desc));
    /* blob: scale (rows) then shift (rows) at offsets 0 and 64-aligned */
    int64_t arr = ((int64_t)rows * 4 + 63) / 64 * 64;
    d->blob_size = 2 * arr;
    d->blob = calloc(1, (size_t)d->blob_size);
    for (int r = 0; r < rows; r++) {
        ((float *)d->blob)[r] = 0.5f;
        ((float *)(d->blob + arr))[r] = 1.0f;
    }
    int32_t *ccuts = malloc(sizeof(int32_t) * (size_t)(cols + 1) * (size_t)n_layers);
    int32_t *rcuts = malloc(sizeof(int32_t) * (size_t)(rows + 1) * (size_t)n_layers);
    int *ncp = malloc(sizeof(int) * (size_t)n_layers), *nrp = malloc(sizeof(int) * (size_t)n_layers);
    int total = 0;
    for (int l = 0; l < n_layers; l++) {
        coacto_layer_desc *ld = &d->layers[l];
        ld->n = 1;
        ld->c = rows;
        ld->h = 1;
        ld->w = cols;
        if (l == 0) {
            ld->op = COACTO_OP_INPUT;
        } else if (l == 1 || rnd() % 2) {
            ld->op = COACTO_OP_AFFINE;
            ld->n_inputs = 1;
            ld->inputs[0] = (int32_t)(rnd() % (uint32_t)l);
            ld->array_offset[0] = 0;
            ld->array_size[0] = rows * 4;
            ld->array_offset[1] = arr;
            ld->array_size[1] = rows * 4;
        } else {
            ld->op = COACTO_OP_BINARY;
            ld->n_inputs = 2;
            ld->inputs[0] = (int32_t)(rnd() % (uint32_t)l);
            ld->inputs[1] = (int32_t)(rnd() % (uint32_t)l);
            ld->iparams[0] = rnd() % 2 ? 0 : 2; /* add or mul */
            for (int k = 4; k < 8; k++) ld->iparams[k] = 1;
        }
        if (l == n_layers - 1) ld->flags = COACTO_LAYER_KEEP;
        ncp[l] = random_cuts(cols, max_col_parts, ccuts + (size_t)l * (cols + 1));
        nrp[l] = random_cuts(rows, max_row_parts, rcuts + (size_t)l * (rows + 1));
        total += ncp[l] * nrp[l];
    }
    /* Every sink layer is an output: an inference ends when its outputs are done, and every tile
     * must then have run (elementwise reads make every tile an ancestor of a sink's tile). */
    for (int l = 0; l < n_layers; l++) {
        int consumed = 0;
        for (int k = l + 1; k < n_layers && !consumed; k++)
            for (int i = 0; i < d->layers[k].n_inputs; i++) consumed |= d->layers[k].inputs[i] == l;
        if (!consumed) d->layers[l].flags = COACTO_LAYER_KEEP;
    }
    d->n_tiles = total;
    d->tile_layer = malloc(sizeof(int32_t) * (size_t)total);
    d->bounds = malloc(sizeof(int32_t) * 4 * (size_t)total);
    d->poff = calloc((size_t)total + 1, sizeof(int32_t));
    int cap = 1024, n_edges = 0;
    d->parents = malloc(sizeof(int32_t) * (size_t)cap);
    int *first = malloc(sizeof(int) * (size_t)(n_layers + 1));
    int t = 0;
    for (int l = 0; l < n_layers; l++) {
        first[l] = t;
        const int32_t *cc = ccuts + (size_t)l * (cols + 1), *rc = rcuts + (size_t)l * (rows + 1);
        for (int a = 0; a < ncp[l]; a++)
            for (int b = 0; b < nrp[l]; b++, t++) {
                d->tile_layer[t] = l;
                int32_t *bd = &d->bounds[4 * t];
                bd[0] = cc[a];
                bd[1] = cc[a + 1];
                bd[2] = rc[b];
                bd[3] = rc[b + 1];
                const coacto_layer_desc *ld = &d->layers[l];
                for (int k = 0; k < ld->n_inputs; k++) {
                    int p = ld->inputs[k];
                    if (k == 1 && ld->inputs[0] == p) break;
                    for (int pt = first[p]; pt < first[p] + ncp[p] * nrp[p]; pt++) {
                        const int32_t *pb = &d->bounds[4 * pt];
                        if (pb[0] < bd[1] && bd[0] < pb[1] && pb[2] < bd[3] && bd[2] < pb[3]) {
                            if (n_edges == cap) {
                                cap *= 2;
                                d->parents = realloc(d->parents, sizeof(int32_t) * (size_t)cap);
                            }
                            d->parents[n_edges++] = pt;
                        }
                    }
                }
                d->poff[t + 1] = n_edges;
            }
    }
    free(first);
    free(ccuts);
    free(rcuts);
    free(ncp);
    free(nrp);
}

static void dag_free(dag *d) {
    free(d->layers);
    free(d->tile_layer);
    free(d->bounds);
    free(d->poff);
    free(d->parents);
    free(d->blob);
}

static coacto_graph_desc dag_desc(const dag *d) {
    coacto_graph_desc g = {d->n_layers, d->layers, d->n_tiles, d->tile_layer, d->bounds,
                           d->poff,     d->parents, d->blob,   d->blob_size, 0};
    return g;
}

typedef struct putter_arg {
    coacto_inference *inf;
    const dag *d;
    const float *const *layer_values; /* per layer, from the reference */
    int start, stride, duplicates, accepted;
} putter_arg;

static void *putter(void *p) {
    putter_arg *a = p;
    const dag *d = a->d;
    float *buf = malloc(sizeof(float) * (size_t)d->cols * d->rows);
    for (int t = a->start; t < d->n_tiles; t += a->stride) {
        int l = d->tile_layer[t];
        if (l == 0) continue;
        const int32_t *b = &d->bounds[4 * t];
        int rows = b[3] - b[2];
        for (int c = b[0]; c < b[1]; c++)
            memcpy(buf + (size_t)(c - b[0]) * rows, a->layer_values[l] + (size_t)c * d->rows + b[2],
                   sizeof(float) * (size_t)rows);
        coacto_status st = coacto_inference_put_tile(a->inf, t, buf, (int64_t)(b[1] - b[0]) * rows);
        if (st == COACTO_OK) a->accepted++;
        else if (st == COACTO_ERR_DUPLICATE) a->duplicates++;
    }
    free(buf);
    return NULL;
}

static void all_layer_values(const dag *d, const float *input, float **vals) {
    size_t n = (size_t)d->cols * d->rows;
    for (int l = 0; l < d->n_layers; l++) {
        vals[l] = malloc(sizeof(float) * n);
        const coacto_layer_desc *ld = &d->layers[l];
        for (size_t i = 0; i < n; i++) {
            if (ld->op == COACTO_OP_INPUT) vals[l][i] = input[i];
            else if (ld->op == COACTO_OP_AFFINE) vals[l][i] = vals[ld->inputs[0]][i] * 0.5f + 1.0f;
            else if (ld->iparams[0] == 0) vals[l][i] = vals[ld->inputs[0]][i] + vals[ld->inputs[1]][i];
            else vals[l][i] = vals[ld->inputs[0]][i] * vals[ld->inputs[1]][i];
        }
    }
}

/* Direct computation of the last layer. */
static void dag_reference(const dag *d, const float *input, float *out) {
    float **v = malloc(sizeof(float *) * (size_t)d->n_layers);
    all_layer_values(d, input, v);
    memcpy(out, v[d->n_layers - 1], sizeof(float) * (size_t)d->cols * d->rows);
    for (int l = 0; l < d->n_layers; l++) free(v[l]);
    free(v);
}

static int64_t span_overlap(int32_t a0, int32_t a1, int32_t b0, int32_t b1) {
    int32_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

/* Every layer here is element-wise over the same columns and rows: a tile's main parent is the
 * tile of its first input's layer that shares the most elements with it, when only one does. */
static void check_main_parents(const dag *d, const coacto_graph *g, int seed) {
    for (int t = 0; t < d->n_tiles; t++) {
        const coacto_layer_desc *ld = &d->layers[d->tile_layer[t]];
        int32_t want = -1;
        if (ld->n_inputs > 0) {
            int64_t best = 0;
            int ties = 0;
            const int32_t *b = &d->bounds[4 * t];
            for (int p = 0; p < d->n_tiles; p++) {
                if (d->tile_layer[p] != ld->inputs[0]) continue;
                const int32_t *pb = &d->bounds[4 * p];
                int64_t sc = span_overlap(b[0], b[1], pb[0], pb[1]) *
                             span_overlap(b[2], b[3], pb[2], pb[3]);
                if (sc > best) best = sc, want = p, ties = 0;
                else if (sc == best && sc > 0) ties++;
            }
            if (ties) want = -1;
        }
        CHECK(g->main_parent[t] == want, "seed %d tile %d: main parent %d, want %d", seed, t,
              g->main_parent[t], want);
    }
}

static void run_case(int seed, int threads, int with_putter) {
    rng_state = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
    dag d;
    int n_layers = 3 + (int)(rnd() % 40);
    dag_build(&d, n_layers, 8 + (int)(rnd() % 120), 1 + (int)(rnd() % 40), 12, 4);
    size_t n = (size_t)d.cols * d.rows;
    float *input = malloc(sizeof(float) * n), *expect = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) input[i] = (float)((int)(rnd() % 200) - 100) / 64.0f;
    dag_reference(&d, input, expect);
    coacto_graph_desc gd = dag_desc(&d);
    coacto_graph *g = NULL;
    char err[256];
    coacto_status st = coacto_graph_create(&gd, &g, err, sizeof err);
    CHECK(st == COACTO_OK, "seed %d: graph_create: %s", seed, err);
    if (st != COACTO_OK) goto out;
    check_main_parents(&d, g, seed);
    coacto_runtime *rt = NULL;
    CHECK(coacto_runtime_create(threads, &rt) == COACTO_OK, "runtime_create");
    for (int rep = 0; rep < 3; rep++) {
        coacto_inference *inf = NULL;
        CHECK(coacto_inference_create(rt, g, &inf) == COACTO_OK, "inference_create");
        float **vals = NULL;
        pthread_t th;
        putter_arg pa = {0};
        if (with_putter) {
            vals = malloc(sizeof(float *) * (size_t)d.n_layers);
            all_layer_values(&d, input, vals);
            pa = (putter_arg){inf, &d, (const float *const *)vals, rep, 2 + rep, 0, 0};
        }
        /* rep 1 times every layer; rep 2 gives the input in ONNX (NCHW) order, which the
         * runtime transposes into its layout (the input layer is 1 x rows x 1 x cols). */
        if (rep == 1) CHECK(coacto_graph_set_profiling(g, 1) == COACTO_OK, "set_profiling");
        if (rep == 2) {
            float *nchw = malloc(sizeof(float) * n);
            for (int col = 0; col < d.cols; col++)
                for (int r = 0; r < d.rows; r++)
                    nchw[(size_t)r * d.cols + col] = input[(size_t)col * d.rows + r];
            CHECK(coacto_inference_set_input_nchw(inf, 0, nchw, (int64_t)n) == COACTO_OK,
                  "set_input_nchw");
            free(nchw);
        } else {
            CHECK(coacto_inference_set_input(inf, 0, input, (int64_t)n) == COACTO_OK, "set_input");
        }
        if (with_putter) pthread_create(&th, NULL, putter, &pa);
        st = coacto_inference_wait(inf, 30.0);
        CHECK(st == COACTO_OK, "seed %d: wait: %s", seed, coacto_status_string(st));
        if (with_putter) pthread_join(th, NULL);
        CHECK(coacto_inference_get_output(inf, d.n_layers - 1, got, (int64_t)n) == COACTO_OK,
              "get_output");
        int bad = 0;
        for (size_t i = 0; i < n; i++) bad += got[i] != expect[i];
        CHECK(bad == 0, "seed %d threads %d: %d values differ from the reference", seed, threads,
              bad);
        coacto_inference_stats s;
        coacto_inference_get_stats(inf, &s);
        int64_t input_tiles = 0;
        for (int t = 0; t < d.n_tiles; t++) input_tiles += d.tile_layer[t] == 0;
        /* Exactly once: no tile counted twice. Without external tiles every tile ran here; with
         * them, an output tile completed from outside can end the inference before some of its
         * ancestors ran (they are then never needed). */
        int64_t accounted = s.tiles_computed + s.tiles_external + input_tiles;
        CHECK(with_putter ? accounted <= d.n_tiles : accounted == d.n_tiles,
              "seed %d: computed %lld + external %lld + input %lld vs tiles %d (exactly once)",
              seed, (long long)s.tiles_computed, (long long)s.tiles_external,
              (long long)input_tiles, d.n_tiles);
        CHECK(s.tiles_external == pa.accepted, "external count %lld vs accepted %d",
              (long long)s.tiles_external, pa.accepted);
        if (!with_putter) {
            for (int t = 0; t < d.n_tiles; t++)
                if (coacto_inference_tile_state(inf, t) != COACTO_TILE_COMPLETED) {
                    CHECK(0, "tile %d not completed", t);
                    break;
                }
        }
        /* A late duplicate is refused. */
        if (d.n_tiles > 1) {
            int t = d.n_tiles - 1;
            const int32_t *b = &d.bounds[4 * t];
            CHECK(coacto_inference_put_tile(inf, t, got, (int64_t)(b[1] - b[0]) * (b[3] - b[2])) ==
                      COACTO_ERR_DUPLICATE,
                  "duplicate put accepted");
        }
        coacto_inference_destroy(inf);
        if (rep == 1) {
            double *secs = malloc(sizeof(double) * (size_t)d.n_layers);
            CHECK(coacto_graph_layer_seconds(g, secs, d.n_layers) == COACTO_OK, "layer_seconds");
            CHECK(coacto_graph_layer_seconds(g, secs, d.n_layers + 1) ==
                      COACTO_ERR_INVALID_ARGUMENT,
                  "layer_seconds accepted a wrong layer count");
            double total = 0;
            for (int l = 0; l < d.n_layers; l++) {
                CHECK(secs[l] >= 0, "layer %d: %g s", l, secs[l]);
                total += secs[l];
            }
            CHECK(secs[0] == 0, "the input layer is never executed, timed %g s", secs[0]);
            CHECK(with_putter || total > 0, "no layer time recorded");
            CHECK(coacto_graph_set_profiling(g, 0) == COACTO_OK, "set_profiling off");
            free(secs);
        }
        if (vals) {
            for (int l = 0; l < d.n_layers; l++) free(vals[l]);
            free(vals);
        }
    }
    coacto_runtime_destroy(rt);
    coacto_graph_destroy(g);
out:
    free(input);
    free(expect);
    free(got);
    dag_free(&d);
}

/* Inferences destroyed the moment they finish or are cancelled, while workers may still be
 * dropping their last references (under ThreadSanitizer this once found a use after free: the
 * last reference was dropped before, not under, the mutex destroy waits on). */
static void *cancel_soon(void *arg) {
    struct timespec ts = {0, (long)(rnd() % 40) * 1000L};
    nanosleep(&ts, NULL);
    coacto_inference_cancel(arg);
    return NULL;
}

static void run_destroy_at_once(void) {
    rng_state = 777;
    dag d;
    dag_build(&d, 12, 48, 8, 6, 2);
    coacto_graph *g = NULL;
    coacto_graph_desc gd = dag_desc(&d);
    CHECK(coacto_graph_create(&gd, &g, NULL, 0) == COACTO_OK, "graph");
    coacto_runtime *rt = NULL;
    coacto_runtime_create(16, &rt); /* more threads than CPUs: preempted between the steps */
    size_t n = (size_t)d.cols * d.rows;
    float *in = calloc(n, sizeof(float));
    for (int it = 0; g && rt && it < 300; it++) {
        coacto_inference *inf = NULL;
        CHECK(coacto_inference_create(rt, g, &inf) == COACTO_OK, "inference_create");
        pthread_t th;
        int cancel = it % 2;
        if (cancel) pthread_create(&th, NULL, cancel_soon, inf);
        coacto_inference_set_input(inf, 0, in, (int64_t)n);
        coacto_status st = coacto_inference_wait(inf, 20.0);
        if (cancel) pthread_join(th, NULL);
        else CHECK(st == COACTO_OK, "iteration %d: wait", it);
        coacto_inference_destroy(inf);
    }
    free(in);
    coacto_runtime_destroy(rt);
    coacto_graph_destroy(g);
    dag_free(&d);
}

/* One INPUT (CIN x SIDE x SIDE) and one 1x1 CONV to COUT channels as a single tile of about
 * 2 * CIN * COUT * SIDE^2 FLOPs: longer than a cancel may take, so the runtime runs it in pieces. */
enum { BIG_CIN = 256, BIG_COUT = 256 };

static coacto_graph *big_tile_graph(int side) {
    static coacto_layer_desc layers[2];
    memset(layers, 0, sizeof layers);
    layers[0].op = COACTO_OP_INPUT;
    layers[0].n = 1, layers[0].c = BIG_CIN, layers[0].h = side, layers[0].w = side;
    coacto_layer_desc *conv = &layers[1];
    conv->op = COACTO_OP_CONV;
    conv->n_inputs = 1;
    conv->n = 1, conv->c = BIG_COUT, conv->h = side, conv->w = side;
    int32_t ip[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0}; /* 1x1, stride 1, no pads, group 1 */
    memcpy(conv->iparams, ip, sizeof ip);
    conv->array_size[0] = (int64_t)BIG_CIN * BIG_COUT * 4;
    conv->flags = COACTO_LAYER_KEEP;
    float *w = malloc((size_t)conv->array_size[0]);
    for (int i = 0; i < BIG_CIN * BIG_COUT; i++) w[i] = (float)((int)(rnd() % 17) - 8) / 64.0f;
    int32_t tile_layer[2] = {0, 1};
    int32_t bounds[8] = {0, side * side, 0, BIG_CIN, 0, side * side, 0, BIG_COUT};
    int32_t poff[3] = {0, 0, 1}, parents[1] = {0};
    coacto_graph_desc gd = {2, layers, 2, tile_layer, bounds, poff, parents, (uint8_t *)w,
                            conv->array_size[0], 0};
    coacto_graph *g = NULL;
    CHECK(coacto_graph_create(&gd, &g, NULL, 0) == COACTO_OK, "big tile graph");
    free(w);
    return g;
}

/* A 1x1 CONV of SHARE_CIN -> SHARE_COUT channels on a SIDE x SIDE input cut into `ncol` column
 * and `nrow` row (output channel) blocks; the input is one tile. `w` NULL: no blob (a graph
 * that shares another's weights). */
enum { SHARE_CIN = 64, SHARE_COUT = 48, SHARE_SIDE = 20 };

typedef struct conv_case {
    coacto_layer_desc layers[2];
    int32_t tile_layer[1 + 16], bounds[4 * (1 + 16)], poff[2 + 16], parents[16];
    coacto_graph_desc gd;
} conv_case;

static void conv_case_init(conv_case *c, int ncol, int nrow, float *w) {
    memset(c, 0, sizeof *c);
    const int cols = SHARE_SIDE * SHARE_SIDE;
    c->layers[0].op = COACTO_OP_INPUT;
    c->layers[0].n = 1, c->layers[0].c = SHARE_CIN, c->layers[0].h = SHARE_SIDE;
    c->layers[0].w = SHARE_SIDE;
    coacto_layer_desc *conv = &c->layers[1];
    conv->op = COACTO_OP_CONV;
    conv->n_inputs = 1;
    conv->n = 1, conv->c = SHARE_COUT, conv->h = SHARE_SIDE, conv->w = SHARE_SIDE;
    int32_t ip[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0};
    memcpy(conv->iparams, ip, sizeof ip);
    conv->array_size[0] = (int64_t)SHARE_CIN * SHARE_COUT * 4;
    conv->flags = COACTO_LAYER_KEEP;
    int32_t in_bounds[4] = {0, cols, 0, SHARE_CIN};
    memcpy(c->bounds, in_bounds, sizeof in_bounds);
    int t = 1;
    for (int i = 0; i < ncol; i++)
        for (int j = 0; j < nrow; j++, t++) {
            c->tile_layer[t] = 1;
            int32_t b[4] = {cols * i / ncol, cols * (i + 1) / ncol, SHARE_COUT * j / nrow,
                            SHARE_COUT * (j + 1) / nrow};
            memcpy(&c->bounds[4 * t], b, sizeof b);
            c->poff[t + 1] = t;
            c->parents[t - 1] = 0;
        }
    c->gd = (coacto_graph_desc){2, c->layers, t, c->tile_layer, c->bounds, c->poff, c->parents,
                                (uint8_t *)w, w ? conv->array_size[0] : 0, 0};
}

static double max_rel_diff(const float *got, const float *expect, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - expect[i]) / (fabs((double)expect[i]) + 1e-3);
        if (!(e <= worst)) worst = e; /* a NaN counts */
    }
    return worst;
}

static void run_conv_case(coacto_runtime *rt, coacto_graph *g, const float *in, float *out) {
    coacto_inference *inf = NULL;
    CHECK(coacto_inference_create(rt, g, &inf) == COACTO_OK, "sharing: inference_create");
    if (!inf) return;
    coacto_inference_set_input(inf, 0, in, (int64_t)SHARE_CIN * SHARE_SIDE * SHARE_SIDE);
    CHECK(coacto_inference_wait(inf, 30.0) == COACTO_OK, "sharing: wait");
    coacto_inference_get_output(inf, 1, out, (int64_t)SHARE_COUT * SHARE_SIDE * SHARE_SIDE);
    coacto_inference_destroy(inf);
}

/* A graph cut into other tiles on another graph's packed weights computes what the owner
 * computes, outlives it, and is refused for a layer that differs. */
static void run_sharing(void) {
    rng_state = 2718;
    const size_t n_in = (size_t)SHARE_CIN * SHARE_SIDE * SHARE_SIDE;
    const size_t n_out = (size_t)SHARE_COUT * SHARE_SIDE * SHARE_SIDE;
    float *w = malloc(sizeof(float) * SHARE_CIN * SHARE_COUT), *in = malloc(sizeof(float) * n_in);
    float *expect = calloc(n_out, sizeof(float)), *got = calloc(n_out, sizeof(float));
    for (int i = 0; i < SHARE_CIN * SHARE_COUT; i++) w[i] = (float)((int)(rnd() % 17) - 8) / 64.0f;
    for (size_t i = 0; i < n_in; i++) in[i] = (float)((int)(rnd() % 33) - 16) / 16.0f;
    static conv_case owner, other, bad;
    conv_case_init(&owner, 1, 1, w);
    coacto_graph *g = NULL, *s = NULL, *s2 = NULL, *x = NULL;
    coacto_runtime *rt = NULL;
    coacto_runtime_create(2, &rt);
    CHECK(coacto_graph_create(&owner.gd, &g, NULL, 0) == COACTO_OK, "sharing: owner graph");
    free(w); /* the owner packed it: the sharing graphs never read a blob */
    if (!g || !rt) goto out;
    run_conv_case(rt, g, in, expect);
    conv_case_init(&other, 4, 3, NULL);
    char err[256];
    CHECK(coacto_graph_create_sharing(&other.gd, g, &s, err, sizeof err) == COACTO_OK,
          "sharing: graph of 12 tiles: %s", err);
    /* of a sharing graph: shares the owner's layers (one level) */
    CHECK(coacto_graph_create_sharing(&other.gd, s, &s2, NULL, 0) == COACTO_OK, "sharing: of s");
    coacto_graph_destroy(g); /* s and s2 hold it */
    g = NULL;
    run_conv_case(rt, s, in, got);
    double worst = max_rel_diff(got, expect, n_out);
    CHECK(worst < 1e-5, "sharing: 12 tiles on shared weights differ from 1 tile by %g", worst);
    coacto_graph_destroy(s);
    s = NULL;
    memset(got, 0, n_out * sizeof(float));
    run_conv_case(rt, s2, in, got);
    worst = max_rel_diff(got, expect, n_out);
    CHECK(worst < 1e-5, "sharing: a graph sharing a sharing graph's weights differs by %g", worst);
    /* a layer that is not the same: refused, nothing held */
    conv_case_init(&bad, 2, 1, NULL);
    bad.layers[1].iparams[10] = 2; /* another group count */
    CHECK(coacto_graph_create_sharing(&bad.gd, s2, &x, err, sizeof err) == COACTO_ERR_INVALID_GRAPH
          && x == NULL && strstr(err, "layer 1 differs"), "sharing: a different layer accepted");
    conv_case_init(&bad, 2, 1, NULL);
    bad.layers[1].array_size[0] -= 4;
    CHECK(coacto_graph_create_sharing(&bad.gd, s2, &x, err, sizeof err) == COACTO_ERR_INVALID_GRAPH
          && x == NULL, "sharing: other weight sizes accepted");
    CHECK(coacto_graph_create_sharing(&other.gd, NULL, &x, err, sizeof err) != COACTO_OK &&
          x == NULL, "sharing: no weights graph accepted");
out:
    coacto_graph_destroy(s2);
    coacto_runtime_destroy(rt);
    free(in);
    free(expect);
    free(got);
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A cancel stops a tile in progress at its next piece, and takes a cancelled inference's tasks
 * out of the pool while the only worker is busy with another inference; the runtime then runs
 * the next inference to the same result. */
static void run_cancel_long_tile(void) {
    rng_state = 4242;
    const int side = 128; /* 2.1 GFLOP: 17 pieces, tens of ms even on a fast core */
    coacto_graph *g = big_tile_graph(side);
    coacto_runtime *rt = NULL;
    coacto_runtime_create(1, &rt);
    size_t n_in = (size_t)BIG_CIN * side * side, n_out = (size_t)BIG_COUT * side * side;
    float *in = malloc(sizeof(float) * n_in), *first = malloc(sizeof(float) * n_out),
          *again = malloc(sizeof(float) * n_out);
    for (size_t i = 0; i < n_in; i++) in[i] = (float)((int)(rnd() % 33) - 16) / 16.0f;
    for (int it = 0; g && rt && it < 2; it++) { /* the first run also packs and warms up */
        coacto_inference *inf = NULL;
        coacto_inference_create(rt, g, &inf);
        double t0 = seconds_now();
        coacto_inference_set_input(inf, 0, in, (int64_t)n_in);
        CHECK(coacto_inference_wait(inf, 600.0) == COACTO_OK, "uncancelled run");
        double full = seconds_now() - t0;
        coacto_inference_get_output(inf, 1, first, (int64_t)n_out);
        coacto_inference_destroy(inf);
        if (it == 0) continue;

        coacto_inference *busy = NULL, *queued = NULL;
        coacto_inference_create(rt, g, &busy);
        coacto_inference_create(rt, g, &queued);
        t0 = seconds_now();
        coacto_inference_set_input(busy, 0, in, (int64_t)n_in);
        coacto_inference_set_input(queued, 0, in, (int64_t)n_in); /* behind busy's tile */
        int state;
        while ((state = coacto_inference_tile_state(busy, 1)) < COACTO_TILE_RUNNING) sched_yield();
        if (state == COACTO_TILE_COMPLETED) { /* this thread was descheduled for a whole tile */
            printf("dag: the long tile ended before this thread saw it run; cancel not tested\n");
            coacto_inference_destroy(queued);
            coacto_inference_destroy(busy);
            continue;
        }
        double t_cancel = seconds_now();
        coacto_inference_destroy(queued); /* cancels; its task waits in the pool */
        double purged = seconds_now() - t_cancel;
        /* It did not wait for the worker to finish busy's tile and reach its task: */
        CHECK(coacto_inference_tile_state(busy, 1) != COACTO_TILE_COMPLETED,
              "a queued inference's destroy waited for another inference's tile");
        coacto_inference_cancel(busy);
        CHECK(coacto_inference_wait(busy, 600.0) == COACTO_ERR_CANCELLED, "wait after cancel");
        while (atomic_load(&busy->inflight) > 0) sched_yield(); /* the piece in progress ends */
        double stopped = seconds_now() - t_cancel;
        /* Unfinished (RUNNING: stopped between two pieces; READY: the worker had not begun). Wall
         * times are printed, not checked: on a loaded machine a thread waits for a CPU. */
        CHECK(coacto_inference_tile_state(busy, 1) != COACTO_TILE_COMPLETED,
              "the long tile ran to its end after the cancel");
        coacto_inference_destroy(busy);
        printf("dag: a %.1f ms tile stopped %.2f ms after its cancel; a queued inference's "
               "destroy took %.2f ms\n", full * 1e3, stopped * 1e3, purged * 1e3);

        coacto_inference *next = NULL;
        coacto_inference_create(rt, g, &next);
        coacto_inference_set_input(next, 0, in, (int64_t)n_in);
        CHECK(coacto_inference_wait(next, 600.0) == COACTO_OK, "run after the cancel");
        coacto_inference_get_output(next, 1, again, (int64_t)n_out);
        CHECK(memcmp(first, again, n_out * sizeof(float)) == 0, "result after a cancel differs");
        coacto_inference_destroy(next);
    }
    free(in);
    free(first);
    free(again);
    coacto_runtime_destroy(rt);
    coacto_graph_destroy(g);
}

/* Several inferences of different graphs in flight on one runtime at once. */
static void run_concurrent(void) {
    rng_state = 12345;
    dag a, b;
    dag_build(&a, 30, 64, 16, 8, 2);
    dag_build(&b, 20, 40, 24, 6, 3);
    coacto_graph *ga = NULL, *gb = NULL;
    coacto_graph_desc da = dag_desc(&a), db = dag_desc(&b);
    CHECK(coacto_graph_create(&da, &ga, NULL, 0) == COACTO_OK, "graph a");
    CHECK(coacto_graph_create(&db, &gb, NULL, 0) == COACTO_OK, "graph b");
    coacto_runtime *rt = NULL;
    coacto_runtime_create(3, &rt);
    enum { K = 8 };
    coacto_inference *inf[K];
    float *in[K], *expect[K], *got[K];
    for (int i = 0; i < K; i++) {
        const dag *d = i % 2 ? &b : &a;
        size_t n = (size_t)d->cols * d->rows;
        in[i] = malloc(sizeof(float) * n);
        expect[i] = malloc(sizeof(float) * n);
        got[i] = malloc(sizeof(float) * n);
        for (size_t j = 0; j < n; j++) in[i][j] = (float)((int)(rnd() % 100) - 50) / 32.0f;
        dag_reference(d, in[i], expect[i]);
        coacto_inference_create(rt, i % 2 ? gb : ga, &inf[i]);
    }
    for (int i = 0; i < K; i++) {
        const dag *d = i % 2 ? &b : &a;
        coacto_inference_set_input(inf[i], 0, in[i], (int64_t)d->cols * d->rows);
    }
    for (int i = 0; i < K; i++) {
        const dag *d = i % 2 ? &b : &a;
        size_t n = (size_t)d->cols * d->rows;
        CHECK(coacto_inference_wait(inf[i], 30.0) == COACTO_OK, "concurrent wait %d", i);
        coacto_inference_get_output(inf[i], d->n_layers - 1, got[i], (int64_t)n);
        CHECK(memcmp(got[i], expect[i], n * sizeof(float)) == 0, "concurrent result %d", i);
        coacto_inference_destroy(inf[i]);
        free(in[i]);
        free(expect[i]);
        free(got[i]);
    }
    /* destroy graphs before the last inference would be fine too: graphs are refcounted */
    coacto_graph_destroy(ga);
    coacto_graph_destroy(gb);
    coacto_runtime_destroy(rt);
    dag_free(&a);
    dag_free(&b);
}

/* A graph description that lies must be refused, never crash. */
static void run_invalid(void) {
    rng_state = 777;
    dag d;
    dag_build(&d, 6, 32, 8, 4, 2);
    coacto_graph_desc gd = dag_desc(&d);
    coacto_graph *g = NULL;
    char err[256];
    int32_t saved;
    /* parent pointing forward */
    if (d.poff[d.n_tiles] > 0) {
        saved = d.parents[0];
        d.parents[0] = d.n_tiles + 5;
        CHECK(coacto_graph_create(&gd, &g, err, sizeof err) == COACTO_ERR_INVALID_GRAPH,
              "forward parent accepted");
        d.parents[0] = saved;
    }
    /* tile outside its layer */
    saved = d.bounds[1];
    d.bounds[1] = d.cols + 1;
    CHECK(coacto_graph_create(&gd, &g, err, sizeof err) == COACTO_ERR_INVALID_GRAPH,
          "out-of-range tile accepted");
    d.bounds[1] = saved;
    /* array outside the blob */
    int64_t so = d.layers[1].array_offset[0];
    d.layers[1].array_offset[0] = d.blob_size + 64;
    CHECK(coacto_graph_create(&gd, &g, err, sizeof err) == COACTO_ERR_INVALID_GRAPH,
          "array outside blob accepted");
    d.layers[1].array_offset[0] = so;
    /* input referring forward */
    int32_t si = d.layers[2].inputs[0];
    d.layers[2].inputs[0] = 4;
    CHECK(coacto_graph_create(&gd, &g, err, sizeof err) == COACTO_ERR_INVALID_GRAPH,
          "forward input accepted");
    d.layers[2].inputs[0] = si;
    /* bad op */
    d.layers[3].op = 99;
    CHECK(coacto_graph_create(&gd, &g, err, sizeof err) == COACTO_ERR_INVALID_GRAPH,
          "bad op accepted");
    d.layers[3].op = COACTO_OP_AFFINE;
    d.layers[3].n_inputs = 1;
    d.layers[3].inputs[0] = 0;
    d.layers[3].array_offset[0] = 0;
    d.layers[3].array_size[0] = d.rows * 4;
    d.layers[3].array_offset[1] = 0;
    d.layers[3].array_size[1] = d.rows * 4;
    /* and the repaired graph loads (parents of layer 3 may now be wrong layer: expect refusal or ok) */
    coacto_status st = coacto_graph_create(&gd, &g, err, sizeof err);
    CHECK(st == COACTO_OK || st == COACTO_ERR_INVALID_GRAPH, "repaired graph: %d", st);
    if (g) coacto_graph_destroy(g);
    /* bad API arguments */
    coacto_runtime *rt = NULL;
    CHECK(coacto_runtime_create(0, &rt) == COACTO_ERR_INVALID_ARGUMENT, "0 threads accepted");
    CHECK(coacto_graph_create(NULL, &g, err, sizeof err) != COACTO_OK, "NULL desc accepted");
    dag_free(&d);
}

/* Offloading plan: parked tiles, compute_all, the send queue (data, order), reports. */
static void run_offload(int seed) {
    rng_state = 4242 + (uint64_t)seed;
    dag d;
    dag_build(&d, 12, 48, 16, 5, 2);
    size_t n = (size_t)d.cols * d.rows;
    float *input = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) input[i] = (float)((int)(rnd() % 64) - 32) / 16.0f;
    float **vals = malloc(sizeof(float *) * (size_t)d.n_layers);
    all_layer_values(&d, input, vals);
    coacto_graph_desc gd = dag_desc(&d);
    coacto_graph *g = NULL;
    coacto_runtime *rt = NULL;
    CHECK(coacto_graph_create(&gd, &g, NULL, 0) == COACTO_OK, "offload graph");
    CHECK(coacto_runtime_create(2, &rt) == COACTO_OK, "offload runtime");
    uint8_t *local = calloc((size_t)d.n_tiles, 1), *send = malloc((size_t)d.n_tiles);
    for (int t = 0; t < d.n_tiles; t++) local[t] = d.tile_layer[t] <= 1;
    memset(send, COACTO_SEND_ALWAYS, (size_t)d.n_tiles);
    coacto_inference *inf = NULL;
    coacto_inference_create(rt, g, &inf);
    CHECK(coacto_inference_set_plan(inf, local, send, NULL, 99) == COACTO_OK, "set_plan");
    coacto_inference_set_input(inf, 0, input, (int64_t)n);
    CHECK(coacto_inference_wait(inf, 0.2) == COACTO_ERR_TIMEOUT, "parked tiles ran");
    CHECK(coacto_inference_set_plan(inf, NULL, NULL, NULL, 1) == COACTO_ERR_STATE,
          "plan changed after start");
    for (int t = 0; t < d.n_tiles; t++)
        if (d.tile_layer[t] >= 2 && coacto_inference_tile_state(inf, t) == COACTO_TILE_COMPLETED)
            CHECK(0, "non-local tile %d completed while parked", t);
    coacto_inference_compute_all(inf);
    CHECK(coacto_inference_wait(inf, 30.0) == COACTO_OK, "compute_all did not finish");
    /* Every tile was completed here, so every tile was queued, shallowest bucket first. */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)d.n_tiles);
    float *data = malloc(sizeof(float) * n * (size_t)d.n_layers);
    int64_t used = 0;
    int32_t k = coacto_inference_take_sends(inf, ids, d.n_tiles, data, (int64_t)n * d.n_layers, &used);
    coacto_inference_stats s;
    coacto_inference_get_stats(inf, &s);
    CHECK(k == s.tiles_sent && k > 0, "took %d of %lld queued tiles", k, (long long)s.tiles_sent);
    CHECK(coacto_inference_queued_bytes(inf) == 0, "queue not empty after taking all");
    int64_t pos = 0;
    int bad = 0;
    for (int32_t i = 0; i < k; i++) {
        const int32_t *b = &d.bounds[4 * ids[i]];
        int rows = b[3] - b[2];
        const float *v = vals[d.tile_layer[ids[i]]];
        for (int c = b[0]; c < b[1]; c++)
            for (int r = 0; r < rows; r++)
                bad += data[pos++] != v[(size_t)c * d.rows + b[2] + r];
    }
    CHECK(bad == 0 && pos == used, "sent tile data: %d wrong values", bad);
    /* Reports: readable fd, a SEND and a DONE carrying the tag. */
    coacto_report rep[64];
    int saw_send = 0, saw_done = 0, total = 0, r;
    while ((r = coacto_runtime_take_reports(rt, rep, 64)) > 0) {
        for (int i = 0; i < r; i++) {
            CHECK(rep[i].tag == 99, "report tag %llu", (unsigned long long)rep[i].tag);
            saw_send |= rep[i].kind == COACTO_REPORT_SEND;
            saw_done |= rep[i].kind == COACTO_REPORT_DONE;
        }
        total += r;
    }
    CHECK(saw_send && saw_done, "reports: send %d done %d (%d)", saw_send, saw_done, total);
    /* Tiles of layers that are not outputs cannot be read back (their buffers are recycled). */
    float tmp[4096];
    const int32_t *b0 = &d.bounds[0];
    CHECK(coacto_inference_get_tile(inf, 0, tmp, (int64_t)(b0[1] - b0[0]) * (b0[3] - b0[2])) ==
              COACTO_ERR_STATE, "get_tile of a non-output layer");
    coacto_inference_destroy(inf);
    for (int l = 0; l < d.n_layers; l++) free(vals[l]);
    free(vals);
    free(ids);
    free(data);
    free(local);
    free(send);
    free(input);
    free(got);
    coacto_runtime_destroy(rt);
    coacto_graph_destroy(g);
    dag_free(&d);
}

/* In-place residuals (coacto_inference_set_inplace) on random graphs of 1x1 convolutions with a
 * residual input, affine layers and sums, every layer on its own grid of column and channel
 * blocks: a convolution's tile reads every channel of its columns of input 0 and its own
 * rectangle of the residual. Wherever the graph lets a convolution write into its residual's
 * buffer, the results still equal a direct computation, on any number of threads. */
static void run_inplace_case(int seed, int threads, int *aliased) {
    rng_state = 0x2545F4914F6CDD1Dull * (uint64_t)(seed + 1);
    /* every fourth graph reduces over 200 to 500 channels: one K block or several (the latter
     * keep their own buffers) */
    const int deep = seed % 4 == 3;
    const int n_layers = 3 + (int)(rnd() % (deep ? 8 : 24)), cols = 8 + (int)(rnd() % (deep ? 30 : 100)),
              rows = deep ? 200 + (int)(rnd() % 300) : 1 + (int)(rnd() % 40);
    const size_t n = (size_t)cols * rows;
    coacto_layer_desc *layers = calloc((size_t)n_layers, sizeof *layers);
    const int64_t vec = ((int64_t)rows * 4 + 63) / 64 * 64, mat = ((int64_t)rows * rows * 4 + 63) / 64 * 64;
    const int64_t blob_size = 2 * vec + mat;
    float *blob = calloc(1, (size_t)blob_size); /* scale, shift (also the bias), weights */
    float *wts = blob + 2 * vec / 4;
    for (int r = 0; r < rows; r++) blob[r] = 0.5f, blob[vec / 4 + r] = 0.25f;
    for (int i = 0; i < rows * rows; i++) wts[i] = ((float)(rnd() % 200) - 100.0f) / (100.0f * rows);
    for (int l = 0; l < n_layers; l++) {
        coacto_layer_desc *ld = &layers[l];
        ld->n = 1, ld->c = rows, ld->h = 1, ld->w = cols;
        const uint32_t kind = l == 0 ? 9 : rnd() % 4;
        if (l == 0) {
            ld->op = COACTO_OP_INPUT;
        } else if (kind <= 1 || l == 1) {
            ld->op = COACTO_OP_CONV;
            ld->n_inputs = 2;
            ld->inputs[0] = (int32_t)(rnd() % (uint32_t)l);
            ld->inputs[1] = (int32_t)(rnd() % (uint32_t)l);
            int32_t p[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, COACTO_ACT_NONE};
            memcpy(ld->iparams, p, sizeof p);
            ld->array_offset[0] = 2 * vec, ld->array_size[0] = (int64_t)rows * rows * 4;
            ld->array_offset[1] = vec, ld->array_size[1] = rows * 4;
        } else if (kind == 2) {
            ld->op = COACTO_OP_AFFINE;
            ld->n_inputs = 1;
            ld->inputs[0] = (int32_t)(rnd() % (uint32_t)l);
            ld->array_offset[0] = 0, ld->array_size[0] = rows * 4;
            ld->array_offset[1] = vec, ld->array_size[1] = rows * 4;
        } else {
            ld->op = COACTO_OP_BINARY;
            ld->n_inputs = 2;
            ld->inputs[0] = (int32_t)(rnd() % (uint32_t)l);
            ld->inputs[1] = (int32_t)(rnd() % (uint32_t)l);
            for (int k = 4; k < 8; k++) ld->iparams[k] = 1; /* add */
        }
    }
    for (int l = 0; l < n_layers; l++) { /* sinks are outputs: every tile then runs */
        int consumed = 0;
        for (int k = l + 1; k < n_layers && !consumed; k++)
            for (int i = 0; i < layers[k].n_inputs; i++) consumed |= layers[k].inputs[i] == l;
        if (!consumed) layers[l].flags = COACTO_LAYER_KEEP;
    }
    /* tiles: each layer's own grid; parents by overlap (all channels of input 0 for a conv) */
    int32_t *ccuts = malloc(sizeof(int32_t) * (size_t)(cols + 1) * n_layers),
            *rcuts = malloc(sizeof(int32_t) * (size_t)(rows + 1) * n_layers);
    int *ncp = malloc(sizeof(int) * n_layers), *nrp = malloc(sizeof(int) * n_layers),
        *first = malloc(sizeof(int) * (n_layers + 1));
    int n_tiles = 0;
    for (int l = 0; l < n_layers; l++) {
        ncp[l] = random_cuts(cols, 6, ccuts + (size_t)l * (cols + 1));
        nrp[l] = random_cuts(rows, 3, rcuts + (size_t)l * (rows + 1));
        n_tiles += ncp[l] * nrp[l];
    }
    int32_t *tile_layer = malloc(sizeof(int32_t) * n_tiles), *bounds = malloc(sizeof(int32_t) * 4 * n_tiles),
            *poff = calloc((size_t)n_tiles + 1, sizeof(int32_t));
    int cap = 1024, n_edges = 0, t = 0;
    int32_t *parents = malloc(sizeof(int32_t) * (size_t)cap);
    for (int l = 0; l < n_layers; l++) {
        first[l] = t;
        const int32_t *cc = ccuts + (size_t)l * (cols + 1), *rc = rcuts + (size_t)l * (rows + 1);
        for (int a = 0; a < ncp[l]; a++)
            for (int b = 0; b < nrp[l]; b++, t++) {
                tile_layer[t] = l;
                int32_t *bd = &bounds[4 * t];
                bd[0] = cc[a], bd[1] = cc[a + 1], bd[2] = rc[b], bd[3] = rc[b + 1];
                const coacto_layer_desc *ld = &layers[l];
                for (int k = 0; k < ld->n_inputs; k++) {
                    const int p = ld->inputs[k];
                    if (k == 1 && ld->inputs[0] == p) break;
                    const int all_rows = ld->op == COACTO_OP_CONV && k == 0;
                    for (int pt = first[p]; pt < first[p] + ncp[p] * nrp[p]; pt++) {
                        const int32_t *pb = &bounds[4 * pt];
                        if (pb[0] < bd[1] && bd[0] < pb[1] && (all_rows || (pb[2] < bd[3] && bd[2] < pb[3]))) {
                            if (n_edges == cap) parents = realloc(parents, sizeof(int32_t) * (size_t)(cap *= 2));
                            parents[n_edges++] = pt;
                        }
                    }
                }
                poff[t + 1] = n_edges;
            }
    }
    /* the reference, in double */
    double **v = malloc(sizeof(double *) * n_layers);
    for (int l = 0; l < n_layers; l++) {
        v[l] = malloc(sizeof(double) * n);
        const coacto_layer_desc *ld = &layers[l];
        for (int col = 0; col < cols; col++)
            for (int r = 0; r < rows; r++) {
                const size_t i = (size_t)col * rows + r;
                if (ld->op == COACTO_OP_INPUT) {
                    v[l][i] = (double)((int)(rnd() % 200) - 100) / 64.0;
                } else if (ld->op == COACTO_OP_AFFINE) {
                    v[l][i] = v[ld->inputs[0]][i] * 0.5 + 0.25;
                } else if (ld->op == COACTO_OP_BINARY) {
                    v[l][i] = v[ld->inputs[0]][i] + v[ld->inputs[1]][i];
                } else {
                    double acc = 0.25 + v[ld->inputs[1]][i];
                    for (int k = 0; k < rows; k++) acc += (double)wts[k * rows + r] * v[ld->inputs[0]][(size_t)col * rows + k];
                    v[l][i] = acc;
                }
            }
    }
    float *input = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) input[i] = (float)v[0][i];
    coacto_graph_desc gd = {n_layers, layers, n_tiles, tile_layer, bounds, poff, parents, (uint8_t *)blob, blob_size, 0};
    coacto_graph *g = NULL;
    coacto_runtime *rt = NULL;
    char err[256];
    coacto_status st = coacto_graph_create(&gd, &g, err, sizeof err);
    CHECK(st == COACTO_OK, "inplace seed %d: graph_create: %s", seed, err);
    if (st == COACTO_OK && coacto_runtime_create(threads, &rt) == COACTO_OK) {
        for (int l = 0; l < n_layers; l++) *aliased += coacto_graph_layer_alias(g, l) >= 0;
        CHECK(coacto_graph_layer_alias(g, n_layers) == -2, "alias of a layer out of range");
        for (int rep = 0; rep < 4; rep++) {
            coacto_inference *inf = NULL;
            CHECK(coacto_inference_create(rt, g, &inf) == COACTO_OK, "inference_create");
            CHECK(coacto_inference_set_inplace(inf, rep != 3) == COACTO_OK, "set_inplace");
            CHECK(coacto_inference_set_input(inf, 0, input, (int64_t)n) == COACTO_OK, "set_input");
            CHECK(coacto_inference_set_inplace(inf, 1) == COACTO_ERR_STATE, "set_inplace after start");
            if (rep != 3) {
                const int32_t *b = &bounds[4 * (n_tiles - 1)];
                CHECK(coacto_inference_put_tile(inf, n_tiles - 1, got, (int64_t)(b[1] - b[0]) * (b[3] - b[2])) ==
                          COACTO_ERR_STATE,
                      "a put into an in-place inference was not refused");
            }
            st = coacto_inference_wait(inf, 30.0);
            CHECK(st == COACTO_OK, "inplace seed %d: wait: %s", seed, coacto_status_string(st));
            for (int l = 0; l < n_layers; l++) {
                if (!(layers[l].flags & COACTO_LAYER_KEEP)) continue;
                CHECK(coacto_inference_get_output(inf, l, got, (int64_t)n) == COACTO_OK, "get_output");
                double scale = 1e-30, worst = 0;
                for (size_t i = 0; i < n; i++) {
                    scale = fmax(scale, fabs(v[l][i]));
                    worst = fmax(worst, fabs((double)got[i] - v[l][i]));
                }
                CHECK(worst <= 1e-5 * scale, "inplace seed %d threads %d rep %d layer %d: error %g of %g",
                      seed, threads, rep, l, worst, scale);
            }
            coacto_inference_stats s;
            coacto_inference_get_stats(inf, &s);
            CHECK(s.tiles_computed + ncp[0] * nrp[0] == n_tiles, "inplace seed %d: %lld of %d tiles computed",
                  seed, (long long)s.tiles_computed, n_tiles);
            coacto_inference_destroy(inf);
        }
    }
    coacto_runtime_destroy(rt);
    coacto_graph_destroy(g);
    for (int l = 0; l < n_layers; l++) free(v[l]);
    free(v), free(input), free(got), free(layers), free(blob), free(ccuts), free(rcuts), free(ncp), free(nrp);
    free(first), free(tile_layer), free(bounds), free(poff), free(parents);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static unsigned total_progress(coacto_runtime *rt) {
    unsigned sum = 0;
    for (int i = 0; i < rt->n_threads; i++) sum += atomic_load(&rt->workers[i].progress);
    return sum;
}

static int all_moved(coacto_runtime *rt, const unsigned *before) {
    for (int i = 0; i < rt->n_threads; i++)
        if (atomic_load(&rt->workers[i].progress) == before[i]) return 0;
    return 1;
}

/* A heads-up wakes every sleeping worker (each one's pulse moves) with no work in the pool, and
 * they go back to sleep after their poll; without one, sleeping workers stay asleep. */
static void run_heads_up(void) {
    coacto_runtime *rt = NULL;
    CHECK(coacto_runtime_create(2, &rt) == COACTO_OK, "heads_up: runtime_create");
    if (!rt) return;
    coacto_runtime_heads_up(NULL); /* ignored */
    double until = now_s() + 5;
    while (atomic_load(&rt->sleepers) < 2 && now_s() < until) sched_yield();
    CHECK(atomic_load(&rt->sleepers) == 2, "heads_up: the workers never slept");
    unsigned before = total_progress(rt), each[2];
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(total_progress(rt) == before, "heads_up: sleeping workers ran without one");
    for (int i = 0; i < 2; i++) each[i] = atomic_load(&rt->workers[i].progress);
    coacto_runtime_heads_up(rt);
    until = now_s() + 5;
    while (!all_moved(rt, each) && now_s() < until) sched_yield();
    CHECK(all_moved(rt, each), "heads_up: not every sleeping worker woke");
    until = now_s() + 5;
    while (atomic_load(&rt->sleepers) < 2 && now_s() < until) sched_yield();
    CHECK(atomic_load(&rt->sleepers) == 2, "heads_up: the workers did not sleep again");
    coacto_runtime_destroy(rt);
}

int main(void) {
    int cases = getenv("COACTO_TEST_QUICK") ? 20 : 60;
    for (int s = 0; s < cases; s++) run_case(s, 1 + s % 4, 0);
    for (int s = 0; s < cases / 2; s++) run_case(1000 + s, 2 + s % 3, 1);
    run_concurrent();
    run_heads_up();
    run_destroy_at_once();
    run_cancel_long_tile();
    run_invalid();
    run_sharing();
    for (int s = 0; s < 5; s++) run_offload(s);
    int aliased = 0;
    for (int s = 0; s < cases; s++) run_inplace_case(s, 1 + s % 4, &aliased);
    CHECK(aliased > cases / 4, "only %d layers of %d graphs wrote into their residual", aliased, cases);
    printf("dag: %d layers of %d random graphs wrote into their residual\n", aliased, cases);
    printf("dag: %d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
