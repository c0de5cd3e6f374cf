// libr4d device rows: gemm_wgmma.cu's GEMM (y[M, N] = x[M, K] . w[N, K]^T above the GEMV band, the
// same two kinds, arguments, split K and epilogue) fed by the Tensor Memory Accelerator, warp
// specialised: one producer warp issues TMA tile loads into a ring of stages, two consumer
// warpgroups run wgmma on them, and full/empty mbarriers hand each stage back and forth. So the
// loads of later k-tiles run under the MMAs of this one inside a block (gemm_wgmma.cu's every thread
// copies, then waits at a barrier: its copies and MMAs take turns). Compiled for sm_90a.
//
// device_kernels.PARTS puts gemm_wgmma.cu before this file, built with R4D_WG_ONLY=3 (none of its
// entries): its wgmma PTX (wg_desc, wg_mma, wg_fence, wg_commit, wg_wait, wg_pin) is the one this
// kernel runs, in the cut given by the same WG_* macros (device_tensor_cores.TmaCut.defines):
//   WG_WARPGROUPS  the consumer warpgroups, 64 rows of x each: 2 (a block is TM_BM = 128 rows, and a
//                  producer warp is the block's ninth), 1 (64 rows and a producer warp, 128 columns:
//                  four blocks a multiprocessor, so 16 stages in flight on it against 6, for 1.5x
//                  the L2 bytes a flop; 2 x 1 clusters bring those back to the 128-row tile's) or 3
//                  (192 rows, with 256 columns; no producer
//                  warp: thread 0 issues the loads between its warpgroup's steps, as 13 warps would
//                  leave a thread 128 registers and a warpgroup's 128 accumulators need ~155)
//   WG_BN          columns of a block (w's rows): 112 or 128 (two blocks a multiprocessor) or 256 (one).
//                  112 (the SwiGLU form's cut) with two consumer warpgroups alone, unclustered: two stages of 128 bytes of K
//                  ((128 + 112) x 128 bytes each) and their barriers fit in the 64 KiB a launch may have,
//                  which 128 x 128's do not by 48 bytes; a stage of 128 bytes of K (four MMAs between a
//                  consumer's waits, whole 128-byte lines a row) made the 8B shapes' GEMMs 13 % faster
//                  than 64 (bench/results/h200_card_runs_2026-12-04d.md)
//   WG_KB          bytes of K a stage holds of each row: 128, 64 or 32; TMA writes the tiles in the
//                  swizzle of that width (the tensor map's swizzle mode), which is the layout wgmma's
//                  descriptor names (wg_desc's layout type): x's 128 rows then w's WG_BN rows
//   WG_STAGES      stages in the ring; every stage plus the barriers within the 64 KiB a launch may
//                  have (RAD_MAX_SHARED_BYTES, abi/rad_stream.h)
// and its own, TM_CLUSTER_M x TM_CLUSTER_N (1 or 2 each; a producer warp's cuts only): a cluster of
// that many blocks, TM_CLUSTER_M tiles down M that read the same tile of w and TM_CLUSTER_N across N
// that read the same tile of x. Each block loads its 1 / TM_CLUSTER_M share of w's tile and its
// 1 / TM_CLUSTER_N of x's, and TMA multicasts each share into every block of the cluster that reads
// it, so L2 serves a k-tile's shared operand once a cluster, not once a block (the 64 KiB a launch
// keeps a block at 128 x 128 tiles). On an H200 they give the same bits and are 4-12 % slower than
// the unclustered cut: the bench's cuts, not the default (bench/results/h200_card_runs_2026-12-04c.md).
//
// The tensor maps. TMA reads a matrix through a 128-byte CUtensorMap. The plugin calls no driver
// function: r4d_tma_maps (a one-warp launch before the GEMM, the same stream) builds both maps in
// the row's scratch on the card: 128 zero bytes in shared memory, each field set by
// tensormap.replace (sm_90a), then tensormap.cp_fenceproxy copies it to global memory with the
// release fence of the tensormap proxy; the GEMM's producer acquires it (fence.proxy.tensormap
// ...acquire) before its first load. Both matrices are maps of bytes (element type u8: a bf16 row
// is 2 K bytes, an e4m3 row K): dimension 0 the row's bytes, dimension 1 the rows; the box WG_KB
// bytes by the tile's rows; out-of-range rows and bytes are filled with zeros (the M, N and K tails).
#define TM_CONSUMERS WG_WARPGROUPS
#define TM_BM (64 * TM_CONSUMERS)
#define TM_PRODUCER (4 * TM_CONSUMERS)                // the producer's warp: the one after the consumers'
#define TM_OWN_PRODUCER (TM_CONSUMERS <= 2)           // a producer warp (else thread 0 loads)
#define TM_THREADS (128 * TM_CONSUMERS + (TM_OWN_PRODUCER ? 32 : 0))
#define TM_X_BYTES (TM_BM * WG_KB)                    // x's tile in a stage, then w's (WG_BN * WG_KB)
#define TM_STAGE_BYTES ((TM_BM + WG_BN) * WG_KB)
#define TM_BARRIERS (WG_STAGES * TM_STAGE_BYTES)      // full[WG_STAGES], empty[WG_STAGES], then the split flag
#define TM_SHARED (TM_BARRIERS + 16 * WG_STAGES + 16)  // device_tensor_cores.TmaCut.shared
// blocks a multiprocessor: 2 x 288 or 4 x 160 threads of at most 96 registers (64 accumulators) at 112 or 128 columns
#define TM_BLOCKS (WG_BN > 128 ? 1 : TM_CONSUMERS == 1 ? 4 : TM_CONSUMERS == 2 ? 2 : 1)
#define TM_SWIZZLE (WG_KB == 128 ? 3 : WG_KB == 64 ? 2 : 1)  // tensormap.replace's swizzle_mode: 128, 64, 32 bytes
#define TM_ARRIVALS (4 * TM_CONSUMERS)                // a stage's release: lane 0 of every consumer warp
#ifndef TM_CLUSTER_M
#define TM_CLUSTER_M 1
#endif
#ifndef TM_CLUSTER_N
#define TM_CLUSTER_N 1
#endif
#define TM_CLUSTER (TM_CLUSTER_M * TM_CLUSTER_N)      // a cluster's blocks: rank r is (r % TM_CLUSTER_M, r / TM_CLUSTER_M)
#define TM_X_BOX (TM_BM / TM_CLUSTER_N)               // x's rows a block loads a stage (its share of the tile)
#define TM_W_BOX (WG_BN / TM_CLUSTER_M)               // w's rows a block loads a stage
#define TM_RELEASERS (TM_CLUSTER_M + TM_CLUSTER_N - 1)  // blocks whose loads land in a block's stage: itself and its peers
#if (WG_WARPGROUPS != 2 && !(WG_WARPGROUPS == 3 && WG_BN == 256) && !(WG_WARPGROUPS == 1 && WG_BN == 128)) || \
    WG_STAGES < 2 || TM_SHARED > 65536 || (WG_BN == 112 && (WG_WARPGROUPS != 2 || TM_CLUSTER_M * TM_CLUSTER_N != 1)) || \
    (WG_BN != 112 && WG_BN != 128 && WG_BN != 256) || TM_CLUSTER_M < 1 || TM_CLUSTER_M > 2 || TM_CLUSTER_N < 1 || TM_CLUSTER_N > 2 || \
    (TM_CLUSTER > 1 && !TM_OWN_PRODUCER)
