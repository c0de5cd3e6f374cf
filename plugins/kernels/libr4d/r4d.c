/* libr4d host kernels.
 *
 * Compiled at first load by native.py (gcc -O3 -march=native -pthread -ffp-contract=off, or a
 * portable -O2 build when that fails), cached on disk by a hash of the sources and the flags, and
 * called through ctypes. Parallel rows run on r4d_pool.h's thread pool. Imports nothing: the Python side hands over array heads shaped like numpy's
 * PyArrayObject head (native.Header: data, nd, dims, strides, filled from the numpy array once per
 * launch plan) and the raw plane pointers of each weight.
 *
 * -ffp-contract=off: every fused multiply-add is written out (_mm256_fmadd_ps); a plain a*b+c
 * rounds twice, as the reference contract does, so the elementwise rows and the value
 * accumulation of attention reproduce libref's arithmetic operation for operation.
 *
 * Weights are read as the container stores them (docs/ENCODINGS.md):
 *   q4_1: codes u4 [N, K/2] (element 2j in the low nibble of byte j), scale f16 [N, K/32],
 *         min f16 [N, K/32], w = code*scale - min
 *   q8_0: codes i8 [N, K], scale f16 [N, K/32], w = code*scale
 *   f32 / f16 / bf16: codes [N, K]
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "r4d_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define R4D_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define R4D_VNNI 1
#elif defined(__AVXVNNI__)
#define R4D_VNNI 1
#endif
/* the decode GEMVs' 512-bit paths: AVX-512 F, BW and VL, with VNNI's vpdpwssd where present */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define R4D_AVX512 1
/* the prefill GEMMs' AMX int8 tiles (r4d_gemm_amx.h: q8_0, and r4d_kquants.c's formats through
 * r4d_amx_gemm), used where the kernel grants the tile state */
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define R4D_AMX 1
#endif
#endif
#endif

#ifdef R4D_AVX512
/* the high 8 floats of a zmm by AVX-512 F's 64-bit-lane extract: extractf32x8 is DQ's, which an
 * AVX-512 CPU need not have (a build for avx512f/bw/vl/vnni alone) */
static inline __m256 high8_ps(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }
#endif

#define R4D_OK 0
#define R4D_E_SHAPE (-3)
#define R4D_E_INVALID (-4)
#define R4D_E_NOMEM (-5)

/* weight formats */
#define F_F32 0
#define F_F16 1
#define F_BF16 2
#define F_Q8_0 3
#define F_Q4_1 4

#define QK 32 /* elements per block of q8_0 / q4_1 */

#include "r4d_view.h" /* Arr, Mat, mat(), ROW() */

static int g_threads = 1;

int r4d_set_threads(int n) {
    g_threads = n < 1 ? 1 : n;
    return g_threads;
}

int r4d_threads(void) { return g_threads; }

/* rad-avx-check (libr4d's avx_par_force): every parallel region on n threads whatever its size, so
 * the chunked paths run where the checker's small cases would run one thread; 0 sizes them again */
int r4d_par_force(int n) {
    g_pool_force = n < 0 ? 0 : n;
    return g_pool_force;
}

/* the pool for the kernels built beside this file (r4d_kquants.c) */
void r4d_parallel(void (*fn)(const void *, int64_t, int64_t), const void *ctx, int64_t items, int64_t unit,
                  int threads) {
    pool_run(fn, ctx, items, unit, threads);
}

static int r4d_amx_usable(void);

/* bit 0: AVX2+FMA+F16C paths, bit 1: VNNI integer dot products, bit 2: AVX-512 paths, bit 3: AMX
 * int8 tiles (built, and granted to this process) */
int r4d_isa(void) {
    int isa = 0;
#ifdef R4D_AVX2
    isa |= 1;
#endif
#ifdef R4D_VNNI
    isa |= 2;
#endif
#ifdef R4D_AVX512
    isa |= 4;
#endif
    if (r4d_amx_usable()) isa |= 8;
    return isa;
}

/* ------------------------------------------------------------------------------------------ */
/* operands */


/* an integer vector of int32 or int64 elements (the element size is its stride) */
typedef struct {
    const char *p;
    int64_t n;
    int64_t stride;
} IVec;

static int ivec(const Arr *a, int64_t need, IVec *v) {
    if (!a || !a->data) return R4D_E_INVALID;
    if (a->nd < 1) return R4D_E_SHAPE;
    int64_t n = 1;
    for (int i = 0; i < a->nd; i++) n *= a->dims[i];
    int64_t s = a->strides[a->nd - 1];
    if (s != 4 && s != 8) return R4D_E_SHAPE;
    if (a->nd > 1 && a->dims[0] > 1 && a->strides[0] != s * n / a->dims[0]) return R4D_E_SHAPE;
    if (n < need) return R4D_E_SHAPE;
    v->p = a->data;
    v->n = n;
    v->stride = s;
    return R4D_OK;
}

static inline int64_t iget(const IVec *v, int64_t i) {
    const char *q = v->p + i * v->stride;
    return v->stride == 8 ? *(const int64_t *)q : (int64_t) * (const int32_t *)q;
}

/* a 2-D integer table (block_tables) */
typedef struct {
    const char *p;
    int64_t rows, cols, pitch, esz;
} ITab;

static int itab(const Arr *a, ITab *t) {
    if (!a || !a->data) return R4D_E_INVALID;
    if (a->nd == 2) {
        t->rows = a->dims[0];
        t->cols = a->dims[1];
        t->esz = a->strides[1];
        t->pitch = a->strides[0];
    } else if (a->nd == 1) {
        t->rows = 1;
        t->cols = a->dims[0];
        t->esz = a->strides[0];
        t->pitch = t->cols * t->esz;
    } else {
        return R4D_E_SHAPE;
    }
    if (t->esz != 4 && t->esz != 8) return R4D_E_SHAPE;
    t->p = a->data;
    return R4D_OK;
}

static inline int64_t tget(const ITab *t, int64_t r, int64_t c) {
    const char *q = t->p + r * t->pitch + c * t->esz;
    return t->esz == 8 ? *(const int64_t *)q : (int64_t) * (const int32_t *)q;
}

/* ------------------------------------------------------------------------------------------ */
/* scalars */

static inline float h2f(uint16_t h) {
#ifdef R4D_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* f32 -> f16 rounded to nearest even (numpy's astype(float16), vcvtps2ph's nearest): overflow to
 * infinity, subnormal halves kept, a NaN stays a NaN */
static inline uint16_t f2h(float x) {
#ifdef R4D_AVX2
    return (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t bits;
    memcpy(&bits, &x, 4);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t e = (bits >> 23) & 0xff, m = bits & 0x7fffffu;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0));
    if (e < 102) return sign; /* below half the smallest subnormal (2^-25): zero */
    if (e < 113) { /* a subnormal half: m' = (1.m) * 2^(e - 103), rounded to nearest even */
        const uint32_t full = m | 0x800000u, shift = 126 - e;
        const uint32_t q = full >> shift, rest = full & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        return (uint16_t)(sign | (q + (rest > halfway || (rest == halfway && (q & 1)))));
    }
    uint32_t h = ((e - 112) << 10) | (m >> 13); /* may carry into the exponent, up to infinity */
    const uint32_t rest = m & 0x1fffu;
    h += rest > 0x1000u || (rest == 0x1000u && (h & 1));
    return (uint16_t)(sign | (h >= 0x7c00u ? 0x7c00u : h));
#endif
}

/* n floats of src stored as f16 at dst, each rounded to nearest even */
static void store_f16(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
#ifdef R4D_AVX512
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#ifdef R4D_AVX2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = f2h(src[i]);
}

static inline float bf2f(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#ifdef R4D_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp in double, 4 lanes: Cody-Waite reduction by ln 2 and a degree-13 Taylor polynomial on
 * |r| <= ln2/2 (truncation 4e-18 relative), so within about 1 ulp of a double. Results below
 * 2^-1022 flush to 0 and arguments above 709 give +inf: every caller rounds the result to f32,
 * where both are 0 / saturate anyway. */
static inline __m256d exp_pd(__m256d x) {
    const __m256d hi = _mm256_set1_pd(709.0), lo = _mm256_set1_pd(-708.0);
    __m256d over = _mm256_cmp_pd(x, hi, _CMP_GT_OQ), under = _mm256_cmp_pd(x, lo, _CMP_LT_OQ);
    __m256d nan = _mm256_cmp_pd(x, x, _CMP_UNORD_Q);
    __m256d xc = _mm256_min_pd(_mm256_max_pd(x, lo), hi);
    __m256d n = _mm256_round_pd(_mm256_mul_pd(xc, _mm256_set1_pd(1.4426950408889634074)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), xc);
    r = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), r);
    __m256d p = _mm256_set1_pd(1.0 / 6227020800.0);
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 479001600.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 39916800.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 3628800.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 362880.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 40320.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 5040.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 720.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 120.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 24.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / 6.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(0.5));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0));
    __m128i ni = _mm256_cvtpd_epi32(n);
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(ni), _mm256_set1_epi64x(1023)), 52);
    __m256d y = _mm256_mul_pd(p, _mm256_castsi256_pd(e));
    y = _mm256_blendv_pd(y, _mm256_set1_pd(INFINITY), over);
    y = _mm256_blendv_pd(y, _mm256_setzero_pd(), under);
    return _mm256_blendv_pd(y, x, nan);
}

#ifdef R4D_AVX512
#include "r4d_exp512.h"
#endif

/* 8 floats -> (float)exp((double)x) */
static inline __m256 exp_f64_ps(__m256 x) {
    __m256d a = exp_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    __m256d b = exp_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    return _mm256_set_m128(_mm256_cvtpd_ps(b), _mm256_cvtpd_ps(a));
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* threads */

static inline int nthreads_for(int64_t work, int64_t grain) {
    int64_t t = work / (grain > 0 ? grain : 1);
    if (t < 1) t = 1;
    return (int)(t < g_threads ? t : g_threads);
}

/* A buffer of this thread's own, at least `bytes` long, 64-byte aligned, kept for the next launch
 * (the pool's workers live as long as the process); NULL when memory runs out. */
static __thread char *t_buffer;
static __thread size_t t_buffer_bytes;

static void *thread_buffer(size_t bytes) {
    if (bytes > t_buffer_bytes) {
        free(t_buffer);
        const size_t rounded = (bytes + 63) & ~(size_t)63;
        t_buffer = (char *)aligned_alloc(64, rounded);
        t_buffer_bytes = t_buffer ? rounded : 0;
    }
    return t_buffer;
}

/* ------------------------------------------------------------------------------------------ */
/* dequantisation: one weight row to f32, exactly as the core decoder computes it */

typedef struct {
    int fmt;
    const uint8_t *codes;
    const uint16_t *scale;
    const uint16_t *min;
    int64_t rows, cols;
} Weight;

static void dequant_row(const Weight *w, int64_t n, float *dst) {
    const int64_t K = w->cols;
    switch (w->fmt) {
    case F_F32:
        memcpy(dst, w->codes + n * K * 4, (size_t)K * 4);
        return;
    case F_F16: {
        const uint16_t *s = (const uint16_t *)w->codes + n * K;
        int64_t k = 0;
#ifdef R4D_AVX2
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + k))));
#endif
        for (; k < K; k++) dst[k] = h2f(s[k]);
        return;
    }
    case F_BF16: {
        const uint16_t *s = (const uint16_t *)w->codes + n * K;
        for (int64_t k = 0; k < K; k++) dst[k] = bf2f(s[k]);
        return;
    }
    case F_Q8_0: {
        const int8_t *c = (const int8_t *)w->codes + n * K;
        const uint16_t *sc = w->scale + n * (K / QK);
        for (int64_t b = 0; b < K / QK; b++) {
            const float d = h2f(sc[b]);
            for (int i = 0; i < QK; i++) dst[b * QK + i] = (float)c[b * QK + i] * d;
        }
        return;
    }
    case F_Q4_1: {
        const uint8_t *c = w->codes + n * (K / 2);
        const uint16_t *sc = w->scale + n * (K / QK), *mn = w->min + n * (K / QK);
        for (int64_t b = 0; b < K / QK; b++) {
            const float d = h2f(sc[b]), m = h2f(mn[b]);
#ifdef R4D_AVX2
            const __m128i v = _mm_loadu_si128((const __m128i *)(c + b * 16)), m4 = _mm_set1_epi8(0x0f);
            const __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi); /* element order */
            const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
            float *o = dst + b * QK;
            _mm256_storeu_ps(o, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0)), vd), vm));
            _mm256_storeu_ps(o + 8, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8))), vd), vm));
            _mm256_storeu_ps(o + 16, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1)), vd), vm));
            _mm256_storeu_ps(o + 24, _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8))), vd), vm));
