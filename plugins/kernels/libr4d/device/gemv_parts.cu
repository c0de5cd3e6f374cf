// libr4d device rows: what both decode GEMVs share (gemv.cu, the split-K kernel any card runs;
// gemv_stream.cu, the persistent one NVIDIA cards run): the epilogue and norm macros, a lane's
// 16-byte chunk and its decoding, the weights of one launch and where a finished output goes.
// device_kernels.py puts common.cu, then this, then one of the two in front of nvrtc/hiprtc.
#ifndef R4D_GEMV_MODE
#define R4D_GEMV_MODE 0  // 0 store; 1 store and add into the residual; 2 silu(gate) * up; 3 store and argmax
#endif
#ifndef R4D_GEMV_NORM
#define R4D_GEMV_NORM 0  // 0 x as it is; 1 rmsnorm(x) * w; 2 rmsnorm(x[index[m]]) * w
#endif
#ifndef R4D_GEMV_FMT
#define R4D_GEMV_FMT FMT_BF16
#endif

// one lane's 16 bytes: how many elements they hold
template <int FMT> struct Chunk;
template <> struct Chunk<FMT_F32> { enum { E = 4 }; };
template <> struct Chunk<FMT_F16> { enum { E = 8 }; };
template <> struct Chunk<FMT_BF16> { enum { E = 8 }; };
template <> struct Chunk<FMT_Q8_0> { enum { E = 16 }; };
template <> struct Chunk<FMT_Q4_1> { enum { E = 32 }; };
template <> struct Chunk<FMT_FP8_ROW> { enum { E = 16 }; };
template <> struct Chunk<FMT_FP8_TENSOR> { enum { E = 16 }; };
// e4m3 codes, a byte an element, with an f32 scale per row or per weight
#define R4D_FP8(FMT) ((FMT) == FMT_FP8_ROW || (FMT) == FMT_FP8_TENSOR)

// streamed once: no L1 allocation, a 256-byte L2 fetch
__device__ __forceinline__ uint4 r4d_stream16(const u8* p) {
    uint4 v;
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__) || !defined(__CUDA_ARCH__)  // (a host build: a load)
    v = *(const uint4*)p;
#else
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
}

template <int FMT>
__device__ __forceinline__ long long chunk_byte(long long n, int K, int e) {
    if (FMT == FMT_F32) return (n * K + e) * 4;
    if (FMT == FMT_F16 || FMT == FMT_BF16) return (n * K + e) * 2;
    if (FMT == FMT_Q8_0 || R4D_FP8(FMT)) return n * K + e;
    return n * (K / 2) + e / 2;
}

// elements 4j..4j+3 of a 16-byte chunk, as f32 (plain values; codes for q8_0 and q4_1)
template <int FMT>
__device__ __forceinline__ void decode4(const uint4& v, int j, float* w) {
    u32 word[4] = {v.x, v.y, v.z, v.w};
    if (FMT == FMT_F32) {
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(word[i]);
    } else if (FMT == FMT_BF16) {
        u32 a = word[2 * j], b = word[2 * j + 1];
        w[0] = __uint_as_float(a << 16); w[1] = __uint_as_float(a & 0xffff0000u);
        w[2] = __uint_as_float(b << 16); w[3] = __uint_as_float(b & 0xffff0000u);
    } else if (FMT == FMT_F16) {
        u32 a = word[2 * j], b = word[2 * j + 1];
        w[0] = r4d_f16(a & 0xffffu); w[1] = r4d_f16(a >> 16); w[2] = r4d_f16(b & 0xffffu); w[3] = r4d_f16(b >> 16);
    } else if (FMT == FMT_Q8_0) {
        // a code c as the float 2^23 + (c + 128), less 2^23 + 128: exact, and no integer conversion
        u32 a = word[j] ^ 0x80808080u;
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(0x4B000000u | ((a >> (8 * i)) & 0xffu)) - 8388736.0f;
    } else if (R4D_FP8(FMT)) {
        r4d_fp8x4(word[j], w);
    } else {
        u32 a = word[j / 2] >> (16 * (j % 2));
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(0x4B000000u | ((a >> (4 * i)) & 15u)) - 8388608.0f;
    }
}

