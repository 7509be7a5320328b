/* Tile graph load: validate a coacto_graph_desc completely (it may come from a corrupt or hostile
 * file), copy what the runtime needs, derive children, depths and buffer lifetimes. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ops_internal.h"
#include "ring.h"
#include "runtime_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define COACTO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COACTO_ASAN 1
#endif
#endif
#ifdef COACTO_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define MAX_LAYERS (1 << 20)
#define MAX_TILES (1 << 26)
#define MAX_EDGES ((int64_t)1 << 28)
#define MAX_LAYER_FLOATS ((int64_t)1 << 31)

double coacto_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *coacto_aligned_alloc(size_t bytes) {
    size_t rounded = (bytes + COACTO_CACHE_LINE - 1) / COACTO_CACHE_LINE * COACTO_CACHE_LINE;
    if (rounded == 0) rounded = COACTO_CACHE_LINE;
    return aligned_alloc(COACTO_CACHE_LINE, rounded);
}

int64_t tile_floats(const coacto_graph *g, int32_t tile) {
    const int32_t *b = &g->tile_bounds[4 * (size_t)tile];
    return (int64_t)(b[1] - b[0]) * (b[3] - b[2]);
}

void tile_copy_out(const coacto_graph *g, int32_t tile, const float *layer_buf, float *dst) {
    const int32_t *b = &g->tile_bounds[4 * (size_t)tile];
    size_t rows = (size_t)(b[3] - b[2]), c = (size_t)g->layers[g->tile_layer[tile]].c;
    for (int32_t col = b[0]; col < b[1]; col++)
        memcpy(dst + (size_t)(col - b[0]) * rows, layer_buf + (size_t)col * c + (size_t)b[2],
               rows * sizeof(float));
}

void tile_copy_in(const coacto_graph *g, int32_t tile, const float *src, float *layer_buf) {
    const int32_t *b = &g->tile_bounds[4 * (size_t)tile];
    size_t rows = (size_t)(b[3] - b[2]), c = (size_t)g->layers[g->tile_layer[tile]].c;
    for (int32_t col = b[0]; col < b[1]; col++)
        memcpy(layer_buf + (size_t)col * c + (size_t)b[2], src + (size_t)(col - b[0]) * rows,
               rows * sizeof(float));
}

/* ---------------------------------------------------------------- activation arena
 *
 * Layer buffers come from one mapped region per graph, first fit at the lowest address, freed
 * blocks coalesced. A buffer is allocated when its layer's first tile runs and freed when its
 * last reader completes, so a layer's output lands in memory freed moments before by the layers
 * just computed: memory still in the caches, written without fetching it from DRAM first. (Reusing
 * buffers by exact size would give each layer the memory it had in the previous inference, which
 * an app's other work between two inferences evicts; docs/PERFORMANCE.md has the figures.) The
 * region is reserved at the size of every layer's buffer together (address space only: pages
 * become resident when first written, and the lowest-address-first policy keeps the touched part
 * near the peak of the live buffers). Concurrent inferences of one graph that outgrow it get
 * further regions of the same size. */

#define ARENA_ALIGN ((int64_t)COACTO_CACHE_LINE)

static int64_t arena_round(int64_t bytes) {
    return bytes <= 0 ? ARENA_ALIGN : (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

static int64_t page_size(void) {
    int64_t page = (int64_t)sysconf(_SC_PAGESIZE);
    return page > 0 ? page : 4096;
}

static int64_t page_round(int64_t bytes) {
    return (bytes + page_size() - 1) / page_size() * page_size();
}

#ifdef COACTO_ASAN
/* Free blocks are poisoned, so a read of a freed buffer is reported as with malloc. */
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (size_t)(n))
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (size_t)(n))
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Inserts a free block at index i of the (address-ordered) free list. */
static int arena_insert(coacto_graph *g, int32_t i, char *ptr, int64_t bytes, int32_t region) {
    uint32_t head = 0; /* a ring that starts at 0 is a plain array */
    if (!ring_reserve((void **)&g->free_blocks, &g->cap_free, &head, (uint32_t)g->n_free,
                      sizeof *g->free_blocks, 64))
        return 0;
    memmove(&g->free_blocks[i + 1], &g->free_blocks[i], sizeof *g->free_blocks * (size_t)(g->n_free - i));
    g->free_blocks[i] = (struct arena_block){ptr, bytes, region};
    g->n_free++;
    return 1;
}

static void arena_remove(coacto_graph *g, int32_t i) {
    memmove(&g->free_blocks[i], &g->free_blocks[i + 1], sizeof *g->free_blocks * (size_t)(g->n_free - i - 1));
    g->n_free--;
}

