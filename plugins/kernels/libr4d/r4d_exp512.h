/* exp in double, 8 lanes (included by r4d.c where the compiler targets AVX-512): r4d.c's exp_pd
 * operation for operation (the same reduction, polynomial, FMAs and clamps), so every lane gives the
 * bits exp_pd gives, and silu_mul stays bit for bit libref's. */

static inline __m512d exp_pd512(__m512d x) {
    const __m512d hi = _mm512_set1_pd(709.0), lo = _mm512_set1_pd(-708.0);
    const __mmask8 over = _mm512_cmp_pd_mask(x, hi, _CMP_GT_OQ), under = _mm512_cmp_pd_mask(x, lo, _CMP_LT_OQ);
    const __mmask8 nan = _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q);
    const __m512d xc = _mm512_min_pd(_mm512_max_pd(x, lo), hi);
    const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(xc, _mm512_set1_pd(1.4426950408889634074)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), xc);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
    __m512d p = _mm512_set1_pd(1.0 / 6227020800.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 479001600.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 39916800.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 3628800.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 362880.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 40320.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 5040.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 720.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    const __m256i ni = _mm512_cvtpd_epi32(n);
    const __m512i e = _mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(ni), _mm512_set1_epi64(1023)), 52);
    __m512d y = _mm512_mul_pd(p, _mm512_castsi512_pd(e));
    y = _mm512_mask_blend_pd(over, y, _mm512_set1_pd(INFINITY));
    y = _mm512_mask_blend_pd(under, y, _mm512_setzero_pd());
    return _mm512_mask_blend_pd(nan, y, x);
}

/* 16 floats -> (float)exp((double)x); the halves moved as 64-bit lanes (AVX-512 F's insert: the
 * f32x8 form is DQ's, which an AVX-512 CPU need not have) */
static inline __m512 exp_f64_ps16(__m512 x) {
    const __m256 a = _mm512_cvtpd_ps(exp_pd512(_mm512_cvtps_pd(_mm512_castps512_ps256(x))));
    const __m256 b = _mm512_cvtpd_ps(exp_pd512(_mm512_cvtps_pd(high8_ps(x))));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}
