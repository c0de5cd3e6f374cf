/* r4d_kquants.c: libr4d's rows for the GGUF block types imported as bit-stream encodings
 * (radiance.weights.formats): q4_0, q5_0, q5_1 (blocks of 32) and q2_k, q3_k, q4_k, q5_k, q6_k
 * (super-blocks of 256). Built into the same library as r4d.c (native.py compiles both); it
 * shares nothing with r4d.c but r4d_threads() and its thread pool (r4d_parallel).
 *
 * Every plane is read as stored: codes and sub-byte scales are little-endian bit streams along the
 * row (element i at bit i * bits), so 8 elements of b bits fill exactly b bytes. A row is decoded to
 * f32 exactly as the core decoder does (radiance/weights/decode.py), in its order and in f32:
 *
 *     v = (code - zero) * scale * scale.1 - min * min.1
 *
 * with zero 8 (q4_0), 16 (q5_0), 4 (q3_k), 32 (q6_k), else none, and min stored negated where GGUF
 * adds it (q5_1). The embedding therefore equals libref's bit for bit; the GEMV and GEMM decode
 * panels of 4 weight rows into a thread's buffer and take f32 FMA dot products with every
 * activation row (libref's values, another summation order: within docs/LIBR4D.md's f32 tolerance).
 */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KQ_AVX2 1
#endif

#define KQ_OK 0
#define KQ_E_SHAPE (-3)
#define KQ_E_INVALID (-4)
#define KQ_E_NOMEM (-5)

/* formats: rows_kquants.FORMAT_CODES */
enum { KQ_Q4_0 = 1, KQ_Q5_0, KQ_Q5_1, KQ_Q2_K, KQ_Q3_K, KQ_Q4_K, KQ_Q5_K, KQ_Q6_K, KQ_LAST = KQ_Q6_K };

#define PANEL 24 /* weight rows decoded together, then r4d.c's register tiles over every activation row */

int r4d_threads(void); /* r4d.c */
/* r4d.c: fn(ctx, begin, end) over [0, items) in chunks of whole units on libr4d's thread pool */
void r4d_parallel(void (*fn)(const void *, int64_t, int64_t), const void *ctx, int64_t items, int64_t unit,
                  int threads);
/* r4d.c: y[m, j] = x[m] . panel[j] for m < M, j < np, with the q4_1 GEMM's register tiles */
void r4d_panel_tiles(const float *panel, int64_t kp, int64_t np, int64_t K, const float *x, int64_t ldx, int64_t M,
                     float *y, int64_t ldy);

#include "r4d_view.h"

