/* The prefill GEMM on AMX int8 tiles (included by r4d.c where the compiler targets AVX-512 and
 * AMX-INT8; used at aq = 16 when the kernel grants this process the tile data state): q8_0 weights,
 * and through r4d_amx_gemm any weight whose rows are int8 codes with one f32 scale (and optionally
 * one f32 min) per block of 32 (r4d_kquants.c's q4_0, q5_0, q5_1, q4_k, q5_k).
 *
 * The arithmetic is the AVX2 int16 GEMM's: the decode GEMV's int16 activations per block of 32
 * (`prepared`), exact int32 dot products with the int8 codes per block, each scaled in f32 by
 * (weight scale x activation step). AMX multiplies bytes, so each int16 activation is split
 * exactly as x = 256 hi + lo (hi signed, lo unsigned): per block one tdpbssd (hi x codes) and one
 * tdpbusd (lo x codes) into two int32 tiles, recombined as (hi << 8) + lo (|hi . w| <= 32 x 128 x
 * 128, so x 256 stays far inside int32). A tile pass covers 16 activation rows x 16 weight rows x
 * one block (K = 32 bytes): the scales change per block, so every block's int32 tile is stored and
 * scaled into 16 f32 accumulators (one zmm per activation row) by AVX-512; a min per block is
 * subtracted there too, min x the activations' exact f32 block sum (the GEMV's min term).
 *
 * Layouts: A (activations) tiles are 16 rows x 32 bytes read in place from hi / lo [Mp][K] (M padded
 * to 16 with zero rows); B (weights) tiles are 8 rows x 64 bytes, row r holding bytes 4r..4r+3 of
 * the block for each of 16 weight rows (AMX's pairs-of-four order), repacked once per 16 weight rows
 * and reused by every activation tile. */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_ROWS 16 /* activation rows and weight rows of one tile pass */

/* 1 when this process may use the AMX tile state (asked of the kernel once), else 0 */
static int r4d_amx_usable(void) {
    static _Atomic int state; /* 0 unknown, 1 granted, -1 refused */
    int s = atomic_load(&state);
    if (!s) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        atomic_store(&state, s);
    }
    return s > 0;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

/* tiles 0, 1: int32 results of hi and lo (16 x 16); 2, 3: hi and lo activations (16 x 32 bytes);
 * 4: the weights of one block (8 x 64 bytes) */
static void amx_configure(void) {
    AmxConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = c.rows[1] = c.rows[2] = c.rows[3] = AMX_ROWS;
    c.colsb[0] = c.colsb[1] = 64;
    c.colsb[2] = c.colsb[3] = QK;
    c.rows[4] = QK / 4;
    c.colsb[4] = 64;
    _tile_loadconfig(&c);
}

/* What both tile GEMMs (this file's per 32, r4d_gemm_amx256.h's per 256) share. */

/* v = 2^s hi + lo exactly for n int16 values (n % 32 == 0): hi = v >> s a signed byte, lo = v & (2^s - 1)
 * a byte (the activations at s = 8, lo unsigned; r4d_gemm_amx256.h's weights at s = 7, lo < 128) */
static inline __attribute__((always_inline)) void amx_split16(const int16_t *v, int64_t n, const int s, int8_t *hi,
                                                              uint8_t *lo) {
    const __m512i mask = _mm512_set1_epi16((short)((1 << s) - 1));
    for (int64_t k = 0; k < n; k += 32) {
        const __m512i x = _mm512_loadu_si512(v + k);
        _mm256_storeu_si256((__m256i *)(hi + k), _mm512_cvtepi16_epi8(_mm512_srai_epi16(x, s)));
        _mm256_storeu_si256((__m256i *)(lo + k), _mm512_cvtepi16_epi8(_mm512_and_si512(x, mask)));
    }
}

/* weight row j of 16 into a B tile of `rows` rows x 64 bytes in AMX's pairs-of-four order: tile row r
 * takes bytes 4r..4r+3 of `bytes` (zeros where the row is past the weight's end: !live) */
static inline void amx_pack_row(int32_t *tile, const int8_t *bytes, int rows, int j, int live) {
    for (int r = 0; r < rows; r++) {
        int32_t four = 0;
        if (live) memcpy(&four, bytes + 4 * r, 4);
        tile[r * AMX_ROWS + j] = four;
    }
}

