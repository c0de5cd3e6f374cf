// libr4d device rows: attention over a paged KV cache for batches and prefill chunks on tensor cores
// (NVIDIA, sm_80 and later): flash attention with tf32 mma.sync (m16n8k8, f32 accumulation), split
// over the context where the tiles alone cannot fill the card (flash-decoding), the splits merged in
// order by each tile's last block. The step's k, v rows are stored first (attention.cu's
// r4d_kv_store_dev), so every key comes from the cache.
//
// Work: a block takes one query tile (R4D_AT_QT consecutive tokens of one sequence, times the
// R4D_AT_G query heads sharing kv head blockIdx.y: at most 64 rows, 16 a warp, row r is token r / G,
// head r % G) and one split of the keys that tile sees (blockIdx.z). Tiles are numbered sequence by
// sequence (gridDim.x bounds their count from the shapes; blocks past the last return). Keys go
// AT_KT at a time through shared memory (cp.async of f32 rows, looked up in the block table, then
// rounded to tf32 in place), S = Q K^T and O += P V on the tensor cores, an online softmax per row
// in between. tf32 keeps f32's range with 10 bits of mantissa: q, k, p and v are rounded to nearest
// (ties away) on the way in; the sums are f32. Scores past a token's position, past the sequence's
// context or past the split are -inf.
//
// Fragments (tensor_core.cu's notation; m16n8k8 tf32): A a0 (row g, k t), a1 (row g + 8, k t), a2 (row
// g, k t + 4), a3 (row g + 8, k t + 4); B b0 (k t, col g), b1 (k t + 4, col g); C (row g, cols 2t,
// 2t + 1), (row g + 8, the same). O += P V takes P straight from S's C fragments by contracting
// the 8 keys of a step in the order 0, 2, 4, 6, 1, 3, 5, 7 (k t <-> key 2t, k t + 4 <-> key 2t + 1),
// and V's B fragment in the same order: no shuffles. Shared rows are padded by 4 floats, which makes
// every fragment load conflict-free.
#define AT_WARPS 4
#define AT_THREADS (AT_WARPS * 32)  // the launch's block (device_attention_tiles.THREADS)
#define AT_ROWS 64
#define AT_KT 32
#define AT_PAD 4
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
    float* partial;            // split: [M, kv_heads, splits, G, D + 2] (max, sum, weighted values)
    u32* counters;             // split: [gridDim.x * kv_heads], zero between launches
    int seqs, max_blocks, q_heads, kv_heads, block_size;
    float scale;
};

