/* r4d_kqgemv_avx2.h: the k-quant decode GEMV (M <= 16) on AVX2 (FMA, F16C): what r4d_kquants.c's
 * AVX-512 VBMI path does, with 256-bit integer dot products. Included by r4d_kquants.c where the
 * build targets AVX2 but not VBMI with VNNI; uses its KW, KGemvTask, KQ_MT, kq_zero, code_bits, codes8.
 *
 * Against r4d.c's int16 activations (per block of 32: int16 codes, f32 step xd, f32 sum xs; the
 * q8_0 GEMV's, shared with it). The weight is never decoded to f32: a block's 32 codes of b bits
 * (4b bytes, element i at bit b * i) are 4 groups of 8 that each start on a byte (group g at byte
 * b * g). The 16 bytes that hold two groups load into both 128-bit lanes of a register, one byte
 * shuffle puts each code's two bytes in an int16 lane (the high lane's group b bytes on), vpmulhuw by 2^(16 - shift)
 * shifts each lane right by its own bit offset (AVX2 has no vpsrlvw) and a mask keeps b bits: 16
 * codes as int16 in 4 operations. The zero is subtracted in int16, vpmaddwd with the activations
 * leaves the dot products in int32 lanes, scaled in f32 by weight scale x activation step (per 16
 * for q3_k and q6_k: each half of the block its own scale). The min term is sum_b min_b * xs_b. The
 * arithmetic is the VBMI path's: docs/LIBR4D.md's int16 tolerance. */

#ifndef R4D_PF_HINT
#define R4D_PF_HINT _MM_HINT_T0 /* native.py passes NTA on AMD, as for r4d.c's GEMVs */
#endif

/* byte pair and multiplier of element i (0..7) of a group of 8 b-bit codes that starts on a byte:
 * its bits start at bit s = (b i) & 7 of byte p = (b i) >> 3. s = 0: the pair (none, p) and 2^8
 * (the code is byte p, whole); else (p, p + 1) and 2^(16 - s): vpmulhuw's high half is the pair >> s.
 * Both 128-bit lanes hold the same 16 bytes (two groups: the second starts at byte b), so the high
 * lane's pairs are b bytes on. */
static int8_t kq2_pick[9][32];
static uint16_t kq2_mul[9][8];

__attribute__((constructor)) static void kq2_tables(void) {
    for (int b = 1; b <= 8; b++)
        for (int lane = 0; lane < 2; lane++)
            for (int i = 0; i < 8; i++) {
                const int p = (b * i) >> 3, s = (b * i) & 7, at = lane * b;
                kq2_pick[b][16 * lane + 2 * i] = (int8_t)(s ? at + p : -128);
                kq2_pick[b][16 * lane + 2 * i + 1] = (int8_t)(s ? at + p + 1 : at + p);
                kq2_mul[b][i] = (uint16_t)(s ? 1u << (16 - s) : 1u << 8);
            }
}

typedef struct {
    __m256i pick, mul, mask, zero;
    int b;
} KqUnpack;

static inline KqUnpack kq2_unpacker(int fmt) {
    const int b = code_bits(fmt);
    KqUnpack u;
    u.pick = _mm256_loadu_si256((const __m256i *)kq2_pick[b]);
    u.mul = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kq2_mul[b]));
    u.mask = _mm256_set1_epi16((short)((1 << b) - 1));
    u.zero = _mm256_set1_epi16((short)kq_zero(fmt));
    u.b = b;
    return u;
}

/* codes 16h .. 16h + 15 of the block at p, minus the zero, as int16 lanes (reads the 16 bytes from
 * byte 2bh into both lanes, a load alone: past the block's 4b bytes, so never the last block of a
 * plane) */
static inline __attribute__((always_inline)) __m256i kq2_half(const KqUnpack *u, const uint8_t *p, int h) {
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2 * u->b * h)));
    const __m256i pairs = _mm256_shuffle_epi8(raw, u->pick);
    return _mm256_sub_epi16(_mm256_and_si256(_mm256_mulhi_epu16(pairs, u->mul), u->mask), u->zero);
}

/* out[j] = element j of a b-bit stream as f32, j < count (a multiple of 8); reads exactly the
 * stream's bytes (codes8) */
static void kq2_unpack_f32(const uint8_t *p, int b, int64_t count, float *out) {
    for (int64_t j = 0; j < count; j += 8) _mm256_storeu_ps(out + j, _mm256_cvtepi32_ps(codes8(p + j * b / 8, b)));
}