#else
            for (int i = 0; i < 16; i++) {
                const uint8_t byte = c[b * 16 + i];
                dst[b * QK + 2 * i] = (float)(byte & 15) * d - m;
                dst[b * QK + 2 * i + 1] = (float)(byte >> 4) * d - m;
            }
#endif
        }
        return;
    }
    }
}

static int weight_check(const Weight *w) {
    if (w->fmt < F_F32 || w->fmt > F_Q4_1 || !w->codes) return R4D_E_INVALID;
    if ((w->fmt == F_Q8_0 || w->fmt == F_Q4_1) && (w->cols % QK || !w->scale)) return R4D_E_SHAPE;
    if (w->fmt == F_Q4_1 && !w->min) return R4D_E_INVALID;
    return R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* embedding: y[m] = table[ids[m]] */

typedef struct {
    const Weight *w;
    const IVec *ids;
    const Mat *Y;
} EmbeddingTask;

static void embedding_task(const void *context, int64_t lo, int64_t hi) {
    const EmbeddingTask *t = (const EmbeddingTask *)context;
    for (int64_t m = lo; m < hi; m++) dequant_row(t->w, iget(t->ids, m), ROW(*t->Y, m, float));
}

int r4d_embedding(const Arr *ids, int fmt, const void *codes, const void *scale, const void *min, int64_t vocab,
                  int64_t n, Arr *y, int64_t M) {
    Weight w = {fmt, (const uint8_t *)codes, (const uint16_t *)scale, (const uint16_t *)min, vocab, n};
    IVec iv;
    Mat Y;
    int rc;
    if ((rc = weight_check(&w)) || (rc = ivec(ids, M, &iv)) || (rc = mat(y, n, 4, M, &Y))) return rc;
    for (int64_t m = 0; m < M; m++) {
        int64_t id = iget(&iv, m);
        if (id < 0 || id >= vocab) return R4D_E_INVALID;
    }
    const EmbeddingTask task = {&w, &iv, &Y};
    pool_run(embedding_task, &task, M, 1, nthreads_for(M * n, 1 << 14));
    return R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GEMV, M <= 4: the weight streams once, every activation row reuses each loaded block.
 *
 * Activations are prepared once (`prepared`: shared by the GEMVs that read the same rows), by `aq`
 * (bits of the activations):
 *   aq = 0:  x in f32; for q4_1 permuted per block to the nibble order (the 16 even elements,
 *            then the 16 odd ones), with the f32 sum of each block for the min term;
 *   aq = 16: x quantised per block of 32 to int16 with an f32 step d = max|x|/32767 (round to
 *            nearest even), the same permutation, the exact f32 block sum; dot products in int32
 *            (vpdpwssd / vpmaddwd), then scaled in f32;
 *   aq = 8:  the same with int8 and d = max|x|/127 (llama.cpp's q8_1 x q4_1), vpdpbusd / vpmaddubsw.
 * Each output is sum_b scale_b * (codes_b . x_b) - sum_b min_b * sum(x_b). */

#define MT_MAX 4
#ifndef R4D_PF_ROWS
#define R4D_PF_ROWS 4 /* weight rows prefetched ahead */
#endif
#ifndef R4D_PF_HINT
/* native.py passes the hint by the CPU's vendor: NTA on AMD (weights are read once per token: kept
 * out of the outer caches; measured on Zen 4), T0 elsewhere (on this Xeon NTA halved the lm head's
 * rate: 13 against 28 GB/s, docs/LIBR4D.md) */
#define R4D_PF_HINT _MM_HINT_T0
#endif

typedef struct {
    int64_t K, nb, M;
    float *xf;   /* [M][K] f32 (f32 path) */
    int8_t *xq;  /* [M][K] int8 (aq = 8) */
    int16_t *xw; /* [M][K] int16 (aq = 16) */
    float *xd;   /* [M][nb] integer step */
    float *xs;   /* [M][nb] block sums (q4_1) */
} Act;

static int64_t act_bytes(int64_t M, int64_t K, int aq) {
    const int64_t nb = (K + QK - 1) / QK;
    return M * K * (aq == 8 ? 1 : aq == 16 ? 2 : 4) + 8 * M * nb + 64 * 4;
}

static char *align64(char *p) { return (char *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

static void act_layout(Act *A, char *s, int64_t M, int64_t K, int aq) {
    A->K = K;
    A->M = M;
    A->nb = (K + QK - 1) / QK;
    s = align64(s);
    A->xf = NULL;
    A->xq = NULL;
    A->xw = NULL;
    if (aq == 8) {
        A->xq = (int8_t *)s;
        s = align64(s + M * K);
    } else if (aq == 16) {
        A->xw = (int16_t *)s;
        s = align64(s + 2 * M * K);
    } else {
        A->xf = (float *)s;
        s = align64(s + 4 * M * K);
    }
    A->xd = (float *)s;
    s = align64(s + 4 * M * A->nb);
    A->xs = (float *)s;
}

/* one activation row into the scratch; `perm`: the q4_1 nibble order (AVX2 paths only) */
static void act_row(const Act *A, int64_t m, const float *x, int aq, int perm) {
    const int64_t K = A->K, nb = A->nb;
    if (!aq && !perm) { /* natural order f32: q8_0 and plain weights, and every portable path */
        memcpy(A->xf + m * K, x, (size_t)K * sizeof(float));
        return;
    }
    /* K % 32 == 0 here (the quantised formats) */
    for (int64_t b = 0; b < nb; b++) {
        const float *src = x + b * QK;
#ifdef R4D_AVX2
        __m256 v0 = _mm256_loadu_ps(src), v1 = _mm256_loadu_ps(src + 8), v2 = _mm256_loadu_ps(src + 16),
               v3 = _mm256_loadu_ps(src + 24);
        if (perm) { /* the 16 even elements, then the 16 odd ones */
            const __m256 e0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
            const __m256 o0 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
            const __m256 e1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v2, v3, 0x88)), 0xD8));
            const __m256 o1 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v2, v3, 0xDD)), 0xD8));
            v0 = e0, v1 = e1, v2 = o0, v3 = o1;
        }
        A->xs[m * nb + b] = hsum8(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
        if (aq) {
            const __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            const float amax = _mm_cvtss_f32(h), d = amax / (aq == 8 ? 127.0f : 32767.0f);
            const float id = d > 0.0f ? 1.0f / d : 0.0f;
            const __m256 vid = _mm256_set1_ps(id);
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
            const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
            if (aq == 8) {
                const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
                _mm256_store_si256((__m256i *)(A->xq + m * K + b * QK),
                                   _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            } else {
                int16_t *first = A->xw + m * K + b * QK, *second = first + 16;
#ifdef R4D_AVX512
                if (perm && (b | 1) < nb) { /* r4d_gemv512.h's pair layout: [evens b, evens b^1, odds b, odds b^1] */
                    first = A->xw + m * K + (b & ~(int64_t)1) * QK + 16 * (b & 1);
                    second = first + 32;
                }
#endif
                _mm256_store_si256((__m256i *)first, _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8));
                _mm256_store_si256((__m256i *)second, _mm256_permute4x64_epi64(_mm256_packs_epi32(q2, q3), 0xD8));
            }
            A->xd[m * nb + b] = d;
        } else {
            float *dst = A->xf + m * K + b * QK;
            _mm256_store_ps(dst, v0);
            _mm256_store_ps(dst + 8, v1);
            _mm256_store_ps(dst + 16, v2);
            _mm256_store_ps(dst + 24, v3);
        }
#else
        (void)src;
#endif
    }
}

#ifdef R4D_AVX2
static inline __m256i dot_u8i8(__m256i u, __m256i s) {
#ifdef R4D_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

#ifdef R4D_AVX2
/* One block of one weight row against `mt` activation rows, into acc[0..mt). Four bodies: q4_1 and
 * q8_0, each with f32 or int8 activations. Called with constant mt and a constant accumulator set,
 * so every accumulator stays in a register. */
#define Q41_UNPACK(c, b)                                                                   \
    const __m128i v_ = _mm_loadu_si128((const __m128i *)((c) + 16 * (b)));                 \
    const __m128i lo_ = _mm_and_si128(v_, _mm_set1_epi8(0x0f));                            \
    const __m128i hi_ = _mm_and_si128(_mm_srli_epi16(v_, 4), _mm_set1_epi8(0x0f));

/* One block of 32 weights (w0..w3, already f32) against the f32 activations of mt rows:
 * acc[i] += (w . x[i, 32b : 32b+32]) * d. Shared by the Q4_1 and Q8_0 f32 paths. */
static inline __attribute__((always_inline)) void block_f32(__m256 w0, __m256 w1, __m256 w2, __m256 w3, __m256 vd,
                                                           const float *x, int64_t K, int64_t b, const int mt,
                                                           __m256 *acc) {
    for (int i = 0; i < mt; i++) {
        const float *xb = x + i * K + 32 * b;
        __m256 t = _mm256_mul_ps(w0, _mm256_load_ps(xb));
        t = _mm256_fmadd_ps(w1, _mm256_load_ps(xb + 8), t);
        t = _mm256_fmadd_ps(w2, _mm256_load_ps(xb + 16), t);
        t = _mm256_fmadd_ps(w3, _mm256_load_ps(xb + 24), t);
        acc[i] = _mm256_fmadd_ps(t, vd, acc[i]);
    }
}

static inline __attribute__((always_inline)) void q41_f32(const uint8_t *c, const float *ds, const float *x, int64_t K,
                                                         int64_t nb, int64_t b, const int mt, __m256 *acc) {
    Q41_UNPACK(c, b)
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo_));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo_, 8)));
    const __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi_));
    const __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi_, 8)));
    (void)nb;
    block_f32(w0, w1, w2, w3, _mm256_broadcast_ss(ds + b), x, K, b, mt, acc);
}

static inline __attribute__((always_inline)) void q41_a8(const uint8_t *c, const float *ds, const int8_t *xq,
                                                        int64_t K, int64_t nb, int64_t b, const int mt, __m256 *acc) {
    Q41_UNPACK(c, b)
    const __m256i cw = _mm256_set_m128i(hi_, lo_);
    for (int i = 0; i < mt; i++) {
        const __m256i q = _mm256_load_si256((const __m256i *)(xq + i * K + 32 * b));
        const __m256 p = _mm256_cvtepi32_ps(dot_u8i8(cw, q));
        acc[i] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(ds + i * nb + b), acc[i]);
    }
}

