/* Computing engines, ready pool and per-inference tile state (ASPEN Algorithm 1).
 *
 * A worker pops a ready tile (its own pool row first, shallowest depth bucket first, then steals),
 * runs it, and completes it; of the children that became ready it continues depth-first with one
 * whose main parent (graph.c: the input block it mostly reads) it computed itself or that has
 * none, and pushes the others, each to the row of the worker that computed its main parent
 * (whose cache holds that input). Completion is exactly once: a tile goes READY -> RUNNING by
 * compare-and-swap, and coacto_inference_put_tile claims NOT_READY/READY -> RUNNING the same way,
 * so a tile that arrives from outside and the same tile computed here complete it once; the loser
 * is dropped. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ring.h"
#include "runtime_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* An idle worker polls the pool for this long before it sleeps. During an inference new tiles
 * appear every few microseconds, and between two inferences of a loop the caller needs a few
 * hundred: a wake-up costs tens of microseconds on bare metal, and far more on a virtual machine,
 * whose idle virtual CPU the host deschedules. Measured in time, not polls: a pause instruction
 * lasts 10 cycles on some CPUs and 140 on others. COACTO_SPIN_US overrides it (0: sleep at once). */
#define SPIN_SECONDS_DEFAULT 1e-3
/* A spinning worker yields its CPU this often. When every CPU runs a worker, the thread that
 * waits for the inference (woken when it ends) or feeds the next one would otherwise wait for a
 * spinner to give up: on Linux's EEVDF scheduler a woken thread does not always preempt, and a
 * 2-thread run on 2 CPUs then ended up to the whole spin time (1 ms) late in one run in ten. A
 * yield returns at once when nothing else is runnable on that CPU. */
#define SPIN_YIELD_SECONDS 20e-6

static _Thread_local int32_t tls_worker = -1;
/* Set while a caller's thread completes several tiles in a row (set_input): its pushes do not wake
 * sleeping workers one by one; it wakes them once at the end. A worker woken on the caller's CPU
 * may preempt the caller, and the tiles it had yet to push then waited for a CPU (GPT-2's
 * embedding tiles started 45 us apart). */
static _Thread_local int tls_defer_wake = 0;

const char *coacto_status_string(coacto_status s) {
    switch (s) {
    case COACTO_OK: return "ok";
    case COACTO_ERR_INVALID_ARGUMENT: return "invalid argument";
    case COACTO_ERR_OUT_OF_MEMORY: return "out of memory";
    case COACTO_ERR_INVALID_GRAPH: return "invalid tile graph";
    case COACTO_ERR_TIMEOUT: return "timed out";
    case COACTO_ERR_CANCELLED: return "cancelled";
    case COACTO_ERR_DUPLICATE: return "tile already completed";
    case COACTO_ERR_THREAD: return "could not start a thread";
    case COACTO_ERR_STATE: return "operation not valid in this state";
    }
    return "unknown status";
}

/* ---------------------------------------------------------------- ready pool */

static int fifo_push(task_fifo *q, task t) {
    if (!ring_reserve((void **)&q->items, &q->cap, &q->head, q->count, sizeof(task), 64)) return 0;
    q->items[(q->head + q->count) % q->cap] = t;
    q->count++;
    return 1;
}

/* The first task of queues [from, to) of a row, shallowest first. */
static int row_pop(pool_row *row, task *out, int from, int to) {
    if (atomic_load_explicit(&row->count, memory_order_relaxed) == 0) return 0;
    int got = 0;
    pthread_mutex_lock(&row->mu);
    for (int b = from; b < to; b++) {
        task_fifo *q = &row->q[b];
        if (q->count) {
            *out = q->items[q->head];
            q->head = (q->head + 1) % q->cap;
            q->count--;
            atomic_fetch_sub_explicit(&row->count, 1, memory_order_relaxed);
            got = 1;
            break;
        }
    }
    pthread_mutex_unlock(&row->mu);
    return got;
}

static int pool_pop(coacto_runtime *rt, int32_t self, task *out) {
    if (atomic_load(&rt->pending) == 0) return 0;
    /* Every row's depth buckets (its own first, then stealing), and only then the rest queues:
     * a worker whose row holds only a rest steals a planned tile rather than start the rest. */
    for (int pass = 0; pass < 2; pass++) {
        const int from = pass ? POOL_REST_QUEUE : 0, to = pass ? POOL_REST_QUEUE + 1 : POOL_REST_QUEUE;
        for (int32_t i = 0; i < rt->n_threads; i++) {
            if (row_pop(&rt->rows[(self + i) % rt->n_threads], out, from, to)) {
                atomic_fetch_sub(&rt->pending, 1);
                return 1;
            }
        }
    }
    return 0;
}

/* Takes every task of `inf` out of the ready pool and drops their inflight references, so that a
 * cancelled inference need not wait for workers busy with other inferences (a server's) to reach
 * and drop its tasks one by one before coacto_inference_destroy returns. */
static void pool_purge(coacto_runtime *rt, coacto_inference *inf) {
    int removed = 0;
    for (int32_t r = 0; r < rt->n_threads; r++) {
        pool_row *row = &rt->rows[r];
        if (atomic_load_explicit(&row->count, memory_order_relaxed) == 0) continue;
        pthread_mutex_lock(&row->mu);
        int row_removed = 0;
        for (int b = 0; b <= POOL_REST_QUEUE; b++) {
            task_fifo *q = &row->q[b];
            uint32_t kept = 0;
            for (uint32_t i = 0; i < q->count; i++) { /* compacts in place, order kept */
                task t = q->items[(q->head + i) % q->cap];
                if (t.inf != inf) q->items[(q->head + kept++) % q->cap] = t;
            }
            row_removed += (int)(q->count - kept);
            q->count = kept;
        }
        atomic_fetch_sub_explicit(&row->count, row_removed, memory_order_relaxed);
        pthread_mutex_unlock(&row->mu);
        removed += row_removed;
    }
    if (!removed) return;
    atomic_fetch_sub(&rt->pending, removed);
    /* Under the mutex, as release_inflight drops a last reference. */
    pthread_mutex_lock(&inf->mu);
    if (atomic_fetch_sub(&inf->inflight, removed) == removed) pthread_cond_broadcast(&inf->cv);
    pthread_mutex_unlock(&inf->mu);
}

/* Wakes one sleeping worker, or all of them. */
static void wake(coacto_runtime *rt, int all) {
    if (atomic_load(&rt->sleepers) > 0) {
        pthread_mutex_lock(&rt->sleep_mu);
        if (all)
            pthread_cond_broadcast(&rt->sleep_cv);
        else
            pthread_cond_signal(&rt->sleep_cv);
        pthread_mutex_unlock(&rt->sleep_mu);
    }
}

