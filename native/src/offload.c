/* Offloading support of the runtime (docs/ARCHITECTURE.md §5): per-tile plans, the ECT send decision, the
 * send queue, and the report queue the communication engine polls. Per-tile work here is C: the
 * decision, the copy into the send queue and the announcement cost well under 5 us per tile. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ring.h"
#include "runtime_internal.h"

/* ---------------------------------------------------------------- report queue */

int report_queue_init(report_queue *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    q->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return q->fd >= 0;
}

void report_queue_destroy(report_queue *q) {
    if (q->fd >= 0) close(q->fd);
    free(q->items);
    pthread_mutex_destroy(&q->mu);
}

void report_push(coacto_runtime *rt, uint64_t tag, int32_t kind, int32_t tile) {
    report_queue *q = &rt->reports;
    pthread_mutex_lock(&q->mu);
    if (!ring_reserve((void **)&q->items, &q->cap, &q->head, q->count, sizeof(coacto_report), 256)) {
        pthread_mutex_unlock(&q->mu);
        return; /* a lost report only delays the engine until its next poll timeout */
    }
    q->items[(q->head + q->count) % q->cap] = (coacto_report){tag, kind, tile};
    q->count++;
    pthread_mutex_unlock(&q->mu);
    uint64_t one = 1;
    ssize_t w = write(q->fd, &one, sizeof one);
    (void)w; /* EAGAIN only when the counter is saturated: it is readable anyway */
}

int32_t coacto_runtime_report_fd(coacto_runtime *rt) { return rt ? rt->reports.fd : -1; }

int32_t coacto_runtime_take_reports(coacto_runtime *rt, coacto_report *out, int32_t max) {
    if (!rt || !out || max <= 0) return 0;
    report_queue *q = &rt->reports;
    uint64_t counter;
    ssize_t r = read(q->fd, &counter, sizeof counter);
    (void)r;
    pthread_mutex_lock(&q->mu);
    uint32_t n = q->count < (uint32_t)max ? q->count : (uint32_t)max;
    for (uint32_t i = 0; i < n; i++) out[i] = q->items[(q->head + i) % q->cap];
    if (n) {
        q->head = (q->head + n) % q->cap;
        q->count -= n;
    }
    int more = q->count > 0;
    pthread_mutex_unlock(&q->mu);
    if (more) {
        uint64_t one = 1;
        ssize_t w = write(q->fd, &one, sizeof one);
        (void)w;
    }
    return (int32_t)n;
}

/* ---------------------------------------------------------------- plan */

int tile_is_local(const coacto_inference *inf, int32_t tile) {
    return !inf->plan_local || inf->plan_local[tile] ||
           atomic_load_explicit(&inf->compute_all, memory_order_acquire);
}

static coacto_status copy_mask(uint8_t **dst, const uint8_t *src, int32_t n) {
    free(*dst);
    *dst = NULL;
    if (!src) return COACTO_OK;
    *dst = malloc((size_t)n);
    if (!*dst) return COACTO_ERR_OUT_OF_MEMORY;
    memcpy(*dst, src, (size_t)n);
    return COACTO_OK;
}

coacto_status coacto_inference_set_plan(coacto_inference *inf, const uint8_t *local,
                                        const uint8_t *send, const uint8_t *report, uint64_t tag) {
    if (!inf) return COACTO_ERR_INVALID_ARGUMENT;
    if (atomic_load(&inf->started)) return COACTO_ERR_STATE;
    int32_t n = inf->g->n_tiles;
    if (send) {
        for (int32_t t = 0; t < n; t++)
            if (send[t] > COACTO_SEND_DECIDE) return COACTO_ERR_INVALID_ARGUMENT;
    }
    coacto_status st = copy_mask(&inf->plan_local, local, n);
    if (st == COACTO_OK) st = copy_mask(&inf->plan_send, send, n);
    if (st == COACTO_OK) st = copy_mask(&inf->plan_report, report, n);
    inf->tag = tag;
    inf->has_plan = 1;
    return st;
}

