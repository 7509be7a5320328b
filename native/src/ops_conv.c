/* Convolution tiles (and Gemm / MatMul, which are convolutions whose kernel covers the input).
 *
 * A tile is columns (output positions) [col0, col1) x rows (output channels) [row0, row1). Three
 * GEMM variants differ only in where the A matrix (one row per output position, K = kh*kw*cin_g
 * values ordered (ky, kx, ci)) comes from:
 *   CONV_POINTWISE  1x1, stride 1, no padding: A is the NHWC input itself (lda = C_in);
 *   CONV_FC         the kernel covers the whole input, no padding: one A row per batch is that
 *                   batch's whole input block (lda = H_in*W_in*C_in);
 *   CONV_IM2COL     anything else: in place from padded copies of the input rows, a block of
 *                   whole output rows at a time (conv_block_padded), where the group is 1, the
 *                   dilation across 1, output rows a row block of the micro-kernel long, the
 *                   window rows and their padded copies fit the row cache (padded_block_rows)
 *                   and a window row holds a quarter of the tile's channels; otherwise im2col of
 *                   a block of the tile's positions into scratch, one reduction slice
 *                   (gemm_block_k values per row) at a time.
 * Depthwise convolutions (group == C_in == C_out) use a direct loop over contiguous channels.
 *
 * Loop order of a GEMM tile: blocks of up to gemm_block_m positions; per block, the whole
 * reduction. The weights are streamed once per block (they are the cold operand: a layer's weights
 * were last read one inference ago), so blocks are as large as the im2col slice that must stay in
 * L2 allows, and im2col is built slice by slice right before the GEMM that consumes it, so it is
 * still in cache when read. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/vec.h"
#include "ops_internal.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

enum { CONV_IM2COL = 0, CONV_POINTWISE = 1, CONV_FC = 2, CONV_DEPTHWISE = 3, CONV_WINOGRAD = 4 };

/* 3x3 convolutions with stride 1, dilation 1, one group and one pixel of padding on every side
 * run as Winograd F(2x2, 3x3) (ops_winograd.c), 16 multiply-adds for every 36 of the direct
 * convolution, when they have WINOGRAD_MIN_CIN input channels or more (the transforms are per
 * channel), at most WINOGRAD_MAX_WEIGHTS weights per tap, and output maps of at least
 * winograd_min_positions() positions: each block of 2x2 tiles reads the 16 transformed weight
 * matrices (16/9 of the weights), so a small map leaves too little work per read, unless the
 * direct kernel itself runs well below the core's rate. It does with an L1 data cache under
 * 48 KiB: the panel slice and the rows of A of a K block deep enough to amortise the passes over
 * C do not stay in 32 KiB and 8 ways together (docs/PERFORMANCE.md, "A second machine kind").
 * COACTO_WINOGRAD=0 in the environment turns it off (the direct paths then compute every
 * convolution). */
#define WINOGRAD_MIN_CIN 16
#define WINOGRAD_MAX_WEIGHTS (512 * 512)

static int64_t winograd_min_positions(void) {
    return cpu_get_caches()->l1d_bytes >= 48 * 1024 ? 28 * 28 : 7 * 7;
}

/* Output positions per im2col block: gemm_block_m. The weights stream once per block, and the
 * im2col slice of a block (gemm_block_m x gemm_block_k floats, a quarter of L2) stays in L2
 * while every panel of the tile's channels reads it. */
/* Positions per block of CONV_POINTWISE and CONV_FC, which read A in place (no im2col scratch):
 * the block only bounds the temporary of a tile that starts inside a panel. */
#define CONV_BLOCK_ROWS_DIRECT 1024

typedef struct conv_geometry {
    int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, group, act;
    int64_t hin, win, cin, cin_g, cout_g, k;
} conv_geometry;

static conv_geometry geometry(const layer *l) {
    const int32_t *p = l->iparams;
    conv_geometry g = {
        .kh = p[0], .kw = p[1], .sh = p[2], .sw = p[3], .pt = p[4], .pl = p[5], .pb = p[6],
        .pr = p[7], .dh = p[8], .dw = p[9], .group = p[10], .act = p[11],
        .hin = l->in_h[0], .win = l->in_w[0], .cin = l->in_c[0],
    };
    /* With a pointwise prologue the window runs over its output, as many channels as this
     * layer's output (conv_prepare checks the layer is depthwise). */
    if (p[12] == 1) g.cin = l->c;
    if (g.group > 0) {
        g.cin_g = g.cin / g.group;
        g.cout_g = l->c / g.group;
    }
    g.k = ops_mul(ops_mul(g.kh, g.kw), g.cin_g); /* -1 when out of range: prepare rejects it */
    return g;
}

/* Output extent of a window sweep: (in + pads - dilated kernel) / stride + 1, or -1 if empty. */
static int64_t conv_extent(int64_t in, int64_t pad0, int64_t pad1, int64_t k, int64_t d,
                           int64_t s) {
    int64_t span = in + pad0 + pad1 - d * (k - 1) - 1;
    return span < 0 ? -1 : span / s + 1;
}

/* Reduction values per im2col slice: one GEMM K block, or all of K when it is shorter. */
static size_t conv_slice_k(const layer *l, const conv_geometry *g) {
    size_t kb = gemm_block_k(l->kern);
    return (size_t)g->k < kb ? (size_t)g->k : kb;
}

/* The in-place path (conv_block_padded) reads each input row it needs from a copy with the
 * layer's left and right padding around it, so that the windows of a whole output row are kw *
 * cin contiguous floats sw * cin apart, borders included. A block of the path is up to
 * padded_block_rows output rows of one batch item; the input rows their windows span
 * (padded_slots of them) are cached in as many slots (a row stays while later blocks still read
 * it), plus one row of zeros for window rows above or below the input. */
#define PADDED_MAX_SLOTS 64
#define PADDED_MAX_BYTES (1024 * 1024)

static int64_t padded_slots(const conv_geometry *g, int64_t rows) {
    return (rows - 1) * g->sh + (g->kh - 1) * g->dh + 1;
}

static size_t padded_row_floats(const conv_geometry *g) {
    return ops_round_up((size_t)((g->pl + g->win + g->pr) * g->cin), 16);
}

/* Output rows per in-place block: whole rows as many as `block` positions hold (at least one),
 * fewer when the input rows their windows span would need more than PADDED_MAX_SLOTS slots or
 * PADDED_MAX_BYTES; 0 when the layer never reads its input in place (a group, dilation across,
 * output rows shorter than a row block of the micro-kernel, or a row cache that cannot hold one
 * output row's window). */
static int64_t padded_block_rows(const layer *l, const conv_geometry *g, int64_t block) {
    if (g->group != 1 || g->dw != 1 || l->w < (int64_t)l->kern->mr) return 0;
    for (int64_t rows = block / l->w > 1 ? block / l->w : 1; rows >= 1; rows--) {
        const int64_t slots = padded_slots(g, rows);
        if (slots <= PADDED_MAX_SLOTS &&
            (size_t)(slots + 1) * padded_row_floats(g) * sizeof(float) <= PADDED_MAX_BYTES)
            return rows;
    }
    return 0;
}

/* Scratch floats of the padded rows, or 0 when the layer never takes the in-place path. */
static size_t padded_rows_floats(const layer *l, const conv_geometry *g, int64_t block) {
    const int64_t rows = padded_block_rows(l, g, block);
    return rows ? (size_t)(padded_slots(g, rows) + 1) * padded_row_floats(g) : 0;
}