#error "gemm_tma.cu: a cut outside what the kernel is written for (device_tensor_cores.TmaCut says which)"
#endif
// TM_EARLY (a producer warp's cuts): a consumer waits for its step's MMAs to retire and releases
// that stage at once, not after it has waited for the next stage's bytes and issued their MMAs
// (which keeps one group in flight across the wait, but holds a stage that is done until the next
// one lands: where loads are late, the ring then refills a stage a load later than it could)
#ifndef TM_EARLY
#define TM_EARLY 0
#endif
#if TM_EARLY && !TM_OWN_PRODUCER
#error "gemm_tma.cu: TM_EARLY with a producer warp alone"
#endif
#if TM_CLUSTER > 1
#define TM_CLUSTER_DIMS __cluster_dims__(TM_CLUSTER, 1, 1)
#else
#define TM_CLUSTER_DIMS
#endif

// ---- the mbarriers' and TMA's PTX (tests/test_gemm_tma_on_host.py puts host forms in place of this part)
__device__ __forceinline__ void tm_init(u64* barrier, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(r4d_smem(barrier)), "r"(count) : "memory");
}
// the initialised barriers made visible to the async proxy (TMA's complete_tx) before any use
__device__ __forceinline__ void tm_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void tm_arrive(u64* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(r4d_smem(barrier)) : "memory");
}
// the producer's arrival on a full barrier, saying how many bytes TMA will complete on it
__device__ __forceinline__ void tm_expect(u64* barrier, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(r4d_smem(barrier)), "r"(bytes) : "memory");
}
// Until the phase of `parity` has completed: a barrier in phase n (none of its phases done yet when
// n = 0) reports parity (n - 1) & 1, the phase before, done, and n & 1 not. A wait past 4 s traps
// (the launch fails with an error) rather than hanging the card: a lost arrival or a load that
// never lands is a bug to be reported. The loop is the asm's own: a C++ loop around try_wait is
// divergent code to ptxas, which then serialises the wgmmas around it (C7518, "compiler-inserted
// WG.DP in divergent path") in the three-warpgroup cut.
__device__ __forceinline__ void tm_wait(u64* barrier, u32 parity) {
    asm volatile("{\n\t.reg .pred p, late;\n\t.reg .u64 start, now;\n\t"
                 "mov.u64 start, %%globaltimer;\n"
                 "TM_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@p bra TM_DONE_%=;\n\t"
                 "mov.u64 now, %%globaltimer;\n\t"
                 "sub.u64 now, now, start;\n\t"
                 "setp.gt.u64 late, now, 4000000000;\n\t"
                 "@late trap;\n\t"
                 "bra TM_WAIT_%=;\n"
                 "TM_DONE_%=:\n}\n" ::"r"(r4d_smem(barrier)), "r"(parity)
                 : "memory");
}
// The box of the map at (byte k of a row, row `row`) into `into`, completing its bytes on `barrier`
__device__ __forceinline__ void tm_load(void* into, const void* map, int k, int row, u64* barrier) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(r4d_smem(into)), "l"(map), "r"(k), "r"(row), "r"(r4d_smem(barrier))
                 : "memory");
}
// The box into `into` of this block and of every block of the cluster in `blocks` (a bit a rank), each
// at the same offset of its own shared memory, completing its bytes on each one's barrier at `barrier`'s offset
__device__ __forceinline__ void tm_load_multicast(void* into, const void* map, int k, int row, u64* barrier, u16 blocks) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(r4d_smem(into)), "l"(map), "r"(k), "r"(row), "r"(r4d_smem(barrier)), "h"(blocks)
                 : "memory");
}
// An arrival on the barrier at `barrier`'s offset in the cluster's block `rank` (this one's included).
// The arrival's own (release at the CTA's scope) order: what it releases is a stage the MMAs of
// this block read, retired by wgmma's wait_group before it, and TMA, which writes over it next, is
// ordered after the producer's wait on it. A release at the cluster's scope would also wait for this
// thread's every memory access to be seen cluster-wide: on an H200 the clustered GEMM then ran at
// 0.45x the unclustered one (bench/results/h200_card_runs_2026-12-04c.md).
__device__ __forceinline__ void tm_arrive_at(u64* barrier, u32 rank) {
    asm volatile("{\n\t.reg .b32 at;\n\tmapa.shared::cluster.u32 at, %0, %1;\n\t"
                 "mbarrier.arrive.shared::cluster.b64 _, [at];\n}\n" ::"r"(r4d_smem(barrier)), "r"(rank)
                 : "memory");
}
// Every thread of the cluster's blocks: what each did before is seen by all after (the barriers'
// init before any peer's load or arrival; no block gone while a peer may still arrive on its barriers)
__device__ __forceinline__ void tm_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// This block's rank in its cluster (the launch's 1-D grid in clusters of TM_CLUSTER: blockIdx.x % TM_CLUSTER)
__device__ __forceinline__ u32 tm_cluster_rank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}
// A map another launch wrote (r4d_tma_maps' release) acquired by the tensormap proxy before TMA
// reads it. The bulk-group commit and wait after it: Triton's workaround for ptxas leaving out a
// fence after the acquire (nothing is in flight then: they cost nothing).
__device__ __forceinline__ void tm_acquire(const void* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n\tcp.async.bulk.commit_group;\n\t"
                 "cp.async.bulk.wait_group.read 0;\n" ::"l"(map)
                 : "memory");
}
// tm_expect and both tm_loads of a stage where `issue` holds: predicated instructions, so that every
// thread runs the same code (thread 0 without a producer warp)
__device__ __forceinline__ void tm_refill(bool issue, u8* into, const u8* map_x, const u8* map_w, int k, int m0, int n0,
                                          u64* barrier) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %0, 0;\n\t"
                 "@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%1], %2;\n\t"
                 "@p cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%3], [%4, {%5, %6}], [%1];\n\t"
                 "@p cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%7], [%8, {%5, %9}], [%1];\n}\n"
                 ::"r"((u32)issue), "r"(r4d_smem(barrier)), "r"((u32)TM_STAGE_BYTES), "r"(r4d_smem(into)), "l"(map_x), "r"(k),
                 "r"(m0), "r"(r4d_smem(into + TM_X_BYTES)), "l"(map_w), "r"(n0)
                 : "memory");
}
// ---- end of the mbarriers' and TMA's PTX