/* the f32 results of one tile pass, acc[i] = y[m0 + i, n0 .. n0 + 16), into Y: the rows below M, the
 * columns below n0 + nr */
static inline void amx_store(const Mat *Y, const __m512 *acc, int64_t m0, int64_t M, int64_t n0, int nr) {
    const __mmask16 columns = (__mmask16)((1u << nr) - 1);
    const int mr = (int)(M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS);
    for (int i = 0; i < mr; i++) _mm512_mask_storeu_ps(ROW(*Y, m0 + i, float) + n0, columns, acc[i]);
}

/* The split activations of one launch, as a split task writes them for its rows of the padded set:
 * hi and lo [Mp][K], the steps xd and (per 32 only) the exact block sums xs [Mp][nb] */
typedef struct {
    const Act *A;     /* per 32: the GEMV's int16 activations, split as they are */
    const Mat *X;     /* per 256: f32 activations, quantised per 256 and split */
    int8_t *hi;
    uint8_t *lo;
    float *xd, *xs;   /* xs NULL per 256 */
    int64_t M, K, nb; /* nb: steps a row (K / 32 or K / 256) */
} AmxSplitTask;

/* a padded row m >= M of the split: zeros, which add nothing to any product */
static void amx_split_zero_row(const AmxSplitTask *t, int64_t m) {
    memset(t->hi + m * t->K, 0, (size_t)t->K);
    memset(t->lo + m * t->K, 0, (size_t)t->K);
    memset(t->xd + m * t->nb, 0, (size_t)t->nb * sizeof(float));
    if (t->xs) memset(t->xs + m * t->nb, 0, (size_t)t->nb * sizeof(float));
}

/* weight row n as the tiles take it: K int8 codes (any zero already subtracted), nb f32 scales and,
 * where the format has them, nb f32 mins (w = code x scale - min per block of 32) */
typedef void (*AmxRow)(const void *weight, int64_t n, int8_t *codes, float *scales, float *mins);

typedef struct {
    AmxRow row;
    const void *weight;
    int mins;
    int64_t N, K;
    const int8_t *hi;
    const uint8_t *lo;
    const float *xd, *xs; /* [Mp][nb] activation steps and exact block sums (zero in padded rows) */
    const Mat *Y;
    int64_t M, Mp;
    _Atomic int failed;
} AmxTask;

/* weight rows [lo, hi) (whole tiles of 16 but the last) against every activation row */
static void amx_gemm_task(const void *context, int64_t lo, int64_t hi) {
    AmxTask *t = (AmxTask *)context;
    const int64_t K = t->K, nb = K / QK;
    /* the repacked weights of 16 rows, their scales and mins by block ([nb][16]), one row's codes,
     * scales and mins as t->row gives them, and the two int32 tiles of one pass */
    char *buffer = (char *)thread_buffer((size_t)(nb * 512 + 2 * nb * 64 + K + 2 * nb * 4 + 2 * 1024 + 256));
    if (!buffer) {
        atomic_store(&t->failed, 1);
        return;
    }
    int8_t *packed = (int8_t *)buffer;
    float *dw = (float *)(buffer + nb * 512), *dm = dw + nb * AMX_ROWS;
    int32_t *c0 = (int32_t *)(dm + nb * AMX_ROWS), *c1 = c0 + 256;
    int8_t *codes = (int8_t *)(c1 + 256);
    float *scales = (float *)align64((char *)(codes + K)), *mins = scales + nb;
    amx_configure();
    for (int64_t n0 = lo; n0 < hi; n0 += AMX_ROWS) {
        const int nr = (int)(hi - n0 < AMX_ROWS ? hi - n0 : AMX_ROWS);
        for (int j = 0; j < AMX_ROWS; j++) { /* row n0 + j into AMX's order, zeros past nr */
            if (j < nr) t->row(t->weight, n0 + j, codes, scales, mins);
            for (int64_t b = 0; b < nb; b++) {
                amx_pack_row((int32_t *)(packed + b * 512), codes + QK * b, QK / 4, j, j < nr);
                dw[b * AMX_ROWS + j] = j < nr ? scales[b] : 0.0f;
                dm[b * AMX_ROWS + j] = j < nr && t->mins ? mins[b] : 0.0f;
            }
        }
        for (int64_t m0 = 0; m0 < t->M; m0 += AMX_ROWS) {
            __m512 acc[AMX_ROWS];
            for (int i = 0; i < AMX_ROWS; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                _tile_loadd(2, t->hi + m0 * K + QK * b, K);
                _tile_loadd(3, t->lo + m0 * K + QK * b, K);
                _tile_loadd(4, packed + b * 512, 64);
                _tile_zero(0);
                _tile_zero(1);
                _tile_dpbssd(0, 2, 4);
                _tile_dpbusd(1, 3, 4);
                _tile_stored(0, c0, 64);
                _tile_stored(1, c1, 64);
                const __m512 wv = _mm512_load_ps(dw + b * AMX_ROWS), mv = _mm512_load_ps(dm + b * AMX_ROWS);
                const float *xd = t->xd + m0 * nb + b, *xs = t->xs + m0 * nb + b;
#pragma GCC unroll 16
                for (int i = 0; i < AMX_ROWS; i++) {
                    const __m512i v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c0 + 16 * i), 8),
                                                       _mm512_load_si512(c1 + 16 * i));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(wv, _mm512_set1_ps(xd[i * nb])), acc[i]);
                    if (t->mins) acc[i] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(xs[i * nb]), acc[i]);
                }
            }
            amx_store(t->Y, acc, m0, t->M, n0, nr);
        }
    }
    _tile_release();
}