static int winograd_fits(const layer *l, const conv_geometry *g) {
    const char *env = getenv("COACTO_WINOGRAD");
    if (env && strcmp(env, "0") == 0) return 0;
    return g->group == 1 && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 &&
           g->dw == 1 && g->pt == 1 && g->pl == 1 && g->pb == 1 && g->pr == 1 &&
           g->cin >= WINOGRAD_MIN_CIN && g->cin * l->c <= WINOGRAD_MAX_WEIGHTS &&
           (int64_t)l->h * l->w >= winograd_min_positions();
}

/* A depthwise convolution with a pointwise prologue keeps the prologue's output rows its window
 * reads in a ring of kh rows (the input row iy in slot iy % kh), computed when the window first
 * reaches them: MobileNet's 1x1 expansions then never write their wide maps (96 channels at 112
 * x 112 are 4.8 MB, past L2) for the depthwise layer to read back. */
#define CONV_PRE_MAX_KH 16
#define CONV_PRE_MAX_RING_FLOATS (4 << 20)

static size_t pre_slot_floats(const conv_geometry *g, int64_t c) {
    return ops_round_up((size_t)(g->win * c), 16);
}

/* The prologue as a pointwise CONV layer of its own (l->pre): output h x w = the input's, l->c
 * channels, weights array 2, bias array 3 (copied: the graph drops the arrays a layer marks
 * consumed, and keeps the others at another address after preparing). */
static coacto_status conv_prepare_pre(layer *l, const conv_geometry *g, char *err,
                                      size_t err_size) {
    OPS_REQUIRE(ops_act_valid(l->iparams[13]), "unknown prologue activation %d", l->iparams[13]);
    coacto_status st = ops_check_array(l, 2, ops_mul(ops_mul(l->in_c[0], l->c), 4),
                                       "prologue weights", err, err_size);
    if (st != COACTO_OK) return st;
    if (l->array_bytes[3] != 0) {
        st = ops_check_array(l, 3, (int64_t)l->c * 4, "prologue bias", err, err_size);
        if (st != COACTO_OK) return st;
    }
    layer *pre = calloc(1, sizeof *pre);
    if (!pre) return COACTO_ERR_OUT_OF_MEMORY;
    l->pre = pre; /* op_release frees it, also after a failure below */
    pre->op = COACTO_OP_CONV;
    pre->n_inputs = 1;
    pre->n = l->n;
    pre->c = l->c;
    pre->h = l->in_h[0];
    pre->w = l->in_w[0];
    pre->in_n[0] = l->in_n[0];
    pre->in_c[0] = l->in_c[0];
    pre->in_h[0] = l->in_h[0];
    pre->in_w[0] = l->in_w[0];
    const int32_t ip[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, l->iparams[13]};
    memcpy(pre->iparams, ip, sizeof ip);
    pre->fparams[0] = l->fparams[2];
    pre->fparams[1] = l->fparams[3];
    pre->arrays[0] = l->arrays[2];
    pre->array_bytes[0] = l->array_bytes[2];
    if (l->array_bytes[3] != 0) {
        float *bias = ops_alloc_floats((size_t)l->c);
        if (!bias) return COACTO_ERR_OUT_OF_MEMORY;
        memcpy(bias, l->arrays[3], (size_t)l->c * sizeof(float));
        pre->arrays[1] = bias;
        pre->array_bytes[1] = l->array_bytes[3];
    }
    pre->kern = l->kern;
    st = op_prepare(pre, err, err_size);
    if (st != COACTO_OK) return st;
    /* one channel in and out is prepared as a depthwise convolution, without the GEMM */
    OPS_REQUIRE(pre->variant == CONV_POINTWISE,
                "a pointwise prologue of %d -> %d channels: it needs more than one", l->in_c[0],
                l->c);
    l->kern = pre->kern;
    l->arrays_consumed |= (1u << 2) | (1u << 3);
    l->scratch_fixed = (size_t)g->kh * pre_slot_floats(g, l->c) + pre->scratch_fixed;
    return COACTO_OK;
}

coacto_status conv_prepare(layer *l, char *err, size_t err_size) {
    const int32_t pre = l->iparams[12];
    OPS_REQUIRE(pre == 0 || pre == 1, "prologue %d must be 0 (none) or 1 (pointwise)", pre);
    if (pre == 0)
        OPS_REQUIRE(l->array_bytes[2] == 0 && l->array_bytes[3] == 0,
                    "arrays 2 and 3 (a pointwise prologue's weights and bias) must be absent "
                    "without a prologue");
    conv_geometry g = geometry(l);
    OPS_REQUIRE(g.kh >= 1 && g.kw >= 1, "kernel %lldx%lld must be positive", (long long)g.kh,
                (long long)g.kw);
    OPS_REQUIRE(g.sh >= 1 && g.sw >= 1 && g.dh >= 1 && g.dw >= 1,
                "strides (%lld, %lld) and dilations (%lld, %lld) must be >= 1", (long long)g.sh,
                (long long)g.sw, (long long)g.dh, (long long)g.dw);
    OPS_REQUIRE(g.pt >= 0 && g.pl >= 0 && g.pb >= 0 && g.pr >= 0, "pads must be >= 0");
    if (pre == 1)
        OPS_REQUIRE(g.group == l->c && g.dh == 1 && g.dw == 1 && g.sh <= g.kh &&
                        g.kh <= CONV_PRE_MAX_KH &&
                        (uint64_t)ops_mul(ops_mul(g.kh, g.win), l->c) <=
                            CONV_PRE_MAX_RING_FLOATS, /* -1 (overflow) fails */
                    "a pointwise prologue needs a depthwise convolution with dilation 1, a "
                    "vertical stride no larger than its %lld kernel rows (at most %d), and %lld "
                    "kernel rows of %lld x %d values in at most %d floats",
                    (long long)g.kh, CONV_PRE_MAX_KH, (long long)g.kh, (long long)g.win, l->c,
                    CONV_PRE_MAX_RING_FLOATS);
    OPS_REQUIRE(ops_act_valid((int32_t)g.act), "unknown activation %lld", (long long)g.act);
    OPS_REQUIRE(g.group >= 1 && g.cin % g.group == 0 && l->c % g.group == 0,
                "group %lld must divide input channels %lld and output channels %d",
                (long long)g.group, (long long)g.cin, l->c);
    OPS_REQUIRE(l->in_n[0] == l->n, "input batch %d differs from the output's %d", l->in_n[0],
                l->n);
    int64_t oh = conv_extent(g.hin, g.pt, g.pb, g.kh, g.dh, g.sh);
    int64_t ow = conv_extent(g.win, g.pl, g.pr, g.kw, g.dw, g.sw);
    OPS_REQUIRE(oh == l->h && ow == l->w,
                "output %dx%d does not match input %lldx%lld under the kernel, strides, pads and "
                "dilations (gives %lldx%lld)",
                l->h, l->w, (long long)g.hin, (long long)g.win, (long long)oh, (long long)ow);
    if (l->n_inputs == 2) {
        coacto_status st = ops_check_same_dims(l, 1, err, err_size);
        if (st != COACTO_OK) return st;
    }
    int64_t wcount = ops_mul(ops_mul(g.group, g.k), g.cout_g);
    OPS_REQUIRE(g.k > 0 && wcount > 0, "kernel %lldx%lld over %lld channels is too large",
                (long long)g.kh, (long long)g.kw, (long long)g.cin_g);
    coacto_status st = ops_check_array(l, 0, wcount * 4, "weights", err, err_size);
    if (st != COACTO_OK) return st;
    if (l->array_bytes[1] != 0) {
        st = ops_check_array(l, 1, (int64_t)l->c * 4, "bias", err, err_size);
        if (st != COACTO_OK) return st;
    }

    const float *w = l->arrays[0];
    if (g.group == g.cin && g.group == l->c) {
        /* Depthwise: re-lay [c][ky][kx] as [ky][kx][c] so each tap is a contiguous vector. */
        l->variant = CONV_DEPTHWISE;
        int64_t taps = g.kh * g.kw, c = l->c;
        l->packed = ops_alloc_floats((size_t)(taps * c));
        if (!l->packed) return COACTO_ERR_OUT_OF_MEMORY;
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t t = 0; t < taps; t++) l->packed[t * c + ch] = w[ch * taps + t];
        l->arrays_consumed = 1u << 0;
        return pre ? conv_prepare_pre(l, &g, err, err_size) : COACTO_OK;
    }

    const gemm_kernel *kern = l->kern ? l->kern : gemm_select();
    l->kern = kern;
    if (winograd_fits(l, &g)) {
        l->variant = CONV_WINOGRAD;
        l->scratch_fixed = winograd_scratch_floats(kern, g.cin, l->c);
        l->packed_group_stride = winograd_packed_stride(kern, g.cin, l->c);
        l->packed = ops_alloc_floats(16 * l->packed_group_stride);
        if (!l->packed) return COACTO_ERR_OUT_OF_MEMORY;
        coacto_status ws = winograd_pack(kern, w, g.cin, l->c, l->packed);
        if (ws != COACTO_OK) return ws;
        l->arrays_consumed = 1u << 0;
        return COACTO_OK;
    }
    if (g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt + g.pl + g.pb + g.pr == 0)
        l->variant = CONV_POINTWISE;
    else if (g.group == 1 && g.kh == g.hin && g.kw == g.win && g.pt + g.pl + g.pb + g.pr == 0)
        l->variant = CONV_FC; /* then h == w == 1 and the dilations do not matter */
    else
        l->variant = CONV_IM2COL;

    size_t block = l->variant == CONV_IM2COL ? gemm_block_m(kern) : CONV_BLOCK_ROWS_DIRECT;
    block = block / kern->mr * kern->mr;
    l->block_cols = (int32_t)block;
    /* An im2col slice of a block, then a block x nr temporary for a tile whose first channel is
     * not at a panel boundary, then the padded input rows of the in-place path. */
    l->scratch_fixed = ops_round_up(block * kern->nr, 16);
    if (l->variant == CONV_IM2COL) {
        l->scratch_fixed += ops_round_up(block * conv_slice_k(l, &g), 16);
        l->scratch_fixed += padded_rows_floats(l, &g, (int64_t)block);
    }

    size_t stride = ops_round_up(gemm_packed_size(kern, (size_t)g.k, (size_t)g.cout_g), 16);
    l->packed_group_stride = stride;
    l->packed = ops_alloc_floats(stride * (size_t)g.group);
    if (!l->packed) return COACTO_ERR_OUT_OF_MEMORY;
    for (int64_t gi = 0; gi < g.group; gi++)
        gemm_pack_b(kern, (size_t)g.k, (size_t)g.cout_g, w + gi * g.k * g.cout_g,
                    (size_t)g.cout_g, l->packed + (size_t)gi * stride);
    l->arrays_consumed = 1u << 0;
    return COACTO_OK;
}

