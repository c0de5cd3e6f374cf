// libr4d device rows: the tensor-core GEMM on Hopper's warpgroup MMA (sm_90a), gemm_mma.cu's job
// (y[M, N] = x[M, K] . w[N, K]^T above the GEMV band, the same two kinds, the same arguments,
// split K and epilogue) where the card is an sm_90: wgmma.mma_async with A from registers and B from
// shared memory, which is the only way to Hopper's fp8 tensor cores (QGMMA) and its full bf16 rate.
// Compiled for sm_90a (device_tensor_cores.options asks nvrtc for it).
//
// Work: a block is 128 x 128 outputs, two warpgroups of 64 rows each over the same w tile. w's tiles
// of 128 rows x 128 bytes of K (64 bf16, 128 e4m3) go by cp.async into WG_STAGES stages of shared
// memory in the 128-byte swizzle wgmma reads (16-byte chunk c of row n at chunk c ^ (n % 8), rows of
// 128 bytes, 8-row atoms of 1024 bytes: the stage base 1024-aligned), made visible to the async
// proxy by fence.proxy.async before the barrier. x needs no shared memory: each lane loads the
// elements of its own A fragments (the m16n8k16 / m16n8k32 layout, per warp 16 rows; a warp's loads
// of one row fill whole 32-byte sectors), a tile ahead, and narrows them (bf16 kind) when it issues
// the tile's 4 wgmmas (K 16 or 32 each, the descriptor advanced 32 bytes inside the swizzled rows).
// Accumulators: 64 floats a thread, the m16n8 C layout over 16 column tiles.
#define WG_BM 128
#define WG_BN 128
#define WG_THREADS 256
#define WG_STAGES 3
#define WG_STAGE_BYTES (WG_BN * 128)

