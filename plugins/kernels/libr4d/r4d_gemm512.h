/* The prefill GEMM's 512-bit register tile (included by r4d.c where the compiler targets AVX-512
 * F/BW/VL): MR512 activation rows x NR512 dequantised weight rows, dot products over K sixteen
 * floats a step (the last step masked), FMA in f32, then each tile's sums reduced four at a time.
 * The f32 arithmetic of the AVX2 tile, twice as wide; the order of the sums differs. */

#define MR512 4
#define NR512 4

/* [sum(a), sum(b), sum(c), sum(d)] */
static inline __m128 hsum4x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), high8_ps(a));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), high8_ps(b));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), high8_ps(c));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), high8_ps(d));
    const __m256 all = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
    return _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
}

/* Y[i, j] = X[i, :K] . W[j, :K] for i < mr, j < nr (W rows `kp` floats apart) */
static inline __attribute__((always_inline)) void tile512(const float *X, int64_t ldx, const int mr, const float *W,
                                                         int64_t kp, int64_t K, const int nr, float *Y, int64_t ldy) {
    __m512 acc[MR512][NR512];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[NR512];
        for (int j = 0; j < nr; j++) wv[j] = _mm512_loadu_ps(W + j * kp + k);
        for (int i = 0; i < mr; i++) {
            const __m512 xv = _mm512_loadu_ps(X + i * ldx + k);
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) { /* the last K % 16 columns: masked, so nothing past a row is read */
        const __mmask16 mask = (__mmask16)((1u << (K - k)) - 1);
        __m512 wv[NR512];
        for (int j = 0; j < nr; j++) wv[j] = _mm512_maskz_loadu_ps(mask, W + j * kp + k);
        for (int i = 0; i < mr; i++) {
            const __m512 xv = _mm512_maskz_loadu_ps(mask, X + i * ldx + k);
            for (int j = 0; j < nr; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++) {
        const __m512 zero = _mm512_setzero_ps();
        const __m128 sums = hsum4x16(acc[i][0], nr > 1 ? acc[i][1] : zero, nr > 2 ? acc[i][2] : zero,
                                     nr > 3 ? acc[i][3] : zero);
        float out[4];
        _mm_storeu_ps(out, sums);
        for (int j = 0; j < nr; j++) Y[i * ldy + j] = out[j];
    }
}

static void tile512_any(const float *X, int64_t ldx, int mr, const float *W, int64_t kp, int64_t K, int nr, float *Y,
                        int64_t ldy) {
#define T(a, b) \
    case a * 8 + b: tile512(X, ldx, a, W, kp, K, b, Y, ldy); break;
    switch (mr * 8 + nr) {
        T(1, 1) T(1, 2) T(1, 3) T(1, 4) T(2, 1) T(2, 2) T(2, 3) T(2, 4)
        T(3, 1) T(3, 2) T(3, 3) T(3, 4) T(4, 1) T(4, 2) T(4, 3) T(4, 4)
    }
#undef T
}
