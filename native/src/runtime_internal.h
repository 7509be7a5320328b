/* Internal structures shared by graph.c (load, validate) and runtime.c (threads, ready pool,
 * inference state). */
#ifndef COACTO_RUNTIME_INTERNAL_H
#define COACTO_RUNTIME_INTERNAL_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "coacto.h"
#include "ops.h"

#define COACTO_CACHE_LINE 64
/* Columns of the ready pool: depth buckets, shallower first. */
#define POOL_DEPTH_BUCKETS 16
/* One more queue per row, after the depth buckets: the tiles of an inference's rest that comes
 * last (coacto_inference_compute_rest), taken only when no row holds any other ready tile. */
#define POOL_REST_QUEUE POOL_DEPTH_BUCKETS

struct coacto_graph {
    atomic_int refs;
    int32_t n_layers;
    layer *layers;
    int32_t *layer_flags;
    int32_t *layer_first_tile;     /* [n_layers + 1] */
    int32_t *layer_uses;           /* [n_layers]: own tiles + tiles of every consumer layer */
    int32_t *layer_input_off;      /* [n_layers + 1] CSR of distinct input layers */
    int32_t *layer_input_ids;
    int64_t *layer_floats;         /* [n_layers] */
    int32_t *layer_alias;          /* [n_layers]: the residual input whose buffer the layer may
                                      write its output into (derive_aliases), or -1 */
    size_t scratch_max;            /* the most scratch floats any of the graph's tiles needs */
    int32_t n_tiles;
    int32_t *tile_layer;
    int32_t *tile_bounds;          /* col0, col1, row0, row1 */
    int32_t *parent_off, *parents;
    int32_t *child_off, *children;
    uint8_t *tile_bucket;          /* depth bucket of the ready pool */
    int32_t *main_parent;          /* the parent holding most of a tile's input, or -1 */
    int32_t n_output_tiles;        /* tiles of KEEP layers: their completion ends an inference */
    double *work;                  /* coacto_graph_set_work, or NULL */
    double *work_old;              /* the array a later set_work replaced (freed with the graph) */
    int32_t n_sources;             /* non-INPUT tiles without parents */
    int32_t *sources;
    uint8_t *blob;                 /* the arrays executors read (64-byte aligned copies); arrays
                                      that prepare packed (weights) are not kept twice */
    struct coacto_graph *weights_of; /* coacto_graph_create_sharing: the graph whose prepared
                                        layers (packed weights, blob) these layers are; held by
                                        a reference, never released through this graph */
    /* Per-layer busy time of computed tiles (coacto_graph_set_profiling), nanoseconds. */
    atomic_int profiling;
    _Atomic int64_t *layer_ns;     /* [n_layers] */
    /* While profiling: when and on which worker each tile last ran (coacto_graph_tile_trace). */
    double *trace_t0, *trace_t1;   /* [n_tiles], coacto_now_seconds */
    int32_t *trace_worker;         /* [n_tiles], -1: not computed since profiling was enabled */
    /* The activation arena (graph.c): mapped regions, the free blocks in address order, and the
     * bytes handed out. */
    pthread_mutex_t cache_mu;
    struct arena_region *regions;
    int32_t n_regions;
    uint32_t cap_regions;
    struct arena_block *free_blocks;
    int32_t n_free;
    uint32_t cap_free;
    int64_t live_bytes;
};

struct arena_region {
    char *base;
    int64_t bytes;
    int64_t touched; /* the end of the furthest block ever handed out or prefaulted, from base
                        (not lowered when release_buffers gives pages back) */
};

struct arena_block {
    char *ptr;
    int64_t bytes;
    int32_t region;
};

typedef struct task {
    coacto_inference *inf;
    int32_t tile;
} task;

typedef struct task_fifo {
    task *items;
    uint32_t cap, head, count;
} task_fifo;

/* One row of the ready pool: owned by one computing thread, stolen from by the others. */
typedef struct pool_row {
    pthread_mutex_t mu;
    atomic_int count;
    task_fifo q[POOL_DEPTH_BUCKETS + 1]; /* the depth buckets, then POOL_REST_QUEUE */
} __attribute__((aligned(COACTO_CACHE_LINE))) pool_row;

typedef struct worker {
    coacto_runtime *rt;
    int32_t index;
    atomic_int tid; /* kernel thread id, for per-thread priority */
    pthread_t thread;
    float *scratch;
    size_t scratch_cap; /* floats */
    atomic_uint progress;           /* tiles completed, spin rounds, wake-ups: a worker's pulse */
    atomic_int computing;           /* 1 inside run_chain */
    double crowded_since, moved_at, looked_at; /* see unstack (runtime.c) */
    unsigned others_seen;
    unsigned char cpus[128];        /* the CPUs it started allowed on (a cpu_set_t; runtime.c) */
    int cpus_known;
} __attribute__((aligned(COACTO_CACHE_LINE))) worker;

/* Announcements for the communication engine: an eventfd becomes readable when any is pending. */
typedef struct report_queue {
    pthread_mutex_t mu;
    coacto_report *items;
    uint32_t head, count, cap;
    int fd;
} report_queue;

typedef struct send_item {
    int32_t tile;
    int32_t mode;    /* COACTO_TRANSFER_* it is encoded in */
    int64_t n_bytes;
    uint8_t *data;
} send_item;

