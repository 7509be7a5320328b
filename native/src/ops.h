/* Tile executors: one function computes one tile of one layer.
 *
 * Parameter encoding of coacto_layer_desc per op (semantics: coacto/ir.py):
 *   CONV        inputs [x] or [x, residual]
 *               iparams: 0 kh, 1 kw, 2 sh, 3 sw, 4 pt, 5 pl, 6 pb, 7 pr, 8 dh, 9 dw, 10 group, 11 act
 *               fparams: 0 alpha, 1 beta (activation)
 *               arrays:  0 weights float[group][kh][kw][cin_g][cout_g], 1 bias float[c] or absent
 *   POOL        iparams: 0 kh, 1 kw, 2 sh, 3 sw, 4 pt, 5 pl, 6 pb, 7 pr, 8 dh, 9 dw, 10 kind
 *                        (0 max, 1 avg), 11 count_include_pad
 *   GLOBAL_POOL iparams: 0 kind (0 max, 1 avg)
 *   BINARY      inputs [a] or [a, b]; iparams: 0 kind (0 add, 1 sub, 2 mul, 3 div), 1 act,
 *               2 const_first, 4..7 constant dims (kn, kc, kh, kw: each 1 or the output's)
 *               fparams: 0 alpha, 1 beta; arrays: 0 constant float, NCHW order (one input only)
 *               Activation inputs broadcast: each input dim is 1 or the output's.
 *   AFFINE      iparams: 0 act; fparams: 0 alpha, 1 beta; arrays: 0 scale float[c], 1 shift float[c]
 *   CONCAT      inputs [x1..xk] (k <= 8), channel concatenation
 *   GATHER      inputs [x1..xk]; fparams: 0 fill; arrays: 0 index int32[n*h*w*c] (output storage
 *               order) into the concatenated input storages, -1 for fill
 *   LRN         iparams: 0 size; fparams: 0 alpha, 1 beta, 2 bias
 *   SOFTMAX     iparams: 0 log (1 for LogSoftmax); over channels, never split by rows
 *   NOP         does nothing (tests, overhead benchmarks)
 *   INPUT       never executed
 * Arrays an op does not list must be absent (0 bytes); listed ones must have exactly their size.
 */
#ifndef COACTO_OPS_H
#define COACTO_OPS_H
#include <stddef.h>
#include <stdint.h>

#include "coacto.h"
#include "kernels/gemm.h"

#define COACTO_MAX_INPUTS 8

typedef struct layer {
    int32_t op;
    int32_t n_inputs;
    int32_t inputs[COACTO_MAX_INPUTS];
    int32_t n, c, h, w; /* output dims */
    int32_t in_n[COACTO_MAX_INPUTS], in_c[COACTO_MAX_INPUTS], in_h[COACTO_MAX_INPUTS],
        in_w[COACTO_MAX_INPUTS];
    int32_t iparams[16];
    float fparams[8];
    const void *arrays[4];    /* the op's arrays (64-byte aligned); during op_prepare they may
                                 point into the caller's description, afterwards into memory the
                                 graph owns, or NULL for an array the op consumed */
    int64_t array_bytes[4];
    uint32_t arrays_consumed; /* set by op_prepare: bit i when execute never reads array i (it
                                 was packed into `packed`), so the graph need not keep a copy */
    /* Filled by op_prepare: */
    const gemm_kernel *kern;  /* CONV: gemm_select(), or the caller's if one of gemm_available() */
    float *packed;            /* CONV: packed weights, one block per group (depthwise: the
                                 weights as [ky][kx][c]); BINARY: the constant in NHWC order */
    size_t packed_group_stride;
    size_t scratch_per_col;   /* floats of scratch a tile needs per output column */
    size_t scratch_fixed;     /* plus this many */
    /* Private to the executors (set by op_prepare): */
    int32_t variant;          /* CONV: the loop that computes it (ops_conv.c) */
    int32_t block_cols;       /* CONV: output positions per im2col + GEMM block */
} layer;

/* Validates the layer's parameters and arrays against its dims and its inputs' dims (in_*
 * filled by the caller), and prepares it (packs CONV weights). Writes a message on failure.
 * Resets every field it fills first, so op_release is safe after a failure. */
coacto_status op_prepare(layer *l, char *err, size_t err_size);
void op_release(layer *l);
/* Computes columns [col0, col1) x rows [row0, row1) of l's output and writes nothing else of it
 * (other tiles of the same buffer are written concurrently). Thread-safe; no allocation.
 * in[i]: the NHWC buffer of input i; out: the NHWC buffer of l's output (whole layer);
 * scratch: at least l->scratch_fixed + l->scratch_per_col * (col1 - col0) floats, 64-byte aligned
 * (may be NULL when that is 0). The bounds must lie inside the output (the caller validates tiles);
 * any row range is allowed for every op (SOFTMAX and LRN read all channels of their columns). */
void op_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                int32_t row0, int32_t row1, float *scratch);

#endif