// A block's output tile in a GEMM of M x N outputs, `cols` outputs a tile across (WG_BN; half of it
// for SwiGLU's paired tiles): the clusters' tiles of TM_CLUSTER_M x TM_CLUSTER_N tiles in
// gemm_wgmma.cu's order (groups of WG_GROUP row tiles, then right), a block's tile in its cluster's by
// its rank. Where M or N does not fill a cluster's tile, a block's may lie past them: it loads its
// shares for its peers (TMA fills its own rows with zeros) and stores nothing.
__device__ __forceinline__ void tm_tile(int M, int N, int cols, int block, int* m0, int* n0) {
    int rows_c = TM_BM * TM_CLUSTER_M, cols_c = cols * TM_CLUSTER_N, rank = block % TM_CLUSTER, cluster = block / TM_CLUSTER;
    int tiles_m = (M + rows_c - 1) / rows_c, tiles_n = (N + cols_c - 1) / cols_c;
    int span = WG_GROUP * tiles_n, first = cluster / span * WG_GROUP, group = min(WG_GROUP, tiles_m - first);
    *m0 = (first + cluster % span % group) * rows_c + rank % TM_CLUSTER_M * TM_BM;
    *n0 = cluster % span / group * cols_c + rank / TM_CLUSTER_M * cols;
}