/* The caller's preparation of an inference (the Python call, reading and converting its inputs:
 * 0.2-0.3 ms for MobileNetV2) is time a sleeping worker can spend waking: on a virtual machine
 * the host deschedules an idle virtual CPU (MobileNetV2 at 2 threads ran 1-2% faster after a
 * pause with the wake-up moved here: docs/PERFORMANCE.md). Woken, a worker polls for rt->spin_seconds as
 * after any tile, then sleeps again. */
void coacto_runtime_heads_up(coacto_runtime *rt) {
    if (!rt) return;
    if (atomic_load(&rt->sleepers) > 0) {
        pthread_mutex_lock(&rt->sleep_mu);
        atomic_fetch_add(&rt->heads_up, 1);
        pthread_cond_broadcast(&rt->sleep_cv);
        pthread_mutex_unlock(&rt->sleep_mu);
    }
}

static void inference_fail(coacto_inference *inf, coacto_status st);

/* A tile outside the plan's local set of an inference whose rest comes last
 * (coacto_inference_compute_rest). */
static inline int rest_tile(const coacto_inference *inf, int32_t tile) {
    return inf->plan_local && !inf->plan_local[tile] &&
           atomic_load_explicit(&inf->rest_last, memory_order_relaxed);
}

/* The caller holds one inflight reference for the task, which the pool takes over. The task goes
 * to row `home` when that is a worker (the one whose cache holds the tile's input), else to this
 * worker's row, else round robin. */
static void pool_push(coacto_runtime *rt, coacto_inference *inf, int32_t tile, int32_t home) {
    int32_t r = home >= 0 && home < rt->n_threads ? home
                : tls_worker >= 0 ? tls_worker
                                  : (int32_t)(atomic_fetch_add(&rt->push_cursor, 1) % rt->n_threads);
    pool_row *row = &rt->rows[r];
    task t = {inf, tile};
    const int bucket = rest_tile(inf, tile) ? POOL_REST_QUEUE : inf->g->tile_bucket[tile];
    pthread_mutex_lock(&row->mu);
    int ok = fifo_push(&row->q[bucket], t);
    if (ok) atomic_fetch_add_explicit(&row->count, 1, memory_order_relaxed);
    pthread_mutex_unlock(&row->mu);
    if (!ok) {
        inference_fail(inf, COACTO_ERR_OUT_OF_MEMORY);
        return;
    }
    atomic_fetch_add(&rt->pending, 1);
    if (!tls_defer_wake) wake(rt, 0);
}

/* Takes an inflight reference for the task and hands it to the pool (row as in pool_push). */
static void schedule_to(coacto_inference *inf, int32_t tile, int32_t home) {
    /* A cancelled inference's tiles are no one's work; one pushed anyway (its check raced with
     * the cancel) is purged again by coacto_inference_destroy, or dropped when popped. */
    if (atomic_load_explicit(&inf->cancelled, memory_order_relaxed)) return;
    atomic_fetch_add(&inf->inflight, 1);
    pool_push(inf->rt, inf, tile, home);
}

void runtime_schedule(coacto_inference *inf, int32_t tile) { schedule_to(inf, tile, -1); }

/* The worker that computed the tile's main parent, or -1 (none, or it came from outside). */
static int32_t tile_home(const coacto_inference *inf, int32_t tile) {
    int32_t mp = inf->g->main_parent[tile];
    int32_t w = mp >= 0 ? inf->tile_worker[mp] : -1;
    return w >= 0 ? w : -1;
}

/* ---------------------------------------------------------------- inference state */

static void signal_done(coacto_inference *inf) {
    pthread_mutex_lock(&inf->mu);
    inf->done = 1;
    pthread_cond_broadcast(&inf->cv);
    pthread_mutex_unlock(&inf->mu);
}

static void inference_fail(coacto_inference *inf, coacto_status st) {
    int expected = COACTO_OK;
    if (!atomic_compare_exchange_strong(&inf->error, &expected, (int)st)) return;
    /* A failed inference is done too: its engine learns it from the report (then wait says why). */
    if (inf->has_plan) report_push(inf->rt, inf->tag, COACTO_REPORT_DONE, -1);
    signal_done(inf);
}

static void release_inflight(coacto_inference *inf) {
    int n = atomic_load(&inf->inflight);
    while (n > 1)
        if (atomic_compare_exchange_weak(&inf->inflight, &n, n - 1)) return;
    /* Perhaps the last reference: it is dropped under the mutex, so coacto_inference_destroy,
     * which waits under it for none to be left, cannot free the inference between the drop and
     * the broadcast (it did: a use after free in the broadcast). */
    pthread_mutex_lock(&inf->mu);
    if (atomic_fetch_sub(&inf->inflight, 1) == 1) pthread_cond_broadcast(&inf->cv);
    pthread_mutex_unlock(&inf->mu);
}

/* The layer whose buffer li writes into in this inference (in-place residual), or -1. */
static int32_t alias_of(const coacto_inference *inf, int32_t li) {
    return inplace_active(inf) ? inf->g->layer_alias[li] : -1;
}

static float *ensure_buffer(coacto_inference *inf, int32_t li) {
    float *buf = atomic_load_explicit(&inf->buffers[li], memory_order_acquire);
    if (buf) return buf;
    const int32_t r = alias_of(inf, li);
    if (r >= 0) {
        /* The residual's buffer, held one use longer: until this layer's buffer is released.
         * It is alive: the tile asking is one of its uses and has not completed. */
        float *shared = atomic_load_explicit(&inf->buffers[r], memory_order_acquire);
        if (!shared) return NULL;
        float *expected = NULL;
        if (!atomic_compare_exchange_strong(&inf->buffers[li], &expected, shared)) return expected;
        atomic_fetch_add(&inf->uses_left[r], 1);
        return shared;
    }
    size_t bytes = (size_t)inf->g->layer_floats[li] * sizeof(float);
    float *fresh = graph_buffer_get(inf->g, (int64_t)bytes);
    if (!fresh) return NULL;
    float *expected = NULL;
    if (!atomic_compare_exchange_strong(&inf->buffers[li], &expected, fresh)) {
        graph_buffer_put(inf->g, fresh, (int64_t)bytes);
        return expected;
    }
    long now = atomic_fetch_add(&inf->bytes_now, (long)bytes) + (long)bytes;
    long peak = atomic_load(&inf->bytes_peak);
    while (now > peak && !atomic_compare_exchange_weak(&inf->bytes_peak, &peak, now)) {
    }
    return fresh;
}

static void use_done(coacto_inference *inf, int32_t li) {
    if (inf->g->layer_flags[li] & COACTO_LAYER_KEEP) return;
    if (atomic_fetch_sub(&inf->uses_left[li], 1) == 1) {
        float *buf = atomic_exchange(&inf->buffers[li], NULL);
        const int32_t r = alias_of(inf, li);
        if (buf && r >= 0) { /* the residual's buffer: drop the use ensure_buffer added */
            use_done(inf, r);
            return;
        }
        if (buf) {
            int64_t bytes = inf->g->layer_floats[li] * (int64_t)sizeof(float);
            atomic_fetch_sub(&inf->bytes_now, (long)bytes);
            graph_buffer_put(inf->g, buf, bytes);
        }
    }
}

