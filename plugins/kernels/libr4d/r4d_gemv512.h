/* The decode GEMV's 512-bit paths (included by r4d.c where the compiler targets AVX-512 F/BW/VL):
 * q4_1 and q8_0 weights against int16 activations (aq = 16, the default), two blocks of 32 per step.
 * The arithmetic is the AVX2 path's (the same int16 activations and steps, exact int32 dot products
 * per block, each scaled in f32 by weight scale x activation step); only the f32 sums' order
 * differs, well within the GEMV's tolerance.
 *
 * q4_1: a pair of blocks (2p, 2p+1) is 32 bytes of codes; its low nibbles are the even elements of
 * both blocks, its high nibbles the odd ones. act_row lays the activations of such a pair out as
 * [evens 2p | evens 2p+1 | odds 2p | odds 2p+1] (16 int16 each; an odd last block keeps
 * [evens | odds]), so the codes widen to int16 with one vpmovzxbw per half and no shuffle:
 * vpdpwssd leaves block 2p's dot product in lanes 0-7 and block 2p+1's in lanes 8-15, scaled by
 * [s_2p x 8 | s_2p+1 x 8] before the f32 accumulation.
 * q8_0: one block is 32 int8 codes, widened to one zmm of int16 against its 32 activations. */

static inline __m512i dpwssd512(__m512i acc, __m512i a, __m512i b) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

/* [ds[0] x 8 | ds[1] x 8] */
static inline __m512 pair_scales(const float *ds) {
    double both;
    memcpy(&both, ds, sizeof both);
    const __m512 two = _mm512_castpd_ps(_mm512_set1_pd(both)); /* ds0 ds1 ds0 ds1 ... */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), two);
}

/* q4_1 blocks b, b + 1 of one weight row (codes c) against mt activation rows, into acc[0..mt) */
static inline __attribute__((always_inline)) void q41_pair512(const uint8_t *c, const float *ds, const int16_t *xw,
                                                             int64_t K, int64_t nb, int64_t b, const int mt,
                                                             __m512 *acc) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(c + 16 * b));
    const __m512i we = _mm512_cvtepu8_epi16(_mm256_and_si256(v, low));
    const __m512i wo = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    for (int i = 0; i < mt; i++) {
        const int16_t *x = xw + i * K + QK * b;
        const __m512i s = dpwssd512(dpwssd512(_mm512_setzero_si512(), we, _mm512_load_si512(x)), wo,
                                    _mm512_load_si512(x + 32));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), pair_scales(ds + i * nb + b), acc[i]);
    }
}

/* an odd last q4_1 block b, laid out [evens | odds], against mt activation rows, into acc[0..mt) */
static inline __attribute__((always_inline)) void q41_tail512(const uint8_t *c, const float *ds, const int16_t *xw,
                                                             int64_t K, int64_t nb, int64_t b, const int mt,
                                                             __m512 *acc) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(c + 16 * b)), m4 = _mm_set1_epi8(0x0f);
    const __m256i ce = _mm256_cvtepu8_epi16(_mm_and_si128(v, m4));
    const __m256i co = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m4));
    const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(ce), co, 1);
    for (int i = 0; i < mt; i++) {
        const __m512i s = dpwssd512(_mm512_setzero_si512(), wv, _mm512_load_si512(xw + i * K + QK * b));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(ds[i * nb + b]), acc[i]);
    }
}

/* q8_0 block b of one weight row (codes c) against mt activation rows, into acc[0..mt) */
static inline __attribute__((always_inline)) void q80_block512(const int8_t *c, const float *ds, const int16_t *xw,
                                                              int64_t K, int64_t nb, int64_t b, const int mt,
                                                              __m512 *acc) {
    const __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(c + QK * b)));
    for (int i = 0; i < mt; i++) {
        const __m512i s = dpwssd512(_mm512_setzero_si512(), wv, _mm512_load_si512(xw + i * K + QK * b));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(ds[i * nb + b]), acc[i]);
    }
}

/* sum_b min_b * xs_b of one q4_1 row, 16 blocks a step (the min term of every output) */
static inline float min_term512(const uint16_t *mn, const float *xs, int64_t nb) {
    __m512 t = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= nb; k += 16)
        t = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mn + k))), _mm512_loadu_ps(xs + k), t);
    float tail = _mm512_reduce_add_ps(t);
    for (; k < nb; k++) tail += h2f(mn[k]) * xs[k];
    return tail;
}

