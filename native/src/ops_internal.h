/* Shared by the tile executors (ops*.c): per-family prepare / execute entry points, parameter
 * checks, activations. Not part of the runtime's interface (that is ops.h). */
#ifndef COACTO_OPS_INTERNAL_H
#define COACTO_OPS_INTERNAL_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ops.h"

/* Executors never handle more elements per layer than this: keeps every index product inside
 * int64 with room to spare, whatever a graph file claims. */
#define OPS_MAX_ELEMENTS ((int64_t)1 << 40)

/* The direct loops (depthwise, pooling, activations) get an x86-64-v3 (AVX2, FMA) clone next to
 * the baseline build, picked at load time, with GCC on Linux (function multiversioning through
 * ifunc). Not under ThreadSanitizer: the clone resolvers run before its runtime exists. */
#if defined(__SANITIZE_THREAD__)
#define OPS_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OPS_UNDER_TSAN 1
#endif
#endif
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(COACTO_NO_CLONES) && !defined(OPS_UNDER_TSAN)
#define OPS_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define OPS_CLONES
#endif

/* Eight floats as one value (GCC / Clang vector extension): SSE2 pairs on the baseline build, one
 * AVX register in the clones, NEON pairs on aarch64. OPS_F32X8(p) is the 8 floats at p as an
 * lvalue; p needs only float alignment (the type is under-aligned and may alias, like the
 * compilers' own __m256_u). */
typedef float ops_f32x8 __attribute__((vector_size(32)));
typedef float ops_f32x8_u __attribute__((vector_size(32), aligned(4), may_alias));
#define OPS_F32X8(p) (*(ops_f32x8_u *)(p))

/* Writes the message (printf format) and returns COACTO_ERR_INVALID_GRAPH. */
coacto_status ops_fail(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Returns from the calling prepare function (which has err, err_size in scope) when cond fails. */
#define OPS_REQUIRE(cond, ...)                                   \
    do {                                                         \
        if (!(cond)) return ops_fail(err, err_size, __VA_ARGS__); \
    } while (0)

/* a * b for non-negative a, b; -1 when the product exceeds OPS_MAX_ELEMENTS (or either is < 0). */
int64_t ops_mul(int64_t a, int64_t b);
/* Array `index` must hold exactly `bytes` bytes (0: must be absent), float aligned. */
coacto_status ops_check_array(const layer *l, int index, int64_t bytes, const char *what,
                              char *err, size_t err_size);
/* Input i must have exactly the output's dims. */
coacto_status ops_check_same_dims(const layer *l, int i, char *err, size_t err_size);
/* 64-byte aligned allocation of `floats` floats (rounded up to whole cache lines), or NULL. */
float *ops_alloc_floats(size_t floats);

static inline size_t ops_round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* Column index -> (batch, y, x) of a layer with h x w positions per batch. */
typedef struct ops_position {
    int64_t n, y, x;
} ops_position;

static inline ops_position ops_position_of(int64_t col, int64_t h, int64_t w) {
    ops_position p;
    p.x = col % w;
    p.y = (col / w) % h;
    p.n = col / (w * h);
    return p;
}

/* Advances p to the next column without dividing. */
static inline void ops_position_next(ops_position *p, int64_t h, int64_t w) {
    if (++p->x == w) {
        p->x = 0;
        if (++p->y == h) {
            p->y = 0;
            p->n++;
        }
    }
}

/* Taps t of a window starting at i0 (step d, k taps) with 0 <= i0 + t*d < n: [*t0, *t1).
 * Arithmetic rather than a scan, so the cost does not grow with the kernel a graph claims. */
static inline void ops_window_taps(int64_t i0, int64_t k, int64_t d, int64_t n, int64_t *t0,
                                   int64_t *t1) {
    int64_t a = i0 < 0 ? (-i0 + d - 1) / d : 0;
    int64_t b = n - i0 > 0 ? (n - i0 - 1) / d + 1 : 0;
    if (b > k) b = k;
    *t0 = a < b ? a : b;
    *t1 = b;
}

/* Activations. NONE, RELU and CLIP are clamps (fused into GEMM epilogues and direct loops); the
 * others are applied to the finished values. */
static inline int ops_act_valid(int32_t act) {
    return act >= COACTO_ACT_NONE && act < COACTO_ACT_COUNT;
}

static inline int ops_act_is_clamp(int32_t act) {
    return act == COACTO_ACT_NONE || act == COACTO_ACT_RELU || act == COACTO_ACT_CLIP;
}

/* Clamp bounds of act; (-inf, inf) for activations that are not clamps. */
static inline void ops_act_bounds(int32_t act, float alpha, float beta, float *lo, float *hi) {
    *lo = -INFINITY;
    *hi = INFINITY;
    if (act == COACTO_ACT_RELU) {
        *lo = 0.0f;
    } else if (act == COACTO_ACT_CLIP) {
        *lo = alpha;
        *hi = beta;
    }
}

/* Applies act in place to x[0:n]. */
void ops_act_apply(float *x, size_t n, int32_t act, float alpha, float beta);
/* x[i] = e^x[i] in place, relative error below 1e-7 (arguments clamped to [-87, 88]); vectorizes. */
void ops_exp(float *x, size_t n);
float ops_softmax_exp(const float *x, float *e, size_t n, float *max_out);
void ops_scale(const float *x, float *o, size_t n, float s);
/* Sum of x[0:n] (n >= 0) in eight lanes; maximum of x[0:n] (n >= 1), NaN if any is NaN. */
float ops_sum(const float *x, size_t n);
float ops_max(const float *x, size_t n);

/* Per family: prepare validates (the common checks of op_prepare already passed) and fills the
 * prepared fields; execute computes one tile (arguments as op_execute). */
coacto_status conv_prepare(layer *l, char *err, size_t err_size);
void conv_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                  int32_t row0, int32_t row1, float *scratch);
/* ops_winograd.c: F(2x2, 3x3) convolution tiles (stride 1, dilation 1, one pixel of padding).
 * l->packed: 16 packed matrices (one per transform element, cin x cout each),
 * l->packed_group_stride = winograd_packed_stride floats apart, filled by winograd_pack from
 * weights laid out [ky][kx][ci][co]; scratch: at least winograd_scratch_floats.
 * winograd_execute computes columns [col0, col1) x channels [row0, row1) with bias and residual,
 * clamped to [lo, hi] (other activations are the caller's). */