static inline float kq_h2f(uint16_t h) {
#ifdef KQ_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            uint32_t m = man;
            do { e++; m <<= 1; } while (!(m & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline uint16_t f16_at(const uint8_t *p, int64_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return h;
}

/* element j of a little-endian stream of b-bit elements (b <= 8) */
static inline unsigned bits_at(const uint8_t *p, int64_t j, int b) {
    const int64_t pos = j * b;
    unsigned v = p[pos >> 3];
    const int shift = (int)(pos & 7);
    if (shift + b > 8) v |= (unsigned)p[(pos >> 3) + 1] << 8;
    return (v >> shift) & ((1u << b) - 1);
}

/* 8 consecutive b-bit elements from the b bytes at p (element 8g starts on a byte) */
static inline __attribute__((always_inline)) void unpack8(const uint8_t *p, int b, uint8_t *out) {
    uint64_t v = 0;
    memcpy(&v, p, (size_t)b);
    const uint64_t mask = (1u << b) - 1;
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((v >> (i * b)) & mask);
}

typedef struct {
    int fmt;
    const uint8_t *codes, *scale, *scale1, *min, *min1;
    int64_t rows, cols;
} KW;

static int code_bits(int fmt) {
    switch (fmt) {
    case KQ_Q4_0: case KQ_Q4_K: return 4;
    case KQ_Q5_0: case KQ_Q5_1: case KQ_Q5_K: return 5;
    case KQ_Q2_K: return 2;
    case KQ_Q3_K: return 3;
    case KQ_Q6_K: return 6;
    }
    return 0;
}

static int64_t block_of(int fmt) { return fmt <= KQ_Q5_1 ? 32 : 256; }

static int kw_check(const KW *w) {
    if (w->fmt < KQ_Q4_0 || w->fmt > KQ_LAST || !w->codes || !w->scale) return KQ_E_INVALID;
    if (w->cols <= 0 || w->cols % block_of(w->fmt)) return KQ_E_SHAPE;
    if (w->fmt >= KQ_Q2_K && !w->scale1) return KQ_E_INVALID;
    if ((w->fmt == KQ_Q5_1 || w->fmt == KQ_Q2_K || w->fmt == KQ_Q4_K || w->fmt == KQ_Q5_K) && !w->min) return KQ_E_INVALID;
    if ((w->fmt == KQ_Q2_K || w->fmt == KQ_Q4_K || w->fmt == KQ_Q5_K) && !w->min1) return KQ_E_INVALID;
    return KQ_OK;
}

#ifdef KQ_AVX2
/* the 8 b-bit codes in the b bytes at p as int32 lanes: the b bytes (read exactly: no byte past
 * them, a plane may end a mapping) broadcast, each lane's two bytes picked by a shuffle, shifted
 * by its bit offset and masked */
#define KQ_AT(i, b) ((char)(((i) * (b)) >> 3))
#define KQ_PAIR(i, b) KQ_AT(i, b), (char)(KQ_AT(i, b) + 1), (char)-128, (char)-128
static inline __attribute__((always_inline)) uint64_t load_bytes(const uint8_t *p, int b) {
    /* assembled in registers: a memcpy of 3, 5 or 6 bytes into a word then read whole stalls on
     * store forwarding (measured 4x slower) */
    uint32_t word;
    uint16_t half;
    if (b >= 4) {
        memcpy(&word, p, 4);
        if (b == 4) return word;
        if (b == 5) return word | (uint64_t)p[4] << 32;
        memcpy(&half, p + 4, 2);
        return word | (uint64_t)half << 32; /* b == 6 */
    }
    memcpy(&half, p, 2);
    return b == 2 ? half : half | (uint32_t)p[2] << 16; /* b == 3 */
}

static inline __attribute__((always_inline)) __m256i codes8(const uint8_t *p, int b) {
    const uint64_t v = load_bytes(p, b);
    const __m256i word = _mm256_set1_epi64x((long long)v);
    const __m256i pick = _mm256_setr_epi8(KQ_PAIR(0, b), KQ_PAIR(1, b), KQ_PAIR(2, b), KQ_PAIR(3, b),
                                          KQ_PAIR(4, b), KQ_PAIR(5, b), KQ_PAIR(6, b), KQ_PAIR(7, b));
    const __m256i shift = _mm256_setr_epi32(0, b & 7, (2 * b) & 7, (3 * b) & 7, (4 * b) & 7, (5 * b) & 7,
                                            (6 * b) & 7, (7 * b) & 7);
    const __m256i pairs = _mm256_shuffle_epi8(word, pick);
    return _mm256_and_si256(_mm256_srlv_epi32(pairs, shift), _mm256_set1_epi32((1 << b) - 1));
}
#endif


/* EACH8(B, G0, G1, EXPR): for groups G0..G1-1 (of 4) of block j's 32 codes of B bits, f = the
 * codes as f32, EXPR (SUB / MUL steps, the core decoder's order), then stored at dst; 8 lanes at a
 * time with AVX2, one element at a time otherwise, the same operations either way */
#ifdef KQ_AVX2
#define EACH8(B, G0, G1, EXPR)                                                                   \
    for (int g = (G0); g < (G1); g++) {                                                          \
        __m256 f = _mm256_cvtepi32_ps(codes8(c + j * 4 * (B) + g * (B), (B)));                   \
        EXPR;                                                                                    \
        _mm256_storeu_ps(dst + 32 * j + 8 * g, f);                                               \
    }
#define SUB(f, v) f = _mm256_sub_ps(f, _mm256_set1_ps(v))
#define MUL(f, v) f = _mm256_mul_ps(f, _mm256_set1_ps(v))
#else
#define EACH8(B, G0, G1, EXPR)                                                                   \
    for (int g = (G0); g < (G1); g++) {                                                          \
        uint8_t u_[8];                                                                           \
        unpack8(c + j * 4 * (B) + g * (B), (B), u_);                                             \
        for (int i_ = 0; i_ < 8; i_++) {                                                         \
            float f = (float)u_[i_];                                                             \
            EXPR;                                                                                \
            dst[32 * j + 8 * g + i_] = f;                                                        \
        }                                                                                        \
    }
#define SUB(f, v) f = f - (v)
#define MUL(f, v) f = f * (v)
#endif

/* dst[K] = row n of the weight, the core decoder's f32 values */
static void kq_row(const KW *w, int64_t n, float *dst) {
    const int64_t K = w->cols;
    const int b = code_bits(w->fmt);
    const uint8_t *c = w->codes + n * (K * b / 8);
    switch (w->fmt) {
    case KQ_Q4_0:
    case KQ_Q5_0: { /* (q - zero) * d, d f16 per 32 */
        const uint8_t *sc = w->scale + n * (K / 32) * 2;
        for (int64_t j = 0; j < K / 32; j++) {
            const float d = kq_h2f(f16_at(sc, j));
            if (b == 4) EACH8(4, 0, 4, SUB(f, 8.0f); MUL(f, d))
            else EACH8(5, 0, 4, SUB(f, 16.0f); MUL(f, d))
        }
        return;
    }
    case KQ_Q5_1: { /* q * d - min, both f16 per 32 (min = GGUF's -m) */
        const uint8_t *sc = w->scale + n * (K / 32) * 2, *mn = w->min + n * (K / 32) * 2;
        for (int64_t j = 0; j < K / 32; j++) {
            const float d = kq_h2f(f16_at(sc, j)), m = kq_h2f(f16_at(mn, j));
            EACH8(5, 0, 4, MUL(f, d); SUB(f, m))
        }
        return;
    }
    case KQ_Q2_K: { /* q * sc * d - mn * dmin: u4 sc and mn per 16, f16 d and dmin per 256 */
        const uint8_t *sc = w->scale + n * (K / 32), *mn = w->min + n * (K / 32);
        const uint8_t *d1 = w->scale1 + n * (K / 256) * 2, *m1 = w->min1 + n * (K / 256) * 2;
        for (int64_t j = 0; j < K / 32; j++) {
            const float d = kq_h2f(f16_at(d1, j / 8)), dmin = kq_h2f(f16_at(m1, j / 8));
            const float s0 = (float)bits_at(sc, 2 * j, 4), m0 = (float)bits_at(mn, 2 * j, 4) * dmin;
            const float s1 = (float)bits_at(sc, 2 * j + 1, 4), m1v = (float)bits_at(mn, 2 * j + 1, 4) * dmin;
            EACH8(2, 0, 2, MUL(f, s0); MUL(f, d); SUB(f, m0))
            EACH8(2, 2, 4, MUL(f, s1); MUL(f, d); SUB(f, m1v))
        }
        return;
    }
    case KQ_Q3_K:
    case KQ_Q6_K: { /* (q - zero) * sc * d: i8 sc per 16, f16 d per 256 */
        const int8_t *sc = (const int8_t *)w->scale + n * (K / 16);
        const uint8_t *d1 = w->scale1 + n * (K / 256) * 2;
        for (int64_t j = 0; j < K / 32; j++) {
            const float d = kq_h2f(f16_at(d1, j / 8)), s0 = (float)sc[2 * j], s1 = (float)sc[2 * j + 1];
            if (b == 3) {
                EACH8(3, 0, 2, SUB(f, 4.0f); MUL(f, s0); MUL(f, d))
                EACH8(3, 2, 4, SUB(f, 4.0f); MUL(f, s1); MUL(f, d))
            } else {
                EACH8(6, 0, 2, SUB(f, 32.0f); MUL(f, s0); MUL(f, d))
                EACH8(6, 2, 4, SUB(f, 32.0f); MUL(f, s1); MUL(f, d))
            }
        }
        return;
    }
    case KQ_Q4_K:
    case KQ_Q5_K: { /* q * sc * d - mn * dmin: u6 sc and mn per 32, f16 d and dmin per 256 */
        const uint8_t *sc = w->scale + n * (K / 32) * 6 / 8, *mn = w->min + n * (K / 32) * 6 / 8;
        const uint8_t *d1 = w->scale1 + n * (K / 256) * 2, *m1 = w->min1 + n * (K / 256) * 2;
        for (int64_t j = 0; j < K / 32; j++) {
            const float d = kq_h2f(f16_at(d1, j / 8)), dmin = kq_h2f(f16_at(m1, j / 8));
            const float scale = (float)bits_at(sc, j, 6), minimum = (float)bits_at(mn, j, 6) * dmin;
            if (b == 4) EACH8(4, 0, 4, MUL(f, scale); MUL(f, d); SUB(f, minimum))
            else EACH8(5, 0, 4, MUL(f, scale); MUL(f, d); SUB(f, minimum))
        }
        return;
    }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* threads */

static int kq_threads_for(int64_t work, int64_t grain) {
    const int most = r4d_threads();
    int64_t t = work / (grain > 0 ? grain : 1);
    if (t < 1) t = 1;
    return (int)(t < most ? t : most);
}

/* ------------------------------------------------------------------------------------------ */
/* y[m, n] = sum_k x[m, k] w[n, k] for m < M: panels of PANEL rows decoded, then dot products */

typedef struct {
    const KW *w;
    const Mat *X;
    Mat *Y;
    int64_t M, K;
    _Atomic int failed;
} GemmTask;

/* rows [begin, end) of y (whole panels but the last): a chunk of the pool's */
static void gemm_task(const void *context, int64_t begin, int64_t end) {
    GemmTask *task = (GemmTask *)context;
    const int64_t K = task->K;
    float *panel = aligned_alloc(64, (size_t)((PANEL * K * 4 + 63) / 64 * 64));
    if (!panel) {
        atomic_store(&task->failed, 1);
        return;
    }
    for (int64_t n = begin; n < end; n += PANEL) {
        const int rows = (int)(end - n < PANEL ? end - n : PANEL);
        for (int r = 0; r < rows; r++) kq_row(task->w, n + r, panel + r * K);
        r4d_panel_tiles(panel, K, rows, K, (const float *)task->X->p, task->X->pitch / 4, task->M,
                        ROW(*task->Y, 0, float) + n, task->Y->pitch / 4);
    }
    free(panel);
}

int r4d_kq_gemm(const Arr *x, int fmt, const void *codes, const void *scale, const void *scale1, const void *min,
                const void *min1, Arr *y, int64_t M, int64_t N, int64_t K) {
    const KW w = {fmt, codes, scale, scale1, min, min1, N, K};
    Mat X, Y;
    int rc;
    if ((rc = kw_check(&w)) || (rc = mat(x, K, 4, M, &X)) || (rc = mat(y, N, 4, M, &Y))) return rc;
    if (M <= 0) return KQ_OK;
    /* each chunk decodes its panels once and reuses them for every activation row */
    GemmTask task = {&w, &X, &Y, M, K, 0};
    r4d_parallel(gemm_task, &task, N, PANEL, kq_threads_for(N * K * (M < 4 ? 4 : M), 1 << 16));
    return atomic_load(&task.failed) ? KQ_E_NOMEM : KQ_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The decode GEMV (M <= 16) on AVX-512 with VBMI and VNNI (vpdpwssd; a VBMI CPU without VNNI
 * takes r4d_kqgemv_avx2.h's path): integer dot products against r4d.c's int16 activations (per
 * block of 32: int16 codes, f32 step xd, f32 sum xs; shared with the q4_1 / q8_0 GEMVs that read
 * the same rows, as llama.cpp shares its Q8 activations). The weight is never decoded to f32:
 * 32 codes of b bits (4b bytes) are spread to 32 int16 lanes by one byte permutation (vpermb),
 * a per-lane shift and a mask, the zero subtracted in int16, then vpdpwssd with the activations
 * leaves the block's dot product in 16 int32 lanes, scaled in f32 by weight scale x activation
 * step. Formats: q4_0, q5_0 ((q - zero) d), q5_1 (q d - m), q4_k, q5_k (q sc d - mn dmin), q3_k,
 * q6_k ((q - zero) sc d, sc per 16); q2_k (its mins per 16) keeps the decoding path. The
 * arithmetic is the q8_0 GEMV's at aq=16: docs/LIBR4D.md's int16 tolerance. */

#ifdef KQ_AVX2
/* r4d.c: rows [0, M) of x as int16 per block of 32, natural order */
int r4d_act16(const Arr *x, int64_t M, int64_t K, const int16_t **xw, const float **xd, const float **xs);

#define KQ_MT 4 /* activation rows a weight row's codes are unpacked for at once */

static int kq_zero(int fmt) {
    switch (fmt) {
    case KQ_Q4_0: return 8;
    case KQ_Q5_0: return 16;
    case KQ_Q3_K: return 4;
    case KQ_Q6_K: return 32;
    }
    return 0;
}

static int kq_fast(int fmt) { return fmt != KQ_Q2_K; }

typedef struct {
    const KW *w;
    const int16_t *xw;
    const float *xd, *xs;
    const int32_t *xz; /* [M][nb] -zero x the block's int16 activations summed (q4_0, q5_0 on AVX-512) */
    const Mat *Y;
    int64_t M;
    const int16_t *xp; /* [M][nb / 2][64] the activations of block pairs, interleaved (kq_pair_rows) */
    const int32_t *xzp; /* [M][nb / 2][16] the pairs' xz in lanes 0 and 8 (q4_0, q5_0) */
} KGemvTask;
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI__) && defined(__AVX512VNNI__)
#define KQ_VBMI 1

static uint8_t kq_pick[9][64];   /* [b]: the two source bytes of each int16 lane (element i: bits b*i) */
static uint16_t kq_shift[9][32]; /* [b]: each lane's bit offset in its two bytes */
/* [b][half]: a pair of blocks (8b bytes), lane j of half h holding element 16h + j % 16 of block
 * j / 16: [block 0's elements 0-15 | block 1's 0-15], then the same of 16-31. The bit offsets
 * within their bytes are kq_shift's first 16 lanes twice (16b bits are whole bytes). */
static uint8_t kq_pick_pair[9][2][64];
static uint16_t kq_shift_pair[9][32];

__attribute__((constructor)) static void kq_tables(void) {
    for (int b = 1; b <= 8; b++)
        for (int i = 0; i < 32; i++) {
            kq_pick[b][2 * i] = (uint8_t)((b * i) >> 3);
            kq_pick[b][2 * i + 1] = (uint8_t)(((b * i) >> 3) + 1);
            kq_shift[b][i] = (uint16_t)((b * i) & 7);
            kq_shift_pair[b][i] = (uint16_t)((b * (i % 16)) & 7);
            for (int h = 0; h < 2; h++) {
                const int bit = 32 * b * (i / 16) + b * (16 * h + i % 16);
                kq_pick_pair[b][h][2 * i] = (uint8_t)(bit >> 3);
                kq_pick_pair[b][h][2 * i + 1] = (uint8_t)((bit >> 3) + 1);
            }
        }
}

/* the 32 b-bit elements of the 4b bytes at p as int16 lanes (reads only those bytes: a plane may
 * end a mapping) */
static inline __attribute__((always_inline)) __m512i kq_unpack(const uint8_t *p, int b) {
    const __m512i raw = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8((__mmask32)((1ULL << (4 * b)) - 1), p));
    const __m512i pairs = _mm512_permutexvar_epi8(_mm512_loadu_si512(kq_pick[b]), raw);
    const __m512i lanes = _mm512_srlv_epi16(pairs, _mm512_loadu_si512(kq_shift[b]));
    return _mm512_and_si512(lanes, _mm512_set1_epi16((short)((1 << b) - 1)));
}

/* out[j] = element j of a b-bit stream as f32 for j < count rounded up to 32 (out holds that
 * many); the bytes past the stream's last element are not read */
static void kq_unpack_f32(const uint8_t *p, int b, int64_t count, float *out) {
    for (int64_t j = 0; j < count; j += 32) {
        const int64_t n = count - j < 32 ? count - j : 32, bytes = (n * b + 7) / 8;
        const __m512i raw = _mm512_maskz_loadu_epi8(bytes >= 64 ? ~0ULL : (1ULL << bytes) - 1, p + j * b / 8);
        const __m512i pairs = _mm512_permutexvar_epi8(_mm512_loadu_si512(kq_pick[b]), raw);
        const __m512i v = _mm512_and_si512(_mm512_srlv_epi16(pairs, _mm512_loadu_si512(kq_shift[b])),
                                           _mm512_set1_epi16((short)((1 << b) - 1)));
        _mm512_storeu_ps(out + j, _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v))));
        _mm512_storeu_ps(out + j + 16, _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1))));
    }
}

