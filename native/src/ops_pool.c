/* Pooling tiles: windowed max / average (ONNX MaxPool, AveragePool) and global pooling. Both loop
 * over output positions and, inside, over contiguous channels, so the channel loops vectorize. */
#include <float.h>
#include <string.h>

#include "ops_internal.h"

enum { POOL_MAX = 0, POOL_AVG = 1 };

typedef struct pool_geometry {
    int64_t kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, kind, count_pad;
    int64_t hin, win;
} pool_geometry;

static pool_geometry geometry(const layer *l) {
    const int32_t *p = l->iparams;
    pool_geometry g = {
        .kh = p[0], .kw = p[1], .sh = p[2], .sw = p[3], .pt = p[4], .pl = p[5], .pb = p[6],
        .pr = p[7], .dh = p[8], .dw = p[9], .kind = p[10], .count_pad = p[11],
        .hin = l->in_h[0], .win = l->in_w[0],
    };
    return g;
}

/* The importer resolved ceil_mode: the output extent is the floor or the ceiling variant. */
static int pool_extent_ok(int64_t out, int64_t in, int64_t pad0, int64_t pad1, int64_t k,
                          int64_t d, int64_t s) {
    int64_t span = in + pad0 + pad1 - d * (k - 1) - 1;
    if (span < 0) return 0;
    return out == span / s + 1 || out == (span + s - 1) / s + 1;
}

coacto_status pool_prepare(layer *l, char *err, size_t err_size) {
    pool_geometry g = geometry(l);
    OPS_REQUIRE(g.kh >= 1 && g.kw >= 1, "kernel %lldx%lld must be positive", (long long)g.kh,
                (long long)g.kw);
    OPS_REQUIRE(g.sh >= 1 && g.sw >= 1 && g.dh >= 1 && g.dw >= 1,
                "strides (%lld, %lld) and dilations (%lld, %lld) must be >= 1", (long long)g.sh,
                (long long)g.sw, (long long)g.dh, (long long)g.dw);
    OPS_REQUIRE(g.pt >= 0 && g.pl >= 0 && g.pb >= 0 && g.pr >= 0, "pads must be >= 0");
    OPS_REQUIRE(g.kind == POOL_MAX || g.kind == POOL_AVG, "unknown pooling kind %lld",
                (long long)g.kind);
    OPS_REQUIRE(g.count_pad == 0 || g.count_pad == 1, "count_include_pad must be 0 or 1");
    OPS_REQUIRE(l->in_n[0] == l->n && l->in_c[0] == l->c,
                "input batch and channels %dx%d differ from the output's %dx%d", l->in_n[0],
                l->in_c[0], l->n, l->c);
    OPS_REQUIRE(pool_extent_ok(l->h, g.hin, g.pt, g.pb, g.kh, g.dh, g.sh) &&
                    pool_extent_ok(l->w, g.win, g.pl, g.pr, g.kw, g.dw, g.sw),
                "output %dx%d does not match input %lldx%lld under the kernel, strides, pads and "
                "dilations",
                l->h, l->w, (long long)g.hin, (long long)g.win);
    return COACTO_OK;
}

/* Window taps starting at i0 (step d, k taps) that fall in [lo, hi). */
static int64_t taps_inside(int64_t i0, int64_t k, int64_t d, int64_t lo, int64_t hi) {
    int64_t t0, t1;
    ops_window_taps(i0 - lo, k, d, hi - lo, &t0, &t1);
    return t1 - t0;
}

/* Each output position reduces its window straight into its own (L1-resident) output channels:
 * one simple loop over contiguous channels per tap, which vectorizes (max maps onto maxps).
 * kind is a constant after inlining. An empty window gives -FLT_MAX (max) or 0 (avg). */