/* Copies n floats; runs of a few channels (a 3-channel image) are too short for a memcpy call. */
static inline void copy_run(float *restrict dst, const float *restrict src, int64_t n) {
    if (n <= 16) {
        for (int64_t j = 0; j < n; j++) dst[j] = src[j];
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

static inline void zero_run(float *dst, int64_t n) {
    if (n <= 16) {
        for (int64_t j = 0; j < n; j++) dst[j] = 0.0f;
    } else {
        memset(dst, 0, (size_t)n * sizeof(float));
    }
}

/* im2col of reduction slice [k0, k1) for m output positions starting at column col, channels of
 * group gi: row i of a (k1 - k0 values) holds A[col + i, k0:k1], zeros where the window leaves the
 * input. The reduction index is (ky * kw + kx) * cin_g + ci; every row starts at the same
 * (ky, kx, ci), found once, and walks on from there by runs: the rest of one tap's channels, or
 * with dilation 1 and one group the rest of a window row inside the input (contiguous in NHWC),
 * or the zeros of a tap or window row outside it. */
static void conv_im2col(const layer *l, const conv_geometry *g, const float *x, int64_t col,
                        int64_t m, int64_t gi, int64_t k0, int64_t k1, float *restrict a) {
    ops_position p = ops_position_of(col, l->h, l->w);
    const int64_t cin_g = g->cin_g, kw = g->kw, ks = k1 - k0;
    const int64_t tap0 = k0 / cin_g, ci0 = k0 - tap0 * cin_g;
    const int64_t ky0 = tap0 / kw, kx0 = tap0 - ky0 * kw;
    const int whole_rows = g->dw == 1 && g->cin_g == g->cin; /* a window row is one run */
    for (int64_t i = 0; i < m; i++, ops_position_next(&p, l->h, l->w)) {
        float *dst = a + i * ks;
        const float *xb = x + p.n * g->hin * g->win * g->cin + gi * g->cin_g;
        const int64_t iy0 = p.y * g->sh - g->pt, ix0 = p.x * g->sw - g->pl;
        int64_t ky = ky0, kx = kx0, ci = ci0, left = ks;
        while (left > 0) {
            const int64_t iy = iy0 + ky * g->dh, ix = ix0 + kx * g->dw;
            int64_t run, taps; /* floats, and whole taps the run finishes */
            if (iy < 0 || iy >= g->hin) {
                run = (kw - kx) * cin_g - ci;
                taps = kw - kx;
            } else if (ix < 0 || ix >= g->win) {
                run = cin_g - ci;
                taps = 1;
            } else {
                taps = 1;
                if (whole_rows) { /* on over the following taps still inside the input */
                    int64_t kx_end = g->win - ix0;
                    taps = (kx_end < kw ? kx_end : kw) - kx;
                }
                run = taps * cin_g - ci;
            }
            if (run > left) run = left; /* the slice ends inside: nothing to advance */
            if (iy < 0 || iy >= g->hin || ix < 0 || ix >= g->win)
                zero_run(dst, run);
            else
                copy_run(dst, xb + (iy * g->win + ix) * g->cin + ci, run);
            dst += run;
            left -= run;
            ci = 0;
            kx += taps;
            if (kx >= kw) {
                kx = 0;
                ky++;
            }
        }
    }
}

/* Reduction range [k0, k1) of output channels [jlo, jhi) of group gi for m positions: c and r
 * point at the group's channel 0 of the first position (row stride l->c); a at A[0, k0]. The
 * first range (k0 == 0) overwrites, the others accumulate, the last (k1 == K) applies bias,
 * residual and clamp. gemm_run wants a panel-aligned first channel; when jlo is not, the
 * channels before the next panel boundary are accumulated in tmp (m x nr, kept between ranges)
 * and copied at the end, so nothing outside the tile is written. */
static void conv_gemm(const layer *l, const conv_geometry *g, size_t m, size_t k0, size_t k1,
                      const float *a, size_t lda, int64_t gi, size_t jlo, size_t jhi, float *c,
                      const float *r, float *tmp) {
    const gemm_kernel *kern = l->kern;
    size_t nr = kern->nr, k = (size_t)g->k, ldc = (size_t)l->c;
    const float *packed = l->packed + (size_t)gi * l->packed_group_stride;
    const float *bias = l->arrays[1] ? (const float *)l->arrays[1] + gi * g->cout_g : NULL;
    const int last = k1 == k;
    float lo, hi;
    ops_act_bounds((int32_t)g->act, l->fparams[0], l->fparams[1], &lo, &hi);

    size_t jmid = ops_round_up(jlo, nr);
    if (jmid > jhi) jmid = jhi;
    if (jlo < jmid) {
        size_t base = jlo / nr * nr;
        gemm_epilogue ep = {bias ? bias + base : NULL, NULL, 0, -INFINITY, INFINITY};
        gemm_run_k(kern, m, 0, jmid - base, k, k0, k1, a, lda, packed + base * k, tmp, nr,
                   last ? &ep : NULL);
        if (last) {
            for (size_t i = 0; i < m; i++) {
                const float *t = tmp + i * nr;
                float *ci = c + i * ldc;
                const float *ri = r ? r + i * ldc : NULL;
                for (size_t j = jlo; j < jmid; j++) {
                    float v = t[j - base] + (ri ? ri[j] : 0.0f);
                    v = v < lo ? lo : v;
                    ci[j] = v > hi ? hi : v;
                }
            }
        }
    }
    if (jmid < jhi) {
        gemm_epilogue ep = {bias ? bias + jmid : NULL, r ? r + jmid : NULL, ldc, lo, hi};
        gemm_run_k(kern, m, 0, jhi - jmid, k, k0, k1, a, lda, packed + jmid * k, c + jmid, ldc,
                   last ? &ep : NULL);
    }
}

/* Group gi's share of output channels [row0, row1): its first channel, and the range [jlo, jhi)
 * of its own channels (0 <= jlo < jhi <= cout_g) the tile covers. */
static void group_channels(const conv_geometry *g, int64_t gi, int64_t row0, int64_t row1,
                           int64_t *first, int64_t *jlo, int64_t *jhi) {
    *first = gi * g->cout_g;
    *jlo = (row0 > *first ? row0 : *first) - *first;
    *jhi = (row1 < *first + g->cout_g ? row1 : *first + g->cout_g) - *first;
}

/* Output channels [row0, row1) of m consecutive columns from b0 by im2col + GEMM (any group). */
static void conv_block_im2col(const layer *l, const conv_geometry *g, const float *x,
                              const float *res, float *out, int64_t b0, int64_t m, int64_t row0,
                              int64_t row1, float *acol, float *tmp) {
    const int64_t c = l->c, slice = (int64_t)conv_slice_k(l, g);
    const int64_t g0 = row0 / g->cout_g, g1 = (row1 - 1) / g->cout_g;
    for (int64_t gi = g0; gi <= g1; gi++) {
        int64_t first, jlo, jhi;
        group_channels(g, gi, row0, row1, &first, &jlo, &jhi);
        float *cb = out + b0 * c + first;
        const float *rb = res ? res + b0 * c + first : NULL;
        for (int64_t k0 = 0; k0 < g->k; k0 += slice) {
            int64_t k1 = g->k - k0 < slice ? g->k : k0 + slice;
            conv_im2col(l, g, x, b0, m, gi, k0, k1, acol);
            conv_gemm(l, g, (size_t)m, (size_t)k0, (size_t)k1, acol, (size_t)(k1 - k0), gi,
                      (size_t)jlo, (size_t)jhi, cb, rb, tmp);
        }
    }
}

/* The padded input rows of one tile: slot i holds input row tag[i] (batch item and row as
 * n * hin + iy, in slot tag % slots; -1 when empty); zero_ready once the row of zeros after the
 * slots has been cleared. */
typedef struct padded_rows {
    float *base;
    size_t row_floats;
    int64_t slots;
    int64_t tag[PADDED_MAX_SLOTS];
    int zero_ready;
} padded_rows;

/* Input row iy of batch item n with the layer's padding on both sides (cin-float positions
 * -pl .. win + pr - 1), or the row of zeros when iy is outside the input. */
static const float *padded_row(padded_rows *pr, const conv_geometry *g, const float *x, int64_t n,
                               int64_t iy) {
    const int64_t cin = g->cin;
    if (iy < 0 || iy >= g->hin) {
        float *zero = pr->base + (size_t)pr->slots * pr->row_floats;
        if (!pr->zero_ready) {
            memset(zero, 0, pr->row_floats * sizeof(float));
            pr->zero_ready = 1;
        }
        return zero;
    }
    const int64_t tag = n * g->hin + iy, slot = tag % pr->slots;
    float *row = pr->base + (size_t)slot * pr->row_floats;
    if (pr->tag[slot] != tag) {
        memset(row, 0, (size_t)(g->pl * cin) * sizeof(float));
        memcpy(row + g->pl * cin, x + tag * g->win * cin, (size_t)(g->win * cin) * sizeof(float));
        memset(row + (g->pl + g->win) * cin, 0, (size_t)(g->pr * cin) * sizeof(float));
        pr->tag[slot] = tag;
    }
    return row;
}

/* Output channels [row0, row1) of m consecutive columns from b0, all of batch item p.n from row
 * p.y, column p.x on (at most PADDED_MAX_SLOTS rows), group 1 and dilation 1 across. In the padded
 * copy of an input row, window row ky of output x is kw * cin contiguous floats from x * sw * cin
 * on, so the GEMM reads A there (row stride sw * cin), one reduction range per window row,
 * accumulating: no im2col, and border positions are no different from the others (window rows
 * outside the input read the row of zeros). The block's output rows are its segments, one
 * gemm_run_k_rows per window row, so that each panel slice of the weights is read from memory
 * once per block and reused by every segment's row blocks. Channels before the tile's first
 * panel boundary go segment by segment through conv_gemm's temporary. */
static void conv_block_padded(const layer *l, const conv_geometry *g, const float *x,
                              const float *res, float *out, int64_t b0, int64_t m,
                              ops_position p, int64_t row0, int64_t row1, float *tmp,
                              padded_rows *pr) {
    const int64_t c = l->c, cin = g->cin, run = g->kw * cin, w = l->w;
    const size_t lda = (size_t)(g->sw * cin), ldc = (size_t)c;
    int64_t seg_col[PADDED_MAX_SLOTS], seg_m[PADDED_MAX_SLOTS], seg_y[PADDED_MAX_SLOTS],
        seg_x[PADDED_MAX_SLOTS];
    int64_t nseg = 0;
    for (int64_t col = b0, y = p.y, x0 = p.x; col < b0 + m; col += seg_m[nseg++], y++, x0 = 0) {
        seg_col[nseg] = col;
        seg_y[nseg] = y;
        seg_x[nseg] = x0;
        seg_m[nseg] = w - x0 < b0 + m - col ? w - x0 : b0 + m - col;
    }
    /* padded_row copies a row in on first use; the rows of one block all fit the cache at once
     * (padded_block_rows), so none is evicted while the block still reads it. */
    int64_t jmid = (int64_t)ops_round_up((size_t)row0, l->kern->nr);
    if (jmid > row1) jmid = row1;
    if (row0 < jmid)
        for (int64_t s = 0; s < nseg; s++)
            for (int64_t ky = 0; ky < g->kh; ky++) {
                const float *a = padded_row(pr, g, x, p.n, seg_y[s] * g->sh - g->pt + ky * g->dh) +
                                 seg_x[s] * g->sw * cin;
                conv_gemm(l, g, (size_t)seg_m[s], (size_t)(ky * run), (size_t)(ky * run + run), a,
                          lda, 0, (size_t)row0, (size_t)jmid, out + seg_col[s] * c,
                          res ? res + seg_col[s] * c : NULL, tmp);
            }
    if (jmid >= row1) return;

    float lo, hi;
    ops_act_bounds((int32_t)g->act, l->fparams[0], l->fparams[1], &lo, &hi);
    const gemm_epilogue ep = {l->arrays[1], NULL, ldc, lo, hi};
    gemm_rows runs[PADDED_MAX_SLOTS];
    for (int64_t s = 0; s < nseg; s++) {
        runs[s].c = out + seg_col[s] * c;
        runs[s].residual = res ? res + seg_col[s] * c : NULL;
        runs[s].m = (size_t)seg_m[s];
    }
    for (int64_t ky = 0; ky < g->kh; ky++) {
        for (int64_t s = 0; s < nseg; s++)
            runs[s].a = padded_row(pr, g, x, p.n, seg_y[s] * g->sh - g->pt + ky * g->dh) +
                        seg_x[s] * g->sw * cin;
        gemm_run_k_rows(l->kern, runs, (size_t)nseg, (size_t)jmid, (size_t)row1, (size_t)g->k,
                        (size_t)(ky * run), (size_t)(ky * run + run), lda, l->packed, ldc, &ep);
    }
}

/* Output channels [row0, row1) of m columns from b0 of a convolution whose A the GEMM reads in
 * place: the input itself (1x1, stride 1, no padding) or, for CONV_FC, column b0's batch item. */
static void conv_block_pointwise(const layer *l, const conv_geometry *g, const float *x,
                                 const float *res, float *out, int64_t b0, int64_t m, int64_t row0,
                                 int64_t row1, float *tmp) {
    const int64_t c = l->c, g0 = row0 / g->cout_g, g1 = (row1 - 1) / g->cout_g;
    for (int64_t gi = g0; gi <= g1; gi++) {
        int64_t first, jlo, jhi;
        group_channels(g, gi, row0, row1, &first, &jlo, &jhi);
        const int pointwise = l->variant == CONV_POINTWISE;
        const float *a = pointwise ? x + b0 * g->cin + gi * g->cin_g : x + b0 * g->k;
        const size_t lda = (size_t)(pointwise ? g->cin : g->k);
        conv_gemm(l, g, (size_t)m, 0, (size_t)g->k, a, lda, gi, (size_t)jlo, (size_t)jhi,
                  out + b0 * c + first, res ? res + b0 * c + first : NULL, tmp);
    }
}

/* Columns of the next block from `left` remaining, at most `block`: as many blocks as needed, of
 * equal size in whole row blocks of the micro-kernel. A 28 x 28 map in blocks of 252 left a last
 * block of 28 columns that streamed all the layer's weights again for little work (VGG-16's
 * 512-channel layer as one tile ran 2% faster in four blocks of 196). */
static int64_t even_block(int64_t left, int64_t block, int64_t mr) {
    if (left <= block) return left;
    const int64_t blocks = (left + block - 1) / block;
    int64_t m = (left + blocks - 1) / blocks;
    m = (m + mr - 1) / mr * mr;
    return m < block ? m : block;
}

static void conv_execute_gemm(const layer *l, const float *const *in, float *out, int64_t col0,
                              int64_t col1, int64_t row0, int64_t row1, float *scratch) {
    conv_geometry g = geometry(l);
    const float *x = in[0], *res = l->n_inputs > 1 ? in[1] : NULL;
    int64_t c = l->c, block = l->block_cols;
    float *acol = scratch;
    float *tmp = scratch;
    if (l->variant == CONV_IM2COL)
        tmp += ops_round_up((size_t)(block * (int64_t)conv_slice_k(l, &g)), 16);

    /* Group-1 convolutions with dilation 1 across read their input in place (conv_block_padded),
     * in blocks of whole output rows, when rows are at least one row block of the micro-kernel
     * long (shorter rows would leave every row block partial), and window rows long enough for
     * the passes over the output (one per window row) to cost less than an im2col copy of the
     * tile's positions would: at least a quarter of the tile's channels (ViT's 16 x 16 patch
     * convolution, 48 values a window row for 768 channels, ran 9% slower in place; MobileNetV2's
     * first, 9 for 32, ran faster). One output row per GEMM, as an earlier form of this path
     * ran, left VGG-16's 56 x 56 x 256 layers 16% slower than im2col: each row re-read the
     * weights. The row blocks of all the block's rows now share each panel slice, as im2col's
     * blocks do (those layers 6% faster than im2col, the 14 x 14 x 512 ones 3%, 28 x 28 x 512
     * 1%). */
    const int64_t brows = l->variant == CONV_IM2COL ? padded_block_rows(l, &g, block) : 0;
    const int direct = brows > 0 && 4 * g.kw * g.cin >= row1 - row0;
    padded_rows pr = {.slots = padded_slots(&g, brows), .row_floats = padded_row_floats(&g)};
    if (direct) {
        pr.base = tmp + ops_round_up((size_t)block * l->kern->nr, 16);
        for (int64_t i = 0; i < pr.slots; i++) pr.tag[i] = -1;
    }

    for (int64_t col = col0, m; col < col1; col += m) {
        if (direct) {
            /* Whole rows (the first from p.x) in blocks of equal row counts, at most brows each
             * (a 28-row tile in blocks of 9 would leave a last block of one row to stream all the
             * weights again), within the batch item and the tile. */
            ops_position p = ops_position_of(col, l->h, l->w);
            const int64_t rows_left = (p.x + col1 - col + l->w - 1) / l->w;
            const int64_t nblocks = (rows_left + brows - 1) / brows;
            int64_t rows = (rows_left + nblocks - 1) / nblocks;
            if (rows > l->h - p.y) rows = l->h - p.y;
            m = rows * l->w - p.x;
            if (m > col1 - col) m = col1 - col;
            if (m > block) m = block; /* rows longer than a block (conv_gemm's temporary) */
            conv_block_padded(l, &g, x, res, out, col, m, p, row0, row1, tmp, &pr);
        } else if (l->variant == CONV_IM2COL) {
            m = even_block(col1 - col, block, (int64_t)l->kern->mr);
            conv_block_im2col(l, &g, x, res, out, col, m, row0, row1, acol, tmp);
        } else {
            m = even_block(col1 - col, block, (int64_t)l->kern->mr);
            conv_block_pointwise(l, &g, x, res, out, col, m, row0, row1, tmp);
        }
        if (!ops_act_is_clamp((int32_t)g.act))
            for (int64_t i = col; i < col + m; i++)
                ops_act_apply(out + i * c + row0, (size_t)(row1 - row0), (int32_t)g.act,
                              l->fparams[0], l->fparams[1]);
    }
}

/* Where a depthwise layer's input rows are: the input itself, or the ring of a pointwise
 * prologue's rows (slot iy % kh; conv_execute_pre keeps those the window reads there). */
typedef struct dw_src {
    const float *x;
    const float *ring;
    size_t slot; /* floats per ring slot */
} dw_src;

/* Input row iy (inside the map) of batch item n, at its position 0. */
static inline const float *dw_row(const dw_src *s, const conv_geometry *g, int64_t n, int64_t iy) {
    if (s->ring) return s->ring + (size_t)(iy % g->kh) * s->slot;
    return s->x + ((n * g->hin + iy) * g->win) * g->cin;
}

/* One block of 8*V channels [c0, ...) of one output position: accumulators acc0.. stay in
 * registers across the window's taps [ky0, ky1) x [kx0, kx1). */
#define DW_TAPS(STEP)                                                                 \
    for (int64_t ky = ky0; ky < ky1; ky++) {                                          \
        const float *xrow = dw_row(src, &g, p.n, iy0 + ky * g.dh) + c0;               \
        const float *wrow = l->packed + ky * g.kw * c + c0;                           \
        for (int64_t kx = kx0; kx < kx1; kx++) {                                      \
            const float *xs = xrow + (ix0 + kx * g.dw) * c, *ws = wrow + kx * c;      \
            STEP                                                                      \
        }                                                                             \
    }
#define DW_INIT(V) ops_f32x8 acc##V = bias ? (ops_f32x8)OPS_F32X8(bias + c0 + 8 * V) : (ops_f32x8){0};
#define DW_MAC(V) acc##V += OPS_F32X8(xs + 8 * V) * OPS_F32X8(ws + 8 * V);
/* Stores max(lo, min(hi, acc + residual)) lane by lane, keeping NaN as ops_act_apply's clamps do:
 * selects by comparison masks, the form the vector extension offers in C (a macro, not a
 * function: a function returning a vector would change the baseline build's ABI). */
#define DW_CLAMP_STORE(VALUE, DST)                                                      \
    {                                                                                   \
        ops_f32x8 v = (VALUE);                                                          \
        dw_i32x8 below = v < lov, above = v > hiv, vi = (dw_i32x8)v;                    \
        vi = (below & (dw_i32x8)lov) | (~below & vi);                                   \
        vi = (above & (dw_i32x8)hiv) | (~above & vi);                                   \
        OPS_F32X8(DST) = (ops_f32x8)vi;                                                 \
    }
#define DW_STORE(V) \
    DW_CLAMP_STORE(r ? acc##V + OPS_F32X8(r + c0 + 8 * V) : acc##V, o + c0 + 8 * V)
typedef int32_t dw_i32x8 __attribute__((vector_size(32)));

/* Positions of one output row that a 3x3 window with dilation 1 covers without padding, from
 * position x on, at most `limit`: the run the register-blocked loop below computes. 0 when the
 * window's rows or x's window are clipped by padding. */
static int64_t dw3_interior_run(const conv_geometry *g, int64_t y, int64_t x, int64_t w,
                                int64_t limit) {
    if (g->kh != 3 || g->kw != 3 || g->dh != 1 || g->dw != 1) return 0;
    const int64_t iy0 = y * g->sh - g->pt, ix0 = x * g->sw - g->pl;
    if (iy0 < 0 || iy0 + 3 > g->hin || ix0 < 0 || ix0 + 3 > g->win) return 0;
    int64_t last = (g->win - 3 + g->pl) / g->sw; /* the last x whose window fits */
    if (last > w - 1) last = w - 1;
    int64_t run = last - x + 1;
    return run < limit ? run : limit;
}

/* A tap row of a 3x3 window for four outputs of a row: their inputs start at q + OFF (OFF: the
 * row's bytes from the window's first row), s bytes apart (stride x channels), s3 = 3 * s; kx
 * steps are cs bytes. Byte offsets base + index * {1, 2} keep the addresses in a few registers. */
#define DW3_ROW(OFF, W0, W1, W2)                                                          \
    {                                                                                     \
        const char *q0 = q + (OFF), *q1 = q0 + cs, *q2 = q0 + 2 * cs;                     \
        a0 += DW3_LD(q0) * W0 + DW3_LD(q1) * W1 + DW3_LD(q2) * W2;                        \
        a1 += DW3_LD(q0 + s) * W0 + DW3_LD(q1 + s) * W1 + DW3_LD(q2 + s) * W2;            \
        a2 += DW3_LD(q0 + 2 * s) * W0 + DW3_LD(q1 + 2 * s) * W1 + DW3_LD(q2 + 2 * s) * W2; \
        a3 += DW3_LD(q0 + s3) * W0 + DW3_LD(q1 + s3) * W1 + DW3_LD(q2 + s3) * W2;         \
    }
#define DW3_LD(P) OPS_F32X8((const float *)(P))
/* Residual, clamp and store of accumulator A for the output at column index COL. */
#define DW3_STORE(A, COL) \
    DW_CLAMP_STORE(res ? A + OPS_F32X8(res + (COL) * c + c0) : A, out + (COL) * c + c0)

/* `count` outputs of one row (columns col.., row y, from x) whose 3x3 windows lie inside the
 * input, channels [row0, row1) in blocks of eight (top: the window's first input row, position 0;
 * d1, d2: the bytes from there to the second and third): four outputs at a time accumulate in
 * registers, each tap row loading its three weights once (the per-position loop loads a weight
 * for every multiply-add, which left it bound by loads at half the FMA rate). Channels past the
 * last block of eight go through the scalar loop. */
static inline __attribute__((always_inline)) void
dw3_interior(const layer *l, const conv_geometry *gp, const float *top, ptrdiff_t d1,
             ptrdiff_t d2, const float *res, float *out, int64_t col, int64_t x, int64_t count,
             int64_t row0, int64_t row1, ops_f32x8 lov, ops_f32x8 hiv, float lo, float hi) {
    const conv_geometry g = *gp;
    const float *bias = l->arrays[1];
    const int64_t c = l->c, sw = g.sw;
    int64_t c0 = row0;
    const size_t cs = (size_t)c * sizeof(float), s = (size_t)sw * cs, s3 = 3 * s;
    const ptrdiff_t dy[3] = {0, d1, d2};
    for (; c0 + 8 <= row1; c0 += 8) {
        const float *wt = l->packed + c0;
        const ops_f32x8 b = bias ? (ops_f32x8)OPS_F32X8(bias + c0) : (ops_f32x8){0};
        /* The nine weights stay in registers for the whole run. */
        const ops_f32x8 w00 = OPS_F32X8(wt), w01 = OPS_F32X8(wt + c), w02 = OPS_F32X8(wt + 2 * c),
                        w10 = OPS_F32X8(wt + 3 * c), w11 = OPS_F32X8(wt + 4 * c),
                        w12 = OPS_F32X8(wt + 5 * c), w20 = OPS_F32X8(wt + 6 * c),
                        w21 = OPS_F32X8(wt + 7 * c), w22 = OPS_F32X8(wt + 8 * c);
        const char *q = (const char *)(top + (x * sw - g.pl) * c + c0);
        int64_t j = 0;
        for (; j + 4 <= count; j += 4, q += 4 * s) {
            ops_f32x8 a0 = b, a1 = b, a2 = b, a3 = b;
            DW3_ROW(0, w00, w01, w02) DW3_ROW(d1, w10, w11, w12) DW3_ROW(d2, w20, w21, w22)
            DW3_STORE(a0, col + j) DW3_STORE(a1, col + j + 1) DW3_STORE(a2, col + j + 2)
            DW3_STORE(a3, col + j + 3)
        }
        for (; j < count; j++, q += s) { /* summed in DW3_ROW's order: tiling changes no bit */
            const char *q0 = q, *q1 = q + d1, *q2 = q + d2;
            ops_f32x8 a0 = b;
            a0 += DW3_LD(q0) * w00 + DW3_LD(q0 + cs) * w01 + DW3_LD(q0 + 2 * cs) * w02;
            a0 += DW3_LD(q1) * w10 + DW3_LD(q1 + cs) * w11 + DW3_LD(q1 + 2 * cs) * w12;
            a0 += DW3_LD(q2) * w20 + DW3_LD(q2 + cs) * w21 + DW3_LD(q2 + 2 * cs) * w22;
            DW3_STORE(a0, col + j)
        }
    }
    for (; c0 < row1; c0++)
        for (int64_t j = 0; j < count; j++) {
            const int64_t ix0 = (x + j) * sw - g.pl;
            float acc = bias ? bias[c0] : 0.0f;
            for (int64_t ky = 0; ky < 3; ky++)
                for (int64_t kx = 0; kx < 3; kx++)
                    acc += ((const float *)((const char *)top + dy[ky]))[(ix0 + kx) * c + c0] *
                           l->packed[(3 * ky + kx) * c + c0];
            float v = acc + (res ? res[(col + j) * c + c0] : 0.0f);
            v = v < lo ? lo : v;
            out[(col + j) * c + c0] = v > hi ? hi : v;
        }
}

#if defined(__x86_64__) || defined(_M_X64)
/* dw3_interior with AVX-512 (where vec_avx512_usable): sixteen channels a vector, the last
 * vector of the channel range masked, so every channel of every tiling takes the same path and
 * the same order of operations (each output: bias, then the taps row by row, one FMA each).
 * Only that last vector uses masked loads and stores: on the Zen 5 this was measured on, a masked
 * load costs several plain ones (MobileNetV2's 144-channel layer at 56 x 56: 0.22 ms with every
 * load masked, 0.16 plain; OpenVINO's 0.08-0.09; the eight-float form 0.24). */
#define DW16_LD(P) (full ? _mm512_loadu_ps((const float *)(P)) : _mm512_maskz_loadu_ps(k, (const float *)(P)))

/* One window row (input row pointer P) of four outputs sw columns apart: the 3 sw + 3 input
 * vectors they read are loaded once each (addressing every tap of every output separately ran
 * out of registers for the addresses and reloaded them from the stack), then each output adds
 * its three taps in order. */
#define DW16_ROW4(P, W0, W1, W2)                                                            \
    {                                                                                       \
        __m512 v[9];                                                                        \
        const char *pp = (P);                                                               \
        for (int t = 0; t < 3 * sw + 3; t++, pp += cs) v[t] = DW16_LD(pp);                 \
        a0 = _mm512_fmadd_ps(v[0], W0, a0);                                                 \
        a0 = _mm512_fmadd_ps(v[1], W1, a0);                                                 \
        a0 = _mm512_fmadd_ps(v[2], W2, a0);                                                 \
        a1 = _mm512_fmadd_ps(v[sw], W0, a1);                                                \
        a1 = _mm512_fmadd_ps(v[sw + 1], W1, a1);                                            \
        a1 = _mm512_fmadd_ps(v[sw + 2], W2, a1);                                            \
        a2 = _mm512_fmadd_ps(v[2 * sw], W0, a2);                                            \
        a2 = _mm512_fmadd_ps(v[2 * sw + 1], W1, a2);                                        \
        a2 = _mm512_fmadd_ps(v[2 * sw + 2], W2, a2);                                        \
        a3 = _mm512_fmadd_ps(v[3 * sw], W0, a3);                                            \
        a3 = _mm512_fmadd_ps(v[3 * sw + 1], W1, a3);                                        \
        a3 = _mm512_fmadd_ps(v[3 * sw + 2], W2, a3);                                        \
    }
/* The same three taps for one output (the run's tail): the same order, so the same bits. */
#define DW16_ROW1(P, W0, W1, W2)                                                            \
    a0 = _mm512_fmadd_ps(DW16_LD(P), W0, a0);                                               \
    a0 = _mm512_fmadd_ps(DW16_LD((P) + cs), W1, a0);                                        \
    a0 = _mm512_fmadd_ps(DW16_LD((P) + 2 * cs), W2, a0);
#define DW16_STORE(A, COL)                                                                  \
    {                                                                                       \
        float *o_ = out + (COL) * c + c0;                                                   \
        __m512 v_ = res ? _mm512_add_ps(A, DW16_LD(res + (COL) * c + c0)) : A;              \
        v_ = _mm512_min_ps(hiv, _mm512_max_ps(lov, v_)); /* NaN stays, as in DW_CLAMP_STORE */ \
        if (full)                                                                           \
            _mm512_storeu_ps(o_, v_);                                                       \
        else                                                                                \
            _mm512_mask_storeu_ps(o_, k, v_);                                               \
    }

/* Channels [c0, c0 + 16) (k: those of them below the range's end) of the run; sw (1 or 2) and
 * full are constants where it is inlined, so v[] stays in registers and full blocks load plain. */
__attribute__((target("avx512f"), always_inline)) static inline void
dw16_block(const layer *l, const conv_geometry *gp, const float *top, ptrdiff_t d1, ptrdiff_t d2,
           const float *res, float *out, int64_t col, int64_t x, int64_t count, int64_t c0,
           __mmask16 k, const int sw, const int full, __m512 lov, __m512 hiv) {
    const conv_geometry g = *gp;
    const float *bias = l->arrays[1];
    const int64_t c = l->c;
    const size_t cs = (size_t)c * sizeof(float), s = (size_t)sw * cs;
    const float *wt = l->packed + c0;
    const __m512 b = bias ? DW16_LD(bias + c0) : _mm512_setzero_ps();
    /* The nine weights stay in registers for the whole run. */
    const __m512 w00 = DW16_LD(wt), w01 = DW16_LD(wt + c), w02 = DW16_LD(wt + 2 * c),
                 w10 = DW16_LD(wt + 3 * c), w11 = DW16_LD(wt + 4 * c), w12 = DW16_LD(wt + 5 * c),
                 w20 = DW16_LD(wt + 6 * c), w21 = DW16_LD(wt + 7 * c), w22 = DW16_LD(wt + 8 * c);
    const char *q = (const char *)(top + (x * sw - g.pl) * c + c0);
    int64_t j = 0;
    for (; j + 4 <= count; j += 4, q += 4 * s) {
        __m512 a0 = b, a1 = b, a2 = b, a3 = b;
        DW16_ROW4(q, w00, w01, w02)
        DW16_ROW4(q + d1, w10, w11, w12)
        DW16_ROW4(q + d2, w20, w21, w22)
        DW16_STORE(a0, col + j) DW16_STORE(a1, col + j + 1)
        DW16_STORE(a2, col + j + 2) DW16_STORE(a3, col + j + 3)
    }
    for (; j < count; j++, q += s) {
        __m512 a0 = b;
        DW16_ROW1(q, w00, w01, w02)
        DW16_ROW1(q + d1, w10, w11, w12)
        DW16_ROW1(q + d2, w20, w21, w22)
        DW16_STORE(a0, col + j)
    }
}

/* The run (window stride sw, 1 or 2), channel blocks outer. */
__attribute__((target("avx512f"))) static void
dw3_interior_avx512(const layer *l, const conv_geometry *g, const float *top, ptrdiff_t d1,
                    ptrdiff_t d2, const float *res, float *out, int64_t col, int64_t x,
                    int64_t count, int64_t row0, int64_t row1, float lo, float hi) {
    const __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    int64_t c0 = row0;
    for (; c0 + 16 <= row1; c0 += 16) {
        if (g->sw == 1)
            dw16_block(l, g, top, d1, d2, res, out, col, x, count, c0, 0xFFFF, 1, 1, lov, hiv);
        else
            dw16_block(l, g, top, d1, d2, res, out, col, x, count, c0, 0xFFFF, 2, 1, lov, hiv);
    }
    if (c0 < row1) {
        const __mmask16 k = (__mmask16)((1u << (row1 - c0)) - 1u);
        if (g->sw == 1)
            dw16_block(l, g, top, d1, d2, res, out, col, x, count, c0, k, 1, 0, lov, hiv);
        else
            dw16_block(l, g, top, d1, d2, res, out, col, x, count, c0, k, 2, 0, lov, hiv);
    }
}
#endif

/* Direct depthwise convolution: per output position, blocks of channels accumulate every tap of
 * the window in registers (weights re-laid [ky][kx][c] so each tap is a contiguous vector). Runs
 * of 3x3 windows inside the input (all but the border of a padded map) take dw3_interior. */
OPS_CLONES static void conv_execute_depthwise(const layer *l, const dw_src *src,
                                              const float *res, float *out, int64_t col0,
                                              int64_t col1, int64_t row0, int64_t row1) {
    conv_geometry g = geometry(l);
    const float *bias = l->arrays[1];
    int64_t c = l->c;
    /* Clamp activations (none, ReLU, ReLU6) are applied in registers before the store; the
     * others in a pass over the finished channels. */
    float lo, hi;
    ops_act_bounds((int32_t)g.act, l->fparams[0], l->fparams[1], &lo, &hi);
    const ops_f32x8 lov = {lo, lo, lo, lo, lo, lo, lo, lo}, hiv = {hi, hi, hi, hi, hi, hi, hi, hi};
    ops_position p = ops_position_of(col0, l->h, l->w);
#if defined(__x86_64__) || defined(_M_X64)
    const int wide = vec_avx512_usable();
#endif
    for (int64_t col = col0; col < col1;) {
        const int64_t run = dw3_interior_run(&g, p.y, p.x, l->w, col1 - col);
        if (run > 0) {
            const int64_t iy = p.y * g.sh - g.pt;
            const float *top = dw_row(src, &g, p.n, iy);
            const ptrdiff_t d1 = (const char *)dw_row(src, &g, p.n, iy + 1) - (const char *)top,
                            d2 = (const char *)dw_row(src, &g, p.n, iy + 2) - (const char *)top;
#if defined(__x86_64__) || defined(_M_X64)
            if (wide && g.sw <= 2)
                dw3_interior_avx512(l, &g, top, d1, d2, res, out, col, p.x, run, row0, row1, lo,
                                    hi);
            else
#endif
                dw3_interior(l, &g, top, d1, d2, res, out, col, p.x, run, row0, row1, lov, hiv,
                             lo, hi);
            if (!ops_act_is_clamp((int32_t)g.act))
                for (int64_t j = 0; j < run; j++)
                    ops_act_apply(out + (col + j) * c + row0, (size_t)(row1 - row0),
                                  (int32_t)g.act, l->fparams[0], l->fparams[1]);
            col += run;
            p.x += run - 1; /* the run ends inside the row: step onto the next column */
            ops_position_next(&p, l->h, l->w);
            continue;
        }
        const float *r = res ? res + col * c : NULL;
        float *o = out + col * c;
        int64_t iy0 = p.y * g.sh - g.pt, ix0 = p.x * g.sw - g.pl, ky0, ky1, kx0, kx1;
        ops_window_taps(iy0, g.kh, g.dh, g.hin, &ky0, &ky1);
        ops_window_taps(ix0, g.kw, g.dw, g.win, &kx0, &kx1);
        int64_t c0 = row0;
        for (; c0 + 32 <= row1; c0 += 32) {
            DW_INIT(0) DW_INIT(1) DW_INIT(2) DW_INIT(3)
            DW_TAPS(DW_MAC(0) DW_MAC(1) DW_MAC(2) DW_MAC(3))
            DW_STORE(0) DW_STORE(1) DW_STORE(2) DW_STORE(3)
        }
        for (; c0 + 8 <= row1; c0 += 8) {
            DW_INIT(0)
            DW_TAPS(DW_MAC(0))
            DW_STORE(0)
        }
        for (; c0 < row1; c0++) {
            float acc = bias ? bias[c0] : 0.0f;
            for (int64_t ky = ky0; ky < ky1; ky++)
                for (int64_t kx = kx0; kx < kx1; kx++)
                    acc += dw_row(src, &g, p.n, iy0 + ky * g.dh)[(ix0 + kx * g.dw) * c + c0] *
                           l->packed[(ky * g.kw + kx) * c + c0];
            float v = acc + (r ? r[c0] : 0.0f);
            v = v < lo ? lo : v;
            o[c0] = v > hi ? hi : v;
        }
        if (!ops_act_is_clamp((int32_t)g.act))
            ops_act_apply(o + row0, (size_t)(row1 - row0), (int32_t)g.act, l->fparams[0],
                          l->fparams[1]);
        col++;
        ops_position_next(&p, l->h, l->w);
    }
}

int conv_writes_output_once(const layer *l) {
    if (l->op != COACTO_OP_CONV || l->n_inputs != 2 || l->variant != CONV_POINTWISE || !l->kern)
        return 0;
    /* a second K block would read back a partial sum written over the residual */
    const conv_geometry g = geometry(l);
    return g.group == 1 && (size_t)g.k <= gemm_one_pass_k(l->kern);
}

/* A depthwise layer with a pointwise prologue, output row by output row (a part of one at the
 * tile's ends): the prologue's rows its windows read are computed into the ring when first
 * needed, for the tile's channels [row0, row1) only (each depthwise channel reads its own), and
 * then the depthwise loop reads them there. A tile recomputes the rows its first output row
 * shares with the tile above it (kh - sh of them). */
static void conv_execute_pre(const layer *l, const float *const *in, float *out, int64_t col0,
                             int64_t col1, int64_t row0, int64_t row1, float *scratch) {
    const conv_geometry g = geometry(l);
    const size_t slot = pre_slot_floats(&g, l->c);
    dw_src src = {.x = NULL, .ring = scratch, .slot = slot};
    float *tmp = scratch + (size_t)g.kh * slot;
    const float *res = l->n_inputs > 1 ? in[1] : NULL;
    const int64_t cin = l->pre->in_c[0];
    int64_t tag[CONV_PRE_MAX_KH];
    for (int64_t i = 0; i < g.kh; i++) tag[i] = -1;
    ops_position p = ops_position_of(col0, l->h, l->w);
    for (int64_t col = col0; col < col1;) {
        const int64_t run = l->w - p.x < col1 - col ? l->w - p.x : col1 - col;
        for (int64_t ky = 0, iy = p.y * g.sh - g.pt; ky < g.kh; ky++, iy++) {
            if (iy < 0 || iy >= g.hin || tag[iy % g.kh] == p.n * g.hin + iy) continue;
            /* the pointwise executor on one input row, as if it were the whole map */
            const float *xr[1] = {in[0] + (p.n * g.hin + iy) * g.win * cin};
            conv_execute_gemm(l->pre, xr, scratch + (size_t)(iy % g.kh) * slot, 0, g.win, row0,
                              row1, tmp);
            tag[iy % g.kh] = p.n * g.hin + iy;
        }
        conv_execute_depthwise(l, &src, res, out, col, col + run, row0, row1);
        col += run;
        p.x += run - 1;
        ops_position_next(&p, l->h, l->w);
    }
}

void conv_execute(const layer *l, const float *const *in, float *out, int32_t col0, int32_t col1,
                  int32_t row0, int32_t row1, float *scratch) {
    if (l->pre) {
        conv_execute_pre(l, in, out, col0, col1, row0, row1, scratch);
    } else if (l->variant == CONV_DEPTHWISE) {
        const dw_src src = {.x = in[0], .ring = NULL, .slot = 0};
        conv_execute_depthwise(l, &src, l->n_inputs > 1 ? in[1] : NULL, out, col0, col1, row0,
                               row1);
    } else if (l->variant == CONV_WINOGRAD) {
        const int32_t act = l->iparams[11];
        float lo, hi;
        ops_act_bounds(act, l->fparams[0], l->fparams[1], &lo, &hi);
        winograd_execute(l, in[0], l->n_inputs > 1 ? in[1] : NULL, out, col0, col1, row0, row1,
                         lo, hi, scratch);
        if (!ops_act_is_clamp(act))
            for (int64_t col = col0; col < col1; col++)
                ops_act_apply(out + col * l->c + row0, (size_t)(row1 - row0), act, l->fparams[0],
                              l->fparams[1]);
    } else {
        conv_execute_gemm(l, in, out, col0, col1, row0, row1, scratch);
    }
}
