/* The prefill GEMM on AMX int8 tiles for weights of integer values with one f32 scale per 256
 * (included by r4d.c after r4d_gemm_amx.h, whose tile permission, split struct, row packing and
 * store it shares): q6_k through r4d_amx_gemm256, its codes less the zero times the int8 scale of
 * each 16, so w = value x d per super-block of 256.
 *
 * Why not r4d_gemm_amx.h's tiles: those scale every block of 32 in f32 (the activations' steps
 * change per 32), so a scale per 16 doubled the tile stores and the f32 work and gained nothing
 * on the f32 panels (bench/results/host_avx512_2026-12-03.md). Here the activations are quantised
 * to int16 with one step per 256 (d = max|x|/32767 over the 256, round to nearest even: the
 * GEMV's rule, over 256 instead of 32), so a super-block's whole dot product stays in int32 tiles
 * and is stored and scaled once per 256.
 *
 * Exactness: x = 256 xh + xl (xh signed, xl unsigned bytes) and w = 128 wh + wl (wh = w >> 7
 * signed, wl = w & 127, a byte in [0, 127] that the tiles may take as signed or unsigned), for
 * |w| < 2^14 (q6_k's |(q - 32) sc| <= 4096). Four tiles per super-block: hh = xh.wh, hl = xh.wl
 * (tdpbssd), lh = xl.wh, ll = xl.wl (tdpbusd); x.w = 128 (256 hh + lh) + (256 hl + ll), where
 * |256 hh + lh| <= 256 (256 x 128 x 128) + 256 x 255 x 128 and |256 hl + ll| likewise: both inside
 * int32, then combined in f32.
 *
 * Layouts: A tiles 16 activation rows x 64 bytes (K = 64 a pass, four passes a super-block) read
 * in place from xh / xl [Mp][K]; B tiles 16 x 64 bytes in AMX's pairs-of-four order, wh and wl of
 * 16 weight rows repacked once per 16 rows ([K / 64][16][64] each). Tiles 0-3: hh hl lh ll, 4, 5:
 * xh xl, 6, 7: wh wl. */

/* weight row n as r4d_amx_gemm256 takes it: K integer values (|v| < 2^14) and K / 256 f32 scales */
typedef void (*AmxRow256)(const void *weight, int64_t n, int16_t *values, float *scales);

#define AMX_SUPER 256 /* elements per scale of the weights and step of the activations */

static void amx256_configure(void) {
    AmxConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = AMX_ROWS, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

typedef struct {
    AmxRow256 row;
    const void *weight;
    int64_t N, K;
    const int8_t *xh;
    const uint8_t *xl;
    const float *xd; /* [Mp][K / 256] activation steps (zero in padded rows) */
    const Mat *Y;
    int64_t M, Mp;
    _Atomic int failed;
} Amx256Task;

/* weight rows [lo, hi) (whole tiles of 16 but the last) against every activation row */
static void amx256_gemm_task(const void *context, int64_t lo, int64_t hi) {
    Amx256Task *t = (Amx256Task *)context;
    const int64_t K = t->K, ns = K / AMX_SUPER;
    /* wh and wl of 16 rows in tile order, their scales by super-block ([ns][16]), the four int32
     * tiles of a super-block, one row's values and scales, its wh and wl in natural order */
    char *buffer = (char *)thread_buffer((size_t)(2 * 16 * K + 64 * ns + 4 * 1024 + 2 * K + 4 * ns + 2 * K + 512));
    if (!buffer) {
        atomic_store(&t->failed, 1);
        return;
    }
    int8_t *wh = (int8_t *)buffer, *wl = wh + 16 * K;
    float *dw = (float *)(wl + 16 * K);
    int32_t *c = (int32_t *)align64((char *)(dw + 16 * ns));
    int16_t *values = (int16_t *)(c + 4 * 256);
    float *scales = (float *)align64((char *)(values + K));
    int8_t *rh = (int8_t *)align64((char *)(scales + ns)), *rl = rh + K;
    amx256_configure();
    for (int64_t n0 = lo; n0 < hi; n0 += AMX_ROWS) {
        const int nr = (int)(hi - n0 < AMX_ROWS ? hi - n0 : AMX_ROWS);
        for (int j = 0; j < AMX_ROWS; j++) { /* row n0 + j into AMX's order, zeros past nr */
            if (j < nr) {
                t->row(t->weight, n0 + j, values, scales);
                amx_split16(values, K, 7, rh, (uint8_t *)rl);
            }
            for (int64_t p = 0; p < K / 64; p++) { /* pass p's tiles */
                amx_pack_row((int32_t *)(wh + p * 1024), rh + 64 * p, 16, j, j < nr);
                amx_pack_row((int32_t *)(wl + p * 1024), rl + 64 * p, 16, j, j < nr);
            }
            for (int64_t s = 0; s < ns; s++) dw[s * AMX_ROWS + j] = j < nr ? scales[s] : 0.0f;
        }
        for (int64_t m0 = 0; m0 < t->M; m0 += AMX_ROWS) {
            __m512 acc[AMX_ROWS];
            for (int i = 0; i < AMX_ROWS; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t s = 0; s < ns; s++) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int64_t p = 4 * s; p < 4 * s + 4; p++) {
                    _tile_loadd(4, t->xh + m0 * K + 64 * p, K);
                    _tile_loadd(5, t->xl + m0 * K + 64 * p, K);
                    _tile_loadd(6, wh + p * 1024, 64);
                    _tile_loadd(7, wl + p * 1024, 64);
                    _tile_dpbssd(0, 4, 6);
                    _tile_dpbssd(1, 4, 7);
                    _tile_dpbusd(2, 5, 6);
                    _tile_dpbusd(3, 5, 7);
                }
                _tile_stored(0, c, 64);
                _tile_stored(1, c + 256, 64);
                _tile_stored(2, c + 512, 64);
                _tile_stored(3, c + 768, 64);
                const __m512 wv = _mm512_load_ps(dw + s * AMX_ROWS);
                const float *xd = t->xd + m0 * ns + s;
#pragma GCC unroll 16
                for (int i = 0; i < AMX_ROWS; i++) {
                    const __m512i high = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c + 16 * i), 8),
                                                          _mm512_load_si512(c + 512 + 16 * i));
                    const __m512i low = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c + 256 + 16 * i), 8),
                                                         _mm512_load_si512(c + 768 + 16 * i));
                    const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(high), _mm512_set1_ps(128.0f), _mm512_cvtepi32_ps(low));
                    acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(wv, _mm512_set1_ps(xd[i * ns])), acc[i]);
                }
            }
            amx_store(t->Y, acc, m0, t->M, n0, nr);
        }
    }
    _tile_release();
}