/* [ds[0] x 8 | ds[1] x 8] */
static inline __m512 kq_pair(const float *ds) {
    double both;
    memcpy(&both, ds, sizeof both);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castpd_ps(_mm512_set1_pd(both)));
}

/* out[j] = the f16 at p + 2j as f32, j < count; out holds count rounded up to 16 (the last store is
 * whole: a masked store does not forward to the loads that soon read it, a stall measured as 18 % of
 * the q5_0 GEMV's samples at SmolLM2's K = 576) */
static inline void kq_f16_f32(const uint8_t *p, int64_t count, float *out) {
    int64_t j = 0;
    for (; j + 16 <= count; j += 16) _mm512_storeu_ps(out + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * j))));
    if (j < count) { /* the last few: a masked load reads only their bytes, zeros past them */
        const __mmask16 last = (__mmask16)((1u << (count - j)) - 1);
        _mm512_storeu_ps(out + j, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(last, p + 2 * j)));
    }
}

/* One weight row's scales: ws[j] (per 32, or per 16 where `halves`) and wm[b] (per 32, the min
 * subtracted; formats without one leave it), the core decoder's factors multiplied in f32. Called with a constant fmt (kq_gemv_rows' instances), so the switch folds away. */
static inline __attribute__((always_inline)) void kq_row_scales(const KW *w, const int fmt, int64_t n, float *ws,
                                                               float *wm) {
    const int64_t K = w->cols, nb = K / 32;
    switch (fmt) {
    case KQ_Q4_0:
    case KQ_Q5_0:
    case KQ_Q5_1:
        kq_f16_f32(w->scale + n * nb * 2, nb, ws);
        if (fmt == KQ_Q5_1) kq_f16_f32(w->min + n * nb * 2, nb, wm);
        return;
    case KQ_Q4_K:
    case KQ_Q5_K: {
        const int64_t ns = K / 256;
        float d[ns + 16], dmin[ns + 16];
        kq_f16_f32(w->scale1 + n * ns * 2, ns, d);
        kq_f16_f32(w->min1 + n * ns * 2, ns, dmin);
        kq_unpack_f32(w->scale + n * nb * 6 / 8, 6, nb, ws);
        kq_unpack_f32(w->min + n * nb * 6 / 8, 6, nb, wm);
        for (int64_t sb = 0; sb < ns; sb++) { /* 8 scales of 32 a super-block */
            _mm256_storeu_ps(ws + 8 * sb, _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * sb), _mm256_set1_ps(d[sb])));
            _mm256_storeu_ps(wm + 8 * sb, _mm256_mul_ps(_mm256_loadu_ps(wm + 8 * sb), _mm256_set1_ps(dmin[sb])));
        }
        return;
    }
    case KQ_Q3_K:
    case KQ_Q6_K: { /* 16 scales of 16 a super-block */
        const int64_t ns = K / 256;
        const int8_t *sc = (const int8_t *)w->scale + n * (K / 16);
        const uint8_t *d1 = w->scale1 + n * ns * 2;
        for (int64_t sb = 0; sb < ns; sb++) {
            const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * sb))));
            _mm512_storeu_ps(ws + 16 * sb, _mm512_mul_ps(v, _mm512_set1_ps(kq_h2f(f16_at(d1, sb)))));
        }
        return;
    }
    }
}