// The weights of one launch: up to three matrices whose rows are concatenated (q, k, v), or two
// paired row by row (gate, up: logical row 2p is gate row p, 2p + 1 is up row p).
struct GemvWeights {
    const u8* codes[3];
    const u16* scale[3];
    const u16* minimum[3];
    float* y[3];
    int n[3];
};

struct GemvRow {
    const u8* codes;
    const u16* scale;
    const u16* minimum;
    long long row;  // inside its matrix
    int seg;
    bool held;      // e4m3 weights: `held_scale` is the row's f32 scale (bits), read once by gemv_row
    u32 held_scale;
};

__device__ __forceinline__ int gemv_rows(const GemvWeights& w) {
    return R4D_GEMV_MODE == 2 ? 2 * w.n[0] : w.n[0] + w.n[1] + w.n[2];
}

// a[seg] by selects, so the arrays stay in registers (a run-time index would put them in local memory)
template <typename T>
__device__ __forceinline__ T r4d_pick(const T* a, int seg) { return seg == 0 ? a[0] : seg == 1 ? a[1] : a[2]; }

// Logical row `logical` of the launch's weights; `hold`: e4m3 weights' row scale read now, into the row
__device__ __forceinline__ GemvRow gemv_row(const GemvWeights& w, long long logical, bool hold = false) {
    int seg = 0;
    long long row = logical;
    if (R4D_GEMV_MODE == 2) {
        seg = (int)(logical & 1);
        row = logical >> 1;
    } else {
        if (row >= w.n[0]) { row -= w.n[0]; seg = 1; }
        if (seg == 1 && row >= w.n[1]) { row -= w.n[1]; seg = 2; }
    }
    GemvRow r = {r4d_pick(w.codes, seg), r4d_pick(w.scale, seg), r4d_pick(w.minimum, seg), row, seg, false, 0u};
    if (hold && R4D_FP8(R4D_GEMV_FMT)) {  // the scale in a register: no load a step, no pointer kept live for it
        r.held = true;
        r.held_scale = __float_as_uint(((const float*)r.scale)[R4D_GEMV_FMT == FMT_FP8_ROW ? r.row : 0]);
    }
    return r;
}

// the (scale | minimum << 16) bits of the 32-element block holding element e of a row (q8_0, q4_1)
template <int FMT>
__device__ __forceinline__ u32 gemv_scales(const GemvRow& r, int K, int e) {
    if (R4D_FP8(FMT) && FMT == R4D_GEMV_FMT && r.held) return r.held_scale;
    if (R4D_FP8(FMT)) return __float_as_uint(((const float*)r.scale)[FMT == FMT_FP8_ROW ? r.row : 0]);  // the row's f32
    if (FMT != FMT_Q8_0 && FMT != FMT_Q4_1) return 0u;
    long long block = r.row * (K / 32) + e / 32;
    return FMT == FMT_Q4_1 ? (u32)r.scale[block] | (u32)r.minimum[block] << 16 : (u32)r.scale[block];
}

// norm weight elements e..e+3 as f32 (decoded exactly as the rmsnorm row's relayout decodes them)
__device__ __forceinline__ float4 gemv_norm4(const u8* norm, int fmt, int e) {
    if (fmt == FMT_F32) return __ldg((const float4*)(norm + 4ll * e));
    uint2 v = __ldg((const uint2*)(norm + 2ll * e));
    if (fmt == FMT_BF16)
        return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                           __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
    return make_float4(r4d_f16(v.x & 0xffffu), r4d_f16(v.x >> 16), r4d_f16(v.y & 0xffffu), r4d_f16(v.y >> 16));
}

__device__ __forceinline__ float gemv_norm1(const u8* norm, int fmt, int e) {
    if (fmt == FMT_F32) return ((const float*)norm)[e];
    u32 h = ((const u16*)norm)[e];
    return fmt == FMT_BF16 ? __uint_as_float(h << 16) : r4d_f16(h);
}

struct GemvOut {
    float* residual;   // mode 1
    float* best;       // mode 3: per (row group, m) the first maximum's value and index
    int* best_index;
};

