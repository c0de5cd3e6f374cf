// libr4d device rows: the decode GEMV, y[M, N] = x[M, K] . w[N, K]^T for M <= 8, reading the planes
// as stored, and the fused rows built on it (docs/OPS.md): the rmsnorm folded in front
// (rmsnorm_gemm3, rmsnorm_gemm2_silu_mul, take_rows_rmsnorm_gemm_sample), several weights in one
// launch (q, k and v; gate and up), and an epilogue (the residual add, silu * mul, a per-row-group
// argmax for greedy sampling). One source, compiled once per (R4D_GEMV_MODE, R4D_GEMV_NORM,
// R4D_GEMV_FMT): its four entries r4d_gemv_m{1,2,4,8} carry MT = 1, 2, 4 or 8 activation rows.
//
// Work: a warp owns GEMV_ROWS consecutive output rows (of the concatenated weights); a block owns
// GEMV_WARPS warps' rows (a row group) and one chunk of K (gridDim.y > 1 splits K for shapes too
// narrow to fill the card). Every lane streams 16 bytes of each of its rows per step, GEMV_PIPE
// steps in flight; the first of them are loaded before the chain prologue's wait, since weights do
// not depend on the kernel before: a chained launch streams its weights while that kernel drains.
// Each activation float4 is read once for the warp's rows, each weight quad decoded once for the MT
// rows. f32 accumulation with fused multiply-adds (agreement with libref, not its order: per-lane
// partial sums, the warp's tree, split chunks added in order by the row group's last block), the
// same order whatever the mode, so a fused row computes bit for bit what the unfused rows compute.
#ifndef GEMV_WARPS
#define GEMV_WARPS 4
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 4  // even: silu * mul pairs a gate row with its up row inside one warp
#endif
#ifndef GEMV_PIPE
#define GEMV_PIPE 2
#endif
#ifndef R4D_GEMV_MODE
#define R4D_GEMV_MODE 0  // 0 store; 1 store and add into the residual; 2 silu(gate) * up; 3 store and argmax
#endif
#ifndef R4D_GEMV_NORM
#define R4D_GEMV_NORM 0  // 0 x as it is; 1 rmsnorm(x) * w; 2 rmsnorm(x[index[m]]) * w
#endif
#ifndef R4D_GEMV_FMT
#define R4D_GEMV_FMT FMT_BF16
#endif
#define GEMV_GROUP (GEMV_WARPS * GEMV_ROWS)

// one lane's 16 bytes: how many elements they hold
template <int FMT> struct Chunk;
template <> struct Chunk<FMT_F32> { enum { E = 4 }; };
template <> struct Chunk<FMT_F16> { enum { E = 8 }; };
template <> struct Chunk<FMT_BF16> { enum { E = 8 }; };
template <> struct Chunk<FMT_Q8_0> { enum { E = 16 }; };
template <> struct Chunk<FMT_Q4_1> { enum { E = 32 }; };

// streamed once: no L1 allocation, a 256-byte L2 fetch
__device__ __forceinline__ uint4 r4d_stream16(const u8* p) {
    uint4 v;
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
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
        w[0] = __uint_as_float(a << 16); w[1] = __uint_as_float(a & 0xffff0000u);
        w[2] = __uint_as_float(b << 16); w[3] = __uint_as_float(b & 0xffff0000u);
    } else if (FMT == FMT_F16) {
        u32 a = word[2 * j], b = word[2 * j + 1];
        w[0] = r4d_f16(a & 0xffffu); w[1] = r4d_f16(a >> 16); w[2] = r4d_f16(b & 0xffffu); w[3] = r4d_f16(b >> 16);
    } else if (FMT == FMT_Q8_0) {
        // a code c as the float 2^23 + (c + 128), less 2^23 + 128: exact, and no integer conversion
        u32 a = word[j] ^ 0x80808080u;
        for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(0x4B000000u | ((a >> (8 * i)) & 0xffu)) - 8388736.0f;
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
};

__device__ __forceinline__ int gemv_rows(const GemvWeights& w) {
    return R4D_GEMV_MODE == 2 ? 2 * w.n[0] : w.n[0] + w.n[1] + w.n[2];
}

// a[seg] by selects, so the arrays stay in registers (a run-time index would put them in local memory)
template <typename T>
__device__ __forceinline__ T r4d_pick(const T* a, int seg) { return seg == 0 ? a[0] : seg == 1 ? a[1] : a[2]; }