static inline __attribute__((always_inline)) void q80_f32(const int8_t *c, const float *ds, const float *x, int64_t K,
                                                         int64_t nb, int64_t b, const int mt, __m256 *acc) {
    const __m128i c0 = _mm_loadu_si128((const __m128i *)(c + 32 * b));
    const __m128i c1 = _mm_loadu_si128((const __m128i *)(c + 32 * b + 16));
    const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c0));
    const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c0, 8)));
    const __m256 w2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c1));
    const __m256 w3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c1, 8)));
    (void)nb;
    block_f32(w0, w1, w2, w3, _mm256_broadcast_ss(ds + b), x, K, b, mt, acc);
}

static inline __attribute__((always_inline)) void q80_a8(const int8_t *c, const float *ds, const int8_t *xq,
                                                        int64_t K, int64_t nb, int64_t b, const int mt, __m256 *acc) {
    const __m256i cw = _mm256_loadu_si256((const __m256i *)(c + 32 * b));
    const __m256i aw = _mm256_sign_epi8(cw, cw);
    for (int i = 0; i < mt; i++) {
        const __m256i q = _mm256_load_si256((const __m256i *)(xq + i * K + 32 * b));
        const __m256 p = _mm256_cvtepi32_ps(dot_u8i8(aw, _mm256_sign_epi8(q, cw)));
        acc[i] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(ds + i * nb + b), acc[i]);
    }
}

/* a0 . b0 + a1 . b1 in int32 lanes (16-bit products, pairs summed) */
static inline __m256i dot2_i16(__m256i a0, __m256i b0, __m256i a1, __m256i b1) {
#ifdef R4D_VNNI
    return _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(_mm256_setzero_si256(), a0, b0), a1, b1);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(a0, b0), _mm256_madd_epi16(a1, b1));
#endif
}

static inline __attribute__((always_inline)) void q41_a16(const uint8_t *c, const float *ds, const int16_t *xw,
                                                         int64_t K, int64_t nb, int64_t b, const int mt, __m256 *acc) {
    /* the 16 code bytes widened to int16 first: then the even codes are a mask and the odd ones a
     * shift (a byte < 256 has no bits above its high nibble), 3 operations where nibbles first took 6 */
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(c + 16 * b)));
    const __m256i c0 = _mm256_and_si256(bytes, _mm256_set1_epi16(0x0f)), c1 = _mm256_srli_epi16(bytes, 4);
    for (int i = 0; i < mt; i++) {
        const int16_t *x = xw + i * K + 32 * b;
        const __m256i s = dot2_i16(c0, _mm256_load_si256((const __m256i *)x), c1,
                                   _mm256_load_si256((const __m256i *)(x + 16)));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(ds + i * nb + b), acc[i]);
    }
}

static inline __attribute__((always_inline)) void q80_a16(const int8_t *c, const float *ds, const int16_t *xw,
                                                         int64_t K, int64_t nb, int64_t b, const int mt, __m256 *acc) {
    const __m256i c0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + 32 * b)));
    const __m256i c1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + 32 * b + 16)));
    for (int i = 0; i < mt; i++) {
        const int16_t *x = xw + i * K + 32 * b;
        const __m256i s = dot2_i16(c0, _mm256_load_si256((const __m256i *)x), c1,
                                   _mm256_load_si256((const __m256i *)(x + 16)));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(ds + i * nb + b), acc[i]);
    }
}

/* ds[i * nb + b] = the f32 scale of block b of this weight row, times the int8 step of activation
 * row m0 + i on the int8 path */
static inline __attribute__((always_inline)) void row_scales(const uint16_t *sc, const Act *A, int aq, int64_t m0,
                                                            const int mt, float *ds) {
    const int64_t nb = A->nb;
    const int a8 = aq != 0; /* an integer step to fold in */
    for (int i = 0; i < (a8 ? mt : 1); i++) {
        const float *xd = A->xd + (m0 + i) * nb;
        int64_t b = 0;
        for (; b + 8 <= nb; b += 8) {
            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + b)));
            if (a8) v = _mm256_mul_ps(v, _mm256_loadu_ps(xd + b));
            _mm256_storeu_ps(ds + i * nb + b, v);
        }
        for (; b < nb; b++) ds[i * nb + b] = a8 ? h2f(sc[b]) * xd[b] : h2f(sc[b]);
    }
}

/* the blocks of one row, two at a time into two accumulator sets */
#define BLOCK_LOOP(CALL)                                                                   \
    do {                                                                                   \
        int64_t b = 0;                                                                     \
        for (; b + 2 <= nb; b += 2) {                                                      \
            { const int64_t bb = b; __m256 *A_ = a0; CALL; }                               \
            { const int64_t bb = b + 1; __m256 *A_ = a1; CALL; }                           \
        }                                                                                  \
        if (b < nb) { const int64_t bb = b; __m256 *A_ = a0; CALL; }                       \
    } while (0)
#endif

/* rows [n0, n1) of y[m, n] for m in [m0, m0 + mt) */
static inline __attribute__((always_inline)) void gemv_rows(const Weight *w, const Act *A, int aq, int64_t m0,
                                                           const int mt, int64_t n0, int64_t n1, const Mat *Y) {
    const int64_t K = w->cols, nb = K / QK;
    (void)nb;
    for (int64_t n = n0; n < n1; n++) {
        float out[MT_MAX];
#ifdef R4D_AVX2
        __m256 a0[MT_MAX], a1[MT_MAX];
        for (int i = 0; i < mt; i++) a0[i] = a1[i] = _mm256_setzero_ps();
        float ds[MT_MAX * nb + 8]; /* per activation row, each block's weight scale (times its int8 step) */
        if (w->fmt == F_Q4_1) {
            const uint8_t *c = w->codes + n * (K / 2);
            const uint16_t *sc = w->scale + n * nb, *mn = w->min + n * nb;
            if (R4D_PF_ROWS && n + R4D_PF_ROWS < n1) {
                const char *pc = (const char *)(c + R4D_PF_ROWS * (K / 2));
                for (int64_t o = 0; o < K / 2; o += 64) _mm_prefetch(pc + o, R4D_PF_HINT);
                _mm_prefetch((const char *)(sc + R4D_PF_ROWS * nb), R4D_PF_HINT);
                _mm_prefetch((const char *)(mn + R4D_PF_ROWS * nb), R4D_PF_HINT);
            }
            row_scales(sc, A, aq, m0, mt, ds);
            if (aq == 8) {
                const int8_t *xq = A->xq + m0 * K;
                BLOCK_LOOP(q41_a8(c, ds, xq, K, nb, bb, mt, A_));
            } else if (aq == 16) {
                const int16_t *xw = A->xw + m0 * K;
                BLOCK_LOOP(q41_a16(c, ds, xw, K, nb, bb, mt, A_));
            } else {
                const float *x = A->xf + m0 * K;
                BLOCK_LOOP(q41_f32(c, ds, x, K, nb, bb, mt, A_));
            }
            for (int i = 0; i < mt; i++) {
                const float *xs = A->xs + (m0 + i) * nb;
                __m256 mt8 = _mm256_setzero_ps();
                int64_t b = 0;
                for (; b + 8 <= nb; b += 8)
                    mt8 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b))),
                                          _mm256_loadu_ps(xs + b), mt8);
                float tail = hsum8(mt8);
                for (; b < nb; b++) tail += h2f(mn[b]) * xs[b];
                out[i] = hsum8(_mm256_add_ps(a0[i], a1[i])) - tail;
            }
        } else if (w->fmt == F_Q8_0) {
            const int8_t *c = (const int8_t *)w->codes + n * K;
            const uint16_t *sc = w->scale + n * nb;
            if (R4D_PF_ROWS && n + R4D_PF_ROWS < n1) {
                const char *pc = (const char *)(c + R4D_PF_ROWS * K);
                for (int64_t o = 0; o < K; o += 64) _mm_prefetch(pc + o, R4D_PF_HINT);
                _mm_prefetch((const char *)(sc + R4D_PF_ROWS * nb), R4D_PF_HINT);
            }
            row_scales(sc, A, aq, m0, mt, ds);
            if (aq == 8) {
                const int8_t *xq = A->xq + m0 * K;
                BLOCK_LOOP(q80_a8(c, ds, xq, K, nb, bb, mt, A_));
            } else if (aq == 16) {
                const int16_t *xw = A->xw + m0 * K;
                BLOCK_LOOP(q80_a16(c, ds, xw, K, nb, bb, mt, A_));
            } else {
                const float *x = A->xf + m0 * K;
                BLOCK_LOOP(q80_f32(c, ds, x, K, nb, bb, mt, A_));
            }
            for (int i = 0; i < mt; i++) out[i] = hsum8(_mm256_add_ps(a0[i], a1[i]));
        } else {
            /* f32 / f16 / bf16: f32 activations in natural order, 16 columns a step */
            int64_t k = 0;
            for (; k + 16 <= K; k += 16) {
                __m256 wa, wb;
                if (w->fmt == F_F32) {
                    wa = _mm256_loadu_ps((const float *)w->codes + n * K + k);
                    wb = _mm256_loadu_ps((const float *)w->codes + n * K + k + 8);
                } else {
                    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w->codes + n * K + k));
                    if (w->fmt == F_F16) {
                        wa = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                        wb = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
                    } else {
                        wa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16));
                        wb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16));
                    }
                }
                for (int i = 0; i < mt; i++) {
                    a0[i] = _mm256_fmadd_ps(wa, _mm256_loadu_ps(A->xf + (m0 + i) * K + k), a0[i]);
                    a1[i] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(A->xf + (m0 + i) * K + k + 8), a1[i]);
                }
            }
            for (int i = 0; i < mt; i++) {
                float s = hsum8(_mm256_add_ps(a0[i], a1[i]));
                for (int64_t kk = k; kk < K; kk++) {
                    float wk = w->fmt == F_F32 ? ((const float *)w->codes)[n * K + kk]
                               : w->fmt == F_F16 ? h2f(((const uint16_t *)w->codes)[n * K + kk])
                                                 : bf2f(((const uint16_t *)w->codes)[n * K + kk]);
                    s += wk * A->xf[(m0 + i) * K + kk];
                }
                out[i] = s;
            }
        }
#else
        /* portable: dequantise the row once, dot it with every activation row */
        float wrow[K];
        dequant_row(w, n, wrow);
        for (int i = 0; i < mt; i++) {
            const float *x = A->xf + (m0 + i) * K;
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += wrow[k] * x[k];
            out[i] = s;
        }
#endif
        for (int i = 0; i < mt; i++) ROW(*Y, m0 + i, float)[n] = out[i];
    }
}

#ifdef R4D_AVX512
#include "r4d_gemv512.h"
#endif

static void gemv_block(const Weight *w, const Act *A, int aq, int64_t m0, int mt, int64_t n0, int64_t n1, const Mat *Y) {
#ifdef R4D_AVX512
    if (aq == 16 && (w->fmt == F_Q4_1 || w->fmt == F_Q8_0)) {
        gemv512_block(w, A, m0, mt, n0, n1, Y);
        return;
    }
#endif
    switch (mt) {
    case 1: gemv_rows(w, A, aq, m0, 1, n0, n1, Y); break;
    case 2: gemv_rows(w, A, aq, m0, 2, n0, n1, Y); break;
    case 3: gemv_rows(w, A, aq, m0, 3, n0, n1, Y); break;
    default: gemv_rows(w, A, aq, m0, 4, n0, n1, Y); break;
    }
}

typedef struct {
    const Weight *w;
    const Act *A;
    int aq;
    int64_t M;
    const Mat *Y;
} GemvTask;

