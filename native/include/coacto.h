/* coacto native tile runtime: the one public header.
 *
 * Opaque handles with create/destroy pairs; every fallible call returns a coacto_status and never
 * aborts on bad input. This file is also read by the cffi builder (coacto/_build.py), which drops
 * the preprocessor lines: keep declarations plain (no macros in declarations, no inline bodies). */
#ifndef COACTO_H
#define COACTO_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum coacto_status {
    COACTO_OK = 0,
    COACTO_ERR_INVALID_ARGUMENT = 1,
    COACTO_ERR_OUT_OF_MEMORY = 2,
    COACTO_ERR_INVALID_GRAPH = 3,
    COACTO_ERR_TIMEOUT = 4,
    COACTO_ERR_CANCELLED = 5,
    COACTO_ERR_DUPLICATE = 6,
    COACTO_ERR_THREAD = 7,
    COACTO_ERR_STATE = 8
} coacto_status;

/* Op codes: shared with coacto/ir.py (OP_*). */
enum {
    COACTO_OP_INPUT = 0,
    COACTO_OP_CONV = 1,
    COACTO_OP_POOL = 2,
    COACTO_OP_GLOBAL_POOL = 3,
    COACTO_OP_BINARY = 4,
    COACTO_OP_AFFINE = 5,
    COACTO_OP_CONCAT = 6,
    COACTO_OP_GATHER = 7,
    COACTO_OP_LRN = 8,
    COACTO_OP_SOFTMAX = 9,
    COACTO_OP_NOP = 10,
    COACTO_OP_MATMUL = 11,
    COACTO_OP_LAYERNORM = 12,
    COACTO_OP_ROW_REDUCE = 13,
    COACTO_OP_WHERE = 14,
    COACTO_OP_EMBED = 15,
    COACTO_OP_ATTENTION = 16,
    COACTO_OP_COUNT = 17
};

/* Activations: shared with coacto/ir.py (ACT_*). */
enum {
    COACTO_ACT_NONE = 0,
    COACTO_ACT_RELU = 1,
    COACTO_ACT_CLIP = 2,
    COACTO_ACT_LEAKY = 3,
    COACTO_ACT_SIGMOID = 4,
    COACTO_ACT_HARDSIGMOID = 5,
    COACTO_ACT_HARDSWISH = 6,
    COACTO_ACT_TANH = 7,
    COACTO_ACT_SQRT = 8,
    COACTO_ACT_ERF = 9,
    COACTO_ACT_GELU = 10,
    COACTO_ACT_GELU_TANH = 11,
    COACTO_ACT_RECIPROCAL = 12,
    COACTO_ACT_EXP = 13,
    COACTO_ACT_ISNAN = 14,
    COACTO_ACT_ELU = 15,
    COACTO_ACT_SELU = 16,
    COACTO_ACT_CELU = 17,
    COACTO_ACT_SOFTPLUS = 18,
    COACTO_ACT_SOFTSIGN = 19,
    COACTO_ACT_THRESHOLDED_RELU = 20,
    COACTO_ACT_ABS = 21,
    COACTO_ACT_FLOOR = 22,
    COACTO_ACT_CEIL = 23,
    COACTO_ACT_ROUND = 24, /* to nearest, halves to even */
    COACTO_ACT_SIGN = 25,
    COACTO_ACT_LOG = 26,
    COACTO_ACT_COUNT = 27
};

enum { COACTO_LAYER_KEEP = 1 };

/* Tile states of one inference. */
enum {
    COACTO_TILE_NOT_READY = 0,
    COACTO_TILE_READY = 1,
    COACTO_TILE_RUNNING = 2,
    COACTO_TILE_COMPLETED = 3
};

/* One layer of a tile graph. Its output is an (n, c, h, w) activation stored NHWC: column
 * (ni*h + y)*w + x holds the c channels of that position contiguously.
 * iparams / fparams / arrays are op-specific; their meaning per op is documented in
 * native/src/ops.h. arrays[i] is a byte range [array_offset[i], array_offset[i] + array_size[i])
 * of the graph's blob (64-byte aligned offsets). */
typedef struct coacto_layer_desc {
    int32_t op;
    int32_t n_inputs;
    int32_t inputs[8];
    int32_t n, c, h, w;
    int32_t iparams[32];
    float fparams[8];
    int64_t array_offset[4];
    int64_t array_size[4];
    int32_t flags; /* COACTO_LAYER_KEEP: a graph output; its buffer lives until the inference dies */
} coacto_layer_desc;

