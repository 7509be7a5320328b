/* Winograd F(2x2, 3x3) convolution tiles (CONV_WINOGRAD in ops_conv.c).
 *
 * A 3x3 convolution with stride 1, dilation 1 and one pixel of padding on every side computes
 * each 2x2 block of outputs (a Winograd tile) from the 4x4 patch of input around it as
 *   Y = A^T [ U (.) V ] A,   U = G g G^T (4x4, per input and output channel),  V = B^T d B
 * where (.) multiplies element by element. Summed over input channels, each of the 16 elements xi
 * of U (.) V is a matrix product: M[xi] (tiles x cout) = V[xi] (tiles x cin) x U[xi] (cin x cout).
 * That is 16 multiply-adds per input channel and output channel for 4 outputs, where the direct
 * convolution spends 36: the products run on the same GEMM micro-kernels, packed per xi at load.
 *
 *   B^T = | 1  0 -1  0 |    G = | 1    0    0  |    A^T = | 1  1  1  0 |
 *         | 0  1  1  0 |        | 1/2  1/2  1/2 |          | 0  1 -1 -1 |
 *         | 0 -1  1  0 |        | 1/2 -1/2  1/2 |
 *         | 0  1  0 -1 |        | 0    0    1  |
 *
 * Each output of a tile depends on exactly the 3x3 window of the patch a direct convolution reads
 * (output row a only on patch rows a..a+2, no cancellation in between: B^T's row 0 is used by
 * output row 0 only, row 3 by output row 1 only; the same across). So a tile whose outputs lie
 * partly outside the layer tile being computed (tile edges, odd maps) computes with zeros in place
 * of the patch values only its other outputs read, and stores only its own: it reads exactly the
 * input a direct convolution of the same outputs reads (what the tile's dependencies cover).
 *
 * The transforms add and subtract (and halve, for U): the result differs from the direct sum by a
 * few rounding steps, well inside the tolerances the tests hold every path to. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "ops_internal.h"

/* Winograd tiles per block: the block's V (16 x tiles x cin floats) and M (16 x tiles x channels)
 * stay in L2 (cpu_get_caches) between the input transform, the 16 products and the output
 * transform, in half of it: the products stream the packed weights of each xi through L2 too,
 * and with V and M filling all of it ResNet-50's 56x56x64 convolutions ran 15% slower. */
#define WINO_BLOCK_MAX 112

size_t winograd_packed_stride(const gemm_kernel *kern, int64_t cin, int64_t cout) {
    return ops_round_up(gemm_packed_size(kern, (size_t)cin, (size_t)cout), 16);
}

static int64_t winograd_block_tiles(const gemm_kernel *kern, int64_t cin, int64_t cout) {
    const int64_t mr = (int64_t)kern->mr;
    const size_t l2 = (size_t)cpu_get_caches()->l2_bytes;
    int64_t t = (int64_t)(l2 / 2 / (16 * sizeof(float) * (size_t)(cin + cout)));
    if (t > WINO_BLOCK_MAX) t = WINO_BLOCK_MAX;
    t = t / mr * mr;
    return t < mr ? mr : t;
}

size_t winograd_scratch_floats(const gemm_kernel *kern, int64_t cin, int64_t cout) {
    const size_t tiles = (size_t)winograd_block_tiles(kern, cin, cout);
    return ops_round_up((size_t)cin, 16) /* the row of zeros */
           + 16 * tiles * (size_t)cin     /* V */
           + 16 * tiles * (size_t)cout;   /* M (rows of at most cout channels) */
}