typedef struct send_fifo {
    send_item *items;
    uint32_t cap, head, count;
} send_fifo;

struct coacto_runtime {
    report_queue reports;
    int32_t n_threads;
    double spin_seconds; /* how long an idle worker polls before it sleeps */
    pool_row *rows;
    worker *workers;
    _Alignas(COACTO_CACHE_LINE) atomic_long pending; /* tasks in the pool */
    _Alignas(COACTO_CACHE_LINE) atomic_int sleepers;
    atomic_uint heads_up; /* bumped by coacto_runtime_heads_up: sleepers wake to poll */
    atomic_uint push_cursor;
    pthread_mutex_t sleep_mu;
    pthread_cond_t sleep_cv;
    atomic_int stop;
};

struct coacto_inference {
    coacto_runtime *rt;
    coacto_graph *g;
    atomic_int *state;           /* [n_tiles] COACTO_TILE_* */
    atomic_int *parents_left;    /* [n_tiles] */
    int8_t *tile_worker;         /* [n_tiles] the worker that computed a tile; -1: none (from
                                    outside, or not yet); -2: a worker numbered 128 or more
                                    (no affinity then) */
    _Atomic(float *) *buffers;   /* [n_layers] */
    atomic_int *uses_left;       /* [n_layers] */
    _Alignas(COACTO_CACHE_LINE) atomic_long completed;
    _Alignas(COACTO_CACHE_LINE) atomic_int inflight; /* pool entries + chains being run */
    atomic_int cancelled;
    atomic_int error;            /* first coacto_status failure */
    atomic_long tiles_computed, tiles_external, tiles_dropped;
    atomic_long bytes_now, bytes_peak;
    double t_start, t_end;
    atomic_int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    /* Wall time with at least one computing thread in a chain of this inference's tiles. */
    pthread_mutex_t busy_mu;
    int busy_active;
    double busy_since, busy_seconds;
    atomic_long outputs_completed;
    /* Offloading plan (NULL: compute every tile, send none, report none). */
    uint8_t *plan_local, *plan_send, *plan_report;
    uint64_t tag;
    int has_plan;
    int inplace;                     /* coacto_inference_set_inplace */
    atomic_int compute_all;
    atomic_int rest_last; /* coacto_inference_compute_rest: unplanned tiles after planned ones */
    pthread_mutex_t params_mu;
    coacto_offload_params params;
    pthread_mutex_t send_mu;
    send_fifo sendq[POOL_DEPTH_BUCKETS];
    atomic_long send_bytes;          /* bytes queued */
    atomic_long tiles_sent, bytes_sent, bytes_sent_raw, tiles_parked;
    int32_t transfer;                /* COACTO_TRANSFER_* of the send queue */
    int8_t *layer_transfer;          /* [n_layers] per-layer modes, NULL: all `transfer` */
    atomic_long *wire_raw, *wire_encoded; /* [n_layers] when measuring, else NULL */
    /* Trace (coacto_inference_enable_trace; NULL when off): per tile start, end, worker, and
     * the send decisions in the order made (each tile is decided at most once). */
    double *trace_t0, *trace_t1;
    int32_t *trace_worker;
    coacto_decision *decisions;
    atomic_int n_decisions;
};

/* runtime.c */
/* Takes an inflight reference for the tile and puts it in the ready pool. */
void runtime_schedule(coacto_inference *inf, int32_t tile);

/* offload.c */
int report_queue_init(report_queue *q);
void report_queue_destroy(report_queue *q);
void report_push(coacto_runtime *rt, uint64_t tag, int32_t kind, int32_t tile);
int tile_is_local(const coacto_inference *inf, int32_t tile);
void offload_on_local_completion(coacto_inference *inf, int32_t tile, const float *layer_buf);
void offload_release(coacto_inference *inf);

/* wire.c */
int64_t wire_size_from_nnz(int32_t mode, int64_t n, int64_t nnz);
int64_t wire_tile_nnz(const coacto_graph *g, int32_t tile, const float *layer_buf);

/* graph.c */
/* A tile's data outside the layer buffer is column by column: (col1 - col0) * (row1 - row0)
 * floats. These move it between that form and the NHWC layer buffer. */
int64_t tile_floats(const coacto_graph *g, int32_t tile);
void tile_copy_out(const coacto_graph *g, int32_t tile, const float *layer_buf, float *dst);
void tile_copy_in(const coacto_graph *g, int32_t tile, const float *src, float *layer_buf);
void graph_release(coacto_graph *g);
/* A buffer of `bytes` (cache-line aligned) from the graph's activation arena; NULL when out of
 * memory. */
float *graph_buffer_get(coacto_graph *g, int64_t bytes);
/* Gives a buffer back to the arena; `bytes` as it was asked for. */
void graph_buffer_put(coacto_graph *g, float *buf, int64_t bytes);
double coacto_now_seconds(void);
void *coacto_aligned_alloc(size_t bytes);
/* Whether layers write into their residual's buffer in this inference (set_inplace, no plan):
 * then no tile may come from outside. */
static inline int inplace_active(const coacto_inference *inf) {
    return inf->inplace && !inf->has_plan;
}

#endif
