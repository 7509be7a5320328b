/* Tile executors: one function computes one tile of one layer.
 *
 * Parameter encoding of coacto_layer_desc per op (semantics: coacto/ir.py; how many of each an
 * op reads: the table in ops.c, mirrored by coacto/ir.py OPS):
 *   CONV        inputs [x] or [x, residual]
 *               iparams: 0 kh, 1 kw, 2 sh, 3 sw, 4 pt, 5 pl, 6 pb, 7 pr, 8 dh, 9 dw, 10 group, 11 act,
 *                        12 pre (1: a depthwise convolution that reads a 1x1 convolution of x,
 *                        computed row by row as the window needs it; 0: none), 13 pre's act
 *               fparams: 0 alpha, 1 beta (activation), 2 alpha, 3 beta (pre's activation)
 *               arrays:  0 weights float[group][kh][kw][cin_g][cout_g], 1 bias float[c] or absent,
 *                        2 pre's weights float[in_c][c] (pre only), 3 pre's bias float[c] or absent
 *   POOL        iparams: 0 kh, 1 kw, 2 sh, 3 sw, 4 pt, 5 pl, 6 pb, 7 pr, 8 dh, 9 dw, 10 kind
 *                        (0 max, 1 avg), 11 count_include_pad
 *   GLOBAL_POOL iparams: 0 kind (0 max, 1 avg)
 *   BINARY      inputs [a] or [a, b]; iparams: 0 kind (0 add, 1 sub, 2 mul, 3 div, 4 equal,
 *               5 less, 6 greater, 7 pow, 8 max, 9 min, 10 greater or equal, 11 less or equal;
 *               comparisons give 1.0 or 0.0, 0.0 where either side is NaN), 1 act,
 *               2 const_first, 4..7 constant dims (kn, kc, kh, kw: each 1 or the output's)
 *               fparams: 0 alpha, 1 beta; arrays: 0 constant float, NCHW order (one input only)
 *               Activation inputs broadcast: each input dim is 1 or the output's.
 *   AFFINE      iparams: 0 act; fparams: 0 alpha, 1 beta; arrays: 0 scale float[c], 1 shift float[c]
 *   CONCAT      inputs [x1..xk] (k <= 8), channel concatenation
 *   GATHER      inputs [x1..xk]; fparams: 0 fill; arrays: 0 index int32[n*h*w*c] (output storage
 *               order) into the concatenated input storages followed by array 1, -1 for fill;
 *               1 constant values float[] (optional)
 *   LRN         iparams: 0 size; fparams: 0 alpha, 1 beta, 2 bias
 *   SOFTMAX     iparams: 0 log (1 for LogSoftmax); over channels, never split by rows
 *   NOP         does nothing (tests, overhead benchmarks)
 *   MATMUL      inputs [a, b] or [a, b, mask]: batched y[b0,b1,i,j] = scale * sum_k A[b0,b1,i,k] *
 *               B[b0,b1,k,j] (+ mask[b0,b1,i,j]), operands read through strides from their
 *               producers' storage (stride 0 broadcasts):
 *                 A[b0,b1,i,k] = a[a_off + b0*a_s0 + b1*a_s1 + i*a_si + k]
 *                 B[b0,b1,k,j] = b[b_off + b0*b_s0 + b1*b_s1 + k*b_sk + j*b_sj], b_sk or b_sj 1
 *                 mask[...]    = mask[m_off + b0*m_s0 + b1*m_s1 + i*m_si + j*m_sj], m_sj 0 or 1
 *               iparams: 0 B0, 1 B1, 2 M, 3 N, 4 K, 5 a_off, 6 a_s0, 7 a_s1, 8 a_si, 9 b_off,
 *                        10 b_s0, 11 b_s1, 12 b_sk, 13 b_sj, 14 out_mode, 15 causal, 16 offset,
 *                        17 has_mask, 18 m_off, 19 m_s0, 20 m_s1, 21 m_si, 22 m_sj
 *               out_mode 0: column (b0*B1 + b1)*M + i, row j (c = N);
 *                        1: column b0*M + i, row b1*N + j (heads side by side, c = B1*N).
 *               causal 1: outputs with j > i + offset are fill (then + mask), not computed;
 *                      2: the sum runs over k <= i + offset only (A is zero beyond).
 *               fparams: 0 scale, 1 fill
 *   ATTENTION   inputs [a, b, v] or [a, b, v, mask]: softmax(scores) times the values, one head
 *               at a time, the scores never stored: the scores are MATMUL's of (a, b, mask)
 *               with iparams 0..22 as there (out_mode says how the context is written), and
 *                 V[b0,b1,j,d]  = v[v_off + b0*v_s0 + b1*v_s1 + j*v_sk + d*v_sj], v_sk or v_sj 1
 *                 y[b0,b1,i,d]  = sum_j softmax_j(scores[b0,b1,i,:])[j] * V[b0,b1,j,d]
 *               iparams: 23 DV, 24 v_off, 25 v_s0, 26 v_s1, 27 v_sk, 28 v_sj
 *               out_mode 0: column (b0*B1 + b1)*M + i, row d (c = DV); 1: column b0*M + i,
 *                        row b1*DV + d (c = B1*DV).
 *               causal 1: keys j > i + offset are left out (probability 0); offset >= 0.
 *               fparams: 0 scale
 *   LAYERNORM   y = (x - mean) / sqrt(var + eps) * scale[r] + shift[r], mean and (biased) variance
 *               over the rows of each column; fparams: 0 eps; arrays: 0 scale float[c], 1 shift
 *   ROW_REDUCE  output c = 1: the max / mean / sum / min of each input column's rows;
 *               iparams: 0 kind (0 max, 1 mean, 2 sum, 3 min)
 *   WHERE       y = cond != 0 ? x : y with broadcasting; iparams: 0 which operands are inputs
 *               (bit 0 cond, 1 x, 2 y; inputs in that order), 4..7 / 8..11 / 12..15 dims (n, c,
 *               h, w) of the constant cond / x / y; arrays: 0 cond, 1 x, 2 y constants (NCHW
 *               order), absent for operands that are inputs
 *   EMBED       inputs [ids]: output column i is row ids[i] of the table (ids read as floats,
 *               negative ones count from the end; ids that are not integers in [-V, V) give
 *               zeros); the input holds exactly one value per output column; iparams: 0 V;
 *               arrays: 0 table float[V][c]
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
    int32_t iparams[32];
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
    struct layer *pre;        /* CONV with a pointwise prologue: that 1x1 convolution, prepared
                                 as a layer of its own (owned; NULL otherwise) */
} layer;

/* Validates the layer's parameters and arrays against its dims and its inputs' dims (in_*
 * filled by the caller), and prepares it (packs CONV weights). Writes a message on failure.
 * Resets every field it fills first, so op_release is safe after a failure. */
coacto_status op_prepare(layer *l, char *err, size_t err_size);
void op_release(layer *l);
/* 1 when a prepared CONV layer writes each output value once, after reading its residual input
 * at the same place (one pass over the reduction), so its output may overwrite that input. */
int conv_writes_output_once(const layer *l);
/* Computes columns [col0, col1) x rows [row0, row1) of l's output and writes nothing else of it
 * (other tiles of the same buffer are written concurrently). Thread-safe; no allocation.
 * in[i]: the NHWC buffer of input i; out: the NHWC buffer of l's output (whole layer);
 * scratch: at least l->scratch_fixed + l->scratch_per_col * (col1 - col0) floats, 64-byte aligned
 * (may be NULL when that is 0). The bounds must lie inside the output (the caller validates tiles);
 * any row range is allowed for every op (SOFTMAX and LRN read all channels of their columns). */
void op_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                int32_t row0, int32_t row1, float *scratch);

#endif