static void inference_finished(coacto_inference *inf) {
    inf->t_end = coacto_now_seconds();
    /* Report before waking waiters: whoever wakes finds the DONE report already queued. */
    if (inf->has_plan) report_push(inf->rt, inf->tag, COACTO_REPORT_DONE, -1);
    signal_done(inf);
}

/* Called once per tile by whoever completed it (`local`: computed or given here, not received).
 * Readies children: the first becomes *next (when next != NULL, the caller continues with it
 * depth-first), the others go to the pool; children this runtime must not compute are parked. */
static void complete_tile(coacto_inference *inf, int32_t tile, int32_t *next, int local) {
    const coacto_graph *g = inf->g;
    int32_t li = g->tile_layer[tile];
    if (local && (inf->plan_send || inf->wire_raw)) /* before the layer's use below: its buffer is alive */
        offload_on_local_completion(inf, tile, atomic_load(&inf->buffers[li]));
    atomic_store_explicit(&inf->state[tile], COACTO_TILE_COMPLETED, memory_order_release);
    if (inf->plan_report && inf->plan_report[tile])
        report_push(inf->rt, inf->tag, COACTO_REPORT_TILE, tile);
    for (int32_t k = g->layer_input_off[li]; k < g->layer_input_off[li + 1]; k++)
        use_done(inf, g->layer_input_ids[k]);
    use_done(inf, li);
    for (int32_t e = g->child_off[tile]; e < g->child_off[tile + 1]; e++) {
        int32_t child = g->children[e];
        if (atomic_fetch_sub_explicit(&inf->parents_left[child], 1, memory_order_acq_rel) != 1)
            continue;
        int expected = COACTO_TILE_NOT_READY;
        if (!atomic_compare_exchange_strong(&inf->state[child], &expected, COACTO_TILE_READY))
            continue; /* already completed from outside */
        if (!tile_is_local(inf, child)) {
            atomic_fetch_add_explicit(&inf->tiles_parked, 1, memory_order_relaxed);
            continue; /* parked: arrives from outside, or compute_all schedules it */
        }
        /* Depth first with a child whose main input this worker computed (or that has none);
         * a child whose main input another worker computed goes to that worker's row, which it
         * pops before stealing: the halo of a window is read across cores, the bulk is not. */
        int32_t home = tile_home(inf, child);
        if (next && *next < 0 && (home < 0 || home == tls_worker) &&
            !(rest_tile(inf, child) && !rest_tile(inf, tile))) {
            *next = child;
        } else {
            schedule_to(inf, child, home);
        }
    }
    atomic_fetch_add(&inf->completed, 1);
    if (g->n_output_tiles > 0 ? (g->layer_flags[li] & COACTO_LAYER_KEEP) &&
                                    atomic_fetch_add(&inf->outputs_completed, 1) + 1 ==
                                        g->n_output_tiles
                              : atomic_load(&inf->completed) == g->n_tiles)
        inference_finished(inf);
}

static int scratch_reserve(worker *w, size_t floats) {
    if (floats <= w->scratch_cap) return 1;
    free(w->scratch);
    w->scratch = coacto_aligned_alloc(floats * sizeof(float));
    w->scratch_cap = w->scratch ? floats : 0;
    return w->scratch != NULL;
}

/* A tile of more than this many FLOPs runs in pieces, and a cancelled (or failed) inference stops
 * between two of them. The partitioner caps a layer's tile count, so one tile of a very large
 * layer, or of a graph cut into few tiles per layer, can take seconds on one thread, which a
 * cancel would otherwise wait out. 128 MFLOP is 1-3 ms on a desktop core and about 15 ms on a Raspberry Pi 4
 * core; the partitioner's own tiles (about 100 MFLOP, see DEFAULT_TILE_FLOPS) stay whole. */
#define CANCEL_PIECE_FLOPS 128e6
/* Row pieces start on a multiple of this from the tile's first row: a multiple of every GEMM
 * kernel's panel width (coacto/partition/rules.py's CONV_ROW_ALIGN), so each piece starts on a packed panel. */
#define PIECE_ROW_ALIGN 32

/* FLOPs per output value of the ops whose tiles can be long; 0 for the others (memory-bound:
 * a tile of them takes about the time of its bytes). */
static double value_flops(const layer *l) {
    if (l->op == COACTO_OP_CONV && l->pre) /* depthwise, after a 1x1 of every input row */
        return 2.0 * l->iparams[0] * l->iparams[1] +
               2.0 * l->in_c[0] * ((double)l->in_h[0] * l->in_w[0]) / ((double)l->h * l->w);
    if (l->op == COACTO_OP_CONV) {
        int32_t group = l->iparams[10] > 0 ? l->iparams[10] : 1;
        return 2.0 * l->iparams[0] * l->iparams[1] * (double)(l->in_c[0] / group);
    }
    if (l->op == COACTO_OP_MATMUL) return 2.0 * l->iparams[4];
    if (l->op == COACTO_OP_ATTENTION) /* the context's sum, the head's scores shared by dv */
        return 2.0 * l->iparams[3] +
               (2.0 * l->iparams[4] + 4.0) * l->iparams[3] / (double)l->iparams[23];
    return 0.0;
}

static int inference_stopped(const coacto_inference *inf) {
    return atomic_load_explicit(&inf->cancelled, memory_order_relaxed) ||
           atomic_load_explicit(&inf->error, memory_order_relaxed);
}

/* Runs a long tile as a grid of pieces (op_execute computes any sub-rectangle of a tile):
 * columns first, rows (aligned) only when there are fewer columns than pieces. Returns
 * COACTO_ERR_CANCELLED, leaving the tile unfinished, when the inference stopped meanwhile. */
static coacto_status execute_pieces(const coacto_inference *inf, const layer *l,
                                    const float *const *in, float *out, const int32_t *b,
                                    double flops, float *scratch) {
    const int64_t cols = b[1] - b[0], rows = b[3] - b[2];
    int64_t pieces = (int64_t)ceil(flops / CANCEL_PIECE_FLOPS);
    int64_t col_pieces = pieces < cols ? pieces : cols;
    int64_t row_pieces = (pieces + col_pieces - 1) / col_pieces;
    int64_t max_row_pieces = rows / PIECE_ROW_ALIGN > 0 ? rows / PIECE_ROW_ALIGN : 1;
    if (row_pieces > max_row_pieces) row_pieces = max_row_pieces;
    int64_t row_step = (rows + row_pieces - 1) / row_pieces;
    row_step = (row_step + PIECE_ROW_ALIGN - 1) / PIECE_ROW_ALIGN * PIECE_ROW_ALIGN;
    for (int64_t i = 0; i < col_pieces; i++) {
        int32_t c0 = (int32_t)(b[0] + cols * i / col_pieces);
        int32_t c1 = (int32_t)(b[0] + cols * (i + 1) / col_pieces);
        for (int64_t r0 = b[2]; r0 < b[3]; r0 += row_step) {
            if (inference_stopped(inf)) return COACTO_ERR_CANCELLED;
            int64_t r1 = r0 + row_step < b[3] ? r0 + row_step : b[3];
            op_execute(l, in, out, c0, c1, (int32_t)r0, (int32_t)r1, scratch);
        }
    }
    return COACTO_OK;
}