/* A whole tile graph. Tiles are numbered in topological order, grouped by layer (all tiles of a
 * layer are contiguous and layers appear in order); each tile covers columns [col0, col1) and rows
 * [row0, row1) of its layer's output; its parents (tile ids smaller than its own) are given in CSR
 * form. Every tile of an INPUT layer is completed by coacto_inference_set_input. */
typedef struct coacto_graph_desc {
    int32_t n_layers;
    const coacto_layer_desc *layers;
    int32_t n_tiles;
    const int32_t *tile_layer;     /* [n_tiles] */
    const int32_t *tile_bounds;    /* [n_tiles * 4]: col0, col1, row0, row1 */
    const int32_t *parent_offsets; /* [n_tiles + 1] */
    const int32_t *parents;        /* [parent_offsets[n_tiles]] */
    const uint8_t *blob;
    int64_t blob_size;
    /* 1: the blob is a read-only file mapping; the pages of weights the runtime packs into its
     * own copy are dropped (madvise MADV_DONTNEED, re-read from the file if touched again) as
     * each layer is packed, so loading never holds the weights twice. 0 for any other memory. */
    int32_t blob_reclaimable;
} coacto_graph_desc;

typedef struct coacto_inference_stats {
    int64_t tiles_total;
    int64_t tiles_computed;  /* by this runtime's threads */
    int64_t tiles_external;  /* completed by coacto_inference_put_tile */
    int64_t tiles_dropped;   /* external copies that lost the race */
    double seconds;          /* start to last completion */
    int64_t peak_bytes;      /* activation memory high-water mark */
    int64_t tiles_sent;      /* queued for sending by the offloading plan */
    int64_t bytes_sent;      /* their bytes as queued (encoded) */
    int64_t bytes_sent_raw;  /* the same tiles as float32 */
    double busy_seconds;     /* wall time with at least one computing thread on its tiles (a
                              * server's span also waits for the inputs to arrive) */
} coacto_inference_stats;

typedef struct coacto_runtime coacto_runtime;
typedef struct coacto_graph coacto_graph;
typedef struct coacto_inference coacto_inference;

const char *coacto_status_string(coacto_status status);

/* What the runtime expects of an op (native/src/ops.c's table): its name, how many inputs it
 * takes, how many array slots it reads (the others must be absent) and how many iparams and
 * fparams it reads (the others are ignored). COACTO_ERR_INVALID_ARGUMENT for an unknown op. */
typedef struct coacto_op_info {
    const char *name;
    int32_t min_inputs, max_inputs;
    int32_t arrays, iparams, fparams;
} coacto_op_info;
coacto_status coacto_op_contract(int32_t op, coacto_op_info *out);
/* Name of the GEMM micro-kernel in use (e.g. "gemm_f32_14x32__avx512f"): the best this CPU runs
 * up to the cap COACTO_ISA sets in the environment before the first call (scalar, avx2, avx512
 * or neon; COACTO_FORCE_SCALAR=1 is the older spelling of scalar). The element-wise and pooling
 * loops are compiled for x86-64-v3 and baseline and picked by the CPU alone. */
const char *coacto_gemm_kernel_name(void);
/* Every GEMM micro-kernel this CPU runs, best first, comma-separated (the cap aside). */
const char *coacto_gemm_kernels_available(void);
/* The GEMM blocking on this machine and the caches it is derived from: block_k reduction values
 * per block (a packed panel slice, block_k x the kernel's NR floats, fills half the L1 data
 * cache), block_m rows per pass over the panels (their block_k-long rows fill a quarter of L2;
 * also the positions per im2col block of a convolution). cache_source: "sysfs", "sysconf",
 * "assumed" or "environment" (COACTO_L1D_BYTES / COACTO_L2_BYTES, read before the first call). */
typedef struct coacto_blocking {
    int64_t l1d_bytes, l2_bytes, block_k, block_m;
    const char *cache_source;
} coacto_blocking;
void coacto_gemm_blocking(coacto_blocking *out);

/* A runtime owns the computing threads and the ready pool; any number of graphs and inferences
 * share it. */
coacto_status coacto_runtime_create(int32_t n_threads, coacto_runtime **out);
void coacto_runtime_destroy(coacto_runtime *rt);
int32_t coacto_runtime_threads(const coacto_runtime *rt);
/* Sets the scheduling priority (nice, -20..19) of the computing threads. A device gives them a
 * lower priority than its communication engine so computing never delays sending. */
