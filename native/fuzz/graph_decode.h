/* Fuzz bytes -> a coacto_graph_desc, shared by the libFuzzer target (fuzz_graph.c) and the test
 * that replays kept inputs under the ordinary and sanitized builds (tests/test_fuzz_graph.c).
 *
 * The decoder is structure-aware: uniformly random descriptions almost never get past the first
 * checks, so small values are cheap to express and the tiling and dependencies can be generated
 * valid, then corrupted a few entries at a time. Every array it hands over really holds what the
 * description says (n_tiles entries, parent_offsets[n_tiles] parents, blob_size bytes): lying
 * about a length is the caller breaking coacto_graph_create's contract, not a hostile file.
 *
 * Byte layout (a reader past the end reads zeros, so every input decodes):
 *   u8 n_layers-1 (mod 8)
 *   per layer: u8 op+1 (mod 18: -1..16), u8 n_inputs+1 (mod 10: -1..8), one u8 per input
 *     (mod li+2, minus 1: -1..li), dims n c h w (dim), u8 k (mod 33) then k iparams (small),
 *     u8 k (mod 9) then k fparams (real), u8 array mask then per set bit: offset (small, x64)
 *     and size (small, x4), u8 flags (bit 0: KEEP)
 *   blob: small size in 64-byte lines (negative kept, at most FUZZ_MAX_BLOB bytes), u8 length L
 *     of a pattern then L bytes; the blob repeats the pattern (zeros without one)
 *   tiles: u8 mode. bit 0 clear: a grid per layer, u8 column parts and u8 row parts (mod 4,
 *     +1) each; set: u8 n_tiles-1 (mod 64), then per tile u8 layer (mod n_layers+1) and four
 *     small bounds. bit 1 clear: every tile of the layers a layer reads is a parent; set: one
 *     bit per candidate from the input. Then u8 k (mod 8) corruptions: u8 which (mod 5: layer,
 *     bound, offset, parent, keep flag), u16 index, small value.
 *
 *   small: a byte b; 0xff: a raw little-endian int32 follows; 0xf0..0xfe: an extreme
 *     (INT32_MIN, INT32_MAX, -1, 1<<30, 65536, 65535, 1<<24, ...); otherwise b - 16.
 *   dim: a byte b; 0xff: small; otherwise b % 17 (0..16).
 *   real: a byte b; 0xff: raw float bits; 0xfe / 0xfd: NaN / infinity; otherwise (b - 128) / 16.
 */
#ifndef COACTO_FUZZ_GRAPH_DECODE_H
#define COACTO_FUZZ_GRAPH_DECODE_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coacto.h"

#define FUZZ_MAX_LAYERS 8
#define FUZZ_MAX_TILES 1024
#define FUZZ_MAX_EDGES (1 << 16)
#define FUZZ_MAX_BLOB (1 << 20)
/* Graphs larger than this (floats over all layers, blob bytes) are validated but not run: an
 * op's work grows with its output times its input or weights, and an input that takes seconds
 * under the sanitizers only slows the search. */
#define FUZZ_MAX_RUN_FLOATS (1 << 14)
#define FUZZ_MAX_RUN_BLOB (1 << 16)
/* An accepted graph whose inference has not ended after this long hangs: that is a finding. */
#define FUZZ_RUN_TIMEOUT_S 25.0

typedef struct fuzz_reader {
    const uint8_t *p;
    size_t n;
} fuzz_reader;

static inline uint8_t fuzz_u8(fuzz_reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

static inline uint32_t fuzz_u32(fuzz_reader *r) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fuzz_u8(r) << (8 * i);
    return v;
}

static inline int32_t fuzz_small(fuzz_reader *r) {
    static const int32_t extreme[15] = {INT32_MIN, INT32_MAX, -1,        1 << 30, 65536,
                                        65535,     1 << 24,   INT32_MIN + 1, INT32_MAX - 1,
                                        1 << 16 | 1, 46341,  -65536,    1 << 20, 1 << 28, 257};
    uint8_t b = fuzz_u8(r);
    if (b == 0xff) return (int32_t)fuzz_u32(r);
    if (b >= 0xf0) return extreme[b - 0xf0];
    return (int32_t)b - 16;
}

static inline int32_t fuzz_dim(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    return b == 0xff ? fuzz_small(r) : (int32_t)(b % 17);
}

static inline float fuzz_real(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b == 0xff) {
        uint32_t bits = fuzz_u32(r);
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    if (b == 0xfe) return NAN;
    if (b == 0xfd) return INFINITY;
    return (float)((int)b - 128) / 16.0f;
}

typedef struct fuzz_graph {
    coacto_layer_desc layers[FUZZ_MAX_LAYERS];
    int32_t tile_layer[FUZZ_MAX_TILES];
    int32_t bounds[4 * FUZZ_MAX_TILES];
    int32_t offsets[FUZZ_MAX_TILES + 1];
    int32_t *parents; /* malloc'ed: as many as the largest offset */
    uint8_t *blob;    /* malloc'ed: blob_size bytes (at least one) */
    coacto_graph_desc desc;
} fuzz_graph;

