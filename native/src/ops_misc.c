/* Per-column tiles: elementwise binary ops and selections with broadcasting, per-channel affine,
 * channel concat, index gathers, local response normalisation, softmax. Each loops over the tile's
 * columns and, inside, over the tile's contiguous rows. */
#include <string.h>

#include "ops_internal.h"
#include "kernels/vec.h"

enum {
    BIN_ADD = 0, BIN_SUB = 1, BIN_MUL = 2, BIN_DIV = 3, BIN_EQUAL = 4, BIN_LESS = 5,
    BIN_GREATER = 6, BIN_POW = 7, BIN_MAX = 8, BIN_MIN = 9, BIN_GREATER_EQUAL = 10,
    BIN_LESS_EQUAL = 11
};

/* ---- BINARY ---------------------------------------------------------------------------------- */

static int broadcasts(int32_t d, int32_t out) { return d == 1 || d == out; }

coacto_status binary_prepare(layer *l, char *err, size_t err_size) {
    const int32_t *p = l->iparams;
    OPS_REQUIRE(p[0] >= BIN_ADD && p[0] <= BIN_LESS_EQUAL, "unknown binary kind %d", p[0]);
    OPS_REQUIRE(ops_act_valid(p[1]), "unknown activation %d", p[1]);
    for (int i = 0; i < l->n_inputs; i++)
        OPS_REQUIRE(broadcasts(l->in_n[i], l->n) && broadcasts(l->in_c[i], l->c) &&
                        broadcasts(l->in_h[i], l->h) && broadcasts(l->in_w[i], l->w),
                    "input %d (%dx%dx%dx%d NCHW) does not broadcast to the output %dx%dx%dx%d", i,
                    l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i], l->n, l->c, l->h, l->w);
    if (l->n_inputs == 2) return ops_check_array(l, 0, 0, "constant", err, err_size);

    int32_t kn = p[4], kc = p[5], kh = p[6], kw = p[7];
    OPS_REQUIRE(p[2] == 0 || p[2] == 1, "const_first must be 0 or 1");
    OPS_REQUIRE(kn >= 1 && kc >= 1 && kh >= 1 && kw >= 1 && broadcasts(kn, l->n) &&
                    broadcasts(kc, l->c) && broadcasts(kh, l->h) && broadcasts(kw, l->w),
                "constant %dx%dx%dx%d (NCHW) does not broadcast to the output %dx%dx%dx%d", kn,
                kc, kh, kw, l->n, l->c, l->h, l->w);
    int64_t count = (int64_t)kn * kc * kh * kw; /* each factor <= the output's */
    coacto_status st = ops_check_array(l, 0, count * 4, "constant", err, err_size);
    if (st != COACTO_OK) return st;
    /* Re-lay NCHW as NHWC so the constant reads like an activation input. */
    const float *k = l->arrays[0];
    l->packed = ops_alloc_floats((size_t)count);
    if (!l->packed) return COACTO_ERR_OUT_OF_MEMORY;
    for (int64_t n = 0; n < kn; n++)
        for (int64_t c = 0; c < kc; c++)
            for (int64_t y = 0; y < kh; y++)
                for (int64_t x = 0; x < kw; x++)
                    l->packed[((n * kh + y) * kw + x) * kc + c] = k[((n * kc + c) * kh + y) * kw + x];
    l->arrays_consumed = 1u << 0;
    return COACTO_OK;
}

/* An operand read with broadcasting: stride 0 on every dim it broadcasts along. */
typedef struct operand {
    const float *base;
    int64_t sn, sy, sx, sc;
} operand;

static operand operand_of(const layer *l, const float *base, int64_t n, int64_t c, int64_t h,
                          int64_t w) {
    operand o = {base, n == l->n ? h * w * c : 0, h == l->h ? w * c : 0, w == l->w ? c : 0,
                 c == l->c ? 1 : 0};
    return o;
}