// The blocks of a cluster, a bit a rank, that read the x tile of block `rank` (its row: the same rank %
// TM_CLUSTER_M) or its w tile (its column: the same rank / TM_CLUSTER_M); itself in both
__device__ __forceinline__ u16 tm_row_blocks(u32 rank) {
    u16 blocks = 0;
    for (int j = 0; j < TM_CLUSTER_N; ++j) blocks |= (u16)(1u << (rank % TM_CLUSTER_M + TM_CLUSTER_M * j));
    return blocks;
}
__device__ __forceinline__ u16 tm_column_blocks(u32 rank) {
    u16 blocks = 0;
    for (int j = 0; j < TM_CLUSTER_M; ++j) blocks |= (u16)(1u << (j + rank / TM_CLUSTER_M * TM_CLUSTER_M));
    return blocks;
}
// This block's share of a tile a stage: a plain load where no other block reads it, else multicast
__device__ __forceinline__ void tm_share(void* into, const void* map, int k, int row, u64* barrier, u16 blocks) {
    if (TM_CLUSTER == 1) tm_load(into, map, k, row, barrier);
    else tm_load_multicast(into, map, k, row, barrier, blocks);
}
// A consumer warp's release of a stage: its block's empty[] alone, or in a cluster that of every block
// in `peers` (tm_row_blocks | tm_column_blocks: those whose loads land in this block's stages, the
// same blocks this block's loads land in)
__device__ __forceinline__ void tm_release(u64* barrier, u32 peers) {
    if (TM_CLUSTER == 1) return tm_arrive(barrier);
    for (u32 r = 0; r < TM_CLUSTER; ++r)
        if (peers >> r & 1) tm_arrive_at(barrier, r);
}

// The tiles' epilogues: TM_STORE y = the sums (gemm_wgmma.cu's wg_store, split K included);
// TM_SWIGLU a tile of WG_BN / 2 gate rows of w then the same WG_BN / 2 rows of up's weight (map_u),
// so a lane's d[i] (gate's column c) and d[i + WG_ACC / 2] (up's column c) are one output's pair:
// up = the up sum, y = silu_mul(gate sum, up sum) (r4d_silu_mul: the bits of r4d_silu_mul_dev)
#define TM_STORE 0
#define TM_SWIGLU 1

// SwiGLU's epilogue: d[i] for i < WG_ACC / 2 is gate's output at (row r0 or r0 + 8, column n0 + (i >> 2) * 8
// + 2 tq + (i & 1)) of the tile's WG_BN / 2 columns (gemm_wgmma.cu's wg_store layout), d[i + WG_ACC / 2] up's
__device__ __forceinline__ void tm_store_swiglu(const TcGemm& p, const float* d, float* up, int r0, int n0, int tq) {
#pragma unroll
    for (int i = 0; i < WG_ACC / 2; i += 2) {  // two adjacent columns a step (wg_store's pairs)
        int m = r0 + ((i >> 1) & 1) * 8, n = n0 + (i >> 2) * 8 + 2 * tq;
        if (m < p.M) {
            float u0 = d[i + WG_ACC / 2], u1 = d[i + 1 + WG_ACC / 2];
            wg_put(up + (long long)m * p.N + n, u0, u1, n, p.N);
            wg_put(p.y + (long long)m * p.N + n, r4d_silu_mul(d[i], u0), r4d_silu_mul(d[i + 1], u1), n, p.N);
        }
    }
}

