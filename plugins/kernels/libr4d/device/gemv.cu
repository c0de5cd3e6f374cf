// libr4d device rows: the decode GEMV, y[M, N] = x[M, K] . w[N, K]^T for M <= 8, reading the planes
// as stored. One warp per GEMV_ROWS output rows, every lane streaming 16 bytes of each row per step;
// all M activation rows ride along (MT = 1, 2, 4 or 8, the next size up from M), so
// the weight crosses HBM once. f32 accumulation, another order than libref's: per-lane partial sums,
// then the warp's tree. Quantised blocks are factored: q8_0 sums x*q per 16 codes then multiplies by
// the scale; q4_1 adds scale*sum(x*q) - min*sum(x) per block of 32.
#define GEMV_WARPS 4
#define GEMV_ROWS 4  // output rows per warp: x is read once for the four

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

// elements 4j..4j+3 of a 16-byte chunk, as f32 (plain values; codes for q8_0 and q4_1)
template <int FMT>
__device__ __forceinline__ void decode4(const uint4& v, int j, float* w) {
    u32 word[4] = {v.x, v.y, v.z, v.w};
    if (FMT == FMT_F32) {
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(word[i]);
    } else if (FMT == FMT_BF16) {
        u32 a = word[2 * j], b = word[2 * j + 1];
        w[0] = r4d_bf16(a & 0xffffu); w[1] = r4d_bf16(a >> 16); w[2] = r4d_bf16(b & 0xffffu); w[3] = r4d_bf16(b >> 16);
    } else if (FMT == FMT_F16) {
        u32 a = word[2 * j], b = word[2 * j + 1];
        w[0] = r4d_f16(a & 0xffffu); w[1] = r4d_f16(a >> 16); w[2] = r4d_f16(b & 0xffffu); w[3] = r4d_f16(b >> 16);
    } else if (FMT == FMT_Q8_0) {
        u32 a = word[j];
        for (int i = 0; i < 4; ++i) w[i] = (float)(signed char)((a >> (8 * i)) & 0xffu);
    } else {
        u32 a = word[j / 2] >> (16 * (j % 2));
        for (int i = 0; i < 4; ++i) w[i] = (float)((a >> (4 * i)) & 15u);
    }
}

// One 16-byte chunk at element e of each of the warp's GEMV_ROWS rows, for all MT activation rows:
// each float4 of x is loaded once for the R rows, each weight quad decoded once for the MT rows.
template <int FMT, int MT>
__device__ __forceinline__ void consume(const uint4* v, int e, const long long* n, int M, int K, const float* x,
                                        const u16* scale, const u16* minimum, float (*acc)[MT]) {
    const int E = Chunk<FMT>::E;
    float part[GEMV_ROWS][MT], xs[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        xs[m] = 0.0f;
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) part[r][m] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
        float w[GEMV_ROWS][4];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) decode4<FMT>(v[r], j, w[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float4 a = *(const float4*)(x + (long long)min(m, M - 1) * K + e + 4 * j);
            if (FMT == FMT_Q4_1) xs[m] += (a.x + a.y) + (a.z + a.w);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r)
                part[r][m] += a.x * w[r][0] + a.y * w[r][1] + a.z * w[r][2] + a.w * w[r][3];
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        float s = 1.0f, mn = 0.0f;
        if (FMT == FMT_Q8_0 || FMT == FMT_Q4_1) s = r4d_f16(scale[n[r] * (K / 32) + e / 32]);
        if (FMT == FMT_Q4_1) mn = r4d_f16(minimum[n[r] * (K / 32) + e / 32]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FMT == FMT_Q8_0) acc[r][m] += s * part[r][m];
            else if (FMT == FMT_Q4_1) acc[r][m] += s * part[r][m] - mn * xs[m];
            else acc[r][m] += part[r][m];
        }
    }
}

// Split K (gridDim.y > 1, for shapes too narrow to fill the card): block (bx, s) sums K's s-th
// chunk of its rows into partial[s][m][n]; the last of a row group's blocks to finish (a counter per
// group, reset by that block for the next launch) adds the chunks in s order, so y does not depend on
// which block finished last.
template <int FMT, int MT>
__device__ void gemv(const float* __restrict__ x, const u8* __restrict__ codes, const u16* __restrict__ scale,
                     const u16* __restrict__ minimum, float* __restrict__ y, int M, int N, int K, int k_chunk,
                     float* partial, u32* counters) {
    const int E = Chunk<FMT>::E, S = R4D_WARP * E;
    int lane = threadIdx.x % R4D_WARP;
    long long first = ((long long)blockIdx.x * GEMV_WARPS + threadIdx.x / R4D_WARP) * GEMV_ROWS;
    int k_end = min(K, (int)(blockIdx.y + 1) * k_chunk);
    long long n[GEMV_ROWS];
    float acc[GEMV_ROWS][MT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        n[r] = min(first + r, (long long)N - 1);  // rows past N read row N-1 and store nothing
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
    }
    // software-pipelined: the next step's chunks are in flight while this step's are consumed
    uint4 v[GEMV_ROWS], next[GEMV_ROWS];
    int e = (int)blockIdx.y * k_chunk + lane * E;
    if (first < N && e < k_end) {
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) v[r] = r4d_ld16(codes + chunk_byte<FMT>(n[r], K, e));
    }
    for (; first < N && e < k_end; e += S) {
        if (e + S < k_end) {
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) next[r] = r4d_ld16(codes + chunk_byte<FMT>(n[r], K, e + S));
        }
        consume<FMT, MT>(v, e, n, M, K, x, scale, minimum, acc);
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r) v[r] = next[r];
    }
    bool split = gridDim.y > 1;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float total = r4d_warp_sum(acc[r][m]);
            if (lane == 0 && m < M && first + r < N) {
                if (split) partial[((long long)blockIdx.y * M + m) * N + first + r] = total;
                else y[(long long)m * N + first + r] = total;
            }
        }
    if (!split) return;
    __shared__ int last;
    __threadfence();  // this block's partials visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int rows = GEMV_WARPS * GEMV_ROWS;
    long long base = (long long)blockIdx.x * rows;
    for (int i = threadIdx.x; i < rows * M; i += blockDim.x) {
        long long col = base + i % rows;
        int m = i / rows;
        if (col >= N) continue;
        float total = 0.0f;
        for (int s = 0; s < (int)gridDim.y; ++s) total += ((volatile const float*)partial)[((long long)s * M + m) * N + col];
        y[(long long)m * N + col] = total;
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch (a graph replays it)
}

#define GEMV_ENTRY(label, FMT, MT)                                                                               \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * R4D_WARP) r4d_gemv_##label##_m##MT(                \
        const float* x, const u8* codes, const u16* scale, const u16* minimum, float* y, int M, int N, int K,      \
        int k_chunk, float* partial, u32* counters) { R4D_CHAIN_PROLOGUE();                                        \
        gemv<FMT, MT>(x, codes, scale, minimum, y, M, N, K, k_chunk, partial, counters);                         \
    }
#define GEMV_ENTRIES(label, FMT) GEMV_ENTRY(label, FMT, 1) GEMV_ENTRY(label, FMT, 2) GEMV_ENTRY(label, FMT, 4) GEMV_ENTRY(label, FMT, 8)

GEMV_ENTRIES(f32, FMT_F32)
GEMV_ENTRIES(f16, FMT_F16)
GEMV_ENTRIES(bf16, FMT_BF16)
GEMV_ENTRIES(q8_0, FMT_Q8_0)
GEMV_ENTRIES(q4_1, FMT_Q4_1)
