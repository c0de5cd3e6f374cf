// libr4d device rows: the tensor-core GEMM, y[M, N] = x[M, K] . w[N, K]^T above the GEMV band
// (prefill chunks, batched decode), on mma.sync (sm_80 and later). Two kinds, one structure:
// - bf16: w bf16 as stored; x f32, rounded to bf16 (nearest even) on its way into shared memory;
//   m16n8k16 products of bf16, f32 accumulation.
// - e4m3: w OCP e4m3 codes with an f32 scale per row (or one for the whole weight: stride 0); x
//   quantised per row by r4d_quantize_e4m3_dev first (codes x / s_m, s_m = amax_m / 448, in the
//   row's scratch); m16n8k32 products of e4m3 (sm_89 and later), f32 accumulation, then
//   y = (acc * s_m) * w_scale[n].
// Tiles: BM x 128 outputs a block (BM 64 or 128), 256 threads as 2 x 4 warps of BM/2 x 32 each; K
// in steps of 64 bytes (32 bf16, 64 e4m3), TC_STAGES deep in dynamic shared memory, rows padded
// to 80 bytes so that ldmatrix reads without bank conflicts. w (and e4m3's x) arrive by cp.async;
// bf16's x is loaded a tile ahead into registers and narrowed as it is stored. gridDim.z > 1 splits
// K (batched decode: too few tiles to fill the card) and adds the splits in order (tensor_core.cu).
// Past M, N or K a tile reads zeros and stores nothing. The row asks K % 8 (bf16) or K % 16 (e4m3)
// and 16-byte aligned operands, so a 16-byte chunk is wholly inside K or wholly past it.
#define TC_BN 128
#define TC_THREADS 256
#define TC_STAGES 3
#define TC_ROW 80  // bytes a shared-memory row: 64 of K, 16 of padding
template <int KIND, int BM>
struct TcTile {
    enum { EB = KIND == TC_BF16 ? 2 : 1, KT = 64 / EB, MT = BM / 32, NT = 4, A_BYTES = BM * TC_ROW,
           B_BYTES = TC_BN * TC_ROW, STAGE = A_BYTES + B_BYTES };
};

// w's k-tile t into a stage: 128 rows x 4 chunks of 16 bytes, two a thread
template <int KIND, int BM>
__device__ __forceinline__ void tc_load_w(const TcGemm& p, u8* stage, int t, int n0) {
    typedef TcTile<KIND, BM> T;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int c = threadIdx.x + i * TC_THREADS, r = c / 4, q = c % 4;
        int n = n0 + r, k = t * T::KT + q * (16 / T::EB);
        bool full = n < p.N && k < p.K;
        const u8* src = full ? p.w + ((long long)n * p.K + k) * T::EB : p.w;
        r4d_cp_async16(stage + T::A_BYTES + r * TC_ROW + q * 16, src, full);
    }
}

// e4m3's x: the codes' k-tile t, BM rows x 4 chunks of 16 bytes
template <int BM>
__device__ __forceinline__ void tc_load_codes(const TcGemm& p, u8* stage, int t, int m0) {
#pragma unroll
    for (int i = 0; i < BM * 4 / TC_THREADS; ++i) {
        int c = threadIdx.x + i * TC_THREADS, r = c / 4, q = c % 4;
        int m = m0 + r, k = t * 64 + q * 16;
        bool full = m < p.M && k < p.K;
        const u8* src = full ? (const u8*)p.x + (long long)m * p.K + k : (const u8*)p.x;
        r4d_cp_async16(stage + r * TC_ROW + q * 16, src, full);
    }
}