coacto_status coacto_graph_set_work(coacto_graph *g, const double *work, int32_t n_tiles) {
    if (!g || !work || n_tiles != g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
    double *copy = malloc(sizeof(double) * (size_t)n_tiles);
    if (!copy) return COACTO_ERR_OUT_OF_MEMORY;
    for (int32_t t = 0; t < n_tiles; t++) {
        if (!(work[t] >= 0)) { /* also rejects NaN */
            free(copy);
            return COACTO_ERR_INVALID_ARGUMENT;
        }
        copy[t] = work[t];
    }
    /* Set once per graph before inferences use it; later calls replace it atomically enough for
     * a heuristic, but the old array is kept alive until the graph dies. */
    double *old = __atomic_exchange_n(&g->work, copy, __ATOMIC_ACQ_REL);
    if (old) {
        free(g->work_old);
        g->work_old = old;
    }
    return COACTO_OK;
}

coacto_status coacto_inference_set_offload_params(coacto_inference *inf,
                                                  const coacto_offload_params *p) {
    if (!inf || !p) return COACTO_ERR_INVALID_ARGUMENT;
    if (!(p->rtt >= 0) || !(p->alpha >= 1.0) || !(p->server_flops > 0) || p->bandwidth != p->bandwidth)
        return COACTO_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&inf->params_mu);
    inf->params = *p;
    pthread_mutex_unlock(&inf->params_mu);
    return COACTO_OK;
}

static coacto_status compute_everything(coacto_inference *inf, int rest_last);

coacto_status coacto_inference_compute_rest(coacto_inference *inf) {
    if (!inf) return COACTO_ERR_INVALID_ARGUMENT;
    return compute_everything(inf, 1);
}

coacto_status coacto_inference_compute_all(coacto_inference *inf) {
    if (!inf) return COACTO_ERR_INVALID_ARGUMENT;
    return compute_everything(inf, 0); /* (a fallback after compute_rest: no order left) */
}

static coacto_status compute_everything(coacto_inference *inf, int rest_last) {
    atomic_store_explicit(&inf->rest_last, rest_last, memory_order_release);
    atomic_store_explicit(&inf->compute_all, 1, memory_order_release);
    if (!inf->plan_local) return COACTO_OK;
    /* Tiles parked before the flag was seen: schedule them (a tile readied concurrently may be
     * pushed twice; the second copy loses the READY -> RUNNING race and is dropped). */
    for (int32_t t = 0; t < inf->g->n_tiles; t++) {
        if (!inf->plan_local[t] && atomic_load(&inf->state[t]) == COACTO_TILE_READY)
            runtime_schedule(inf, t);
    }
    return COACTO_OK;
}

/* ---------------------------------------------------------------- send decision and queue */

int32_t coacto_send_rule(const coacto_offload_params *p, double now, double queued_bytes,
                         double tile_bytes, double work, double *ect_offloaded, double *ect_server) {
    double off = INFINITY, srv = INFINITY;
    int32_t send = 0;
    if (p && p->bandwidth > 0 && p->server_flops > 0 && work >= 0) {
        off = now + (queued_bytes + tile_bytes) / p->bandwidth + 0.5 * p->rtt;
        /* The input goes first on the same link: no tile reaches the server before it, whatever
         * the engine still holds beyond this queue. */
        double after_inputs = p->inputs_at_server + tile_bytes / p->bandwidth;
        if (after_inputs > off) off = after_inputs;
        srv = p->inputs_at_server + p->alpha * work / p->server_flops;
        send = off < srv;
    }
    if (ect_offloaded) *ect_offloaded = off;
    if (ect_server) *ect_server = srv;
    return send;
}

static int send_decided(coacto_inference *inf, int32_t tile, int64_t bytes) {
    int mode = inf->plan_send[tile];
    if (mode == COACTO_SEND_ALWAYS) return 1;
    if (mode != COACTO_SEND_DECIDE) return 0;
    const double *work = __atomic_load_n(&inf->g->work, __ATOMIC_ACQUIRE);
    if (!work) return 0;
    pthread_mutex_lock(&inf->params_mu);
    coacto_offload_params p = inf->params;
    pthread_mutex_unlock(&inf->params_mu);
    double now = coacto_now_seconds();
    double queued = (double)atomic_load_explicit(&inf->send_bytes, memory_order_relaxed);
    double off, srv;
    int send = coacto_send_rule(&p, now, queued, (double)bytes, work[tile], &off, &srv);
    if (inf->decisions) {
        int i = atomic_fetch_add_explicit(&inf->n_decisions, 1, memory_order_relaxed);
        if (i < inf->g->n_tiles) inf->decisions[i] = (coacto_decision){tile, send, now, off, srv};
    }
    return send;
}