/* rows [n0, n1) of y[m, n] for m in [m0, m0 + mt), weights of format fmt (a constant: one instance
 * per format, its bit width, scale grouping and zero folded in; 1.1-1.2x the one loop for every
 * format on this Xeon, bench/results/host_avx512_2026-12-03.md) */
static inline __attribute__((always_inline)) void kq_gemv_rows(const KGemvTask *t, const int fmt, int64_t m0,
                                                              const int mt, int64_t n0, int64_t n1) {
    const KW *w = t->w;
    const int64_t K = w->cols, nb = K / 32;
    const int b = code_bits(fmt);
    const int halves = fmt == KQ_Q3_K || fmt == KQ_Q6_K;
    const int mins = fmt == KQ_Q5_1 || fmt == KQ_Q4_K || fmt == KQ_Q5_K;
    /* the zero: per 32 (q4_0, q5_0) it starts the block's int32 dot product as -zero x (the sum of
     * the block's int16 activations), t->xz, so the codes go in unshifted (exactly (q - z) . x);
     * per 16 (q3_k, q6_k) it is subtracted from the codes in int16 */
    const int zero_first = !halves && kq_zero(fmt);
    const int64_t row_bytes = K * b / 8;
    const __m512i zero = _mm512_set1_epi16((short)kq_zero(fmt));
    const __m512i pick = _mm512_loadu_si512(kq_pick[b]), shift = _mm512_loadu_si512(kq_shift[b]);
    const __m512i mask = _mm512_set1_epi16((short)((1 << b) - 1));
    const __mmask64 bytes = (__mmask64)((1ULL << (4 * b)) - 1), pair_bytes = (__mmask64)((1ULL << (8 * b)) - 1);
    const __m512i pick0 = _mm512_loadu_si512(kq_pick_pair[b][0]), pick1 = _mm512_loadu_si512(kq_pick_pair[b][1]);
    const __m512i pair_shift = _mm512_loadu_si512(kq_shift_pair[b]);
    float ws[2 * nb + 32], wm[nb + 32], ds[KQ_MT * 2 * nb + 16];
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *c = w->codes + n * row_bytes;
        if (n + 4 < n1)
            for (int64_t o = 0; o < row_bytes; o += 64) _mm_prefetch((const char *)(c + 4 * row_bytes + o), _MM_HINT_T0);
        kq_row_scales(w, fmt, n, ws, wm);
        for (int i = 0; i < mt; i++) { /* ds: each scale times its block's activation step */
            const float *xd = t->xd + (m0 + i) * nb;
            float *di = ds + i * (halves ? 2 : 1) * nb;
            int64_t j = 0;
            if (halves) {
                const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
                for (; j + 8 <= nb; j += 8)
                    _mm512_storeu_ps(di + 2 * j, _mm512_mul_ps(_mm512_loadu_ps(ws + 2 * j),
                                                               _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(xd + j)))));
                for (; j < nb; j++) di[2 * j] = ws[2 * j] * xd[j], di[2 * j + 1] = ws[2 * j + 1] * xd[j];
            } else { /* 16 at a time, the last few by a masked load of xd (ws and ds hold nb rounded up to 16) */
                for (; j < nb; j += 16) {
                    const __mmask16 in = nb - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - j)) - 1);
                    _mm512_storeu_ps(di + j, _mm512_mul_ps(_mm512_loadu_ps(ws + j), _mm512_maskz_loadu_ps(in, xd + j)));
                }
            }
        }
        __m512 a0[KQ_MT], a1[KQ_MT];
        for (int i = 0; i < mt; i++) a0[i] = a1[i] = _mm512_setzero_ps();
