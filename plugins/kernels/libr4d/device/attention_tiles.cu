// libr4d device rows: attention over a paged KV cache for batches and prefill chunks on tensor cores
// (NVIDIA, sm_80 and later): flash attention with bf16 mma.sync (m16n8k16, f32 accumulation), split
// over the context where the tiles alone cannot fill the card (flash-decoding), the splits merged in
// order by each tile's last block. The step's k, v rows are stored first (attention.cu's
// r4d_kv_store_dev), so every key comes from the cache.
//
// Work: a block takes one query tile (R4D_AT_QT consecutive tokens of one sequence, times the
// R4D_AT_G query heads sharing one kv head: at most AT_ROWS rows, 16 a warp, row r is token
// r / G, head r % G) and one split of the keys that tile sees (blockIdx.z). Tiles are numbered
// sequence by sequence (gridDim.x bounds their count from the shapes; blocks past the last return).
//
// Keys go AT_KT at a time: their f32 cache rows (looked up in the block table) are copied by
// cp.async into a stage while the tensor cores work on the previous tile, then each thread narrows
// the 16-byte chunks it copied itself to bf16 (its own cp.async writes are visible to it after the
// wait) into the tile the MMAs read, rows padded by 16 bytes so that every ldmatrix is conflict-free.
// Two barriers a key tile: the bf16 tile is written (all warps done with the last one) and read.
// S = Q K^T on m16n8k16 with q pre-multiplied by scale * log2(e) before it is rounded, so the scores
// are in log2 units and the online softmax takes exp2 (ex2.approx) with no multiply; P goes from S's
// accumulators straight into the A fragment of O += P V (the m16n8k16 C and A layouts line up two
// n-tiles to one k-step); V's B fragments by ldmatrix.trans. q, k, v and the weights are rounded to
// bf16 (nearest even) on the way in; every sum is f32. Scores past a token's position, past the
// sequence's context or past the split are -inf; a warp masks only the key tiles that cross one of
// its rows' limits and skips the tiles past all of them (causal prefill: the tiles past the diagonal).
//
// Fragments (tensor_core.cu's notation; m16n8k16 bf16): A a0 (row g, k 2t..2t+1), a1 (row g + 8, the
// same), a2 (row g, k 2t+8..2t+9), a3 (row g + 8, the same); B b0 (k 2t..2t+1, col g), b1 (k
// 2t+8..2t+9, col g); C (row g, cols 2t, 2t + 1), (row g + 8, the same).
#ifndef R4D_AT_WARPS
#define R4D_AT_WARPS 8  // device_attention_tiles.warps: 8 for prefill tiles, 4 where tiles are short
#endif
#define AT_THREADS (R4D_AT_WARPS * 32)
#define AT_ROWS (R4D_AT_WARPS * 16)
#define AT_KT 32          // keys a tile (device_attention_tiles.KEYS)
#define AT_BPAD 8         // bf16 padding a shared row (16 bytes)
#define AT_MAX_SPLITS 16  // device_attention_tiles.MAX_SPLITS
#ifndef R4D_AT_D
#define R4D_AT_D 128
#endif
#ifndef R4D_AT_G
#define R4D_AT_G 4
#endif
#define R4D_AT_QT (AT_ROWS / R4D_AT_G)

struct AttTiles {
    const float* q;            // [M, q_heads * D]
    const float* k_cache;      // [slots, kv_heads * D]
    const float* v_cache;
    const int* positions;      // [M]
    const int* cu_seqlens;     // [seqs + 1]
    const int* context_lens;   // [seqs]
    const int* block_tables;   // [seqs, max_blocks]
    float* out;                // [M, q_heads * D]
    float* partial;            // split: [M, kv_heads, splits, G, D + 2] (max in log2 units, sum, weighted values)
    u32* counters;             // split: [gridDim.x * kv_heads], zero between launches
    int seqs, max_blocks, q_heads, kv_heads, block_size;
    float scale;
};

