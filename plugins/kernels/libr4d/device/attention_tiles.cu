// libr4d device rows: attention over a paged KV cache for batches and prefill chunks on tensor cores
// (NVIDIA, sm_80 and later): flash attention with bf16 mma.sync (m16n8k16, f32 accumulation), split
// over the context where the tiles alone cannot fill the card (flash-decoding), the splits merged in
// order by each tile's last block. The step's k, v rows are stored first by r4d_kv_store_bf16_dev
// (below): at their cache slots in f32, as attention.cu's store does, and narrowed to bf16 into the
// row's scratch ("fresh" rows, [M, kv_heads * D]), which the tiles read for this step's keys.
//
// Work: a block takes one query tile (R4D_AT_QT consecutive tokens of one sequence, times the
// R4D_AT_G query heads sharing one kv head: at most AT_ROWS rows, 16 a warp, row r is token
// r / G, head r % G) and one split of the keys that tile sees (blockIdx.z). Tiles are numbered
// sequence by sequence (gridDim.x bounds their count from the shapes; blocks past the last return).
//
// Keys go AT_KT at a time through two bf16 tiles of K and V in shared memory (rows padded by 16
// bytes, so that every ldmatrix is conflict-free): the MMAs read one while the next key tile is
// written into the other, one barrier a key tile. A key tile of this step's own keys (a sequence's
// tokens in a step are its last positions, in order, as the scheduler lays them out: key j is step
// row cu_seqlens[s] + j - (context - new tokens)) comes from the fresh bf16 rows by 16-byte
// cp.async, issued before the products of the tile before and landing under them: a prefill from
// position 0 takes every key that way, half the bytes of the f32 cache and no narrowing. A key tile
// that holds older keys (a chunk after a cached context, decode tokens) comes from the f32 cache
// through the block table (the slots looked up a tile ahead), loaded into registers by 16 bytes and
// narrowed to bf16 by the thread that loaded them, after the products (the other blocks of the
// multiprocessor cover the wait).
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
#ifndef R4D_AT_KT
#define R4D_AT_KT 32      // keys a tile (device_attention_tiles.Cut.keys: 32, or 48 to halve the barriers and
#endif                    // rescales a key; two stages of 64 keys at D 128 pass the 64 KiB a launch may have)
#define AT_KT R4D_AT_KT
#ifndef R4D_AT_LAZY
#define R4D_AT_LAZY 0     // 1: skip O's rescale where no row of the warp raised its max (device_attention_tiles.Cut.lazy)
#endif
#define AT_BPAD 8         // bf16 padding a shared row (16 bytes)
#define AT_MAX_SPLITS 16  // device_attention_tiles.MAX_SPLITS
#ifndef R4D_AT_BATCH
#define R4D_AT_BATCH 8    // 16-byte cache loads a thread keeps in flight (older keys)
#endif
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
    const u16* fresh_k;        // [M, kv_heads * D] bf16: this step's k, v rows narrowed (r4d_kv_store_bf16_dev)
    const u16* fresh_v;
};

// k_cache[slots[m]] = k[m], v_cache[slots[m]] = v[m] (attention.cu's r4d_kv_store_dev), and the same
// rows narrowed to bf16 (nearest even) at fresh_k[m], fresh_v[m]; grid (ceil(width / 4 / blockDim.x),
// M): 4 values a thread, by 16 bytes where width % 4 == 0 and k, v and the caches are 16-byte aligned
// (the bf16 rows 8)
extern "C" __global__ void r4d_kv_store_bf16_dev(const float* k, const float* v, float* k_cache, float* v_cache,
                                                 const int* slots, int width, u16* fresh_k, u16* fresh_v) {
    R4D_CHAIN_PROLOGUE();
    int m = blockIdx.y, c = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= width) return;
    long long slot = slots[m], row = (long long)m * width + c;
    bool vector = width % 4 == 0 && ((((unsigned long long)k | (unsigned long long)v | (unsigned long long)k_cache |
                                       (unsigned long long)v_cache) & 15) | (((unsigned long long)fresh_k |
                                       (unsigned long long)fresh_v) & 7)) == 0;
    if (vector) {
        float4 a = *(const float4*)(k + row), b = *(const float4*)(v + row);
        *(float4*)(k_cache + slot * width + c) = a;
        *(float4*)(v_cache + slot * width + c) = b;
        *(uint2*)(fresh_k + row) = make_uint2(r4d_bf16x2(a.x, a.y), r4d_bf16x2(a.z, a.w));
        *(uint2*)(fresh_v + row) = make_uint2(r4d_bf16x2(b.x, b.y), r4d_bf16x2(b.z, b.w));
        return;
    }
    for (int e = c; e < min(c + 4, width); ++e) {
        float a = k[(long long)m * width + e], b = v[(long long)m * width + e];
        k_cache[slot * width + e] = a;
        v_cache[slot * width + e] = b;
        fresh_k[(long long)m * width + e] = (u16)r4d_bf16x2(a, 0.0f);
        fresh_v[(long long)m * width + e] = (u16)r4d_bf16x2(b, 0.0f);
    }
}