static inline __attribute__((always_inline)) void
pool_tile(const layer *l, const pool_geometry *g, int64_t kind, const float *x, float *out,
          int64_t col0, int64_t col1, int64_t row0, int64_t row1) {
    int64_t c = l->c;
    size_t nc = (size_t)(row1 - row0);
    ops_position p = ops_position_of(col0, l->h, l->w);
    for (int64_t col = col0; col < col1; col++, ops_position_next(&p, l->h, l->w)) {
        const float *xb = x + p.n * g->hin * g->win * c + row0;
        float *restrict o = out + col * c + row0;
        int64_t iy0 = p.y * g->sh - g->pt, ix0 = p.x * g->sw - g->pl, ky0, ky1, kx0, kx1;
        ops_window_taps(iy0, g->kh, g->dh, g->hin, &ky0, &ky1);
        ops_window_taps(ix0, g->kw, g->dw, g->win, &kx0, &kx1);
        for (size_t i = 0; i < nc; i++) o[i] = kind == POOL_MAX ? -FLT_MAX : 0.0f;
        for (int64_t ky = ky0; ky < ky1; ky++) {
            const float *xrow = xb + (iy0 + ky * g->dh) * g->win * c;
            for (int64_t kx = kx0; kx < kx1; kx++) {
                const float *restrict xs = xrow + (ix0 + kx * g->dw) * c;
                if (kind == POOL_MAX)
                    for (size_t i = 0; i < nc; i++) o[i] = xs[i] > o[i] ? xs[i] : o[i];
                else
                    for (size_t i = 0; i < nc; i++) o[i] += xs[i];
            }
        }
        if (kind == POOL_AVG) {
            int64_t ylo = g->count_pad ? -g->pt : 0, yhi = g->hin + (g->count_pad ? g->pb : 0);
            int64_t xlo = g->count_pad ? -g->pl : 0, xhi = g->win + (g->count_pad ? g->pr : 0);
            int64_t count = taps_inside(iy0, g->kh, g->dh, ylo, yhi) *
                            taps_inside(ix0, g->kw, g->dw, xlo, xhi);
            float scale = count ? 1.0f / (float)count : 0.0f;
            for (size_t i = 0; i < nc; i++) o[i] *= scale;
        }
    }
}

OPS_CLONES void pool_execute(const layer *l, const float *const *in, float *out, int32_t col0,
                             int32_t col1, int32_t row0, int32_t row1) {
    pool_geometry g = geometry(l);
    if (g.kind == POOL_MAX)
        pool_tile(l, &g, POOL_MAX, in[0], out, col0, col1, row0, row1);
    else
        pool_tile(l, &g, POOL_AVG, in[0], out, col0, col1, row0, row1);
}

coacto_status global_pool_prepare(layer *l, char *err, size_t err_size) {
    int32_t kind = l->iparams[0];
    OPS_REQUIRE(kind == POOL_MAX || kind == POOL_AVG, "unknown pooling kind %d", kind);
    OPS_REQUIRE(l->h == 1 && l->w == 1, "global pooling output must be 1x1, is %dx%d", l->h,
                l->w);
    OPS_REQUIRE(l->in_n[0] == l->n && l->in_c[0] == l->c,
                "input batch and channels %dx%d differ from the output's %dx%d", l->in_n[0],
                l->in_c[0], l->n, l->c);
    return COACTO_OK;
}

/* Output column b reduces the h*w columns of batch b, accumulating in the tile's own output. */
OPS_CLONES void global_pool_execute(const layer *l, const float *const *in, float *out,
                                    int32_t col0, int32_t col1, int32_t row0, int32_t row1) {
    int64_t c = l->c, positions = (int64_t)l->in_h[0] * l->in_w[0];
    size_t nc = (size_t)(row1 - row0);
    for (int64_t b = col0; b < col1; b++) {
        const float *x = in[0] + b * positions * c + row0;
        float *restrict o = out + b * c + row0;
        memcpy(o, x, nc * sizeof(float));
        if (l->iparams[0] == POOL_MAX) {
            for (int64_t p = 1; p < positions; p++) {
                const float *xp = x + p * c;
                for (size_t i = 0; i < nc; i++) o[i] = xp[i] > o[i] ? xp[i] : o[i];
            }
        } else {
            for (int64_t p = 1; p < positions; p++) {
                const float *xp = x + p * c;
                for (size_t i = 0; i < nc; i++) o[i] += xp[i];
            }
            float scale = 1.0f / (float)positions;
            for (size_t i = 0; i < nc; i++) o[i] *= scale;
        }
    }
}