coacto_status coacto_inference_set_transfer(coacto_inference *inf, int32_t mode,
                                            int32_t measure) {
    if (!inf || mode < COACTO_TRANSFER_RAW || mode > COACTO_TRANSFER_INT8)
        return COACTO_ERR_INVALID_ARGUMENT;
    if (atomic_load(&inf->started)) return COACTO_ERR_STATE;
    inf->transfer = mode;
    if (measure && !inf->wire_raw) {
        size_t nl = (size_t)inf->g->n_layers;
        inf->wire_raw = calloc(nl ? nl : 1, sizeof(atomic_long));
        inf->wire_encoded = calloc(nl ? nl : 1, sizeof(atomic_long));
        if (!inf->wire_raw || !inf->wire_encoded) {
            free(inf->wire_raw), free(inf->wire_encoded);
            inf->wire_raw = inf->wire_encoded = NULL;
            return COACTO_ERR_OUT_OF_MEMORY;
        }
    }
    return COACTO_OK;
}

coacto_status coacto_inference_set_layer_transfer(coacto_inference *inf, int32_t layer,
                                                  int32_t mode) {
    if (!inf || layer < 0 || layer >= inf->g->n_layers || mode < COACTO_TRANSFER_RAW ||
        mode > COACTO_TRANSFER_INT8)
        return COACTO_ERR_INVALID_ARGUMENT;
    if (atomic_load(&inf->started)) return COACTO_ERR_STATE;
    if (!inf->layer_transfer) {
        inf->layer_transfer = malloc((size_t)inf->g->n_layers);
        if (!inf->layer_transfer) return COACTO_ERR_OUT_OF_MEMORY;
        memset(inf->layer_transfer, -1, (size_t)inf->g->n_layers);
    }
    inf->layer_transfer[layer] = (int8_t)mode;
    return COACTO_OK;
}

coacto_status coacto_inference_wire_bytes(const coacto_inference *inf, int64_t *raw,
                                          int64_t *encoded, int32_t n_layers) {
    if (!inf || !raw || !encoded || n_layers != inf->g->n_layers) return COACTO_ERR_INVALID_ARGUMENT;
    if (!inf->wire_raw) return COACTO_ERR_STATE;
    for (int32_t li = 0; li < n_layers; li++) {
        raw[li] = atomic_load(&inf->wire_raw[li]);
        encoded[li] = atomic_load(&inf->wire_encoded[li]);
    }
    return COACTO_OK;
}

void offload_on_local_completion(coacto_inference *inf, int32_t tile, const float *layer_buf) {
    if (!layer_buf) return;
    const coacto_graph *g = inf->g;
    const int32_t li = g->tile_layer[tile];
    const int mode = inf->layer_transfer && inf->layer_transfer[li] >= 0 ? inf->layer_transfer[li]
                                                                         : inf->transfer;
    int64_t n = tile_floats(g, tile), wire = -1;
    if (inf->wire_raw) {
        wire = wire_size_from_nnz(mode, n, mode == COACTO_TRANSFER_RAW
                                               ? n : wire_tile_nnz(g, tile, layer_buf));
        atomic_fetch_add_explicit(&inf->wire_raw[li], (long)(n * 4), memory_order_relaxed);
        atomic_fetch_add_explicit(&inf->wire_encoded[li], (long)wire, memory_order_relaxed);
    }
    if (!inf->plan_send || inf->plan_send[tile] == COACTO_SEND_NEVER) return;
    if (wire < 0)  /* the send rule prices the bytes the tile will take on the wire */
        wire = wire_size_from_nnz(mode, n, (mode == COACTO_TRANSFER_RAW || inf->plan_send[tile] ==
                                            COACTO_SEND_ALWAYS) ? n : wire_tile_nnz(g, tile, layer_buf));
    if (!send_decided(inf, tile, wire)) return;
    float *plain = malloc(sizeof(float) * (size_t)n);
    if (!plain) return; /* not sent: the server computes it itself */
    tile_copy_out(g, tile, layer_buf, plain);
    uint8_t *bytes = (uint8_t *)plain;
    int64_t n_bytes = n * (int64_t)sizeof(float);
    if (mode != COACTO_TRANSFER_RAW) {
        n_bytes = coacto_wire_size(mode, plain, n);
        bytes = malloc((size_t)n_bytes);
        if (!bytes) {
            free(plain);
            return;
        }
        coacto_wire_encode(mode, plain, n, bytes);
        free(plain);
    }
    send_fifo *q = &inf->sendq[g->tile_bucket[tile]];
    pthread_mutex_lock(&inf->send_mu);
    if (!ring_reserve((void **)&q->items, &q->cap, &q->head, q->count, sizeof(send_item), 64)) {
        pthread_mutex_unlock(&inf->send_mu);
        free(bytes);
        return;
    }
    q->items[(q->head + q->count) % q->cap] = (send_item){tile, mode, n_bytes, bytes};
    q->count++;
    long before = atomic_fetch_add(&inf->send_bytes, (long)n_bytes);
    pthread_mutex_unlock(&inf->send_mu);
    atomic_fetch_add(&inf->tiles_sent, 1);
    atomic_fetch_add(&inf->bytes_sent, (long)n_bytes);
    atomic_fetch_add(&inf->bytes_sent_raw, (long)(n * (int64_t)sizeof(float)));
    if (before == 0) report_push(inf->rt, inf->tag, COACTO_REPORT_SEND, tile);
}