/* one block's int32 dot products (16 lanes) scaled into ACC */
#define KQ_BLOCK(blk, ACC)                                                                                  \
    do {                                                                                                    \
        __m512i q_ = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8((__mmask32)bytes, c + (blk) * 4 * b));  \
        q_ = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(pick, q_), shift), mask);            \
        if (halves && kq_zero(fmt)) q_ = _mm512_sub_epi16(q_, zero);                                      \
        for (int i = 0; i < mt; i++) {                                                                      \
            const __m512i x_ = _mm512_loadu_si512(t->xw + (m0 + i) * K + 32 * (blk));                       \
            const __m512i start_ = zero_first ? _mm512_castsi128_si512(_mm_cvtsi32_si128(t->xz[(m0 + i) * nb + (blk)])) \
                                              : _mm512_setzero_si512();                                     \
            const __m512i dot_ = _mm512_dpwssd_epi32(start_, q_, x_);                                        \
            const __m512 scale_ = halves ? kq_pair(ds + i * 2 * nb + 2 * (blk)) : _mm512_set1_ps(ds[i * nb + (blk)]); \
            ACC[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_), scale_, ACC[i]);                             \
        }                                                                                                   \
    } while (0)
/* KQ_TWO: blocks 2p, 2p + 1 at once (a scale per 32): their codes spread by kq_pick_pair, two vpdpwssd
 * against the interleaved activations (t->xp) leave block 2p's dot product in lanes 0-7 and 2p + 1's
 * in 8-15, so one conversion and one FMA with [ds_2p x 8 | ds_2p+1 x 8] scale both (as the q4_1
 * GEMV's pairs: 5.5 vector operations a block instead of 7) */
#define KQ_TWO(p, ACC)                                                                                     \
    do {                                                                                                    \
        const __m512i raw_ = _mm512_maskz_loadu_epi8(pair_bytes, c + (p) * 8 * b);                          \
        const __m512i q0_ = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(pick0, raw_), pair_shift), mask); \
        const __m512i q1_ = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(pick1, raw_), pair_shift), mask); \
        for (int i = 0; i < mt; i++) {                                                                      \
            const int16_t *x_ = t->xp + ((m0 + i) * (nb / 2) + (p)) * 64;                                    \
            const __m512i start_ = zero_first ? _mm512_loadu_si512(t->xzp + ((m0 + i) * (nb / 2) + (p)) * 16) \
                                              : _mm512_setzero_si512();                                     \
            const __m512i dot_ = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(start_, q0_, _mm512_loadu_si512(x_)), \
                                                     q1_, _mm512_loadu_si512(x_ + 32));                      \
            ACC[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_), kq_pair(ds + i * nb + 2 * (p)), ACC[i]);     \
        }                                                                                                   \
    } while (0)
        int64_t blk = 0;
        if (!halves) {
            for (; blk + 4 <= nb; blk += 4) { /* two accumulator sets: the FMAs' latency overlaps */
                KQ_TWO(blk / 2, a0);
                KQ_TWO(blk / 2 + 1, a1);
            }
            if (blk + 2 <= nb) {
                KQ_TWO(blk / 2, a0);
                blk += 2;
            }
        }
        for (; blk + 2 <= nb; blk += 2) { /* two accumulator sets: the FMAs' latency overlaps */
            KQ_BLOCK(blk, a0);
            KQ_BLOCK(blk + 1, a1);
        }
        if (blk < nb) KQ_BLOCK(blk, a0);
#undef KQ_BLOCK
#undef KQ_TWO
        for (int i = 0; i < mt; i++) {
            float minimum = 0.0f;
            if (mins) {
                const float *xs = t->xs + (m0 + i) * nb;
                __m512 mv = _mm512_setzero_ps();
                int64_t j = 0;
                for (; j + 16 <= nb; j += 16) mv = _mm512_fmadd_ps(_mm512_loadu_ps(wm + j), _mm512_loadu_ps(xs + j), mv);
                minimum = _mm512_reduce_add_ps(mv);
                for (; j < nb; j++) minimum += wm[j] * xs[j];
            }
            ROW(*t->Y, m0 + i, float)[n] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i])) - minimum;
        }
    }
}

/* kq_gemv_rows for a constant format, mt = 1..KQ_MT */
#define KQ_ROWS_OF(FMT)                                                                                     \
    static void kq_rows_##FMT(const KGemvTask *t, int64_t lo, int64_t hi) {                                 \
        for (int64_t m0 = 0; m0 < t->M; m0 += KQ_MT) {                                                      \
            switch (t->M - m0 < KQ_MT ? t->M - m0 : KQ_MT) {                                                \
            case 1: kq_gemv_rows(t, FMT, m0, 1, lo, hi); break;                                             \
            case 2: kq_gemv_rows(t, FMT, m0, 2, lo, hi); break;                                             \
            case 3: kq_gemv_rows(t, FMT, m0, 3, lo, hi); break;                                             \
            default: kq_gemv_rows(t, FMT, m0, 4, lo, hi); break;                                            \
            }                                                                                               \
        }                                                                                                   \
    }
KQ_ROWS_OF(KQ_Q4_0)
KQ_ROWS_OF(KQ_Q5_0)
KQ_ROWS_OF(KQ_Q5_1)
KQ_ROWS_OF(KQ_Q3_K)
KQ_ROWS_OF(KQ_Q4_K)
KQ_ROWS_OF(KQ_Q5_K)
KQ_ROWS_OF(KQ_Q6_K)
#undef KQ_ROWS_OF

static void kq_gemv_task(const void *context, int64_t lo, int64_t hi) {
    const KGemvTask *t = (const KGemvTask *)context;
    switch (t->w->fmt) {
    case KQ_Q4_0: kq_rows_KQ_Q4_0(t, lo, hi); break;
    case KQ_Q5_0: kq_rows_KQ_Q5_0(t, lo, hi); break;
    case KQ_Q5_1: kq_rows_KQ_Q5_1(t, lo, hi); break;
    case KQ_Q3_K: kq_rows_KQ_Q3_K(t, lo, hi); break;
    case KQ_Q4_K: kq_rows_KQ_Q4_K(t, lo, hi); break;
    case KQ_Q5_K: kq_rows_KQ_Q5_K(t, lo, hi); break;
    case KQ_Q6_K: kq_rows_KQ_Q6_K(t, lo, hi); break;
    }
}
#elif defined(KQ_AVX2)
#include "r4d_kqgemv_avx2.h" /* kq_gemv_task on AVX2's vpmaddwd */
#endif