size_t winograd_packed_stride(const gemm_kernel *kern, int64_t cin, int64_t cout);
size_t winograd_scratch_floats(const gemm_kernel *kern, int64_t cin, int64_t cout);
coacto_status winograd_pack(const gemm_kernel *kern, const float *w, int64_t cin, int64_t cout,
                            float *packed);
void winograd_execute(const layer *l, const float *x, const float *res, float *out, int64_t col0,
                      int64_t col1, int64_t row0, int64_t row1, float lo, float hi,
                      float *scratch);

coacto_status pool_prepare(layer *l, char *err, size_t err_size);
void pool_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                  int32_t row0, int32_t row1);
coacto_status global_pool_prepare(layer *l, char *err, size_t err_size);
void global_pool_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                         int32_t col1, int32_t row0, int32_t row1);
coacto_status binary_prepare(layer *l, char *err, size_t err_size);
void binary_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1);
coacto_status affine_prepare(layer *l, char *err, size_t err_size);
void affine_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1);
coacto_status concat_prepare(layer *l, char *err, size_t err_size);
void concat_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1);
coacto_status gather_prepare(layer *l, char *err, size_t err_size);
void gather_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1);
coacto_status lrn_prepare(layer *l, char *err, size_t err_size);
void lrn_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                 int32_t row0, int32_t row1);
coacto_status softmax_prepare(layer *l, char *err, size_t err_size);
void softmax_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                     int32_t col1, int32_t row0, int32_t row1, float *scratch);
coacto_status where_prepare(layer *l, char *err, size_t err_size);
void where_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                   int32_t row0, int32_t row1);
/* ops_seq.c: the operators of sequence models. */
coacto_status matmul_prepare(layer *l, char *err, size_t err_size);
void matmul_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1, float *scratch);
coacto_status attention_prepare(layer *l, char *err, size_t err_size);
void attention_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                       int32_t col1, int32_t row0, int32_t row1, float *scratch);
coacto_status layernorm_prepare(layer *l, char *err, size_t err_size);
void layernorm_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                       int32_t col1, int32_t row0, int32_t row1);
coacto_status row_reduce_prepare(layer *l, char *err, size_t err_size);
void row_reduce_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                        int32_t col1, int32_t row0, int32_t row1);
coacto_status embed_prepare(layer *l, char *err, size_t err_size);
void embed_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                   int32_t row0, int32_t row1);

#endif