/* Maps one more region of at least `bytes`; its whole extent becomes a free block. */
static int arena_grow(coacto_graph *g, int64_t bytes) {
    int64_t want = 0;
    for (int32_t li = 0; li < g->n_layers; li++)
        want += arena_round(g->layer_floats[li] * (int64_t)sizeof(float));
    if (want < bytes) want = bytes;
    want = page_round(want);
    uint32_t head = 0;
    if (!ring_reserve((void **)&g->regions, &g->cap_regions, &head, (uint32_t)g->n_regions,
                      sizeof *g->regions, 4))
        return 0;
    void *p = mmap(NULL, (size_t)want, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return 0;
    int32_t region = g->n_regions;
    int32_t at = g->n_free;
    while (at > 0 && g->free_blocks[at - 1].ptr > (char *)p) at--;
    if (!arena_insert(g, at, p, want, region)) {
        munmap(p, (size_t)want);
        return 0;
    }
    g->regions[g->n_regions++] = (struct arena_region){p, want, 0};
    ARENA_POISON(p, want);
    return 1;
}

/* The start of the lowest free block of at least `need` bytes, taken; NULL when none is. */
static char *arena_take(coacto_graph *g, int64_t need) {
    for (int32_t i = 0; i < g->n_free; i++) {
        struct arena_block *b = &g->free_blocks[i];
        if (b->bytes < need) continue;
        char *ptr = b->ptr;
        struct arena_region *r = &g->regions[b->region];
        if (ptr + need - r->base > r->touched) r->touched = ptr + need - r->base;
        b->ptr += need;
        b->bytes -= need;
        if (b->bytes == 0) arena_remove(g, i);
        return ptr;
    }
    return NULL;
}

float *graph_buffer_get(coacto_graph *g, int64_t bytes) {
    int64_t need = arena_round(bytes);
    pthread_mutex_lock(&g->cache_mu);
    char *ptr = arena_take(g, need);
    if (!ptr && arena_grow(g, need)) ptr = arena_take(g, need);
    if (ptr) {
        g->live_bytes += need;
        ARENA_UNPOISON(ptr, need);
    }
    pthread_mutex_unlock(&g->cache_mu);
    return (float *)ptr;
}

void graph_buffer_put(coacto_graph *g, float *buf, int64_t bytes) {
    if (!buf) return;
    int64_t size = arena_round(bytes);
    char *ptr = (char *)buf;
    pthread_mutex_lock(&g->cache_mu);
    int32_t region = 0;
    while (region < g->n_regions && !(ptr >= g->regions[region].base &&
                                       ptr < g->regions[region].base + g->regions[region].bytes))
        region++;
    int32_t i = 0; /* the first free block after ptr */
    while (i < g->n_free && g->free_blocks[i].ptr < ptr) i++;
    struct arena_block *prev = i > 0 ? &g->free_blocks[i - 1] : NULL;
    struct arena_block *next = i < g->n_free ? &g->free_blocks[i] : NULL;
    int join_prev = prev && prev->region == region && prev->ptr + prev->bytes == ptr;
    int join_next = next && next->region == region && ptr + size == next->ptr;
    ARENA_POISON(ptr, size);
    if (join_prev && join_next) {
        prev->bytes += size + next->bytes;
        arena_remove(g, i);
    } else if (join_prev) {
        prev->bytes += size;
    } else if (join_next) {
        next->ptr = ptr;
        next->bytes += size;
    } else if (!arena_insert(g, i, ptr, size, region)) {
        /* Out of memory for the free list: the block stays unusable until the graph is freed
         * (its region is unmapped then), which is all that is lost. */
    }
    g->live_bytes -= size;
    pthread_mutex_unlock(&g->cache_mu);
}

int32_t coacto_graph_layer_alias(const coacto_graph *g, int32_t li) {
    if (!g || li < 0 || li >= g->n_layers) return -2;
    return g->layer_alias[li];
}

int64_t coacto_graph_release_buffers(coacto_graph *g) {
    if (!g) return 0;
    int64_t freed = 0;
    pthread_mutex_lock(&g->cache_mu);
    if (g->live_bytes == 0) { /* nothing handed out: the regions go back whole */
        for (int32_t r = 0; r < g->n_regions; r++) {
            munmap(g->regions[r].base, (size_t)g->regions[r].bytes);
            freed += g->regions[r].bytes;
        }
        g->n_regions = 0;
        g->n_free = 0;
    } else { /* the pages of free blocks go back; the addresses stay reserved */
        const uintptr_t page = (uintptr_t)page_size();
        for (int32_t i = 0; i < g->n_free; i++) {
            const uintptr_t start = (uintptr_t)g->free_blocks[i].ptr;
            const uintptr_t lo = (start + page - 1) / page * page;
            const uintptr_t hi = (start + (uintptr_t)g->free_blocks[i].bytes) / page * page;
            if (hi > lo && madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED) == 0) freed += (int64_t)(hi - lo);
        }
    }
    pthread_mutex_unlock(&g->cache_mu);
    return freed;
}

coacto_status coacto_graph_arena_bytes(coacto_graph *g, int64_t *reserved, int64_t *touched) {
    if (!g || !reserved || !touched) return COACTO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g->cache_mu);
    *reserved = *touched = 0;
    for (int32_t r = 0; r < g->n_regions; r++) {
        *reserved += g->regions[r].bytes;
        *touched += g->regions[r].touched;
    }
    pthread_mutex_unlock(&g->cache_mu);
    return COACTO_OK;
}