// What the chain does with a finished output `total` of (logical row, m): store it, and add it into
// the residual (mode 1); silu(gate) * up of a gate row and its up row's `partner` (mode 2).
__device__ __forceinline__ void gemv_store(const GemvWeights& w, const GemvOut& out, long long logical, int m,
                                           float total, float partner) {
    GemvRow r = gemv_row(w, logical);
    long long at = (long long)m * r4d_pick(w.n, r.seg) + r.row;
    if (R4D_GEMV_MODE == 2) {
        w.y[0][at] = r4d_silu_mul(total, partner);
        w.y[1][at] = partner;
        return;
    }
    r4d_pick(w.y, r.seg)[at] = total;
    if (R4D_GEMV_MODE == 1) out.residual[at] = out.residual[at] + total;
}

// The activations a block reads for its MT rows (row m beyond M reads row M-1): x itself, or
// rmsnorm(x) * norm recomputed element by element, the per-row scale worked out once per block
// exactly as r4d_rmsnorm_dev works it out. Indexed by constants only (registers, not local memory).
template <int MT>
struct GemvInput {
    const float* row[MT];  // x's row for activation row m (take_rows: row index[m])
    const u8* norm;        // the norm's weight as stored: f32, f16 or bf16 (norm_fmt)
    int norm_fmt;
    float scale[MT];
    bool bad[MT];          // an index outside x: a NaN row, as take_rows gives
};

template <int MT>
__device__ __forceinline__ float4 gemv_x(const GemvInput<MT>& in, int m, int e) {
    float4 a = __ldg((const float4*)(in.row[m] + e));
    if (R4D_GEMV_NORM) {
        float4 w = gemv_norm4(in.norm, in.norm_fmt, e);
        float s = in.scale[m];
        a.x = (a.x * s) * w.x; a.y = (a.y * s) * w.y; a.z = (a.z * s) * w.z; a.w = (a.w * s) * w.w;
        if (in.bad[m]) a.x = a.y = a.z = a.w = __uint_as_float(0x7fc00000u);
    }
    return a;
}

// One step: the 16-byte chunk at element e of each of a warp's ROWS rows, for all MT activation
// rows; `sc` the (scale | minimum << 16) of the 32-element block each chunk falls in (q8_0, q4_1),
// or the row's f32 scale (fp8).
template <int FMT, int MT, int ROWS>
__device__ __forceinline__ void consume(const uint4* v, const u32* sc, int e, const GemvInput<MT>& in,
                                        float (*acc)[MT]) {
    const int E = Chunk<FMT>::E;
    float part[ROWS][MT], xs[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        xs[m] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) part[r][m] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
        float w[ROWS][4];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) decode4<FMT>(v[r], j, w[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float4 a = gemv_x(in, m, e + 4 * j);
            if (FMT == FMT_Q4_1) xs[m] += (a.x + a.y) + (a.z + a.w);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float p = part[r][m];
                p = __fmaf_rn(a.x, w[r][0], p); p = __fmaf_rn(a.y, w[r][1], p);
                p = __fmaf_rn(a.z, w[r][2], p); p = __fmaf_rn(a.w, w[r][3], p);
                part[r][m] = p;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        float s = r4d_f16(sc[r] & 0xffffu), mn = r4d_f16(sc[r] >> 16);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FMT == FMT_Q8_0) acc[r][m] = __fmaf_rn(s, part[r][m], acc[r][m]);
            else if (FMT == FMT_Q4_1) acc[r][m] = __fmaf_rn(s, part[r][m], __fmaf_rn(-mn, xs[m], acc[r][m]));
            else if (R4D_FP8(FMT)) acc[r][m] = __fmaf_rn(__uint_as_float(sc[r]), part[r][m], acc[r][m]);
            else acc[r][m] += part[r][m];
        }
    }
}

