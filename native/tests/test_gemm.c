/* GEMM kernels against a naive double-accumulated loop, for every kernel usable on this CPU.
 *
 * Two levels:
 *  - the micro-kernel alone: every row count 1..MR, channel counts around the vector widths,
 *    short reductions, with and without accumulate and epilogue;
 *  - gemm_run: m, n and k around MR, NR and the K block, prime sizes, strided A and C, channel
 *    sub-ranges (j0 > 0, j1 < n), bias / residual / clamp.
 * C always sits inside a larger buffer filled with a guard pattern that must survive: blocks write
 * exactly their own elements. A, bias and residual are allocated to their exact extent so an
 * address sanitizer catches reads beyond them.
 *
 * COACTO_TEST_QUICK=1 trims the sweep (emulators, sanitizers). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"

static long n_passed, n_failed;
static uint32_t rng_state = 0x12345678u;

static float rand_float(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static void fill_random(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = rand_float();
}

static float *alloc_floats(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "gemm: out of memory\n");
        exit(2);
    }
    return p;
}

/* 64-byte aligned, as gemm.h requires of packed B. */
static float *alloc_packed(size_t n)
{
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (!p) {
        fprintf(stderr, "gemm: out of memory\n");
        exit(2);
    }
    return p;
}

static const float GUARD = -12345.5f;

static int is_guard(float v) { return memcmp(&v, &GUARD, sizeof v) == 0; }

/* Clamp written exactly like the kernels' contract (NaN propagates). */
static double clamp_ref(double v, float lo, float hi)
{
    v = (double)lo > v ? (double)lo : v;
    v = (double)hi < v ? (double)hi : v;
    return v;
}

static void report_failure(const char *what, const char *kname, const char *params, size_t i,
                           size_t j, double got, double want, double tol)
{
    if (n_failed < 20)
        fprintf(stderr, "FAIL %s %s [%s] at (%zu, %zu): got %.9g want %.9g (tol %.3g)\n", what,
                kname, params, i, j, got, want, tol);
}

/* Compares the block [0:m, j0:j1] of c against ref (m x (j1-j0), tolerance per element) and
 * checks that every other element of the c buffer (rows_total x ldc, block at row0) still holds
 * the guard. Returns 1 when all is well. */
static int check_block(const char *what, const char *kname, const char *params,
                       const float *cbuf, size_t rows_total, size_t row0, size_t ldc, size_t m,
                       size_t j0, size_t j1, const double *ref, const double *tol)
{
    int ok = 1;
    for (size_t r = 0; r < rows_total; r++) {
        for (size_t j = 0; j < ldc; j++) {
            const float v = cbuf[r * ldc + j];
            const int inside = r >= row0 && r < row0 + m && j >= j0 && j < j1;
            if (!inside) {
                if (!is_guard(v)) {
                    if (ok) report_failure(what, kname, params, r, j, v, GUARD, 0.0);
                    ok = 0;
                }
                continue;
            }
            const size_t i = r - row0, jj = j - j0, w = j1 - j0;
            const double want = ref[i * w + jj], t = tol[i * w + jj];
            if (!(fabs((double)v - want) <= t)) {
                if (ok) report_failure(what, kname, params, i, j, v, want, t);
                ok = 0;
            }
        }
    }
    return ok;
}

static void count(int ok)
{
    if (ok)
        n_passed++;
    else
        n_failed++;
}

/* Relative error budget of a k-term float sum: one rounding per FMA plus the epilogue's adds. */
static double tolerance(size_t k, double magnitude)
{
    return ((double)k + 4.0) * 1.2e-7 * magnitude + 1e-30;
}

/* ---- micro-kernel level --------------------------------------------------------------------- */