int64_t coacto_graph_arena_prefault(coacto_graph *g, int64_t bytes) {
    if (!g || bytes <= 0) return 0;
    const int64_t page = page_size();
    int64_t covered = 0;
    pthread_mutex_lock(&g->cache_mu);
    if (g->n_regions == 0 && !arena_grow(g, 0)) {
        pthread_mutex_unlock(&g->cache_mu);
        return 0;
    }
    /* Only free blocks are written (a byte per page): their contents mean nothing, while blocks
     * handed out hold live data (or will, once their tile writes them). */
    for (int32_t i = 0; i < g->n_free; i++) {
        const struct arena_block *b = &g->free_blocks[i];
        struct arena_region *r = &g->regions[b->region];
        /* `bytes` counts the regions in the order they were mapped */
        int64_t limit = bytes;
        for (int32_t k = 0; k < b->region; k++) limit -= g->regions[k].bytes;
        if (limit > r->bytes) limit = r->bytes;
        const int64_t from = ((b->ptr - r->base) + page - 1) / page * page;
        int64_t to = b->ptr + b->bytes - r->base;
        if (to > limit) to = limit;
        if (to <= from) continue;
        ARENA_UNPOISON(r->base + from, to - from);
        for (int64_t at = from; at < to; at += page) ((volatile char *)r->base)[at] = 0;
        ARENA_POISON(r->base + from, to - from);
        covered += to - from;
        if (to > r->touched) r->touched = to;
    }
    pthread_mutex_unlock(&g->cache_mu);
    return covered;
}

static void graph_free(coacto_graph *g) {
    if (!g) return;
    for (int32_t r = 0; r < g->n_regions; r++) munmap(g->regions[r].base, (size_t)g->regions[r].bytes);
    free(g->regions);
    free(g->free_blocks);
    pthread_mutex_destroy(&g->cache_mu);
    if (g->layers && !g->weights_of) {
        for (int32_t i = 0; i < g->n_layers; i++) op_release(&g->layers[i]);
    }
    free(g->layers);
    free(g->layer_flags);
    free(g->layer_first_tile);
    free(g->layer_uses);
    free(g->layer_input_off);
    free(g->layer_input_ids);
    free(g->layer_floats);
    free(g->layer_alias);
    free(g->tile_layer);
    free(g->tile_bounds);
    free(g->parent_off);
    free(g->parents);
    free(g->child_off);
    free(g->children);
    free(g->tile_bucket);
    free(g->main_parent);
    free(g->sources);
    free(g->work);
    free(g->work_old);
    free(g->blob);
    free(g->layer_ns);
    free(g->trace_t0);
    free(g->trace_t1);
    free(g->trace_worker);
    graph_release(g->weights_of);
    free(g);
}

void graph_release(coacto_graph *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) graph_free(g);
}

void coacto_graph_destroy(coacto_graph *g) { graph_release(g); }

int32_t coacto_graph_tile_count(const coacto_graph *g) { return g ? g->n_tiles : 0; }

coacto_status coacto_graph_set_profiling(coacto_graph *g, int32_t enable) {
    if (!g) return COACTO_ERR_INVALID_ARGUMENT;
    if (enable) {
        for (int32_t li = 0; li < g->n_layers; li++) atomic_store(&g->layer_ns[li], 0);
        for (int32_t t = 0; t < g->n_tiles; t++) {
            g->trace_t0[t] = g->trace_t1[t] = 0.0;
            g->trace_worker[t] = -1;
        }
    }
    atomic_store(&g->profiling, enable ? 1 : 0);
    return COACTO_OK;
}

coacto_status coacto_graph_layer_seconds(const coacto_graph *g, double *seconds, int32_t n) {
    if (!g || !seconds || n != g->n_layers) return COACTO_ERR_INVALID_ARGUMENT;
    for (int32_t li = 0; li < n; li++) seconds[li] = 1e-9 * (double)atomic_load(&g->layer_ns[li]);
    return COACTO_OK;
}