#define BIN_ADD_OP(x, y) ((x) + (y))
#define BIN_SUB_OP(x, y) ((x) - (y))
#define BIN_MUL_OP(x, y) ((x) * (y))
#define BIN_DIV_OP(x, y) ((x) / (y))
#define BIN_EQUAL_OP(x, y) ((x) == (y) ? 1.0f : 0.0f)
#define BIN_LESS_OP(x, y) ((x) < (y) ? 1.0f : 0.0f)
#define BIN_GREATER_OP(x, y) ((x) > (y) ? 1.0f : 0.0f)
/* Ordered comparisons: NaN on either side gives 0 (not 1 - LESS). */
#define BIN_GREATER_EQUAL_OP(x, y) ((x) >= (y) ? 1.0f : 0.0f)
#define BIN_LESS_EQUAL_OP(x, y) ((x) <= (y) ? 1.0f : 0.0f)
#define BIN_POW_OP(x, y) powf((x), (y))
/* NaN in either operand gives NaN, as numpy's maximum / minimum. */
#define BIN_MAX_OP(x, y) ((x) != (x) || (x) > (y) ? (x) : (y))
#define BIN_MIN_OP(x, y) ((x) != (x) || (x) < (y) ? (x) : (y))
/* One loop per operand shape (vector or broadcast scalar) so each vectorizes. */
#define BIN_LOOPS(OP)                                                       \
    do {                                                                    \
        if (sa && sb) {                                                     \
            for (size_t i = 0; i < n; i++) o[i] = OP(a[i], b[i]);           \
        } else if (sa) {                                                    \
            const float bv = b[0];                                          \
            for (size_t i = 0; i < n; i++) o[i] = OP(a[i], bv);             \
        } else if (sb) {                                                    \
            const float av = a[0];                                          \
            for (size_t i = 0; i < n; i++) o[i] = OP(av, b[i]);             \
        } else {                                                            \
            const float v = OP(a[0], b[0]);                                 \
            for (size_t i = 0; i < n; i++) o[i] = v;                        \
        }                                                                   \
    } while (0)

static void binary_span(int32_t kind, const float *restrict a, int sa, const float *restrict b,
                        int sb, float *restrict o, size_t n) {
    switch (kind) {
    case BIN_ADD: BIN_LOOPS(BIN_ADD_OP); break;
    case BIN_SUB: BIN_LOOPS(BIN_SUB_OP); break;
    case BIN_MUL: BIN_LOOPS(BIN_MUL_OP); break;
    case BIN_DIV: BIN_LOOPS(BIN_DIV_OP); break;
    case BIN_EQUAL: BIN_LOOPS(BIN_EQUAL_OP); break;
    case BIN_LESS: BIN_LOOPS(BIN_LESS_OP); break;
    case BIN_GREATER: BIN_LOOPS(BIN_GREATER_OP); break;
    case BIN_POW: BIN_LOOPS(BIN_POW_OP); break;
    case BIN_MAX: BIN_LOOPS(BIN_MAX_OP); break;
    case BIN_GREATER_EQUAL: BIN_LOOPS(BIN_GREATER_EQUAL_OP); break;
    case BIN_LESS_EQUAL: BIN_LOOPS(BIN_LESS_EQUAL_OP); break;
    default: BIN_LOOPS(BIN_MIN_OP); break;
    }
}

/* Values a flat span (a tile of whole columns) is computed in before its activation runs over
 * them: activations of several passes (sigmoid: negate, e^x, reciprocal) then find them in L1. */
#define FLAT_CHUNK 2048

/* An operand read as the output is laid out (NHWC of the output's dims), or a single value. */
static int operand_flat(const operand *x, const layer *l) {
    const int64_t c = l->c, w = l->w, h = l->h;
    if (x->sn == 0 && x->sy == 0 && x->sx == 0 && x->sc == 0) return 1;
    return x->sc == 1 && x->sx == c && x->sy == c * w && (x->sn == c * w * h || l->n == 1);
}

