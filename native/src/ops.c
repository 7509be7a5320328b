/* Tile executors: the checks every op shares, each op's contract (one table: inputs, arrays,
 * parameters, prepare and execute) and the dispatch through it. The op families live in
 * ops_conv.c, ops_pool.c, ops_misc.c, ops_seq.c and ops_winograd.c; the vector maths they share
 * (e^x, sums, activations) in ops_vec.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_internal.h"

coacto_status ops_fail(char *err, size_t err_size, const char *fmt, ...) {
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return COACTO_ERR_INVALID_GRAPH;
}

int64_t ops_mul(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return -1;
    if (a == 0 || b == 0) return 0;
    if (a > OPS_MAX_ELEMENTS / b) return -1;
    return a * b;
}

coacto_status ops_check_array(const layer *l, int index, int64_t bytes, const char *what,
                              char *err, size_t err_size) {
    int64_t have = l->array_bytes[index];
    if (bytes == 0) {
        OPS_REQUIRE(have == 0, "array %d (%s) must be absent, has %lld bytes", index, what,
                    (long long)have);
        return COACTO_OK;
    }
    OPS_REQUIRE(have == bytes, "array %d (%s) has %lld bytes, expected %lld", index, what,
                (long long)have, (long long)bytes);
    OPS_REQUIRE(l->arrays[index] != NULL && (uintptr_t)l->arrays[index] % sizeof(float) == 0,
                "array %d (%s) is missing or misaligned", index, what);
    return COACTO_OK;
}

coacto_status ops_check_same_dims(const layer *l, int i, char *err, size_t err_size) {
    OPS_REQUIRE(l->in_n[i] == l->n && l->in_c[i] == l->c && l->in_h[i] == l->h &&
                    l->in_w[i] == l->w,
                "input %d is %dx%dx%dx%d (NCHW), the output %dx%dx%dx%d: they must be equal", i,
                l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i], l->n, l->c, l->h, l->w);
    return COACTO_OK;
}

float *ops_alloc_floats(size_t floats) {
    size_t bytes = ops_round_up((floats ? floats : 1) * sizeof(float), 64);
    return aligned_alloc(64, bytes);
}

/* Tensor size with every product checked; -1 when out of range. */
static int64_t elements(int32_t n, int32_t c, int32_t h, int32_t w) {
    return ops_mul(ops_mul(ops_mul(n, c), h), w);
}

/* Executors without scratch, in the table's one signature. */
#define NO_SCRATCH(fn)                                                                      \
    static void fn##_(const layer *l, const float *const *in, float *out, int32_t col0,     \
                      int32_t col1, int32_t row0, int32_t row1, float *scratch) {           \
        (void)scratch;                                                                      \
        fn(l, in, out, col0, col1, row0, row1);                                             \
    }
NO_SCRATCH(pool_execute)
NO_SCRATCH(global_pool_execute)
NO_SCRATCH(binary_execute)
NO_SCRATCH(affine_execute)
NO_SCRATCH(concat_execute)
NO_SCRATCH(gather_execute)
NO_SCRATCH(lrn_execute)
NO_SCRATCH(layernorm_execute)
NO_SCRATCH(row_reduce_execute)
NO_SCRATCH(where_execute)
NO_SCRATCH(embed_execute)

typedef void (*op_execute_fn)(const layer *l, const float *const *in, float *out, int32_t col0,
                              int32_t col1, int32_t row0, int32_t row1, float *scratch);

/* Each op's contract, once: its name, inputs [min, max], the array slots it reads (the others
 * must be absent), the iparams and fparams it reads (their meaning: ops.h; the Python side's
 * copy, coacto/ir.py OPS, is checked against this by tests/test_structure.py), and the two
 * functions that run it. */
typedef struct op_contract {
    const char *name;
    int8_t min_inputs, max_inputs, arrays, iparams, fparams;
    coacto_status (*prepare)(layer *l, char *err, size_t err_size);
    op_execute_fn execute;
} op_contract;