static inline void fuzz_graph_free(fuzz_graph *fg) {
    free(fg->parents);
    free(fg->blob);
    fg->parents = NULL;
    fg->blob = NULL;
}

static inline int32_t fuzz_clamp(int64_t v, int32_t lo, int32_t hi) {
    return v < lo ? lo : v > hi ? hi : (int32_t)v;
}

/* a * b * c of dims that may be anything (a bad graph's), saturated instead of overflowing. */
static inline int64_t fuzz_columns(int32_t a, int32_t b, int32_t c) {
    int64_t x = (int64_t)a * b; /* two int32 factors always fit */
    if (x <= 0 || c <= 0) return 0;
    return x > INT64_MAX / c ? INT64_MAX : x * c;
}

/* Even cuts of [0, total) into at most `parts` non-empty blocks; returns the count. */
static inline int32_t fuzz_cuts(int64_t total, int32_t parts, int32_t *cuts) {
    if (total < 1) total = 1; /* a bad dim: one (wrong) tile keeps the rest of the graph going */
    if (total > INT32_MAX) total = INT32_MAX;
    if (parts > total) parts = (int32_t)total;
    for (int32_t i = 0; i <= parts; i++) cuts[i] = (int32_t)(total * i / parts);
    return parts;
}

/* Decodes `data` into *fg (zeroed first). Returns 0, or -1 when out of memory. */
static inline int fuzz_graph_decode(const uint8_t *data, size_t size, fuzz_graph *fg) {
    memset(fg, 0, sizeof *fg);
    fuzz_reader r = {data, size};
    int32_t nl = 1 + fuzz_u8(&r) % FUZZ_MAX_LAYERS;
    for (int32_t li = 0; li < nl; li++) {
        coacto_layer_desc *l = &fg->layers[li];
        l->op = (int32_t)(fuzz_u8(&r) % 18) - 1;
        l->n_inputs = (int32_t)(fuzz_u8(&r) % 10) - 1;
        for (int32_t i = 0; i < l->n_inputs && i < 8; i++)
            l->inputs[i] = (int32_t)(fuzz_u8(&r) % (uint32_t)(li + 2)) - 1;
        l->n = fuzz_dim(&r);
        l->c = fuzz_dim(&r);
        l->h = fuzz_dim(&r);
        l->w = fuzz_dim(&r);
        int k = fuzz_u8(&r) % 33;
        for (int i = 0; i < k; i++) l->iparams[i] = fuzz_small(&r);
        k = fuzz_u8(&r) % 9;
        for (int i = 0; i < k; i++) l->fparams[i] = fuzz_real(&r);
        uint8_t mask = fuzz_u8(&r);
        for (int a = 0; a < 4; a++) {
            if (!(mask & (1u << a))) continue;
            l->array_offset[a] = (int64_t)fuzz_small(&r) * 64;
            l->array_size[a] = (int64_t)fuzz_small(&r) * 4;
        }
        l->flags = fuzz_u8(&r) & 1;
    }

    int64_t blob_size = (int64_t)fuzz_small(&r) * 64;
    if (blob_size > FUZZ_MAX_BLOB) blob_size = FUZZ_MAX_BLOB;
    uint8_t pattern[255];
    int plen = fuzz_u8(&r);
    for (int i = 0; i < plen; i++) pattern[i] = fuzz_u8(&r);
    fg->blob = malloc(blob_size > 0 ? (size_t)blob_size : 1);
    if (!fg->blob) return -1;
    for (int64_t i = 0; i < blob_size; i++) fg->blob[i] = plen ? pattern[i % plen] : 0;

    uint8_t mode = fuzz_u8(&r);
    int32_t nt = 0;
    if (!(mode & 1)) {
        for (int32_t li = 0; li < nl; li++) {
            const coacto_layer_desc *l = &fg->layers[li];
            int32_t ccuts[5], rcuts[5];
            int32_t cp = fuzz_cuts(fuzz_columns(l->n, l->h, l->w), 1 + fuzz_u8(&r) % 4, ccuts);
            int32_t rp = fuzz_cuts(l->c, 1 + fuzz_u8(&r) % 4, rcuts);
            for (int32_t i = 0; i < cp; i++)
                for (int32_t j = 0; j < rp && nt < FUZZ_MAX_TILES; j++, nt++) {
                    fg->tile_layer[nt] = li;
                    int32_t *b = &fg->bounds[4 * nt];
                    b[0] = ccuts[i], b[1] = ccuts[i + 1], b[2] = rcuts[j], b[3] = rcuts[j + 1];
                }
        }
    } else {
        nt = 1 + fuzz_u8(&r) % 64;
        for (int32_t t = 0; t < nt; t++) {
            fg->tile_layer[t] = fuzz_u8(&r) % (uint32_t)(nl + 1);
            for (int i = 0; i < 4; i++) fg->bounds[4 * t + i] = fuzz_small(&r);
        }
    }

    /* Dependencies: a tile's candidate parents are the earlier tiles of the layers its layer
     * reads (what the validator accepts); a corruption below can point elsewhere. */
    fg->parents = calloc(FUZZ_MAX_EDGES, sizeof(int32_t));
    if (!fg->parents) return -1;
    int32_t ne = 0;
    for (int32_t t = 0; t < nt; t++) {
        fg->offsets[t] = ne;
        int32_t li = fg->tile_layer[t];
        if (li < 0 || li >= nl) continue;
        const coacto_layer_desc *l = &fg->layers[li];
        for (int32_t p = 0; p < t && ne < FUZZ_MAX_EDGES; p++) {
            int reads = 0;
            for (int i = 0; i < l->n_inputs && i < 8; i++) reads |= l->inputs[i] == fg->tile_layer[p];
            if (!reads) continue;
            if ((mode & 2) && !(fuzz_u8(&r) & 1)) continue;
            fg->parents[ne++] = p;
        }
    }
    fg->offsets[nt] = ne;

    int n_corrupt = fuzz_u8(&r) % 8;
    for (int i = 0; i < n_corrupt; i++) {
        int which = fuzz_u8(&r) % 5;
        uint32_t at = fuzz_u8(&r) | (uint32_t)fuzz_u8(&r) << 8;
        int32_t v = fuzz_small(&r);
        switch (which) {
        case 0: fg->tile_layer[at % (uint32_t)nt] = v; break;
        case 1: fg->bounds[at % (uint32_t)(4 * nt)] = v; break;
        /* an offset beyond the parents held is clamped: the array must hold what it claims */
        case 2: fg->offsets[at % (uint32_t)(nt + 1)] = fuzz_clamp(v, INT32_MIN, FUZZ_MAX_EDGES); break;
        case 3: if (ne) fg->parents[at % (uint32_t)ne] = v; break;
        default: fg->layers[at % (uint32_t)nl].flags ^= COACTO_LAYER_KEEP; break;
        }
    }

    coacto_graph_desc *d = &fg->desc;
    d->n_layers = nl;
    d->layers = fg->layers;
    d->n_tiles = nt;
    d->tile_layer = fg->tile_layer;
    d->tile_bounds = fg->bounds;
    d->parent_offsets = fg->offsets;
    d->parents = fg->parents;
    d->blob = fg->blob;
    d->blob_size = blob_size;
    d->blob_reclaimable = 0;
    return 0;
}

