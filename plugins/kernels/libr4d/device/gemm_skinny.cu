// libr4d device rows: the tensor-core GEMM of few rows of x on Hopper (sm_90a), y[M, N] = x[M, K] .
// w[N, K]^T for batched decode's M (9 .. device_tensor_cores.SKINNY_BELOW - 1), bf16, f32
// accumulation, gemm_wgmma.cu's contract (device_tensor_cores.TOLERANCE).
//
// Why a kernel of its own: at M = 64 a layer's 8B GEMMs read 436 MB of weights for 2 M flops a
// weight, far under the card's flops a byte, so the time is the weights' bytes over HBM's
// bandwidth. gemm_wgmma.cu's 128 x 128 tiles put x's few rows in wgmma's M (64 a warpgroup: half of a
// 128-row tile empty at M = 64) and leave few column tiles to spread over 132 multiprocessors. Here
// the operands swap places ("swap AB", y^T = w . x^T): w's rows are wgmma's M (64 a warpgroup), x's
// rows its N (SK_MX = 8, 16, 32, 64 or 128: M rounded up), both K-major in shared memory, so a block
// owns 64 or 128 of w's rows, every one of them used, and N / 64 blocks (times the splits of K)
// keep every multiprocessor streaming weights.
//
// Built after tensor_core.cu and gemm_wgmma.cu (device_kernels.PARTS; R4D_WG_ONLY=3: none of its
// entries), whose loader and PTX it runs: wg_load (cp.async of 16-byte chunks into the swizzle of
// WG_KB bytes, zeros past the matrix), wg_desc, wg_mma<TC_BF16, SK_MX>, wg_fence, wg_commit,
// wg_wait, wg_pin. The cut (device_tensor_cores.SkinnyCut.defines):
//   SK_MX          x's rows a tile, wgmma's N: 16, 32, 64 or 128 (8 for M <= 8, below the rows' band: the
//                  bench's comparison with the GEMV); M above 128 takes ceil(M / SK_MX) tiles of x along
//                  the grid's y, each reading all of w again
//   WG_WARPGROUPS  warpgroups of 128 threads, 64 of w's rows each: a block is SK_BW = 64 WG_WARPGROUPS
//                  rows of w (1 or 2)
//   WG_KB          bytes of K a stage holds of each row (128 or 64), in the swizzle of that width
//   SK_STAGES      stages of w's SK_BW rows then x's SK_MX rows, (SK_BW + SK_MX) WG_KB bytes each, all
//                  in a block's share of the multiprocessor (at most the 64 KiB a launch may have,
//                  RAD_MAX_SHARED_BYTES); SK_STAGES - 1 k-tiles of copies are in flight while one
//                  k-tile's MMAs run
//   SK_BLOCKS      blocks a multiprocessor (__launch_bounds__): 3 (3 x 64 KiB of stages), 2 for two
//                  warpgroups from SK_MX = 64 (registers), or the cut's 2, 3 or 4; the split of K plans
//                  for 132 x SK_BLOCKS
// (WG_BN, WG_STAGES and WG_DEPTH only satisfy gemm_wgmma.cu's own check of its macros: the cut's
// defines set 128, 2 and 1.)
#ifndef SK_MX
#define SK_MX 64
#endif
#ifndef SK_STAGES
#define SK_STAGES 4
#endif
#define SK_BW (64 * WG_WARPGROUPS)
#define SK_THREADS (128 * WG_WARPGROUPS)
#define SK_ACC (SK_MX / 2)                  // f32 accumulators a thread: m64nSK_MX's D over 128 threads
#define SK_W_BYTES (SK_BW * WG_KB)          // w's tile in a stage, then x's (SK_MX * WG_KB)
#define SK_STAGE_BYTES ((SK_BW + SK_MX) * WG_KB)
#ifndef SK_BLOCKS
#define SK_BLOCKS 3
#endif
#if (SK_MX != 8 && SK_MX != 16 && SK_MX != 32 && SK_MX != 64 && SK_MX != 128) || WG_WARPGROUPS < 1 || WG_WARPGROUPS > 2 || \
    (WG_KB != 128 && WG_KB != 64) || SK_STAGES < 2 || SK_STAGES * SK_STAGE_BYTES > 65536
#error "gemm_skinny.cu: a cut outside what the kernel is written for (device_tensor_cores.SkinnyCut says which)"
#endif