static coacto_status execute_tile(worker *w, coacto_inference *inf, int32_t tile) {
    const coacto_graph *g = inf->g;
    int32_t li = g->tile_layer[tile];
    const layer *l = &g->layers[li];
    const int32_t *b = &g->tile_bounds[4 * (size_t)tile];
    if (l->op == COACTO_OP_NOP) /* nothing to compute, but a buffer to send from */
        return ensure_buffer(inf, li) ? COACTO_OK : COACTO_ERR_OUT_OF_MEMORY;
    const float *in[COACTO_MAX_INPUTS];
    for (int i = 0; i < l->n_inputs; i++) {
        in[i] = ensure_buffer(inf, l->inputs[i]);
        if (!in[i]) return COACTO_ERR_OUT_OF_MEMORY;
    }
    float *out = ensure_buffer(inf, li);
    if (!out) return COACTO_ERR_OUT_OF_MEMORY;
    size_t need = l->scratch_fixed + l->scratch_per_col * (size_t)(b[1] - b[0]);
    /* The graph's largest need at once: a worker's scratch then grows once per graph, in the
     * first tile it runs (the warm-up inference's, usually), not again in a later inference
     * whose tiles it had not met (MobileNetV2's first inference after the warm-up at 2 threads
     * faulted in 950 pages, 7.5 ms against 2.8) */
    if (need && !scratch_reserve(w, need > g->scratch_max ? need : g->scratch_max))
        return COACTO_ERR_OUT_OF_MEMORY;
    double flops = value_flops(l) * (double)(b[1] - b[0]) * (double)(b[3] - b[2]);
    if (flops > CANCEL_PIECE_FLOPS) return execute_pieces(inf, l, in, out, b, flops, w->scratch);
    op_execute(l, in, out, b[0], b[1], b[2], b[3], w->scratch);
    return COACTO_OK;
}

/* A worker woken while another computes on its CPU waits for the scheduler to move one of them
 * (the idle CPU's balancing runs on its tick: milliseconds), however idle the other CPUs are.
 * MobileNetV2 at 2 threads on a 2-CPU machine, fresh processes: in 2 of 14 both workers last ran
 * on one CPU when the first inference after loading woke them, and it took 8.4-9.5 ms against
 * 3.7-4.4 steady, the second worker starting 2.1-3.9 ms in. So a computing worker that sees, for
 * UNSTACK_SECONDS, tiles waiting in the pool while no other worker computes a tile or makes
 * progress (a woken worker that has not run yet, or one preempted while spinning; not one in a
 * long tile) looks in /proc for a worker runnable on its own CPU and, if there is one, moves
 * itself to a CPU where no worker last ran: its affinity set to that CPU alone, which migrates
 * it, then back to the CPUs it started with (a move, not a pinning). The waiting worker then runs
 * at once on the CPU it waited for (moving it instead made it wait for the idle CPU to wake:
 * 0.65-1.0 ms in, against 0.35-0.65). A worker slow to wake on an idle CPU of a virtual machine,
 * or preempted by another process on its own CPU, is left alone. At most once per
 * UNSTACK_INTERVAL_SECONDS per worker. */
#define UNSTACK_SECONDS 200e-6
#define UNSTACK_INTERVAL_SECONDS 5e-3