/* rows [n0, n1) of y[m, n] for m in [m0, m0 + mt), q4_1 or q8_0 weights, int16 activations */
static inline __attribute__((always_inline)) void gemv512_rows(const Weight *w, const Act *A, int64_t m0,
                                                              const int mt, int64_t n0, int64_t n1, const Mat *Y) {
    const int64_t K = w->cols, nb = K / QK;
    const int q41 = w->fmt == F_Q4_1;
    const int64_t row_bytes = q41 ? K / 2 : K;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *c = w->codes + n * row_bytes;
        const uint16_t *sc = w->scale + n * nb;
        if (R4D_PF_ROWS && n + R4D_PF_ROWS < n1) {
            const char *pc = (const char *)(c + R4D_PF_ROWS * row_bytes);
            for (int64_t o = 0; o < row_bytes; o += 64) _mm_prefetch(pc + o, R4D_PF_HINT);
            _mm_prefetch((const char *)(sc + R4D_PF_ROWS * nb), R4D_PF_HINT);
            if (q41) _mm_prefetch((const char *)(w->min + (n + R4D_PF_ROWS) * nb), R4D_PF_HINT);
        }
        float ds[MT_MAX * nb + 16] __attribute__((aligned(64)));
        row_scales(sc, A, 16, m0, mt, ds);
        __m512 a0[MT_MAX], a1[MT_MAX];
        for (int i = 0; i < mt; i++) a0[i] = a1[i] = _mm512_setzero_ps();
        float out[MT_MAX];
        int64_t b = 0;
        const int16_t *xw = A->xw + m0 * K;
        if (q41) {
            for (; b + 4 <= nb; b += 4) { /* two pairs a step, into two accumulator sets */
                q41_pair512(c, ds, xw, K, nb, b, mt, a0);
                q41_pair512(c, ds, xw, K, nb, b + 2, mt, a1);
            }
            if (b + 2 <= nb) {
                q41_pair512(c, ds, xw, K, nb, b, mt, a0);
                b += 2;
            }
            if (b < nb) q41_tail512(c, ds, xw, K, nb, b, mt, a0);
            for (int i = 0; i < mt; i++)
                out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i])) -
                         min_term512(w->min + n * nb, A->xs + (m0 + i) * nb, nb);
        } else {
            const int8_t *c8 = (const int8_t *)c;
            for (; b + 2 <= nb; b += 2) {
                q80_block512(c8, ds, xw, K, nb, b, mt, a0);
                q80_block512(c8, ds, xw, K, nb, b + 1, mt, a1);
            }
            if (b < nb) q80_block512(c8, ds, xw, K, nb, b, mt, a0);
            for (int i = 0; i < mt; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i]));
        }
        for (int i = 0; i < mt; i++) ROW(*Y, m0 + i, float)[n] = out[i];
    }
}

/* q4_1 blocks b, b + 1 of two weight rows (codes c, c + row bytes) against one activation row */
static inline __attribute__((always_inline)) void q41_pair512_two(const uint8_t *c, int64_t row_bytes, const float *ds0,
                                                                 const float *ds1, const int16_t *x, int64_t b,
                                                                 __m512 *acc0, __m512 *acc1) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    const __m512i xe = _mm512_load_si512(x + QK * b), xo = _mm512_load_si512(x + QK * b + 32);
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(c + 16 * b));
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(c + row_bytes + 16 * b));
    const __m512i s0 = dpwssd512(dpwssd512(_mm512_setzero_si512(), _mm512_cvtepu8_epi16(_mm256_and_si256(v0, low)), xe),
                                 _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low)), xo);
    const __m512i s1 = dpwssd512(dpwssd512(_mm512_setzero_si512(), _mm512_cvtepu8_epi16(_mm256_and_si256(v1, low)), xe),
                                 _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low)), xo);
    *acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), pair_scales(ds0 + b), *acc0);
    *acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), pair_scales(ds1 + b), *acc1);
}