// The epilogue, transposed: D is w's rows by x's rows. A lane's d[i] (wgmma's D layout, gemm_wgmma.cu's
// wg_store) is w row n0 + 16 warp + g + 8 ((i >> 1) & 1) and x row m0 + 8 (i >> 2) + 2 tq + (i & 1),
// so output y[m][n]. Split K: this split's sums into partial[split][M][N]; else y.
__device__ __forceinline__ void sk_store(const TcGemm& p, const float* d, int nr, int m0, int tq, bool split) {
#pragma unroll
    for (int i = 0; i < SK_ACC; ++i) {
        int n = nr + ((i >> 1) & 1) * 8, m = m0 + (i >> 2) * 8 + 2 * tq + (i & 1);
        if (m < p.M && n < p.N) {
            if (split) p.partial[((long long)blockIdx.z * p.M + m) * p.N + n] = d[i];
            else p.y[(long long)m * p.N + n] = d[i];
        }
    }
}
// The tile's last block (r4d_last_split said so): every split's sums of this lane's outputs, added in
// split order (the same on every card: the split is the shapes'), into y. Four outputs' partials of
// every split are asked for before any is added (up to 4 x SK_MAX_SPLITS loads in flight a thread):
// added one load at a time, a tile's splits x 16 KB (MX 64) cost a round trip of L2 each, at the
// end of the launch when little else runs.
#define SK_MAX_SPLITS 16  // device_tensor_cores.SKINNY_MAX_SPLITS
__device__ __forceinline__ void sk_add_splits(const TcGemm& p, int nr, int m0, int tq) {
    int splits = (int)gridDim.z;
    if (splits > SK_MAX_SPLITS) __trap();  // the plan never asks for more
    long long plane = (long long)p.M * p.N;
#pragma unroll
    for (int i0 = 0; i0 < SK_ACC; i0 += 4) {
        float v[4][SK_MAX_SPLITS];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int i = i0 + j, n = nr + ((i >> 1) & 1) * 8, m = m0 + (i >> 2) * 8 + 2 * tq + (i & 1);
            bool in = m < p.M && n < p.N;
            const float* at = p.partial + (in ? (long long)m * p.N + n : 0);
#pragma unroll
            for (int s = 0; s < SK_MAX_SPLITS; ++s) v[j][s] = in && s < splits ? r4d_load_l2(at + s * plane) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int i = i0 + j, n = nr + ((i >> 1) & 1) * 8, m = m0 + (i >> 2) * 8 + 2 * tq + (i & 1);
            if (m >= p.M || n >= p.N) continue;
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < SK_MAX_SPLITS; ++s)
                if (s < splits) sum += v[j][s];
            p.y[(long long)m * p.N + n] = sum;
        }
    }
}

__device__ void sk_gemm(const TcGemm& p) {
    enum { KT = WG_KB / 2, AHEAD = SK_STAGES - 1 };  // KT: K elements (bf16) a stage
    extern __shared__ __align__(1024) u8 sk_shared[];
    if (r4d_smem(sk_shared) % 1024) __trap();  // the swizzle's atoms would not be where wgmma reads them
    int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    int n0 = blockIdx.x * SK_BW, m0 = blockIdx.y * SK_MX;  // the block's w rows and x rows
    int nr = n0 + warpgroup * 64 + warp * 16 + g;          // this lane's w rows: nr and nr + 8
    int tiles = (p.K + KT - 1) / KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = max(0, t1 - t0);
    const u8* x = (const u8*)p.x;
    float d[SK_ACC];
#pragma unroll
    for (int i = 0; i < SK_ACC; ++i) d[i] = 0.0f;
    // The first AHEAD k-tiles: w's before the chain's wait (the weights are no kernel's output),
    // x's after it; a cp.async group a tile (the first also holds those w tiles)
#pragma unroll
    for (int s = 0; s < AHEAD; ++s)
        if (s < count) wg_load<SK_BW>(sk_shared + s * SK_STAGE_BYTES, p.w, p.N, p.K, 2, n0, t0 + s);
    R4D_CHAIN_PROLOGUE();
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < count) wg_load<SK_MX>(sk_shared + s * SK_STAGE_BYTES + SK_W_BYTES, x, p.M, p.K, 2, m0, t0 + s);
        r4d_cp_commit();
    }
    // gemm_wgmma.cu's step with one k-tile of MMAs left in flight (WG_DEPTH 1): k-tile i lives in
    // stage i % SK_STAGES. Wait for this thread's copies of tile i, fence them to the async proxy,
    // barrier (every thread's are in); issue its WG_KB / 32 MMAs (K 16 each, the descriptors 32 bytes
    // on) and commit; wait_group 1 (tile i - 1's MMAs have read their stage), barrier (every
    // warpgroup's have); only then copy tile i + AHEAD into tile i - 1's stage.
    for (int i = 0; i < count; ++i) {
        u8* stage = sk_shared + (i % SK_STAGES) * SK_STAGE_BYTES;
        r4d_cp_wait<AHEAD - 1>();
        wg_proxy_fence();
        __syncthreads();
        u64 a = wg_desc(stage + warpgroup * 64 * WG_KB), b = wg_desc(stage + SK_W_BYTES);
        wg_fence();
#pragma unroll
        for (int j = 0; j < WG_KB / 32; ++j) wg_mma<TC_BF16, SK_MX>(d, a + 2 * j, b + 2 * j);
        wg_commit();
        wg_wait<1>();
        __syncthreads();
        if (i + AHEAD < count) {
            u8* into = sk_shared + ((i + AHEAD) % SK_STAGES) * SK_STAGE_BYTES;
            wg_load<SK_BW>(into, p.w, p.N, p.K, 2, n0, t0 + i + AHEAD);
            wg_load<SK_MX>(into + SK_W_BYTES, x, p.M, p.K, 2, m0, t0 + i + AHEAD);
        }
        r4d_cp_commit();
    }
    wg_wait<0>();
    wg_pin<SK_ACC>(d);
    bool split = gridDim.z > 1;
    sk_store(p, d, nr, m0, tq, split);
    // the flag of the tile's last block in the stages' first word: every copy and MMA has ended
    if (!split || !r4d_last_split(p.counters, (int*)sk_shared)) return;
    sk_add_splits(p, nr, m0, tq);
}

// gemm_wgmma.cu's arguments (x: the bf16 rows r4d_narrow_bf16_dev wrote; x_scale, w_scale and
// w_stride unused: bf16 only)
extern "C" __global__ void __launch_bounds__(SK_THREADS, SK_BLOCKS) r4d_skinny_gemm_bf16(
    const void* x, const float* x_scale, const u8* w, const float* w_scale, int w_stride, float* y, float* partial,
    u32* counters, int M, int N, int K, int tiles_per_split) {
    TcGemm p = {x, x_scale, w, w_scale, w_stride, y, partial, counters, M, N, K, tiles_per_split};
    sk_gemm(p);
}
