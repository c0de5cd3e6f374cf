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
// From GEMV_TC_FROM activation rows (bf16 and e4m3 weights, NVIDIA sm_80 and later) the products
// run on tensor cores instead (gemv_tc below): the same bytes streamed, an eighth of the instructions.
#ifndef GEMV_WARPS
#define GEMV_WARPS 4
#endif
#ifndef GEMV_ROWS
#define GEMV_ROWS 8  // even: silu * mul pairs a gate row with its up row inside one warp
#endif
#ifndef GEMV_PIPE
#define GEMV_PIPE 1
#endif
#define GEMV_GROUP (GEMV_WARPS * GEMV_ROWS)

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

#ifndef GEMV_TC_FROM
#define GEMV_TC_FROM 8  // the fewest register rows (MT) the tensor-core path serves
#endif
#ifndef GEMV_TC_PIPE
#define GEMV_TC_PIPE (2 * GEMV_PIPE)  // tensor-core path: steps a lane keeps in flight (a chunk of each tile a step)
#endif
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIP_PLATFORM_AMD__)) || defined(R4D_GEMV_TC_ON_HOST)
#define GEMV_TC 1
#else
#define GEMV_TC 0
#endif
#if GEMV_TC && !defined(R4D_GEMV_TC_ON_HOST)
// d += a . b, mma.m16n8k16, bf16 in, f32 accumulation (fragments: tensor_core.cu's header). tensor_core.cu's
// r4d_mma_bf16 is the same instruction; that file is NVIDIA's alone, and this one is built for AMD too.
__device__ __forceinline__ void gemv_mma(float* d, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats as bf16 rounded to nearest even, `lo` in the low half
__device__ __forceinline__ u32 gemv_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

// The FMA path: the warp's GEMV_ROWS rows (from `first`), lanes over K, its sums in `totals` (every lane).
template <int FMT, int MT>
__device__ __forceinline__ void gemv_fma(const GemvWeights& w, const u8* norm, int norm_fmt, const float* x, int M, int K, int k_begin,
                         int k_end, float* normed, float* gathered, const int* index, int x_rows, float eps,
                         float (*totals)[MT]) {
    const int E = Chunk<FMT>::E, S = R4D_WARP * E;
    const int N = gemv_rows(w);
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    long long first = ((long long)blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
    GemvRow rows[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r) rows[r] = gemv_row(w, min(first + r, (long long)N - 1), true);  // past N: row N-1, stored nowhere
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
    GemvInput<MT> in = gemv_input<MT>(x, norm, norm_fmt, M, K, k_begin, k_end, eps, index, x_rows, normed, gathered);
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
            u32 sc[GEMV_ROWS];
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) sc[r] = gemv_scales<FMT>(rows[r], K, at);
            consume<FMT, MT, GEMV_ROWS>(now, sc, at, in, acc);
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) totals[r][m] = r4d_warp_sum(acc[r][m]);
}

template <int FMT, int MT>
struct GemvTc {
    enum { on = GEMV_TC && R4D_WARP == 32 && MT >= GEMV_TC_FROM &&
                (FMT == FMT_BF16 || FMT == FMT_Q8_0 || FMT == FMT_Q4_1 || R4D_FP8(FMT)) && GEMV_GROUP % 8 == 0 };
};

#if GEMV_TC
// Four activation elements as [bf16 hi of (0, 1), hi of (2, 3)] and the remainders
// x - hi likewise: hi + lo carries 16 significant bits of each f32, so the products agree with f32
// arithmetic to about 2^-17 of each term.
__device__ __forceinline__ void gemv_tc_split(float4 a, u32* hi, u32* lo) {
    hi[0] = gemv_bf16x2(a.x, a.y);
    hi[1] = gemv_bf16x2(a.z, a.w);
    lo[0] = gemv_bf16x2(a.x - __uint_as_float(hi[0] << 16), a.y - __uint_as_float(hi[0] & 0xffff0000u));
    lo[1] = gemv_bf16x2(a.z - __uint_as_float(hi[1] << 16), a.w - __uint_as_float(hi[1] & 0xffff0000u));
}