void binary_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1) {
    const int32_t *p = l->iparams;
    operand ops[2];
    ops[0] = operand_of(l, in[0], l->in_n[0], l->in_c[0], l->in_h[0], l->in_w[0]);
    if (l->n_inputs == 2) {
        ops[1] = operand_of(l, in[1], l->in_n[1], l->in_c[1], l->in_h[1], l->in_w[1]);
    } else {
        ops[1] = operand_of(l, l->packed, p[4], p[5], p[6], p[7]);
        if (p[2]) { /* constant OP input */
            operand t = ops[0];
            ops[0] = ops[1];
            ops[1] = t;
        }
    }
    const operand *A = &ops[0], *B = &ops[1];
    int64_t c = l->c;
    size_t n = (size_t)(row1 - row0);
    /* Whole columns of operands laid out as the output (or one value each): one span, one
     * activation call (per column, two 3-channel images' sum took 240 us, 1.6 ns a value) */
    if (row0 == 0 && row1 == c && operand_flat(A, l) && operand_flat(B, l)) {
        const size_t total = (size_t)(col1 - col0) * (size_t)c;
        for (size_t i = 0; i < total; i += FLAT_CHUNK) {
            const size_t m = total - i < FLAT_CHUNK ? total - i : FLAT_CHUNK;
            const size_t at = (size_t)(col0 * c) + i;
            binary_span(p[0], A->sc ? A->base + at : A->base, A->sc != 0,
                        B->sc ? B->base + at : B->base, B->sc != 0, out + at, m);
            ops_act_apply(out + at, m, p[1], l->fparams[0], l->fparams[1]);
        }
        return;
    }
    ops_position q = ops_position_of(col0, l->h, l->w);
    for (int64_t col = col0; col < col1; col++, ops_position_next(&q, l->h, l->w)) {
        const float *a = A->base + q.n * A->sn + q.y * A->sy + q.x * A->sx + row0 * A->sc;
        const float *b = B->base + q.n * B->sn + q.y * B->sy + q.x * B->sx + row0 * B->sc;
        float *o = out + col * c + row0;
        binary_span(p[0], a, A->sc != 0, b, B->sc != 0, o, n);
        ops_act_apply(o, n, p[1], l->fparams[0], l->fparams[1]);
    }
}

/* ---- AFFINE ---------------------------------------------------------------------------------- */

coacto_status affine_prepare(layer *l, char *err, size_t err_size) {
    OPS_REQUIRE(ops_act_valid(l->iparams[0]), "unknown activation %d", l->iparams[0]);
    coacto_status st = ops_check_same_dims(l, 0, err, err_size);
    if (st == COACTO_OK) st = ops_check_array(l, 0, (int64_t)l->c * 4, "scale", err, err_size);
    if (st == COACTO_OK) st = ops_check_array(l, 1, (int64_t)l->c * 4, "shift", err, err_size);
    return st;
}

void affine_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1) {
    const float *restrict scale = (const float *)l->arrays[0] + row0;
    const float *restrict shift = (const float *)l->arrays[1] + row0;
    int64_t c = l->c;
    size_t n = (size_t)(row1 - row0);
    /* A tile of whole columns is one contiguous span, computed and then activated FLAT_CHUNK
     * values at a time (called per column, a 3-channel image's normalisation took 4.6 ns a
     * value, one activation call per pixel). Fewer than 16 channels go against scale and shift
     * repeated 16 times, a loop the compiler vectorizes. */
    if (row0 == 0 && row1 == c) {
        float sp[256], tp[256];
        const float *restrict s = scale, *restrict t = shift;
        size_t period = (size_t)c;
        if (c < 16) {
            period = (size_t)c * 16;
            for (size_t i = 0; i < period; i++) sp[i] = scale[i % (size_t)c], tp[i] = shift[i % (size_t)c];
            s = sp, t = tp;
        }
        const size_t total = (size_t)(col1 - col0) * (size_t)c;
        const size_t chunk = period >= FLAT_CHUNK ? period : FLAT_CHUNK / period * period;
        const float *restrict x = in[0] + col0 * c;
        float *restrict o = out + col0 * c;
        for (size_t i0 = 0; i0 < total; i0 += chunk) { /* whole periods: each starts at phase 0 */
            const size_t end = total - i0 < chunk ? total : i0 + chunk;
            for (size_t i = i0; i < end; i += period) {
                const size_t m = end - i < period ? end - i : period;
                for (size_t j = 0; j < m; j++) o[i + j] = x[i + j] * s[j] + t[j];
            }
            ops_act_apply(o + i0, end - i0, l->iparams[0], l->fparams[0], l->fparams[1]);
        }
        return;
    }
    for (int64_t col = col0; col < col1; col++) {
        const float *restrict x = in[0] + col * c + row0;
        float *restrict o = out + col * c + row0;
        for (size_t i = 0; i < n; i++) o[i] = x[i] * scale[i] + shift[i];
        ops_act_apply(o, n, l->iparams[0], l->fparams[0], l->fparams[1]);
    }
}