/* One beat of a worker's progress counter: only the worker writes it, so no locked add. */
static inline void pulse(worker *w) {
    atomic_store_explicit(&w->progress,
                          atomic_load_explicit(&w->progress, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* Between two looks at the other workers' counters, at least this long: with many threads a look
 * reads a cache line per worker, which spinning workers keep writing. */
#define UNSTACK_LOOK_SECONDS 50e-6

#if defined(__linux__) && defined(CPU_SETSIZE)
/* The state letter and the CPU of thread `tid` of this process (0 when unreadable). Plain
 * system calls on a stack buffer: stdio would allocate, and a worker's first allocation maps an
 * arena of its own (pages faulted in during an inference). */
static int task_state(int tid, char *state, int *cpu) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ') return 0;
    *state = p[2];
    p += 2; /* field 3, the state; the CPU is field 39 */
    for (int field = 3; field < 39; field++) {
        p = strchr(p, ' ');
        if (!p) return 0;
        p++;
    }
    *cpu = atoi(p);
    return 1;
}
#endif

static void unstack(worker *w) {
#if defined(__linux__) && defined(CPU_SETSIZE)
    coacto_runtime *rt = w->rt;
    if (rt->n_threads < 2 || atomic_load_explicit(&rt->pending, memory_order_relaxed) == 0) {
        w->crowded_since = 0;
        return;
    }
    const double now = coacto_now_seconds();
    if (w->crowded_since != 0 && now - w->looked_at < UNSTACK_LOOK_SECONDS) return;
    w->looked_at = now;
    unsigned others = 0;
    for (int32_t i = 0; i < rt->n_threads; i++) {
        if (i == w->index) continue;
        if (atomic_load_explicit(&rt->workers[i].computing, memory_order_relaxed)) {
            w->crowded_since = 0;
            return;
        }
        others += atomic_load_explicit(&rt->workers[i].progress, memory_order_relaxed);
    }
    if (w->crowded_since == 0 || others != w->others_seen) {
        w->crowded_since = now;
        w->others_seen = others;
        return;
    }
    if (now - w->crowded_since < UNSTACK_SECONDS || now - w->moved_at < UNSTACK_INTERVAL_SECONDS)
        return;
    w->moved_at = now;
    w->crowded_since = 0;
    const int cur = sched_getcpu();
    if (cur < 0 || cur >= CPU_SETSIZE) return;
    cpu_set_t taken;
    CPU_ZERO(&taken);
    CPU_SET(cur, &taken);
    int stuck = -1;
    for (int32_t i = 0; i < rt->n_threads; i++) {
        char state;
        int cpu, tid = atomic_load(&rt->workers[i].tid);
        if (i == w->index || tid <= 0 || !task_state(tid, &state, &cpu)) continue;
        if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &taken);
        if (state == 'R' && cpu == cur) stuck = i;
    }
    if (stuck < 0 || !w->cpus_known) return;
    cpu_set_t allowed, one;
    memcpy(&allowed, w->cpus, sizeof allowed);
    int target = -1;
    for (int pass = 0; pass < 2 && target < 0; pass++) /* a CPU without a worker, else any other */
        for (int i = 1; i < CPU_SETSIZE; i++) {
            const int c = (cur + i) % CPU_SETSIZE;
            if (CPU_ISSET(c, &allowed) && (pass == 1 || !CPU_ISSET(c, &taken))) {
                target = c;
                break;
            }
        }
    if (target < 0) return;
    CPU_ZERO(&one);
    CPU_SET(target, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0 &&
        sched_setaffinity(0, sizeof allowed, &allowed) != 0)
        sched_setaffinity(0, sizeof allowed, &allowed); /* once more: never stay pinned */
#else
    (void)w;
#endif
}

/* The inference's busy time (its stats' busy_seconds) counts while any chain of it runs. */
static void busy_enter(coacto_inference *inf) {
    pthread_mutex_lock(&inf->busy_mu);
    if (inf->busy_active++ == 0) inf->busy_since = coacto_now_seconds();
    pthread_mutex_unlock(&inf->busy_mu);
}

static void busy_leave(coacto_inference *inf) {
    pthread_mutex_lock(&inf->busy_mu);
    if (--inf->busy_active == 0) inf->busy_seconds += coacto_now_seconds() - inf->busy_since;
    pthread_mutex_unlock(&inf->busy_mu);
}

/* Runs a popped task and the depth-first chain behind it; holds one inflight reference. */
static void run_chain(worker *w, coacto_inference *inf, int32_t tile) {
    atomic_store_explicit(&w->computing, 1, memory_order_relaxed);
    busy_enter(inf);
    w->crowded_since = 0; /* a window opened in an earlier chain is no observation of this one */
    while (tile >= 0) {
        if (inference_stopped(inf)) break;
        int expected = COACTO_TILE_READY;
        if (!atomic_compare_exchange_strong(&inf->state[tile], &expected, COACTO_TILE_RUNNING))
            break; /* completed from outside meanwhile */
        coacto_status st;
        if (inf->trace_t0) {
            double t0 = coacto_now_seconds();
            st = execute_tile(w, inf, tile);
            double t1 = coacto_now_seconds();
            if (st == COACTO_OK) { /* a tile left unfinished by a cancel was not computed */
                inf->trace_t0[tile] = t0;
                inf->trace_t1[tile] = t1;
                inf->trace_worker[tile] = w->index;
            }
        } else if (atomic_load_explicit(&inf->g->profiling, memory_order_relaxed)) {
            double t0 = coacto_now_seconds();
            st = execute_tile(w, inf, tile);
            double t1 = coacto_now_seconds();
            coacto_graph *g = inf->g;
            atomic_fetch_add_explicit(&g->layer_ns[g->tile_layer[tile]], (int64_t)((t1 - t0) * 1e9),
                                      memory_order_relaxed);
            /* Each tile runs once per inference; concurrent inferences of one graph only blur
             * the trace (plain stores of distinct slots per tile). */
            g->trace_t0[tile] = t0;
            g->trace_t1[tile] = t1;
            g->trace_worker[tile] = w->index;
        } else {
            st = execute_tile(w, inf, tile);
        }
        if (st == COACTO_ERR_CANCELLED) break; /* stopped mid-tile: it stays RUNNING, unread */
        if (st != COACTO_OK) {
            inference_fail(inf, st);
            break;
        }
        atomic_fetch_add_explicit(&inf->tiles_computed, 1, memory_order_relaxed);
        /* Read by whoever readies a child, after the release of complete_tile below; -2: a
         * worker whose index does not fit (no home for its children, but computed here). */
        inf->tile_worker[tile] = (int8_t)(w->index < 128 ? w->index : -2);
        int32_t next = -1;
        complete_tile(inf, tile, &next, 1);
        tile = next;
        pulse(w);
        unstack(w);
    }
    busy_leave(inf);
    atomic_store_explicit(&w->computing, 0, memory_order_relaxed);
    release_inflight(inf);
}

/* Computing threads treat subnormal floats as zero, in and out (x86 MXCSR FTZ and DAZ, Arm FPCR
 * FZ), as inference runtimes do: an operation on a subnormal costs a microcode assist of about a
 * hundred cycles on x86, and the values lie below 1.2e-38, far under any model's tolerance. */
static void flush_subnormals(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(_mm_getcsr() | 0x8040);
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    fpcr |= (uint64_t)1 << 24;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
#endif
}

static void *worker_main(void *arg) {
    worker *w = arg;
    coacto_runtime *rt = w->rt;
    flush_subnormals();
    tls_worker = w->index;
#if defined(__linux__) && defined(CPU_SETSIZE)
    {
        cpu_set_t cpus; /* what it may run on, restored after unstack moves it */
        _Static_assert(sizeof cpus <= sizeof w->cpus, "worker.cpus holds a cpu_set_t");
        w->cpus_known = sched_getaffinity(0, sizeof cpus, &cpus) == 0;
        if (w->cpus_known) memcpy(w->cpus, &cpus, sizeof cpus);
    }
#endif
    atomic_store(&w->tid, (int)syscall(SYS_gettid));
    task t;
    for (;;) {
        int got = pool_pop(rt, w->index, &t);
        if (!got && rt->spin_seconds > 0) {
            double now = coacto_now_seconds(), until = now + rt->spin_seconds;
            double next_yield = now + SPIN_YIELD_SECONDS;
            for (unsigned spin = 1; !got; spin++) {
                got = pool_pop(rt, w->index, &t);
                if (got || atomic_load_explicit(&rt->stop, memory_order_relaxed)) break;
                if (spin % 32 == 0) {
                    pulse(w);
                    now = coacto_now_seconds();
                    if (now > until) break;
                    if (now > next_yield) {
                        sched_yield();
                        next_yield = now + SPIN_YIELD_SECONDS;
                    }
                }
                cpu_relax();
            }
        }
        if (got) {
            run_chain(w, t.inf, t.tile);
            continue;
        }
        pthread_mutex_lock(&rt->sleep_mu);
        atomic_fetch_add(&rt->sleepers, 1);
        const unsigned heads_up = atomic_load(&rt->heads_up);
        while (atomic_load(&rt->pending) == 0 && !atomic_load(&rt->stop) &&
               atomic_load(&rt->heads_up) == heads_up)
            pthread_cond_wait(&rt->sleep_cv, &rt->sleep_mu);
        atomic_fetch_sub(&rt->sleepers, 1);
        pthread_mutex_unlock(&rt->sleep_mu);
        pulse(w); /* it runs */
        if (atomic_load(&rt->stop) && atomic_load(&rt->pending) == 0) break;
    }
    free(w->scratch);
    w->scratch = NULL;
    return NULL;
}

/* ---------------------------------------------------------------- runtime */

coacto_status coacto_runtime_create(int32_t n_threads, coacto_runtime **out) {
    if (!out) return COACTO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return COACTO_ERR_INVALID_ARGUMENT;
    coacto_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return COACTO_ERR_OUT_OF_MEMORY;
    rt->n_threads = n_threads;
    rt->spin_seconds = SPIN_SECONDS_DEFAULT;
    const char *spin_env = getenv("COACTO_SPIN_US");
    if (spin_env && *spin_env) {
        char *end;
        double us = strtod(spin_env, &end);
        if (*end == '\0' && us >= 0 && us <= 1e6) rt->spin_seconds = us * 1e-6;
    }
    rt->rows = aligned_alloc(COACTO_CACHE_LINE, sizeof(pool_row) * (size_t)n_threads);
    rt->workers = aligned_alloc(COACTO_CACHE_LINE, sizeof(worker) * (size_t)n_threads);
    if (!rt->rows || !rt->workers) {
        free(rt->rows);
        free(rt->workers);
        free(rt);
        return COACTO_ERR_OUT_OF_MEMORY;
    }
    memset(rt->rows, 0, sizeof(pool_row) * (size_t)n_threads);
    if (!report_queue_init(&rt->reports)) {
        free(rt->rows);
        free(rt->workers);
        free(rt);
        return COACTO_ERR_OUT_OF_MEMORY;
    }
    memset(rt->workers, 0, sizeof(worker) * (size_t)n_threads);
    for (int32_t i = 0; i < n_threads; i++) pthread_mutex_init(&rt->rows[i].mu, NULL);
    pthread_mutex_init(&rt->sleep_mu, NULL);
    pthread_cond_init(&rt->sleep_cv, NULL);
    int32_t started = 0;
    for (; started < n_threads; started++) {
        worker *w = &rt->workers[started];
        w->rt = rt;
        w->index = started;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) break;
    }
    if (started < n_threads) {
        rt->n_threads = started;
        coacto_runtime_destroy(rt);
        return COACTO_ERR_THREAD;
    }
    *out = rt;
    return COACTO_OK;
}