static void test_ukernel(const gemm_kernel *kern)
{
    const size_t MR = kern->mr, NR = kern->nr;
    const size_t kcs[] = {0, 1, 2, 3, 7, 17};
    size_t nrs[] = {1, 2, NR / 2 - 1, NR / 2, NR / 2 + 1, NR - 1, NR};
    const size_t n_nrs = sizeof nrs / sizeof nrs[0];
    for (size_t kci = 0; kci < sizeof kcs / sizeof kcs[0]; kci++) {
        const size_t kc = kcs[kci];
        const size_t lda = kc + 3;
        float *a = alloc_floats(MR * lda);
        float *b = alloc_floats((kc ? kc : 1) * NR);
        float *panel = alloc_packed(gemm_packed_size(kern, kc ? kc : 1, NR));
        fill_random(a, MR * lda);
        fill_random(b, (kc ? kc : 1) * NR);
        gemm_pack_b(kern, kc, NR, b, NR, panel);
        for (size_t mr = 1; mr <= MR; mr++) {
            for (size_t nri = 0; nri < n_nrs; nri++) {
                const size_t nr = nrs[nri];
                if (nr == 0 || nr > NR) continue;
                for (int mode = 0; mode < 4; mode++) {
                    /* mode 0 overwrite; 1 accumulate; 2 overwrite + epilogue; 3 both */
                    const int accumulate = mode & 1, with_ep = mode >> 1;
                    const size_t ldc = nr + 5, rows_total = mr + 2, row0 = 1;
                    float *cbuf = alloc_floats(rows_total * ldc);
                    for (size_t x = 0; x < rows_total * ldc; x++) cbuf[x] = GUARD;
                    float *c = cbuf + row0 * ldc + 2; /* block at column 2 */
                    double *ref = malloc(mr * nr * sizeof(double));
                    double *tol = malloc(mr * nr * sizeof(double));
                    float *bias = alloc_floats(nr);
                    const size_t ldr = nr + 1;
                    float *res = alloc_floats((mr - 1) * ldr + nr);
                    fill_random(bias, nr);
                    fill_random(res, (mr - 1) * ldr + nr);
                    for (size_t i = 0; i < mr; i++)
                        for (size_t j = 0; j < nr; j++)
                            if (accumulate) c[i * ldc + j] = rand_float();
                    gemm_epilogue ep = {bias, res, ldr, -0.5f, 0.75f};
                    for (size_t i = 0; i < mr; i++) {
                        for (size_t j = 0; j < nr; j++) {
                            double s = 0.0, mag = 0.0;
                            for (size_t p = 0; p < kc; p++) {
                                s += (double)a[i * lda + p] * b[p * NR + j];
                                mag += fabs((double)a[i * lda + p] * b[p * NR + j]);
                            }
                            if (accumulate) {
                                s += c[i * ldc + j];
                                mag += fabs(c[i * ldc + j]);
                            }
                            if (with_ep) {
                                s += bias[j] + res[i * ldr + j];
                                mag += fabs(bias[j]) + fabs(res[i * ldr + j]);
                                s = clamp_ref(s, ep.lo, ep.hi);
                            }
                            ref[i * nr + j] = s;
                            tol[i * nr + j] = tolerance(kc, mag);
                        }
                    }
                    /* The prefetch hint (here the panel itself) must not change results. */
                    kern->ukernel(mr, nr, kc, a, lda, panel, c, ldc, accumulate,
                                  with_ep ? &ep : NULL, accumulate ? panel : NULL, (int)(kc % 2));
                    char params[96];
                    snprintf(params, sizeof params, "ukernel mr=%zu nr=%zu kc=%zu acc=%d ep=%d", mr,
                             nr, kc, accumulate, with_ep);
                    count(check_block("ukernel", kern->name, params, cbuf, rows_total, row0, ldc,
                                      mr, 2, 2 + nr, ref, tol));
                    free(cbuf);
                    free(ref);
                    free(tol);
                    free(bias);
                    free(res);
                }
            }
        }
        free(a);
        free(b);
        free(panel);
    }
}

/* ---- packing -------------------------------------------------------------------------------- */

static void test_pack(const gemm_kernel *kern)
{
    const size_t k = 5, n = kern->nr * 2 + 3, ldb = n + 2;
    float *b = alloc_floats(k * ldb);
    fill_random(b, k * ldb);
    const size_t size = gemm_packed_size(kern, k, n);
    float *packed = alloc_packed(size);
    gemm_pack_b(kern, k, n, b, ldb, packed);
    const size_t nr = kern->nr, panels = (n + nr - 1) / nr;
    int ok = size == panels * nr * k;
    for (size_t p = 0; ok && p < panels; p++)
        for (size_t kk = 0; kk < k; kk++)
            for (size_t jj = 0; jj < nr; jj++) {
                const size_t j = p * nr + jj;
                const float want = j < n ? b[kk * ldb + j] : 0.0f;
                if (packed[p * k * nr + kk * nr + jj] != want) ok = 0;
            }
    if (!ok) fprintf(stderr, "FAIL pack %s: layout differs from gemm.h\n", kern->name);
    count(ok);
    free(b);
    free(packed);
}