/* activation rows [lo, hi) of the padded set, quantised per 256 and split, zeros past M */
static void amx256_split_task(const void *context, int64_t lo, int64_t hi) {
    const AmxSplitTask *t = (const AmxSplitTask *)context;
    const int64_t K = t->K, ns = t->nb;
    for (int64_t m = lo; m < hi; m++) {
        int8_t *xh = t->hi + m * K;
        uint8_t *xl = t->lo + m * K;
        if (m >= t->M) {
            amx_split_zero_row(t, m);
            continue;
        }
        const float *x = ROW(*t->X, m, const float);
        for (int64_t s = 0; s < ns; s++) {
            const float *v = x + s * AMX_SUPER;
            __m512 mx = _mm512_setzero_ps();
            for (int k = 0; k < AMX_SUPER; k += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(v + k)));
            const float d = _mm512_reduce_max_ps(mx) / 32767.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            for (int k = 0; k < AMX_SUPER; k += 16) {
                const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + k), _mm512_set1_ps(id)));
                _mm_storeu_si128((__m128i *)(xh + s * AMX_SUPER + k), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 8)));
                _mm_storeu_si128((__m128i *)(xl + s * AMX_SUPER + k), _mm512_cvtepi32_epi8(_mm512_and_si512(q, _mm512_set1_epi32(0xff))));
            }
            t->xd[m * ns + s] = d;
        }
    }
}

/* The split activations of the launching thread: kept across launches, grown as needed */
static __thread char *t_amx256_split;
static __thread size_t t_amx256_split_bytes;

/* y = x W^T for a weight of N rows of K (K % 256 == 0) given by `row`; R4D_E_NOMEM when memory runs out */
static int amx_gemm256(AmxRow256 row, const void *weight, int64_t N, int64_t K, const Mat *X, const Mat *Y, int64_t M) {
    const int64_t ns = K / AMX_SUPER, Mp = (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    if (!grow(&t_amx256_split, &t_amx256_split_bytes, (size_t)(2 * Mp * K + 4 * Mp * ns + 128))) return R4D_E_NOMEM;
    int8_t *xh = (int8_t *)t_amx256_split;
    uint8_t *xl = (uint8_t *)xh + Mp * K;
    AmxSplitTask split = {NULL, X, xh, xl, (float *)align64((char *)(xl + Mp * K)), NULL, M, K, ns};
    pool_run(amx256_split_task, &split, Mp, 4, nthreads_for(Mp * K, 1 << 15));
    Amx256Task task = {row, weight, N, K, xh, xl, split.xd, Y, M, Mp, 0};
    pool_run(amx256_gemm_task, &task, N, AMX_ROWS, nthreads_for(M * N * K, 1 << 18));
    return atomic_load(&task.failed) ? R4D_E_NOMEM : R4D_OK;
}