/* Moves queued items into the caller's buffers, shallowest first; lens may be NULL. */
static int32_t take_items(coacto_inference *inf, int32_t *ids, int32_t *lens, int32_t max_ids,
                          uint8_t *data, int64_t max_bytes, int64_t *n_bytes, int32_t *mode) {
    int32_t n = 0;
    *mode = -1;
    int64_t used = 0;
    pthread_mutex_lock(&inf->send_mu);
    for (int bkt = 0; bkt < POOL_DEPTH_BUCKETS && n < max_ids; bkt++) {
        send_fifo *q = &inf->sendq[bkt];
        while (q->count && n < max_ids) {
            send_item it = q->items[q->head];
            if (used + it.n_bytes > max_bytes || it.n_bytes > INT32_MAX) goto full;
            if (*mode >= 0 && it.mode != *mode) goto full; /* one mode per message */
            *mode = it.mode;
            memcpy(data + used, it.data, (size_t)it.n_bytes);
            free(it.data);
            if (lens) lens[n] = (int32_t)it.n_bytes;
            ids[n++] = it.tile;
            used += it.n_bytes;
            q->head = (q->head + 1) % q->cap;
            q->count--;
            atomic_fetch_sub(&inf->send_bytes, (long)it.n_bytes);
        }
    }
full:
    pthread_mutex_unlock(&inf->send_mu);
    *n_bytes = used;
    return n;
}

int32_t coacto_inference_take_sends(coacto_inference *inf, int32_t *ids, int32_t max_ids,
                                    float *data, int64_t max_floats, int64_t *n_floats) {
    if (n_floats) *n_floats = 0;
    if (!inf || !ids || !data || max_ids <= 0 || max_floats <= 0) return 0;
    if (inf->transfer != COACTO_TRANSFER_RAW || inf->layer_transfer)
        return 0; /* encoded: take_sends_encoded */
    int64_t used = 0;
    int32_t mode;
    int32_t n = take_items(inf, ids, NULL, max_ids, (uint8_t *)data,
                           max_floats * (int64_t)sizeof(float), &used, &mode);
    if (n_floats) *n_floats = used / (int64_t)sizeof(float);
    return n;
}

int32_t coacto_inference_take_sends_encoded(coacto_inference *inf, int32_t *ids, int32_t *lens,
                                            int32_t max_ids, uint8_t *data, int64_t max_bytes,
                                            int64_t *n_bytes, int32_t *mode) {
    if (n_bytes) *n_bytes = 0;
    if (mode) *mode = inf ? inf->transfer : 0;
    if (!inf || !ids || !lens || !data || max_ids <= 0 || max_bytes <= 0) return 0;
    int64_t used = 0;
    int32_t m;
    int32_t n = take_items(inf, ids, lens, max_ids, data, max_bytes, &used, &m);
    if (n_bytes) *n_bytes = used;
    if (mode && n) *mode = m;
    return n;
}