coacto_status winograd_pack(const gemm_kernel *kern, const float *w, int64_t cin, int64_t cout,
                            float *packed) {
    /* w: [ky][kx][ci][co]. u: U[xi][ci][co], then each xi packed as a cin x cout B. */
    const size_t plane = (size_t)(cin * cout);
    float *u = malloc(16 * plane * sizeof(float));
    if (!u) return COACTO_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < plane; i++) {
        float g[3][3], t[4][3];
        for (int ky = 0; ky < 3; ky++)
            for (int kx = 0; kx < 3; kx++) g[ky][kx] = w[(size_t)(ky * 3 + kx) * plane + i];
        for (int kx = 0; kx < 3; kx++) { /* G g */
            t[0][kx] = g[0][kx];
            t[1][kx] = 0.5f * (g[0][kx] + g[1][kx] + g[2][kx]);
            t[2][kx] = 0.5f * (g[0][kx] - g[1][kx] + g[2][kx]);
            t[3][kx] = g[2][kx];
        }
        for (int r = 0; r < 4; r++) { /* (G g) G^T */
            u[(size_t)(4 * r + 0) * plane + i] = t[r][0];
            u[(size_t)(4 * r + 1) * plane + i] = 0.5f * (t[r][0] + t[r][1] + t[r][2]);
            u[(size_t)(4 * r + 2) * plane + i] = 0.5f * (t[r][0] - t[r][1] + t[r][2]);
            u[(size_t)(4 * r + 3) * plane + i] = t[r][2];
        }
    }
    const size_t stride = winograd_packed_stride(kern, cin, cout);
    for (int xi = 0; xi < 16; xi++)
        gemm_pack_b(kern, (size_t)cin, (size_t)cout, u + (size_t)xi * plane, (size_t)cout,
                    packed + (size_t)xi * stride);
    free(u);
    return COACTO_OK;
}

/* Patch entries (bit 4 * r + c) that the outputs in `outs` (bit 2 * a + b) read. */
static unsigned patch_needs(unsigned outs) {
    unsigned need = 0;
    for (unsigned a = 0; a < 2; a++)
        for (unsigned b = 0; b < 2; b++)
            if (outs & (1u << (2 * a + b)))
                for (unsigned r = a; r < a + 3; r++)
                    for (unsigned c = b; c < b + 3; c++) need |= 1u << (4 * r + c);
    return need;
}

/* One Winograd tile of the block, where it starts: batch item, tile row and column, and which of
 * its four outputs (bit 2 * a + b for output row 2ty + a, column 2tx + b) the layer tile owns. */
typedef struct wino_tile {
    int64_t n, ty, tx;
    unsigned outs;
} wino_tile;

/* V[xi][t][ci] = (B^T d B)[xi] for the block's tiles, ci in [0, cin), rows cin floats apart,
 * planes (one per xi) plane floats apart. d[r][c] is the input at patch row r, column c, or zero
 * outside the input and where no owned output reads it. */
OPS_CLONES static void winograd_input(const layer *l, const float *x, const wino_tile *tiles,
                                      int64_t count, const float *zero, float *v, size_t plane) {
    const int64_t hin = l->in_h[0], win = l->in_w[0], cin = l->in_c[0];
    for (int64_t t = 0; t < count; t++) {
        const wino_tile *wt = &tiles[t];
        const unsigned need = patch_needs(wt->outs);
        const float *d[16];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) {
                const int64_t iy = 2 * wt->ty - 1 + r, ix = 2 * wt->tx - 1 + c;
                const int inside = iy >= 0 && iy < hin && ix >= 0 && ix < win;
                d[4 * r + c] = inside && (need >> (4 * r + c) & 1u)
                                   ? x + ((wt->n * hin + iy) * win + ix) * cin
                                   : zero;
            }
        float *vt = v + (size_t)t * (size_t)cin;
        int64_t ci = 0;
#define WINO_IN(LOAD, STORE)                                                                   \
    {                                                                                          \
        for (int c = 0; c < 4; c++) { /* B^T d, column c */                                  \
            const TYPE d0 = LOAD(d[c]), d1 = LOAD(d[4 + c]), d2 = LOAD(d[8 + c]),             \
                       d3 = LOAD(d[12 + c]);                                                   \
            tr[0][c] = d0 - d2;                                                                \
            tr[1][c] = d1 + d2;                                                                \
            tr[2][c] = d2 - d1;                                                                \
            tr[3][c] = d1 - d3;                                                                \
        }                                                                                      \
        for (int r = 0; r < 4; r++) { /* (B^T d) B */                                        \
            STORE(vt + (size_t)(4 * r + 0) * plane, tr[r][0] - tr[r][2]);                      \
            STORE(vt + (size_t)(4 * r + 1) * plane, tr[r][1] + tr[r][2]);                      \
            STORE(vt + (size_t)(4 * r + 2) * plane, tr[r][2] - tr[r][1]);                      \
            STORE(vt + (size_t)(4 * r + 3) * plane, tr[r][1] - tr[r][3]);                      \
        }                                                                                      \
    }
#define TYPE ops_f32x8
#define LOAD8(P) OPS_F32X8((P) + ci)
#define STORE8(P, V) (OPS_F32X8((P) + ci) = (V))
        for (; ci + 8 <= cin; ci += 8) {
            ops_f32x8 tr[4][4];
            WINO_IN(LOAD8, STORE8)
        }
#undef TYPE
#define TYPE float
#define LOAD1(P) ((P)[ci])
#define STORE1(P, V) ((P)[ci] = (V))
        for (; ci < cin; ci++) {
            float tr[4][4];
            WINO_IN(LOAD1, STORE1)
        }
#undef TYPE
#undef LOAD8
#undef STORE8
#undef LOAD1
#undef STORE1
    }
}

