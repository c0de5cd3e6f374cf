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
#ifndef SK_BAND
#define SK_BAND 0  // 1: the decode band's entry (r4d_skinny_band_bf16, below) in place of r4d_skinny_gemm_bf16
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

// The dynamic shared memory: SK_STAGES stages of w's SK_BW rows then x's SK_MX rows
__device__ __forceinline__ u8* sk_smem() {
    extern __shared__ __align__(1024) u8 sk_shared[];
    return sk_shared;
}

// The main loop of both entries: k-tiles t0 .. t0 + count - 1 of w (load_w(stage, t): w's k-tile t
// into a stage's first SK_W_BYTES) and of x's SK_MX rows from m0 (an [x_rows, K] bf16 matrix) into d.
template <class LoadW>
__device__ __forceinline__ void sk_mainloop(float* d, LoadW load_w, const u8* x, int x_rows, int K, int m0, int t0,
                                            int count) {
    enum { AHEAD = SK_STAGES - 1 };
    u8* shared = sk_smem();
    if (r4d_smem(shared) % 1024) __trap();  // the swizzle's atoms would not be where wgmma reads them
    int warpgroup = threadIdx.x / 128;
#pragma unroll
    for (int i = 0; i < SK_ACC; ++i) d[i] = 0.0f;
    // The first AHEAD k-tiles: w's before the chain's wait (the weights are no kernel's output),
    // x's after it; a cp.async group a tile (the first also holds those w tiles)
#pragma unroll
    for (int s = 0; s < AHEAD; ++s)
        if (s < count) load_w(shared + s * SK_STAGE_BYTES, t0 + s);
    R4D_CHAIN_PROLOGUE();
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < count) wg_load<SK_MX>(shared + s * SK_STAGE_BYTES + SK_W_BYTES, x, x_rows, K, 2, m0, t0 + s);
        r4d_cp_commit();
    }
    // gemm_wgmma.cu's step with one k-tile of MMAs left in flight (WG_DEPTH 1): k-tile i lives in
    // stage i % SK_STAGES. Wait for this thread's copies of tile i, fence them to the async proxy,
    // barrier (every thread's are in); issue its WG_KB / 32 MMAs (K 16 each, the descriptors 32 bytes
    // on) and commit; wait_group 1 (tile i - 1's MMAs have read their stage), barrier (every
    // warpgroup's have); only then copy tile i + AHEAD into tile i - 1's stage.
    for (int i = 0; i < count; ++i) {
        u8* stage = shared + (i % SK_STAGES) * SK_STAGE_BYTES;
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
            u8* into = shared + ((i + AHEAD) % SK_STAGES) * SK_STAGE_BYTES;
            load_w(into, t0 + i + AHEAD);
            wg_load<SK_MX>(into + SK_W_BYTES, x, x_rows, K, 2, m0, t0 + i + AHEAD);
        }
        r4d_cp_commit();
    }
    wg_wait<0>();
    wg_pin<SK_ACC>(d);
}

__device__ void sk_gemm(const TcGemm& p) {
    enum { KT = WG_KB / 2 };  // KT: K elements (bf16) a stage
    int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    int n0 = blockIdx.x * SK_BW, m0 = blockIdx.y * SK_MX;  // the block's w rows and x rows
    int nr = n0 + warpgroup * 64 + warp * 16 + g;          // this lane's w rows: nr and nr + 8
    int tiles = (p.K + KT - 1) / KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = max(0, t1 - t0);
    float d[SK_ACC];
    sk_mainloop(d, [&](u8* stage, int t) { wg_load<SK_BW>(stage, p.w, p.N, p.K, 2, n0, t); }, (const u8*)p.x, p.M, p.K,
                m0, t0, count);
    bool split = gridDim.z > 1;
    sk_store(p, d, nr, m0, tq, split);
    // the flag of the tile's last block in the stages' first word: every copy and MMA has ended
    if (!split || !r4d_last_split(p.counters, (int*)sk_smem())) return;
    sk_add_splits(p, nr, m0, tq);
}

// gemm_wgmma.cu's arguments (x: the bf16 rows r4d_narrow_bf16_dev wrote; x_scale, w_scale and
// w_stride unused: bf16 only)
#if !SK_BAND
extern "C" __global__ void __launch_bounds__(SK_THREADS, SK_BLOCKS) r4d_skinny_gemm_bf16(
    const void* x, const float* x_scale, const u8* w, const float* w_scale, int w_stride, float* y, float* partial,
    u32* counters, int M, int N, int K, int tiles_per_split) {
    TcGemm p = {x, x_scale, w, w_scale, w_stride, y, partial, counters, M, N, K, tiles_per_split};
    sk_gemm(p);
}
#endif