/* ---- WHERE ----------------------------------------------------------------------------------- */

/* Operand o of a WHERE: input (bit o of iparams[0]) or constant (array o, dims iparams[4 + 4o]). */
coacto_status where_prepare(layer *l, char *err, size_t err_size) {
    int32_t which = l->iparams[0];
    OPS_REQUIRE(which >= 1 && which <= 7, "WHERE operand mask %d must be 1..7 (one input at least)",
                which);
    int inputs = (which & 1) + ((which >> 1) & 1) + ((which >> 2) & 1);
    OPS_REQUIRE(inputs == l->n_inputs, "WHERE operand mask %d names %d inputs, the layer has %d",
                which, inputs, l->n_inputs);
    for (int i = 0; i < l->n_inputs; i++)
        OPS_REQUIRE(broadcasts(l->in_n[i], l->n) && broadcasts(l->in_c[i], l->c) &&
                        broadcasts(l->in_h[i], l->h) && broadcasts(l->in_w[i], l->w),
                    "input %d (%dx%dx%dx%d NCHW) does not broadcast to the output %dx%dx%dx%d", i,
                    l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i], l->n, l->c, l->h, l->w);
    int64_t offset[3] = {0, 0, 0}, total = 0;
    for (int o = 0; o < 3; o++) {
        const int32_t *d = &l->iparams[4 + 4 * o];
        if (which >> o & 1) {
            coacto_status st = ops_check_array(l, o, 0, "constant operand", err, err_size);
            if (st != COACTO_OK) return st;
            continue;
        }
        OPS_REQUIRE(d[0] >= 1 && d[1] >= 1 && d[2] >= 1 && d[3] >= 1 && broadcasts(d[0], l->n) &&
                        broadcasts(d[1], l->c) && broadcasts(d[2], l->h) && broadcasts(d[3], l->w),
                    "constant operand %d (%dx%dx%dx%d NCHW) does not broadcast to the output", o,
                    d[0], d[1], d[2], d[3]);
        int64_t count = (int64_t)d[0] * d[1] * d[2] * d[3];
        coacto_status st = ops_check_array(l, o, count * 4, "constant operand", err, err_size);
        if (st != COACTO_OK) return st;
        offset[o] = total;
        total += count;
    }
    if (total == 0) return COACTO_OK;
    /* The constants re-laid NHWC, one after the other, so they read like inputs. */
    l->packed = ops_alloc_floats((size_t)total);
    if (!l->packed) return COACTO_ERR_OUT_OF_MEMORY;
    for (int o = 0; o < 3; o++) {
        if (which >> o & 1) continue;
        const int32_t *d = &l->iparams[4 + 4 * o];
        const float *k = l->arrays[o];
        float *dst = l->packed + offset[o];
        for (int64_t n = 0; n < d[0]; n++)
            for (int64_t c = 0; c < d[1]; c++)
                for (int64_t y = 0; y < d[2]; y++)
                    for (int64_t x = 0; x < d[3]; x++)
                        dst[((n * d[2] + y) * d[3] + x) * d[1] + c] =
                            k[((n * d[1] + c) * d[2] + y) * d[3] + x];
    }
    return COACTO_OK;
}