/* Clamp to [lo, hi] lane by lane, NaN kept (as ops_act_apply's clamps and the GEMM epilogue). */
typedef int32_t wino_i32x8 __attribute__((vector_size(32)));
#define WINO_CLAMP(V)                                                                        \
    {                                                                                        \
        wino_i32x8 below = (V) < lov, above = (V) > hiv, vi = (wino_i32x8)(V);               \
        vi = (below & (wino_i32x8)lov) | (~below & vi);                                      \
        vi = (above & (wino_i32x8)hiv) | (~above & vi);                                      \
        (V) = (ops_f32x8)vi;                                                                 \
    }

/* Y = A^T M A for the block's tiles, output channels [row0, row1) (M's columns from j0 on, ldm
 * floats a row, planes plane floats apart), plus bias and residual, clamped; stored where the
 * layer tile owns the output. */
OPS_CLONES static void winograd_output(const layer *l, const wino_tile *tiles, int64_t count,
                                       const float *m, size_t plane, size_t ldm, int64_t j0,
                                       int64_t row0, int64_t row1, const float *res, float *out,
                                       float lo, float hi) {
    const int64_t h = l->h, w = l->w, c = l->c;
    const float *bias = l->arrays[1];
    const ops_f32x8 lov = {lo, lo, lo, lo, lo, lo, lo, lo}, hiv = {hi, hi, hi, hi, hi, hi, hi, hi};
    for (int64_t t = 0; t < count; t++) {
        const wino_tile *wt = &tiles[t];
        float *o[4];
        const float *rp[4];
        for (int q = 0; q < 4; q++) {
            const int64_t col = (wt->n * h + 2 * wt->ty + q / 2) * w + 2 * wt->tx + q % 2;
            o[q] = wt->outs >> q & 1u ? out + col * c : NULL;
            rp[q] = wt->outs >> q & 1u && res ? res + col * c : NULL;
        }
        const float *mt = m + (size_t)t * ldm;
        int64_t co = row0;
#define WINO_OUT(LOAD)                                                                         \
    {                                                                                          \
        for (int cc = 0; cc < 4; cc++) { /* A^T M, column cc */                              \
            const TYPE m0 = LOAD(mt + (size_t)cc * plane);                                   \
            const TYPE m1 = LOAD(mt + (size_t)(4 + cc) * plane);                             \
            const TYPE m2 = LOAD(mt + (size_t)(8 + cc) * plane);                             \
            const TYPE m3 = LOAD(mt + (size_t)(12 + cc) * plane);                            \
            s[0][cc] = m0 + m1 + m2;                                                           \
            s[1][cc] = m1 - m2 - m3;                                                           \
        }                                                                                      \
        for (int a = 0; a < 2; a++) { /* (A^T M) A */                                        \
            y[2 * a] = s[a][0] + s[a][1] + s[a][2] + b;                                        \
            y[2 * a + 1] = s[a][1] - s[a][2] - s[a][3] + b;                                    \
        }                                                                                      \
    }
#define TYPE ops_f32x8
#define MLOAD8(P) OPS_F32X8((P) + (co - j0))
#define MLOAD1(P) ((P)[co - j0])
        for (; co + 8 <= row1; co += 8) {
            ops_f32x8 s[2][4], y[4];
            const ops_f32x8 b = bias ? (ops_f32x8)OPS_F32X8(bias + co) : (ops_f32x8){0};
            WINO_OUT(MLOAD8)
            for (int q = 0; q < 4; q++)
                if (o[q]) {
                    if (rp[q]) y[q] += OPS_F32X8(rp[q] + co);
                    WINO_CLAMP(y[q])
                    OPS_F32X8(o[q] + co) = y[q];
                }
        }
#undef TYPE
#define TYPE float
        for (; co < row1; co++) {
            float s[2][4], y[4];
            const float b = bias ? bias[co] : 0.0f;
            WINO_OUT(MLOAD1)
            for (int q = 0; q < 4; q++)
                if (o[q]) {
                    float v = y[q] + (rp[q] ? rp[q][co] : 0.0f);
                    v = v < lo ? lo : v;
                    o[q][co] = v > hi ? hi : v;
                }
        }
#undef TYPE
    }
}
#undef MLOAD8
#undef MLOAD1