// One output tile (rows m0.., columns n0.. of p's y) of x (map_x) . w^T (map_w; FORM TM_SWIGLU: the
// gate's weight, map_u the up's, `up` its output)
template <int KIND, int FORM>
__device__ void tm_gemm(const u8* map_x, const u8* map_w, const u8* map_u, int m0, int n0, const TcGemm& p, float* up) {
    extern __shared__ __align__(1024) u8 tm_shared[];
    if (r4d_smem(tm_shared) % 1024) __trap();  // the swizzle's atoms would not be where TMA and wgmma put them
    u64* full = (u64*)(tm_shared + TM_BARRIERS);  // full[s]: stage s's bytes have landed
    u64* empty = full + WG_STAGES;                 // empty[s]: every consumer warp is done reading stage s
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = warp / 4, g = lane / 4, tq = lane % 4;
    int tiles = (p.K * (KIND == TC_BF16 ? 2 : 1) + WG_KB - 1) / WG_KB;  // k-tiles of WG_KB bytes
    int t0 = blockIdx.z * p.tiles_per_split, t1 = min(tiles, t0 + p.tiles_per_split), count = max(0, t1 - t0);
    u32 rank = blockIdx.x % TM_CLUSTER;  // tm_tile's; the cluster's own, checked below
    // the blocks that read this block's x tile and its w tile (itself alone unclustered): where its
    // loads land, and whose loads land in it (the blocks its consumers release stages into)
    u16 row_blocks = tm_row_blocks(rank), column_blocks = tm_column_blocks(rank);
    u32 peers = row_blocks | column_blocks;
    if (threadIdx.x == 0) {
        if (TM_CLUSTER > 1 && tm_cluster_rank() != rank) __trap();  // a grid not in clusters of TM_CLUSTER
        for (int s = 0; s < WG_STAGES; ++s) {
            tm_init(full + s, 1);                            // the producer's expect_tx arrival (and TMA's bytes)
            tm_init(empty + s, TM_ARRIVALS * TM_RELEASERS);  // lane 0 of each consumer warp of each releasing block
        }
        tm_init_fence();
    }
    if (TM_CLUSTER > 1) tm_cluster_sync();  // no peer's load or release before this block's barriers exist
    else __syncthreads();
    R4D_CHAIN_PROLOGUE();  // the maps, x's rows (and e4m3's scales) are the launches' before this one
    // k-tile i lives in stage s = i % WG_STAGES, its round r = i / WG_STAGES: the r-th time stage s
    // is filled, which completes phase r of full[s]; the consumers' release of it completes phase r
    // of empty[s]. Parity: in round r the consumers wait full[s] for parity r & 1 (phase r done);
    // the producer, before filling stage s in round r, waits empty[s] for parity (r & 1) ^ 1, the
    // phase before r: in round 0 that is the barrier's phase "-1", reported done at once (the ring
    // starts empty); in round r > 0 it is phase r - 1, the consumers' release of round r - 1. A
    // barrier cannot run two phases ahead of a waiter: stage s is not refilled (full[s]'s next phase)
    // before every consumer warp has released it (empty[s]), which each does only after its own wait
    // on full[s] in that round. In a cluster every block's stage s is filled by its own producer and
    // its peers' (full[s] expects the whole stage's bytes all the same), so empty[s] counts the
    // releases of every block this block's loads land in, and each consumer warp releases into
    // every block whose loads land in its own (the same blocks: a row and a column of the cluster).
    // A peer's bytes may complete on full[s] before this block's expect_tx: the phase cannot end
    // before that arrival, and no peer loads round r + 1 into this block before it released round r.
    if (TM_OWN_PRODUCER && warp == TM_PRODUCER) {
        if (lane == 0 && count > 0) {
            int across = rank / TM_CLUSTER_M, down = rank % TM_CLUSTER_M;  // this block's shares of x's and w's tiles
            tm_acquire(map_x);
            tm_acquire(map_w);
            if (FORM == TM_SWIGLU) tm_acquire(map_u);
            for (int i = 0; i < count; ++i) {
                int s = i % WG_STAGES;
                u32 round = (u32)(i / WG_STAGES);
                tm_wait(empty + s, (round & 1) ^ 1);
                u8* stage = tm_shared + s * TM_STAGE_BYTES;
                tm_expect(full + s, TM_STAGE_BYTES);  // every box of the stage, zero-filled parts included
                int k = (t0 + i) * WG_KB;
                // x's rows m0 + across * TM_X_BOX.., to the blocks of this row of the cluster
                tm_share(stage + across * TM_X_BOX * WG_KB, map_x, k, m0 + across * TM_X_BOX, full + s, row_blocks);
                if (FORM == TM_SWIGLU && TM_CLUSTER_M == 1) {  // boxes of WG_BN / 2 rows: gate's, then up's below them
                    tm_share(stage + TM_X_BYTES, map_w, k, n0, full + s, column_blocks);
                    tm_share(stage + TM_X_BYTES + WG_BN / 2 * WG_KB, map_u, k, n0, full + s, column_blocks);
                } else if (FORM == TM_SWIGLU) {  // two down M: the first loads gate's half, the second up's
                    tm_share(stage + TM_X_BYTES + down * TM_W_BOX * WG_KB, down ? map_u : map_w, k, n0, full + s,
                             column_blocks);
                } else {  // w's rows n0 + down * TM_W_BOX.., to the blocks of this column
                    tm_share(stage + TM_X_BYTES + down * TM_W_BOX * WG_KB, map_w, k, n0 + down * TM_W_BOX, full + s,
                             column_blocks);
                }
            }
        }
    }
    // Without a producer warp (three consumer warpgroups) the whole block runs the loads' code and
    // thread 0 alone issues them, by predicate: the ring filled first (round 0: every stage empty),
    // then after step i's release, once every warp has released tile i - 1 (the phase of its round
    // of empty[]), that stage refilled with tile i - 1 + WG_STAGES. No wait can hold itself up: the
    // full[] wait of step i is for a tile loaded at step i - WG_STAGES + 1 or before, the empty[]
    // wait of step i for releases every warp makes at step i before it waits.
    bool loader = !TM_OWN_PRODUCER && threadIdx.x == 0 && count > 0;
    if (!TM_OWN_PRODUCER) {
        if (loader) {
            tm_acquire(map_x);
            tm_acquire(map_w);
        }
        for (int i = 0; i < min(count, WG_STAGES); ++i)
            tm_refill(loader, tm_shared + i * TM_STAGE_BYTES, map_x, map_w, (t0 + i) * WG_KB, m0, n0, full + i);
    }
    float d[WG_ACC];
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) d[i] = 0.0f;
    int r0 = m0 + warpgroup * 64 + warp % 4 * 16 + g;  // a consumer lane's output rows: r0 and r0 + 8
    if (warp < TM_PRODUCER) {
        // A step: wait for the stage's bytes, issue its WG_KB / 32 MMAs (K 16 bf16 or 32 e4m3 each,
        // the descriptors advanced 32 bytes), commit; wait_group 1: this warpgroup's MMAs of the
        // step before have retired (read their stage), so the warp releases that stage. One group
        // stays in flight under the next stage's wait; the last stage needs no release.
        for (int i = 0; i < count; ++i) {
            int s = i % WG_STAGES;
            tm_wait(full + s, (u32)(i / WG_STAGES) & 1);
            u8* stage = tm_shared + s * TM_STAGE_BYTES;
            u64 a = wg_desc(stage + warpgroup * 64 * WG_KB), b = wg_desc(stage + TM_X_BYTES);
            wg_fence();
#pragma unroll
            for (int j = 0; j < WG_KB / 32; ++j) wg_mma<KIND, WG_BN>(d, a + 2 * j, b + 2 * j);
            wg_commit();
            if (TM_EARLY) {  // this step's MMAs retired, its stage released at once
                wg_wait<0>();
                __syncwarp();
                if (lane == 0) tm_release(empty + s, peers);
                continue;
            }
            wg_wait<1>();
            __syncwarp();  // every lane past its wait (wait_group is .aligned: this only says so)
            if (i > 0 && lane == 0) tm_release(empty + (i - 1) % WG_STAGES, peers);
            if (!TM_OWN_PRODUCER && i > 0 && i - 1 + WG_STAGES < count) {
                // the stage tile i - 1 leaves, refilled with tile i - 1 + WG_STAGES once every warp
                // has released it (its round's phase of empty[]). Every thread waits, the same code
                // for all (the block's warps keep within a step of each other: tile i's MMAs are in
                // flight meanwhile); thread 0 alone issues, by predicate
                int back = (i - 1) % WG_STAGES, k = (t0 + i - 1 + WG_STAGES) * WG_KB;
                tm_wait(empty + back, (u32)((i - 1) / WG_STAGES) & 1);
                tm_refill(loader, tm_shared + back * TM_STAGE_BYTES, map_x, map_w, k, m0, n0, full + back);
            }
        }
        wg_wait<0>();
        wg_pin(d);
    }
    if (TM_CLUSTER > 1) {  // no block of the cluster leaves while a peer may still arrive on its barriers
        __syncwarp();
        tm_cluster_sync();
    }
    bool split = gridDim.z > 1, consumer = warp < TM_PRODUCER;
    if (FORM == TM_SWIGLU) {
        if (consumer) tm_store_swiglu(p, d, up, r0, n0, tq);
        return;  // never split (the plan's)
    }
    // gemm_wgmma.cu's epilogue; the producer's warp holds no outputs
    if (consumer) wg_store<KIND>(p, d, r0, n0, tq, split);
    // every thread of the block passes r4d_last_split's barriers, the producer's warp too
    if (!split || !r4d_last_split(p.counters, (int*)(tm_shared + TM_BARRIERS + 16 * WG_STAGES)) || !consumer) return;
    wg_add_splits<KIND>(p, r0, n0, tq);
}