/* q8_0 block b of two weight rows against one activation row */
static inline __attribute__((always_inline)) void q80_block512_two(const int8_t *c, int64_t row_bytes, const float *ds0,
                                                                  const float *ds1, const int16_t *x, int64_t b,
                                                                  __m512 *acc0, __m512 *acc1) {
    const __m512i xv = _mm512_load_si512(x + QK * b);
    const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(c + QK * b)));
    const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(c + row_bytes + QK * b)));
    *acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dpwssd512(_mm512_setzero_si512(), w0, xv)), _mm512_set1_ps(ds0[b]), *acc0);
    *acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dpwssd512(_mm512_setzero_si512(), w1, xv)), _mm512_set1_ps(ds1[b]), *acc1);
}

/* One activation row (decode at one sequence): the weight rows two at a time, so each step's
 * activations are loaded once for both and a row's fixed costs (its block scales, its min term,
 * the reductions) overlap the other's dot products. Rows [n0, n1); an odd last row goes alone. */
static void gemv512_one(const Weight *w, const Act *A, int64_t m0, int64_t n0, int64_t n1, const Mat *Y) {
    const int64_t K = w->cols, nb = K / QK;
    const int q41 = w->fmt == F_Q4_1;
    const int64_t row_bytes = q41 ? K / 2 : K;
    const int16_t *x = A->xw + m0 * K;
    float *y = ROW(*Y, m0, float);
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) {
        const uint8_t *c = w->codes + n * row_bytes;
        const uint16_t *sc = w->scale + n * nb;
        if (R4D_PF_ROWS && n + 2 + R4D_PF_ROWS < n1) {
            const char *pc = (const char *)(c + R4D_PF_ROWS * row_bytes);
            for (int64_t o = 0; o < 2 * row_bytes; o += 64) _mm_prefetch(pc + o, R4D_PF_HINT);
            _mm_prefetch((const char *)(sc + R4D_PF_ROWS * nb), R4D_PF_HINT);
            if (q41) _mm_prefetch((const char *)(w->min + (n + R4D_PF_ROWS) * nb), R4D_PF_HINT);
        }
        float ds[2 * nb + 16] __attribute__((aligned(64)));
        row_scales(sc, A, 16, m0, 1, ds);
        row_scales(sc + nb, A, 16, m0, 1, ds + nb);
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
        int64_t b = 0;
        if (q41) {
            for (; b + 4 <= nb; b += 4) {
                q41_pair512_two(c, row_bytes, ds, ds + nb, x, b, &a0, &b0);
                q41_pair512_two(c, row_bytes, ds, ds + nb, x, b + 2, &a1, &b1);
            }
            if (b + 2 <= nb) {
                q41_pair512_two(c, row_bytes, ds, ds + nb, x, b, &a0, &b0);
                b += 2;
            }
            if (b < nb) { /* an odd last block */
                __m512 one[2] = {a1, b1};
                q41_tail512(c, ds, x, K, nb, b, 1, &one[0]);
                q41_tail512(c + row_bytes, ds + nb, x, K, nb, b, 1, &one[1]);
                a1 = one[0], b1 = one[1];
            }
            const float *xs = A->xs + m0 * nb;
            y[n] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) - min_term512(w->min + n * nb, xs, nb);
            y[n + 1] = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1)) - min_term512(w->min + (n + 1) * nb, xs, nb);
        } else {
            const int8_t *c8 = (const int8_t *)c;
            for (; b + 2 <= nb; b += 2) {
                q80_block512_two(c8, row_bytes, ds, ds + nb, x, b, &a0, &b0);
                q80_block512_two(c8, row_bytes, ds, ds + nb, x, b + 1, &a1, &b1);
            }
            if (b < nb) q80_block512_two(c8, row_bytes, ds, ds + nb, x, b, &a0, &b0);
            y[n] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
            y[n + 1] = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1));
        }
    }
    if (n < n1) gemv512_rows(w, A, m0, 1, n, n1, Y);
}

static void gemv512_block(const Weight *w, const Act *A, int64_t m0, int mt, int64_t n0, int64_t n1, const Mat *Y) {
    switch (mt) {
    case 1: gemv512_one(w, A, m0, n0, n1, Y); break;
    case 2: gemv512_rows(w, A, m0, 2, n0, n1, Y); break;
    case 3: gemv512_rows(w, A, m0, 3, n0, n1, Y); break;
    default: gemv512_rows(w, A, m0, 4, n0, n1, Y); break;
    }
}
