/* Tile executors against naive oracles.
 *
 * Every case builds a layer by hand, prepares it, and computes its whole output as tiles of three
 * tilings (one tile; random column x row cuts; column cuts x row cuts at GEMM panel boundaries).
 * Each tile runs on a fresh output buffer filled with a sentinel: the tile's rectangle must match
 * the oracle (computed in double, in NCHW index terms) and nothing outside it may change; then
 * three threads compute the random tiling into one shared buffer (harness.h). Convolutions run
 * with every GEMM kernel the CPU supports (op_prepare keeps a kernel the caller sets in
 * layer.kern when it is one of gemm_available()). A second part checks
 * that op_prepare rejects corrupt parameters, arrays and dims.
 *
 * Usage: test_ops [seed] */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "kernels/vec.h"

/* ---- CONV ------------------------------------------------------------------------------------ */

typedef struct conv_case {
    const char *name;
    int n, cin, hin, win, cout, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, group, act;
    int residual, bias;
    float alpha, beta;
} conv_case;

static void test_conv(const conv_case *cc, const gemm_kernel *kern) {
    int oh = (cc->hin + cc->pt + cc->pb - cc->dh * (cc->kh - 1) - 1) / cc->sh + 1;
    int ow = (cc->win + cc->pl + cc->pr - cc->dw * (cc->kw - 1) - 1) / cc->sw + 1;
    int cin_g = cc->cin / cc->group, cout_g = cc->cout / cc->group;
    tensor x = t_rand(cc->n, cc->cin, cc->hin, cc->win, -1, 1);
    tensor r = t_rand(cc->n, cc->cout, oh, ow, -1, 1);
    size_t wn = (size_t)cc->group * cc->kh * cc->kw * cin_g * cout_g;
    float *w = malloc(wn * sizeof(float)), *b = malloc((size_t)cc->cout * sizeof(float));
    for (size_t i = 0; i < wn; i++) w[i] = frand(-0.5f, 0.5f);
    for (int i = 0; i < cc->cout; i++) b[i] = frand(-1, 1);

    layer l = mk(COACTO_OP_CONV, cc->n, cc->cout, oh, ow);
    set_input(&l, 0, &x);
    if (cc->residual) set_input(&l, 1, &r);
    int32_t ip[12] = {cc->kh, cc->kw, cc->sh, cc->sw, cc->pt, cc->pl,  cc->pb,
                      cc->pr, cc->dh, cc->dw, cc->group, cc->act};
    memcpy(l.iparams, ip, sizeof ip);
    l.fparams[0] = cc->alpha;
    l.fparams[1] = cc->beta;
    void *wb = blob_copy(w, wn * 4), *bb = blob_copy(b, (size_t)cc->cout * 4);
    set_array(&l, 0, wb, wn * 4);
    if (cc->bias) set_array(&l, 1, bb, (size_t)cc->cout * 4);

    expected e = e_new(&l);
    for (int ni = 0; ni < cc->n; ni++)
        for (int co = 0; co < cc->cout; co++)
            for (int y = 0; y < oh; y++)
                for (int xo = 0; xo < ow; xo++) {
                    int g = co / cout_g, j = co % cout_g;
                    double s = cc->bias ? b[co] : 0, mag = fabs(s);
                    for (int ky = 0; ky < cc->kh; ky++)
                        for (int kx = 0; kx < cc->kw; kx++) {
                            int iy = y * cc->sh - cc->pt + ky * cc->dh;
                            int ix = xo * cc->sw - cc->pl + kx * cc->dw;
                            if (iy < 0 || iy >= cc->hin || ix < 0 || ix >= cc->win) continue;
                            for (int ci = 0; ci < cin_g; ci++) {
                                double t = (double)t_at(&x, ni, g * cin_g + ci, iy, ix) *
                                           w[(((size_t)(g * cc->kh + ky) * cc->kw + kx) * cin_g + ci) *
                                                 cout_g + j];
                                s += t;
                                mag += fabs(t);
                            }
                        }
                    if (cc->residual) {
                        s += t_at(&r, ni, co, y, xo);
                        mag += 1;
                    }
                    size_t i = idx(cc->cout, oh, ow, ni, co, y, xo);
                    e.v[i] = act_ref(s, cc->act, cc->alpha, cc->beta);
                    e.mag[i] = mag;
                }
    const float *in[2] = {x.d, r.d};
    char name[128];
    snprintf(name, sizeof name, "%s [%s]", cc->name, kern->name);
    l.kern = kern;
    check_tiles(name, &l, in, &e, 2e-6, 1);
    e_free(&e);
    free(x.d), free(r.d), free(w), free(b), free(wb), free(bb);
}