// ---- the tensor maps' PTX (tensormap.replace on a map in shared memory; the host test replaces this part too)
#define TM_REPLACE(FIELD, TYPE) "tensormap.replace.tile." FIELD ".shared::cta.b1024." TYPE " [%0], %1;\n"
#define TM_REPLACE_AT(FIELD, TYPE) "tensormap.replace.tile." FIELD ".shared::cta.b1024." TYPE " [%0], %1, %2;\n"

// The map of a [rows, row_bytes] matrix of bytes at `base`, its box WG_KB bytes by `box` rows, in
// the swizzle of WG_KB bytes, written into `staged` (shared, 128 zero bytes: the fields no replace
// names stay 0: element type u8, no interleave, zero fill, no L2 promotion). One thread.
__device__ __forceinline__ void tm_fill(u32* staged, const void* base, int rows, int row_bytes, int box) {
    u32 map = r4d_smem(staged);
    // tensormap.replace's global_stride: the stride in bytes from PTX ISA 8.6 on; the PTX of older
    // compilers (CUDA <= 12.6: PTX <= 8.5) took it already divided by 16 (Triton's ptxas workaround)
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ < 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ <= 6))
    u64 stride = (u64)row_bytes >> 4;
#else
    u64 stride = (u64)row_bytes;
#endif
    asm volatile(TM_REPLACE("global_address", "b64") ::"r"(map), "l"((u64)base) : "memory");
    asm volatile(TM_REPLACE("rank", "b32") ::"r"(map), "n"(1) : "memory");  // rank - 1: two dimensions
    asm volatile(TM_REPLACE_AT("box_dim", "b32") ::"r"(map), "n"(0), "r"(WG_KB) : "memory");
    asm volatile(TM_REPLACE_AT("box_dim", "b32") ::"r"(map), "n"(1), "r"(box) : "memory");
    asm volatile(TM_REPLACE_AT("global_dim", "b32") ::"r"(map), "n"(0), "r"(row_bytes) : "memory");
    asm volatile(TM_REPLACE_AT("global_dim", "b32") ::"r"(map), "n"(1), "r"(rows) : "memory");
    asm volatile(TM_REPLACE_AT("global_stride", "b64") ::"r"(map), "n"(0), "l"(stride) : "memory");
    asm volatile(TM_REPLACE_AT("element_stride", "b32") ::"r"(map), "n"(0), "r"(1) : "memory");
    asm volatile(TM_REPLACE_AT("element_stride", "b32") ::"r"(map), "n"(1), "r"(1) : "memory");
    asm volatile(TM_REPLACE("swizzle_mode", "b32") ::"r"(map), "n"(TM_SWIZZLE) : "memory");
}
// The staged map copied to `to` in global memory with the tensormap proxy's release: the whole warp
__device__ __forceinline__ void tm_publish(u8* to, u32* staged) {
    asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n"
                 ::"l"(to), "r"(r4d_smem(staged))
                 : "memory");
}
// ---- end of the tensor maps' PTX