static const op_contract OPS[COACTO_OP_COUNT] = {
    [COACTO_OP_INPUT] = {"INPUT", 0, 0, 0, 0, 0, NULL, NULL},
    [COACTO_OP_CONV] = {"CONV", 1, 2, 4, 14, 4, conv_prepare, conv_execute},
    [COACTO_OP_POOL] = {"POOL", 1, 1, 0, 12, 0, pool_prepare, pool_execute_},
    [COACTO_OP_GLOBAL_POOL] = {"GLOBAL_POOL", 1, 1, 0, 1, 0, global_pool_prepare,
                               global_pool_execute_},
    [COACTO_OP_BINARY] = {"BINARY", 1, 2, 1, 8, 2, binary_prepare, binary_execute_},
    [COACTO_OP_AFFINE] = {"AFFINE", 1, 1, 2, 1, 2, affine_prepare, affine_execute_},
    [COACTO_OP_CONCAT] = {"CONCAT", 1, COACTO_MAX_INPUTS, 0, 0, 0, concat_prepare,
                          concat_execute_},
    [COACTO_OP_GATHER] = {"GATHER", 1, COACTO_MAX_INPUTS, 2, 0, 1, gather_prepare,
                          gather_execute_},
    [COACTO_OP_LRN] = {"LRN", 1, 1, 0, 1, 3, lrn_prepare, lrn_execute_},
    [COACTO_OP_SOFTMAX] = {"SOFTMAX", 1, 1, 0, 1, 0, softmax_prepare, softmax_execute},
    [COACTO_OP_NOP] = {"NOP", 0, COACTO_MAX_INPUTS, 0, 0, 0, NULL, NULL}, /* any arrays */
    [COACTO_OP_MATMUL] = {"MATMUL", 2, 3, 0, 23, 2, matmul_prepare, matmul_execute},
    [COACTO_OP_LAYERNORM] = {"LAYERNORM", 1, 1, 2, 0, 1, layernorm_prepare, layernorm_execute_},
    [COACTO_OP_ROW_REDUCE] = {"ROW_REDUCE", 1, 1, 0, 1, 0, row_reduce_prepare,
                              row_reduce_execute_},
    [COACTO_OP_WHERE] = {"WHERE", 1, 3, 3, 16, 0, where_prepare, where_execute_},
    [COACTO_OP_EMBED] = {"EMBED", 1, 1, 1, 1, 0, embed_prepare, embed_execute_},
    [COACTO_OP_ATTENTION] = {"ATTENTION", 3, 4, 0, 29, 1, attention_prepare, attention_execute},
};

/* A kernel the caller picked (tests sweep every one) is kept when it is one of gemm_available(). */
static const gemm_kernel *known_kernel(const gemm_kernel *k) {
    if (k)
        for (const gemm_kernel *const *a = gemm_available(); *a; a++)
            if (*a == k) return k;
    return NULL;
}

coacto_status op_prepare(layer *l, char *err, size_t err_size) {
    l->kern = known_kernel(l->kern);
    l->packed = NULL;
    l->packed_group_stride = 0;
    l->scratch_per_col = 0;
    l->scratch_fixed = 0;
    l->variant = 0;
    l->block_cols = 0;
    l->pre = NULL;
    l->arrays_consumed = 0;
    if (err && err_size) err[0] = '\0';

    OPS_REQUIRE(l->op >= 0 && l->op < COACTO_OP_COUNT, "unknown op code %d", l->op);
    const op_contract *op = &OPS[l->op];
    OPS_REQUIRE(l->n_inputs >= op->min_inputs && l->n_inputs <= op->max_inputs,
                "%s takes %d to %d inputs, got %d", op->name, op->min_inputs, op->max_inputs,
                l->n_inputs);
    OPS_REQUIRE(elements(l->n, l->c, l->h, l->w) > 0 && (int64_t)l->n * l->h * l->w <= INT32_MAX,
                "output dims %dx%dx%dx%d (NCHW) are out of range", l->n, l->c, l->h, l->w);
    for (int i = 0; i < l->n_inputs; i++)
        OPS_REQUIRE(elements(l->in_n[i], l->in_c[i], l->in_h[i], l->in_w[i]) > 0,
                    "input %d dims %dx%dx%dx%d (NCHW) are out of range", i, l->in_n[i],
                    l->in_c[i], l->in_h[i], l->in_w[i]);
    /* Arrays an op does not read must be absent (NOP takes anything: tests, benchmarks); the op
     * checks the ones it reads itself. */
    if (l->op != COACTO_OP_NOP)
        for (int a = op->arrays; a < 4; a++)
            OPS_REQUIRE(l->array_bytes[a] == 0, "array %d must be absent for %s", a, op->name);
    return op->prepare ? op->prepare(l, err, err_size) : COACTO_OK;
}

void op_release(layer *l) {
    free(l->packed);
    l->packed = NULL;
    if (l->pre) {
        free((void *)l->pre->arrays[1]); /* the prologue's bias, copied by conv_prepare */
        op_release(l->pre);
        free(l->pre);
        l->pre = NULL;
    }
}

void op_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                int32_t row0, int32_t row1, float *scratch) {
    if (col0 >= col1 || row0 >= row1) return;
    /* INPUT is never executed; NOP does nothing */
    if (OPS[l->op].execute) OPS[l->op].execute(l, in, out, col0, col1, row0, row1, scratch);
}

coacto_status coacto_op_contract(int32_t op, coacto_op_info *out) {
    if (!out || op < 0 || op >= COACTO_OP_COUNT) return COACTO_ERR_INVALID_ARGUMENT;
    const op_contract *c = &OPS[op];
    *out = (coacto_op_info){c->name, c->min_inputs, c->max_inputs, c->arrays, c->iparams,
                            c->fparams};
    return COACTO_OK;
}