// ---- the decode band (device_skinny_band.py): the GEMV rows and their fused forms at M = 2 .. 8 on Hopper
//
// x is the 16 bf16 rows r4d_split_bf16_dev wrote (SK_MX 16): row m the activation row m rounded to
// bf16, row 8 + m its remainder x - bf16(x) rounded again (hi + lo carry 16 significant bits of each
// f32, as gemv.cu's tensor-core path reads them), rows past M zero. A lane's d[i] and d[i + 4] are the
// same (w row, x row m = 2 tq + (i & 1)) of hi and of lo: added, the product of the f32 row to within
// the GEMV's tolerance, not the bf16 row's. The epilogue (SK_MODE) is gemv.cu's for its fused rows:
//   0  y_s = x . w_s^T for up to three weights one after the other along the grid (q, k, v): weight s
//      takes ceil(rows_s / SK_BW) blocks, its tail rows zeros that nothing stores
//   1  one weight, y = x . w^T and residual += y (gemm_add)
//   2  gate and up paired (rmsnorm_gemm2_silu_mul): a block's 16-row bands of the tile are 8 gate rows
//      then the same 8 up rows, so a lane holds a gate output (d[i]) and its up output (d[i + 2]);
//      y0 = silu(gate) * up (sigmoid in f64, as gemv.cu), y1 = up
//   3  one weight (the lm head), y stored and each block's first maximum of each x row over its rows
//      into best / best_index [blocks, M], which r4d_sample_groups_dev reduces (gemv.cu's mode 3)
// SK_L2 256: w's copies ask for 256-byte L2 fetches (r4d_cp_async16_l2).
// Split K: this split's (hi + lo) sums into partial[split][M][gridDim.x SK_BW] (a block's tile rows
// along it), added in split order by the block's last split (a counter a block), then the epilogue.
#if SK_BAND
#ifndef SK_MODE
#define SK_MODE 0
#endif
#if SK_MX != 16 || SK_MODE < 0 || SK_MODE > 3
#error "gemm_skinny.cu: the band reads 8 activation rows as 16 hi and lo rows (SK_MX 16), modes 0 .. 3"
#endif
struct SkBand {
    const u16* x_rows;  // [16, K] bf16: hi rows 0..7, lo rows 8..15
    const u8* w[3];   // bf16 [rows_s, K]
    float* y[3];      // f32 [M, rows_s]
    int rows[3];
    float* residual;  // mode 1: [M, rows_0]
    float* best;      // mode 3: [blocks, M] each block's first maximum of each x row, and its w row
    int* best_index;
    float* partial;   // split K: [splits, M, gridDim.x SK_BW]
    u32* counters;    // split K: a u32 a block, zero between launches
    int M, K, tiles_per_split;
};

// a[s] of a three-entry array without indexing it at run time (which would put the struct in local memory)
template <class T>
__device__ __forceinline__ T sk_pick(const T* a, int s) { return s == 0 ? a[0] : s == 1 ? a[1] : a[2]; }

#ifndef SK_L2
#define SK_L2 0  // 256: w's copies ask the L2 for the 256-byte block around them (device_tensor_cores.BAND_L2)
#endif
#if SK_L2 != 0 && SK_L2 != 256
#error "gemm_skinny.cu: SK_L2 is 0 or 256"
#endif

// w's k-tile t of the block: tile row r is row rows_of(r) of `pick(r)`'s matrix, gemm_wgmma.cu's wg_load's
// chunks and swizzle (zeros past the rows or K). Modes 0 and 1: rows r0 + r of one weight; mode 2: gate
// (r / 8 even) or up (odd) row j0 + 8 (r / 16) + r % 8.
__device__ __forceinline__ void sk_load_w(u8* tile, const u8* first, const u8* second, int rows, int K, int r0, int t) {
    enum { CHUNKS = WG_KB / 16, STEP = SK_THREADS / CHUNKS };
    int r = threadIdx.x / CHUNKS, q = threadIdx.x % CHUNKS, k = t * WG_KB + q * 16;
    long long stride = (long long)K * 2;
#pragma unroll
    for (int j = 0; j < SK_BW / STEP; ++j) {
        int tr = r + STEP * j, row = SK_MODE == 2 ? r0 + (tr / 16) * 8 + tr % 8 : r0 + tr;
        const u8* matrix = SK_MODE == 2 && (tr / 8) % 2 ? second : first;
        bool full = row < rows && k < stride;
        u8* into = tile + wg_swizzle(tr * WG_KB + q * 16);
        const u8* from = full ? matrix + row * stride + k : matrix;
        if (SK_L2 == 256) r4d_cp_async16_l2(into, from, full);
        else r4d_cp_async16(into, from, full);
    }
}

// What the chain leaves of one output: v of x row m and the lane's tile row tr (its block's from
// n_local, of weight s; mode 2: tr's gate row, `up` its up row's)
__device__ __forceinline__ void sk_band_finish(const SkBand& p, int s, int n_local, int tr, int m, float v, float up) {
    if (m >= p.M) return;
    if (SK_MODE == 2) {
        int j = n_local / 2 + (tr / 16) * 8 + tr % 8;
        if (j >= p.rows[0]) return;
        p.y[0][(long long)m * p.rows[0] + j] = r4d_silu_mul(v, up);
        p.y[1][(long long)m * p.rows[0] + j] = up;
        return;
    }
    int n = n_local + tr, rows = sk_pick(p.rows, s);
    if (n >= rows) return;
    long long at = (long long)m * rows + n;
    sk_pick(p.y, s)[at] = v;
    if (SK_MODE == 1) p.residual[at] = p.residual[at] + v;
}