void coacto_runtime_destroy(coacto_runtime *rt) {
    if (!rt) return;
    pthread_mutex_lock(&rt->sleep_mu);
    atomic_store(&rt->stop, 1);
    pthread_cond_broadcast(&rt->sleep_cv);
    pthread_mutex_unlock(&rt->sleep_mu);
    for (int32_t i = 0; i < rt->n_threads; i++) pthread_join(rt->workers[i].thread, NULL);
    for (int32_t i = 0; i < rt->n_threads; i++) {
        for (int b = 0; b <= POOL_REST_QUEUE; b++) free(rt->rows[i].q[b].items);
        pthread_mutex_destroy(&rt->rows[i].mu);
    }
    pthread_mutex_destroy(&rt->sleep_mu);
    pthread_cond_destroy(&rt->sleep_cv);
    report_queue_destroy(&rt->reports);
    free(rt->rows);
    free(rt->workers);
    free(rt);
}

int32_t coacto_runtime_threads(const coacto_runtime *rt) { return rt ? rt->n_threads : 0; }

coacto_status coacto_runtime_set_worker_nice(coacto_runtime *rt, int32_t nice) {
    if (!rt || nice < -20 || nice > 19) return COACTO_ERR_INVALID_ARGUMENT;
    coacto_status st = COACTO_OK;
    for (int32_t i = 0; i < rt->n_threads; i++) {
        int tid;
        while ((tid = atomic_load(&rt->workers[i].tid)) == 0) sched_yield(); /* still starting */
        if (setpriority(PRIO_PROCESS, (id_t)tid, nice) != 0) st = COACTO_ERR_INVALID_ARGUMENT;
    }
    return st;
}

/* ---------------------------------------------------------------- inference API */

coacto_status coacto_inference_create(coacto_runtime *rt, coacto_graph *g,
                                      coacto_inference **out) {
    if (!out) return COACTO_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!rt || !g) return COACTO_ERR_INVALID_ARGUMENT;
    coacto_inference *inf = calloc(1, sizeof *inf);
    if (!inf) return COACTO_ERR_OUT_OF_MEMORY;
    size_t nt = (size_t)g->n_tiles, nl = (size_t)g->n_layers;
    inf->state = malloc(nt * sizeof(atomic_int));
    inf->parents_left = malloc(nt * sizeof(atomic_int));
    inf->tile_worker = malloc(nt);
    inf->buffers = calloc(nl, sizeof(*inf->buffers));
    inf->uses_left = malloc(nl * sizeof(atomic_int));
    if (!inf->state || !inf->parents_left || !inf->tile_worker || !inf->buffers ||
        !inf->uses_left) {
        free(inf->state);
        free(inf->parents_left);
        free(inf->tile_worker);
        free(inf->buffers);
        free(inf->uses_left);
        free(inf);
        return COACTO_ERR_OUT_OF_MEMORY;
    }
    memset(inf->tile_worker, 0xff, nt); /* -1: computed by no worker (yet) */
    for (size_t t = 0; t < nt; t++) {
        atomic_init(&inf->state[t], COACTO_TILE_NOT_READY);
        atomic_init(&inf->parents_left[t], g->parent_off[t + 1] - g->parent_off[t]);
    }
    for (size_t li = 0; li < nl; li++) {
        atomic_init(&inf->buffers[li], NULL);
        atomic_init(&inf->uses_left[li], g->layer_uses[li]);
    }
    inf->rt = rt;
    inf->g = g;
    atomic_fetch_add(&g->refs, 1);
    pthread_mutex_init(&inf->mu, NULL);
    pthread_cond_init(&inf->cv, NULL);
    pthread_mutex_init(&inf->params_mu, NULL);
    pthread_mutex_init(&inf->busy_mu, NULL);
    pthread_mutex_init(&inf->send_mu, NULL);
    inf->params.alpha = 1.0;
    inf->params.server_flops = 1.0;
    *out = inf;
    return COACTO_OK;
}

static void mark_started(coacto_inference *inf) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&inf->started, &expected, 1)) return;
    inf->t_start = coacto_now_seconds();
    for (int32_t i = 0; i < inf->g->n_sources; i++) {
        int32_t t = inf->g->sources[i];
        int st = COACTO_TILE_NOT_READY;
        if (atomic_compare_exchange_strong(&inf->state[t], &st, COACTO_TILE_READY) &&
            tile_is_local(inf, t))
            runtime_schedule(inf, t);
    }
}

/* Claims a tile for completion from outside; the caller then writes its data and completes it. */
static int claim_tile(coacto_inference *inf, int32_t tile) {
    int s = atomic_load(&inf->state[tile]);
    while (s == COACTO_TILE_NOT_READY || s == COACTO_TILE_READY) {
        if (atomic_compare_exchange_weak(&inf->state[tile], &s, COACTO_TILE_RUNNING)) return 1;
    }
    return 0;
}

static int inference_usable(const coacto_inference *inf) {
    return !atomic_load(&inf->cancelled) && !atomic_load(&inf->error);
}