// 2^x (ex2.approx: about 2 ulp; -inf gives +0)
__device__ __forceinline__ float r4d_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

template <int D, int G>
__device__ void attend_tiles(const AttTiles& p) {
    const int QT = AT_ROWS / G, BROW = D + AT_BPAD;
    const int TILE4 = AT_KT * (D / 4);                  // 16-byte f32 chunks of a K (or V) tile
    const int CHUNKS = 2 * TILE4 / AT_THREADS;          // a K and a V tile's chunks, over the block
    static_assert(CHUNKS * AT_THREADS == 2 * TILE4 && D % 32 == 0 && AT_KT % 16 == 0, "attention_tiles.cu: shapes");
    extern __shared__ __align__(16) float at_shared[];
    float* stage = at_shared;                           // [2][AT_KT][D] f32, K then V, as copied
    u16* kb = (u16*)(at_shared + 2 * AT_KT * D);        // [AT_KT][BROW] bf16
    u16* vb = kb + AT_KT * BROW;                        // [AT_KT][BROW] bf16
    __shared__ long long s_slot[2][AT_KT];  // the cache slots of the next key tile's keys and of the one after
    __shared__ int s_last;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // Blocks start in the order of x, then y: the kv head is taken from the faster-moving part of that
    // order (block b of a split is tile b / kv_heads, kv head b % kv_heads), so that every kv head's
    // tile of one index starts before the next index's. One sequence (a prefill chunk) takes its tiles
    // from the last back: the last sees the most keys, so the longest blocks of every kv head go in
    // the first waves and the grid ends on short ones. `named` (the tile before that reversal) and the
    // kv head name the split counter.
    int order = blockIdx.x + gridDim.x * blockIdx.y;
    int named = order / gridDim.y, kvh = order % gridDim.y, split = blockIdx.z, splits = gridDim.z;
    // this block's tile: the sequence and its first token
    int tile = named, s = 0;
    if (p.seqs == 1) {
        int tiles = (p.cu_seqlens[1] - p.cu_seqlens[0] + QT - 1) / QT;
        if (tile >= tiles) return;  // past the last tile: nothing, and no counter of its own
        tile = tiles - 1 - tile;
    }
    for (; s < p.seqs; ++s) {
        int tiles = (p.cu_seqlens[s + 1] - p.cu_seqlens[s] + QT - 1) / QT;
        if (tile < tiles) break;
        tile -= tiles;
    }
    if (s >= p.seqs) return;  // past the last tile: nothing, and no counter of its own
    int first = p.cu_seqlens[s] + tile * QT, count = min(QT, p.cu_seqlens[s + 1] - first);
    int context = p.context_lens[s], visible = 0;
    for (int i = 0; i < count; ++i) visible = max(visible, min(p.positions[first + i], context - 1) + 1);
    int chunk = ((visible + splits - 1) / splits + AT_KT - 1) / AT_KT * AT_KT;
    int k0 = split * chunk, k1 = min(visible, k0 + chunk);
    // the warp's two rows of each fragment: r and r + 8, and the lowest and highest last key any
    // real row of the warp sees (every lane works them out alike: at most 16 tokens)
    int rows[2] = {warp * 16 + g, warp * 16 + g + 8}, limit[2];
    bool active = warp * 16 < count * G;  // a warp of padding rows only (a decode tile) copies, but computes nothing
    int lowest = 0x7fffffff, highest = -1;
    for (int token = warp * 16 / G; token <= (warp * 16 + 15) / G && token < count; ++token) {
        int last = min(p.positions[first + token], context - 1);
        lowest = min(lowest, last);
        highest = max(highest, last);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int token = rows[h] / G;
        limit[h] = token < count ? min(p.positions[first + token], context - 1) : -1;
    }
    // q * scale * log2(e), rounded to bf16, as A fragments for all of D (a padding row repeats the
    // tile's last token: finite, and never written)
    u32 qa[D / 16][4];
    {
        const float fold = p.scale * 1.4426950408889634f;
        const float* q0 = p.q + ((long long)(first + min(rows[0] / G, count - 1)) * p.q_heads + kvh * G + rows[0] % G) * D;
        const float* q1 = p.q + ((long long)(first + min(rows[1] / G, count - 1)) * p.q_heads + kvh * G + rows[1] % G) * D;
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            qa[k][0] = r4d_bf16x2(q0[16 * k + 2 * t] * fold, q0[16 * k + 2 * t + 1] * fold);
            qa[k][1] = r4d_bf16x2(q1[16 * k + 2 * t] * fold, q1[16 * k + 2 * t + 1] * fold);
            qa[k][2] = r4d_bf16x2(q0[16 * k + 2 * t + 8] * fold, q0[16 * k + 2 * t + 9] * fold);
            qa[k][3] = r4d_bf16x2(q1[16 * k + 2 * t + 8] * fold, q1[16 * k + 2 * t + 9] * fold);
        }
    }
    const float minus_inf = __uint_as_float(0xff800000u);
    float o[D / 8][4], run_max[2] = {minus_inf, minus_inf}, run_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int d = 0; d < D / 8; ++d)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[d][c] = 0.0f;
    const int width = p.kv_heads * D;
    const int* table = p.block_tables + (long long)s * p.max_blocks;
    // key j's slot in the cache through the block table; -1 past this split's keys (zeros copied)
    auto slot_of = [&](int j) -> long long {
        return j < k1 ? (long long)table[j / p.block_size] * p.block_size + j % p.block_size : -1;
    };
    // the key tile whose slots are in `slots`, into the stage: 16 bytes a copy, CHUNKS a thread. Chunk
    // c is (K or V, key i, floats 4 q4..4 q4 + 3); consecutive threads take consecutive 16 bytes of
    // a key's row (whole 512-byte rows of the cache at D = 128)
    auto copy = [&](const long long* slots) {
#pragma unroll 4
        for (int u = 0; u < CHUNKS; ++u) {
            int c = threadIdx.x + u * AT_THREADS;
            int which = c / TILE4, rest = c % TILE4, i = rest / (D / 4), q4 = rest % (D / 4);
            long long slot = slots[i];
            const float* cache = which ? p.v_cache : p.k_cache;
            const float* src = slot >= 0 ? cache + slot * width + (long long)kvh * D + 4 * q4 : cache;
            r4d_cp_async16(stage + c * 4, src, slot >= 0);
        }
        r4d_cp_commit();
    };
    if (k0 < k1) {
        if (threadIdx.x < AT_KT) {
            s_slot[0][threadIdx.x] = slot_of(k0 + threadIdx.x);
            s_slot[1][threadIdx.x] = slot_of(k0 + AT_KT + threadIdx.x);
        }
        __syncthreads();
        copy(s_slot[0]);
    }
    for (int kt = k0, buffer = 1; kt < k1; kt += AT_KT, buffer ^= 1) {
        // this tile's copies (this thread's own) landed: narrow them to bf16 (4 chunks in flight)
        r4d_cp_wait<0>();
#pragma unroll 4
        for (int u = 0; u < CHUNKS; ++u) {
            int c = threadIdx.x + u * AT_THREADS;
            int which = c / TILE4, rest = c % TILE4, i = rest / (D / 4), q4 = rest % (D / 4);
            float4 v = *(const float4*)(stage + c * 4);
            *(uint2*)((which ? vb : kb) + i * BROW + 4 * q4) = make_uint2(r4d_bf16x2(v.x, v.y), r4d_bf16x2(v.z, v.w));
        }
        __syncthreads();  // the bf16 tile is whole; the stage is free; s_slot[buffer] was written before
        // the next tile's copies fly under this tile's products; then the slots of the one after
        // (s_slot[buffer ^ 1] was last read by this tile's copies, all issued before the barrier)
        if (kt + AT_KT < k1) copy(s_slot[buffer]);
        if (threadIdx.x < AT_KT) s_slot[buffer ^ 1][threadIdx.x] = slot_of(kt + 2 * AT_KT + threadIdx.x);
        if (active && kt <= highest) {
            float sc[AT_KT / 8][4];
#pragma unroll
            for (int n = 0; n < AT_KT / 8; ++n)
#pragma unroll
                for (int c = 0; c < 4; ++c) sc[n][c] = 0.0f;
            // S = Q K^T: ldmatrix x4 of keys 8n..8n + 7 gives B for two k-steps (matrix l / 8 is
            // dims 8 (l / 8).. of this pair of steps)
#pragma unroll
            for (int k = 0; k < D / 16; k += 2)
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n) {
                    u32 b[4];
                    r4d_ldmatrix_x4(b, kb + (8 * n + lane % 8) * BROW + 16 * k + 8 * (lane / 8));
                    r4d_mma_bf16(sc[n], qa[k], b);
                    r4d_mma_bf16(sc[n], qa[k + 1], b + 2);
                }
            // mask only where a row's limit, the split or the context ends inside this tile
            if (kt + AT_KT - 1 > lowest || kt + AT_KT > k1) {
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        int j = kt + 8 * n + 2 * t + (c & 1);
                        if (j >= k1 || j > limit[c / 2]) sc[n][c] = minus_inf;
                    }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float top = minus_inf;
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n) top = fmaxf(top, fmaxf(sc[n][2 * h], sc[n][2 * h + 1]));
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
                float next = fmaxf(run_max[h], top);
                float base = next == minus_inf ? 0.0f : next;  // a row that has seen no key yet: every weight 0
                float keep = r4d_exp2(run_max[h] - base), sum = 0.0f;
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float e = r4d_exp2(sc[n][2 * h + c] - base);
                        sum += e;
                        sc[n][2 * h + c] = e;
                    }
                run_sum[h] = run_sum[h] * keep + sum;
                run_max[h] = next;