// A lane's chunk of a weight row on the tensor-core path: 16 bytes, but 8 codes of a block format (8
// bytes of q8_0, 4 of q4_1), so that the four lanes of a row cover one block of 32 and an MMA's k
// never spans two blocks' scales
template <int FMT>
__device__ __forceinline__ uint4 gemv_tc_load(const u8* p) {
    if (FMT != FMT_Q8_0 && FMT != FMT_Q4_1) return r4d_stream16(p);
    uint2 v = {0u, 0u};
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__) || !defined(__CUDA_ARCH__)
    if (FMT == FMT_Q8_0) v = *(const uint2*)p;
    else v.x = *(const u32*)p;
#else
    if (FMT == FMT_Q8_0) asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    else asm("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v.x) : "l"(p));
#endif
    return make_uint4(v.x, v.y, 0u, 0u);
}

// The block's GEMV_GROUP rows on tensor cores: y^T = [x_hi; x_lo] . w^T as mma.m16n8k16, A's rows
// 0..7 the activation rows as bf16 and rows 8..15 their remainders, B eight weight rows (a tile).
// Every warp takes all GEMV_GROUP / 8 tiles and every GEMV_WARPS-th step of the block's K chunk; a
// step is 4 E elements of each row. Lane (group g, thread t) streams 16 bytes of each tile's row g at
// element step + t E: a dot product may add its k in any order, so those E elements fill the lane's
// k slots of E / 4 MMAs, and the lane's activation row g (the last row past MT) gives the same
// elements. q8_0 and q4_1: a lane streams 8 codes (a step is one block), the block's MMAs go to a
// fresh accumulator, and its sums join the lane's outputs times their rows' block scales (q4_1: less
// the minimum times the block's activation sum), as the FMA path scales each block's sum. The warps' parts meet in shared memory and are added in warp order;
// `totals` gets the rows the FMA path's warp would own (warp w: rows w * GEMV_ROWS ...), in every lane.
template <int FMT, int MT>
__device__ __forceinline__ void gemv_tc(const GemvWeights& w, const u8* norm, int norm_fmt, const float* x, int M, int K, int k_begin,
                        int k_end, float* normed, float* gathered, const int* index, int x_rows, float eps,
                        float (*totals)[MT]) {
    const bool BLOCKS = FMT == FMT_Q8_0 || FMT == FMT_Q4_1;  // a scale (and a minimum) a block of 32
    const int E = BLOCKS ? 8 : Chunk<FMT>::E, STEP = 4 * E, TILES = GEMV_GROUP / 8;
    const int N = gemv_rows(w);
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP, g = lane / 4, t = lane % 4;
    long long base = (long long)blockIdx.x * GEMV_GROUP;
    GemvRow rows[TILES], out_rows[TILES][2];  // the row a lane streams; the rows of its outputs (their scales)
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
        rows[i] = gemv_row(w, min(base + 8 * i + g, (long long)N - 1));
        out_rows[i][0] = gemv_row(w, min(base + 8 * i + 2 * t, (long long)N - 1));
        out_rows[i][1] = gemv_row(w, min(base + 8 * i + 2 * t + 1, (long long)N - 1));
    }
    int steps = (k_end - k_begin + STEP - 1) / STEP;
    uint4 v[GEMV_TC_PIPE][TILES];
    u32 sv[GEMV_TC_PIPE][TILES][2];  // blocks: the step's block scales of the lane's two output rows