#ifdef KQ_VBMI
/* -zero x (the sum of each block's 32 int16 activations), [M][K / 32] int32, in a buffer of the
 * launching thread kept for its next launch; NULL when memory runs out */
static const int32_t *kq_zero_starts(const int16_t *xw, int64_t M, int64_t K, int zero) {
    static __thread int32_t *buffer;
    static __thread size_t have;
    const int64_t nb = K / 32;
    const size_t need = (size_t)(M * nb) * sizeof(int32_t);
    if (need > have) {
        free(buffer);
        have = (need + 63) & ~(size_t)63;
        if (!(buffer = aligned_alloc(64, have))) return have = 0, NULL;
    }
    const __m512i ones = _mm512_set1_epi16(1);
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < nb; j++) /* pairs summed in int32 (exact), then the 16 lanes */
            buffer[m * nb + j] = -zero * _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_loadu_si512(xw + m * K + 32 * j), ones));
    return buffer;
}
#endif

#ifdef KQ_VBMI
/* the activations of block pairs as KQ_TWO reads them: per row m and pair p, 64 int16
 * [x 0-15 | x 32-47 | x 16-31 | x 48-63] of the pair's 64 (*xp: KQ_TWO's halves), and where zero_starts is given the
 * pair's two zero starts in lanes 0 and 8 of 16 int32 (*xzp); buffers of the launching thread kept
 * for its next launch. -5 (KQ_E_NOMEM) when memory runs out. */
static int kq_pair_rows(const int16_t *xw, const int32_t *zero_starts, int64_t M, int64_t K, const int16_t **xp,
                        const int32_t **xzp) {
    static __thread int16_t *pairs;
    static __thread int32_t *starts;
    static __thread size_t have_pairs, have_starts;
    const int64_t np = K / 64;
    const size_t need = (size_t)(M * np) * 64 * sizeof(int16_t), need_starts = (size_t)(M * np) * 16 * sizeof(int32_t);
    if (need > have_pairs) {
        free(pairs);
        have_pairs = (need + 63) & ~(size_t)63;
        if (!(pairs = aligned_alloc(64, have_pairs))) return have_pairs = 0, KQ_E_NOMEM;
    }
    if (zero_starts && need_starts > have_starts) {
        free(starts);
        have_starts = (need_starts + 63) & ~(size_t)63;
        if (!(starts = aligned_alloc(64, have_starts))) return have_starts = 0, KQ_E_NOMEM;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t p = 0; p < np; p++) {
            const int16_t *x = xw + m * K + 64 * p;
            int16_t *out = pairs + (m * np + p) * 64;
            const __m512i a = _mm512_loadu_si512(x), c = _mm512_loadu_si512(x + 32); /* quarters 0 1 | 2 3 */
            _mm512_storeu_si512(out, _mm512_shuffle_i64x2(a, c, 0x44));      /* 0 2 */
            _mm512_storeu_si512(out + 32, _mm512_shuffle_i64x2(a, c, 0xee)); /* 1 3 */
            if (zero_starts) {
                const int32_t *z = zero_starts + m * (K / 32) + 2 * p;
                int32_t *s = starts + (m * np + p) * 16;
                memset(s, 0, 16 * sizeof(int32_t));
                s[0] = z[0], s[8] = z[1];
            }
        }
    *xp = pairs, *xzp = zero_starts ? starts : NULL;
    return KQ_OK;
}
#endif

/* r4d.c: y = x W^T on AMX int8 tiles against the GEMV's int16 activations, W's rows as `row` gives
 * them (K int8 codes, K / 32 scales and mins); -4 (KQ_E_INVALID) where AMX is not built or granted */
int r4d_amx_gemm(const Arr *x, int64_t M, int64_t N, int64_t K,
                 void (*row)(const void *, int64_t, int8_t *, float *, float *), const void *weight, int mins,
                 Arr *y);

/* r4d.c: the same for weights of int16 values with one scale per 256 (K / 256 of them) */
int r4d_amx_gemm256(const Arr *x, int64_t M, int64_t N, int64_t K, void (*row)(const void *, int64_t, int16_t *, float *),
                    const void *weight, Arr *y);

#ifdef KQ_VBMI
/* the formats of one scale (and min) per 32, which the AMX tiles take: q4_0, q5_0, q5_1, q4_k, q5_k */
static int kq_amx_format(int fmt) {
    return fmt == KQ_Q4_0 || fmt == KQ_Q5_0 || fmt == KQ_Q5_1 || fmt == KQ_Q4_K || fmt == KQ_Q5_K;
}

static int kq_has_mins(int fmt) { return fmt == KQ_Q5_1 || fmt == KQ_Q4_K || fmt == KQ_Q5_K; }

/* weight row n as r4d_amx_gemm takes it: the codes less the zero as int8 (b <= 5 bits: they fit),
 * the GEMV's scales and mins (kq_row_scales) */
static void kq_amx_row(const void *weight, int64_t n, int8_t *codes, float *scales, float *mins) {
    const KW *w = (const KW *)weight;
    const int fmt = w->fmt, b = code_bits(fmt);
    const int64_t K = w->cols, nb = K / 32;
    const uint8_t *c = w->codes + n * (K * b / 8);
    const __m512i zero = _mm512_set1_epi16((short)kq_zero(fmt));
    for (int64_t j = 0; j < nb; j++)
        _mm256_storeu_si256((__m256i *)(codes + 32 * j), _mm512_cvtepi16_epi8(_mm512_sub_epi16(kq_unpack(c + j * 4 * b, b), zero)));
    float ws[2 * nb + 32], wm[nb + 32];
    switch (fmt) {
    case KQ_Q4_0: kq_row_scales(w, KQ_Q4_0, n, ws, wm); break;
    case KQ_Q5_0: kq_row_scales(w, KQ_Q5_0, n, ws, wm); break;
    case KQ_Q5_1: kq_row_scales(w, KQ_Q5_1, n, ws, wm); break;
    case KQ_Q4_K: kq_row_scales(w, KQ_Q4_K, n, ws, wm); break;
    default: kq_row_scales(w, KQ_Q5_K, n, ws, wm); break;
    }
    memcpy(scales, ws, (size_t)nb * sizeof(float));
    if (kq_has_mins(fmt)) memcpy(mins, wm, (size_t)nb * sizeof(float));
}

/* weight row n of q6_k as r4d_amx_gemm256 takes it: (code - 32) x the int8 scale of each 16
 * (|v| <= 32 x 128), and the f16 super-block scales d as f32. (q3_k would take the same form; its
 * error against libref measured 0.9-1.3e-4 of the int16 tolerance's 2e-4, q6_k's 0.8-0.9e-4, so
 * q3_k keeps its f32 panels.) */