#pragma unroll
                for (int d = 0; d < D / 8; ++d) { o[d][2 * h] *= keep; o[d][2 * h + 1] *= keep; }
            }
            // O += P V: keys 16 s..16 s + 15 are n-tiles 2s and 2s + 1 of S, which are P's A
            // fragment as they stand; ldmatrix.trans x4 gives V's B for two d-tiles (matrix l / 8:
            // keys 8 ((l / 8) % 2).., dims 8 (l / 16)..)
#pragma unroll
            for (int s2 = 0; s2 < AT_KT / 16; ++s2) {
                u32 pa[4] = {r4d_bf16x2(sc[2 * s2][0], sc[2 * s2][1]), r4d_bf16x2(sc[2 * s2][2], sc[2 * s2][3]),
                             r4d_bf16x2(sc[2 * s2 + 1][0], sc[2 * s2 + 1][1]),
                             r4d_bf16x2(sc[2 * s2 + 1][2], sc[2 * s2 + 1][3])};
#pragma unroll
                for (int d = 0; d < D / 8; d += 2) {
                    u32 b[4];
                    r4d_ldmatrix_x4_trans(b, vb + (16 * s2 + 8 * ((lane / 8) % 2) + lane % 8) * BROW + 8 * d + 8 * (lane / 16));
                    r4d_mma_bf16(o[d], pa, b);
                    r4d_mma_bf16(o[d + 1], pa, b + 2);
                }
            }
        }
        __syncthreads();  // every warp is done with this bf16 tile before the next is written
    }
    float total[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        total[h] = run_sum[h] + __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
        total[h] += __shfl_xor_sync(0xffffffffu, total[h], 2);
    }
    const int K = p.kv_heads;
    if (splits == 1) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int token = rows[h] / G;
            if (token >= count) continue;
            float* orow = p.out + ((long long)(first + token) * p.q_heads + kvh * G + rows[h] % G) * D;
            float inverse = 1.0f / total[h];
