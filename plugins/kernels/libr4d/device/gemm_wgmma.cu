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
// The cut (device_tensor_cores.WgmmaCut passes these; R4D_WG_CUT picks one for a process):
//   WG_WARPGROUPS  warpgroups of 128 threads, 64 rows of x each: a block is WG_BM = 64 WG_WARPGROUPS rows
//   WG_BN          columns of a block (w's rows): 128 or 256, m64nWG_BN MMAs, WG_BN / 2 f32 accumulators a thread
//                  (112: gemm_tma.cu's cut alone, whose two stages of 128 bytes of K must leave room for barriers)
//   WG_KB          bytes of K a stage holds of each row: 128, 64 or 32, stored in the swizzle of that
//                  width (the 16-byte chunk c of byte b of a tile at c ^ ((b >> 7) & (WG_KB / 16 - 1)),
//                  8-row atoms of 8 WG_KB bytes); WG_KB / 32 MMAs a stage (each reads 32 bytes of K:
//                  16 bf16, 32 e4m3)
//   WG_STAGES      stages of x's WG_BM rows then w's WG_BN rows, (WG_BM + WG_BN) WG_KB bytes each;
//                  all of them in the 64 KiB a launch may have (RAD_MAX_SHARED_BYTES, abi/rad_stream.h)
//   WG_DEPTH       k-tiles of MMAs a warpgroup leaves in flight after a step (wait_group WG_DEPTH):
//                  1 or 2; 2 keeps the tensor cores two tiles deep while the block's threads pass
//                  the barriers and issue copies, at one stage fewer of copies in flight
// No static shared memory and no slack to align: the dynamic area starts 1024-aligned when there is
// no static shared memory (checked: a trap otherwise). Why several cuts: a 128 x 128 block moves 1
// byte of shared memory for 64 flops, and at two such blocks a multiprocessor keeps ~64 KiB of copies
// in flight; whether the tensor cores then wait on the latency of those copies (more, smaller stages:
// WG_KB 64, 4 stages) or on L2's bandwidth (a wider block: 128 x 256 moves 1 byte for 85 flops) is the
// card's to say (bench/card_prefill_gemm.py --cuts).
// (the defaults are device_tensor_cores.CUTS[0]; options() passes every cut's macros, these included)
#ifndef WG_WARPGROUPS
#define WG_WARPGROUPS 2
#endif
#ifndef WG_BN
#define WG_BN 256
#endif
#ifndef WG_KB
#define WG_KB 32
#endif
#ifndef WG_STAGES
#define WG_STAGES 5
#endif
#ifndef WG_DEPTH
#define WG_DEPTH 2
#endif
#ifndef WG_GROUP
#define WG_GROUP 16                        // row tiles a group of blocks goes down before it moves right
#endif
#define WG_BM (64 * WG_WARPGROUPS)
#define WG_THREADS (128 * WG_WARPGROUPS)
#define WG_ACC (WG_BN / 2)                 // f32 accumulators a thread: m64nWG_BN's D over 128 threads
#define WG_X_BYTES (WG_BM * WG_KB)          // x's tile in a stage, then w's (WG_BN * WG_KB)
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * WG_KB)
// two blocks a multiprocessor where their accumulators fit the registers (2 x 256 threads of at most
// 128: 64 accumulators each), one otherwise
#define WG_BLOCKS (WG_THREADS * WG_ACC <= 256 * 64 ? 2 : 1)
// the descriptor's layout type of the swizzle: 1 = 128-byte, 2 = 64-byte, 3 = 32-byte
#define WG_LAYOUT (WG_KB == 128 ? 1 : WG_KB == 64 ? 2 : 3)
#if (WG_KB != 128 && WG_KB != 64 && WG_KB != 32) || (WG_BN != 112 && WG_BN != 128 && WG_BN != 256) || WG_WARPGROUPS < 1 || \
    WG_WARPGROUPS > 3 || WG_DEPTH < 1 || WG_DEPTH > 2 || WG_STAGES < WG_DEPTH + 1 ||                         \
    WG_STAGES * WG_STAGE_BYTES > 65536