/* ---- gemm_run level ------------------------------------------------------------------------- */

typedef struct run_case {
    size_t m, n, k; /* n: channels computed (j1 - j0) */
    int variant;
} run_case;

/* Variants cycle over the cases so each shape meets one of them (and every variant meets many
 * shapes): 0 plain, tight strides, ep NULL; 1 bias + ReLU, strided A and C, j0 > 0;
 * 2 bias + residual + clamp, strided, j1 < n_total; 3 identity epilogue, j0 > 0, j1 < n_total;
 * 4 (outside the cycle) as 2, with rows of A a multiple of 4 KiB apart, so that a row block's
 * rows share an L1 set and the driver reads them from its copy (gemm.c a_rows_conflict). */
static void run_one(const gemm_kernel *const *kernels, size_t j_align, const run_case *tc)
{
    const size_t m = tc->m, n = tc->n, k = tc->k;
    const int v = tc->variant;
    const size_t j0 = (v == 1 || v == 3) ? j_align : 0;
    const size_t j1 = j0 + n;
    const size_t n_total = j1 + ((v == 2 || v == 3 || v == 4) ? 7 : 0);
    const size_t lda = v == 0 ? k : v == 4 ? (k / 1024 + 1) * 1024 : k + 3;
    const size_t ldc = v == 0 ? n_total : n_total + 5;
    const size_t ldr = n_total + 2;
    const size_t rows_total = m + 2, row0 = 1;

    float *a = alloc_floats(m ? (m - 1) * lda + k : 1);
    float *b = alloc_floats(k * n_total + 1);
    float *bias = alloc_floats(n_total);
    float *res = alloc_floats((m - 1) * ldr + n_total);
    fill_random(a, m ? (m - 1) * lda + k : 1);
    fill_random(b, k * n_total + 1);
    fill_random(bias, n_total);
    fill_random(res, (m - 1) * ldr + n_total);
    gemm_epilogue ep_store = {NULL, NULL, 0, -INFINITY, INFINITY};
    const gemm_epilogue *ep = NULL;
    if (v == 1) {
        ep_store.bias = bias;
        ep_store.lo = 0.0f;
        ep = &ep_store;
    } else if (v == 2 || v == 4) {
        ep_store.bias = bias;
        ep_store.residual = res;
        ep_store.ld_residual = ldr;
        ep_store.lo = -1.5f;
        ep_store.hi = 2.0f;
        ep = &ep_store;
    } else if (v == 3) {
        ep = &ep_store;
    }

    double *ref = malloc((m && n ? m * n : 1) * sizeof(double));
    double *tol = malloc((m && n ? m * n : 1) * sizeof(double));
    for (size_t i = 0; i < m; i++) {
        for (size_t jj = 0; jj < n; jj++) {
            const size_t j = j0 + jj;
            double s = 0.0, mag = 0.0;
            for (size_t p = 0; p < k; p++) {
                const double t = (double)a[i * lda + p] * b[p * n_total + j];
                s += t;
                mag += fabs(t);
            }
            if (ep) {
                if (ep->bias) {
                    s += ep->bias[j];
                    mag += fabs(ep->bias[j]);
                }
                if (ep->residual) {
                    s += ep->residual[i * ldr + j];
                    mag += fabs(ep->residual[i * ldr + j]);
                }
                s = clamp_ref(s, ep->lo, ep->hi);
            }
            ref[i * n + jj] = s;
            tol[i * n + jj] = tolerance(k, mag);
        }
    }

    float *cbuf = alloc_floats(rows_total * ldc);
    for (const gemm_kernel *const *kp = kernels; *kp; kp++) {
        const gemm_kernel *kern = *kp;
        float *packed = alloc_packed(gemm_packed_size(kern, k, n_total));
        gemm_pack_b(kern, k, n_total, b, n_total, packed);
        for (size_t x = 0; x < rows_total * ldc; x++) cbuf[x] = GUARD;
        gemm_run(kern, m, j0, j1, k, a, lda, packed, cbuf + row0 * ldc, ldc, ep);
        char params[128];
        snprintf(params, sizeof params, "run m=%zu j0=%zu j1=%zu n_total=%zu k=%zu variant=%d", m,
                 j0, j1, n_total, k, v);
        count(check_block("run", kern->name, params, cbuf, rows_total, row0, ldc, m, j0, j1, ref,
                          tol));
        /* The same product by gemm_run_k over consecutive reduction ranges (as im2col slices
         * feed it): the first overwrites, the rest accumulate, the last applies the epilogue. */
        if (k > 0) {
            for (size_t x = 0; x < rows_total * ldc; x++) cbuf[x] = GUARD;
            const size_t step = 1 + (k * 7 + 3) / 11; /* ranges not aligned to the K block */
            for (size_t k0 = 0; k0 < k; k0 += step) {
                const size_t k1 = k - k0 < step ? k : k0 + step;
                gemm_run_k(kern, m, j0, j1, k, k0, k1, a + k0, lda, packed, cbuf + row0 * ldc,
                           ldc, ep);
            }
            snprintf(params, sizeof params, "run_k m=%zu j0=%zu j1=%zu n_total=%zu k=%zu step=%zu "
                     "variant=%d", m, j0, j1, n_total, k, step, v);
            count(check_block("run_k", kern->name, params, cbuf, rows_total, row0, ldc, m, j0, j1,
                              ref, tol));
            /* And by gemm_run_k_rows, the rows cut into runs of 1, 2, 3, ... rows (each with its
             * own A, C and residual pointers), over the same reduction ranges. */
            gemm_rows runs[64];
            size_t n_runs = 0;
            for (size_t i0 = 0, len = 1; i0 < m && n_runs < 64; i0 += len, len++, n_runs++) {
                runs[n_runs].c = cbuf + (row0 + i0) * ldc;
                runs[n_runs].residual = ep && ep->residual ? ep->residual + i0 * ldr : NULL;
                runs[n_runs].m = m - i0 < len ? m - i0 : len;
            }
            for (size_t x = 0; x < rows_total * ldc; x++) cbuf[x] = GUARD;
            for (size_t k0 = 0; k0 < k; k0 += step) {
                const size_t k1 = k - k0 < step ? k : k0 + step;
                for (size_t r = 0, i0 = 0; r < n_runs; i0 += runs[r].m, r++)
                    runs[r].a = a + i0 * lda + k0;
                gemm_run_k_rows(kern, runs, n_runs, j0, j1, k, k0, k1, lda, packed, ldc, ep);
            }
            snprintf(params, sizeof params, "run_k_rows m=%zu j0=%zu j1=%zu n_total=%zu k=%zu "
                     "step=%zu runs=%zu variant=%d", m, j0, j1, n_total, k, step, n_runs, v);
            count(check_block("run_k_rows", kern->name, params, cbuf, rows_total, row0, ldc, m,
                              j0, j1, ref, tol));
        }
        free(packed);
    }
    free(cbuf);
    free(a);
    free(b);
    free(bias);
    free(res);
    free(ref);
    free(tol);
}

