// libr4d device rows: the tensor-core GEMM on Hopper's warpgroup MMA (sm_90a), gemm_mma.cu's job
// (y[M, N] = x[M, K] . w[N, K]^T above the GEMV band, the same two kinds, the same arguments,
// split K and epilogue) where the card is an sm_90: wgmma.mma_async with both operands from shared
// memory, the only way to Hopper's fp8 tensor cores (QGMMA) and its full bf16 rate. Compiled for
// sm_90a (device_tensor_cores.options asks nvrtc for it).
//
// Operands: both are bytes in global memory when this kernel runs. w as stored (bf16 or e4m3); x
// as the rows the step before wrote into the scratch: bf16 (r4d_narrow_bf16_dev, x rounded to
// nearest even) or e4m3 codes (r4d_quantize_e4m3_dev). So one loader serves both operands and both
// kinds, and x crosses L2 as 2 bytes an element, not the f32's 4, for every column tile that reads it.
//
// Work: a block is 128 x 128 outputs, 256 threads: two warpgroups of 64 rows each over the same w
// tile, m64n128k16 (bf16) or m64n128k32 (e4m3), 64 f32 accumulators a thread. K advances 128 bytes
// a step (64 bf16, 128 e4m3). A stage is x's 128 rows then w's 128 rows, each row 128 bytes of K in
// the 128-byte swizzle wgmma reads: the 16-byte chunk c of row r at chunk c ^ (r % 8), 8-row atoms
// of 1024 bytes, every tile 1024-aligned. WG_STAGES = 2 stages of 32 KiB fill the 64 KiB of shared
// memory a launch may have (RAD_MAX_SHARED_BYTES, abi/rad_stream.h): no static shared memory, no
// slack to align (the dynamic area starts 1024-aligned when there is no static shared memory: checked,
// a trap otherwise). Two blocks a multiprocessor (128 registers a thread at most) so that one block's
// MMAs run while the other waits on its copies.
#define WG_BM 128
#define WG_BN 128
#define WG_THREADS 256
#ifndef WG_STAGES
#define WG_STAGES 2
#endif
#ifndef WG_GROUP
#define WG_GROUP 16                        // row tiles a group of blocks goes down before it moves right
#endif
#define WG_TILE_BYTES (128 * 128)          // one operand's tile: 128 rows x 128 bytes of K
#define WG_STAGE_BYTES (2 * WG_TILE_BYTES)  // x's tile, then w's

// The matrix descriptor of a K-major tile in the 128-byte swizzle (sm_90 GMMA descriptor): start
// address / 16 in bits 0-13, leading byte offset / 16 in 16-29 (not used by a swizzled K-major
// tile: one wgmma reads 32 bytes of K, inside a 128-byte row), stride byte offset / 16 in 32-45
// (1024: from one 8-row atom to the next), base offset 0 (atoms 1024-aligned), layout 1 (128B) in
// 62-63. x's and w's tiles alike (A and B are both K-major). Adding 2 to a descriptor moves its
// start 32 bytes along K inside the rows: the card applies the swizzle to the address it forms.
__device__ __forceinline__ u64 wg_desc(const void* tile) {
    u64 address = r4d_smem(tile);
    return ((address & 0x3FFFFull) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// ---- wgmma's PTX (tests/test_gemm_wgmma_on_host.py puts host forms in place of this part)
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// until at most N of this warpgroup's committed groups of MMAs are still in flight
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// the generic proxy's writes to shared memory (cp.async's) made visible to the async proxy (wgmma's reads)
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// the accumulators pinned where they are: no read or write of d moves across this (after a wait)
__device__ __forceinline__ void wg_pin(float* d) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_D64                                                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),  \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),   \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),  \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),  \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),  \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),  \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_D64_TEXT                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d[64] += A . B^T, A 64 x K and B 128 x K from their descriptors (K-major both), f32 accumulation:
// m64n128k16 of bf16, m64n128k32 of e4m3. The immediates: scale d 1, A and B not negated, neither
// transposed (bf16 only: fp8 is K-major always).
template <int KIND>
__device__ __forceinline__ void wg_mma(float* d, u64 a, u64 b) {
    if (KIND == TC_BF16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64_TEXT ", %64, %65, 1, 1, 1, 0, 0;\n"
                     : WG_D64
                     : "l"(a), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_D64_TEXT ", %64, %65, 1, 1, 1;\n"
                     : WG_D64
                     : "l"(a), "l"(b));
}
// ---- end of wgmma's PTX

// One operand's k-tile t into its place in a stage: rows r0.. r0 + 127 of an [rows, K] matrix of
// `eb`-byte elements, 128 rows x 8 chunks of 16 bytes, chunk q of row r at q ^ (r % 8). Thread i
// copies chunk i % 8 of rows i / 8 + 32 j, j < 4 (so one swizzled column a thread: the rows it
// copies are 32 apart, the same r % 8). Past the matrix's rows or K: zeros (the row asks K % 8
// bf16, K % 16 e4m3: a chunk is wholly in K or past it).
__device__ __forceinline__ void wg_load(u8* tile, const u8* matrix, int rows, int K, int eb, int r0, int t) {
    int r = threadIdx.x / 8, q = threadIdx.x % 8, k = t * 128 + q * 16;  // k: bytes along the row
    long long stride = (long long)K * eb;
    u8* into = tile + r * 128 + ((q ^ (r & 7)) << 4);
    const u8* from = matrix + (r0 + r) * stride + k;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        bool full = r0 + r + 32 * j < rows && k < stride;
        r4d_cp_async16(into + j * 32 * 128, full ? from + j * 32 * stride : matrix, full);
    }
}