coacto_status coacto_runtime_set_worker_nice(coacto_runtime *rt, int32_t nice);
/* Work is about to come (an inference the caller is starting): sleeping computing threads wake
 * now and poll for it, rather than when its first tiles are pushed, so that their wake-up
 * overlaps the caller's preparation (reading the inputs). Does nothing when none sleeps. */
void coacto_runtime_heads_up(coacto_runtime *rt);

/* Validates the description completely (a corrupt file must not crash the runtime) and copies /
 * packs what it needs; the description may be freed afterwards. On failure a message is written
 * to err (may be NULL). */
coacto_status coacto_graph_create(const coacto_graph_desc *desc, coacto_graph **out, char *err,
                                  size_t err_size);
/* The same model cut into other tiles: a graph whose layers are `weights`'s, packed weights
 * included (not packed or held twice), with its own tiles and edges from `desc`. Every layer
 * of `desc` must describe the same layer as `weights`'s (op, inputs, dims, parameters, array
 * sizes: checked, COACTO_ERR_INVALID_GRAPH otherwise); its blob is not read (may be NULL).
 * The new graph holds a reference on `weights`: either may be destroyed first. */
coacto_status coacto_graph_create_sharing(const coacto_graph_desc *desc, coacto_graph *weights,
                                          coacto_graph **out, char *err, size_t err_size);
void coacto_graph_destroy(coacto_graph *graph);
int32_t coacto_graph_tile_count(const coacto_graph *graph);
/* Gives the memory of the graph's activation arena that no running inference holds back to the
 * system (the whole arena when none runs); returns the bytes given back. Later inferences map
 * it again. A server calls it when idle, so a burst does not leave the process holding its peak.
 * Safe from any thread. */
int64_t coacto_graph_release_buffers(coacto_graph *graph);
/* The activation arena: the bytes of address space its regions reserve, and how many of them
 * have ever been written (each region's furthest block end handed out or prefaulted, summed).
 * Safe from any thread. */
coacto_status coacto_graph_arena_bytes(coacto_graph *graph, int64_t *reserved, int64_t *touched);
/* Makes the first `bytes` of the activation arena resident (its regions counted in the order
 * they were mapped; the arena is mapped first if it is not yet), so that an inference which
 * places its buffers further than earlier ones did does not fault the pages in while it runs.
 * Only free blocks are written, a byte per page; returns how many bytes of free blocks it
 * covered. It holds the arena's lock while it writes: buffers of inferences running on the
 * graph wait for it. Safe from any thread. */
int64_t coacto_graph_arena_prefault(coacto_graph *graph, int64_t bytes);
/* Per-layer profile: while enabled, the computing threads add each tile's execution time to its
 * layer's total (two clock reads per tile). Enabling resets the totals. layer_seconds receives
 * n_layers totals (n_layers must be the graph's layer count). */
coacto_status coacto_graph_set_profiling(coacto_graph *graph, int32_t enable);
coacto_status coacto_graph_layer_seconds(const coacto_graph *graph, double *layer_seconds,
                                         int32_t n_layers);
/* While profiling, each computed tile's start and end (seconds of a monotonic clock) and worker
 * index are recorded (the last inference's); a tile not computed here since profiling was
 * enabled has worker -1. Each array holds n_tiles (the graph's tile count). */
coacto_status coacto_graph_tile_trace(const coacto_graph *graph, double *t0, double *t1,
                                      int32_t *worker, int32_t n_tiles);

coacto_status coacto_inference_create(coacto_runtime *rt, coacto_graph *graph,
                                      coacto_inference **out);
/* In-place residuals, before the first input is set (COACTO_ERR_STATE after): with on != 0 a
 * layer the graph found safe for it (coacto_graph_layer_alias) writes its output into the buffer
 * of its residual input, which the runtime then frees with the layer's own, as onnxruntime and
 * OpenVINO write a convolution's sum into its residual. Only for an inference whose every tile is
 * computed here: puts (coacto_inference_put_tile and the batch forms) are refused with
 * COACTO_ERR_STATE, and a plan (coacto_inference_set_plan) turns it off. */
coacto_status coacto_inference_set_inplace(coacto_inference *inf, int32_t on);
/* The layer whose buffer `layer` writes its output into under coacto_inference_set_inplace (its
 * residual input), -1 when none, -2 when layer is out of range. */