__device__ void sk_band(const SkBand& p) {
    enum { KT = WG_KB / 2 };
    int warpgroup = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    int tr0 = warpgroup * 64 + warp * 16 + g;  // this lane's tile rows: tr0 and tr0 + 8
    // the block's weight and its first row of it (mode 2: its first row of the paired gate and up, doubled)
    int s = 0, b = blockIdx.x;
    if (SK_MODE == 0)
        for (; s < 2 && sk_pick(p.rows, s + 1) > 0 && b >= (sk_pick(p.rows, s) + SK_BW - 1) / SK_BW; ++s)
            b -= (sk_pick(p.rows, s) + SK_BW - 1) / SK_BW;
    int n_local = b * SK_BW;
    int tiles = (p.K + KT - 1) / KT;
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = max(0, t1 - t0);
    float d[SK_ACC];
    const u8* w = sk_pick(p.w, s);
    int rows = sk_pick(p.rows, s);
    const u8* up = SK_MODE == 2 ? p.w[1] : w;
    int r0 = SK_MODE == 2 ? n_local / 2 : n_local;
    sk_mainloop(d, [&](u8* stage, int t) { sk_load_w(stage, w, up, rows, p.K, r0, t); }, (const u8*)p.x_rows, 16, p.K, 0,
                t0, count);
    float v[4];  // i: tile row tr0 + 8 ((i >> 1) & 1), x row 2 tq + (i & 1)
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = d[i] + d[i + 4];
    if (gridDim.z > 1) {
        long long width = (long long)gridDim.x * SK_BW, plane = (long long)p.M * width;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int m = 2 * tq + (i & 1);
            long long col = (long long)blockIdx.x * SK_BW + tr0 + 8 * ((i >> 1) & 1);
            if (m < p.M) p.partial[blockIdx.z * plane + m * width + col] = v[i];
        }
        if (!r4d_last_split(p.counters, (int*)sk_smem())) return;
        // every split's sums of this lane's four outputs, asked for before any is added, added in split order
        float part[4][SK_MAX_SPLITS];
        int splits = (int)gridDim.z;
        if (splits > SK_MAX_SPLITS) __trap();  // the plan never asks for more
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int m = 2 * tq + (i & 1);
            long long col = (long long)blockIdx.x * SK_BW + tr0 + 8 * ((i >> 1) & 1);
            const float* at = p.partial + (m < p.M ? m * width + col : 0);
#pragma unroll
            for (int z = 0; z < SK_MAX_SPLITS; ++z) part[i][z] = m < p.M && z < splits ? r4d_load_l2(at + z * plane) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float sum = 0.0f;
#pragma unroll
            for (int z = 0; z < SK_MAX_SPLITS; ++z)
                if (z < splits) sum += part[i][z];
            v[i] = sum;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (SK_MODE == 2 && (i >> 1)) continue;  // up rows: their gate row's lane finishes them
        sk_band_finish(p, s, n_local, tr0 + 8 * ((i >> 1) & 1), 2 * tq + (i & 1), v[i], SK_MODE == 2 ? v[i + 2] : 0.0f);
    }
    if (SK_MODE == 3) {  // the block's first maximum of each x row, in the stages (every copy and MMA has ended)
        float* outputs = (float*)sk_smem();  // [8][SK_BW]
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i) outputs[(2 * tq + (i & 1)) * SK_BW + tr0 + 8 * ((i >> 1) & 1)] = v[i];
        __syncthreads();
        if ((int)threadIdx.x < p.M) {
            int m = threadIdx.x, where = 0x7fffffff;
            float best = __uint_as_float(0xff800000u);
            for (int r = 0; r < SK_BW && n_local + r < p.rows[0]; ++r)
                if (r4d_better(outputs[m * SK_BW + r], n_local + r, best, where)) { best = outputs[m * SK_BW + r]; where = n_local + r; }
            p.best[(long long)blockIdx.x * p.M + m] = best;
            p.best_index[(long long)blockIdx.x * p.M + m] = where;
        }
    }
}

// x_rows: the [16, K] bf16 rows of r4d_split_bf16_dev; up to three (w, y, rows) of the weights, rows 0
// past the last; residual (mode 1); best, best_index (mode 3); partial and counters (split K) in the row's scratch
extern "C" __global__ void __launch_bounds__(SK_THREADS, SK_BLOCKS) r4d_skinny_band_bf16(
    const u16* x_rows, const u8* w0, float* y0, int rows0, const u8* w1, float* y1, int rows1, const u8* w2, float* y2,
    int rows2, float* residual, float* best, int* best_index, float* partial, u32* counters, int M, int K,
    int tiles_per_split) {
    SkBand p = {x_rows, {w0, w1, w2}, {y0, y1, y2}, {rows0, rows1, rows2}, residual, best, best_index, partial, counters,
                M, K, tiles_per_split};
    sk_band(p);
}
#endif