#error "gemm_wgmma.cu: a cut outside what the kernel is written for (device_tensor_cores.WgmmaCut says which)"
#endif

// The matrix descriptor of a K-major tile in the WG_KB-byte swizzle (sm_90 GMMA descriptor): start
// address / 16 in bits 0-13, leading byte offset / 16 in 16-29 (not used by a swizzled K-major
// tile: one wgmma reads 32 bytes of K, inside a row), stride byte offset / 16 in 32-45 (8 WG_KB:
// from one 8-row atom to the next), base offset 0 (atoms aligned to their size), the layout type
// in 62-63. x's and w's tiles alike (A and B are both K-major). Adding 2 to a descriptor moves its
// start 32 bytes along K inside the rows: the card applies the swizzle to the address it forms.
__device__ __forceinline__ u64 wg_desc(const void* tile) {
    u64 address = r4d_smem(tile);
    return ((address & 0x3FFFFull) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(8 * WG_KB >> 4) << 32) |
           ((u64)WG_LAYOUT << 62);
}

// Where byte `at` of a tile (row at / WG_KB, K byte at % WG_KB) is stored: its 16-byte chunk XORed
// with the address bits 7 and up that the swizzle of that width takes (three for 128 bytes, two
// for 64, one for 32). The tiles are aligned to their atoms, so the tile's offset is the address's.
__device__ __forceinline__ int wg_swizzle(int at) { return at ^ (((at >> 7) & (WG_KB / 16 - 1)) << 4); }

// ---- wgmma's PTX (tests/test_gemm_wgmma_on_host.py puts host forms in place of this part)
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// until at most N of this warpgroup's committed groups of MMAs are still in flight
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// the generic proxy's writes to shared memory (cp.async's) made visible to the async proxy (wgmma's reads)
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// the accumulators pinned where they are: no read or write of d moves across this (after a wait);
// COUNT of them (gemm_skinny.cu's SK_ACC)
template <int COUNT = WG_ACC>
__device__ __forceinline__ void wg_pin(float* d) {
#pragma unroll
    for (int i = 0; i < COUNT; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16(i) WG_F4(i), WG_F4(i + 4), WG_F4(i + 8), WG_F4(i + 12)
#define WG_D4 WG_F4(0)
#define WG_D8 WG_F4(0), WG_F4(4)
#define WG_D16 WG_F16(0)
#define WG_D32 WG_F16(0), WG_F16(16)
#define WG_D64 WG_F16(0), WG_F16(16), WG_F16(32), WG_F16(48)
#define WG_D56 WG_F16(0), WG_F16(16), WG_F16(32), WG_F4(48), WG_F4(52)
#define WG_D128 WG_D64, WG_F16(64), WG_F16(80), WG_F16(96), WG_F16(112)
#define WG_D4_TEXT "{%0, %1, %2, %3}"
#define WG_D8_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define WG_D16_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define WG_D32_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D64_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_D56_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}"
#define WG_D128_TEXT "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, " \
    "%65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, " \
    "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, " \
    "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
    "%124, %125, %126, %127}"

// d[N / 2] += A . B^T, A 64 x K and B N x K from their descriptors (K-major both), f32 accumulation:
// m64nNk16 of bf16 (N 8, 16, 32, 64: gemm_skinny.cu's few rows of x; 112: gemm_tma.cu's SwiGLU cut; 128,
// 256), m64nNk32 of e4m3 (N 112, 128, 256). The immediates: scale d 1, A and B not negated, neither
// transposed (bf16 only: fp8 is K-major always). d has N / 2 elements: only the branch of this N is compiled (if constexpr).
template <int KIND, int N>
__device__ __forceinline__ void wg_mma(float* d, u64 a, u64 b) {
    static_assert(KIND == TC_BF16 ? N == 8 || N == 16 || N == 32 || N == 64 || N == 112 || N == 128 || N == 256
                                  : N == 112 || N == 128 || N == 256,
                  "wg_mma: m64n8, n16, n32, n64, n112, n128, n256 of bf16; n112, n128, n256 of e4m3");
    if constexpr (KIND == TC_BF16 && N == 8)
        asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 " WG_D4_TEXT ", %4, %5, 1, 1, 1, 0, 0;\n"
                     : WG_D4
                     : "l"(a), "l"(b));
    else if constexpr (KIND == TC_BF16 && N == 16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " WG_D8_TEXT ", %8, %9, 1, 1, 1, 0, 0;\n"
                     : WG_D8
                     : "l"(a), "l"(b));
    else if constexpr (KIND == TC_BF16 && N == 32)
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " WG_D16_TEXT ", %16, %17, 1, 1, 1, 0, 0;\n"
                     : WG_D16
                     : "l"(a), "l"(b));
    else if constexpr (KIND == TC_BF16 && N == 64)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32_TEXT ", %32, %33, 1, 1, 1, 0, 0;\n"
                     : WG_D32
                     : "l"(a), "l"(b));
    else if constexpr (KIND == TC_BF16 && N == 112)
        asm volatile("wgmma.mma_async.sync.aligned.m64n112k16.f32.bf16.bf16 " WG_D56_TEXT ", %56, %57, 1, 1, 1, 0, 0;\n"
                     : WG_D56
                     : "l"(a), "l"(b));
    else if constexpr (KIND == TC_BF16 && N == 128)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64_TEXT ", %64, %65, 1, 1, 1, 0, 0;\n"
                     : WG_D64
                     : "l"(a), "l"(b));
    else if constexpr (KIND == TC_BF16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_D128_TEXT ", %128, %129, 1, 1, 1, 0, 0;\n"
                     : WG_D128
                     : "l"(a), "l"(b));
    else if constexpr (N == 112)
        asm volatile("wgmma.mma_async.sync.aligned.m64n112k32.f32.e4m3.e4m3 " WG_D56_TEXT ", %56, %57, 1, 1, 1;\n"
                     : WG_D56
                     : "l"(a), "l"(b));
    else if constexpr (N == 128)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_D64_TEXT ", %64, %65, 1, 1, 1;\n"
                     : WG_D64
                     : "l"(a), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " WG_D128_TEXT ", %128, %129, 1, 1, 1;\n"
                     : WG_D128
                     : "l"(a), "l"(b));
}
// ---- end of wgmma's PTX