/* out[j] = the f16 at p + 2j as f32, j < count */
static void kq2_f16_f32(const uint8_t *p, int64_t count, float *out) {
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * j))));
    for (; j < count; j++) out[j] = kq_h2f(f16_at(p, j));
}

/* One weight row's scales: ws[j] (per 32, or per 16 where `halves`) and wm[j] (per 32, the min
 * subtracted; `mins` 0 where the format has none), the core decoder's factors multiplied in f32 */
static void kq2_row_scales(const KW *w, int64_t n, float *ws, float *wm, int *halves, int *mins) {
    const int64_t K = w->cols, nb = K / 32;
    *halves = w->fmt == KQ_Q3_K || w->fmt == KQ_Q6_K;
    *mins = w->fmt == KQ_Q5_1 || w->fmt == KQ_Q4_K || w->fmt == KQ_Q5_K;
    switch (w->fmt) {
    case KQ_Q4_0:
    case KQ_Q5_0:
    case KQ_Q5_1:
        kq2_f16_f32(w->scale + n * nb * 2, nb, ws);
        if (w->fmt == KQ_Q5_1) kq2_f16_f32(w->min + n * nb * 2, nb, wm);
        return;
    case KQ_Q4_K:
    case KQ_Q5_K: { /* 8 scales of 32 a super-block, u6 each, times the super-block's f16 */
        const int64_t ns = K / 256;
        const uint8_t *d1 = w->scale1 + n * ns * 2, *m1 = w->min1 + n * ns * 2;
        kq2_unpack_f32(w->scale + n * nb * 6 / 8, 6, nb, ws);
        kq2_unpack_f32(w->min + n * nb * 6 / 8, 6, nb, wm);
        for (int64_t sb = 0; sb < ns; sb++) {
            _mm256_storeu_ps(ws + 8 * sb, _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * sb), _mm256_set1_ps(kq_h2f(f16_at(d1, sb)))));
            _mm256_storeu_ps(wm + 8 * sb, _mm256_mul_ps(_mm256_loadu_ps(wm + 8 * sb), _mm256_set1_ps(kq_h2f(f16_at(m1, sb)))));
        }
        return;
    }
    case KQ_Q3_K:
    case KQ_Q6_K: { /* 16 scales of 16 a super-block, i8 each, times the super-block's f16 */
        const int64_t ns = K / 256;
        const int8_t *sc = (const int8_t *)w->scale + n * (K / 16);
        const uint8_t *d1 = w->scale1 + n * ns * 2;
        for (int64_t sb = 0; sb < ns; sb++) {
            const __m256 d = _mm256_set1_ps(kq_h2f(f16_at(d1, sb)));
            const __m128i s16 = _mm_loadu_si128((const __m128i *)(sc + 16 * sb));
            _mm256_storeu_ps(ws + 16 * sb, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)), d));
            _mm256_storeu_ps(ws + 16 * sb + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8))), d));
        }
        return;
    }
    }
}

/* one block's dot products with activation rows m0 .. m0 + mt - 1, scaled into ACC (8 f32 lanes a
 * row): q0, q1 the block's two halves of codes; ds per row: its blocks' scales (x2 where halves) */