void where_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                   int32_t row0, int32_t row1) {
    int32_t which = l->iparams[0];
    operand ops[3];
    const float *packed = l->packed;
    for (int o = 0, next_input = 0; o < 3; o++) {
        if (which >> o & 1) {
            int i = next_input++;
            ops[o] = operand_of(l, in[i], l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i]);
        } else {
            const int32_t *d = &l->iparams[4 + 4 * o];
            ops[o] = operand_of(l, packed, d[0], d[1], d[2], d[3]);
            packed += (int64_t)d[0] * d[1] * d[2] * d[3];
        }
    }
    int64_t c = l->c;
    ops_position q = ops_position_of(col0, l->h, l->w);
    for (int64_t col = col0; col < col1; col++, ops_position_next(&q, l->h, l->w)) {
        const float *p[3];
        for (int o = 0; o < 3; o++)
            p[o] = ops[o].base + q.n * ops[o].sn + q.y * ops[o].sy + q.x * ops[o].sx +
                   row0 * ops[o].sc;
        float *restrict dst = out + col * c + row0;
        int64_t sc = ops[0].sc, sx = ops[1].sc, sy = ops[2].sc;
        for (int64_t r = 0; r < row1 - row0; r++)
            dst[r] = p[0][r * sc] != 0.0f ? p[1][r * sx] : p[2][r * sy];
    }
}

/* ---- CONCAT ---------------------------------------------------------------------------------- */

coacto_status concat_prepare(layer *l, char *err, size_t err_size) {
    int64_t total = 0;
    for (int i = 0; i < l->n_inputs; i++) {
        OPS_REQUIRE(l->in_n[i] == l->n && l->in_h[i] == l->h && l->in_w[i] == l->w,
                    "input %d is %dx_x%dx%d (NCHW), the output %dx_x%dx%d: only channels may "
                    "differ",
                    i, l->in_n[i], l->in_h[i], l->in_w[i], l->n, l->h, l->w);
        total += l->in_c[i];
    }
    OPS_REQUIRE(total == l->c, "input channels sum to %lld, the output has %d", (long long)total,
                l->c);
    return COACTO_OK;
}

void concat_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1) {
    int64_t c = l->c, first = 0;
    for (int i = 0; i < l->n_inputs; i++) {
        int64_t ci = l->in_c[i];
        int64_t lo = row0 > first ? row0 : first, hi = row1 < first + ci ? row1 : first + ci;
        if (lo < hi)
            for (int64_t col = col0; col < col1; col++)
                memcpy(out + col * c + lo, in[i] + col * ci + (lo - first),
                       (size_t)(hi - lo) * sizeof(float));
        first += ci;
    }
}

/* ---- GATHER ---------------------------------------------------------------------------------- */

coacto_status gather_prepare(layer *l, char *err, size_t err_size) {
    int64_t total = 0;
    for (int i = 0; i < l->n_inputs; i++)
        total += (int64_t)l->in_n[i] * l->in_c[i] * l->in_h[i] * l->in_w[i];
    OPS_REQUIRE(total <= INT32_MAX, "inputs hold %lld values, more than an int32 index reaches",
                (long long)total);
    int64_t count = (int64_t)l->n * l->c * l->h * l->w;
    coacto_status st = ops_check_array(l, 0, count * 4, "index", err, err_size);
    if (st != COACTO_OK) return st;
    int64_t constants = l->array_bytes[1] / 4;
    OPS_REQUIRE(l->array_bytes[1] % 4 == 0, "constant values have %lld bytes, not whole floats",
                (long long)l->array_bytes[1]);
    if (constants) {
        st = ops_check_array(l, 1, constants * 4, "constant values", err, err_size);
        if (st != COACTO_OK) return st;
    }
    OPS_REQUIRE(total + constants <= INT32_MAX, "inputs and constants hold %lld values, more "
                "than an int32 index reaches", (long long)(total + constants));
    const int32_t *index = l->arrays[0];
    for (int64_t i = 0; i < count; i++)
        OPS_REQUIRE(index[i] >= -1 && index[i] < total + constants,
                    "index[%lld] = %d is outside [-1, %lld) (the inputs' and constant values)",
                    (long long)i, index[i], (long long)(total + constants));
    return COACTO_OK;
}