static void kq_amx_row256(const void *weight, int64_t n, int16_t *values, float *scales) {
    const KW *w = (const KW *)weight;
    const int b = code_bits(w->fmt);
    const int64_t K = w->cols, nb = K / 32;
    const uint8_t *c = w->codes + n * (K * b / 8);
    const int8_t *sc = (const int8_t *)w->scale + n * (K / 16);
    const __m512i zero = _mm512_set1_epi16((short)kq_zero(w->fmt));
    for (int64_t j = 0; j < nb; j++) { /* the block's two scales, 16 lanes each */
        const __m512i scale = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(sc[2 * j])),
                                                 _mm256_set1_epi16(sc[2 * j + 1]), 1);
        _mm512_storeu_si512(values + 32 * j, _mm512_mullo_epi16(_mm512_sub_epi16(kq_unpack(c + j * 4 * b, b), zero), scale));
    }
    kq_f16_f32(w->scale1 + n * (K / 256) * 2, K / 256, scales);
}
#endif

/* The prefill band: at aq 16 the AMX int8 tiles where they serve (an AMX build and kernel; formats
 * of one scale per 32 through r4d_amx_gemm, q6_k through r4d_amx_gemm256), else (and at aq 0)
 * r4d_kq_gemm's decoded f32 panels */
int r4d_kq_gemm_aq(const Arr *x, int fmt, const void *codes, const void *scale, const void *scale1, const void *min,
                   const void *min1, Arr *y, int64_t M, int64_t N, int64_t K, int aq) {
    if (aq != 0 && aq != 16) return KQ_E_INVALID;
#ifdef KQ_VBMI
    const KW w = {fmt, codes, scale, scale1, min, min1, N, K};
    if (aq == 16 && !kw_check(&w) && kq_amx_format(fmt) && M > 0) {
        const int rc = r4d_amx_gemm(x, M, N, K, kq_amx_row, &w, kq_has_mins(fmt), y);
        if (rc != KQ_E_INVALID) return rc;
    }
    if (aq == 16 && !kw_check(&w) && fmt == KQ_Q6_K && M > 0) {
        const int rc = r4d_amx_gemm256(x, M, N, K, kq_amx_row256, &w, y);
        if (rc != KQ_E_INVALID) return rc;
    }
#endif
    return r4d_kq_gemm(x, fmt, codes, scale, scale1, min, min1, y, M, N, K);
}

#ifdef KQ_AVX2
/* whether the integer GEMV serves w at `aq` (else r4d_kq_gemm's decoded f32 panels) */
static int kq_gemv_serves(const KW *w, int aq) {
    return aq == 16 && !kw_check(w) && kq_fast(w->fmt) && w->cols % 32 == 0;
}

/* the integer GEMV's task for w against rows [0, M) of x (M > 0) into Y: the activations from
 * r4d.c's cache, on AVX-512 the zero starts and pair rows too (the launching thread's buffers,
 * valid until its next launch: a second task of the same format reads the same ones) */
static int kq_gemv_prepare(const Arr *x, const KW *w, const Mat *Y, int64_t M, KGemvTask *task) {
    const int64_t K = w->cols;
    const int16_t *xw;
    const float *xd, *xs;
    int rc;
    if ((rc = r4d_act16(x, M, K, &xw, &xd, &xs))) return rc;
    *task = (KGemvTask){w, xw, xd, xs, NULL, Y, M, NULL, NULL};
#ifdef KQ_VBMI
    const int halves = w->fmt == KQ_Q3_K || w->fmt == KQ_Q6_K;
    if (kq_zero(w->fmt) && !halves && !(task->xz = kq_zero_starts(xw, M, K, kq_zero(w->fmt)))) return KQ_E_NOMEM;
    if (!halves && K >= 64 && (rc = kq_pair_rows(xw, task->xz, M, K, &task->xp, &task->xzp))) return rc;
#endif
    return KQ_OK;
}

static int64_t kq_gemv_bytes(const KW *w) { return w->rows * w->cols * code_bits(w->fmt) / 8; }
#endif

/* The decode band: the integer GEMV where it serves (aq 16, an AVX2 build (AVX-512 VBMI's above,
 * r4d_kqgemv_avx2.h's otherwise), not q2_k), else r4d_kq_gemm's decoded f32 panels (aq 0) */
int r4d_kq_gemv(const Arr *x, int fmt, const void *codes, const void *scale, const void *scale1, const void *min,
                const void *min1, Arr *y, int64_t M, int64_t N, int64_t K, int aq) {
#ifdef KQ_AVX2
    const KW w = {fmt, codes, scale, scale1, min, min1, N, K};
    Mat Y;
    int rc;
    if (kq_gemv_serves(&w, aq)) {
        if ((rc = mat(y, N, 4, M, &Y))) return rc;
        if (M <= 0) return KQ_OK;
        KGemvTask task;
        if ((rc = kq_gemv_prepare(x, &w, &Y, M, &task))) return rc;
        r4d_parallel(kq_gemv_task, &task, N, 16, kq_threads_for(kq_gemv_bytes(&w), 1 << 15));
        return KQ_OK;
    }
#endif
    if (aq != 0 && aq != 16) return KQ_E_INVALID;
    return r4d_kq_gemm(x, fmt, codes, scale, scale1, min, min1, y, M, N, K);
}

static int kq_gemv_of(const Arr *x, const KW *w, Arr *y, int64_t M, int aq) {
    return r4d_kq_gemv(x, w->fmt, w->codes, w->scale, w->scale1, w->min, w->min1, y, M, w->rows, w->cols, aq);
}

#ifdef KQ_AVX2
/* the rows of two GEMVs as one list: [0, split) the first's, [split, split + N2) the second's */
typedef struct {
    const KGemvTask *first, *second;
    int64_t split;
} KGemv2Task;

static void kq_gemv2_task(const void *context, int64_t lo, int64_t hi) {
    const KGemv2Task *t = (const KGemv2Task *)context;
    if (lo < t->split) kq_gemv_task(t->first, lo, hi < t->split ? hi : t->split);
    if (hi > t->split) kq_gemv_task(t->second, (lo > t->split ? lo : t->split) - t->split, hi - t->split);
}
#endif

/* y1 = x W1^T and y2 = x W2^T, the decode GEMVs of two weights of one format reading the same
 * activations (gate and up), in one parallel region: the activations prepared once, the pool woken
 * once, the rows of both weights shared out as one list. Each output row is computed as
 * r4d_kq_gemv computes it, so the bits are those of the two launches; where the integer GEMV does
 * not serve both, the two launches. */