static void test_run(const gemm_kernel *const *kernels, int quick)
{
    size_t max_mr = 0, max_nr = 0, max_kc = 0, j_align = 1;
    for (const gemm_kernel *const *kp = kernels; *kp; kp++) {
        const gemm_kernel *kern = *kp;
        if (kern->mr > max_mr) max_mr = kern->mr;
        if (kern->nr > max_nr) max_nr = kern->nr;
        if (gemm_block_k(kern) > max_kc) max_kc = gemm_block_k(kern);
        size_t x = j_align, y = kern->nr; /* j0 must be a multiple of every kernel's nr */
        while (y) {
            const size_t t = x % y;
            x = y;
            y = t;
        }
        j_align = j_align / x * kern->nr;
    }

    /* Shape lists: sizes around every kernel's MR / NR / K block, then primes and layer sizes. */
    size_t ms[64], ns[64], ks[64];
    size_t n_ms = 0, n_ns = 0, n_ks = 0;
    for (size_t m = 1; m <= 2 * max_mr + 1; m++) ms[n_ms++] = m;
    ms[n_ms++] = 49;
    ms[n_ms++] = 196;
    for (const gemm_kernel *const *kp = kernels; *kp; kp++) {
        const size_t nr = (*kp)->nr, kc = gemm_block_k(*kp);
        const size_t nn[] = {nr - 1, nr, nr + 1, 2 * nr + 3};
        for (size_t x = 0; x < 4; x++) ns[n_ns++] = nn[x];
        const size_t kk[] = {kc - 1, kc, kc + 1};
        for (size_t x = 0; x < 3; x++) ks[n_ks++] = kk[x];
    }
    const size_t more_n[] = {1, 100, 256}, more_k[] = {1, 2, 3, 7, 577, 1000};
    for (size_t x = 0; x < 3; x++) ns[n_ns++] = more_n[x];
    for (size_t x = 0; x < 6; x++) ks[n_ks++] = more_k[x];

    /* Small products run over the whole cross product; large ones are sampled (every fifth, or
     * every 25th when quick) so that every m, n and k still meets large partners. */
    const double full_limit = quick ? 6e4 : 3e5;
    const size_t sample = quick ? 25 : 5;
    size_t index = 0, variant = 0;
    for (size_t mi = 0; mi < n_ms; mi++)
        for (size_t ni = 0; ni < n_ns; ni++) {
            int dup_n = 0;
            for (size_t x = 0; x < ni; x++) dup_n |= ns[x] == ns[ni];
            if (dup_n) continue;
            for (size_t ki = 0; ki < n_ks; ki++) {
                int dup_k = 0;
                for (size_t x = 0; x < ki; x++) dup_k |= ks[x] == ks[ki];
                if (dup_k) continue;
                const double work = (double)ms[mi] * (double)ns[ni] * (double)ks[ki];
                if (work > full_limit && index++ % sample != 0) continue;
                const run_case tc = {ms[mi], ns[ni], ks[ki], (int)(variant++ % 4)};
                run_one(kernels, j_align, &tc);
            }
        }
    /* Rows of A 4 KiB apart (variant 4): block heights around every kernel's MR, reductions
     * of one K block and several, in gemm_run, gemm_run_k and gemm_run_k_rows alike. */
    const size_t conflict_m[] = {1, 3, max_mr, max_mr + 1, 2 * max_mr + 1, 49, 196};
    const size_t conflict_k[] = {7, max_kc + 1, 1000, 1024, 2048};
    for (size_t mi = 0; mi < sizeof conflict_m / sizeof *conflict_m; mi++)
        for (size_t ki = 0; ki < sizeof conflict_k / sizeof *conflict_k; ki++) {
            if (quick && conflict_m[mi] * conflict_k[ki] > 100000 && (mi + ki) % 3) continue;
            const run_case tc = {conflict_m[mi], 2 * max_nr + 3, conflict_k[ki], 4};
            run_one(kernels, j_align, &tc);
        }
    /* k == 0: the epilogue alone. */
    for (int v = 0; v < 4; v++) {
        const run_case tc = {max_mr + 1, max_nr + 1, 0, v};
        run_one(kernels, j_align, &tc);
    }
    (void)max_kc;
}