#define KQ2_BLOCK(blk, q0, q1, ACC)                                                                       \
    do {                                                                                                  \
        for (int i = 0; i < mt; i++) {                                                                    \
            const int16_t *x = t->xw + (m0 + i) * K + 32 * (blk);                                         \
            const __m256i d0 = _mm256_madd_epi16(q0, _mm256_loadu_si256((const __m256i *)x));             \
            const __m256i d1 = _mm256_madd_epi16(q1, _mm256_loadu_si256((const __m256i *)(x + 16)));      \
            if (halves) {                                                                                 \
                const float *s = ds + i * 2 * nb + 2 * (blk);                                             \
                ACC[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_broadcast_ss(s), ACC[i]);         \
                ACC[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_broadcast_ss(s + 1), ACC[i]);     \
            } else {                                                                                      \
                ACC[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d0, d1)),                    \
                                         _mm256_broadcast_ss(ds + i * nb + (blk)), ACC[i]);               \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

static inline float kq2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* rows [n0, n1) of y[m, n] for m in [m0, m0 + mt); `halves` (q3_k, q6_k) a constant of each call */
static inline __attribute__((always_inline)) void kq2_rows(const KGemvTask *t, int64_t m0, const int mt, const int halves,
                                                          int64_t n0, int64_t n1) {
    const KW *w = t->w;
    const int64_t K = w->cols, nb = K / 32;
    const KqUnpack u = kq2_unpacker(w->fmt);
    const int64_t row_bytes = K * u.b / 8, block_bytes = 4 * u.b;
    float ws[2 * nb + 16], wm[nb + 16], ds[KQ_MT * 2 * nb + 16];
    uint8_t last[64] = {0}; /* the plane's last block, copied: kq2_half reads past a block */
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *c = w->codes + n * row_bytes;
        if (n + 4 < n1)
            for (int64_t o = 0; o < row_bytes; o += 64) _mm_prefetch((const char *)(c + 4 * row_bytes + o), R4D_PF_HINT);
        int row_halves, mins;
        kq2_row_scales(w, n, ws, wm, &row_halves, &mins); /* row_halves == halves */
        for (int i = 0; i < mt; i++) { /* ds: each scale times its block's activation step */
            const float *xd = t->xd + (m0 + i) * nb;
            float *di = ds + i * (halves ? 2 : 1) * nb;
            int64_t j = 0;
            if (halves) {
                const __m256i twice = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
                for (; j + 4 <= nb; j += 4)
                    _mm256_storeu_ps(di + 2 * j, _mm256_mul_ps(_mm256_loadu_ps(ws + 2 * j),
                                                               _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(xd + j)), twice)));
                for (; j < nb; j++) di[2 * j] = ws[2 * j] * xd[j], di[2 * j + 1] = ws[2 * j + 1] * xd[j];
            } else {
                for (; j + 8 <= nb; j += 8) _mm256_storeu_ps(di + j, _mm256_mul_ps(_mm256_loadu_ps(ws + j), _mm256_loadu_ps(xd + j)));
                for (; j < nb; j++) di[j] = ws[j] * xd[j];
            }
        }
        __m256 a0[KQ_MT], a1[KQ_MT];
        for (int i = 0; i < mt; i++) a0[i] = a1[i] = _mm256_setzero_ps();
        int64_t blk = 0;
        for (; blk + 2 < nb; blk += 2) { /* two accumulator sets: the FMAs' latency overlaps */
            const uint8_t *p = c + blk * block_bytes;
            const __m256i q0 = kq2_half(&u, p, 0), q1 = kq2_half(&u, p, 1);
            KQ2_BLOCK(blk, q0, q1, a0);
            const __m256i r0 = kq2_half(&u, p + block_bytes, 0), r1 = kq2_half(&u, p + block_bytes, 1);
            KQ2_BLOCK(blk + 1, r0, r1, a1);
        }
        for (; blk < nb; blk++) { /* the last one or two; the plane's very last block from a copy */
            const uint8_t *p = c + blk * block_bytes;
            if (n == w->rows - 1 && blk == nb - 1) {
                memcpy(last, p, (size_t)block_bytes);
                p = last;
            }
            const __m256i q0 = kq2_half(&u, p, 0), q1 = kq2_half(&u, p, 1);
            KQ2_BLOCK(blk, q0, q1, a0);
        }
        for (int i = 0; i < mt; i++) {
            float minimum = 0.0f;
            if (mins) {
                const float *xs = t->xs + (m0 + i) * nb;
                __m256 mv = _mm256_setzero_ps();
                int64_t j = 0;
                for (; j + 8 <= nb; j += 8) mv = _mm256_fmadd_ps(_mm256_loadu_ps(wm + j), _mm256_loadu_ps(xs + j), mv);
                minimum = kq2_hsum(mv);
                for (; j < nb; j++) minimum += wm[j] * xs[j];
            }
            ROW(*t->Y, m0 + i, float)[n] = kq2_hsum(_mm256_add_ps(a0[i], a1[i])) - minimum;
        }
    }
}

/* weight rows [lo, hi) against every activation row, KQ_MT at a time (r4d_parallel's chunk) */
static void kq_gemv_task(const void *context, int64_t lo, int64_t hi) {
    const KGemvTask *t = (const KGemvTask *)context;
    const int halves = t->w->fmt == KQ_Q3_K || t->w->fmt == KQ_Q6_K;
    for (int64_t m0 = 0; m0 < t->M; m0 += KQ_MT) {
        const int mt = (int)(t->M - m0 < KQ_MT ? t->M - m0 : KQ_MT);
#define KQ2_CASE(MT)                                                                                      \
    case MT:                                                                                              \
        if (halves) kq2_rows(t, m0, MT, 1, lo, hi);                                                       \
        else kq2_rows(t, m0, MT, 0, lo, hi);                                                              \
        break;
        switch (mt) {
            KQ2_CASE(1)
            KQ2_CASE(2)
            KQ2_CASE(3)
            KQ2_CASE(4)
        }
#undef KQ2_CASE
    }
}