int r4d_kq_gemv2(const Arr *x, const KW *w1, Arr *y1, const KW *w2, Arr *y2, int64_t M, int aq) {
    int rc;
#ifdef KQ_AVX2
    Mat Y1, Y2;
    if (kq_gemv_serves(w1, aq) && kq_gemv_serves(w2, aq) && w1->fmt == w2->fmt && w1->cols == w2->cols) {
        if ((rc = mat(y1, w1->rows, 4, M, &Y1)) || (rc = mat(y2, w2->rows, 4, M, &Y2))) return rc;
        if (M <= 0) return KQ_OK;
        KGemvTask first, second;
        if ((rc = kq_gemv_prepare(x, w1, &Y1, M, &first))) return rc;
        second = first; /* the same activations, zero starts and pairs (one format) */
        second.w = w2, second.Y = &Y2;
        const KGemv2Task task = {&first, &second, w1->rows};
        r4d_parallel(kq_gemv2_task, &task, w1->rows + w2->rows, 16,
                     kq_threads_for(kq_gemv_bytes(w1) + kq_gemv_bytes(w2), 1 << 15));
        return KQ_OK;
    }
#endif
    rc = kq_gemv_of(x, w1, y1, M, aq);
    return rc ? rc : kq_gemv_of(x, w2, y2, M, aq);
}

/* r4d.c's rows, for the fused chains below */
int r4d_rmsnorm(const Arr *x, const Arr *weight, Arr *y, int64_t M, int64_t n, double eps);
int r4d_silu_mul(const Arr *g, const Arr *u, Arr *y, int64_t M, int64_t n);
int r4d_add(const Arr *a, const Arr *b, Arr *y, int64_t M, int64_t n);

/* rmsnorm(x, norm, normed); y1 = normed W1^T; y2 = normed W2^T: the attention's norm and its q and k
 * projections (docs/OPS.md rmsnorm_gemm2; v, of another format in a Q4_K_M file, is its own launch),
 * each link by its own row's code, so the bits are the chain's */
int r4d_kq_rmsnorm_gemm2(const Arr *x, const Arr *norm, Arr *normed, const KW *w1, Arr *y1, const KW *w2, Arr *y2,
                         int64_t M, double eps, int aq) {
    const int rc = r4d_rmsnorm(x, norm, normed, M, w1->cols, eps);
    return rc ? rc : r4d_kq_gemv2(normed, w1, y1, w2, y2, M, aq);
}

/* the same with wg, gate, wu, up, then gate = silu(gate) * up: the FFN's front in one launch
 * (docs/OPS.md rmsnorm_gemm2_silu_mul) */
int r4d_kq_rmsnorm_gemm2_silu_mul(const Arr *x, const Arr *norm, Arr *normed, const KW *wg, Arr *gate,
                                  const KW *wu, Arr *up, int64_t M, double eps, int aq) {
    if (wg->rows != wu->rows) return KQ_E_SHAPE;
    const int rc = r4d_kq_rmsnorm_gemm2(x, norm, normed, wg, gate, wu, up, M, eps, aq);
    return rc ? rc : r4d_silu_mul(gate, up, gate, M, wg->rows);
}

/* y[m] = table[ids[m]]: ids int32 or int64 (the element size is the stride) */
int r4d_kq_embedding(const Arr *ids, int fmt, const void *codes, const void *scale, const void *scale1,
                     const void *min, const void *min1, int64_t vocab, int64_t n, Arr *y, int64_t M) {
    const KW w = {fmt, codes, scale, scale1, min, min1, vocab, n};
    Mat Y;
    int rc;
    if ((rc = kw_check(&w)) || (rc = mat(y, n, 4, M, &Y))) return rc;
    if (!ids || !ids->data || ids->nd < 1) return KQ_E_INVALID;
    int64_t count = 1; /* r4d.c's ivec(): the ids evenly strided, at least M of them */
    for (int i = 0; i < ids->nd; i++) count *= ids->dims[i];
    const int64_t stride = ids->strides[ids->nd - 1];
    if ((stride != 4 && stride != 8) || count < M) return KQ_E_SHAPE;
    if (ids->nd > 1 && ids->dims[0] > 1 && ids->strides[0] != stride * count / ids->dims[0]) return KQ_E_SHAPE;
    for (int64_t m = 0; m < M; m++) {
        const char *p = ids->data + m * stride;
        int64_t id;
        if (stride == 4) {
            int32_t v;
            memcpy(&v, p, 4);
            id = v;
        } else {
            memcpy(&id, p, 8);
        }
        if (id < 0 || id >= vocab) return KQ_E_INVALID;
        kq_row(&w, id, ROW(Y, m, float));
    }
    return KQ_OK;
}

/* packed-argument entry points (rows_kquants.py plans them once per RadArgs) */
#define KA(i) ((Arr *)(intptr_t)a[i])
#define KV(i) ((const void *)(intptr_t)a[i])

int r4d_kq_gemm_p(const int64_t *a) {
    return r4d_kq_gemm_aq(KA(0), (int)a[1], KV(2), KV(3), KV(4), KV(5), KV(6), KA(7), a[8], a[9], a[10], (int)a[11]);
}

int r4d_kq_gemv_p(const int64_t *a) {
    return r4d_kq_gemv(KA(0), (int)a[1], KV(2), KV(3), KV(4), KV(5), KV(6), KA(7), a[8], a[9], a[10], (int)a[11]);
}

/* y = x W^T; residual = residual + y: a projection and the residual add after it in one launch
 * (docs/OPS.md gemm_add), each by its own row's code, so the bits are the chain's */
int r4d_kq_gemv_add(const Arr *x, const KW *w, Arr *y, Arr *residual, int64_t M, int aq) {
    const int rc = kq_gemv_of(x, w, y, M, aq);
    return rc ? rc : r4d_add(residual, y, residual, M, w->rows);
}

/* a weight as rows_kquants.py packs it: format, the five plane pointers, rows, cols */
#define KWA(i) ((KW){(int)a[i], KV(i + 1), KV(i + 2), KV(i + 3), KV(i + 4), KV(i + 5), a[i + 6], a[i + 7]})

/* x, norm, normed, the first weight, its y, the second weight, its y, M, eps's bits, aq */
int r4d_kq_rmsnorm_gemm2_p(const int64_t *a) {
    const KW w1 = KWA(3), w2 = KWA(12);
    double eps;
    memcpy(&eps, &a[22], sizeof eps);
    return r4d_kq_rmsnorm_gemm2(KA(0), KA(1), KA(2), &w1, KA(11), &w2, KA(20), a[21], eps, (int)a[23]);
}

int r4d_kq_rmsnorm_gemm2_silu_mul_p(const int64_t *a) {
    const KW wg = KWA(3), wu = KWA(12);
    double eps;
    memcpy(&eps, &a[22], sizeof eps);
    return r4d_kq_rmsnorm_gemm2_silu_mul(KA(0), KA(1), KA(2), &wg, KA(11), &wu, KA(20), a[21], eps, (int)a[23]);
}

int r4d_kq_gemv_add_p(const int64_t *a) {
    const KW w = KWA(1);
    return r4d_kq_gemv_add(KA(0), &w, KA(9), KA(10), a[11], (int)a[12]);
}

int r4d_kq_embedding_p(const int64_t *a) {
    return r4d_kq_embedding(KA(0), (int)a[1], KV(2), KV(3), KV(4), KV(5), KV(6), a[7], a[8], KA(9), a[10]);
}