__device__ __forceinline__ u32 r4d_tf32(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// d += a . b, m16n8k8, tf32 in, f32 accumulation
__device__ __forceinline__ void r4d_mma_tf32(float* d, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D, int G>
__device__ void attend_tiles(const AttTiles& p) {
    const int QT = AT_ROWS / G, ROW = D + AT_PAD;
    const int CHUNKS = 2 * AT_KT * (D / 4) / AT_THREADS;  // a K and a V tile in 16-byte chunks, over the block
    extern __shared__ __align__(16) float at_shared[];
    float* ks = at_shared;               // [AT_KT][ROW]
    float* vs = at_shared + AT_KT * ROW; // [AT_KT][ROW]
    __shared__ long long s_slot[2][AT_KT];  // the cache slots of this key tile's keys and of the next's
    __shared__ int s_last;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int kvh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    // this block's tile: the sequence and its first token. One sequence (a prefill chunk) takes its
    // tiles from the last back: the last sees the most keys, so the longest blocks go in the first
    // wave and the grid ends on short ones (blocks start in blockIdx.x order). blockIdx.x still names
    // the tile for its split counter.
    int tile = blockIdx.x, s = 0;
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
    // the warp's two rows of each fragment: r and r + 8
    int rows[2] = {warp * 16 + g, warp * 16 + g + 8}, limit[2];
    bool active = warp * 16 < count * G;  // a warp of padding rows only (a decode tile) loads, but computes nothing
    u32 qa[D / 8][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int token = rows[h] / G;
        limit[h] = token < count ? min(p.positions[first + token], context - 1) : -1;
    }
    {
        const float* q0 = p.q + ((long long)(first + min(rows[0] / G, count - 1)) * p.q_heads + kvh * G + rows[0] % G) * D;
        const float* q1 = p.q + ((long long)(first + min(rows[1] / G, count - 1)) * p.q_heads + kvh * G + rows[1] % G) * D;
#pragma unroll
        for (int k = 0; k < D / 8; ++k) {
            qa[k][0] = r4d_tf32(q0[8 * k + t]);
            qa[k][1] = r4d_tf32(q1[8 * k + t]);
            qa[k][2] = r4d_tf32(q0[8 * k + t + 4]);
            qa[k][3] = r4d_tf32(q1[8 * k + t + 4]);
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
    if (threadIdx.x < AT_KT) s_slot[0][threadIdx.x] = slot_of(k0 + threadIdx.x);
    __syncthreads();
    for (int kt = k0, buffer = 0; kt < k1; kt += AT_KT, buffer ^= 1) {
        const long long* slots = s_slot[buffer];
        // 16 bytes a copy, CHUNKS a thread; each thread rounds the chunks it copied itself (its own
        // cp.async writes are visible to it after the wait), so one barrier serves both
#pragma unroll 4
        for (int u = 0; u < CHUNKS; ++u) {  // (4 at a time: unrolled whole, the addresses spill qa and o)
            int c = threadIdx.x + u * AT_THREADS;
            int which = c / (AT_KT * (D / 4)), rest = c % (AT_KT * (D / 4)), i = rest / (D / 4), q4 = rest % (D / 4);
            long long slot = slots[i];
            const float* cache = which ? p.v_cache : p.k_cache;
            const float* src = slot >= 0 ? cache + slot * width + (long long)kvh * D + 4 * q4 : cache;
            r4d_cp_async16((which ? vs : ks) + i * ROW + 4 * q4, src, slot >= 0);
        }
        r4d_cp_commit();
        // the next tile's slots, looked up under this tile's copies and products; read after the
        // barriers below (the other buffer's last readers were the previous tile's copies)
        if (threadIdx.x < AT_KT) s_slot[buffer ^ 1][threadIdx.x] = slot_of(kt + AT_KT + threadIdx.x);
        r4d_cp_wait<0>();
#pragma unroll 4
        for (int u = 0; u < CHUNKS; ++u) {  // tf32, nearest, in place (4 chunks in flight)
            int c = threadIdx.x + u * AT_THREADS;
            int which = c / (AT_KT * (D / 4)), rest = c % (AT_KT * (D / 4)), i = rest / (D / 4), q4 = rest % (D / 4);
            float4* at = (float4*)((which ? vs : ks) + i * ROW + 4 * q4);
            float4 v = *at;
            *at = make_float4(__uint_as_float(r4d_tf32(v.x)), __uint_as_float(r4d_tf32(v.y)),
                              __uint_as_float(r4d_tf32(v.z)), __uint_as_float(r4d_tf32(v.w)));
        }
        __syncthreads();
        if (active) {
            float sc[AT_KT / 8][4];
#pragma unroll
            for (int n = 0; n < AT_KT / 8; ++n) {
#pragma unroll
                for (int c = 0; c < 4; ++c) sc[n][c] = 0.0f;
                const float* key = ks + (8 * n + g) * ROW;
#pragma unroll
                for (int k = 0; k < D / 8; ++k)
                    r4d_mma_tf32(sc[n], qa[k], __float_as_uint(key[8 * k + t]), __float_as_uint(key[8 * k + t + 4]));
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float top = minus_inf;
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        int j = kt + 8 * n + 2 * t + c;
                        float v = (j < k1 && j <= limit[h]) ? sc[n][2 * h + c] * p.scale : minus_inf;
                        sc[n][2 * h + c] = v;
                        top = fmaxf(top, v);
                    }
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
                float next = fmaxf(run_max[h], top);
                float base = next == minus_inf ? 0.0f : next;  // a row that has seen no key yet: every weight 0
                float keep = expf(run_max[h] - base), sum = 0.0f;
#pragma unroll
                for (int n = 0; n < AT_KT / 8; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float e = expf(sc[n][2 * h + c] - base);
                        sum += e;
                        sc[n][2 * h + c] = e;
                    }
                run_sum[h] = run_sum[h] * keep + sum;
                run_max[h] = next;
#pragma unroll
                for (int d = 0; d < D / 8; ++d) { o[d][2 * h] *= keep; o[d][2 * h + 1] *= keep; }
            }
#pragma unroll
            for (int n = 0; n < AT_KT / 8; ++n) {  // keys 8n..8n + 7, contracted as 0, 2, 4, 6, 1, 3, 5, 7
                u32 pa[4] = {r4d_tf32(sc[n][0]), r4d_tf32(sc[n][2]), r4d_tf32(sc[n][1]), r4d_tf32(sc[n][3])};
                const float* v0 = vs + (8 * n + 2 * t) * ROW;
#pragma unroll
                for (int d = 0; d < D / 8; ++d)
                    r4d_mma_tf32(o[d], pa, __float_as_uint(v0[8 * d + g]), __float_as_uint(v0[ROW + 8 * d + g]));
            }
        }
        __syncthreads();  // every warp is done with this tile before the next one lands
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
#pragma unroll
            for (int d = 0; d < D / 8; ++d) {
                orow[8 * d + 2 * t] = o[d][2 * h] / total[h];
                orow[8 * d + 2 * t + 1] = o[d][2 * h + 1] / total[h];
            }
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
        u32* counter = p.counters + (long long)blockIdx.x * K + kvh;
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
            float w = sum > 0.0f ? expf(r4d_load_l2(entries + (long long)z * G * (D + 2)) - top) : 0.0f;
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

extern "C" __global__ void __launch_bounds__(AT_THREADS, 3) r4d_attend_tiles(
    const float* q, const float* k_cache, const float* v_cache, const int* positions, const int* cu_seqlens,
    const int* context_lens, const int* block_tables, float* out, float* partial, u32* counters, int seqs,
    int max_blocks, int q_heads, int kv_heads, int block_size, float scale) { R4D_CHAIN_PROLOGUE();
    AttTiles p = {q, k_cache, v_cache, positions, cu_seqlens, context_lens, block_tables, out, partial, counters,
                  seqs, max_blocks, q_heads, kv_heads, block_size, scale};
    attend_tiles<R4D_AT_D, R4D_AT_G>(p);
}