#pragma unroll
    for (int q = 0; q < GEMV_TC_PIPE; ++q) {
        int at = k_begin + (warp + q * GEMV_WARPS) * STEP, e = at + t * E;
#pragma unroll
        for (int i = 0; i < TILES; ++i) {
            v[q][i] = e < k_end ? gemv_tc_load<FMT>(rows[i].codes + chunk_byte<FMT>(rows[i].row, K, e)) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int c = 0; c < 2; ++c) sv[q][i][c] = BLOCKS && at < k_end ? gemv_scales<FMT>(out_rows[i][c], K, at) : 0u;
        }
    }
    R4D_CHAIN_PROLOGUE();
    GemvInput<MT> in = gemv_input<MT>(x, norm, norm_fmt, M, K, k_begin, k_end, eps, index, x_rows, normed, gathered);
    // this lane's activation row, its scale and whether it is a NaN row (constant indices only)
    const float* xr = in.row[0];
    float xs = in.scale[0];
    bool bad = in.bad[0];
#pragma unroll
    for (int m = 1; m < MT; ++m)
        if (min(g, MT - 1) == m) { xr = in.row[m]; xs = in.scale[m]; bad = in.bad[m]; }
    float d[TILES][4];
#pragma unroll
    for (int i = 0; i < TILES; ++i) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
    for (int s0 = warp; s0 < steps; s0 += GEMV_TC_PIPE * GEMV_WARPS) {
#pragma unroll
        for (int q = 0; q < GEMV_TC_PIPE; ++q) {
            int s = s0 + q * GEMV_WARPS;
            if (s >= steps) break;  // the same for the whole warp: every lane reaches each MMA
            int at = k_begin + s * STEP, e = at + t * E, ahead = GEMV_TC_PIPE * GEMV_WARPS * STEP;
            uint4 now[TILES];
            u32 scales[TILES][2];
#pragma unroll
            for (int i = 0; i < TILES; ++i) {
                now[i] = v[q][i];
                scales[i][0] = sv[q][i][0];
                scales[i][1] = sv[q][i][1];
                if (e + ahead < k_end) v[q][i] = gemv_tc_load<FMT>(rows[i].codes + chunk_byte<FMT>(rows[i].row, K, e + ahead));
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if (BLOCKS && at + ahead < k_end) sv[q][i][c] = gemv_scales<FMT>(out_rows[i][c], K, at + ahead);
            }
            float block[TILES][4], sum = 0.0f;  // blocks: this block's sums before its scales; q4_1: x's sum
#pragma unroll
            for (int i = 0; i < TILES; ++i) block[i][0] = block[i][1] = block[i][2] = block[i][3] = 0.0f;
            bool here = e < k_end;  // past the chunk: zeros, still at the MMA
#pragma unroll
            for (int j = 0; j < E / 4; ++j) {
                u32 a[4] = {0u, 0u, 0u, 0u};
                if (here) {
                    float4 xv = __ldg((const float4*)(xr + e + 4 * j));
                    if (R4D_GEMV_NORM) {
                        float4 nw = gemv_norm4(in.norm, in.norm_fmt, e + 4 * j);
                        xv.x = (xv.x * xs) * nw.x; xv.y = (xv.y * xs) * nw.y; xv.z = (xv.z * xs) * nw.z; xv.w = (xv.w * xs) * nw.w;
                        if (bad) xv.x = xv.y = xv.z = xv.w = __uint_as_float(0x7fc00000u);
                    }
                    if (FMT == FMT_Q4_1) sum += (xv.x + xv.y) + (xv.z + xv.w);
                    u32 hi[2], lo[2];
                    gemv_tc_split(xv, hi, lo);
                    a[0] = hi[0]; a[1] = lo[0]; a[2] = hi[1]; a[3] = lo[1];
                }
#pragma unroll
                for (int i = 0; i < TILES; ++i) {
                    u32 b0, b1;
                    if (FMT == FMT_BF16) {
                        u32 word[4] = {now[i].x, now[i].y, now[i].z, now[i].w};
                        b0 = word[2 * j]; b1 = word[2 * j + 1];
                    } else {  // e4m3, q8_0 and q4_1 codes: exact in bf16, so the pairs' conversion rounds nothing
                        float c[4];
                        decode4<FMT>(now[i], j, c);
                        b0 = gemv_bf16x2(c[0], c[1]);
                        b1 = gemv_bf16x2(c[2], c[3]);
                    }
                    gemv_mma(BLOCKS ? block[i] : d[i], a, b0, b1);
                }
            }
            if (BLOCKS) {
                if (FMT == FMT_Q4_1) {  // the block's sum of activation row g: the lane's and its group's three others
                    sum += R4D_SHFL_XOR(sum, 1);
                    sum += R4D_SHFL_XOR(sum, 2);
                }
#pragma unroll
                for (int i = 0; i < TILES; ++i)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float s = r4d_f16(scales[i][c] & 0xffffu), y = block[i][c] + block[i][c + 2];
                        d[i][c] = FMT == FMT_Q4_1 ? __fmaf_rn(s, y, __fmaf_rn(-r4d_f16(scales[i][c] >> 16), sum, d[i][c]))
                                                  : __fmaf_rn(s, y, d[i][c]);
                    }
            }
        }
    }
    // C: lane (g, t) holds (activation row g, tile rows 2t and 2t + 1) and the remainders' same
    __shared__ float s_part[GEMV_WARPS][GEMV_GROUP][8];