#ifndef R4D_TM_ONLY
#define R4D_TM_ONLY 0
#endif

// The maps the GEMMs read, one warp, maps 128-aligned (the scratch's parts are 256-aligned): x's
// ([M, row_bytes], boxes of TM_X_BOX rows: a block's share of x's tile) at maps[0..127], then each
// weight's ([rows, row_bytes], boxes of `box` rows) after it
__device__ __forceinline__ void tm_maps(const void* x, const void* w0, const void* w1, const void* w2, int M, int n0,
                                        int n1, int n2, int weights, int row_bytes, int box, u8* maps) {
    __shared__ __align__(128) u32 staged[4][32];
    R4D_CHAIN_PROLOGUE();  // the launch after this one waits for this one alone: wait for the one before
    for (int which = 0; which <= weights; ++which) {
        staged[which][threadIdx.x] = 0u;
        __syncwarp();
        if (threadIdx.x == 0) {
            const void* base = which == 0 ? x : which == 1 ? w0 : which == 2 ? w1 : w2;
            int rows = which == 0 ? M : which == 1 ? n0 : which == 2 ? n1 : n2;
            tm_fill(staged[which], base, rows, row_bytes, which ? box : TM_X_BOX);
        }
        __syncwarp();  // lane 0's fields in before the warp's copy
        tm_publish(maps + 128 * which, staged[which]);
    }
}

#if R4D_TM_ONLY == 0 || R4D_TM_ONLY == 3
// x's map, then w's (boxes of TM_W_BOX rows: a block's share of w's tile)
extern "C" __global__ void __launch_bounds__(32) r4d_tma_maps(const void* x, const void* w, int M, int N, int row_bytes,
                                                              u8* maps) {
    tm_maps(x, w, nullptr, nullptr, M, N, 0, 0, 1, row_bytes, TM_W_BOX, maps);
}
// x's map, then `weights` (1..3) weights' (boxes of `box` rows: TM_W_BOX for r4d_tma_gemm_bf16_group,
// WG_BN / 2 for r4d_tma_gemm_bf16_swiglu)
extern "C" __global__ void __launch_bounds__(32) r4d_tma_maps_group(const void* x, const void* w0, const void* w1,
                                                                    const void* w2, int M, int n0, int n1, int n2,
                                                                    int weights, int row_bytes, int box, u8* maps) {
    if (weights < 1 || weights > 3) __trap();
    tm_maps(x, w0, w1, w2, M, n0, n1, n2, weights, row_bytes, box, maps);
}
#endif