static void test_select(const gemm_kernel *const *kernels)
{
    const gemm_kernel *sel = gemm_select();
    const char *force = getenv("COACTO_FORCE_SCALAR");
    const int forced = force && force[0] && strcmp(force, "0") != 0;
    const gemm_kernel *last = kernels[0];
    for (const gemm_kernel *const *kp = kernels; *kp; kp++) last = *kp;
    const gemm_kernel *want = forced ? last : kernels[0];
    const int ok = sel == want && gemm_select() == sel && strstr(last->name, "__scalar") != NULL;
    if (!ok) fprintf(stderr, "FAIL select: got %s, want %s\n", sel->name, want->name);
    count(ok);
    printf("gemm: selected %s%s\n", sel->name, forced ? " (COACTO_FORCE_SCALAR)" : "");
}

int main(void)
{
    const char *q = getenv("COACTO_TEST_QUICK");
    const int quick = q && q[0] && strcmp(q, "0") != 0;
    const gemm_kernel *const *kernels = gemm_available();
    test_select(kernels);
    for (const gemm_kernel *const *kp = kernels; *kp; kp++) {
        const gemm_kernel *kern = *kp;
        printf("gemm: checking %s (mr %zu, nr %zu, k block %zu)\n", kern->name, kern->mr,
               kern->nr, gemm_block_k(kern));
        test_pack(kern);
        test_ukernel(kern);
    }
    test_run(kernels, quick);
    printf("gemm: %ld passed, %ld failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