// One operand's k-tile t into its place in a stage: rows r0.. r0 + ROWS - 1 of an [rows, K] matrix
// of `eb`-byte elements, ROWS rows x WG_KB / 16 chunks of 16 bytes, each at its swizzled place.
// Thread i copies chunk i % (WG_KB / 16) of rows i / (WG_KB / 16) + j WG_THREADS / (WG_KB / 16): the
// rows a thread copies are a multiple of 8 (128-byte rows), 16 (64) or 32 (32) apart, so the same
// swizzled column (the tiles' rows need not be whole passes: 256 of w by 384 threads). Past the matrix's rows or K: zeros (the row asks K % 8 bf16, K % 16 e4m3: a
// chunk is wholly in K or past it).
template <int ROWS>
__device__ __forceinline__ void wg_load(u8* tile, const u8* matrix, int rows, int K, int eb, int r0, int t) {
    enum { CHUNKS = WG_KB / 16, STEP = WG_THREADS / CHUNKS };  // chunks a row; rows a pass of the block
    int r = threadIdx.x / CHUNKS, q = threadIdx.x % CHUNKS, k = t * WG_KB + q * 16;  // k: bytes along the row
    long long stride = (long long)K * eb;
    const u8* from = matrix + (r0 + r) * stride + k;
#pragma unroll
    for (int j = 0; j < (ROWS + STEP - 1) / STEP; ++j) {
        if (ROWS % STEP != 0 && r + STEP * j >= ROWS) break;  // three warpgroups' last pass of w: part of the block
        bool full = r0 + r + STEP * j < rows && k < stride;
        r4d_cp_async16(tile + wg_swizzle((r + STEP * j) * WG_KB + q * 16), full ? from + STEP * j * stride : matrix, full);
    }
}