void gather_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                    int32_t row0, int32_t row1) {
    const int32_t *index = l->arrays[0];
    const float fill = l->fparams[0];
    int64_t c = l->c;
    /* first[i]: flat index of input i's first value in the concatenated storages. */
    int64_t first[COACTO_MAX_INPUTS + 1] = {0};
    for (int i = 0; i < l->n_inputs; i++)
        first[i + 1] = first[i] + (int64_t)l->in_n[i] * l->in_c[i] * l->in_h[i] * l->in_w[i];
    const float *constants = l->arrays[1];
    int64_t total = first[l->n_inputs];
    for (int64_t col = col0; col < col1; col++) {
        const int32_t *ix = index + col * c;
        float *o = out + col * c;
        if (l->n_inputs == 1 && !constants) {
            const float *x = in[0];
            for (int64_t r = row0; r < row1; r++) o[r] = ix[r] < 0 ? fill : x[ix[r]];
            continue;
        }
        for (int64_t r = row0; r < row1; r++) {
            int64_t v = ix[r];
            if (v < 0) {
                o[r] = fill;
                continue;
            }
            if (v >= total) {
                o[r] = constants[v - total];
                continue;
            }
            int i = 0;
            while (v >= first[i + 1]) i++;
            o[r] = in[i][v - first[i]];
        }
    }
}

/* ---- LRN ------------------------------------------------------------------------------------- */

coacto_status lrn_prepare(layer *l, char *err, size_t err_size) {
    const float *f = l->fparams;
    OPS_REQUIRE(l->iparams[0] >= 1, "LRN size %d must be >= 1", l->iparams[0]);
    OPS_REQUIRE(isfinite(f[0]) && isfinite(f[1]) && isfinite(f[2]),
                "LRN alpha, beta and bias must be finite");
    return ops_check_same_dims(l, 0, err, err_size);
}

/* y = x / (bias + alpha / size * sum of x^2 over channels [c - (size-1)/2, c + ceil((size-1)/2)]).
 */
void lrn_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                 int32_t row0, int32_t row1) {
    int64_t c = l->c, size = l->iparams[0];
    int64_t before = (size - 1) / 2, after = size - 1 - before;
    float alpha = l->fparams[0] / (float)size, beta = l->fparams[1], bias = l->fparams[2];
    for (int64_t col = col0; col < col1; col++) {
        const float *x = in[0] + col * c;
        float *o = out + col * c;
        for (int64_t r = row0; r < row1; r++) {
            int64_t lo = r - before < 0 ? 0 : r - before;
            int64_t hi = r + after >= c ? c - 1 : r + after;
            float sum = 0.0f;
            for (int64_t j = lo; j <= hi; j++) sum += x[j] * x[j];
            o[r] = x[r] * powf(bias + alpha * sum, -beta);
        }
    }
}

/* ---- SOFTMAX --------------------------------------------------------------------------------- */

coacto_status softmax_prepare(layer *l, char *err, size_t err_size) {
    OPS_REQUIRE(l->iparams[0] == 0 || l->iparams[0] == 1, "softmax log flag must be 0 or 1");
    l->scratch_fixed = (size_t)l->c;
    return ops_check_same_dims(l, 0, err, err_size);
}

/* Over all channels of each column (max-subtracted); a row-split tile still reads them all. */
void softmax_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                     int32_t col1, int32_t row0, int32_t row1, float *scratch) {
    int64_t c = l->c;
    float *restrict e = scratch;
#if defined(__x86_64__) || defined(_M_X64)
    const int wide = vec_avx512_usable();
#endif
    for (int64_t col = col0; col < col1; col++) {
        const float *restrict x = in[0] + col * c;
        float *restrict o = out + col * c;
        float max, sum;
#if defined(__x86_64__) || defined(_M_X64)
        if (wide) {
            sum = vec_softmax_exp_avx512(x, e, (size_t)c, &max);
            if (!l->iparams[0]) {
                vec_scale_avx512(e + row0, o + row0, (size_t)(row1 - row0), 1.0f / sum);
                continue;
            }
        } else
#endif
            sum = ops_softmax_exp(x, e, (size_t)c, &max);
        if (l->iparams[0]) {
            float shift = max + logf(sum);
            for (int64_t r = row0; r < row1; r++) o[r] = x[r] - shift;
        } else {
            ops_scale(e + row0, o + row0, (size_t)(row1 - row0), 1.0f / sum);
        }
    }
}