int64_t coacto_inference_queued_bytes(const coacto_inference *inf) {
    return inf ? atomic_load(&inf->send_bytes) : 0;
}

void offload_release(coacto_inference *inf) {
    for (int bkt = 0; bkt < POOL_DEPTH_BUCKETS; bkt++) {
        send_fifo *q = &inf->sendq[bkt];
        for (uint32_t i = 0; i < q->count; i++) free(q->items[(q->head + i) % q->cap].data);
        free(q->items);
    }
    free(inf->plan_local);
    free(inf->plan_send);
    free(inf->plan_report);
    free(inf->trace_t0);
    free(inf->trace_t1);
    free(inf->trace_worker);
    free(inf->decisions);
    free(inf->wire_raw);
    free(inf->wire_encoded);
    free(inf->layer_transfer);
    pthread_mutex_destroy(&inf->params_mu);
    pthread_mutex_destroy(&inf->send_mu);
}

coacto_status coacto_inference_get_tile(coacto_inference *inf, int32_t tile, float *out,
                                        int64_t n_floats) {
    if (!inf || !out || tile < 0 || tile >= inf->g->n_tiles) return COACTO_ERR_INVALID_ARGUMENT;
    const coacto_graph *g = inf->g;
    int32_t li = g->tile_layer[tile];
    if (n_floats != tile_floats(g, tile)) return COACTO_ERR_INVALID_ARGUMENT;
    if (!(g->layer_flags[li] & COACTO_LAYER_KEEP)) return COACTO_ERR_STATE;
    if (atomic_load(&inf->state[tile]) != COACTO_TILE_COMPLETED) return COACTO_ERR_STATE;
    const float *buf = atomic_load(&inf->buffers[li]);
    if (!buf) return COACTO_ERR_STATE;
    tile_copy_out(g, tile, buf, out);
    return COACTO_OK;
}

/* ---------------------------------------------------------------- per-inference trace */

coacto_status coacto_inference_enable_trace(coacto_inference *inf) {
    if (!inf) return COACTO_ERR_INVALID_ARGUMENT;
    if (atomic_load(&inf->started)) return COACTO_ERR_STATE;
    if (inf->trace_t0) return COACTO_OK;
    size_t n = (size_t)inf->g->n_tiles;
    double *t0 = malloc(sizeof(double) * n), *t1 = malloc(sizeof(double) * n);
    int32_t *w = malloc(sizeof(int32_t) * n);
    coacto_decision *d = malloc(sizeof(coacto_decision) * n);
    if (!t0 || !t1 || !w || !d) {
        free(t0), free(t1), free(w), free(d);
        return COACTO_ERR_OUT_OF_MEMORY;
    }
    for (size_t t = 0; t < n; t++) {
        t0[t] = t1[t] = 0.0;
        w[t] = -1;
    }
    inf->trace_t0 = t0, inf->trace_t1 = t1, inf->trace_worker = w, inf->decisions = d;
    atomic_store(&inf->n_decisions, 0);
    return COACTO_OK;
}

coacto_status coacto_inference_tile_trace(const coacto_inference *inf, double *t0, double *t1,
                                          int32_t *worker, int32_t n_tiles) {
    if (!inf || !t0 || !t1 || !worker || n_tiles != inf->g->n_tiles)
        return COACTO_ERR_INVALID_ARGUMENT;
    if (!inf->trace_t0) return COACTO_ERR_STATE;
    memcpy(t0, inf->trace_t0, sizeof(double) * (size_t)n_tiles);
    memcpy(t1, inf->trace_t1, sizeof(double) * (size_t)n_tiles);
    memcpy(worker, inf->trace_worker, sizeof(int32_t) * (size_t)n_tiles);
    return COACTO_OK;
}

int32_t coacto_inference_decisions(const coacto_inference *inf, coacto_decision *out, int32_t max) {
    if (!inf || !out || max <= 0 || !inf->decisions) return 0;
    int32_t n = atomic_load(&inf->n_decisions);
    if (n > inf->g->n_tiles) n = inf->g->n_tiles;
    if (n > max) n = max;
    /* A slot is claimed before it is written: entries copied while the inference still runs
     * may be the newest few unwritten; read after it ends for an exact log. */
    memcpy(out, inf->decisions, sizeof(coacto_decision) * (size_t)n);
    return n;
}
