// libr4d device rows: the persistent decode GEMV of NVIDIA cards (sm_80 and later), y[M, N] =
// x[M, K] . w[N, K]^T for M <= 4, with every epilogue and folded norm of gemv.cu (gemv_parts.cu
// has the macros and the arithmetic both share). A decode step is a chain of these, so each is
// built to keep HBM busy to its last byte:
// - GS_BLOCKS blocks a multiprocessor, GS_WARPS warps each, and no more blocks than that: block b
//   owns units [b*U/G, (b+1)*U/G) of the U units (GS_UNIT consecutive rows; in mode 2 gate and up
//   rows in pairs), so every multiprocessor streams the same bytes to within a unit, and there is
//   no last partial wave; warp w takes every GS_WARPS-th unit of its block's;
// - a lane keeps GS_DEPTH 16-byte steps of each of its unit's rows in flight in registers, flowing
//   from one unit into the next; the first are issued before the chain prologue's wait (weights
//   do not depend on the kernel before), so a chained launch streams while that kernel drains;
// - GS_AHEAD > 0: entering a unit, a warp also prefetches its unit GS_AHEAD ahead into the L2.
// The arithmetic is gemv.cu's consume, in its order (per lane, a step's products in order, steps
// added in order; the warp's tree): where gemv.cu does not split K, both give the same bits, and a
// fused row gives the bits of the rows it replaces.
#ifndef GS_WARPS
#define GS_WARPS 4
#endif
#ifndef GS_BLOCKS
#define GS_BLOCKS 4
#endif
#ifndef GS_DEPTH
#define GS_DEPTH 4
#endif
#ifndef GS_AHEAD
#define GS_AHEAD 0
#endif
#ifndef GS_UNIT
#define GS_UNIT 2
#endif

// a weight plane's 16 bits, read once
__device__ __forceinline__ u32 r4d_stream_u16(const u16* p) {
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
    return *p;
#else
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
#endif
}

// Where a unit's two rows start: their codes, and (q8_0, q4_1) their scales and minima
struct GsUnit {
    const u8* codes[GS_UNIT];
    const u16* scale[GS_UNIT];
    const u16* minimum[GS_UNIT];
};

template <int FMT>
__device__ __forceinline__ GsUnit gs_unit(const GemvWeights& w, long long unit, int K) {
    GsUnit u;
#pragma unroll
    for (int r = 0; r < GS_UNIT; ++r) {
        GemvRow row = gemv_row(w, unit * GS_UNIT + r);
        u.codes[r] = row.codes + chunk_byte<FMT>(row.row, K, 0);
        u.scale[r] = row.scale + row.row * (K / 32);
        u.minimum[r] = row.minimum + row.row * (K / 32);
    }
    return u;
}

// the unit's rows into the L2: codes, and the planes of their scales and minima
template <int FMT>
__device__ __forceinline__ void gs_prefetch(const GsUnit& u, int K, int lane) {
    const long long bytes = chunk_byte<FMT>(1, K, 0) - chunk_byte<FMT>(0, K, 0);
#pragma unroll
    for (int r = 0; r < GS_UNIT; ++r) {
        for (long long at = lane * 128ll; at < bytes; at += R4D_WARP * 128ll) r4d_prefetch_l2(u.codes[r] + at);
        if (FMT == FMT_Q8_0 || FMT == FMT_Q4_1) {
            if (lane * 64 < K / 32) r4d_prefetch_l2(u.scale[r] + lane * 64);
            if (FMT == FMT_Q4_1 && lane * 64 < K / 32) r4d_prefetch_l2(u.minimum[r] + lane * 64);
        }
    }
}

// One lane's step of a unit: 16 bytes of each row (zeros past K), and the scale and minimum of the
// 32-element block they fall in, as (scale | minimum << 16)
template <int FMT>
struct GsStep {
    uint4 v[GS_UNIT];
    u32 s[GS_UNIT];
};

template <int FMT>
__device__ __forceinline__ GsStep<FMT> gs_load(const GsUnit& u, int step, int lane, int K) {
    const int E = Chunk<FMT>::E;
    GsStep<FMT> st;
    int e = (step * R4D_WARP + lane) * E;
    bool in = e < K;
#pragma unroll
    for (int r = 0; r < GS_UNIT; ++r) {
        st.v[r] = in ? r4d_stream16(u.codes[r] + (long long)(step * R4D_WARP + lane) * 16) : make_uint4(0u, 0u, 0u, 0u);
        st.s[r] = 0u;
        if ((FMT == FMT_Q8_0 || FMT == FMT_Q4_1) && in) {
            st.s[r] = r4d_stream_u16(u.scale[r] + e / 32);
            if (FMT == FMT_Q4_1) st.s[r] |= r4d_stream_u16(u.minimum[r] + e / 32) << 16;
        }
    }
    return st;
}

// A warp's load cursor over its units' steps (unit j is the block's unit first + j * GS_WARPS):
// entering unit j prefetches unit j + GS_AHEAD into the L2; made, it prefetches units 0..GS_AHEAD.
template <int FMT>
struct GsLoader {
    const GemvWeights& w;
    long long first;
    int units, K, lane, unit = 0, step = 0;
    GsUnit rows;

    __device__ __forceinline__ GsLoader(const GemvWeights& w_, long long first_, int units_, int K_, int lane_)
        : w(w_), first(first_), units(units_), K(K_), lane(lane_) {
        for (int j = 1; j <= GS_AHEAD && j < units; ++j) gs_prefetch<FMT>(gs_unit<FMT>(w, first + j * GS_WARPS, K), K, lane);
        rows = gs_unit<FMT>(w, first, K);
        if (GS_AHEAD > 0 && units > 0) gs_prefetch<FMT>(rows, K, lane);
    }