coacto_status coacto_graph_tile_trace(const coacto_graph *g, double *t0, double *t1,
                                      int32_t *worker, int32_t n) {
    if (!g || !t0 || !t1 || !worker || n != g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
    memcpy(t0, g->trace_t0, (size_t)n * sizeof(double));
    memcpy(t1, g->trace_t1, (size_t)n * sizeof(double));
    memcpy(worker, g->trace_worker, (size_t)n * sizeof(int32_t));
    return COACTO_OK;
}

/* The whole pages inside [p, p + n) of a read-only file mapping go back to the page cache
 * (they are read from the file again if touched). */
static void drop_mapped_pages(const uint8_t *p, size_t n) {
    static long page;
    if (!page) page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static coacto_status load_layers(coacto_graph *g, const coacto_graph_desc *d, char *err,
                                 size_t es) {
    for (int32_t li = 0; li < d->n_layers; li++) {
        const coacto_layer_desc *ld = &d->layers[li];
        layer *l = &g->layers[li];
        if (ld->op < 0 || ld->op >= COACTO_OP_COUNT)
            return ops_fail(err, es, "layer %d: unknown op code %d", li, ld->op);
        if (ld->n_inputs < 0 || ld->n_inputs > COACTO_MAX_INPUTS)
            return ops_fail(err, es, "layer %d: %d inputs (0..%d allowed)", li, ld->n_inputs,
                        COACTO_MAX_INPUTS);
        if ((ld->op == COACTO_OP_INPUT) != (ld->n_inputs == 0) && ld->op != COACTO_OP_NOP)
            return ops_fail(err, es, "layer %d: input layers and only they have no inputs", li);
        if (ld->n < 1 || ld->c < 1 || ld->h < 1 || ld->w < 1)
            return ops_fail(err, es, "layer %d: non-positive dims", li);
        /* one factor at a time: four int32 dims overflow int64 (ops_mul gives -1 instead) */
        int64_t floats = ops_mul(ops_mul(ops_mul(ld->n, ld->c), ld->h), ld->w);
        int64_t cols = ops_mul(ops_mul(ld->n, ld->h), ld->w);
        if (floats < 0 || floats > MAX_LAYER_FLOATS || cols < 0 || cols > INT32_MAX)
            return ops_fail(err, es, "layer %d: dims %dx%dx%dx%d (NCHW) are too large (at most "
                            "%lld values, %d columns)", li, ld->n, ld->c, ld->h, ld->w,
                            (long long)MAX_LAYER_FLOATS, INT32_MAX);
        g->layer_floats[li] = floats;
        g->layer_flags[li] = ld->flags;
        memset(l, 0, sizeof *l);
        l->op = ld->op;
        l->n_inputs = ld->n_inputs;
        l->n = ld->n;
        l->c = ld->c;
        l->h = ld->h;
        l->w = ld->w;
        memcpy(l->iparams, ld->iparams, sizeof l->iparams);
        memcpy(l->fparams, ld->fparams, sizeof l->fparams);
        for (int i = 0; i < ld->n_inputs; i++) {
            int32_t p = ld->inputs[i];
            if (p < 0 || p >= li)
                return ops_fail(err, es, "layer %d: input %d refers to layer %d (must be < %d)", li,
                            i, p, li);
            l->inputs[i] = p;
            l->in_n[i] = d->layers[p].n;
            l->in_c[i] = d->layers[p].c;
            l->in_h[i] = d->layers[p].h;
            l->in_w[i] = d->layers[p].w;
        }
        for (int a = 0; a < 4; a++) {
            int64_t off = ld->array_offset[a], size = ld->array_size[a];
            if (size == 0) continue;
            if (size < 0 || off < 0 || off % COACTO_CACHE_LINE || off > d->blob_size ||
                size > d->blob_size - off)
                return ops_fail(err, es, "layer %d: array %d [%lld, +%lld) outside the blob (%lld bytes)",
                            li, a, (long long)off, (long long)size, (long long)d->blob_size);
            l->arrays[a] = d->blob + off; /* until keep_arrays copies what execution needs */
            l->array_bytes[a] = size;
        }
        char op_err[256] = {0};
        coacto_status st = op_prepare(l, op_err, sizeof op_err);
        if (st != COACTO_OK) {
            if (st == COACTO_ERR_OUT_OF_MEMORY) return st;
            return ops_fail(err, es, "layer %d: %s", li, op_err[0] ? op_err : "invalid parameters");
        }
        if (d->blob_reclaimable)
            for (int a = 0; a < 4; a++)
                if (l->arrays[a] && (l->arrays_consumed & (1u << a)))
                    drop_mapped_pages(l->arrays[a], (size_t)l->array_bytes[a]);
    }
    return COACTO_OK;
}

/* The layers of a graph cut into other tiles are those of `w`, which prepared (packed) them:
 * each described layer must be the same layer, field by field, or the tiles of one would run on
 * the weights of another. */
static coacto_status share_layers(coacto_graph *g, const coacto_graph_desc *d,
                                  const coacto_graph *w, char *err, size_t es) {
    if (d->n_layers != w->n_layers)
        return ops_fail(err, es, "the graph has %d layers, the graph whose weights it shares %d",
                        d->n_layers, w->n_layers);
    for (int32_t li = 0; li < d->n_layers; li++) {
        const coacto_layer_desc *ld = &d->layers[li];
        const layer *l = &w->layers[li];
        int same = ld->op == l->op && ld->n_inputs == l->n_inputs && ld->n == l->n &&
                   ld->c == l->c && ld->h == l->h && ld->w == l->w &&
                   memcmp(ld->iparams, l->iparams, sizeof l->iparams) == 0 &&
                   memcmp(ld->fparams, l->fparams, sizeof l->fparams) == 0;
        for (int i = 0; same && i < ld->n_inputs && i < COACTO_MAX_INPUTS; i++)
            same = ld->inputs[i] == l->inputs[i];
        for (int a = 0; same && a < 4; a++) same = ld->array_size[a] == l->array_bytes[a];
        if (!same)
            return ops_fail(err, es, "layer %d differs from layer %d of the graph whose weights "
                            "it shares (another model, or other parameters)", li, li);
        g->layers[li] = *l;
        g->layer_floats[li] = w->layer_floats[li];
        g->layer_flags[li] = ld->flags;
    }
    return COACTO_OK;
}

/* Copies the arrays the executors read into one allocation the graph owns; arrays op_prepare
 * consumed (packed weights) are dropped, so a graph holds its weights once, packed. */
static coacto_status keep_arrays(coacto_graph *g, int reclaimable) {
    size_t total = 0;
    for (int32_t li = 0; li < g->n_layers; li++) {
        const layer *l = &g->layers[li];
        for (int a = 0; a < 4; a++)
            if (l->arrays[a] && !(l->arrays_consumed & (1u << a)))
                total += ops_round_up((size_t)l->array_bytes[a], COACTO_CACHE_LINE);
    }
    g->blob = coacto_aligned_alloc(total);
    if (!g->blob) return COACTO_ERR_OUT_OF_MEMORY;
    size_t off = 0;
    for (int32_t li = 0; li < g->n_layers; li++) {
        layer *l = &g->layers[li];
        for (int a = 0; a < 4; a++) {
            if (!l->arrays[a]) continue;
            if (l->arrays_consumed & (1u << a)) {
                l->arrays[a] = NULL;
                continue;
            }
            memcpy(g->blob + off, l->arrays[a], (size_t)l->array_bytes[a]);
            if (reclaimable) drop_mapped_pages(l->arrays[a], (size_t)l->array_bytes[a]);
            l->arrays[a] = g->blob + off;
            off += ops_round_up((size_t)l->array_bytes[a], COACTO_CACHE_LINE);
        }
    }
    return COACTO_OK;
}

static coacto_status load_tiles(coacto_graph *g, const coacto_graph_desc *d, char *err,
                                size_t es) {
    int32_t nt = d->n_tiles;
    int64_t *area = calloc((size_t)d->n_layers, sizeof *area);
    if (!area) return COACTO_ERR_OUT_OF_MEMORY;
    coacto_status st = COACTO_OK;
    int32_t prev = 0;
    for (int32_t t = 0; t < nt && st == COACTO_OK; t++) {
        int32_t li = d->tile_layer[t];
        if (li < 0 || li >= d->n_layers || li < prev) {
            st = ops_fail(err, es, "tile %d: layer %d out of order or out of range", t, li);
            break;
        }
        for (int32_t k = prev + 1; k <= li; k++) g->layer_first_tile[k] = t;
        prev = li;
        const int32_t *b = &d->tile_bounds[4 * (size_t)t];
        const layer *l = &g->layers[li];
        int64_t cols = (int64_t)l->n * l->h * l->w;
        if (b[0] < 0 || b[0] >= b[1] || b[1] > cols || b[2] < 0 || b[2] >= b[3] || b[3] > l->c) {
            st = ops_fail(err, es, "tile %d: bounds [%d,%d)x[%d,%d) outside layer %d (%lld x %d)", t,
                      b[0], b[1], b[2], b[3], li, (long long)cols, l->c);
            break;
        }
        area[li] += (int64_t)(b[1] - b[0]) * (b[3] - b[2]);
        g->tile_layer[t] = li;
        memcpy(&g->tile_bounds[4 * (size_t)t], b, 4 * sizeof(int32_t));
    }
    for (int32_t k = prev + 1; k <= d->n_layers; k++) g->layer_first_tile[k] = nt;
    g->layer_first_tile[0] = 0;
    for (int32_t li = 0; li < d->n_layers && st == COACTO_OK; li++) {
        if (area[li] != g->layer_floats[li])
            st = ops_fail(err, es, "layer %d: its tiles cover %lld of %lld values", li,
                      (long long)area[li], (long long)g->layer_floats[li]);
    }
    free(area);
    return st;
}

static int layer_reads(const layer *l, int32_t producer) {
    for (int i = 0; i < l->n_inputs; i++)
        if (l->inputs[i] == producer) return 1;
    return 0;
}

static coacto_status load_edges(coacto_graph *g, const coacto_graph_desc *d, char *err,
                                size_t es) {
    int32_t nt = d->n_tiles;
    if (d->parent_offsets[0] != 0) return ops_fail(err, es, "parent offsets must start at 0");
    for (int32_t t = 0; t < nt; t++) {
        if (d->parent_offsets[t + 1] < d->parent_offsets[t])
            return ops_fail(err, es, "parent offsets decrease at tile %d", t);
    }
    int64_t ne = d->parent_offsets[nt];
    if (ne > MAX_EDGES) return ops_fail(err, es, "too many dependencies (%lld)", (long long)ne);
    g->parents = malloc(sizeof(int32_t) * (size_t)(ne ? ne : 1));
    g->child_off = calloc((size_t)nt + 1, sizeof(int32_t));
    g->children = malloc(sizeof(int32_t) * (size_t)(ne ? ne : 1));
    if (!g->parents || !g->child_off || !g->children) return COACTO_ERR_OUT_OF_MEMORY;
    memcpy(g->parent_off, d->parent_offsets, sizeof(int32_t) * ((size_t)nt + 1));
    for (int32_t t = 0; t < nt; t++) {
        const layer *l = &g->layers[g->tile_layer[t]];
        if (l->op == COACTO_OP_INPUT && d->parent_offsets[t + 1] != d->parent_offsets[t])
            return ops_fail(err, es, "tile %d of an input layer has parents", t);
        for (int32_t e = d->parent_offsets[t]; e < d->parent_offsets[t + 1]; e++) {
            int32_t p = d->parents[e];
            if (p < 0 || p >= t) return ops_fail(err, es, "tile %d: parent %d (must be < %d)", t, p, t);
            if (!layer_reads(l, g->tile_layer[p]))
                return ops_fail(err, es, "tile %d: parent %d is in layer %d, not an input of layer %d",
                            t, p, g->tile_layer[p], g->tile_layer[t]);
            g->parents[e] = p;
            g->child_off[p + 1]++;
        }
    }
    for (int32_t t = 0; t < nt; t++) g->child_off[t + 1] += g->child_off[t];
    int32_t *fill = malloc(sizeof(int32_t) * ((size_t)nt + 1));
    if (!fill) return COACTO_ERR_OUT_OF_MEMORY;
    memcpy(fill, g->child_off, sizeof(int32_t) * ((size_t)nt + 1));
    for (int32_t t = 0; t < nt; t++)
        for (int32_t e = g->parent_off[t]; e < g->parent_off[t + 1]; e++)
            g->children[fill[g->parents[e]]++] = t;
    free(fill);
    return COACTO_OK;
}

static int64_t overlap(int32_t a0, int32_t a1, int32_t b0, int32_t b1) {
    int32_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? (int64_t)hi - lo : 0;
}

/* A tile's main parent: among its parents in the layer's first input, the one whose block covers
 * the most of the tile's own block (the same columns, and the same rows for ops whose row block
 * reads the same rows: depthwise convolutions, pooling, element-wise ops), when exactly one
 * covers the most; otherwise -1. Comparable only between layers of as many columns, and not
 * for index maps (gather, concat, matmul, embedding): a convolution's column block mostly reads
 * the same block of the layer before (the rest is its window's halo), a depthwise row block the
 * same channels. The runtime prefers to run a tile on the worker that computed its main parent,
 * whose cache holds that input. */
static coacto_status derive_main_parents(coacto_graph *g) {
    int32_t nt = g->n_tiles;
    g->main_parent = malloc(sizeof(int32_t) * (size_t)nt);
    if (!g->main_parent) return COACTO_ERR_OUT_OF_MEMORY;
    for (int32_t t = 0; t < nt; t++) {
        g->main_parent[t] = -1;
        const layer *l = &g->layers[g->tile_layer[t]];
        if (l->n_inputs < 1) continue;
        const int32_t src = l->inputs[0];
        const layer *s = &g->layers[src];
        if ((int64_t)s->n * s->h * s->w != (int64_t)l->n * l->h * l->w) continue;
        int rows_match = 0; /* a row block reads the same rows of the input */
        switch (l->op) {
        case COACTO_OP_GATHER: case COACTO_OP_CONCAT: case COACTO_OP_MATMUL: case COACTO_OP_EMBED:
        case COACTO_OP_ATTENTION:
            continue; /* index maps: a column or row is not the input's column or row */
        case COACTO_OP_CONV: /* depthwise; any other convolution reads every input row */
            rows_match = l->iparams[10] > 1 && l->iparams[10] == l->c && s->c == l->c;
            break;
        case COACTO_OP_POOL: case COACTO_OP_BINARY: case COACTO_OP_AFFINE: case COACTO_OP_WHERE:
            rows_match = s->c == l->c;
            break;
        default:
            break;
        }
        const int32_t *b = &g->tile_bounds[4 * (size_t)t];
        int64_t best = 0;
        int ties = 0;
        int32_t arg = -1;
        for (int32_t e = g->parent_off[t]; e < g->parent_off[t + 1]; e++) {
            int32_t p = g->parents[e];
            if (g->tile_layer[p] != src) continue;
            const int32_t *pb = &g->tile_bounds[4 * (size_t)p];
            int64_t score = overlap(b[0], b[1], pb[0], pb[1]);
            if (rows_match) score *= overlap(b[2], b[3], pb[2], pb[3]);
            if (score > best) {
                best = score;
                arg = p;
                ties = 0;
            } else if (score == best && score > 0) {
                ties++;
            }
        }
        if (!ties) g->main_parent[t] = arg;
    }
    return COACTO_OK;
}

/* Depth (longest path from a source) decides the pool column: shallower tiles first. */
static coacto_status derive_schedule(coacto_graph *g) {
    int32_t nt = g->n_tiles;
    int32_t *depth = calloc((size_t)nt, sizeof(int32_t));
    g->tile_bucket = malloc((size_t)nt);
    g->sources = malloc(sizeof(int32_t) * (size_t)nt);
    if (!depth || !g->tile_bucket || !g->sources) {
        free(depth);
        return COACTO_ERR_OUT_OF_MEMORY;
    }
    int32_t max_depth = 0;
    g->n_sources = 0;
    for (int32_t t = 0; t < nt; t++) {
        int32_t dpt = 0;
        for (int32_t e = g->parent_off[t]; e < g->parent_off[t + 1]; e++)
            if (depth[g->parents[e]] + 1 > dpt) dpt = depth[g->parents[e]] + 1;
        depth[t] = dpt;
        if (dpt > max_depth) max_depth = dpt;
        if (g->parent_off[t] == g->parent_off[t + 1] &&
            g->layers[g->tile_layer[t]].op != COACTO_OP_INPUT)
            g->sources[g->n_sources++] = t;
    }
    for (int32_t t = 0; t < nt; t++)
        g->tile_bucket[t] = (uint8_t)((int64_t)depth[t] * POOL_DEPTH_BUCKETS / (max_depth + 1));
    free(depth);
    return derive_main_parents(g);
}

/* A layer's buffer is freed when its own tiles and every tile of every layer reading it are
 * completed (a tile no consumer reads still writes into the buffer). */
static coacto_status derive_lifetimes(coacto_graph *g) {
    int32_t nl = g->n_layers;
    g->layer_input_off = calloc((size_t)nl + 1, sizeof(int32_t));
    g->layer_input_ids = malloc(sizeof(int32_t) * (size_t)nl * COACTO_MAX_INPUTS + 1);
    if (!g->layer_input_off || !g->layer_input_ids) return COACTO_ERR_OUT_OF_MEMORY;
    int32_t k = 0;
    for (int32_t li = 0; li < nl; li++) {
        const layer *l = &g->layers[li];
        int32_t ntiles = g->layer_first_tile[li + 1] - g->layer_first_tile[li];
        g->layer_uses[li] += ntiles;
        g->layer_input_off[li] = k;
        for (int i = 0; i < l->n_inputs; i++) {
            int dup = 0;
            for (int j = 0; j < i; j++) dup |= l->inputs[j] == l->inputs[i];
            if (dup) continue;
            g->layer_input_ids[k++] = l->inputs[i];
            g->layer_uses[l->inputs[i]] += ntiles;
        }
    }
    g->layer_input_off[nl] = k;
    g->n_output_tiles = 0;
    for (int32_t li = 0; li < nl; li++)
        if (g->layer_flags[li] & COACTO_LAYER_KEEP)
            g->n_output_tiles += g->layer_first_tile[li + 1] - g->layer_first_tile[li];
    return COACTO_OK;
}

/* 1 when tile `anc` is an ancestor of tile t (parents come before their children, so the search
 * goes no lower than anc). seen: n_tiles stamps, `stamp` new for each search; stack: n_tiles. */
static int is_ancestor(const coacto_graph *g, int32_t anc, int32_t t, int32_t *seen,
                       int32_t stamp, int32_t *stack) {
    int32_t top = 0;
    stack[top++] = t;
    while (top > 0) {
        const int32_t u = stack[--top];
        for (int32_t e = g->parent_off[u]; e < g->parent_off[u + 1]; e++) {
            const int32_t p = g->parents[e];
            if (p == anc) return 1;
            if (p < anc || seen[p] == stamp) continue;
            seen[p] = stamp;
            stack[top++] = p;
        }
    }
    return 0;
}

static int32_t alias_root(const coacto_graph *g, int32_t li) {
    while (g->layer_alias[li] >= 0) li = g->layer_alias[li];
    return li;
}

/* Which layers may write their output into their residual input's buffer
 * (coacto_inference_set_inplace): a convolution that writes each value once after reading the
 * residual there (conv_writes_output_once), whose residual R has the same size, is computed
 * here (not an input) and not kept as an output, shares no buffer with the layer's other input,
 * and whose every tile T comes after every other reader of the part of R it overwrites: each tile
 * that reads a tile of R that T reads (T's parents in R) is T's ancestor or a tile of T's own
 * layer (which reads R only where it writes, as T does). Then when T writes, nothing still needs
 * those values. */
static coacto_status derive_aliases(coacto_graph *g) {
    const int32_t nl = g->n_layers, nt = g->n_tiles;
    g->layer_alias = malloc(sizeof(int32_t) * (size_t)nl);
    if (!g->layer_alias) return COACTO_ERR_OUT_OF_MEMORY;
    for (int32_t li = 0; li < nl; li++) g->layer_alias[li] = -1;
    int32_t *seen = NULL, *stack = NULL, stamp = 0;
    for (int32_t li = 0; li < nl; li++) {
        const layer *l = &g->layers[li];
        if (!conv_writes_output_once(l)) continue;
        const int32_t r = l->inputs[1];
        if (r == li || g->layers[r].op == COACTO_OP_INPUT || (g->layer_flags[r] & COACTO_LAYER_KEEP) ||
            g->layer_floats[r] != g->layer_floats[li] || alias_root(g, l->inputs[0]) == alias_root(g, r))
            continue;
        if (!seen) {
            seen = calloc((size_t)nt, sizeof(int32_t));
            stack = malloc(sizeof(int32_t) * (size_t)nt);
            if (!seen || !stack) {
                free(seen), free(stack);
                return COACTO_ERR_OUT_OF_MEMORY;
            }
        }
        int safe = 1;
        for (int32_t t = g->layer_first_tile[li]; safe && t < g->layer_first_tile[li + 1]; t++)
            for (int32_t e = g->parent_off[t]; safe && e < g->parent_off[t + 1]; e++) {
                const int32_t p = g->parents[e];
                if (g->tile_layer[p] != r) continue;
                for (int32_t c = g->child_off[p]; safe && c < g->child_off[p + 1]; c++) {
                    const int32_t u = g->children[c];
                    if (g->tile_layer[u] == li) continue;
                    safe = u < t && is_ancestor(g, u, t, seen, ++stamp, stack);
                }
            }
        if (safe) g->layer_alias[li] = r;
    }
    free(seen);
    free(stack);
    return COACTO_OK;
}

static coacto_status graph_create(const coacto_graph_desc *d, coacto_graph *weights,
                                  coacto_graph **out, char *err, size_t es) {
    if (err && es) err[0] = 0;
    if (!out) return COACTO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!d || !d->layers || !d->tile_layer || !d->tile_bounds || !d->parent_offsets ||
        (!weights && !d->blob && d->blob_size > 0))
        return ops_fail(err, es, "graph description has NULL arrays");
    if (d->n_layers < 1 || d->n_layers > MAX_LAYERS || d->n_tiles < 1 || d->n_tiles > MAX_TILES ||
        d->blob_size < 0)
        return ops_fail(err, es, "graph has %d layers and %d tiles (1..%d and 1..%d allowed)",
                    d->n_layers, d->n_tiles, MAX_LAYERS, MAX_TILES);
    /* a graph of inputs only (a model whose outputs are its inputs) has no dependencies */
    if (!d->parents && d->parent_offsets[d->n_tiles] != 0)
        return ops_fail(err, es, "graph description has NULL arrays");
    coacto_graph *g = calloc(1, sizeof *g);
    if (!g) return COACTO_ERR_OUT_OF_MEMORY;
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->cache_mu, NULL);
    g->n_layers = d->n_layers;
    g->n_tiles = d->n_tiles;
    size_t nl = (size_t)d->n_layers, nt = (size_t)d->n_tiles;
    g->layers = calloc(nl, sizeof(layer));
    g->layer_flags = calloc(nl, sizeof(int32_t));
    g->layer_first_tile = calloc(nl + 1, sizeof(int32_t));
    g->layer_uses = calloc(nl, sizeof(int32_t));
    g->layer_floats = calloc(nl, sizeof(int64_t));
    g->layer_ns = calloc(nl, sizeof *g->layer_ns);
    g->trace_t0 = calloc(nt ? nt : 1, sizeof(double));
    g->trace_t1 = calloc(nt ? nt : 1, sizeof(double));
    g->trace_worker = malloc((nt ? nt : 1) * sizeof(int32_t));
    g->tile_layer = malloc(nt * sizeof(int32_t));
    g->tile_bounds = malloc(nt * 4 * sizeof(int32_t));
    g->parent_off = malloc((nt + 1) * sizeof(int32_t));
    if (g->trace_worker)
        for (size_t t = 0; t < nt; t++) g->trace_worker[t] = -1;
    coacto_status st = COACTO_OK;
    if (!g->layers || !g->layer_flags || !g->layer_first_tile || !g->layer_uses ||
        !g->layer_floats || !g->layer_ns || !g->tile_layer ||
        !g->trace_t0 || !g->trace_t1 || !g->trace_worker || !g->tile_bounds || !g->parent_off)
        st = COACTO_ERR_OUT_OF_MEMORY;
    if (st == COACTO_OK && weights) {
        /* before the first layer is copied: a failure frees g without releasing its layers */
        atomic_fetch_add(&weights->refs, 1);
        g->weights_of = weights;
        st = share_layers(g, d, weights, err, es);
    } else if (st == COACTO_OK) {
        st = load_layers(g, d, err, es);
        if (st == COACTO_OK) st = keep_arrays(g, d->blob_reclaimable);
    }
    if (st == COACTO_OK) st = load_tiles(g, d, err, es);
    if (st == COACTO_OK) {
        for (int32_t li = 0; li < g->n_layers; li++)
            if (g->layer_first_tile[li + 1] == g->layer_first_tile[li]) {
                st = ops_fail(err, es, "layer %d has no tiles", li);
                break;
            }
    }
    if (st == COACTO_OK) st = load_edges(g, d, err, es);
    if (st == COACTO_OK) st = derive_schedule(g);
    if (st == COACTO_OK) st = derive_lifetimes(g);
    if (st == COACTO_OK) st = derive_aliases(g);
    if (st == COACTO_OK)
        for (int32_t t = 0; t < g->n_tiles; t++) {
            const layer *l = &g->layers[g->tile_layer[t]];
            const int32_t *b = &g->tile_bounds[4 * (size_t)t];
            const size_t need = l->scratch_fixed + l->scratch_per_col * (size_t)(b[1] - b[0]);
            if (need > g->scratch_max) g->scratch_max = need;
        }
    if (st != COACTO_OK) {
        if (st == COACTO_ERR_OUT_OF_MEMORY && err && es && !err[0])
            snprintf(err, es, "out of memory while loading the graph");
        graph_free(g);
        return st;
    }
    *out = g;
    return COACTO_OK;
}

coacto_status coacto_graph_create(const coacto_graph_desc *d, coacto_graph **out, char *err,
                                  size_t es) {
    return graph_create(d, NULL, out, err, es);
}

coacto_status coacto_graph_create_sharing(const coacto_graph_desc *d, coacto_graph *weights,
                                          coacto_graph **out, char *err, size_t es) {
    if (!weights) {
        if (out) *out = NULL;
        return ops_fail(err, es, "no graph to share the weights of");
    }
    /* one level: a sharing graph's layers are its weights graph's, which it holds */
    return graph_create(d, weights->weights_of ? weights->weights_of : weights, out, err, es);
}