#pragma unroll
    for (int i = 0; i < TILES; ++i)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float y = BLOCKS ? d[i][c] : d[i][c] + d[i][c + 2];  // (blocks: each block's halves added already)
            if (R4D_FP8(FMT)) y *= __uint_as_float(gemv_scales<FMT>(out_rows[i][c], K, 0));
            s_part[warp][8 * i + 2 * t + c][g] = y;
        }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float total = 0.0f;
#pragma unroll
            for (int p = 0; p < GEMV_WARPS; ++p) total += s_part[p][warp * GEMV_ROWS + r][m];
            totals[r][m] = total;
        }
}
#endif

template <int FMT, int MT>
__device__ void gemv(const GemvWeights& w, const float* x, const u8* norm, int norm_fmt, const GemvOut& out, int M, int K,
                     int k_chunk, float* partial, u32* counters, float* normed, float* gathered, const int* index,
                     int x_rows, float eps) {
    const int N = gemv_rows(w);
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    long long first = ((long long)blockIdx.x * GEMV_WARPS + warp) * GEMV_ROWS;
    int k_begin = (int)blockIdx.y * k_chunk, k_end = min(K, k_begin + k_chunk);
    float totals[GEMV_ROWS][MT];
#if GEMV_TC
    if constexpr (GemvTc<FMT, MT>::on)
        gemv_tc<FMT, MT>(w, norm, norm_fmt, x, M, K, k_begin, k_end, normed, gathered, index, x_rows, eps, totals);
    else
#endif
        gemv_fma<FMT, MT>(w, norm, norm_fmt, x, M, K, k_begin, k_end, normed, gathered, index, x_rows, eps, totals);
    bool split = gridDim.y > 1;
    __shared__ float s_total[GEMV_GROUP][8];  // mode 3: the row group's outputs, for its argmax
    if (split && lane == 0)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m)
                if (m < M && first + r < N) partial[((long long)blockIdx.y * M + m) * N + first + r] = totals[r][m];
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
        const float* x, int M, int K, int k_chunk, float* partial, u32* counters, GEMV_ARGUMENTS) {              \
        GEMV_BIND;                                                                                                \
        gemv<R4D_GEMV_FMT, MT>(w, x, norm, norm_fmt, out, M, K, k_chunk, partial, counters, normed, gathered, index, \
                               x_rows, eps);                                                                     \
    }

GEMV_ENTRY(1)
GEMV_ENTRY(2)
GEMV_ENTRY(4)
GEMV_ENTRY(8)