template <int KIND>
__device__ void wg_gemm(const TcGemm& p) {
    enum { EB = KIND == TC_BF16 ? 2 : 1, KT = 128 / EB };
    extern __shared__ __align__(1024) u8 wg_shared[];
    if (r4d_smem(wg_shared) % 1024) __trap();  // the swizzle's atoms would not be where wgmma reads them
    int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    // The output tile: the grid is (tiles, 1, splits), block b of a split going down a group of
    // WG_GROUP row tiles, then right to the group's next column tile. So the ~264 blocks of a wave
    // (two a multiprocessor) are 16 row tiles of ~16 column tiles, not one row tile of 264: a wave
    // reads each w tile from HBM once (at M 2048, 8B's gate+up: all of w once, not once per row
    // tile) and a group's x rows stay in L2.
    int tiles_m = (p.M + WG_BM - 1) / WG_BM, tiles_n = (p.N + WG_BN - 1) / WG_BN;
    int span = WG_GROUP * tiles_n, first = (int)blockIdx.x / span * WG_GROUP, group = min(WG_GROUP, tiles_m - first);
    int m0 = (first + (int)blockIdx.x % span % group) * WG_BM, n0 = (int)blockIdx.x % span / group * WG_BN;
    int r0 = m0 + warpgroup * 64 + warp * 16 + g;  // this lane's output rows: r0 and r0 + 8 (wgmma's D layout)
    int tiles = (p.K + KT - 1) / KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = t1 - t0;
    const u8* x = (const u8*)p.x;
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;
    // the first WG_STAGES - 1 k-tiles: w's before the chain's wait (the weights are no kernel's
    // output), x's after it; a cp.async group a tile (the first also holds those w tiles)
#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; ++s)
        if (s < count) wg_load(wg_shared + s * WG_STAGE_BYTES + WG_TILE_BYTES, p.w, p.N, p.K, EB, n0, t0 + s);
    R4D_CHAIN_PROLOGUE();
#pragma unroll
    for (int s = 0; s < WG_STAGES - 1; ++s) {
        if (s < count) wg_load(wg_shared + s * WG_STAGE_BYTES, x, p.M, p.K, EB, m0, t0 + s);
        r4d_cp_commit();
    }
    // k-tile i lives in stage i % WG_STAGES. The order of a step, and why:
    //  1. wait for this thread's copies of tile i (WG_STAGES - 2 later groups may stay in flight),
    //     fence them to the async proxy, then the barrier: every thread's copies of tile i are in.
    //  2. issue tile i's 4 MMAs (K 16 or 32 each: the descriptors advanced 32 bytes) and commit them.
    //  3. wait_group 1: this warpgroup's MMAs of tile i - 1 have retired (read their stage), while
    //     tile i's stay in flight; then the barrier: the other warpgroup's have too.
    //  4. only now copy tile i + WG_STAGES - 1 into stage (i - 1) % WG_STAGES, tile i - 1's.
    // So tile i + 1's copies (issued in step 4 of step i - WG_STAGES + 2) land under tile i's MMAs,
    // and no stage is written while an MMA may still read it.
    for (int i = 0; i < count; ++i) {
        u8* stage = wg_shared + (i % WG_STAGES) * WG_STAGE_BYTES;
        r4d_cp_wait<WG_STAGES - 2>();
        wg_proxy_fence();
        __syncthreads();
        u64 a = wg_desc(stage + warpgroup * 64 * 128), b = wg_desc(stage + WG_TILE_BYTES);
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) wg_mma<KIND>(d, a + 2 * j, b + 2 * j);
        wg_commit();
        wg_wait<1>();
        __syncthreads();
        int next = i + WG_STAGES - 1;
        if (next < count) {
            u8* into = wg_shared + (next % WG_STAGES) * WG_STAGE_BYTES;
            wg_load(into, x, p.M, p.K, EB, m0, t0 + next);
            wg_load(into + WG_TILE_BYTES, p.w, p.N, p.K, EB, n0, t0 + next);
        }
        r4d_cp_commit();
    }
    wg_wait<0>();
    wg_pin(d);
    // D's layout (as mma.sync's C per warp of 16 rows): d[i] is row r0 + 8 ((i >> 1) & 1), column
    // n0 + 8 (i >> 2) + 2 tq + (i & 1)
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
    // the flag of the tile's last block in the stages' first word: every copy and MMA has ended
    if (!split || !r4d_last_split(p.counters, (int*)wg_shared)) return;
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
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 2) NAME(                                           \
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