/* weight rows [lo, hi) against every activation row, MT_MAX at a time */
static void gemv_task(const void *context, int64_t lo, int64_t hi) {
    const GemvTask *t = (const GemvTask *)context;
    for (int64_t m0 = 0; m0 < t->M; m0 += MT_MAX) {
        const int mt = (int)(t->M - m0 < MT_MAX ? t->M - m0 : MT_MAX);
        gemv_block(t->w, t->A, t->aq, m0, mt, lo, hi, t->Y);
    }
}

/* The activations the last GEMV of this thread prepared, kept for the next GEMV that reads the same
 * rows in the same form: q, k and v read one normed x, gate and up another, so a decode step
 * quantises each once (as llama.cpp shares its Q8 activations). `source` holds the f32 rows they
 * were made from, compared whole before they are taken again: a buffer written since (the next
 * layer's x in the same buffer) is never taken for the old one, whichever row wrote it. */
typedef struct {
    Act act;
    char *buffer;
    float *source;
    size_t buffer_bytes, source_bytes;
    const char *from;
    int64_t pitch, M, K;
    int aq, perm, valid;
} ActCache;

static __thread ActCache t_act;

typedef struct {
    const Act *A;
    const Mat *X;
    float *source;
    int aq, perm;
} PrepareTask;

/* activation rows [lo, hi) prepared, and copied as the source they were made from */
static void prepare_task(const void *context, int64_t lo, int64_t hi) {
    const PrepareTask *t = (const PrepareTask *)context;
    const int64_t K = t->A->K;
    for (int64_t m = lo; m < hi; m++) {
        act_row(t->A, m, ROW(*t->X, m, const float), t->aq, t->perm);
        memcpy(t->source + m * K, ROW(*t->X, m, const float), (size_t)K * sizeof(float));
    }
}

static int grow(void *slot, size_t *have, size_t need) {
    if (need <= *have) return 1;
    void **p = (void **)slot;
    free(*p);
    const size_t rounded = (need + 63) & ~(size_t)63;
    *p = aligned_alloc(64, rounded);
    *have = *p ? rounded : 0;
    return *p != NULL;
}

/* rows [0, M) of X prepared as `aq` and `perm` ask, from the cache when X still holds what they were
 * made from; NULL when memory runs out */
static const Act *prepared(const Mat *X, int64_t M, int64_t K, int aq, int perm) {
    ActCache *c = &t_act;
    const size_t row = (size_t)K * sizeof(float);
    if (c->valid && c->from == X->p && c->pitch == X->pitch && c->M == M && c->K == K && c->aq == aq && c->perm == perm) {
        int64_t m = 0;
        while (m < M && !memcmp(c->source + m * K, ROW(*X, m, const float), row)) m++;
        if (m == M) return &c->act;
    }
    c->valid = 0;
    if (!grow(&c->buffer, &c->buffer_bytes, (size_t)act_bytes(M, K, aq)) || !grow(&c->source, &c->source_bytes, M * row))
        return NULL;
    act_layout(&c->act, c->buffer, M, K, aq);
    /* a decode step's few rows on this thread; a prefill's (the q8_0 GEMM's) shared out */
    const PrepareTask task = {&c->act, X, c->source, aq, perm};
    pool_run(prepare_task, &task, M, 4, nthreads_for(M * K, 1 << 15));
    c->from = X->p, c->pitch = X->pitch, c->M = M, c->K = K, c->aq = aq, c->perm = perm, c->valid = 1;
    return &c->act;
}

int r4d_gemv(const Arr *x, int fmt, const void *codes, const void *scale, const void *min, Arr *y, int64_t M,
             int64_t N, int64_t K, int aq) {
    Weight w = {fmt, (const uint8_t *)codes, (const uint16_t *)scale, (const uint16_t *)min, N, K};
    Mat X, Y;
    int rc;
    if ((rc = weight_check(&w)) || (rc = mat(x, K, 4, M, &X)) || (rc = mat(y, N, 4, M, &Y))) return rc;
#ifndef R4D_AVX2
    aq = 0;
#endif
    if (fmt != F_Q4_1 && fmt != F_Q8_0) aq = 0;
    if (aq != 0 && aq != 8 && aq != 16) return R4D_E_INVALID;
#ifdef R4D_AVX2
    const int perm = fmt == F_Q4_1;
#else
    const int perm = 0;
#endif
    const Act *A = prepared(&X, M, K, aq, perm);
    if (!A) return R4D_E_NOMEM;
    /* chunks of rows of W, a multiple of 16 so no two threads share a cache line of y */
    const int64_t bytes = fmt == F_Q4_1 ? N * K * 5 / 8 : fmt == F_Q8_0 ? N * K * 17 / 16 : N * K * (fmt == F_F32 ? 4 : 2);
    const GemvTask task = {&w, A, aq, M, &Y};
    pool_run(gemv_task, &task, N, 16, nthreads_for(bytes, 1 << 15));
    return R4D_OK;
}

/* The decode GEMV's int16 activations of rows [0, M) of x in natural order (per block of 32: int16
 * codes, the f32 step, the f32 sum of the block), from the launching thread's cache as the q8_0 GEMV
 * takes them, for r4d_kquants.c's integer GEMVs. Valid until this thread prepares another set. */
int r4d_act16(const Arr *x, int64_t M, int64_t K, const int16_t **xw, const float **xd, const float **xs) {
#ifdef R4D_AVX2
    Mat X;
    int rc;
    if (K % QK) return R4D_E_SHAPE;
    if ((rc = mat(x, K, 4, M, &X))) return rc;
    const Act *A = prepared(&X, M, K, 16, 0);
    if (!A) return R4D_E_NOMEM;
    *xw = A->xw, *xd = A->xd, *xs = A->xs;
    return R4D_OK;
#else
    (void)x, (void)M, (void)K, (void)xw, (void)xd, (void)xs;
    return R4D_E_INVALID;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM, larger M: each thread dequantises a panel of NP weight rows to exact f32 values, then a
 * register tile of dot products over K runs against it: 4 x 3 of 8 floats (AVX2), or 4 x 4 of 16
 * (r4d_gemm512.h). */

#define NP 24
#define MR 4
#define NR 3

#ifndef R4D_AVX512 /* r4d_gemm512.h's tile serves where the compiler targets AVX-512 */
static inline __attribute__((always_inline)) void tile(const float *X, int64_t ldx, const int mr, const float *W,
                                                      int64_t K, const int nr, float *Y, int64_t ldy) {
#ifdef R4D_AVX2
    __m256 acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = _mm256_load_ps(W + j * K + k);
        for (int i = 0; i < mr; i++) {
            const __m256 xv = _mm256_loadu_ps(X + i * ldx + k);
            for (int j = 0; j < nr; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = hsum8(acc[i][j]);
            for (int64_t kk = k; kk < K; kk++) s += X[i * ldx + kk] * W[j * K + kk];
            Y[i * ldy + j] = s;
        }
#else
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += X[i * ldx + k] * W[j * K + k];
            Y[i * ldy + j] = s;
        }
#endif
}

static void tile_any(const float *X, int64_t ldx, int mr, const float *W, int64_t K, int nr, float *Y, int64_t ldy) {
#define T(a, b) \
    case a * 4 + b: tile(X, ldx, a, W, K, b, Y, ldy); break;
    switch (mr * 4 + nr) {
        T(1, 1) T(1, 2) T(1, 3) T(2, 1) T(2, 2) T(2, 3) T(3, 1) T(3, 2) T(3, 3) T(4, 1) T(4, 2) T(4, 3)
    }
#undef T
}

#endif

#ifdef R4D_AVX512
#include "r4d_gemm512.h"
#endif

typedef struct {
    const Weight *w;
    const Mat *X, *Y;
    int64_t M, N, K, ldx, ldy;
    _Atomic int failed;
} GemmTask;

/* weight panels [lo, hi): each dequantised to f32 once, then every activation row against it */
static void gemm_task(const void *context, int64_t lo, int64_t hi) {
    GemmTask *t = (GemmTask *)context;
    const int64_t M = t->M, N = t->N, K = t->K;
    /* K padded to a multiple of 8 floats keeps every panel row 32-byte aligned */
    const int64_t kp = (K + 7) & ~(int64_t)7;
    float *panel = (float *)thread_buffer((size_t)(NP * kp * 4));
    if (!panel) {
        atomic_store(&t->failed, 1);
        return;
    }
    for (int64_t p = lo; p < hi; p++) {
        const int64_t n0 = p * NP, np = N - n0 < NP ? N - n0 : NP;
        for (int64_t j = 0; j < np; j++) dequant_row(t->w, n0 + j, panel + j * kp);
#ifdef R4D_AVX512
        for (int64_t m0 = 0; m0 < M; m0 += MR512) {
            const int mr = (int)(M - m0 < MR512 ? M - m0 : MR512);
            const float *xr = ROW(*t->X, m0, const float);
            for (int64_t j0 = 0; j0 < np; j0 += NR512)
                tile512_any(xr, t->ldx, mr, panel + j0 * kp, kp, K, (int)(np - j0 < NR512 ? np - j0 : NR512),
                            ROW(*t->Y, m0, float) + n0 + j0, t->ldy);
        }
#else
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int mr = (int)(M - m0 < MR ? M - m0 : MR);
            const float *xr = ROW(*t->X, m0, const float);
            for (int64_t j0 = 0; j0 < np; j0 += NR) {
                const int nr = (int)(np - j0 < NR ? np - j0 : NR);
                /* the tile reads rows of K elements at a pitch of kp */
                float *yr = ROW(*t->Y, m0, float) + n0 + j0;
                if (kp == K) {
                    tile_any(xr, t->ldx, mr, panel + j0 * kp, K, nr, yr, t->ldy);
                } else {
                    for (int jj = 0; jj < nr; jj++)
                        tile_any(xr, t->ldx, mr, panel + (j0 + jj) * kp, K, 1, yr + jj, t->ldy);
                }
            }
        }
#endif
    }
}

/* y[m, j] = x[m, :K] . panel[j, :K] for m < M, j < np: the register tiles above against a panel of
 * f32 weight rows another file decoded (r4d_kquants.c's GEMM); rows of x and y `ldx`, `ldy` floats
 * apart, panel rows `kp` floats apart (kp == K, K % 8 == 0) */
void r4d_panel_tiles(const float *panel, int64_t kp, int64_t np, int64_t K, const float *x, int64_t ldx, int64_t M,
                     float *y, int64_t ldy) {
#ifdef R4D_AVX512
    for (int64_t m0 = 0; m0 < M; m0 += MR512) {
        const int mr = (int)(M - m0 < MR512 ? M - m0 : MR512);
        for (int64_t j0 = 0; j0 < np; j0 += NR512)
            tile512_any(x + m0 * ldx, ldx, mr, panel + j0 * kp, kp, K, (int)(np - j0 < NR512 ? np - j0 : NR512),
                        y + m0 * ldy + j0, ldy);
    }
#else
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
        const int mr = (int)(M - m0 < MR ? M - m0 : MR);
        for (int64_t j0 = 0; j0 < np; j0 += NR) {
            const int nr = (int)(np - j0 < NR ? np - j0 : NR);
            if (kp == K) {
                tile_any(x + m0 * ldx, ldx, mr, panel + j0 * kp, K, nr, y + m0 * ldy + j0, ldy);
            } else {
                for (int jj = 0; jj < nr; jj++)
                    tile_any(x + m0 * ldx, ldx, mr, panel + (j0 + jj) * kp, K, 1, y + m0 * ldy + j0 + jj, ldy);
            }
        }
    }
#endif
}