__device__ __forceinline__ GemvRow gemv_row(const GemvWeights& w, long long logical) {
    int seg = 0;
    long long row = logical;
    if (R4D_GEMV_MODE == 2) {
        seg = (int)(logical & 1);
        row = logical >> 1;
    } else {
        if (row >= w.n[0]) { row -= w.n[0]; seg = 1; }
        if (seg == 1 && row >= w.n[1]) { row -= w.n[1]; seg = 2; }
    }
    GemvRow r = {r4d_pick(w.codes, seg), r4d_pick(w.scale, seg), r4d_pick(w.minimum, seg), row, seg};
    return r;
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

// One step: the 16-byte chunk at element e of each of the warp's rows, for all MT activation rows.
template <int FMT, int MT>
__device__ __forceinline__ void consume(const uint4* v, int e, const GemvRow* rows, int K, const GemvInput<MT>& in,
                                        float (*acc)[MT]) {
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
            float4 a = gemv_x(in, m, e + 4 * j);
            if (FMT == FMT_Q4_1) xs[m] += (a.x + a.y) + (a.z + a.w);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) {
                float p = part[r][m];
                p = __fmaf_rn(a.x, w[r][0], p); p = __fmaf_rn(a.y, w[r][1], p);
                p = __fmaf_rn(a.z, w[r][2], p); p = __fmaf_rn(a.w, w[r][3], p);
                part[r][m] = p;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) {
        float s = 1.0f, mn = 0.0f;
        if (FMT == FMT_Q8_0 || FMT == FMT_Q4_1) s = r4d_f16(rows[r].scale[rows[r].row * (K / 32) + e / 32]);
        if (FMT == FMT_Q4_1) mn = r4d_f16(rows[r].minimum[rows[r].row * (K / 32) + e / 32]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (FMT == FMT_Q8_0) acc[r][m] = __fmaf_rn(s, part[r][m], acc[r][m]);
            else if (FMT == FMT_Q4_1) acc[r][m] = __fmaf_rn(s, part[r][m], __fmaf_rn(-mn, xs[m], acc[r][m]));
            else acc[r][m] += part[r][m];
        }
    }
}

// the last of a row group's split-K blocks: this block reads every chunk's partials
__device__ bool gemv_last_split(u32* counters) {
    __shared__ int last;
    __threadfence();  // this block's partials visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
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
        float sig = (float)(1.0 / (1.0 + exp(-(double)total)));
        w.y[0][at] = (total * sig) * partner;
        w.y[1][at] = partner;
        return;
    }
    r4d_pick(w.y, r.seg)[at] = total;
    if (R4D_GEMV_MODE == 1) out.residual[at] = out.residual[at] + total;
}

