/* r4d_gemma.c: libr4d's rows of the ops Gemma 3 adds (rows_gemma.py): scale and gelu_tanh_mul.
 * Built into the same library as r4d.c (native.py compiles both); it shares r4d.c's thread pool
 * (r4d_parallel), r4d_threads() and its f64 exp (r4d_exp_f64). rmsnorm_heads runs r4d.c's rmsnorm
 * over rows of head_dim and sliding_attention r4d.c's attention with a window (rows_gemma.py).
 *
 * Arithmetic, against libref's (plugins/kernels/libref/dense.py):
 *   scale:          y = x * (float)scale, one rounding: libref's bits.
 *   gelu_tanh_mul:  y = (float)gelu(gate) * up, gelu in double. libref takes 0.5 x (1 + tanh(z)),
 *                   z = sqrt(2/pi) (x + 0.044715 x^3); here x / (1 + exp(-2z)), the same function
 *                   (1 + tanh(z) = 2 / (1 + exp(-2z))) without 1 + tanh's cancellation for z << 0,
 *                   computed with r4d.c's 8-lane exp. Both are within a few ulps of a double, so the
 *                   f32 results are libref's but for rare roundings one ulp apart, and where libref's
 *                   1 + tanh(z) has cancelled (gate below about -5, |y| under 1e-6 |gate|).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define G_OK 0
#define G_E_SHAPE (-3)
#define G_E_INVALID (-4)

int r4d_threads(void); /* r4d.c */
void r4d_parallel(void (*fn)(const void *, int64_t, int64_t), const void *ctx, int64_t items, int64_t unit,
                  int threads);
void r4d_exp_f64(double *y, int64_t n);

#include "r4d_view.h"

static int threads_for(int64_t work, int64_t grain) {
    const int64_t t = work / grain, most = r4d_threads();
    return (int)(t < 1 ? 1 : t < most ? t : most);
}

typedef struct {
    Mat a, b, y;
    int64_t n;
    float scale;
} GTask;

static void scale_task(const void *context, int64_t lo, int64_t hi) {
    const GTask *t = (const GTask *)context;
    const float s = t->scale;
    for (int64_t m = lo; m < hi; m++) {
        const float *xr = ROW(t->a, m, float);
        float *yr = ROW(t->y, m, float);
        for (int64_t i = 0; i < t->n; i++) yr[i] = xr[i] * s;
    }
}

/* y = x * scale (y may be x) */
int r4d_scale(const Arr *x, Arr *y, int64_t M, int64_t n, double scale) {
    GTask t;
    int rc;
    if ((rc = mat(x, n, 4, M, &t.a)) || (rc = mat(y, n, 4, M, &t.y))) return rc;
    t.n = n;
    t.scale = (float)scale;
    r4d_parallel(scale_task, &t, M, 1, threads_for(M * n, 1 << 16));
    return G_OK;
}

#define GELU_CHUNK 256 /* doubles of exp arguments on the stack at a time */

static void gelu_task(const void *context, int64_t lo, int64_t hi) {
    const GTask *t = (const GTask *)context;
    const double c = sqrt(2.0 / M_PI); /* numpy's np.sqrt(2.0 / np.pi): the same double */
    double e[GELU_CHUNK];
    for (int64_t m = lo; m < hi; m++) {
        const float *gr = ROW(t->a, m, float), *ur = ROW(t->b, m, float);
        float *yr = ROW(t->y, m, float);
        for (int64_t i0 = 0; i0 < t->n; i0 += GELU_CHUNK) {
            const int64_t k = t->n - i0 < GELU_CHUNK ? t->n - i0 : GELU_CHUNK;
            for (int64_t i = 0; i < k; i++) {
                const double x = gr[i0 + i];
                e[i] = -2.0 * (c * (x + 0.044715 * x * x * x)); /* libref's order: ((0.044715 x) x) x */
            }
            r4d_exp_f64(e, k);
            for (int64_t i = 0; i < k; i++) {
                const float g = (float)((double)gr[i0 + i] / (1.0 + e[i]));
                yr[i0 + i] = g * ur[i0 + i]; /* after g is read: y may be gate */
            }
        }
    }
}

/* y = gelu_tanh(gate) * up (y may be gate or up) */
int r4d_gelu_tanh_mul(const Arr *gate, const Arr *up, Arr *y, int64_t M, int64_t n) {
    GTask t;
    int rc;
    if ((rc = mat(gate, n, 4, M, &t.a)) || (rc = mat(up, n, 4, M, &t.b)) || (rc = mat(y, n, 4, M, &t.y))) return rc;
    t.n = n;
    t.scale = 0.0f;
    r4d_parallel(gelu_task, &t, M, 1, threads_for(M * n, 1 << 12));
    return G_OK;
}

/* packed entry points (rows_gemma.py): operands as array heads, doubles by their bits */
static double g_bits_f64(int64_t v) {
    double d;
    memcpy(&d, &v, 8);
    return d;
}

#define GA(i) ((Arr *)(intptr_t)a[i])

int r4d_scale_p(const int64_t *a) { return r4d_scale(GA(0), GA(1), a[2], a[3], g_bits_f64(a[4])); }
int r4d_gelu_tanh_mul_p(const int64_t *a) { return r4d_gelu_tanh_mul(GA(0), GA(1), GA(2), a[3], a[4]); }