/* activation rows [lo, hi) of the padded set: x = 256 hi + lo, zeros past M */
static void amx_split_task(const void *context, int64_t lo, int64_t hi) {
    const AmxSplitTask *t = (const AmxSplitTask *)context;
    const int64_t K = t->K, nb = t->nb;
    for (int64_t m = lo; m < hi; m++) {
        if (m >= t->M) {
            amx_split_zero_row(t, m);
            continue;
        }
        amx_split16(t->A->xw + m * K, K, 8, t->hi + m * K, t->lo + m * K); /* K % 32 == 0 */
        memcpy(t->xd + m * nb, t->A->xd + m * nb, (size_t)nb * sizeof(float));
        memcpy(t->xs + m * nb, t->A->xs + m * nb, (size_t)nb * sizeof(float));
    }
}

/* The split activations of the launching thread: kept across launches, grown as needed */
static __thread char *t_amx_split;
static __thread size_t t_amx_split_bytes;

/* y = x W^T for a weight of N rows of K given by `row` (K % 32 == 0), from the activations A; R4D_E_NOMEM
 * when memory runs out */
static int amx_gemm(AmxRow row, const void *weight, int mins, int64_t N, int64_t K, const Act *A, const Mat *Y,
                    int64_t M) {
    const int64_t nb = K / QK, Mp = (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    const size_t bytes = (size_t)(2 * Mp * K + 8 * Mp * nb + 256);
    if (!grow(&t_amx_split, &t_amx_split_bytes, bytes)) return R4D_E_NOMEM;
    float *xd = (float *)align64(t_amx_split + 2 * Mp * K + 128);
    AmxSplitTask split = {A, NULL, (int8_t *)t_amx_split, (uint8_t *)t_amx_split + Mp * K + 64, xd, xd + Mp * nb, M, K,
                          nb};
    pool_run(amx_split_task, &split, Mp, 4, nthreads_for(Mp * K, 1 << 15));
    AmxTask task = {row, weight, mins, N, K, split.hi, split.lo, split.xd, split.xs, Y, M, Mp, 0};
    pool_run(amx_gemm_task, &task, N, AMX_ROWS, nthreads_for(M * N * K, 1 << 18));
    return atomic_load(&task.failed) ? R4D_E_NOMEM : R4D_OK;
}

/* AmxRow of a q8_0 Weight */
static void amx_row_q8_0(const void *weight, int64_t n, int8_t *codes, float *scales, float *mins) {
    const Weight *w = (const Weight *)weight;
    const int64_t K = w->cols, nb = K / QK;
    (void)mins;
    memcpy(codes, (const int8_t *)w->codes + n * K, (size_t)K);
    for (int64_t b = 0; b < nb; b++) scales[b] = h2f(w->scale[n * nb + b]);
}