// rmsnorm folded in front (R4D_GEMV_NORM): each row's scale, once per block; row group 0 also
// writes what the chain leaves behind: the gathered rows (take_rows) and the normed activations.
template <int MT>
__device__ void gemv_norm(GemvInput<MT>& in, const float* x, int M, int K, int k_begin, int k_end, float eps,
                          const int* index, int x_rows, float* normed, float* gathered) {
    __shared__ float s_scale[8];
    __shared__ int s_row[8];
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    for (int m = warp; m < M; m += GEMV_WARPS) {
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
    if (blockIdx.x != 0) return;
    int width = k_end - k_begin;
    for (int i = threadIdx.x; i < M * width; i += blockDim.x) {
        int m = i / width, k = k_begin + i % width;
        float h = s_row[m] < 0 ? __uint_as_float(0x7fc00000u) : x[(long long)s_row[m] * K + k];
        if (R4D_GEMV_NORM == 2) gathered[(long long)m * K + k] = h;
        normed[(long long)m * K + k] = (h * s_scale[m]) * gemv_norm1(in.norm, in.norm_fmt, k);
    }
}

template <int FMT, int MT>
__device__ void gemv(const GemvWeights& w, const float* x, const u8* norm, int norm_fmt, const GemvOut& out, int M, int K,
                     int k_chunk, float* partial, u32* counters, float* normed, float* gathered, const int* index,
                     int x_rows, float eps) {
    const int E = Chunk<FMT>::E, S = R4D_WARP * E;
    const int N = gemv_rows(w);
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    long long first = ((long long)blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
    int k_begin = (int)blockIdx.y * k_chunk, k_end = min(K, k_begin + k_chunk);
    GemvRow rows[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) rows[r] = gemv_row(w, min(first + r, (long long)N - 1));  // past N: row N-1, stored nowhere
    // the weights' first steps, before waiting on the kernel this one is chained to
    uint4 v[GEMV_PIPE][GEMV_ROWS];
    int e = k_begin + lane * E;
    bool mine = first < N;
#pragma unroll
    for (int p = 0; p < GEMV_PIPE; ++p)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
            if (mine && e + p * S < k_end) v[p][r] = r4d_stream16(rows[r].codes + chunk_byte<FMT>(rows[r].row, K, e + p * S));
    R4D_CHAIN_PROLOGUE();
    GemvInput<MT> in;
    in.norm = norm;
    in.norm_fmt = norm_fmt;
#pragma unroll
    for (int m = 0; m < MT; ++m) { in.row[m] = x + (long long)min(m, M - 1) * K; in.scale[m] = 1.0f; in.bad[m] = false; }
    if (R4D_GEMV_NORM) gemv_norm<MT>(in, x, M, K, k_begin, k_end, eps, index, x_rows, normed, gathered);
    float acc[GEMV_ROWS][MT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
    for (; mine && e < k_end; e += GEMV_PIPE * S) {
#pragma unroll
        for (int p = 0; p < GEMV_PIPE; ++p) {
            int at = e + p * S, ahead = at + GEMV_PIPE * S;
            if (at >= k_end) break;
            uint4 now[GEMV_ROWS];
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) now[r] = v[p][r];
            if (ahead < k_end) {
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; ++r) v[p][r] = r4d_stream16(rows[r].codes + chunk_byte<FMT>(rows[r].row, K, ahead));
            }
            consume<FMT, MT>(now, at, rows, K, in, acc);
        }
    }
    bool split = gridDim.y > 1;
    __shared__ float s_total[GEMV_GROUP][8];  // mode 3: the row group's outputs, for its argmax
    float totals[GEMV_ROWS][MT];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            totals[r][m] = r4d_warp_sum(acc[r][m]);
            if (split && lane == 0 && m < M && first + r < N)
                partial[((long long)blockIdx.y * M + m) * N + first + r] = totals[r][m];
        }
    if (!split) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) {
                if (first + r >= N) continue;
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    if (m >= M) continue;
                    if (R4D_GEMV_MODE != 2 || r % 2 == 0)
                        gemv_store(w, out, first + r, m, totals[r][m], R4D_GEMV_MODE == 2 ? totals[(r + 1) % GEMV_ROWS][m] : 0.0f);
                    if (R4D_GEMV_MODE == 3) s_total[warp * GEMV_ROWS + r][m] = totals[r][m];
                }
            }
        }
    } else {
        if (!gemv_last_split(counters)) return;
        // the row group's last block: every chunk's partials, added in chunk order
        long long base = (long long)blockIdx.x * GEMV_GROUP;
        const int step = R4D_GEMV_MODE == 2 ? 2 : 1, width = GEMV_GROUP / step;
        for (int i = threadIdx.x; i < width * M; i += blockDim.x) {
            long long logical = base + (i % width) * step;
            int m = i / width;
            if (logical >= N) continue;
            float total = 0.0f, partner = 0.0f;
#pragma unroll 4
            for (int s = 0; s < (int)gridDim.y; ++s) {
                total += r4d_load_l2(partial + ((long long)s * M + m) * N + logical);
                if (R4D_GEMV_MODE == 2) partner += r4d_load_l2(partial + ((long long)s * M + m) * N + logical + 1);
            }
            gemv_store(w, out, logical, m, total, partner);
            if (R4D_GEMV_MODE == 3) s_total[logical - base][m] = total;
        }
        if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch (a graph replays it)
    }
    if (R4D_GEMV_MODE == 3) {  // the row group's first maximum of each activation row
        __syncthreads();
        if (threadIdx.x < M) {
            int m = threadIdx.x;
            float best = __uint_as_float(0xff800000u);
            int where = 0x7fffffff;
            long long base = (long long)blockIdx.x * GEMV_GROUP;
            for (int r = 0; r < GEMV_GROUP && base + r < N; ++r)
                if (r4d_better(s_total[r][m], (int)(base + r), best, where)) { best = s_total[r][m]; where = (int)(base + r); }
            out.best[(long long)blockIdx.x * M + m] = best;
            out.best_index[(long long)blockIdx.x * M + m] = where;
        }
    }
}

#define GEMV_ENTRY(MT)                                                                                            \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * R4D_WARP) r4d_gemv_m##MT(                          \
        const float* x, int M, int K, int k_chunk, float* partial, u32* counters,                               \
        const u8* c0, const u16* s0, const u16* n0, float* y0, int rows0,                                        \
        const u8* c1, const u16* s1, const u16* n1, float* y1, int rows1,                                        \
        const u8* c2, const u16* s2, const u16* n2, float* y2, int rows2,                                        \
        const u8* norm, int norm_fmt, float eps, float* normed, const int* index, float* gathered, int x_rows,     \
        float* residual, float* best, int* best_index) {                                                         \
        GemvWeights w = {{c0, c1, c2}, {s0, s1, s2}, {n0, n1, n2}, {y0, y1, y2}, {rows0, rows1, rows2}};       \
        GemvOut out = {residual, best, best_index};                                                              \
        gemv<R4D_GEMV_FMT, MT>(w, x, norm, norm_fmt, out, M, K, k_chunk, partial, counters, normed, gathered, index, \
                               x_rows, eps);                                                                     \
    }

GEMV_ENTRY(1)
GEMV_ENTRY(2)
GEMV_ENTRY(4)
GEMV_ENTRY(8)