/* Scratch of one layer tile: the row of zeros, V and M (see winograd_scratch_floats). */
typedef struct wino_block {
    const float *x, *res, *zero;
    float *v, *m, *out;
    size_t vplane, mplane, ldm;
    int64_t j0, row0, row1;
    float lo, hi;
} wino_block;

/* Input transform, the 16 products over output channels [j0, row1) (from the panel boundary at
 * or before row0: M's extra leading channels are scratch, never stored), output transform. */
static void winograd_block(const layer *l, const wino_block *b, const wino_tile *tiles,
                           int64_t count) {
    const size_t cin = (size_t)l->in_c[0];
    winograd_input(l, b->x, tiles, count, b->zero, b->v, b->vplane);
    for (size_t xi = 0; xi < 16; xi++)
        gemm_run(l->kern, (size_t)count, 0, b->ldm, cin, b->v + xi * b->vplane, cin,
                 l->packed + xi * l->packed_group_stride + (size_t)b->j0 * cin,
                 b->m + xi * b->mplane, b->ldm, NULL);
    winograd_output(l, tiles, count, b->m, b->mplane, b->ldm, b->j0, b->row0, b->row1, b->res,
                    b->out, b->lo, b->hi);
}

/* Columns [col0, col1) x channels [row0, row1): the Winograd tiles that own any of the columns,
 * in blocks of winograd_block_tiles. */
void winograd_execute(const layer *l, const float *x, const float *res, float *out, int64_t col0,
                      int64_t col1, int64_t row0, int64_t row1, float lo, float hi,
                      float *scratch) {
    const gemm_kernel *kern = l->kern;
    const int64_t h = l->h, w = l->w, cin = l->in_c[0], c = l->c, tw = (w + 1) / 2;
    const int64_t block = winograd_block_tiles(kern, cin, c);
    wino_block b = {.x = x, .res = res, .out = out, .row0 = row0,
                    .row1 = row1, .lo = lo, .hi = hi};
    b.j0 = row0 / (int64_t)kern->nr * (int64_t)kern->nr;
    b.ldm = (size_t)(row1 - b.j0);
    b.vplane = (size_t)(block * cin);
    b.mplane = (size_t)block * b.ldm;
    float *zero = scratch;
    b.zero = zero;
    b.v = zero + ops_round_up((size_t)cin, 16);
    b.m = b.v + 16 * b.vplane;
    memset(zero, 0, (size_t)cin * sizeof(float));

    wino_tile tiles[WINO_BLOCK_MAX];
    int64_t count = 0;
    const ops_position first = ops_position_of(col0, h, w), last = ops_position_of(col1 - 1, h, w);
    for (int64_t n = first.n; n <= last.n; n++) {
        const int64_t ty0 = n == first.n ? first.y / 2 : 0;
        const int64_t ty1 = n == last.n ? last.y / 2 : (h - 1) / 2;
        for (int64_t ty = ty0; ty <= ty1; ty++)
            for (int64_t tx = 0; tx < tw; tx++) {
                unsigned outs = 0;
                for (int q = 0; q < 4; q++) {
                    const int64_t y = 2 * ty + q / 2, xo = 2 * tx + q % 2;
                    const int64_t col = (n * h + y) * w + xo;
                    if (y < h && xo < w && col >= col0 && col < col1) outs |= 1u << q;
                }
                if (!outs) continue;
                tiles[count++] = (wino_tile){n, ty, tx, outs};
                if (count == block) {
                    winograd_block(l, &b, tiles, count);
                    count = 0;
                }
            }
    }
    if (count) winograd_block(l, &b, tiles, count);
}
