// libr4d device rows: the decode GEMV, y[M, N] = x[M, K] . w[N, K]^T for M <= 8, reading the planes
// as stored. One warp per output row n, every lane streaming 16 bytes of the weight per step, four
// steps in flight; all M activation rows ride along (MT = 1, 2, 4 or 8, the next size up from M), so
// the weight crosses HBM once. f32 accumulation, another order than libref's: per-lane partial sums,
// then the warp's tree. Quantised blocks are factored: q8_0 sums x*q per 16 codes then multiplies by
// the scale; q4_1 adds scale*sum(x*q) - min*sum(x) per block of 32.
#define GEMV_WARPS 8

__device__ __forceinline__ uint4 r4d_ld16(const u8* p) { return *(const uint4*)p; }

// the 16-byte chunk at element e of row n: how many elements it holds and its byte offset
template <int FMT> struct Chunk;
template <> struct Chunk<FMT_F32> { enum { E = 4 }; };
template <> struct Chunk<FMT_F16> { enum { E = 8 }; };
template <> struct Chunk<FMT_BF16> { enum { E = 8 }; };
template <> struct Chunk<FMT_Q8_0> { enum { E = 16 }; };
template <> struct Chunk<FMT_Q4_1> { enum { E = 32 }; };

template <int FMT>
__device__ __forceinline__ long long chunk_byte(long long n, int K, int e) {
    if (FMT == FMT_F32) return (n * K + e) * 4;
    if (FMT == FMT_F16 || FMT == FMT_BF16) return (n * K + e) * 2;
    if (FMT == FMT_Q8_0) return n * K + e;
    return n * (K / 2) + e / 2;
}

__device__ __forceinline__ void unpack_plain(uint4 v, float* w, int fmt) {
    u32 word[4] = {v.x, v.y, v.z, v.w};
    if (fmt == FMT_F32) {
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(word[i]);
    } else if (fmt == FMT_BF16) {
        for (int i = 0; i < 4; ++i) { w[2 * i] = r4d_bf16(word[i] & 0xffffu); w[2 * i + 1] = r4d_bf16(word[i] >> 16); }
    } else {
        for (int i = 0; i < 4; ++i) { w[2 * i] = r4d_f16(word[i] & 0xffffu); w[2 * i + 1] = r4d_f16(word[i] >> 16); }
    }
}

// add one chunk's contribution to acc[0..MT)
template <int FMT, int MT>
__device__ __forceinline__ void consume(uint4 v, int e, long long n, int M, int K, const float* x,
                                        const u16* scale, const u16* minimum, float* acc) {
    const int E = Chunk<FMT>::E;
    if (FMT == FMT_F32 || FMT == FMT_F16 || FMT == FMT_BF16) {
        float w[E];
        unpack_plain(v, w, FMT);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float4* xv = (const float4*)(x + (long long)min(m, M - 1) * K + e);
#pragma unroll
            for (int j = 0; j < E / 4; ++j) {
                float4 a = xv[j];
                acc[m] += a.x * w[4 * j] + a.y * w[4 * j + 1] + a.z * w[4 * j + 2] + a.w * w[4 * j + 3];
            }
        }
    } else if (FMT == FMT_Q8_0) {
        float q[16];
        u32 word[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = (float)(signed char)((word[i / 4] >> (8 * (i % 4))) & 0xffu);
        float s = r4d_f16(scale[n * (K / 32) + e / 32]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float4* xv = (const float4*)(x + (long long)min(m, M - 1) * K + e);
            float part = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float4 a = xv[j];
                part += a.x * q[4 * j] + a.y * q[4 * j + 1] + a.z * q[4 * j + 2] + a.w * q[4 * j + 3];
            }
            acc[m] += s * part;
        }
    } else {
        float q[32];
        u32 word[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 32; ++i) q[i] = (float)((word[i / 8] >> (4 * (i % 8))) & 15u);
        long long b = n * (K / 32) + e / 32;
        float s = r4d_f16(scale[b]), mn = r4d_f16(minimum[b]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float4* xv = (const float4*)(x + (long long)min(m, M - 1) * K + e);
            float part = 0.0f, xs = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float4 a = xv[j];
                part += a.x * q[4 * j] + a.y * q[4 * j + 1] + a.z * q[4 * j + 2] + a.w * q[4 * j + 3];
                xs += (a.x + a.y) + (a.z + a.w);
            }
            acc[m] += s * part - mn * xs;
        }
    }
}

template <int FMT, int MT>
__device__ void gemv(const float* __restrict__ x, const u8* __restrict__ codes, const u16* __restrict__ scale,
                     const u16* __restrict__ minimum, float* __restrict__ y, int M, int N, int K) {
    const int E = Chunk<FMT>::E, S = R4D_WARP * E;
    int lane = threadIdx.x % R4D_WARP;
    long long n = (long long)blockIdx.x * GEMV_WARPS + threadIdx.x / R4D_WARP;
    if (n >= N) return;
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
    int e = lane * E;
    for (; e + 3 * S < K; e += 4 * S) {
        uint4 v0 = r4d_ld16(codes + chunk_byte<FMT>(n, K, e)), v1 = r4d_ld16(codes + chunk_byte<FMT>(n, K, e + S));
        uint4 v2 = r4d_ld16(codes + chunk_byte<FMT>(n, K, e + 2 * S)), v3 = r4d_ld16(codes + chunk_byte<FMT>(n, K, e + 3 * S));
        consume<FMT, MT>(v0, e, n, M, K, x, scale, minimum, acc);
        consume<FMT, MT>(v1, e + S, n, M, K, x, scale, minimum, acc);
        consume<FMT, MT>(v2, e + 2 * S, n, M, K, x, scale, minimum, acc);
        consume<FMT, MT>(v3, e + 3 * S, n, M, K, x, scale, minimum, acc);
    }
    for (; e < K; e += S) consume<FMT, MT>(r4d_ld16(codes + chunk_byte<FMT>(n, K, e)), e, n, M, K, x, scale, minimum, acc);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        float total = r4d_warp_sum(acc[m]);
        if (lane == 0 && m < M) y[(long long)m * N + n] = total;
    }
}

#define GEMV_ENTRY(label, FMT, MT)                                                                               \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * R4D_WARP) r4d_gemv_##label##_m##MT(                \
        const float* x, const u8* codes, const u16* scale, const u16* minimum, float* y, int M, int N, int K) { \
        gemv<FMT, MT>(x, codes, scale, minimum, y, M, N, K);                                                     \
    }
#define GEMV_ENTRIES(label, FMT) GEMV_ENTRY(label, FMT, 1) GEMV_ENTRY(label, FMT, 2) GEMV_ENTRY(label, FMT, 4) GEMV_ENTRY(label, FMT, 8)

GEMV_ENTRIES(f32, FMT_F32)
GEMV_ENTRIES(f16, FMT_F16)
GEMV_ENTRIES(bf16, FMT_BF16)
GEMV_ENTRIES(q8_0, FMT_Q8_0)
GEMV_ENTRIES(q4_1, FMT_Q4_1)
