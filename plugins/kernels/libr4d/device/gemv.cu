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
    if (R4D_GEMV_NORM) {  // this block's slice of its K chunk of the normed (and gathered) rows, in whole float4s
        long long quads = (k_end - k_begin) / 4;
        int lo = k_begin + 4 * (int)(blockIdx.x * quads / gridDim.x);
        int hi = blockIdx.x + 1 == gridDim.x ? k_end : k_begin + 4 * (int)((blockIdx.x + 1ll) * quads / gridDim.x);
        gemv_norm<MT>(in, x, M, K, lo, hi, eps, index, x_rows, normed, gathered);
    }
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
        const float* x, int M, int K, int k_chunk, float* partial, u32* counters, GEMV_ARGUMENTS) {              \
        GEMV_BIND;                                                                                                \
        gemv<R4D_GEMV_FMT, MT>(w, x, norm, norm_fmt, out, M, K, k_chunk, partial, counters, normed, gathered, index, \
                               x_rows, eps);                                                                     \
    }

GEMV_ENTRY(1)
GEMV_ENTRY(2)
GEMV_ENTRY(4)
GEMV_ENTRY(8)