/* NCHW -> NHWC of positions [p0, p1) of one batch item (c planes of hw values at src), in blocks
 * that stay in L1; dst points at the item's first position. Three channels (images) get a loop
 * per position with the channels unrolled. */
static void transpose_to_nhwc(const float *restrict src, float *restrict dst, int64_t c,
                              int64_t hw, int64_t p0, int64_t p1) {
    enum { BLOCK = 64 };
    if (c == 3) {
        for (int64_t p = p0; p < p1; p++) {
            dst[3 * p] = src[p];
            dst[3 * p + 1] = src[hw + p];
            dst[3 * p + 2] = src[2 * hw + p];
        }
        return;
    }
    for (int64_t b0 = p0; b0 < p1; b0 += BLOCK) {
        int64_t b1 = b0 + BLOCK < p1 ? b0 + BLOCK : p1;
        for (int64_t c0 = 0; c0 < c; c0 += BLOCK) {
            int64_t c1 = c0 + BLOCK < c ? c0 + BLOCK : c;
            for (int64_t p = b0; p < b1; p++)
                for (int64_t ch = c0; ch < c1; ch++) dst[p * c + ch] = src[ch * hw + p];
        }
    }
}

/* Columns [col0, col1) of an input layer (storage: c floats per column, columns position-major
 * over n, h, w) from the caller's data (NCHW when nchw, else the storage order). */
static void copy_input_columns(const layer *l, const float *data, float *buf, int64_t col0,
                               int64_t col1, int nchw) {
    const int64_t c = l->c, hw = (int64_t)l->h * l->w, item = hw * c;
    if (!nchw || hw == 1 || c == 1) {
        memcpy(buf + col0 * c, data + col0 * c, (size_t)((col1 - col0) * c) * sizeof(float));
        return;
    }
    for (int64_t p = col0; p < col1;) { /* batch item by batch item */
        const int64_t ni = p / hw, q0 = p - ni * hw;
        const int64_t q1 = col1 - ni * hw < hw ? col1 - ni * hw : hw;
        transpose_to_nhwc(data + ni * item, buf + ni * item, c, hw, q0, q1);
        p = ni * hw + q1;
    }
}

/* Copies the input tile by tile and completes each tile as soon as its columns are in place, so
 * the computing threads start on the first layer while the rest of the input is still being
 * copied (a 224x224 image takes this thread tens of microseconds). */
static coacto_status set_input(coacto_inference *inf, int32_t li, const float *data,
                               int64_t n_floats, int nchw) {
    if (!inf || !data || li < 0 || li >= inf->g->n_layers) return COACTO_ERR_INVALID_ARGUMENT;
    const coacto_graph *g = inf->g;
    if (g->layers[li].op != COACTO_OP_INPUT || n_floats != g->layer_floats[li])
        return COACTO_ERR_INVALID_ARGUMENT;
    if (!inference_usable(inf)) return COACTO_ERR_CANCELLED;
    mark_started(inf);
    float *buf = ensure_buffer(inf, li);
    if (!buf) return COACTO_ERR_OUT_OF_MEMORY;
    int32_t first = g->layer_first_tile[li], end = g->layer_first_tile[li + 1];
    for (int32_t t = first; t < end; t++)
        if (atomic_load(&inf->state[t]) != COACTO_TILE_NOT_READY) return COACTO_ERR_STATE;
    const layer *l = &g->layers[li];
    /* Tiles of whole columns (the partitioner never splits an input's rows) are copied one by
     * one; any other tiling is copied at once first. */
    int by_tile = 1;
    for (int32_t t = first; t < end && by_tile; t++) {
        const int32_t *b = &g->tile_bounds[4 * (size_t)t];
        by_tile = b[2] == 0 && b[3] == l->c;
    }
    if (!by_tile) copy_input_columns(l, data, buf, 0, (int64_t)l->n * l->h * l->w, nchw);
    atomic_fetch_add(&inf->inflight, 1); /* pushes below happen on this thread's reference */
    const int defer = tls_worker < 0;    /* spinning workers take the tiles meanwhile */
    if (defer) tls_defer_wake = 1;
    for (int32_t t = first; t < end; t++) {
        const int32_t *b = &g->tile_bounds[4 * (size_t)t];
        if (by_tile) copy_input_columns(l, data, buf, b[0], b[1], nchw);
        if (claim_tile(inf, t)) complete_tile(inf, t, NULL, 1);
    }
    if (defer) {
        tls_defer_wake = 0;
        wake(inf->rt, 1);
    }
    release_inflight(inf);
    return COACTO_OK;
}

coacto_status coacto_inference_set_input(coacto_inference *inf, int32_t li, const float *data,
                                         int64_t n_floats) {
    return set_input(inf, li, data, n_floats, 0);
}

coacto_status coacto_inference_set_input_nchw(coacto_inference *inf, int32_t li,
                                              const float *data, int64_t n_floats) {
    return set_input(inf, li, data, n_floats, 1);
}

coacto_status coacto_inference_set_inplace(coacto_inference *inf, int32_t on) {
    if (!inf) return COACTO_ERR_INVALID_ARGUMENT;
    if (atomic_load(&inf->started)) return COACTO_ERR_STATE;
    inf->inplace = on != 0;
    return COACTO_OK;
}

coacto_status coacto_inference_put_tile(coacto_inference *inf, int32_t tile, const float *data,
                                        int64_t n_floats) {
    if (!inf || !data || tile < 0 || tile >= inf->g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
    const coacto_graph *g = inf->g;
    int32_t li = g->tile_layer[tile];
    if (n_floats != tile_floats(g, tile)) return COACTO_ERR_INVALID_ARGUMENT;
    if (inplace_active(inf)) return COACTO_ERR_STATE;
    if (!inference_usable(inf)) return COACTO_ERR_CANCELLED;
    mark_started(inf);
    atomic_fetch_add(&inf->inflight, 1);
    coacto_status st = COACTO_OK;
    if (!claim_tile(inf, tile)) {
        atomic_fetch_add(&inf->tiles_dropped, 1);
        st = COACTO_ERR_DUPLICATE;
    } else {
        float *buf = ensure_buffer(inf, li);
        if (!buf) {
            inference_fail(inf, COACTO_ERR_OUT_OF_MEMORY);
            st = COACTO_ERR_OUT_OF_MEMORY;
        } else {
            tile_copy_in(g, tile, data, buf);
            atomic_fetch_add(&inf->tiles_external, 1);
            complete_tile(inf, tile, NULL, 0);
        }
    }
    release_inflight(inf);
    return st;
}

/* Checks a batch's ids and that data holds exactly their floats. */
static coacto_status check_batch(const coacto_inference *inf, const int32_t *ids, int32_t n,
                                 int64_t n_floats) {
    if (!inf || (!ids && n > 0) || n < 0) return COACTO_ERR_INVALID_ARGUMENT;
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= inf->g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
        total += tile_floats(inf->g, ids[i]);
    }
    return total == n_floats ? COACTO_OK : COACTO_ERR_INVALID_ARGUMENT;
}