// the cache loads a thread keeps in flight: the most, up to `most`, that divide its `chunks` (12 at 48 keys,
// 8 warps: 6; a batch past the chunks would write past the tiles)
__device__ constexpr int at_batch(int chunks, int most) {
    return chunks <= most ? chunks : chunks % most == 0 ? most : at_batch(chunks, most - 1);
}

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
    const int CHUNKS = 2 * TILE4 / AT_THREADS;          // a K and a V tile's f32 chunks, over the block
    const int TILE8 = AT_KT * (D / 8);                  // 16-byte bf16 chunks of a K (or V) tile
    const int CHUNKS8 = 2 * TILE8 / AT_THREADS;         // a K and a V tile's bf16 chunks, over the block
    static_assert(CHUNKS8 * AT_THREADS == 2 * TILE8 && D % 32 == 0 && AT_KT % 16 == 0, "attention_tiles.cu: shapes");
    extern __shared__ __align__(16) float at_shared[];
    u16* buffers = (u16*)at_shared;  // [2 buffers][K, V][AT_KT][BROW] bf16
    __shared__ long long s_slot[2][AT_KT];  // the cache slots of a key tile's keys, by the tile's parity
    __shared__ int s_last;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // Blocks start in the order of x, then y: the kv head is taken from the faster-moving part of that
    // order (block b of a split is tile b / kv_heads, kv head b % kv_heads), so that every kv head's
    // tile of one index starts before the next index's. Each sequence (a prefill chunk) takes its
    // tiles from the last back: the last sees the most keys, so the longest blocks of every kv head go
    // in the first waves and the grid ends on short ones (sequences still in order). `named` (the tile
    // before that reversal) and the kv head name the split counter.
    int order = blockIdx.x + gridDim.x * blockIdx.y;
    int named = order / gridDim.y, kvh = order % gridDim.y, split = blockIdx.z, splits = gridDim.z;
    // this block's tile: the sequence and its first token
    int tile = named, s = 0;
    for (; s < p.seqs; ++s) {
        int tiles = (p.cu_seqlens[s + 1] - p.cu_seqlens[s] + QT - 1) / QT;
        if (tile < tiles) {
            tile = tiles - 1 - tile;  // the sequence's tiles from its last back
            break;
        }
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
    // key j's slot in the cache through the block table; -1 past this split's keys (zeros loaded)
    auto slot_of = [&](int j) -> long long {
        return j < k1 ? (long long)table[j / p.block_size] * p.block_size + j % p.block_size : -1;
    };
    // this step's keys from `fresh` on: key j is fresh row fresh_row + j (none without fresh rows)
    int fresh = p.fresh_k ? context - (p.cu_seqlens[s + 1] - p.cu_seqlens[s]) : 0x7fffffff;
    long long fresh_row = (long long)p.cu_seqlens[s] - fresh;
    // the key tile from kt, of this step's keys alone, into bf16 buffer `into` by cp.async: 16 bytes
    // a copy, CHUNKS8 a thread; chunk c is (K or V, key i, bf16 8 q8..8 q8 + 7), consecutive threads
    // on consecutive 16 bytes of a key's row; keys past k1 zero-filled
    auto copy_fresh = [&](int kt, u16* into) {
#pragma unroll
        for (int u = 0; u < CHUNKS8; ++u) {
            int c = threadIdx.x + u * AT_THREADS;
            int which = c / TILE8, rest = c % TILE8, i = rest / (D / 8), q8 = rest % (D / 8);
            const u16* step_rows = which ? p.fresh_v : p.fresh_k;
            bool live = kt + i < k1;
            const u16* src = live ? step_rows + (fresh_row + kt + i) * width + (long long)kvh * D + 8 * q8 : step_rows;
            r4d_cp_async16(into + (which * AT_KT + i) * BROW + 8 * q8, src, live);
        }
        r4d_cp_commit();
    };
    // the key tile whose slots are in `slots` from the f32 cache into bf16 buffer `into`: 16 bytes a
    // load, CHUNKS a thread, R4D_AT_BATCH in flight; chunk c is (K or V, key i, floats 4 q4..4 q4 + 3)
    auto load_cache = [&](const long long* slots, u16* into) {
        constexpr int BATCH = at_batch(CHUNKS, R4D_AT_BATCH);
        static_assert(CHUNKS % BATCH == 0, "attention_tiles.cu: whole batches of cache loads");
#pragma unroll 1
        for (int u0 = 0; u0 < CHUNKS; u0 += BATCH) {  // batch after batch (unrolled, the loads of all hoist and spill)
            float4 v[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                int c = threadIdx.x + (u0 + u) * AT_THREADS;
                int which = c / TILE4, rest = c % TILE4, i = rest / (D / 4), q4 = rest % (D / 4);
                long long slot = slots[i];
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (slot >= 0) v[u] = *(const float4*)((which ? p.v_cache : p.k_cache) + slot * width + (long long)kvh * D + 4 * q4);
            }
#pragma unroll
            for (int u = 0; u < BATCH; ++u) {
                int c = threadIdx.x + (u0 + u) * AT_THREADS;
                int which = c / TILE4, rest = c % TILE4, i = rest / (D / 4), q4 = rest % (D / 4);
                *(uint2*)(into + (which * AT_KT + i) * BROW + 4 * q4) = make_uint2(r4d_bf16x2(v[u].x, v[u].y), r4d_bf16x2(v[u].z, v[u].w));
            }
        }
    };
    if (k0 < k1) {
        if (threadIdx.x < AT_KT) {
            s_slot[0][threadIdx.x] = slot_of(k0 + threadIdx.x);
            s_slot[1][threadIdx.x] = slot_of(k0 + AT_KT + threadIdx.x);
        }
        __syncthreads();
        if (k0 >= fresh) copy_fresh(k0, buffers);
        else load_cache(s_slot[0], buffers);
    }
    for (int kt = k0, parity = 0; kt < k1; kt += AT_KT, parity ^= 1) {
        const u16* kb = buffers + parity * 2 * AT_KT * BROW;
        const u16* vb = kb + AT_KT * BROW;
        u16* next = buffers + (parity ^ 1) * 2 * AT_KT * BROW;
        // this tile is whole (this thread's copies landed; the barrier makes every thread's visible),
        // and every warp is done with the other buffer (the last tile's products)
        r4d_cp_wait<0>();
        __syncthreads();
        // the next tile's copies fly under this tile's products where it is all this step's keys;
        // the slots of the tile after it (s_slot[parity] was last read before the barrier)
        bool next_fresh = kt + AT_KT >= fresh;
        if (kt + AT_KT < k1 && next_fresh) copy_fresh(kt + AT_KT, next);
        if (threadIdx.x < AT_KT) s_slot[parity][threadIdx.x] = slot_of(kt + 2 * AT_KT + threadIdx.x);
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
            float keep[2];  // each row's factor on what it summed before this tile
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float top = minus_inf;
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n) top = fmaxf(top, fmaxf(sc[n][2 * h], sc[n][2 * h + 1]));
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
                float next_max = fmaxf(run_max[h], top);
                float base = next_max == minus_inf ? 0.0f : next_max;  // a row that has seen no key yet: every weight 0
                float sum = 0.0f;
                keep[h] = r4d_exp2(run_max[h] - base);
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float e = r4d_exp2(sc[n][2 * h + c] - base);
                        sum += e;
                        sc[n][2 * h + c] = e;
                    }
                run_sum[h] = run_sum[h] * keep[h] + sum;
                run_max[h] = next_max;
            }
            // O's rescale: D / 2 multiplies a lane a tile. Lazy, where every row of the warp kept its max
            // (keep exactly 1: ex2 of 0), skipped warp-wide: the same bits, the multiplies by 1 left out
            if (!R4D_AT_LAZY || !__all_sync(0xffffffffu, keep[0] == 1.0f && keep[1] == 1.0f)) {
#pragma unroll
                for (int d = 0; d < D / 8; ++d)
#pragma unroll
                    for (int c = 0; c < 4; ++c) o[d][c] *= keep[c / 2];
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
        // a next tile with older keys: from the cache, after the products
        if (kt + AT_KT < k1 && !next_fresh) load_cache(s_slot[parity ^ 1], next);
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
    int max_blocks, int q_heads, int kv_heads, int block_size, float scale, const u16* fresh_k, const u16* fresh_v) {
    R4D_CHAIN_PROLOGUE();
    AttTiles p = {q, k_cache, v_cache, positions, cu_seqlens, context_lens, block_tables, out, partial, counters,
                  seqs, max_blocks, q_heads, kv_heads, block_size, scale, fresh_k, fresh_v};
    attend_tiles<R4D_AT_D, R4D_AT_G>(p);
}