#if defined(R4D_AVX2) && !defined(R4D_AVX512)
/* The q8_0 GEMM on AVX2 with int16 activations (aq = 16): the decode GEMV's per-block int16 codes
 * and f32 steps (`prepared`, natural order: shared with every GEMM and GEMV that reads the same
 * rows), the weight's int8 codes widened to int16 and multiplied pairwise (vpmaddwd: 16 products a
 * step where an FMA makes 8), each block's int32 sum scaled by (weight scale * activation step) into
 * f32 lanes. A register tile of Q8_MR activation rows x Q8_NR weight rows; a weight row pair's
 * codes (2 K bytes) stay in L1 while every activation row passes. Within TOL_A16 of libref, as the
 * GEMV at aq = 16; measured 1.6-2x the f32 panels' rate on one Zen 3 core. */
#define Q8_MR 4
#define Q8_NR 2

static inline __attribute__((always_inline)) void q80_tile16(const Act *A, int64_t m0, const int mr, const int8_t *c,
                                                            const float *dw, const int nr, int64_t K, float *y,
                                                            int64_t ldy) {
    const int64_t nb = A->nb;
    const int16_t *xw = A->xw + m0 * K;
    const float *xd = A->xd + m0 * nb;
    __m256 acc[Q8_MR][Q8_NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w0[Q8_NR], w1[Q8_NR];
        __m256 vw[Q8_NR];
        for (int j = 0; j < nr; j++) {
            w0[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + j * K + QK * b)));
            w1[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + j * K + QK * b + 16)));
            vw[j] = _mm256_broadcast_ss(dw + j * nb + b);
        }
        for (int i = 0; i < mr; i++) {
            const __m256i x0 = _mm256_load_si256((const __m256i *)(xw + i * K + QK * b));
            const __m256i x1 = _mm256_load_si256((const __m256i *)(xw + i * K + QK * b + 16));
            const __m256 vx = _mm256_broadcast_ss(xd + i * nb + b);
            for (int j = 0; j < nr; j++) {
                const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(w0[j], x0), _mm256_madd_epi16(w1[j], x1));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(vx, vw[j]), acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) y[i * ldy + j] = hsum8(acc[i][j]);
}

static void q80_tile16_any(const Act *A, int64_t m0, int mr, const int8_t *c, const float *dw, int nr, int64_t K,
                           float *y, int64_t ldy) {
#define T(a, b) \
    case a * 4 + b: q80_tile16(A, m0, a, c, dw, b, K, y, ldy); break;
    switch (mr * 4 + nr) { T(1, 1) T(1, 2) T(2, 1) T(2, 2) T(3, 1) T(3, 2) T(4, 1) T(4, 2) }
#undef T
}

typedef struct {
    const Weight *w;
    const Act *A;
    const Mat *Y;
    int64_t M;
    _Atomic int failed;
} Q8GemmTask;

/* weight row pairs [lo, hi) against every activation row */
static void q80_gemm16_task(const void *context, int64_t lo, int64_t hi) {
    Q8GemmTask *t = (Q8GemmTask *)context;
    const int64_t K = t->w->cols, N = t->w->rows, nb = K / QK;
    float *dw = (float *)thread_buffer((size_t)(Q8_NR * nb) * sizeof(float)); /* the pair's f32 scales */
    if (!dw) {
        atomic_store(&t->failed, 1);
        return;
    }
    for (int64_t p = lo; p < hi; p++) {
        const int64_t n0 = p * Q8_NR;
        const int nr = (int)(N - n0 < Q8_NR ? N - n0 : Q8_NR);
        for (int j = 0; j < nr; j++)
            for (int64_t b = 0; b < nb; b++) dw[j * nb + b] = h2f(t->w->scale[(n0 + j) * nb + b]);
        const int8_t *c = (const int8_t *)t->w->codes + n0 * K;
        for (int64_t m0 = 0; m0 < t->M; m0 += Q8_MR)
            q80_tile16_any(t->A, m0, (int)(t->M - m0 < Q8_MR ? t->M - m0 : Q8_MR), c, dw, nr, K,
                           ROW(*t->Y, m0, float) + n0, t->Y->pitch / 4);
    }
}
#endif

#ifdef R4D_AMX
#include "r4d_gemm_amx.h"
#include "r4d_gemm_amx256.h"
#else
static int r4d_amx_usable(void) { return 0; }
#endif

/* y = x W^T on AMX int8 tiles for another file's weights (r4d_kquants.c): `row(weight, n, codes,
 * scales, mins)` gives weight row n as K int8 codes and K / 32 f32 scales (and mins where `mins`),
 * w = code x scale - min per block of 32; the activations are the GEMV's int16 ones. R4D_E_INVALID
 * where AMX is not built or not granted: the caller keeps its own path. */
int r4d_amx_gemm(const Arr *x, int64_t M, int64_t N, int64_t K,
                 void (*row)(const void *, int64_t, int8_t *, float *, float *), const void *weight, int mins,
                 Arr *y) {
#ifdef R4D_AMX
    Mat X, Y;
    int rc;
    if (!r4d_amx_usable() || K % QK || K <= 0) return R4D_E_INVALID;
    if ((rc = mat(x, K, 4, M, &X)) || (rc = mat(y, N, 4, M, &Y))) return rc;
    if (M <= 0) return R4D_OK;
    const Act *A = prepared(&X, M, K, 16, 0);
    if (!A) return R4D_E_NOMEM;
    return amx_gemm(row, weight, mins, N, K, A, &Y, M);
#else
    (void)x, (void)M, (void)N, (void)K, (void)row, (void)weight, (void)mins, (void)y;
    return R4D_E_INVALID;
#endif
}

/* y = x W^T on AMX int8 tiles for weights of one scale per 256 (r4d_kquants.c's q6_k):
 * `row(weight, n, values, scales)` gives weight row n as K int16 values (|v| < 2^14) and K / 256
 * f32 scales; the activations are quantised per 256 (r4d_gemm_amx256.h). R4D_E_INVALID where AMX
 * is not built or not granted, or K is not a multiple of 256: the caller keeps its own path. */
int r4d_amx_gemm256(const Arr *x, int64_t M, int64_t N, int64_t K, void (*row)(const void *, int64_t, int16_t *, float *),
                    const void *weight, Arr *y) {
#ifdef R4D_AMX
    Mat X, Y;
    int rc;
    if (!r4d_amx_usable() || K % AMX_SUPER || K <= 0) return R4D_E_INVALID;
    if ((rc = mat(x, K, 4, M, &X)) || (rc = mat(y, N, 4, M, &Y))) return rc;
    if (M <= 0) return R4D_OK;
    return amx_gemm256(row, weight, N, K, &X, &Y, M);
#else
    (void)x, (void)M, (void)N, (void)K, (void)row, (void)weight, (void)y;
    return R4D_E_INVALID;
#endif
}

int r4d_gemm(const Arr *x, int fmt, const void *codes, const void *scale, const void *min, Arr *y, int64_t M,
             int64_t N, int64_t K, int aq) {
    Weight w = {fmt, (const uint8_t *)codes, (const uint16_t *)scale, (const uint16_t *)min, N, K};
    Mat X, Y;
    int rc;
    if ((rc = weight_check(&w)) || (rc = mat(x, K, 4, M, &X)) || (rc = mat(y, N, 4, M, &Y))) return rc;
    if (X.pitch % 4 || Y.pitch % 4) return R4D_E_SHAPE;
    if (aq != 0 && aq != 16) return R4D_E_INVALID;
#ifdef R4D_AMX
    if (aq == 16 && fmt == F_Q8_0 && M > 0 && r4d_amx_usable()) {
        const Act *A = prepared(&X, M, K, 16, 0);
        if (!A) return R4D_E_NOMEM;
        return amx_gemm(amx_row_q8_0, &w, 0, N, K, A, &Y, M);
    }
#endif
#if defined(R4D_AVX2) && !defined(R4D_AVX512)
    if (aq == 16 && fmt == F_Q8_0 && M > 0) {
        const Act *A = prepared(&X, M, K, 16, 0);
        if (!A) return R4D_E_NOMEM;
        Q8GemmTask task = {&w, A, &Y, M, 0};
        const int64_t pairs = (N + Q8_NR - 1) / Q8_NR;
        pool_run(q80_gemm16_task, &task, pairs, 8, nthreads_for(M * N * K, 1 << 18));
        return atomic_load(&task.failed) ? R4D_E_NOMEM : R4D_OK;
    }
#endif
    GemmTask task = {&w, &X, &Y, M, N, K, X.pitch / 4, Y.pitch / 4, 0};
    pool_run(gemm_task, &task, (N + NP - 1) / NP, 1, nthreads_for(M * N * K, 1 << 18));
    return atomic_load(&task.failed) ? R4D_E_NOMEM : R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* rmsnorm: y = (x * (1 / sqrt(sum(x*x) / n + eps))) * w, the sum in column order (libref's
 * arithmetic, operation for operation) */

/* sums[r] = the ordered sum of squares of rows[r], r < count <= SQUARE_ROWS: every row's own sum in
 * column order, each square rounded before its add (libref's arithmetic). Eight rows go together,
 * one per lane: 8 x 8 blocks transposed so lane r holds row r's columns in turn, so the rows' add
 * chains run side by side (a row alone is bound by the adds' latency). The sums start at +0, and
 * 0 + x*x is x*x exactly. */
#define SQUARE_ROWS 8
static void sums_of_squares(const float *const *rows, int count, int64_t n, float *sums) {
    int64_t i = 0;
    float s[SQUARE_ROWS] = {0};
#ifdef R4D_AVX2
    if (count == SQUARE_ROWS) {
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m256 r[8], t[8], u[8];
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(rows[k] + i);
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) {
                u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
                u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
                u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
                u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
            }
            for (int k = 0; k < 4; k++) { /* column k, then column k + 4, of the 8 rows */
                const __m256 low = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
                t[k] = low;
                t[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
            }
            for (int k = 0; k < 8; k++) acc = _mm256_add_ps(acc, _mm256_mul_ps(t[k], t[k]));
        }
        _mm256_storeu_ps(s, acc);
    }
#endif
    for (int r = 0; r < count; r++)
        for (int64_t k = i; k < n; k++) {
            const float p = rows[r][k] * rows[r][k];
            s[r] = s[r] + p;
        }
    for (int r = 0; r < count; r++) sums[r] = s[r];
}

/* yr = (xr * (1 / sqrt(s / n + eps))) * w, given xr's sum of squares s */
static void rmsnorm_scale(const float *xr, float s, const float *w, float *yr, int64_t n, float fn, float e) {
    const float scale = 1.0f / sqrtf(s / fn + e);
    int64_t i = 0;
#ifdef R4D_AVX2
    const __m256 vs = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vs), _mm256_loadu_ps(w + i)));
#endif
    for (; i < n; i++) yr[i] = (xr[i] * scale) * w[i];
}

/* rows [lo, hi) of Y = rmsnorm(rows of X) * w, SQUARE_ROWS at a time */
static void rmsnorm_rows(const Mat *X, const float *w, const Mat *Y, int64_t lo, int64_t hi, int64_t n, float fn, float e) {
    for (int64_t m = lo; m < hi; m += SQUARE_ROWS) {
        const int count = (int)(hi - m < SQUARE_ROWS ? hi - m : SQUARE_ROWS);
        const float *rows[SQUARE_ROWS];
        float sums[SQUARE_ROWS];
        for (int r = 0; r < count; r++) rows[r] = ROW(*X, m + r, const float);
        sums_of_squares(rows, count, n, sums);
        for (int r = 0; r < count; r++) rmsnorm_scale(rows[r], sums[r], w, ROW(*Y, m + r, float), n, fn, e);
    }
}