// The epilogue, gemm_tma.cu's too. D's layout (as mma.sync's C per warp of 16 rows): d[i] is row
// r0 + 8 ((i >> 1) & 1), column n0 + 8 (i >> 2) + 2 tq + (i & 1). Split K: this split's sums into
// the partials; else y, finished (tc_finish: the scales, for e4m3). A lane's d[i], d[i + 1] (i even)
// are two adjacent columns of one row: with WG_PAIRS (the default) stored as one float2 where both
// lie inside and rows are 8-byte aligned (N even), so a warp's store fills its 32-byte sectors
// (4-byte stores half-fill them, each sector written twice); the same values either way.
#ifndef WG_PAIRS
#define WG_PAIRS 1
#endif
__device__ __forceinline__ void wg_put(float* at, float a, float b, int n, int N) {
    if (WG_PAIRS && n + 1 < N && (N & 1) == 0) {
        *(float2*)at = make_float2(a, b);
        return;
    }
    if (n < N) at[0] = a;
    if (n + 1 < N) at[1] = b;
}
template <int KIND>
__device__ __forceinline__ void wg_store(const TcGemm& p, const float* d, int r0, int n0, int tq, bool split) {
#pragma unroll
    for (int i = 0; i < WG_ACC; i += 2) {
        int m = r0 + ((i >> 1) & 1) * 8, n = n0 + (i >> 2) * 8 + 2 * tq;
        if (m < p.M) {
            if (split) wg_put(p.partial + ((long long)blockIdx.z * p.M + m) * p.N + n, d[i], d[i + 1], n, p.N);
            else wg_put(p.y + (long long)m * p.N + n, tc_finish<KIND>(p, m, n, d[i]),
                        n + 1 < p.N ? tc_finish<KIND>(p, m, n + 1, d[i + 1]) : 0.0f, n, p.N);  // e4m3's scales: N of them
        }
        // one column tile's scales at a time: hoisting all the outputs' loads spilled the e4m3 kernel
        if ((i & 3) == 2) asm volatile("" ::: "memory");
    }
}
// The tile's last block (r4d_last_split said so): every split's sums of this lane's outputs, added in
// split order, finished into y.
template <int KIND>
__device__ __forceinline__ void wg_add_splits(const TcGemm& p, int r0, int n0, int tq) {
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) {
        int m = r0 + ((i >> 1) & 1) * 8, n = n0 + (i >> 2) * 8 + 2 * tq + (i & 1);
        if (m >= p.M || n >= p.N) continue;
        float sum = 0.0f;
        for (int s = 0; s < (int)gridDim.z; ++s) sum += r4d_load_l2(p.partial + ((long long)s * p.M + m) * p.N + n);
        p.y[(long long)m * p.N + n] = tc_finish<KIND>(p, m, n, sum);
    }
}

template <int KIND>
__device__ void wg_gemm(const TcGemm& p) {
    enum { EB = KIND == TC_BF16 ? 2 : 1, KT = WG_KB / EB };  // KT: K elements a stage
    extern __shared__ __align__(1024) u8 wg_shared[];
    if (r4d_smem(wg_shared) % 1024) __trap();  // the swizzle's atoms would not be where wgmma reads them
    int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    // The output tile: the grid is (tiles, 1, splits), block b of a split going down a group of
    // WG_GROUP row tiles, then right to the group's next column tile. So the 132 or 264 blocks of a
    // wave (one or two a multiprocessor) are 16 row tiles of ~8 or ~16 column tiles, not one row
    // tile of them all: a wave reads each w tile from HBM once (at M 2048, 8B's gate+up: all of w
    // once, not once per row tile) and a group's x rows stay in L2.
    int tiles_m = (p.M + WG_BM - 1) / WG_BM, tiles_n = (p.N + WG_BN - 1) / WG_BN;
    int span = WG_GROUP * tiles_n, first = (int)blockIdx.x / span * WG_GROUP, group = min(WG_GROUP, tiles_m - first);
    int m0 = (first + (int)blockIdx.x % span % group) * WG_BM, n0 = (int)blockIdx.x % span / group * WG_BN;
    int r0 = m0 + warpgroup * 64 + warp * 16 + g;  // this lane's output rows: r0 and r0 + 8 (wgmma's D layout)
    int tiles = (p.K + KT - 1) / KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = t1 - t0;
    const u8* x = (const u8*)p.x;
    float d[WG_ACC];
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) d[i] = 0.0f;
    // AHEAD = WG_STAGES - WG_DEPTH k-tiles are copied ahead of the MMAs: the first AHEAD before the
    // loop, w's before the chain's wait (the weights are no kernel's output), x's after it; a
    // cp.async group a tile (the first also holds those w tiles)
    enum { AHEAD = WG_STAGES - WG_DEPTH };