coacto_status coacto_inference_put_tiles(coacto_inference *inf, const int32_t *ids, int32_t n,
                                         const float *data, int64_t n_floats, int32_t *accepted,
                                         int32_t *duplicates) {
    if (accepted) *accepted = 0;
    if (duplicates) *duplicates = 0;
    if (inf && inplace_active(inf)) return COACTO_ERR_STATE;
    coacto_status st = check_batch(inf, ids, n, n_floats);
    if (st != COACTO_OK || n == 0) return st;
    if (!data) return COACTO_ERR_INVALID_ARGUMENT;
    int64_t pos = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t size = tile_floats(inf->g, ids[i]);
        st = coacto_inference_put_tile(inf, ids[i], data + pos, size);
        pos += size;
        if (st == COACTO_OK) {
            if (accepted) (*accepted)++;
        } else if (st == COACTO_ERR_DUPLICATE) {
            if (duplicates) (*duplicates)++;
        } else {
            return st;
        }
    }
    return COACTO_OK;
}

coacto_status coacto_inference_get_tiles(coacto_inference *inf, const int32_t *ids, int32_t n,
                                         float *out, int64_t n_floats) {
    coacto_status st = check_batch(inf, ids, n, n_floats);
    if (st != COACTO_OK || n == 0) return st;
    if (!out) return COACTO_ERR_INVALID_ARGUMENT;
    int64_t pos = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t size = tile_floats(inf->g, ids[i]);
        st = coacto_inference_get_tile(inf, ids[i], out + pos, size);
        if (st != COACTO_OK) return st;
        pos += size;
    }
    return COACTO_OK;
}

coacto_status coacto_inference_wait(coacto_inference *inf, double timeout_s) {
    if (!inf) return COACTO_ERR_INVALID_ARGUMENT;
    struct timespec deadline;
    if (timeout_s >= 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        double whole = floor(timeout_s);
        deadline.tv_sec += (time_t)whole;
        deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    coacto_status st = COACTO_OK;
    pthread_mutex_lock(&inf->mu);
    while (!inf->done) {
        int rc = timeout_s >= 0 ? pthread_cond_timedwait(&inf->cv, &inf->mu, &deadline)
                                : pthread_cond_wait(&inf->cv, &inf->mu);
        if (rc == ETIMEDOUT && !inf->done) {
            st = COACTO_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&inf->mu);
    if (st != COACTO_OK) return st;
    int err = atomic_load(&inf->error);
    if (err) return (coacto_status)err;
    if (atomic_load(&inf->cancelled)) return COACTO_ERR_CANCELLED;
    return COACTO_OK;
}

coacto_status coacto_inference_get_output(coacto_inference *inf, int32_t li, float *out,
                                          int64_t n_floats) {
    if (!inf || !out || li < 0 || li >= inf->g->n_layers) return COACTO_ERR_INVALID_ARGUMENT;
    const coacto_graph *g = inf->g;
    if (n_floats != g->layer_floats[li]) return COACTO_ERR_INVALID_ARGUMENT;
    if (!(g->layer_flags[li] & COACTO_LAYER_KEEP)) return COACTO_ERR_INVALID_ARGUMENT;
    for (int32_t t = g->layer_first_tile[li]; t < g->layer_first_tile[li + 1]; t++)
        if (atomic_load(&inf->state[t]) != COACTO_TILE_COMPLETED) return COACTO_ERR_STATE;
    const float *buf = atomic_load(&inf->buffers[li]);
    if (!buf) return COACTO_ERR_STATE;
    memcpy(out, buf, (size_t)n_floats * sizeof(float));
    return COACTO_OK;
}

coacto_status coacto_inference_get_stats(const coacto_inference *inf, coacto_inference_stats *out) {
    if (!inf || !out) return COACTO_ERR_INVALID_ARGUMENT;
    out->tiles_total = inf->g->n_tiles;
    out->tiles_computed = atomic_load(&inf->tiles_computed);
    out->tiles_external = atomic_load(&inf->tiles_external);
    out->tiles_dropped = atomic_load(&inf->tiles_dropped);
    out->seconds = (inf->t_end > 0 && inf->t_start > 0) ? inf->t_end - inf->t_start : 0.0;
    out->peak_bytes = atomic_load(&inf->bytes_peak);
    out->tiles_sent = atomic_load(&inf->tiles_sent);
    out->bytes_sent = atomic_load(&inf->bytes_sent);
    out->bytes_sent_raw = atomic_load(&inf->bytes_sent_raw);
    pthread_mutex_t *busy_mu = (pthread_mutex_t *)&inf->busy_mu; /* (a read; the lock is not state) */
    pthread_mutex_lock(busy_mu);
    out->busy_seconds = inf->busy_seconds +
                        (inf->busy_active > 0 ? coacto_now_seconds() - inf->busy_since : 0.0);
    pthread_mutex_unlock(busy_mu);
    return COACTO_OK;
}

coacto_status coacto_inference_computed_mask(const coacto_inference *inf, uint8_t *mask,
                                             int32_t n) {
    if (!inf || !mask || n != inf->g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
    for (int32_t t = 0; t < n; t++) mask[t] = inf->tile_worker[t] != -1;
    return COACTO_OK;
}

int32_t coacto_inference_tile_state(const coacto_inference *inf, int32_t tile) {
    if (!inf || tile < 0 || tile >= inf->g->n_tiles) return -1;
    return atomic_load(&inf->state[tile]);
}

void coacto_inference_cancel(coacto_inference *inf) {
    if (!inf) return;
    atomic_store(&inf->cancelled, 1);
    pool_purge(inf->rt, inf);
    signal_done(inf);
}

void coacto_inference_destroy(coacto_inference *inf) {
    if (!inf) return;
    coacto_inference_cancel(inf);
    pthread_mutex_lock(&inf->mu);
    while (atomic_load(&inf->inflight) > 0) pthread_cond_wait(&inf->cv, &inf->mu);
    pthread_mutex_unlock(&inf->mu);
    for (int32_t li = 0; li < inf->g->n_layers; li++) {
        float *buf = atomic_load(&inf->buffers[li]);
        if (alias_of(inf, li) >= 0) continue; /* the residual's, put with it (its uses are held) */
        if (buf) graph_buffer_put(inf->g, buf, inf->g->layer_floats[li] * (int64_t)sizeof(float));
    }
    pthread_mutex_destroy(&inf->mu);
    pthread_mutex_destroy(&inf->busy_mu);
    pthread_cond_destroy(&inf->cv);
    offload_release(inf);
    graph_release(inf->g);
    free(inf->state);
    free(inf->parents_left);
    free(inf->tile_worker);
    free(inf->buffers);
    free(inf->uses_left);
    free(inf);
}