/* the row-wise ops' operands: rows of a (and b) into rows of y, n wide */
typedef struct {
    const Mat *a, *b, *y;
    const float *w;
    int64_t n;
    float fn, eps;
} RowsTask;

static void rmsnorm_task(const void *context, int64_t lo, int64_t hi) {
    const RowsTask *t = (const RowsTask *)context;
    rmsnorm_rows(t->a, t->w, t->y, lo, hi, t->n, t->fn, t->eps);
}

int r4d_rmsnorm(const Arr *x, const Arr *weight, Arr *y, int64_t M, int64_t n, double eps) {
    Mat X, Y, W;
    int rc;
    if ((rc = mat(x, n, 4, M, &X)) || (rc = mat(weight, n, 4, 1, &W)) || (rc = mat(y, n, 4, M, &Y))) return rc;
    const float *w = (const float *)W.p;
    const float e = (float)eps, fn = (float)n;
    const RowsTask task = {&X, NULL, &Y, w, n, fn, e};
    pool_run(rmsnorm_task, &task, M, SQUARE_ROWS, nthreads_for(M * n, 1 << 14));
    return R4D_OK;
}

/* residual = residual + x; y = rmsnorm(residual) * w: the tail of the fused all_reduce + add +
 * rmsnorm once the reduction is done, with add's and rmsnorm's arithmetic (bit for bit libref's) */
static void add_rmsnorm_task(const void *context, int64_t lo, int64_t hi) {
    const RowsTask *t = (const RowsTask *)context;
    for (int64_t m = lo; m < hi; m++) {
        float *rr = ROW(*t->a, m, float);
        const float *xr = ROW(*t->b, m, const float);
        for (int64_t i = 0; i < t->n; i++) rr[i] = rr[i] + xr[i];
    }
    rmsnorm_rows(t->a, t->w, t->y, lo, hi, t->n, t->fn, t->eps);
}

int r4d_add_rmsnorm(Arr *residual, const Arr *x, const Arr *weight, Arr *y, int64_t M, int64_t n, double eps) {
    Mat R, X, W, Y;
    int rc;
    if ((rc = mat(residual, n, 4, M, &R)) || (rc = mat(x, n, 4, M, &X)) || (rc = mat(weight, n, 4, 1, &W)) ||
        (rc = mat(y, n, 4, M, &Y)))
        return rc;
    const float *w = (const float *)W.p;
    const float e = (float)eps, fn = (float)n;
    const RowsTask task = {&R, &X, &Y, w, n, fn, e};
    pool_run(add_rmsnorm_task, &task, M, SQUARE_ROWS, nthreads_for(M * n, 1 << 14));
    return R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* elementwise */

static void add_task(const void *context, int64_t lo, int64_t hi) {
    const RowsTask *t = (const RowsTask *)context;
    for (int64_t m = lo; m < hi; m++) {
        const float *ar = ROW(*t->a, m, const float), *br = ROW(*t->b, m, const float);
        float *yr = ROW(*t->y, m, float);
        for (int64_t i = 0; i < t->n; i++) yr[i] = ar[i] + br[i];
    }
}

int r4d_add(const Arr *a, const Arr *b, Arr *y, int64_t M, int64_t n) {
    Mat A, B, Y;
    int rc;
    if ((rc = mat(a, n, 4, M, &A)) || (rc = mat(b, n, 4, M, &B)) || (rc = mat(y, n, 4, M, &Y))) return rc;
    const RowsTask task = {&A, &B, &Y, NULL, n, 0, 0};
    pool_run(add_task, &task, M, 1, nthreads_for(M * n, 1 << 16));
    return R4D_OK;
}

/* y = (g * sigmoid(g)) * u, the sigmoid 1 / (1 + exp(-g)) in double, rounded once to f32 */
static void silu_row(const float *gr, const float *ur, float *yr, int64_t n) {
    int64_t i = 0;
#ifdef R4D_AVX512
    const __m512d one8 = _mm512_set1_pd(1.0);
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(gr + i);
        const __m512d e = exp_pd512(_mm512_sub_pd(_mm512_setzero_pd(), _mm512_cvtps_pd(gv)));
        const __m256 sg = _mm512_cvtpd_ps(_mm512_div_pd(one8, _mm512_add_pd(one8, e)));
        _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(gv, sg), _mm256_loadu_ps(ur + i)));
    }
#endif
#ifdef R4D_AVX2
    const __m256d one = _mm256_set1_pd(1.0);
    for (; i + 4 <= n; i += 4) {
        const __m128 gv = _mm_loadu_ps(gr + i);
        const __m256d e = exp_pd(_mm256_sub_pd(_mm256_setzero_pd(), _mm256_cvtps_pd(gv)));
        const __m128 sg = _mm256_cvtpd_ps(_mm256_div_pd(one, _mm256_add_pd(one, e)));
        _mm_storeu_ps(yr + i, _mm_mul_ps(_mm_mul_ps(gv, sg), _mm_loadu_ps(ur + i)));
    }
#endif
    for (; i < n; i++) {
        const float sg = (float)(1.0 / (1.0 + exp(-(double)gr[i])));
        yr[i] = (gr[i] * sg) * ur[i];
    }
}

static void silu_mul_task(const void *context, int64_t lo, int64_t hi) {
    const RowsTask *t = (const RowsTask *)context;
    for (int64_t m = lo; m < hi; m++) silu_row(ROW(*t->a, m, const float), ROW(*t->b, m, const float), ROW(*t->y, m, float), t->n);
}

int r4d_silu_mul(const Arr *g, const Arr *u, Arr *y, int64_t M, int64_t n) {
    Mat G, U, Y;
    int rc;
    if ((rc = mat(g, n, 4, M, &G)) || (rc = mat(u, n, 4, M, &U)) || (rc = mat(y, n, 4, M, &Y))) return rc;
    const RowsTask task = {&G, &U, &Y, NULL, n, 0, 0};
    pool_run(silu_mul_task, &task, M, 1, nthreads_for(M * n, 1 << 13));
    return R4D_OK;
}

int r4d_take_rows(const Arr *x, const Arr *index, Arr *y, int64_t M, int64_t n) {
    Mat X, Y;
    IVec iv;
    int rc;
    if ((rc = mat(x, n, 4, 0, &X)) || (rc = ivec(index, M, &iv)) || (rc = mat(y, n, 4, M, &Y))) return rc;
    for (int64_t m = 0; m < M; m++) {
        const int64_t r = iget(&iv, m);
        if (r < 0 || r >= X.rows) return R4D_E_INVALID;
    }
    for (int64_t m = 0; m < M; m++) memmove(ROW(Y, m, float), ROW(X, iget(&iv, m), float), (size_t)n * 4);
    return R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* rope: angle = (float)position * inv_freq[i] in f32, cos and sin in double rounded to f32,
 * (a, b) -> (a*cos - b*sin, a*sin + b*cos) with every product rounded (libref's arithmetic).
 * The cos/sin of a position are kept in a table keyed by the inv_freq values, so the layers of a
 * step after the first reuse them. */

static float *g_rope_tab = NULL;     /* [cap][half][2] */
static uint8_t *g_rope_have = NULL;  /* [cap] */
static float g_rope_freq[512];
static int64_t g_rope_half = 0, g_rope_cap = 0;

#define ROPE_CAP_MAX (1 << 20)

static int rope_table(const float *inv, int64_t half, int64_t need_cap) {
    if (half != g_rope_half || memcmp(inv, g_rope_freq, (size_t)half * 4)) {
        memcpy(g_rope_freq, inv, (size_t)half * 4);
        g_rope_half = half;
        if (g_rope_have) memset(g_rope_have, 0, (size_t)g_rope_cap);
    }
    if (need_cap > g_rope_cap) {
        if (need_cap > ROPE_CAP_MAX) return 0;
        int64_t cap = g_rope_cap ? g_rope_cap : 1024;
        while (cap < need_cap) cap *= 2;
        float *tab = (float *)malloc((size_t)(cap * 512 * 2) * 4);
        uint8_t *have = (uint8_t *)calloc((size_t)cap, 1);
        if (!tab || !have) {
            free(tab);
            free(have);
            return 0;
        }
        for (int64_t p = 0; p < g_rope_cap; p++)
            if (g_rope_have[p]) {
                memcpy(tab + p * 1024, g_rope_tab + p * 1024, (size_t)half * 8);
                have[p] = 1;
            }
        free(g_rope_tab);
        free(g_rope_have);
        g_rope_tab = tab;
        g_rope_have = have;
        g_rope_cap = cap;
    }
    return 1;
}

/* cs[i] = cos, cs[half + i] = sin of position * inv[i] */
static void rope_angles(const float *inv, int64_t half, int64_t pos, float *cs) {
    const float p = (float)pos;
    for (int64_t i = 0; i < half; i++) {
        const float angle = p * inv[i];
        cs[i] = (float)cos((double)angle);
        cs[half + i] = (float)sin((double)angle);
    }
}

/* (a, b) -> (a*cos - b*sin, a*sin + b*cos), every product rounded, no FMA: written with intrinsics
 * because GCC's vectoriser turns the interleaved form into a complex multiply with vfmaddsub. */
static void rotate(float *x, int64_t heads, int64_t D, int interleaved, const float *cs) {
    const int64_t half = D / 2;
    const float *C = cs, *S = cs + half;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * D;
        int64_t i = 0;
#ifdef R4D_AVX2
        for (; i + 8 <= half; i += 8) {
            __m256 c = _mm256_loadu_ps(C + i), sn = _mm256_loadu_ps(S + i);
            if (interleaved) {
                const __m256 x0 = _mm256_loadu_ps(v + 2 * i), x1 = _mm256_loadu_ps(v + 2 * i + 8);
                const __m256 a = _mm256_shuffle_ps(x0, x1, 0x88), b = _mm256_shuffle_ps(x0, x1, 0xDD);
                /* a, b hold pairs 0 1 4 5 | 2 3 6 7: cos and sin in the same order */
                c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(c), 0xD8));
                sn = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sn), 0xD8));
                const __m256 ra = _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, sn));
                const __m256 rb = _mm256_add_ps(_mm256_mul_ps(a, sn), _mm256_mul_ps(b, c));
                _mm256_storeu_ps(v + 2 * i, _mm256_unpacklo_ps(ra, rb));
                _mm256_storeu_ps(v + 2 * i + 8, _mm256_unpackhi_ps(ra, rb));
            } else {
                const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
                _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, sn)));
                _mm256_storeu_ps(v + half + i, _mm256_add_ps(_mm256_mul_ps(a, sn), _mm256_mul_ps(b, c)));
            }
        }
#endif
        for (; i < half; i++) {
            volatile float *pa = interleaved ? v + 2 * i : v + i; /* volatile: no pattern matching */
            volatile float *pb = interleaved ? v + 2 * i + 1 : v + i + half;
            const float a = *pa, b = *pb, c = C[i], sn = S[i];
            const float ac = a * c, bs = b * sn, as = a * sn, bc = b * c;
            *pa = ac - bs;
            *pb = as + bc;
        }
    }
}

typedef struct {
    const Mat *Q, *K;
    const IVec *positions;
    const float *inv;
    int64_t half, qh, kvh, D;
    int interleaved, cached;
} RopeTask;