int32_t coacto_graph_layer_alias(const coacto_graph *graph, int32_t layer);
/* Copies an input layer's NHWC data (exactly n*h*w*c floats) and completes its tiles. */
coacto_status coacto_inference_set_input(coacto_inference *inf, int32_t layer, const float *data,
                                         int64_t n_floats);
/* The same from data in ONNX order (NCHW): transposed into the runtime's layout while copied. */
coacto_status coacto_inference_set_input_nchw(coacto_inference *inf, int32_t layer,
                                              const float *data, int64_t n_floats);
/* Completes a tile from outside (e.g. received from the network): copies its (col1 - col0) *
 * (row1 - row0) floats, column by column. Exactly once: returns COACTO_ERR_DUPLICATE when the tile
 * was already completed or is being computed. */
coacto_status coacto_inference_put_tile(coacto_inference *inf, int32_t tile, const float *data,
                                        int64_t n_floats);
/* A batch of put_tile: n tiles whose data is concatenated in ids order. Every id and the total
 * size are checked before any tile is applied; duplicates are counted, not errors. */
coacto_status coacto_inference_put_tiles(coacto_inference *inf, const int32_t *ids, int32_t n,
                                         const float *data, int64_t n_floats, int32_t *accepted,
                                         int32_t *duplicates);
/* Waits until every tile of the output (KEEP) layers is completed (COACTO_OK), the timeout
 * passes (COACTO_ERR_TIMEOUT; negative timeout waits forever), or the inference failed (its
 * error). Tiles still running then are cancelled by coacto_inference_destroy. */
coacto_status coacto_inference_wait(coacto_inference *inf, double timeout_s);
coacto_status coacto_inference_get_output(coacto_inference *inf, int32_t layer, float *out,
                                          int64_t n_floats);
coacto_status coacto_inference_get_stats(const coacto_inference *inf, coacto_inference_stats *out);
int32_t coacto_inference_tile_state(const coacto_inference *inf, int32_t tile);
/* mask[t] = 1 for the tiles this runtime's computing threads computed in this inference (not
 * those put from outside, nor those no one computed; tiles with nothing to compute count, at 0
 * FLOPs); n: the graph's tile count. */
coacto_status coacto_inference_computed_mask(const coacto_inference *inf, uint8_t *mask, int32_t n);
/* Stops the inference; from any thread, without blocking. Its tasks leave the ready pool, a tile
 * in progress stops at its next piece (tiles of more than about 128 MFLOP run in pieces: a few
 * milliseconds each on a desktop core), and waiters wake with COACTO_ERR_CANCELLED. */
void coacto_inference_cancel(coacto_inference *inf);
/* Cancels if still running and waits for tiles in flight on the computing threads. */
void coacto_inference_destroy(coacto_inference *inf);

/* ------------------------------------------------------------------ offloading (docs/ARCHITECTURE.md §5)
 *
 * An inference can carry a per-tile plan: which tiles this runtime may compute (the others are
 * parked when they become ready, until they arrive from outside or coacto_inference_compute_all
 * unparks them), and what happens to a tile once this runtime completed it: never sent, always
 * sent, or sent when the ECT rule says the server gets it sooner that way:
 *     max(now + (bytes queued + tile bytes) / bandwidth + rtt / 2,
 *         inputs_at_server + tile bytes / bandwidth)          (the input goes first)
 *         <  inputs_at_server + alpha * work(tile) / server_flops
 * Sent tiles are copied into the inference's send queue (shallowest first) and announced on the
 * runtime's report queue, whose file descriptor becomes readable when reports are pending (poll it
 * with zmq.Poller / select). Tiles marked `report` and the end of the whole inference are announced
 * there too (REPORT_DONE also when it failed: coacto_inference_wait then returns its error). All times are seconds on coacto_now_seconds()'s clock. */
enum { COACTO_SEND_NEVER = 0, COACTO_SEND_ALWAYS = 1, COACTO_SEND_DECIDE = 2 };
enum { COACTO_REPORT_SEND = 1, COACTO_REPORT_TILE = 2, COACTO_REPORT_DONE = 3 };

typedef struct coacto_offload_params {
    double bandwidth;        /* bytes per second (goodput estimate); <= 0: never decide to send */
    double rtt;              /* seconds */
    double inputs_at_server; /* when the server holds the input tiles */
    double server_flops;     /* FLOP/s the server gives this device */
    double alpha;            /* server contention, >= 1 */
} coacto_offload_params;