// The matrix descriptor of a K-major tile in the 128-byte swizzle (sm_90 GMMA descriptor): start
// address / 16 in bits 0-13, leading byte offset / 16 in 16-29 (not used by a swizzled K-major
// tile: one wgmma reads 32 bytes of K, inside a 128-byte row), stride byte offset / 16 in 32-45
// (1024: from one 8-row atom to the next), base offset 0 (atoms 1024-aligned), layout 1 (128B) in 62-63.
__device__ __forceinline__ u64 wg_desc(const void* tile) {
    u64 address = r4d_smem(tile);
    return ((address & 0x3FFFFull) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d[64] += a . B (the descriptor's tile), m64n128k16 bf16 x bf16 -> f32, A from registers
__device__ __forceinline__ void wg_mma_bf16(float* d, const u32* a, u64 desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// d[64] += a . B, m64n128k32 e4m3 x e4m3 -> f32, A from registers
__device__ __forceinline__ void wg_mma_e4m3(float* d, const u32* a, u64 desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

template <int KIND>
struct WgTile {
    enum { EB = KIND == TC_BF16 ? 2 : 1, KT = 128 / EB };
};

// w's k-tile t into a stage: 128 rows x 8 chunks of 16 bytes, 4 a thread, swizzled
template <int KIND>
__device__ __forceinline__ void wg_load_w(const TcGemm& p, u8* stage, int t, int n0) {
    typedef WgTile<KIND> T;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int c = threadIdx.x + i * WG_THREADS, r = c / 8, q = c % 8;
        int n = n0 + r, k = t * T::KT + q * (16 / T::EB);
        bool full = n < p.N && k < p.K;
        const u8* src = full ? p.w + ((long long)n * p.K + k) * T::EB : p.w;
        r4d_cp_async16(stage + r * 128 + ((q ^ (r & 7)) << 4), src, full);
    }
}

// This lane's A fragments of x's k-tile t, as loaded: per K step j (16 bf16 or 32 e4m3) the
// fragment's rows r0, r0 + 8 at k (2t or 4t) and k + half. bf16: float2 pairs; e4m3: 4 codes a word.
template <int KIND> struct WgX;
template <> struct WgX<TC_BF16> { float2 f[4][4]; };
template <> struct WgX<TC_E4M3> { u32 c[4][4]; };

__device__ __forceinline__ u32 wg_a(const WgX<TC_BF16>& x, int j, int q) { return r4d_bf16x2(x.f[j][q].x, x.f[j][q].y); }
__device__ __forceinline__ u32 wg_a(const WgX<TC_E4M3>& x, int j, int q) { return x.c[j][q]; }

__device__ __forceinline__ void wg_load_x(const TcGemm& p, WgX<TC_BF16>& x, int j, int i, int m, int k, bool in) {
    x.f[j][i] = in ? __ldg((const float2*)((const float*)p.x + (long long)m * p.K + k)) : make_float2(0.0f, 0.0f);
}
__device__ __forceinline__ void wg_load_x(const TcGemm& p, WgX<TC_E4M3>& x, int j, int i, int m, int k, bool in) {
    x.c[j][i] = in ? __ldg((const u32*)((const u8*)p.x + (long long)m * p.K + k)) : 0u;
}

template <int KIND>
__device__ __forceinline__ void wg_fetch_x(const TcGemm& p, WgX<KIND>& x, int t, int r0) {
    int lane = threadIdx.x % 32, tq = lane % 4;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int m = r0 + (i & 1) * 8;
            int k = KIND == TC_BF16 ? t * 64 + j * 16 + 2 * tq + (i >> 1) * 8 : t * 128 + j * 32 + 4 * tq + (i >> 1) * 16;
            wg_load_x(p, x, j, i, m, k, m < p.M && k < p.K);
        }
}

template <int KIND>
__device__ void wg_gemm(const TcGemm& p) {
    typedef WgTile<KIND> T;
    extern __shared__ __align__(1024) u8 wg_shared[];
    // the dynamic area's start as the runtime places it, rounded up to 1024 for the swizzle atoms
    u8* stages = (u8*)(((unsigned long long)wg_shared + 1023) & ~1023ull);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    int m0 = blockIdx.y * WG_BM, n0 = blockIdx.x * WG_BN;
    int r0 = m0 + (warp / 4) * 64 + (warp % 4) * 16 + g;  // this lane's fragment rows: r0 and r0 + 8
    int tiles = (p.K + T::KT - 1) / T::KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = t1 - t0;
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; ++s) {  // the weights' first tiles, before the chain's wait
        if (s < count) wg_load_w<KIND>(p, stages + s * WG_STAGE_BYTES, t0 + s, n0);
        r4d_cp_commit();
    }
    R4D_CHAIN_PROLOGUE();
    WgX<KIND> x;
    if (count > 0) wg_fetch_x<KIND>(p, x, t0, r0);
    for (int i = 0; i < count; ++i) {
        r4d_cp_wait<WG_STAGES - 2>();  // tile i's group has landed
        wg_proxy_fence();              // ... and is visible to the tensor cores' (async) proxy
        __syncthreads();               // for every thread; every warpgroup is done with tile i - 1
        int next = i + WG_STAGES - 1;
        if (next < count) wg_load_w<KIND>(p, stages + (next % WG_STAGES) * WG_STAGE_BYTES, t0 + next, n0);
        r4d_cp_commit();
        u32 a[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q)
                a[j][q] = wg_a(x, j, q);
        if (i + 1 < count) wg_fetch_x<KIND>(p, x, t0 + i + 1, r0);  // in flight under this tile's products
        u64 desc = wg_desc(stages + (i % WG_STAGES) * WG_STAGE_BYTES);
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (KIND == TC_BF16) wg_mma_bf16(d, a[j], desc + 2 * j);  // +32 bytes of K a step
            else wg_mma_e4m3(d, a[j], desc + 2 * j);
        }
        wg_commit();
        wg_wait0();
    }
    bool split = gridDim.z > 1;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        int m = r0 + ((i >> 1) & 1) * 8, n = n0 + (i >> 2) * 8 + 2 * tq + (i & 1);
        if (m < p.M && n < p.N) {
            if (split) p.partial[((long long)blockIdx.z * p.M + m) * p.N + n] = d[i];
            else p.y[(long long)m * p.N + n] = tc_finish<KIND>(p, m, n, d[i]);
        }
        // one column tile's scales at a time: hoisting all 64 outputs' loads spilled the e4m3 kernel
        if ((i & 3) == 3) asm volatile("" ::: "memory");
    }
    if (!split || !r4d_last_split(p.counters)) return;
#pragma unroll
    for (int i = 0; i < 64; ++i) {  // the tile's last block: every split's sums, added in split order
        int m = r0 + ((i >> 1) & 1) * 8, n = n0 + (i >> 2) * 8 + 2 * tq + (i & 1);
        if (m >= p.M || n >= p.N) continue;
        float sum = 0.0f;
        for (int s = 0; s < (int)gridDim.z; ++s) sum += r4d_load_l2(p.partial + ((long long)s * p.M + m) * p.N + n);
        p.y[(long long)m * p.N + n] = tc_finish<KIND>(p, m, n, sum);
    }
}

#define WG_GEMM_ENTRY(KIND, NAME)                                                                                \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) NAME(                                           \
        const void* x, const float* x_scale, const u8* w, const float* w_scale, int w_stride, float* y,           \
        float* partial, u32* counters, int M, int N, int K, int tiles_per_split) {                               \
        TcGemm p = {x, x_scale, w, w_scale, w_stride, y, partial, counters, M, N, K, tiles_per_split};           \
        wg_gemm<KIND>(p);                                                                                        \
    }

// One entry a compile, as gemm_mma.cu (-DR4D_WG_ONLY=1 or 2; 0: both, the compile test)
#ifndef R4D_WG_ONLY
#define R4D_WG_ONLY 0
#endif
#if R4D_WG_ONLY == 0 || R4D_WG_ONLY == 1
WG_GEMM_ENTRY(TC_BF16, r4d_wgmma_gemm_bf16)
#endif
#if R4D_WG_ONLY == 0 || R4D_WG_ONLY == 2
WG_GEMM_ENTRY(TC_E4M3, r4d_wgmma_gemm_e4m3)
#endif