// bf16's x: the f32 k-tile t into registers (BM rows x 8 float4, BM / 32 a thread) ...
template <int BM>
__device__ __forceinline__ void tc_fetch_x(const TcGemm& p, float4* v, int t, int m0) {
#pragma unroll
    for (int i = 0; i < BM / 32; ++i) {
        int c = threadIdx.x + i * TC_THREADS, r = c / 8, q = c % 8;
        int m = m0 + r, k = t * 32 + q * 4;
        v[i] = (m < p.M && k < p.K) ? __ldg((const float4*)((const float*)p.x + (long long)m * p.K + k))
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// ... and from there into a stage as bf16
template <int BM>
__device__ __forceinline__ void tc_store_x(const float4* v, u8* stage) {
#pragma unroll
    for (int i = 0; i < BM / 32; ++i) {
        int c = threadIdx.x + i * TC_THREADS, r = c / 8, q = c % 8;
        *(uint2*)(stage + r * TC_ROW + q * 8) = make_uint2(r4d_bf16x2(v[i].x, v[i].y), r4d_bf16x2(v[i].z, v[i].w));
    }
}

// One stage's products: two steps of 32 bytes of K, each an A fragment per m-tile (ldmatrix x4) and
// a B fragment per n-tile (ldmatrix x4 covers two n-tiles)
template <int KIND, int BM>
__device__ __forceinline__ void tc_compute(const u8* stage, int wm, int wn, float (*acc)[4][4]) {
    typedef TcTile<KIND, BM> T;
    int lane = threadIdx.x % 32;
    const u8* as = stage;
    const u8* bs = stage + T::A_BYTES;
#pragma unroll
    for (int kb = 0; kb < 64; kb += 32) {
        u32 a[T::MT][4], b[T::NT][2];
#pragma unroll
        for (int mt = 0; mt < T::MT; ++mt)
            r4d_ldmatrix_x4(a[mt], as + (wm * (BM / 2) + mt * 16 + lane % 16) * TC_ROW + kb + (lane / 16) * 16);
#pragma unroll
        for (int np = 0; np < T::NT / 2; ++np) {
            u32 r[4];
            r4d_ldmatrix_x4(r, bs + (wn * 32 + np * 16 + (lane / 16) * 8 + lane % 8) * TC_ROW + kb + ((lane / 8) % 2) * 16);
            b[2 * np][0] = r[0]; b[2 * np][1] = r[1]; b[2 * np + 1][0] = r[2]; b[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < T::NT; ++nt) {
                if (KIND == TC_BF16) r4d_mma_bf16(acc[mt][nt], a[mt], b[nt]);
                else r4d_mma_e4m3(acc[mt][nt], a[mt], b[nt]);
            }
    }
}

template <int KIND, int BM>
__device__ void tc_gemm(const TcGemm& p) {
    typedef TcTile<KIND, BM> T;
    extern __shared__ __align__(128) u8 tc_shared[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp / 4, wn = warp % 4;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * TC_BN;
    int tiles = (p.K + T::KT - 1) / T::KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = t1 - t0;
    float acc[T::MT][T::NT][4];
#pragma unroll
    for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    // the weights' first tiles before the chain prologue's wait: no kernel writes them
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; ++s) {
        if (s < count) tc_load_w<KIND, BM>(p, tc_shared + s * T::STAGE, t0 + s, n0);
        if (KIND == TC_BF16) r4d_cp_commit();
    }
    R4D_CHAIN_PROLOGUE();
    float4 xv[KIND == TC_BF16 ? BM / 32 : 1];
    if (KIND == TC_BF16) {
        if (count > 0) {
            tc_fetch_x<BM>(p, xv, t0, m0);
            tc_store_x<BM>(xv, tc_shared);
        }
        if (count > 1) tc_fetch_x<BM>(p, xv, t0 + 1, m0);
    } else {
        // the codes' first tiles, a group each; group 0 also takes the weights' first tiles (issued
        // above, not yet committed), so group s holds all of tile s
#pragma unroll
        for (int s = 0; s < TC_STAGES - 1; ++s) {
            if (s < count) tc_load_codes<BM>(p, tc_shared + s * T::STAGE, t0 + s, m0);
            r4d_cp_commit();
        }
    }
    for (int i = 0; i < count; ++i) {
        r4d_cp_wait<TC_STAGES - 2>();  // tile i's group has landed
        __syncthreads();               // ... for every thread; and every thread is done with tile i - 1
        int next = i + TC_STAGES - 1;   // into the stage tile i - 1 used
        u8* refill = tc_shared + (next % TC_STAGES) * T::STAGE;
        if (next < count) {
            tc_load_w<KIND, BM>(p, refill, t0 + next, n0);
            if (KIND == TC_E4M3) tc_load_codes<BM>(p, refill, t0 + next, m0);
        }
        r4d_cp_commit();  // an empty group past the end keeps the count of groups in step
        if (KIND == TC_BF16 && i + 1 < count) {
            tc_store_x<BM>(xv, tc_shared + ((i + 1) % TC_STAGES) * T::STAGE);  // tile i + 1, read after the next barrier
            if (i + 2 < count) tc_fetch_x<BM>(p, xv, t0 + i + 2, m0);
        }
        tc_compute<KIND, BM>(tc_shared + (i % TC_STAGES) * T::STAGE, wm, wn, acc);
    }
    int g = lane / 4, t = lane % 4;
    bool split = gridDim.z > 1;
#pragma unroll
    for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int m = m0 + wm * (BM / 2) + mt * 16 + g + (i / 2) * 8, n = n0 + wn * 32 + nt * 8 + 2 * t + i % 2;
                if (m >= p.M || n >= p.N) continue;
                if (split) p.partial[((long long)blockIdx.z * p.M + m) * p.N + n] = acc[mt][nt][i];
                else p.y[(long long)m * p.N + n] = tc_finish<KIND>(p, m, n, acc[mt][nt][i]);
            }
    if (!split || !r4d_last_split(p.counters)) return;
    // the tile's last block: every split's sums at this thread's outputs, added in split order
#pragma unroll
    for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < T::NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int m = m0 + wm * (BM / 2) + mt * 16 + g + (i / 2) * 8, n = n0 + wn * 32 + nt * 8 + 2 * t + i % 2;
                if (m >= p.M || n >= p.N) continue;
                float sum = 0.0f;
                for (int s = 0; s < (int)gridDim.z; ++s) sum += r4d_load_l2(p.partial + ((long long)s * p.M + m) * p.N + n);
                p.y[(long long)m * p.N + n] = tc_finish<KIND>(p, m, n, sum);
            }
}

#define TC_GEMM_ENTRY(KIND, BM, NAME)                                                                             \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 2) NAME(                                             \
        const void* x, const float* x_scale, const u8* w, const float* w_scale, int w_stride, float* y,           \
        float* partial, u32* counters, int M, int N, int K, int tiles_per_split) {                               \
        TcGemm p = {x, x_scale, w, w_scale, w_stride, y, partial, counters, M, N, K, tiles_per_split};           \
        tc_gemm<KIND, BM>(p);                                                                                    \
    }

// A launch compiles only the entry it needs (-DR4D_TC_ONLY=n, device_tensor_cores.options): each
// takes nvrtc seconds. Without it, every entry (the compile test).
#ifndef R4D_TC_ONLY
#define R4D_TC_ONLY 0
#endif
#if R4D_TC_ONLY == 0 || R4D_TC_ONLY == 1
TC_GEMM_ENTRY(TC_BF16, 64, r4d_mma_gemm_bf16_m64)
#endif
#if R4D_TC_ONLY == 0 || R4D_TC_ONLY == 2
TC_GEMM_ENTRY(TC_BF16, 128, r4d_mma_gemm_bf16_m128)
#endif
#if R4D_TC_ONLY == 0 || R4D_TC_ONLY == 3
TC_GEMM_ENTRY(TC_E4M3, 64, r4d_mma_gemm_e4m3_m64)
#endif
#if R4D_TC_ONLY == 0 || R4D_TC_ONLY == 4
TC_GEMM_ENTRY(TC_E4M3, 128, r4d_mma_gemm_e4m3_m128)
#endif