typedef struct coacto_report {
    uint64_t tag;            /* the inference's tag (coacto_inference_set_plan) */
    int32_t kind;            /* COACTO_REPORT_* */
    int32_t tile;            /* -1 for DONE */
} coacto_report;

double coacto_now_seconds(void);
/* The send rule above, the one implementation the runtime and the simulator (coacto.sim) both
 * call: 1 when sending a tile of tile_bytes, with queued_bytes ahead of it on the link at time
 * now, gets it to the server sooner than the server computing it (work: FLOPs from the inputs),
 * else 0 (also when the estimates cannot decide: bandwidth or server_flops not positive). The two
 * completion times are written where the pointers are not NULL (+inf when undecidable). */
int32_t coacto_send_rule(const coacto_offload_params *params, double now, double queued_bytes,
                         double tile_bytes, double work, double *ect_offloaded, double *ect_server);
/* Per-tile plan, before the first input is set. Arrays of n_tiles bytes; NULL keeps the default
 * (local: every tile; send: never; report: none). tag identifies the inference in reports. */
coacto_status coacto_inference_set_plan(coacto_inference *inf, const uint8_t *local,
                                        const uint8_t *send, const uint8_t *report, uint64_t tag);
/* work[t]: FLOPs the server needs to produce tile t from the inputs (t and its ancestors). */
coacto_status coacto_graph_set_work(coacto_graph *graph, const double *work, int32_t n_tiles);
coacto_status coacto_inference_set_offload_params(coacto_inference *inf,
                                                  const coacto_offload_params *params);
/* Fallback: this runtime computes every remaining tile itself (parked tiles are scheduled). */
coacto_status coacto_inference_compute_all(coacto_inference *inf);
/* As coacto_inference_compute_all, but the tiles outside the plan's local set come after its own:
 * they wait in a queue of their own that a computing thread takes from only when no row of the
 * ready pool holds another tile, and a planned tile's worker does not go on into one. A device
 * share or a streamed cut whose rest starts as insurance keeps sending what the server waits for
 * first. A later coacto_inference_compute_all (a fallback) drops the order for tiles pushed
 * after it. */
coacto_status coacto_inference_compute_rest(coacto_inference *inf);
/* Moves queued tiles (shallowest first) into ids / data until max_ids or max_floats would be
 * exceeded (at least one tile if any is queued and fits). Each tile's data is column by column,
 * (col1 - col0) * (row1 - row0) floats, as coacto_inference_put_tile takes it. Returns the count. */
int32_t coacto_inference_take_sends(coacto_inference *inf, int32_t *ids, int32_t max_ids,
                                    float *data, int64_t max_floats, int64_t *n_floats);
int64_t coacto_inference_queued_bytes(const coacto_inference *inf);
/* Transfer encodings of tile data (PROTOCOL.md §2): RAW sends the floats as they are; the others
 * send each tile dense or as a bitmap of its non-zero values (by bit pattern) plus those values,
 * whichever is smaller, as float32 (LOSSLESS: bit-exact), float16 (F16: round to nearest even,
 * beyond 65504 infinite) or int8 with a float32 per-tile scale max|x| / 127 first (INT8: NaN
 * becomes 0, infinities the largest finite magnitude). */
enum { COACTO_TRANSFER_RAW = 0, COACTO_TRANSFER_LOSSLESS = 1, COACTO_TRANSFER_F16 = 2,
       COACTO_TRANSFER_INT8 = 3 };
/* Bytes n floats take in `mode` (0: bad arguments). */
int64_t coacto_wire_size(int32_t mode, const float *x, int64_t n);
/* Encodes n floats into out (which holds coacto_wire_size bytes); returns the bytes written. */
int64_t coacto_wire_encode(int32_t mode, const float *x, int64_t n, uint8_t *out);
/* Decodes one tile of n floats from len bytes; COACTO_ERR_INVALID_ARGUMENT when len, the bitmap
 * (its count of ones, bits past the n-th) or an int8 scale does not describe n floats. */
coacto_status coacto_wire_decode(int32_t mode, const uint8_t *in, int64_t len, float *out,
                                 int64_t n);
/* Tiles sent by this inference are queued encoded in `mode` and the send rule prices each at its
 * encoded size (default RAW; before the first input is set). measure != 0 also sums, per layer,
 * the raw and encoded bytes of every tile completed here (coacto_inference_wire_bytes). */