static void rope_task(const void *context, int64_t lo, int64_t hi) {
    const RopeTask *t = (const RopeTask *)context;
    float local[1024];
    for (int64_t m = lo; m < hi; m++) {
        const int64_t p = iget(t->positions, m);
        const float *cs = local;
        if (t->cached)
            cs = g_rope_tab + p * 1024;
        else
            rope_angles(t->inv, t->half, p, local);
        rotate(ROW(*t->Q, m, float), t->qh, t->D, t->interleaved, cs);
        rotate(ROW(*t->K, m, float), t->kvh, t->D, t->interleaved, cs);
    }
}

int r4d_rope(Arr *q, Arr *k, const Arr *positions, const Arr *inv_freq, int64_t M, int64_t qh, int64_t kvh,
             int64_t D, int interleaved) {
    Mat Q, Kk, F;
    IVec pos;
    int rc;
    if (D % 2 || D / 2 > 512) return R4D_E_SHAPE;
    const int64_t half = D / 2;
    if ((rc = mat(q, qh * D, 4, M, &Q)) || (rc = mat(k, kvh * D, 4, M, &Kk)) || (rc = ivec(positions, M, &pos)) ||
        (rc = mat(inv_freq, half, 4, 1, &F)))
        return rc;
    const float *inv = (const float *)F.p;
    int64_t maxpos = -1, minpos = 0;
    for (int64_t m = 0; m < M; m++) {
        const int64_t p = iget(&pos, m);
        maxpos = p > maxpos ? p : maxpos;
        minpos = p < minpos ? p : minpos;
    }
    const int cached = minpos >= 0 && rope_table(inv, half, maxpos + 1);
    if (cached)
        for (int64_t m = 0; m < M; m++) {
            const int64_t p = iget(&pos, m);
            if (!g_rope_have[p]) {
                rope_angles(inv, half, p, g_rope_tab + p * 1024);
                g_rope_have[p] = 1;
            }
        }
    const RopeTask task = {&Q, &Kk, &pos, inv, half, qh, kvh, D, interleaved, cached};
    pool_run(rope_task, &task, M, 1, nthreads_for(M * (qh + kvh) * D, 1 << 13));
    return R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* attention over a paged cache. Stores k, v at slots, then for each (token, head): scores
 * q . k (f32 dot products, vectorised over head_dim with FMA) times scale, e_j = exp(s_j - max)
 * in double rounded to f32, total = sum e_j in key order, out = (sum_j e_j * v_j) / total with
 * the sum over keys in key order, each product rounded (libref's order). */

/* One query head over its visible keys: scores, softmax weights, weighted value sum.
 * `rows_k[j]`, `rows_v[j]` point at the head's D elements of key j: floats, or f16 where `half`
 * (widened exactly, so the arithmetic is the f32 cache's on the rounded values). sc: L floats of
 * scratch. */
#define ATT_PF 16 /* keys ahead whose K and V rows the first head of a group prefetches */

/* 16 (8) elements of a cached row from element d, as floats */
#ifdef R4D_AVX512
static inline __m512 cache16(const void *row, int64_t d, const int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d)))
                : _mm512_loadu_ps((const float *)row + d);
}
#endif
#ifdef R4D_AVX2
static inline __m256 cache8(const void *row, int64_t d, const int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)))
                : _mm256_loadu_ps((const float *)row + d);
}
#endif
static inline float cache1(const void *row, int64_t d, const int half) {
    return half ? h2f(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)row + b);
}

static inline __attribute__((always_inline)) void head_attend(const float *qv, const void *const *rows_k,
                                                             const void *const *rows_v, int64_t L, const int64_t D,
                                                             const int half, float fscale, float *sc, float *o,
                                                             int prefetch) {
    const int64_t bytes = D * (half ? 2 : 4); /* of a cached row */
    int64_t j = 0;
    if (prefetch) /* the cache rows of a sequence are cold after a token's weights streamed past */
        for (int64_t u = 0; u < ATT_PF && u < L; u++) {
            prefetch_row(rows_k[u], bytes);
            prefetch_row(rows_v[u], bytes);
        }
#ifdef R4D_AVX512
    if (D % 16 == 0) {
        for (; j + 8 <= L; j += 8) { /* 8 keys at once, 16 dimensions a step, then as below */
            if (prefetch)
                for (int64_t u = j + ATT_PF; u < j + ATT_PF + 8 && u < L; u++) {
                    prefetch_row(rows_k[u], bytes);
                    prefetch_row(rows_v[u], bytes);
                }
            __m512 w[8];
            for (int u = 0; u < 8; u++) w[u] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 16) {
                const __m512 q16 = _mm512_loadu_ps(qv + d);
                for (int u = 0; u < 8; u++) w[u] = _mm512_fmadd_ps(q16, cache16(rows_k[j + u], d, half), w[u]);
            }
            __m256 a[8];
            for (int u = 0; u < 8; u++) a[u] = _mm256_add_ps(_mm512_castps512_ps256(w[u]), high8_ps(w[u]));
            const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            const __m256 t2 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(t0, t2, 0x20), _mm256_permute2f128_ps(t0, t2, 0x31));
            _mm256_storeu_ps(sc + j, _mm256_mul_ps(r, _mm256_set1_ps(fscale)));
        }
    }
#endif
#ifdef R4D_AVX2
    if (D % 8 == 0) {
        for (; j + 8 <= L; j += 8) { /* 8 keys at once, reduced by a transpose of sums */
            if (prefetch)
                for (int64_t u = j + ATT_PF; u < j + ATT_PF + 8 && u < L; u++) {
                    prefetch_row(rows_k[u], bytes);
                    prefetch_row(rows_v[u], bytes);
                }
            __m256 a[8];
            for (int u = 0; u < 8; u++) a[u] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 q8 = _mm256_loadu_ps(qv + d);
                for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(q8, cache8(rows_k[j + u], d, half), a[u]);
            }
            const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            const __m256 t2 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(t0, t2, 0x20), _mm256_permute2f128_ps(t0, t2, 0x31));
            _mm256_storeu_ps(sc + j, _mm256_mul_ps(r, _mm256_set1_ps(fscale)));
        }
    }
#endif
    for (; j < L; j++) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += qv[d] * cache1(rows_k[j], d, half);
        sc[j] = dot * fscale;
    }
    float mx = -INFINITY;
    for (j = 0; j < L; j++) mx = sc[j] > mx ? sc[j] : mx;
    j = 0;
#ifdef R4D_AVX512
    const __m512 vmx16 = _mm512_set1_ps(mx);
    for (; j + 16 <= L; j += 16) _mm512_storeu_ps(sc + j, exp_f64_ps16(_mm512_sub_ps(_mm512_loadu_ps(sc + j), vmx16)));
#endif
#ifdef R4D_AVX2
    const __m256 vmx = _mm256_set1_ps(mx);
    for (; j + 8 <= L; j += 8) _mm256_storeu_ps(sc + j, exp_f64_ps(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vmx)));
#endif
    for (; j < L; j++) sc[j] = (float)exp((double)(sc[j] - mx));
    float total = sc[0];
    for (j = 1; j < L; j++) total = total + sc[j];
#ifdef R4D_AVX512
    if (D % 16 == 0 && D <= 256) { /* each output element adds its products in key order, as below */
        __m512 acc[16];
        for (int64_t d = 0; d < D / 16; d++) acc[d] = _mm512_setzero_ps();
        for (j = 0; j < L; j++) {
            const __m512 e = _mm512_set1_ps(sc[j]);
            const void *vr = rows_v[j];
            for (int64_t d = 0; d < D / 16; d++) acc[d] = _mm512_fmadd_ps(e, cache16(vr, 16 * d, half), acc[d]);
        }
        const __m512 inv = _mm512_set1_ps(total);
        for (int64_t d = 0; d < D / 16; d++) _mm512_storeu_ps(o + 16 * d, _mm512_div_ps(acc[d], inv));
        return;
    }
#endif
#ifdef R4D_AVX2
    if (D % 8 == 0 && D <= 256) {
        __m256 acc[32];
        for (int64_t d = 0; d < D / 8; d++) acc[d] = _mm256_setzero_ps();
        for (j = 0; j < L; j++) {
            const __m256 e = _mm256_broadcast_ss(sc + j);
            const void *vr = rows_v[j];
            for (int64_t d = 0; d < D / 8; d++) acc[d] = _mm256_fmadd_ps(e, cache8(vr, 8 * d, half), acc[d]);
        }
        const __m256 inv = _mm256_set1_ps(total);
        for (int64_t d = 0; d < D / 8; d++) _mm256_storeu_ps(o + 8 * d, _mm256_div_ps(acc[d], inv));
        return;
    }
#endif
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (j = 0; j < L; j++)
        for (int64_t d = 0; d < D; d++) o[d] += sc[j] * cache1(rows_v[j], d, half);
    for (int64_t d = 0; d < D; d++) o[d] = o[d] / total;
}

/* the common head sizes and the cache's two types compiled as constants */
static void head_attend_any(const float *qv, const void *const *rk, const void *const *rv, int64_t L, int64_t D,
                            int half, float fscale, float *sc, float *o, int prefetch) {
#define HEAD_ATTEND(dim, h) head_attend(qv, rk, rv, L, dim, h, fscale, sc, o, prefetch)
    if (half) {
        switch (D) {
        case 64: HEAD_ATTEND(64, 1); break;
        case 128: HEAD_ATTEND(128, 1); break;
        default: HEAD_ATTEND(D, 1); break;
        }
    } else {
        switch (D) {
        case 64: HEAD_ATTEND(64, 0); break;
        case 128: HEAD_ATTEND(128, 0); break;
        default: HEAD_ATTEND(D, 0); break;
        }
    }
#undef HEAD_ATTEND
}

typedef struct {
    const Mat *Q, *KC, *VC, *O;
    const IVec *positions, *context_lens;
    const ITab *tables;
    const int64_t *seq_of;
    int64_t KVH, group, D, bs, maxlen;
    int per_head; /* items are (token, query head), not (token, kv head) */
    int half;     /* the cache holds f16, not f32 */
    int64_t window; /* > 0: a token at position p sees positions p - window < j <= p (sliding_attention) */
    float scale;
    _Atomic int failed;
} AttentionTask;

static void attention_task(const void *context, int64_t lo, int64_t hi) {
    AttentionTask *a = (AttentionTask *)context;
    const int64_t KVH = a->KVH, D = a->D, bs = a->bs, group = a->group, maxlen = a->maxlen;
    /* this thread's: the scores of one head, the row pointers of one sequence's keys and values */
    const int64_t scores = (maxlen + 8 + 15) & ~(int64_t)15; /* floats, so the pointers after them stay aligned */
    float *sc = (float *)thread_buffer((size_t)scores * sizeof(float) + (size_t)(2 * maxlen) * sizeof(void *));
    if (!sc) {
        atomic_store(&a->failed, 1);
        return;
    }
    const void **rk = (const void **)(sc + scores), **rv = rk + maxlen;
    const int64_t esz = a->half ? 2 : 4; /* bytes of a cached element */
    const int64_t per_item = a->per_head ? 1 : group; /* query heads an item attends with */
    for (int64_t it = lo; it < hi; it++) {
        const int64_t heads = KVH * group / per_item; /* items per token */
        const int64_t t = it / heads, h0 = (it % heads) * per_item, g = h0 / group, s = a->seq_of[t];
        if (s < 0) continue; /* a token of no sequence: left as it is */
        const int64_t len = iget(a->context_lens, s), p = iget(a->positions, t);
        const int64_t L = p + 1 < len ? p + 1 : len;
        /* the first visible key: past the window's start, or 0 (the masked keys' exp would be 0,
         * and x + 0 = x, so skipping them gives libref's masked softmax) */
        const int64_t first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        const int64_t off = g * D * esz; /* bytes into a cached row */
        if (L - first <= 0) {
            for (int64_t hh = 0; hh < per_item; hh++)
                for (int64_t d = 0; d < D; d++) ROW(*a->O, t, float)[(h0 + hh) * D + d] = NAN;
            continue;
        }
        for (int64_t j0 = first / bs * bs; j0 < L; j0 += bs) {
            const int64_t base = tget(a->tables, s, j0 / bs) * bs, jn = L - j0 < bs ? L - j0 : bs;
            for (int64_t jj = 0; jj < jn; jj++) {
                rk[j0 + jj] = ROW(*a->KC, base + jj, const char) + off;
                rv[j0 + jj] = ROW(*a->VC, base + jj, const char) + off;
            }
        }
        for (int64_t hh = 0; hh < per_item; hh++)
            head_attend_any(ROW(*a->Q, t, const float) + (h0 + hh) * D, rk + first, rv + first, L - first, D,
                            a->half, a->scale, sc, ROW(*a->O, t, float) + (h0 + hh) * D, hh == 0);
    }
}