#pragma unroll
    for (int s = 0; s < AHEAD; ++s)
        if (s < count) wg_load<WG_BN>(wg_shared + s * WG_STAGE_BYTES + WG_X_BYTES, p.w, p.N, p.K, EB, n0, t0 + s);
    R4D_CHAIN_PROLOGUE();
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < count) wg_load<WG_BM>(wg_shared + s * WG_STAGE_BYTES, x, p.M, p.K, EB, m0, t0 + s);
        r4d_cp_commit();
    }
    // k-tile i lives in stage i % WG_STAGES. The order of a step, and why:
    //  1. wait for this thread's copies of tile i (AHEAD - 1 later groups may stay in flight),
    //     fence them to the async proxy, then the barrier: every thread's copies of tile i are in.
    //  2. issue tile i's WG_KB / 32 MMAs (K 16 or 32 each: the descriptors advanced 32 bytes) and
    //     commit them.
    //  3. wait_group WG_DEPTH: this warpgroup's MMAs of tile i - WG_DEPTH have retired (read their
    //     stage), while tiles i - WG_DEPTH + 1 .. i stay in flight; then the barrier: the other
    //     warpgroups' have too.
    //  4. only now copy tile i - WG_DEPTH + WG_STAGES into stage (i - WG_DEPTH) % WG_STAGES, the
    //     retired tile's.
    // So tiles i + 1 .. i + AHEAD - 1's copies (issued in earlier steps' step 4) land under tile
    // i's MMAs, and no stage is written while an MMA may still read it.
    for (int i = 0; i < count; ++i) {
        u8* stage = wg_shared + (i % WG_STAGES) * WG_STAGE_BYTES;
        r4d_cp_wait<AHEAD - 1>();
        wg_proxy_fence();
        __syncthreads();
        u64 a = wg_desc(stage + warpgroup * 64 * WG_KB), b = wg_desc(stage + WG_X_BYTES);
        wg_fence();
#pragma unroll
        for (int j = 0; j < WG_KB / 32; ++j) wg_mma<KIND, WG_BN>(d, a + 2 * j, b + 2 * j);
        wg_commit();
        wg_wait<WG_DEPTH>();
        __syncthreads();
        if (i + AHEAD < count) {
            u8* into = wg_shared + ((i + AHEAD) % WG_STAGES) * WG_STAGE_BYTES;
            wg_load<WG_BM>(into, x, p.M, p.K, EB, m0, t0 + i + AHEAD);
            wg_load<WG_BN>(into + WG_X_BYTES, p.w, p.N, p.K, EB, n0, t0 + i + AHEAD);
        }
        r4d_cp_commit();
    }
    wg_wait<0>();
    wg_pin(d);
    bool split = gridDim.z > 1;
    wg_store<KIND>(p, d, r0, n0, tq, split);
    // the flag of the tile's last block in the stages' first word: every copy and MMA has ended
    if (!split || !r4d_last_split(p.counters, (int*)wg_shared)) return;
    wg_add_splits<KIND>(p, r0, n0, tq);
}

#define WG_GEMM_ENTRY(KIND, NAME)                                                                                \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, WG_BLOCKS) NAME(                                           \
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