coacto_status coacto_inference_set_transfer(coacto_inference *inf, int32_t mode, int32_t measure);
/* One layer's tiles in another mode than the inference's (e.g. lossless for integer inputs such as
 * token ids, which a lossy mode would corrupt); after set_transfer, before the first input. */
coacto_status coacto_inference_set_layer_transfer(coacto_inference *inf, int32_t layer,
                                                  int32_t mode);
/* Per layer: raw and encoded bytes of the tiles completed here so far (n_layers entries each). */
coacto_status coacto_inference_wire_bytes(const coacto_inference *inf, int64_t *raw,
                                          int64_t *encoded, int32_t n_layers);
/* take_sends, encoded: queued tiles (shallowest first) of one transfer mode (written to *mode:
 * the first queued tile's; a tile of another mode ends the batch), each tile's encoded length in
 * lens, the bytes concatenated in data, until max_ids or max_bytes would be exceeded (at least
 * one tile if any is queued and fits). Returns the count. */
int32_t coacto_inference_take_sends_encoded(coacto_inference *inf, int32_t *ids, int32_t *lens,
                                            int32_t max_ids, uint8_t *data, int64_t max_bytes,
                                            int64_t *n_bytes, int32_t *mode);
/* put_tiles from encoded data: lens[i] bytes of tile ids[i], concatenated. Every id, length and
 * bitmap is checked before any tile is applied. */
coacto_status coacto_inference_put_tiles_encoded(coacto_inference *inf, int32_t mode,
                                                 const int32_t *ids, const int32_t *lens, int32_t n,
                                                 const uint8_t *data, int64_t n_bytes,
                                                 int32_t *accepted, int32_t *duplicates);
/* get_tiles, encoded: lens[i] receives tile ids[i]'s encoded length; COACTO_ERR_INVALID_ARGUMENT
 * if they would not fit in max_bytes (4 bytes per float plus 4 per tile always suffice). */
coacto_status coacto_inference_get_tiles_encoded(coacto_inference *inf, int32_t mode,
                                                 const int32_t *ids, int32_t n, int32_t *lens,
                                                 uint8_t *out, int64_t max_bytes, int64_t *n_bytes);
/* Copies a completed tile's data (column by column). COACTO_ERR_STATE if not completed or its
 * buffer is gone (only KEEP layers are guaranteed to stay). */
coacto_status coacto_inference_get_tile(coacto_inference *inf, int32_t tile, float *out,
                                        int64_t n_floats);
/* A batch of get_tile, data concatenated in ids order (checked before anything is copied). */
coacto_status coacto_inference_get_tiles(coacto_inference *inf, const int32_t *ids, int32_t n,
                                         float *out, int64_t n_floats);
/* Per-inference trace, enabled before the first input is set: every tile this runtime computes
 * for the inference records its start, end (coacto_now_seconds) and worker index (-1: not
 * computed here), and every SEND_DECIDE decision is logged with both completion times. */
typedef struct coacto_decision {
    int32_t tile;
    int32_t sent;            /* 1: queued for sending */
    double time;             /* when decided */
    double ect_offloaded;
    double ect_server;
} coacto_decision;
coacto_status coacto_inference_enable_trace(coacto_inference *inf);
/* Each array holds n_tiles (the graph's tile count). COACTO_ERR_STATE without enable_trace. */
coacto_status coacto_inference_tile_trace(const coacto_inference *inf, double *t0, double *t1,
                                          int32_t *worker, int32_t n_tiles);
/* Copies up to max logged decisions in the order they were made; returns how many. */
int32_t coacto_inference_decisions(const coacto_inference *inf, coacto_decision *out, int32_t max);
int32_t coacto_runtime_report_fd(coacto_runtime *rt);
/* Takes up to max pending reports (non-blocking); returns how many. */
int32_t coacto_runtime_take_reports(coacto_runtime *rt, coacto_report *out, int32_t max);

/* Benchmark hook: runs C[m x n] = A[m x k] * B[k x n] with the selected kernel (B packed once,
 * outside the timing) `repeats` times and returns the best time in seconds, or a negative value on
 * bad arguments. */
double coacto_gemm_benchmark(int32_t m, int32_t n, int32_t k, int32_t repeats);

#ifdef __cplusplus
}
#endif
#endif