static void conv_cases(void) {
    static const conv_case cases[] = {
        /* name n cin hin win cout kh kw sh sw pt pl pb pr dh dw group act res bias alpha beta */
        {"conv 3x3 s1 p1 relu", 1, 16, 9, 11, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0},
        {"conv 3x3 s2 asym pads", 2, 5, 10, 9, 19, 3, 3, 2, 2, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0, 0},
        {"conv 1x1 residual relu", 2, 24, 7, 6, 72, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0},
        {"conv 1x1 s2", 1, 20, 9, 9, 33, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0},
        {"conv 3x3 dilation 2", 1, 8, 12, 10, 21, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1, 0, 0, 1, 0, 0},
        {"conv 3x2 dilation (2,3) s(1,2)", 1, 6, 11, 13, 17, 3, 2, 1, 2, 1, 3, 0, 2, 2, 3, 1, 0, 1, 1, 0, 0},
        {"conv 7x7 s2 p3 (stem)", 1, 3, 23, 21, 64, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 0, 1, 0, 0},
        {"conv grouped 4", 2, 16, 8, 7, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 0, 0},
        {"conv grouped 3 odd", 1, 9, 7, 8, 15, 3, 3, 2, 1, 1, 0, 1, 1, 1, 1, 3, 0, 0, 1, 0, 0},
        {"conv grouped 1x1", 1, 32, 6, 6, 48, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 2, 1, 1, 1, 0, 0},
        {"conv grouped big groups", 1, 64, 5, 5, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 0, 1, 0, 0},
        {"conv channel multiplier", 1, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 8, 0, 0, 1, 0, 0},
        {"depthwise 3x3 relu6", 2, 37, 9, 10, 37, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 37, 2, 0, 1, 0, 6},
        {"depthwise 3x3 s2", 1, 48, 11, 11, 48, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 48, 1, 0, 1, 0, 0},
        /* 3x3 runs inside the input: four-output groups, leftovers, channel blocks and tails */
        {"depthwise 3x3 wide residual relu6", 1, 29, 6, 23, 29, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 29, 2, 1, 1, 0, 6},
        {"depthwise 3x3 s2 unpadded", 2, 16, 9, 14, 16, 3, 3, 2, 2, 0, 0, 0, 0, 1, 1, 16, 0, 0, 1, 0, 0},
        {"depthwise 3x3 s2 pad after", 1, 8, 12, 13, 8, 3, 3, 2, 2, 0, 0, 1, 1, 1, 1, 8, 1, 1, 0, 0, 0},
        {"depthwise 3x3 stride 1x2 hardswish", 1, 21, 7, 17, 21, 3, 3, 1, 2, 1, 1, 1, 1, 1, 1, 21, 6, 1, 1, 0, 0},
        {"depthwise 5x5 residual hardswish", 1, 20, 8, 9, 20, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 20, 6, 1, 1, 0, 0},
        {"depthwise dilation 2 no bias", 1, 33, 10, 10, 33, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 33, 0, 0, 0, 0, 0},
        {"fc whole input", 3, 7, 4, 5, 70, 4, 5, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0},
        {"fc gemm 1x1", 2, 100, 1, 1, 70, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0},
        {"fc large k", 1, 300, 2, 2, 50, 2, 2, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0},
        {"conv no bias", 1, 4, 6, 6, 9, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0},
        {"conv clip", 1, 12, 6, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, -0.5f, 0.7f},
        {"conv leaky", 1, 12, 6, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 0.1f, 0},
        {"conv sigmoid", 1, 12, 6, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 0, 0},
        {"conv hardsigmoid", 1, 12, 6, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5, 1, 1, 0.2f, 0.5f},
        {"conv hardswish", 1, 12, 6, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1, 0, 0},
        {"conv tanh", 1, 12, 6, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 7, 1, 1, 0, 0},
        {"pointwise leaky residual", 1, 40, 5, 5, 50, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 3, 1, 1, 0.2f, 0},
        {"depthwise sigmoid", 1, 17, 5, 5, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 17, 4, 0, 1, 0, 0},
        {"conv many columns", 1, 64, 30, 30, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        /* deep taps split across K blocks, dilation, uneven pads, residual, an activation applied
         * after; a wide strided row */
        {"conv deep dilated residual hardswish", 2, 300, 6, 20, 40, 3, 3, 1, 1, 2, 2, 1, 3, 2, 2, 1, 6, 1, 1, 0, 0},
        /* rows long enough for the in-place path on every kernel: a stem-like 7x7 stride 2 */
        {"conv 7x7 s2 stem residual hardswish", 2, 3, 70, 66, 16, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1, 6, 1, 1, 0, 0},
        {"conv s2 wide", 1, 24, 9, 61, 33, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 2, 0, 1, 0, 6},
        /* in place with window rows dilated (slots that skip rows), batches sharing the row
         * cache, asymmetric pads, rows longer than a block, a 5x5 window over 9 input rows;
         * then windows the row cache cannot hold (67 input rows; a padded row over 1 MiB):
         * im2col */
        {"conv rows dilated 2 wide batch 2", 2, 24, 13, 33, 40, 3, 3, 1, 1, 2, 1, 2, 0, 2, 1, 1, 1, 1, 1, 0, 0},
        {"conv rows longer than a block", 1, 8, 3, 300, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {"conv two-row maps batch 3", 3, 8, 2, 20, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0},
        {"conv rows dilated 3 s(2,1)", 1, 16, 20, 30, 20, 3, 3, 2, 1, 3, 1, 3, 1, 3, 1, 1, 0, 0, 1, 0, 0},
        {"conv 5x5 rows dilated 2 wide", 1, 8, 14, 30, 16, 5, 5, 1, 1, 4, 4, 4, 4, 2, 1, 1, 1, 1, 1, 0, 0},
        {"conv window taller than the row cache", 1, 8, 90, 30, 16, 3, 3, 1, 1, 33, 1, 33, 1, 33, 1, 1, 1, 1, 1, 0, 0},
        {"conv padded row over 1 MiB", 1, 2048, 3, 32, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {"conv deep k", 1, 160, 5, 6, 35, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0},
        /* im2col slices that start and end inside taps, with groups, dilation and borders */
        {"conv taps across slices", 1, 300, 7, 6, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {"conv grouped deep k dilated", 1, 200, 8, 8, 36, 3, 3, 2, 1, 2, 1, 0, 2, 2, 1, 2, 0, 0, 1, 0, 0},
        {"conv 1x1 s2 several blocks", 1, 24, 44, 40, 40, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0},
        {"pointwise many columns", 2, 16, 25, 25, 24, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0},
        {"conv 1x1 output", 1, 4, 3, 3, 5, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0},
        {"conv single channel", 1, 1, 6, 6, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0},
    };
    /* Every GEMM kernel this CPU has: each has its own panel width, so its own misaligned rows. */
    for (const gemm_kernel *const *k = gemm_available(); *k; k++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_conv(&cases[i], *k);

    /* 3x3, stride 1, one pixel of padding, maps of 28 x 28 positions or more (7 x 7 where the
     * L1 data cache is under 48 KiB: the Makefile runs this test again with COACTO_L1D_BYTES=32K
     * too): Winograd F(2x2, 3x3) (ops_winograd.c), then with COACTO_WINOGRAD=0 the direct path. Odd heights and widths
     * (tiles half outside the map), batches, input channels off the vector width, one-row-pair
     * and one-column maps, several blocks of tiles; the tilings cut Winograd tiles between layer
     * tiles and channels off panel boundaries. */
    static const conv_case winograd[] = {
        {"winograd odd map residual relu", 1, 24, 29, 31, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {"winograd batch 2 odd channels hardswish", 2, 19, 20, 40, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, 1, 0, 0},
        {"winograd clip no bias", 1, 16, 28, 30, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 0, 0, -0.5f, 0.7f},
        {"winograd two rows", 1, 16, 2, 400, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0},
        {"winograd one column", 1, 16, 801, 1, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0},
        {"winograd several blocks", 1, 64, 33, 32, 96, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0},
        {"winograd 7x7 residual relu", 1, 48, 7, 7, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {"winograd 14x14 batch 2", 2, 32, 14, 14, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0},
        {"winograd 7x9 no bias", 1, 17, 7, 9, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0},
    };
    for (int direct = 0; direct < 2; direct++) {
        if (direct) setenv("COACTO_WINOGRAD", "0", 1);
        for (const gemm_kernel *const *k = gemm_available(); *k; k++)
            for (size_t i = 0; i < sizeof winograd / sizeof winograd[0]; i++)
                test_conv(&winograd[i], *k);
    }
    unsetenv("COACTO_WINOGRAD");
}

/* ---- POOL / GLOBAL_POOL ---------------------------------------------------------------------- */

typedef struct pool_case {
    const char *name;
    int n, c, hin, win, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, kind, count_pad, ceil_mode;
} pool_case;

static int pool_extent(int in, int p0, int p1, int k, int d, int s, int ceil_mode) {
    int span = in + p0 + p1 - d * (k - 1) - 1;
    return (ceil_mode ? (span + s - 1) / s : span / s) + 1;
}

static void test_pool(const pool_case *pc) {
    int oh = pool_extent(pc->hin, pc->pt, pc->pb, pc->kh, pc->dh, pc->sh, pc->ceil_mode);
    int ow = pool_extent(pc->win, pc->pl, pc->pr, pc->kw, pc->dw, pc->sw, pc->ceil_mode);
    tensor x = t_rand(pc->n, pc->c, pc->hin, pc->win, -1, 1);
    layer l = mk(COACTO_OP_POOL, pc->n, pc->c, oh, ow);
    set_input(&l, 0, &x);
    int32_t ip[12] = {pc->kh, pc->kw, pc->sh, pc->sw, pc->pt,   pc->pl,
                      pc->pb, pc->pr, pc->dh, pc->dw, pc->kind, pc->count_pad};
    memcpy(l.iparams, ip, sizeof ip);
    expected e = e_new(&l);
    for (int ni = 0; ni < pc->n; ni++)
        for (int ci = 0; ci < pc->c; ci++)
            for (int y = 0; y < oh; y++)
                for (int xo = 0; xo < ow; xo++) {
                    double s = pc->kind == 0 ? -FLT_MAX : 0;
                    int count = 0;
                    for (int ky = 0; ky < pc->kh; ky++)
                        for (int kx = 0; kx < pc->kw; kx++) {
                            int iy = y * pc->sh - pc->pt + ky * pc->dh;
                            int ix = xo * pc->sw - pc->pl + kx * pc->dw;
                            int in_pad = iy >= -pc->pt && iy < pc->hin + pc->pb &&
                                         ix >= -pc->pl && ix < pc->win + pc->pr;
                            int in_x = iy >= 0 && iy < pc->hin && ix >= 0 && ix < pc->win;
                            count += pc->count_pad ? in_pad : in_x;
                            if (!in_x) continue;
                            double v = t_at(&x, ni, ci, iy, ix);
                            s = pc->kind == 0 ? fmax(s, v) : s + v;
                        }
                    size_t i = idx(pc->c, oh, ow, ni, ci, y, xo);
                    e.v[i] = pc->kind == 0 ? s : (count ? s / count : 0);
                    e.mag[i] = pc->kind == 0 ? 0 : 1;
                }
    const float *in[1] = {x.d};
    check_tiles(pc->name, &l, in, &e, 2e-6, 1);
    e_free(&e);
    free(x.d);
}

static void pool_cases(void) {
    static const pool_case cases[] = {
        /* name n c hin win kh kw sh sw pt pl pb pr dh dw kind count_pad ceil */
        {"maxpool 3x3 s2 p1", 2, 21, 11, 12, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0},
        {"maxpool 2x2 s2", 1, 40, 8, 8, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0, 0},
        {"maxpool 3x3 s2 ceil", 1, 17, 10, 10, 3, 3, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0, 1},
        {"maxpool dilation 2", 1, 9, 10, 11, 3, 2, 1, 2, 1, 0, 1, 1, 2, 2, 0, 0, 0},
        {"avgpool 3x3 s1 p1", 1, 35, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {"avgpool 3x3 s1 p1 count pad", 1, 35, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0},
        {"avgpool 3x3 s2 ceil count pad", 2, 19, 8, 9, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1},
        {"avgpool 2x3 s(2,1) asym ceil", 1, 6, 9, 7, 2, 3, 2, 1, 1, 0, 0, 2, 1, 1, 1, 0, 1},
        {"avgpool 5x5 s3 count pad", 1, 16, 13, 13, 5, 5, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0},
        {"avgpool 1x1", 1, 7, 4, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0},
        {"avgpool dilation 2 count pad", 1, 10, 9, 9, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_pool(&cases[i]);

    for (int kind = 0; kind < 2; kind++) {
        tensor x = t_rand(3, 45, 5, 7, -1, 1);
        layer l = mk(COACTO_OP_GLOBAL_POOL, 3, 45, 1, 1);
        set_input(&l, 0, &x);
        l.iparams[0] = kind;
        expected e = e_new(&l);
        for (int ni = 0; ni < 3; ni++)
            for (int ci = 0; ci < 45; ci++) {
                double s = kind == 0 ? -INFINITY : 0;
                for (int y = 0; y < 5; y++)
                    for (int xo = 0; xo < 7; xo++) {
                        double v = t_at(&x, ni, ci, y, xo);
                        s = kind == 0 ? fmax(s, v) : s + v / 35.0;
                    }
                e.v[ni * 45 + ci] = s;
                e.mag[ni * 45 + ci] = 1;
            }
        const float *in[1] = {x.d};
        check_tiles(kind ? "global avgpool" : "global maxpool", &l, in, &e, 2e-6, 1);
        e_free(&e);
        free(x.d);
    }
}

/* ---- BINARY / AFFINE ------------------------------------------------------------------------- */

static double bin_ref(int kind, double a, double b) {
    switch (kind) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    default: return a / b;
    }
}

/* Value of a broadcast operand at output (n, c, y, x). */
static double bcast(const tensor *t, int ni, int ci, int y, int x) {
    return t_at(t, t->n == 1 ? 0 : ni, t->c == 1 ? 0 : ci, t->h == 1 ? 0 : y, t->w == 1 ? 0 : x);
}

typedef struct binary_case {
    const char *name;
    int kind, act;
    int on, oc, oh, ow;
    int a[4], b[4]; /* NCHW dims of the operands */
    int constant, const_first;
} binary_case;

static void test_binary(const binary_case *bc) {
    /* Divisors stay away from 0. */
    tensor a = t_rand(bc->a[0], bc->a[1], bc->a[2], bc->a[3], -1, 1);
    tensor b = t_rand(bc->b[0], bc->b[1], bc->b[2], bc->b[3], 0.5f, 2);
    if (bc->constant && bc->const_first) {
        for (size_t i = 0; i < t_size(&a); i++) a.d[i] = frand(0.5f, 2);
        for (size_t i = 0; i < t_size(&b); i++) b.d[i] = frand(-1, 1);
    }
    layer l = mk(COACTO_OP_BINARY, bc->on, bc->oc, bc->oh, bc->ow);
    l.iparams[0] = bc->kind;
    l.iparams[1] = bc->act;
    l.fparams[0] = 0.1f;
    l.fparams[1] = 0.6f;
    set_input(&l, 0, &a);
    float *kblob = NULL;
    if (bc->constant) {
        /* b becomes the constant: NCHW order. */
        l.iparams[2] = bc->const_first;
        memcpy(&l.iparams[4], bc->b, sizeof bc->b);
        float *k = malloc(t_size(&b) * sizeof(float));
        for (int ni = 0; ni < b.n; ni++)
            for (int ci = 0; ci < b.c; ci++)
                for (int y = 0; y < b.h; y++)
                    for (int x = 0; x < b.w; x++)
                        k[((ni * b.c + ci) * b.h + y) * b.w + x] = t_at(&b, ni, ci, y, x);
        kblob = blob_copy(k, t_size(&b) * 4);
        free(k);
        set_array(&l, 0, kblob, t_size(&b) * 4);
    } else {
        set_input(&l, 1, &b);
    }
    expected e = e_new(&l);
    for (int ni = 0; ni < bc->on; ni++)
        for (int ci = 0; ci < bc->oc; ci++)
            for (int y = 0; y < bc->oh; y++)
                for (int x = 0; x < bc->ow; x++) {
                    double va = bcast(&a, ni, ci, y, x), vb = bcast(&b, ni, ci, y, x);
                    double v = bc->constant && bc->const_first ? bin_ref(bc->kind, vb, va)
                                                               : bin_ref(bc->kind, va, vb);
                    size_t i = idx(bc->oc, bc->oh, bc->ow, ni, ci, y, x);
                    e.v[i] = act_ref(v, bc->act, 0.1, 0.6);
                    e.mag[i] = 1;
                }
    const float *in[2] = {a.d, b.d};
    check_tiles(bc->name, &l, in, &e, 2e-6, 1);
    e_free(&e);
    free(a.d), free(b.d), free(kblob);
}

static void binary_cases(void) {
    static const binary_case cases[] = {
        {"add same shape relu", 0, 1, 2, 21, 4, 5, {2, 21, 4, 5}, {2, 21, 4, 5}, 0, 0},
        {"mul per channel (SE)", 2, 0, 2, 33, 3, 4, {2, 33, 3, 4}, {2, 33, 1, 1}, 0, 0},
        {"sub spatial broadcast a", 1, 0, 2, 9, 4, 3, {1, 1, 4, 3}, {2, 9, 4, 3}, 0, 0},
        {"div scalar b", 3, 7, 1, 18, 3, 3, {1, 18, 3, 3}, {1, 1, 1, 1}, 0, 0},
        {"add both broadcast", 0, 0, 2, 6, 5, 7, {2, 1, 5, 1}, {1, 6, 1, 7}, 0, 0},
        {"mul scalar a hardsigmoid", 2, 5, 1, 20, 2, 2, {1, 1, 1, 1}, {1, 20, 2, 2}, 0, 0},
        {"const per channel add", 0, 0, 2, 25, 3, 3, {2, 25, 3, 3}, {1, 25, 1, 1}, 1, 0},
        {"const full sub const_first", 1, 0, 1, 11, 4, 5, {1, 11, 4, 5}, {1, 11, 4, 5}, 1, 1},
        {"const batch-spatial div const_first", 3, 0, 2, 5, 3, 4, {2, 5, 3, 4}, {2, 1, 3, 4}, 1, 1},
        {"const scalar mul tanh", 2, 7, 1, 13, 2, 3, {1, 13, 2, 3}, {1, 1, 1, 1}, 1, 0},
        {"const row broadcast div", 3, 3, 1, 8, 3, 6, {1, 8, 3, 6}, {1, 8, 1, 6}, 1, 0},
        {"add broadcast input const", 0, 2, 2, 10, 3, 3, {1, 10, 1, 1}, {2, 10, 3, 3}, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_binary(&cases[i]);

    /* AFFINE with every activation, over 29 channels and over 3 (a span of many columns: an
     * image's normalisation; 5 x 7 positions so a tile's span is not a multiple of 48). */
    for (int act = 0; act < COACTO_ACT_COUNT; act++)
        for (int wide = 0; wide < 2; wide++) {
            const int ch = wide ? 29 : 3, hh = wide ? 3 : 5, ww = wide ? 4 : 7;
            tensor x = t_rand(2, ch, hh, ww, -3, 3);
            float sc[29], sh[29];
            for (int i = 0; i < ch; i++) sc[i] = frand(-2, 2), sh[i] = frand(-1, 1);
            if (act == COACTO_ACT_SQRT || act == COACTO_ACT_RECIPROCAL || act == COACTO_ACT_LOG)
                /* arguments in [0.5, 5.5] */
                for (int i = 0; i < ch; i++) sc[i] = frand(-0.5f, 0.5f), sh[i] = frand(2, 4);
            layer l = mk(COACTO_OP_AFFINE, 2, ch, hh, ww);
            set_input(&l, 0, &x);
            l.iparams[0] = act;
            float alpha = act == COACTO_ACT_CLIP ? -1.0f : 0.2f,
                  beta = act == COACTO_ACT_CLIP ? 2.0f : 0.5f;
            l.fparams[0] = alpha;
            l.fparams[1] = beta;
            void *sb = blob_copy(sc, sizeof(float) * ch), *tb = blob_copy(sh, sizeof(float) * ch);
            set_array(&l, 0, sb, sizeof(float) * ch);
            set_array(&l, 1, tb, sizeof(float) * ch);
            expected e = e_new(&l);
            for (size_t i = 0; i < t_size(&x); i++) {
                int ci = (int)(i % (size_t)ch);
                e.v[i] = act_ref((double)x.d[i] * sc[ci] + sh[ci], act, alpha, beta);
                e.mag[i] = 4;
            }
            char name[64];
            snprintf(name, sizeof name, "affine act %d, %d channels", act, ch);
            const float *in[1] = {x.d};
            check_tiles(name, &l, in, &e, 2e-6, 1);
            e_free(&e);
            free(x.d), free(sb), free(tb);
        }
}

/* ---- CONCAT / GATHER ------------------------------------------------------------------------- */

static void data_cases(void) {
    {
        int cs[3] = {5, 16, 3};
        tensor x[3];
        layer l = mk(COACTO_OP_CONCAT, 2, 24, 3, 5);
        for (int i = 0; i < 3; i++) {
            x[i] = t_rand(2, cs[i], 3, 5, -1, 1);
            set_input(&l, i, &x[i]);
        }
        expected e = e_new(&l);
        for (int ni = 0; ni < 2; ni++)
            for (int y = 0; y < 3; y++)
                for (int xo = 0; xo < 5; xo++)
                    for (int i = 0, first = 0; i < 3; first += cs[i], i++)
                        for (int ci = 0; ci < cs[i]; ci++)
                            e.v[idx(24, 3, 5, ni, first + ci, y, xo)] = t_at(&x[i], ni, ci, y, xo);
        const float *in[3] = {x[0].d, x[1].d, x[2].d};
        check_tiles("concat 3 inputs", &l, in, &e, 0, 1);
        e_free(&e);
        for (int i = 0; i < 3; i++) free(x[i].d);
    }
    for (int inputs = 1; inputs <= 3; inputs++) {
        tensor x[3];
        layer l = mk(COACTO_OP_GATHER, 2, 7, 4, 3);
        int64_t total = 0;
        for (int i = 0; i < inputs; i++) {
            x[i] = t_rand(1, 3 + i, 5, 2 + i, -1, 1);
            set_input(&l, i, &x[i]);
            total += (int64_t)t_size(&x[i]);
        }
        size_t count = 2 * 7 * 4 * 3;
        int32_t *index = malloc(count * sizeof(int32_t));
        for (size_t i = 0; i < count; i++)
            index[i] = rnd() % 5 == 0 ? -1 : (int32_t)(rnd() % (uint32_t)total);
        void *ib = blob_copy(index, count * 4);
        set_array(&l, 0, ib, count * 4);
        l.fparams[0] = -7.5f;
        expected e = e_new(&l);
        for (size_t i = 0; i < count; i++) {
            int64_t v = index[i];
            if (v < 0) {
                e.v[i] = -7.5;
                continue;
            }
            int k = 0;
            while (v >= (int64_t)t_size(&x[k])) v -= (int64_t)t_size(&x[k++]);
            e.v[i] = x[k].d[v];
        }
        char name[64];
        snprintf(name, sizeof name, "gather %d inputs with fill", inputs);
        const float *in[3] = {x[0].d, inputs > 1 ? x[1].d : NULL, inputs > 2 ? x[2].d : NULL};
        check_tiles(name, &l, in, &e, 0, 1);
        e_free(&e);
        for (int i = 0; i < inputs; i++) free(x[i].d);
        free(index), free(ib);
    }
}

/* ---- LRN / SOFTMAX / NOP --------------------------------------------------------------------- */

static void norm_cases(void) {
    static const int sizes[] = {5, 4, 1, 3, 40};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int size = sizes[s];
        tensor x = t_rand(2, 23, 3, 4, -2, 2);
        layer l = mk(COACTO_OP_LRN, 2, 23, 3, 4);
        set_input(&l, 0, &x);
        l.iparams[0] = size;
        l.fparams[0] = 0.7f, l.fparams[1] = 0.75f, l.fparams[2] = s == 3 ? 2.0f : 1.0f;
        expected e = e_new(&l);
        for (size_t i = 0; i < t_size(&x); i++) {
            int c = (int)(i % 23);
            size_t col = i / 23;
            double sum = 0;
            for (int j = c - (size - 1) / 2; j <= c + size / 2; j++)
                if (j >= 0 && j < 23) sum += (double)x.d[col * 23 + j] * x.d[col * 23 + j];
            e.v[i] = x.d[i] / pow(l.fparams[2] + 0.7 / size * sum, 0.75);
            e.mag[i] = 1;
        }
        char name[64];
        snprintf(name, sizeof name, "lrn size %d", size);
        const float *in[1] = {x.d};
        check_tiles(name, &l, in, &e, 1e-5, 1);
        e_free(&e);
        free(x.d);
    }
    for (int lg = 0; lg < 2; lg++) {
        tensor x = t_rand(3, 37, 2, 3, -8, 8);
        layer l = mk(COACTO_OP_SOFTMAX, 3, 37, 2, 3);
        set_input(&l, 0, &x);
        l.iparams[0] = lg;
        expected e = e_new(&l);
        for (size_t col = 0; col < 18; col++) {
            double max = -INFINITY, sum = 0;
            for (int j = 0; j < 37; j++) max = fmax(max, x.d[col * 37 + j]);
            for (int j = 0; j < 37; j++) sum += exp(x.d[col * 37 + j] - max);
            for (int j = 0; j < 37; j++) {
                double v = x.d[col * 37 + j] - max;
                e.v[col * 37 + j] = lg ? v - log(sum) : exp(v) / sum;
                e.mag[col * 37 + j] = lg ? 10 : 0;
            }
        }
        const float *in[1] = {x.d};
        check_tiles(lg ? "logsoftmax" : "softmax", &l, in, &e, 1e-5, 1);
        e_free(&e);
        free(x.d);
    }
    {
        /* NOP computes nothing: every tile leaves the sentinel. */
        layer l = mk(COACTO_OP_NOP, 1, 4, 2, 2);
        char err[128];
        int ok = op_prepare(&l, err, sizeof err) == COACTO_OK;
        float out[16];
        uint32_t s = SENTINEL, bits;
        for (int i = 0; i < 16; i++) memcpy(&out[i], &s, 4);
        op_execute(&l, NULL, out, 0, 4, 0, 4, NULL);
        for (int i = 0; i < 16; i++) {
            memcpy(&bits, &out[i], 4);
            ok &= bits == SENTINEL;
        }
        op_release(&l);
        if (ok) passed++;
        else {
            failed++;
            fprintf(stderr, "nop: failed\n");
        }
    }
}

/* ---- op_prepare rejections ------------------------------------------------------------------- */

static float zeros[4096] __attribute__((aligned(64)));
static int32_t izeros[4096] __attribute__((aligned(64)));

static void expect_reject(const char *name, layer l) {
    char err[256] = {0};
    coacto_status st = op_prepare(&l, err, sizeof err);
    op_release(&l);
    if (st == COACTO_ERR_INVALID_GRAPH && err[0]) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "reject %s: status %d, message '%s'\n", name, st, err);
    }
}

static void expect_accept(const char *name, layer l) {
    char err[256] = {0};
    coacto_status st = op_prepare(&l, err, sizeof err);
    op_release(&l);
    if (st == COACTO_OK) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "accept %s: status %d, message '%s'\n", name, st, err);
    }
}

static void rejections(void) {
    /* A valid 3x3 conv: 8 -> 12 channels, 6x6 -> 6x6, group 2. */
    tensor x = {1, 8, 6, 6, NULL}, r = {1, 12, 6, 6, NULL};
    layer conv = mk(COACTO_OP_CONV, 1, 12, 6, 6);
    set_input(&conv, 0, &x);
    int32_t ip[12] = {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
    memcpy(conv.iparams, ip, sizeof ip);
    set_array(&conv, 0, zeros, 2 * 9 * 4 * 6 * 4);
    set_array(&conv, 1, zeros, 12 * 4);
    expect_accept("conv baseline", conv);
    layer t;
#define MUTATE(name, stmt) \
    do {                   \
        t = conv;          \
        stmt;              \
        expect_reject(name, t); \
    } while (0)
    MUTATE("conv weights short", t.array_bytes[0] -= 4);
    MUTATE("conv weights long", t.array_bytes[0] += 4);
    MUTATE("conv weights null", t.arrays[0] = NULL);
    MUTATE("conv bias size", t.array_bytes[1] = 11 * 4);
    MUTATE("conv extra array", set_array(&t, 2, zeros, 64));
    MUTATE("conv group not dividing", t.iparams[10] = 3);
    MUTATE("conv group 0", t.iparams[10] = 0);
    MUTATE("conv kernel 0", t.iparams[0] = 0);
    MUTATE("conv stride 0", t.iparams[3] = 0);
    MUTATE("conv dilation 0", t.iparams[8] = 0);
    MUTATE("conv pad -1", t.iparams[5] = -1);
    MUTATE("conv act 99", t.iparams[11] = 99);
    MUTATE("conv act -1", t.iparams[11] = -1);
    MUTATE("conv output h", t.h = 5);
    MUTATE("conv output w", t.w = 7);
    MUTATE("conv batch", t.in_n[0] = 2);
    MUTATE("conv kernel larger than padded input", (t.iparams[0] = 9, t.iparams[4] = 0));
    MUTATE("conv residual dims", (set_input(&t, 1, &r), t.in_c[1] = 11));
    MUTATE("conv three inputs", (set_input(&t, 1, &r), set_input(&t, 2, &r)));
    MUTATE("conv no input", t.n_inputs = 0);
    MUTATE("conv huge dims", (t.in_h[0] = INT32_MAX, t.in_w[0] = INT32_MAX));
    MUTATE("conv negative dims", t.c = -12);
    MUTATE("conv huge stride overflow", (t.iparams[2] = INT32_MAX, t.iparams[6] = INT32_MAX));
    MUTATE("unknown op", t.op = 99);
    MUTATE("negative op", t.op = -1);
    t = conv;
    set_input(&t, 1, &r);
    expect_accept("conv residual", t);
#undef MUTATE

    layer pool = mk(COACTO_OP_POOL, 1, 8, 3, 3);
    set_input(&pool, 0, &x);
    int32_t pp[12] = {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0};
    memcpy(pool.iparams, pp, sizeof pp);
    expect_accept("pool baseline", pool);
    t = pool, t.h = 4, expect_accept("pool ceil extent", t);
    t = pool, t.h = 5, expect_reject("pool output h", t);
    t = pool, t.iparams[10] = 2, expect_reject("pool kind", t);
    t = pool, t.iparams[11] = 2, expect_reject("pool count_include_pad", t);
    t = pool, t.c = 9, expect_reject("pool channels", t);
    t = pool, t.iparams[9] = 0, expect_reject("pool dilation", t);
    t = pool, t.iparams[6] = -1, expect_reject("pool pad", t);
    t = pool, set_array(&t, 0, zeros, 64), expect_reject("pool array", t);
    t = pool, set_input(&t, 1, &x), expect_reject("pool two inputs", t);

    layer gp = mk(COACTO_OP_GLOBAL_POOL, 1, 8, 1, 1);
    set_input(&gp, 0, &x);
    expect_accept("global pool baseline", gp);
    t = gp, t.h = 2, expect_reject("global pool h", t);
    t = gp, t.iparams[0] = 5, expect_reject("global pool kind", t);
    t = gp, t.in_n[0] = 3, expect_reject("global pool batch", t);

    layer bin = mk(COACTO_OP_BINARY, 2, 8, 6, 6);
    tensor a = {2, 8, 6, 6, NULL}, b = {1, 8, 1, 1, NULL};
    set_input(&bin, 0, &a);
    set_input(&bin, 1, &b);
    expect_accept("binary baseline", bin);
    t = bin, t.in_c[1] = 3, expect_reject("binary non-broadcast channels", t);
    t = bin, t.in_h[0] = 12, expect_reject("binary input larger than output", t);
    t = bin, t.iparams[0] = 12, expect_reject("binary kind", t);
    t = bin, t.iparams[1] = COACTO_ACT_COUNT, expect_reject("binary act", t);
    t = bin, set_array(&t, 0, zeros, 32), expect_reject("binary constant with two inputs", t);
    layer bc = mk(COACTO_OP_BINARY, 2, 8, 6, 6);
    set_input(&bc, 0, &a);
    int32_t kd[4] = {1, 8, 1, 1};
    memcpy(&bc.iparams[4], kd, sizeof kd);
    set_array(&bc, 0, zeros, 8 * 4);
    expect_accept("binary constant baseline", bc);
    t = bc, t.array_bytes[0] = 7 * 4, expect_reject("binary constant bytes", t);
    t = bc, t.iparams[5] = 4, expect_reject("binary constant dims", t);
    t = bc, t.iparams[6] = 0, expect_reject("binary constant dim 0", t);
    t = bc, t.iparams[2] = 2, expect_reject("binary const_first", t);
    t = bc, set_array(&t, 0, NULL, 0), expect_reject("binary constant missing", t);

    layer af = mk(COACTO_OP_AFFINE, 2, 8, 6, 6);
    set_input(&af, 0, &a);
    set_array(&af, 0, zeros, 32);
    set_array(&af, 1, zeros, 32);
    expect_accept("affine baseline", af);
    t = af, t.array_bytes[1] = 28, expect_reject("affine shift bytes", t);
    t = af, set_array(&t, 1, NULL, 0), expect_reject("affine shift missing", t);
    t = af, t.in_w[0] = 5, expect_reject("affine dims", t);
    t = af, t.iparams[0] = COACTO_ACT_COUNT, expect_reject("affine act", t);

    layer cat = mk(COACTO_OP_CONCAT, 2, 16, 6, 6);
    set_input(&cat, 0, &a);
    set_input(&cat, 1, &a);
    expect_accept("concat baseline", cat);
    t = cat, t.c = 15, expect_reject("concat channel sum", t);
    t = cat, t.in_h[1] = 5, expect_reject("concat h", t);
    t = cat, t.in_n[0] = 1, expect_reject("concat batch", t);

    layer ga = mk(COACTO_OP_GATHER, 1, 4, 2, 2);
    tensor g1 = {1, 2, 2, 2, NULL};
    set_input(&ga, 0, &g1);
    set_input(&ga, 1, &g1);
    int32_t *gi = izeros;
    for (int i = 0; i < 16; i++) gi[i] = i - 1;
    set_array(&ga, 0, gi, 16 * 4);
    expect_accept("gather baseline", ga);
    t = ga, t.array_bytes[0] = 15 * 4, expect_reject("gather index bytes", t);
    gi[3] = 16;
    expect_reject("gather index past the inputs", ga);
    gi[3] = -2;
    expect_reject("gather index -2", ga);
    gi[3] = 2;
    t = ga, t.in_n[0] = 40000, t.in_c[0] = 40000, expect_reject("gather inputs beyond int32", t);

    layer lrn = mk(COACTO_OP_LRN, 2, 8, 6, 6);
    set_input(&lrn, 0, &a);
    lrn.iparams[0] = 5;
    lrn.fparams[0] = 1e-4f, lrn.fparams[1] = 0.75f, lrn.fparams[2] = 1.0f;
    expect_accept("lrn baseline", lrn);
    t = lrn, t.iparams[0] = 0, expect_reject("lrn size 0", t);
    t = lrn, t.fparams[0] = NAN, expect_reject("lrn alpha nan", t);
    t = lrn, t.in_c[0] = 7, expect_reject("lrn dims", t);

    layer sm = mk(COACTO_OP_SOFTMAX, 2, 8, 6, 6);
    set_input(&sm, 0, &a);
    expect_accept("softmax baseline", sm);
    t = sm, t.iparams[0] = 2, expect_reject("softmax log flag", t);
    t = sm, t.in_h[0] = 3, expect_reject("softmax dims", t);

    layer inp = mk(COACTO_OP_INPUT, 1, 3, 4, 4);
    expect_accept("input baseline", inp);
    t = inp, set_input(&t, 0, &x), expect_reject("input with inputs", t);
    t = inp, t.n = 0, expect_reject("input zero batch", t);
}

/* The closed form the direct loops use for a window's valid taps, against a scan. */
static void window_taps_cases(void) {
    int bad = 0;
    for (int64_t i0 = -12; i0 <= 12; i0++)
        for (int64_t k = 1; k <= 7; k++)
            for (int64_t d = 1; d <= 4; d++)
                for (int64_t n = 0; n <= 9; n++) {
                    int64_t t0, t1, count = 0, first = -1;
                    ops_window_taps(i0, k, d, n, &t0, &t1);
                    for (int64_t t = 0; t < k; t++)
                        if (i0 + t * d >= 0 && i0 + t * d < n) {
                            if (first < 0) first = t;
                            count++;
                        }
                    if (t1 - t0 != count || (count && t0 != first)) bad++;
                }
    if (bad) {
        failed++;
        fprintf(stderr, "window taps: %d mismatches\n", bad);
    } else {
        passed++;
    }
}

/* The softmax row kernels, portable and (where it runs) AVX-512, against a double reference at
 * every length around their vector widths, with rows of huge negative values (exact zeros), a
 * NaN (max and results NaN), and -inf entries. */
static void softmax_row_cases(void) {
    float x[80], e[80];
    for (int form = 0; form < 2; form++) {
#if defined(__x86_64__) || defined(_M_X64)
        if (form == 1 && !vec_avx512_usable()) continue;
#else
        if (form == 1) continue;
#endif
        for (int n = 1; n <= 70; n++)
            for (int kind = 0; kind < 4; kind++) {
                for (int i = 0; i < n; i++) x[i] = frand(-20, 20);
                if (kind == 1) x[n / 2] = -1000.0f;            /* e^(x - max) exactly 0 */
                if (kind == 2) x[n - 1] = NAN;                  /* NaN wins */
                if (kind == 3 && n > 1) x[0] = -INFINITY;       /* e^-inf = 0 */
                for (int i = n; i < 80; i++) e[i] = 7.0f;       /* nothing written past n */
                float max, sum;
#if defined(__x86_64__) || defined(_M_X64)
                sum = form ? vec_softmax_exp_avx512(x, e, (size_t)n, &max)
                           : ops_softmax_exp(x, e, (size_t)n, &max);
#else
                sum = ops_softmax_exp(x, e, (size_t)n, &max);
#endif
                int bad = 0;
                for (int i = n; i < 80; i++) bad += e[i] != 7.0f;
                if (kind == 2) {
                    bad += !isnan(max);
                } else {
                    double m = -INFINITY, s = 0;
                    for (int i = 0; i < n; i++) m = fmax(m, x[i]);
                    bad += max != (float)m;
                    for (int i = 0; i < n; i++) {
                        /* the argument as the kernels round it: e^x itself is then within
                         * a few units of 1e-7 */
                        const float arg = x[i] - (float)m;
                        const double want = exp((double)arg);
                        s += want;
                        bad += fabs(e[i] - want) > 2e-7 * want + (want < 1e-37 ? 0 : 1e-38);
                        if (kind == 1 && i == n / 2 && n > 1) bad += e[i] != 0.0f;
                    }
                    bad += fabs(sum - s) > 1e-6 * s;
                }
                if (bad) {
                    failed++;
                    fprintf(stderr, "FAIL softmax row: form %d, n %d, kind %d\n", form, n, kind);
                } else {
                    passed++;
                }
            }
    }
}

int main(int argc, char **argv) {
    if (argc > 1) rng = strtoull(argv[1], NULL, 0) | 1;
    printf("gemm kernel: %s\n", gemm_select()->name);
    window_taps_cases();
    conv_cases();
    pool_cases();
    binary_cases();
    data_cases();
    norm_cases();
    softmax_row_cases();
    rejections();
    printf("ops: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