#define TM_GEMM_ENTRY(KIND, NAME)                                                                               \
    extern "C" __global__ void TM_CLUSTER_DIMS __launch_bounds__(TM_THREADS, TM_BLOCKS) NAME(                        \
        const u8* maps, const float* x_scale, const float* w_scale, int w_stride, float* y, float* partial,      \
        u32* counters, int M, int N, int K, int tiles_per_split) {                                             \
        TcGemm p = {nullptr, x_scale, nullptr, w_scale, w_stride, y, partial, counters, M, N, K, tiles_per_split}; \
        int m0, n0;                                                                                            \
        tm_tile(M, N, WG_BN, blockIdx.x, &m0, &n0);                                                            \
        tm_gemm<KIND, TM_STORE>(maps, maps + 128, nullptr, m0, n0, p, nullptr);                                \
    }

// The blocks of a GEMM of M x N outputs in tiles `cols` across: its clusters' tiles (tm_tile's), in clusters
__device__ __forceinline__ int tm_blocks(int M, int N, int cols) {
    int rows_c = TM_BM * TM_CLUSTER_M, cols_c = cols * TM_CLUSTER_N;
    return (M + rows_c - 1) / rows_c * ((N + cols_c - 1) / cols_c) * TM_CLUSTER;
}

// q, k and v (or any 1..3 weights of one x) in one launch: y_g = x . w_g^T, f32 [M, n_g], the blocks
// of each weight's tiles after the one before's (its tiles in tm_tile's order: a cluster never spans
// two weights); never split. maps: r4d_tma_maps_group's with boxes of TM_W_BOX rows.
__device__ void tm_gemm_group(const u8* maps, float* y0, float* y1, float* y2, int M, int n0, int n1, int n2, int weights,
                              int K) {
    int block = blockIdx.x, which = 0, N = n0, m0, c0;
    while (which < weights - 1 && block >= tm_blocks(M, N, WG_BN)) {
        block -= tm_blocks(M, N, WG_BN);
        N = ++which == 1 ? n1 : n2;
    }
    float* y = which == 0 ? y0 : which == 1 ? y1 : y2;
    tm_tile(M, N, WG_BN, block, &m0, &c0);
    TcGemm p = {nullptr, nullptr, nullptr, nullptr, 0, y, nullptr, nullptr, M, N, K, (2 * K + WG_KB - 1) / WG_KB};
    tm_gemm<TC_BF16, TM_STORE>(maps, maps + 128 * (1 + which), nullptr, m0, c0, p, nullptr);
}

// gate and up of one x in one launch, silu * mul in the epilogue: up = x . wu^T, gate = silu_mul(x . wg^T,
// up), f32 [M, N] each; a block's WG_BN / 2 output columns; never split. maps: r4d_tma_maps_group's
// of the gate's then the up's weight with boxes of WG_BN / 2 rows.
__device__ void tm_gemm_swiglu(const u8* maps, float* gate, float* up, int M, int N, int K) {
    int m0, c0;
    tm_tile(M, N, WG_BN / 2, blockIdx.x, &m0, &c0);
    TcGemm p = {nullptr, nullptr, nullptr, nullptr, 0, gate, nullptr, nullptr, M, N, K, (2 * K + WG_KB - 1) / WG_KB};
    tm_gemm<TC_BF16, TM_SWIGLU>(maps, maps + 128, maps + 256, m0, c0, p, up);
}

// One entry a compile (-DR4D_TM_ONLY=1 bf16 with its group and SwiGLU forms, 2 e4m3, 3 the maps; 0: all,
// the compile test)
#if R4D_TM_ONLY == 0 || R4D_TM_ONLY == 1
TM_GEMM_ENTRY(TC_BF16, r4d_tma_gemm_bf16)
// the grouped blocks and the paired tiles: the cuts of a producer warp and 112 or 128 columns alone
// (device_tensor_cores.groups_serve; the plan never launches them in another)
#define TM_GROUPS (TM_OWN_PRODUCER && WG_BN <= 128)
extern "C" __global__ void TM_CLUSTER_DIMS __launch_bounds__(TM_THREADS, TM_BLOCKS) r4d_tma_gemm_bf16_group(
    const u8* maps, float* y0, float* y1, float* y2, int M, int n0, int n1, int n2, int weights, int K) {
    if (!TM_GROUPS) __trap();
    tm_gemm_group(maps, y0, y1, y2, M, n0, n1, n2, weights, K);
}
extern "C" __global__ void TM_CLUSTER_DIMS __launch_bounds__(TM_THREADS, TM_BLOCKS) r4d_tma_gemm_bf16_swiglu(
    const u8* maps, float* gate, float* up, int M, int N, int K) {
    if (!TM_GROUPS) __trap();
    tm_gemm_swiglu(maps, gate, up, M, N, K);
}
#endif
#if R4D_TM_ONLY == 0 || R4D_TM_ONLY == 2
TM_GEMM_ENTRY(TC_E4M3, r4d_tma_gemm_e4m3)
#endif