/* Validates the decoded graph and, when accepted and small, runs one inference on it (inputs of
 * small integers; what an op computes is not checked, only that it stays inside its buffers and
 * ends). A graph without an INPUT layer is not run: its inference starts with the first input or
 * put_tile, and none comes.
 * `rt`: a runtime, or NULL to validate only. Returns the status of coacto_graph_create, whose
 * message goes to err (may be NULL). */
static inline coacto_status fuzz_graph_run(const uint8_t *data, size_t size, coacto_runtime *rt,
                                           char *err, size_t err_size) {
    fuzz_graph *fg = malloc(sizeof *fg);
    if (!fg) return COACTO_ERR_OUT_OF_MEMORY;
    if (fuzz_graph_decode(data, size, fg) != 0) {
        fuzz_graph_free(fg);
        free(fg);
        return COACTO_ERR_OUT_OF_MEMORY;
    }
    coacto_graph *g = NULL;
    coacto_status st = coacto_graph_create(&fg->desc, &g, err, err_size);
    if (st == COACTO_OK && rt) {
        int64_t total = 0;
        int has_input = 0;
        for (int32_t li = 0; li < fg->desc.n_layers; li++) {
            const coacto_layer_desc *l = &fg->layers[li];
            total += (int64_t)l->n * l->c * l->h * l->w;
            has_input |= l->op == COACTO_OP_INPUT;
        }
        coacto_inference *inf = NULL;
        if (has_input && total <= FUZZ_MAX_RUN_FLOATS && fg->desc.blob_size <= FUZZ_MAX_RUN_BLOB &&
            coacto_inference_create(rt, g, &inf) == COACTO_OK) {
            float *input = malloc(sizeof(float) * (size_t)(total ? total : 1));
            for (int64_t i = 0; input && i < total; i++) input[i] = (float)(i % 7) - 3.0f;
            for (int32_t li = 0; input && li < fg->desc.n_layers; li++) {
                const coacto_layer_desc *l = &fg->layers[li];
                if (l->op == COACTO_OP_INPUT)
                    coacto_inference_set_input(inf, li, input, (int64_t)l->n * l->c * l->h * l->w);
            }
            free(input);
            if (coacto_inference_wait(inf, FUZZ_RUN_TIMEOUT_S) == COACTO_ERR_TIMEOUT) {
                fprintf(stderr, "an accepted graph's inference did not end in %.0f s\n",
                        FUZZ_RUN_TIMEOUT_S);
                abort();
            }
            coacto_inference_destroy(inf);
        }
    }
    coacto_graph_destroy(g);
    fuzz_graph_free(fg);
    free(fg);
    return st;
}
#endif