/* attention (window 0) and sliding_attention (window > 0: each token sees its last `window` positions) */
static int attend(const Arr *q, const Arr *k, const Arr *v, Arr *kc, Arr *vc, const Arr *slots, const Arr *positions,
                  const Arr *cu_seqlens, const Arr *context_lens, const Arr *block_tables, Arr *out, int64_t M,
                  int64_t H, int64_t KVH, int64_t D, int64_t bs, double scale, int64_t window) {
    Mat Q, Kn, Vn, KC, VC, O;
    IVec sl, pos, cu, ctx;
    ITab bt;
    int rc;
    const int64_t kvw = KVH * D;
    if (KVH < 1 || H % KVH || bs < 1 || window < 0) return R4D_E_SHAPE;
    /* the cache: f32, or f16 (2-byte elements: rows.py hands over no other 2-byte type) */
    const int half = kc && kc->nd >= 1 && kc->strides[kc->nd - 1] == 2;
    const int64_t esz = half ? 2 : 4;
    if ((rc = mat(q, H * D, 4, M, &Q)) || (rc = mat(k, kvw, 4, M, &Kn)) || (rc = mat(v, kvw, 4, M, &Vn)) ||
        (rc = mat(kc, kvw, esz, 0, &KC)) || (rc = mat(vc, kvw, esz, 0, &VC)) || (rc = mat(out, H * D, 4, M, &O)) ||
        (rc = ivec(slots, M, &sl)) || (rc = ivec(positions, M, &pos)) || (rc = ivec(cu_seqlens, 1, &cu)) ||
        (rc = ivec(context_lens, cu.n - 1, &ctx)) || (rc = itab(block_tables, &bt)))
        return rc;
    const int64_t nseq = cu.n - 1;
    if (bt.rows < nseq) return R4D_E_SHAPE;
    for (int64_t m = 0; m < M; m++) {
        const int64_t s = iget(&sl, m);
        if (s < 0 || s >= KC.rows || s >= VC.rows) return R4D_E_INVALID;
        if (half) { /* rounded to nearest even, as numpy's astype(float16) in libref */
            store_f16(ROW(KC, s, uint16_t), ROW(Kn, m, const float), kvw);
            store_f16(ROW(VC, s, uint16_t), ROW(Vn, m, const float), kvw);
        } else {
            memcpy(ROW(KC, s, float), ROW(Kn, m, float), (size_t)kvw * 4);
            memcpy(ROW(VC, s, float), ROW(Vn, m, float), (size_t)kvw * 4);
        }
    }
    /* which sequence each token belongs to, and the longest visible context */
    int64_t *seq_of = (int64_t *)malloc((size_t)(M > 0 ? M : 1) * sizeof(int64_t));
    if (!seq_of) return R4D_E_NOMEM;
    int64_t maxlen = 1;
    for (int64_t m = 0; m < M; m++) seq_of[m] = -1;
    for (int64_t s = 0; s < nseq; s++) {
        const int64_t t0 = iget(&cu, s), t1 = iget(&cu, s + 1), len = iget(&ctx, s);
        if (t0 < 0 || t1 > M || t0 > t1 || len < 0 || (len + bs - 1) / bs > bt.cols) {
            free(seq_of);
            return R4D_E_INVALID;
        }
        for (int64_t t = t0; t < t1; t++) seq_of[t] = s;
        maxlen = len > maxlen ? len : maxlen;
    }
    /* every slot a sequence reads must lie inside the cache */
    for (int64_t s = 0; s < nseq; s++) {
        const int64_t len = iget(&ctx, s);
        for (int64_t blk = 0; blk < (len + bs - 1) / bs; blk++) {
            const int64_t b = tget(&bt, s, blk);
            const int64_t last = b * bs + (len - blk * bs < bs ? len - blk * bs : bs) - 1;
            if (b < 0 || last >= KC.rows || last >= VC.rows) {
                free(seq_of);
                return R4D_E_INVALID;
            }
        }
    }
    /* (token, kv head) items, each cached row read once for its group of query heads; where that
     * leaves fewer items than threads (decode: one token, fewer kv heads than threads), (token,
     * query head) items, a kv head's rows read once per query head (from cache after the first).
     * SmolLM2's decode (3 kv heads, 2 threads) takes its kv heads, one thread two of them: attention
     * 1.76-1.89 ms a token against 2.03-2.15 with its 9 query heads shared out (profiled decodes,
     * alternated; bench/results/host_avx512_2026-12-03b.md): the cached rows come from memory once. */
    const int nt = nthreads_for(M * H * maxlen * D, 1 << 14);
    const int per_head = nt > 1 && M * KVH < nt;
    AttentionTask task = {&Q, &KC, &VC, &O, &pos, &ctx, &bt, seq_of, KVH, H / KVH, D, bs, maxlen, per_head, half,
                          window, (float)scale, 0};
    pool_run(attention_task, &task, per_head ? M * H : M * KVH, 1, nt);
    free(seq_of);
    return atomic_load(&task.failed) ? R4D_E_NOMEM : R4D_OK;
}

int r4d_attention(const Arr *q, const Arr *k, const Arr *v, Arr *kc, Arr *vc, const Arr *slots, const Arr *positions,
                  const Arr *cu_seqlens, const Arr *context_lens, const Arr *block_tables, Arr *out, int64_t M,
                  int64_t H, int64_t KVH, int64_t D, int64_t bs, double scale) {
    return attend(q, k, v, kc, vc, slots, positions, cu_seqlens, context_lens, block_tables, out, M, H, KVH, D, bs,
                  scale, 0);
}

/* y[i] = exp(y[i]) for n doubles, exp_pd's bits (r4d_gemma.c's gelu_tanh_mul) */
void r4d_exp_f64(double *y, int64_t n) {
    int64_t i = 0;
#ifdef R4D_AVX512
    for (; i + 8 <= n; i += 8) _mm512_storeu_pd(y + i, exp_pd512(_mm512_loadu_pd(y + i)));
#endif
#ifdef R4D_AVX2
    for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, exp_pd(_mm256_loadu_pd(y + i)));
#endif
    for (; i < n; i++) y[i] = exp(y[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* sample's ordering: out = np.argsort(-v, kind="stable") for n values (ties by index; -0.0 and
 * +0.0 equal; NaN after everything). A stable LSD radix sort, 11 + 11 + 10 bits, of the negated
 * values' order-preserving bits. */

int r4d_argsort_desc(const float *v, int64_t n, int64_t *out) {
    if (n <= 0) return R4D_OK;
    if (n > 0xffffffffLL) return R4D_E_SHAPE;
    uint32_t *k0 = (uint32_t *)malloc((size_t)n * 4), *k1 = (uint32_t *)malloc((size_t)n * 4);
    uint32_t *i0 = (uint32_t *)malloc((size_t)n * 4), *i1 = (uint32_t *)malloc((size_t)n * 4);
    if (!k0 || !k1 || !i0 || !i1) {
        free(k0), free(k1), free(i0), free(i1);
        return R4D_E_NOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        float f = -v[i] + 0.0f;
        uint32_t b;
        memcpy(&b, &f, 4);
        if (f != f) b = 0x7fc00000u; /* one positive NaN */
        k0[i] = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
        i0[i] = (uint32_t)i;
    }
    static const int shift[3] = {0, 11, 22};
    for (int pass = 0; pass < 3; pass++) {
        int64_t count[2048];
        memset(count, 0, sizeof count);
        const int s = shift[pass];
        for (int64_t i = 0; i < n; i++) count[(k0[i] >> s) & 2047]++;
        int64_t total = 0;
        for (int d = 0; d < 2048; d++) {
            const int64_t c = count[d];
            count[d] = total;
            total += c;
        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t at = count[(k0[i] >> s) & 2047]++;
            k1[at] = k0[i];
            i1[at] = i0[i];
        }
        uint32_t *t = k0;
        k0 = k1, k1 = t;
        t = i0, i0 = i1, i1 = t;
    }
    for (int64_t i = 0; i < n; i++) out[i] = i0[i];
    free(k0), free(k1), free(i0), free(i1);
    return R4D_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* packed entry points: one int64 array per launch, prepared once per RadArgs by rows.py, so a
 * launch costs one ctypes argument. Pointers and array object addresses as integers, doubles by
 * their bits. */

static inline double bits_f64(int64_t v) {
    double d;
    memcpy(&d, &v, 8);
    return d;
}

#define PA(i) ((Arr *)(intptr_t)a[i])
#define PV(i) ((const void *)(intptr_t)a[i])

int r4d_embedding_p(const int64_t *a) { return r4d_embedding(PA(0), (int)a[1], PV(2), PV(3), PV(4), a[5], a[6], PA(7), a[8]); }
int r4d_gemv_p(const int64_t *a) {
    return r4d_gemv(PA(0), (int)a[1], PV(2), PV(3), PV(4), PA(5), a[6], a[7], a[8], (int)a[9]);
}
int r4d_gemm_p(const int64_t *a) { return r4d_gemm(PA(0), (int)a[1], PV(2), PV(3), PV(4), PA(5), a[6], a[7], a[8], (int)a[9]); }
int r4d_rmsnorm_p(const int64_t *a) { return r4d_rmsnorm(PA(0), PA(1), PA(2), a[3], a[4], bits_f64(a[5])); }
int r4d_add_p(const int64_t *a) { return r4d_add(PA(0), PA(1), PA(2), a[3], a[4]); }
int r4d_add_rmsnorm_p(const int64_t *a) { return r4d_add_rmsnorm(PA(0), PA(1), PA(2), PA(3), a[4], a[5], bits_f64(a[6])); }
int r4d_silu_mul_p(const int64_t *a) { return r4d_silu_mul(PA(0), PA(1), PA(2), a[3], a[4]); }
int r4d_take_rows_p(const int64_t *a) { return r4d_take_rows(PA(0), PA(1), PA(2), a[3], a[4]); }
int r4d_rope_p(const int64_t *a) { return r4d_rope(PA(0), PA(1), PA(2), PA(3), a[4], a[5], a[6], a[7], (int)a[8]); }
int r4d_attention_p(const int64_t *a) {
    return r4d_attention(PA(0), PA(1), PA(2), PA(3), PA(4), PA(5), PA(6), PA(7), PA(8), PA(9), PA(10), a[11], a[12],
                         a[13], a[14], a[15], bits_f64(a[16]));
}
int r4d_sliding_attention_p(const int64_t *a) {
    return attend(PA(0), PA(1), PA(2), PA(3), PA(4), PA(5), PA(6), PA(7), PA(8), PA(9), PA(10), a[11], a[12], a[13],
                  a[14], a[15], bits_f64(a[16]), a[17]);
}