    __device__ __forceinline__ GsStep<FMT> next() {
        const int S = (K + R4D_WARP * Chunk<FMT>::E - 1) / (R4D_WARP * Chunk<FMT>::E);
        GsStep<FMT> st = gs_load<FMT>(rows, step, lane, K);
        if (++step == S) {
            step = 0;
            if (++unit < units) {
                rows = gs_unit<FMT>(w, first + (long long)unit * GS_WARPS, K);
                if (GS_AHEAD > 0 && unit + GS_AHEAD < units) gs_prefetch<FMT>(gs_unit<FMT>(w, first + (long long)(unit + GS_AHEAD) * GS_WARPS, K), K, lane);
            }
        }
        return st;
    }
};

template <int FMT, int MT>
__device__ void gemv_stream(const GemvWeights& w, const float* x, const u8* norm, int norm_fmt, const GemvOut& out,
                            int M, int K, float* normed, float* gathered, const int* index, int x_rows, float eps) {
    const int E = Chunk<FMT>::E, S = (K + R4D_WARP * E - 1) / (R4D_WARP * E);
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    long long units = gemv_rows(w) / GS_UNIT;
    long long u_begin = blockIdx.x * units / gridDim.x, u_end = (blockIdx.x + 1ll) * units / gridDim.x;
    int mine = u_end - u_begin > warp ? (int)((u_end - u_begin - warp + GS_WARPS - 1) / GS_WARPS) : 0;
    const int T = mine * S;  // this warp's steps: its units' S steps each, one after another
    // before the wait: the first steps into registers (and the first units into the L2)
    GsStep<FMT> ring[GS_DEPTH];
    GsLoader<FMT> loader(w, u_begin + warp, mine, K, lane);
#pragma unroll
    for (int p = 0; p < GS_DEPTH; ++p)
        if (p < T) ring[p] = loader.next();
    R4D_CHAIN_PROLOGUE();
    GemvInput<MT> in = gemv_input<MT>(x, norm, norm_fmt, M, K, 0, K, eps, index, x_rows, normed, gathered);
    float acc[GS_UNIT][MT];
#pragma unroll
    for (int r = 0; r < GS_UNIT; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
    float best[MT];
    int best_at[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) { best[m] = __uint_as_float(0xff800000u); best_at[m] = 0x7fffffff; }
    int unit = 0, step = 0;
    for (int i0 = 0; i0 < T; i0 += GS_DEPTH) {
#pragma unroll
        for (int p = 0; p < GS_DEPTH; ++p) {
            if (i0 + p >= T) break;
            GsStep<FMT> now = ring[p];
            if (i0 + p + GS_DEPTH < T) ring[p] = loader.next();
            consume<FMT, MT, GS_UNIT>(now.v, now.s, (step * R4D_WARP + lane) * E, in, acc);
            if (++step < S) continue;
            // the unit's last step: its outputs through the warp's tree, out through the epilogue
            step = 0;
            long long first = (u_begin + warp + (long long)unit * GS_WARPS) * GS_UNIT;
            float totals[GS_UNIT][MT];
#pragma unroll
            for (int r = 0; r < GS_UNIT; ++r)
#pragma unroll
                for (int m = 0; m < MT; ++m) { totals[r][m] = r4d_warp_sum(acc[r][m]); acc[r][m] = 0.0f; }
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < GS_UNIT; ++r) {
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        if (m >= M || (R4D_GEMV_MODE == 2 && r % 2)) continue;
                        gemv_store(w, out, first + r, m, totals[r][m], R4D_GEMV_MODE == 2 ? totals[(r + 1) % GS_UNIT][m] : 0.0f);
                        if (R4D_GEMV_MODE == 3 && r4d_better(totals[r][m], (int)(first + r), best[m], best_at[m])) {
                            best[m] = totals[r][m];
                            best_at[m] = (int)(first + r);
                        }
                    }
                }
            }
            ++unit;
        }
    }
    if (R4D_GEMV_MODE == 3) {  // the block's first maximum of each activation row, over its warps
        __shared__ float s_best[GS_WARPS][8];
        __shared__ int s_best_at[GS_WARPS][8];
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < MT; ++m) { s_best[warp][m] = best[m]; s_best_at[warp][m] = best_at[m]; }
        }
        __syncthreads();
        if (threadIdx.x < M) {
            int m = threadIdx.x;
            float top = s_best[0][m];
            int at = s_best_at[0][m];
            for (int v = 1; v < GS_WARPS; ++v)
                if (r4d_better(s_best[v][m], s_best_at[v][m], top, at)) { top = s_best[v][m]; at = s_best_at[v][m]; }
            out.best[(long long)blockIdx.x * M + m] = top;
            out.best_index[(long long)blockIdx.x * M + m] = at;
        }
    }
}

#define GEMV_STREAM_ENTRY(MT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(GS_WARPS * R4D_WARP, GS_BLOCKS)                                  \
        r4d_gemv_stream_m##MT(const float* x, int M, int K, GEMV_ARGUMENTS) {                                     \
        GEMV_BIND;                                                                                                \
        gemv_stream<R4D_GEMV_FMT, MT>(w, x, norm, norm_fmt, out, M, K, normed, gathered, index, x_rows, eps);    \
    }

GEMV_STREAM_ENTRY(1)
GEMV_STREAM_ENTRY(2)
GEMV_STREAM_ENTRY(4)