#pragma unroll
            for (int d = 0; d < D / 8; ++d)
                *(float2*)(orow + 8 * d + 2 * t) = make_float2(o[d][2 * h] * inverse, o[d][2 * h + 1] * inverse);
        }
        return;
    }
    // this split's (max, sum, weighted values) of each real row
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int token = rows[h] / G;
        if (token >= count) continue;
        float* entry = p.partial + ((((long long)(first + token) * K + kvh) * splits + split) * G + rows[h] % G) * (D + 2);
        if (t == 0) { entry[0] = run_max[h]; entry[1] = total[h]; }
#pragma unroll
        for (int d = 0; d < D / 8; ++d) { entry[2 + 8 * d + 2 * t] = o[d][2 * h]; entry[3 + 8 * d + 2 * t] = o[d][2 * h + 1]; }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* counter = p.counters + (long long)named * K + kvh;
        s_last = atomicAdd(counter, 1u) == (u32)splits - 1;
        if (s_last) *counter = 0u;  // every split has counted: ready for the next launch
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // the tile's last block: each row's splits merged in order, the weights staged in shared memory
    float* weight = at_shared;                 // [AT_ROWS][AT_MAX_SPLITS]
    float* sums = at_shared + AT_ROWS * AT_MAX_SPLITS;  // [AT_ROWS]
    int real = count * G;
    if (threadIdx.x < real) {
        int r = threadIdx.x;
        const float* entries = p.partial + (((long long)(first + r / G) * K + kvh) * splits * G + r % G) * (D + 2);
        float top = minus_inf, all = 0.0f;
        for (int z = 0; z < splits; ++z)
            if (r4d_load_l2(entries + (long long)z * G * (D + 2) + 1) > 0.0f) top = fmaxf(top, r4d_load_l2(entries + (long long)z * G * (D + 2)));
        for (int z = 0; z < splits; ++z) {
            float sum = r4d_load_l2(entries + (long long)z * G * (D + 2) + 1);
            float w = sum > 0.0f ? r4d_exp2(r4d_load_l2(entries + (long long)z * G * (D + 2)) - top) : 0.0f;
            weight[r * AT_MAX_SPLITS + z] = w;
            all += sum * w;
        }
        sums[r] = all;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < real * D; i += blockDim.x) {
        int r = i / D, d = i % D;
        const float* entries = p.partial + (((long long)(first + r / G) * K + kvh) * splits * G + r % G) * (D + 2);
        float mixed = 0.0f;
        for (int z = 0; z < splits; ++z) {
            float w = weight[r * AT_MAX_SPLITS + z];
            if (w > 0.0f) mixed += r4d_load_l2(entries + (long long)z * G * (D + 2) + 2 + d) * w;
        }
        p.out[((long long)(first + r / G) * p.q_heads + kvh * G + r % G) * D + d] = mixed / sums[r];
    }
}

extern "C" __global__ void __launch_bounds__(AT_THREADS, R4D_AT_WARPS == 8 ? 1 : 2) r4d_attend_tiles(
    const float* q, const float* k_cache, const float* v_cache, const int* positions, const int* cu_seqlens,
    const int* context_lens, const int* block_tables, float* out, float* partial, u32* counters, int seqs,
    int max_blocks, int q_heads, int kv_heads, int block_size, float scale) { R4D_CHAIN_PROLOGUE();
    AttTiles p = {q, k_cache, v_cache, positions, cu_seqlens, context_lens, block_tables, out, partial, counters,
                  seqs, max_blocks, q_heads, kv_heads, block_size, scale};
    attend_tiles<R4D_AT_D, R4D_AT_G>(p);
}