// rmsnorm folded in front (R4D_GEMV_NORM): each row's scale, once per block. The block also writes
// its part [k_begin, k_end) of what the chain leaves behind: the gathered rows (take_rows) and the
// normed activations, every block a slice, so that no block works longer than the others.
template <int MT>
__device__ void gemv_norm(GemvInput<MT>& in, const float* x, int M, int K, int k_begin, int k_end, float eps,
                          const int* index, int x_rows, float* normed, float* gathered) {
    __shared__ float s_scale[8];
    __shared__ int s_row[8];
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__)
    // every thread asks for some of the rows' lines first: the warp summing a row in the canonical
    // order then finds them in L1 instead of waiting on one L2 round trip after another
    for (int i = threadIdx.x; i < M * (K / 32); i += blockDim.x) {
        int m = i / (K / 32), row = R4D_GEMV_NORM == 2 ? index[m] : m;
        if (row >= 0 && row < (R4D_GEMV_NORM == 2 ? x_rows : M))
            asm volatile("prefetch.global.L1 [%0];" ::"l"(x + (long long)row * K + 32 * (i % (K / 32))));
    }
#endif
    for (int m = warp; m < M; m += blockDim.x / R4D_WARP) {
        int row = m;
        if (R4D_GEMV_NORM == 2) {
            row = index[m];
            row = (row < 0 || row >= x_rows) ? -1 : row;
        }
        float total = r4d_row_squares(x + (long long)max(row, 0) * K, K);
        if (lane == 0) { s_scale[m] = 1.0f / sqrtf(total / (float)K + eps); s_row[m] = row; }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        int mm = min(m, M - 1);
        in.scale[m] = s_scale[mm];
        in.bad[m] = s_row[mm] < 0;
        in.row[m] = x + (long long)max(s_row[mm], 0) * K;
    }
    int width = k_end - k_begin;
    for (int i = threadIdx.x; i < M * width; i += blockDim.x) {
        int m = i / width, k = k_begin + i % width;
        float h = s_row[m] < 0 ? __uint_as_float(0x7fc00000u) : x[(long long)s_row[m] * K + k];
        if (R4D_GEMV_NORM == 2) gathered[(long long)m * K + k] = h;
        normed[(long long)m * K + k] = (h * s_scale[m]) * gemv_norm1(in.norm, in.norm_fmt, k);
    }
}

// What a GEMV reads after its chain prologue's wait: x's rows as they are, or (R4D_GEMV_NORM) with the
// folded norm's per-row scales, the block writing its share of [k_begin, k_end) of the normed (and
// gathered) rows, in whole float4s, so that no block works longer than the others.
template <int MT>
__device__ __forceinline__ GemvInput<MT> gemv_input(const float* x, const u8* norm, int norm_fmt, int M, int K,
                                                    int k_begin, int k_end, float eps, const int* index, int x_rows,
                                                    float* normed, float* gathered) {
    GemvInput<MT> in;
    in.norm = norm;
    in.norm_fmt = norm_fmt;
#pragma unroll
    for (int m = 0; m < MT; ++m) { in.row[m] = x + (long long)min(m, M - 1) * K; in.scale[m] = 1.0f; in.bad[m] = false; }
    if (R4D_GEMV_NORM) {
        long long quads = (k_end - k_begin) / 4;
        int lo = k_begin + 4 * (int)(blockIdx.x * quads / gridDim.x);
        int hi = blockIdx.x + 1 == gridDim.x ? k_end : k_begin + 4 * (int)((blockIdx.x + 1ll) * quads / gridDim.x);
        gemv_norm<MT>(in, x, M, K, lo, hi, eps, index, x_rows, normed, gathered);
    }
    return in;
}

// The arguments both GEMVs' entries take after their own (x, M, K and gemv.cu's split-K part): the
// weights of the launch, the folded norm's, the epilogue's. GEMV_BIND makes their structs.
#define GEMV_ARGUMENTS                                                                                            \
    const u8 *c0, const u16 *s0, const u16 *n0, float *y0, int rows0,                                             \
    const u8 *c1, const u16 *s1, const u16 *n1, float *y1, int rows1,                                             \
    const u8 *c2, const u16 *s2, const u16 *n2, float *y2, int rows2,                                             \
    const u8 *norm, int norm_fmt, float eps, float *normed, const int *index, float *gathered, int x_rows,         \
    float *residual, float *best, int *best_index
#define GEMV_BIND                                                                                                 \
    GemvWeights w = {{c0, c1, c2}, {s0, s1, s2}, {n0, n1, n2}, {y0, y1, y2}, {rows0, rows1, rows2}};             \
    GemvOut out = {residual, best, best_index}
