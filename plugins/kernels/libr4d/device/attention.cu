// libr4d device rows: attention over a paged KV cache, prefill and decode tokens of several
// sequences in one launch, split over the context (flash-decoding's idea):
// - the attention row: the step's k, v rows stored at their slots (r4d_kv_store_dev), then
//   r4d_attend_*_cache over the cache;
// - the fused rope_attention row: r4d_attend_*_fresh alone. It rotates q and the step's own keys
//   itself (rope's arithmetic) and reads the keys of this step's positions from the k, v rows
//   instead of the cache (a sequence's tokens in a step are its last positions, in order, as the
//   scheduler lays them out), stores them at their slots, and leaves q and k rotated, as rope would.
// Grid (M tokens, kv heads, S splits), ATT_WARPS warps a block: a block takes the G query heads that
// share one kv head (each key and value row is read once for the G of them) over its split of the
// token's visible positions; each warp walks every ATT_WARPS-th of them with an online softmax per
// head, the warps are merged, and the (token, kv head)'s last block merges the S splits in order.
// Everything is sized from the tensors' shapes and read from device arrays, so a captured launch
// replays with new contents.
// A decode step (every sequence one token, M == seqs: the grid knows it without a load) is a chain of
// round trips to L2 more than of bytes (4 MB of cache at an 8B model's 512 positions), so there each
// (token, kv head)'s last block also stores the token's rotated k (from the cos and sin its lanes
// already hold) and its v, with no grid-wide step after it.
#define ATT_WARPS 4
#define ATT_MAX_SPLITS 32  // device_kernels.ATT_MAX_SPLITS; at most a warp (the split merge takes a lane each)

// k_cache[slots[m]] = k[m], v_cache[slots[m]] = v[m]; grid (ceil(width / blockDim.x), M)
extern "C" __global__ void r4d_kv_store_dev(const float* k, const float* v, float* k_cache, float* v_cache,
                                            const int* slots, int width) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    long long slot = slots[m];
    k_cache[slot * width + c] = k[(long long)m * width + c];
    v_cache[slot * width + c] = v[(long long)m * width + c];
}

struct Attend {
    float* q;  // [M, q_heads * head_dim]
    float* k;  // [M, kv_heads * head_dim]
    const float* v;
    float* k_cache;
    float* v_cache;
    const int* slots;
    const int* positions;
    const int* cu_seqlens;
    const int* context_lens;
    const int* block_tables;
    float* out;
    const float* inv_freq;
    float* partial;  // [M, kv_heads, S, G, head_dim + 2]
    u32* counters;   // [M * kv_heads] then one for the whole grid
    int seqs, max_blocks, q_heads, kv_heads, head_dim, block_size, interleaved;
    float scale;
    int window;  // sliding_attention (attention_window.cu): keys p - window < j <= p; 0 (left out): all
};

// rope's cos and sin for element d of a head_dim row at `position` (f64 rounded once, as the rope row)
__device__ __forceinline__ void r4d_rope_cs(int d, int head_dim, int position, const float* inv_freq, int interleaved,
                                            float& c, float& s) {
    int i = interleaved ? d / 2 : d % (head_dim / 2);  // the pair's index
    r4d_cos_sin((float)position * inv_freq[i], c, s);
}

// Element d of row `row` rotated by the angle whose cos and sin are c, s, as rope rotates it.
__device__ __forceinline__ float r4d_rotate_cs(const float* row, int d, int head_dim, int interleaved, float c, float s) {
    int half = head_dim / 2;
    int i = interleaved ? d / 2 : d % half;
    bool second = interleaved ? (d & 1) : d >= half;
    float a = row[interleaved ? 2 * i : i], b = row[interleaved ? 2 * i + 1 : i + half];
    return second ? a * s + b * c : a * c - b * s;
}

__device__ __forceinline__ float r4d_rotated(const float* row, int d, int head_dim, int position, const float* inv_freq,
                                             int interleaved) {
    float c, s;
    r4d_rope_cs(d, head_dim, position, inv_freq, interleaved, c, s);
    return r4d_rotate_cs(row, d, head_dim, interleaved, c, s);
}

// `heads` rows of head_dim values rotated in place, row h by positions[h / per_position]: a thread
// per (row, pair) reads both values of its pair before writing them, so no barrier is needed.
__device__ void rotate_pairs(float* rows, int heads, int D, const int* positions, int per_position, const Attend& p) {
    int half = D / 2;
    for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
        int head = i / half, pair = i % half;
        float* row = rows + (long long)head * D;
        int ia = p.interleaved ? 2 * pair : pair, ib = p.interleaved ? 2 * pair + 1 : pair + half;
        float c, s;
        r4d_rope_cs(ia, D, positions[head / per_position], p.inv_freq, p.interleaved, c, s);
        float a = row[ia], b = row[ib];
        row[ia] = a * c - b * s;
        row[ib] = a * s + b * c;
    }
}

template <int DPL, int G, bool FRESH>
__device__ void attend(const Attend& p) {
    __shared__ float s_max[ATT_WARPS][G], s_sum[ATT_WARPS][G];
    __shared__ float s_acc[ATT_WARPS][G][DPL * R4D_WARP];
    __shared__ int s_last;
    __shared__ float s_split_max[ATT_MAX_SPLITS * G], s_split_sum[ATT_MAX_SPLITS * G], s_total[G];
    int m = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const bool decode = FRESH && (int)gridDim.x == p.seqs;  // one token a sequence: no token reads another's k
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    const int D = p.head_dim, width = p.kv_heads * D;
    int s = 0;
    while (s + 1 < p.seqs && p.cu_seqlens[s + 1] <= m) ++s;  // the sequence token m belongs to
    int length = p.context_lens[s], position = p.positions[m];
    int visible = min(position, length - 1) + 1;
    int oldest = p.window > 0 ? max(0, position - p.window + 1) : 0;  // the first key a window lets in
    int step_first = p.cu_seqlens[s], fresh = length - (p.cu_seqlens[s + 1] - step_first);  // this step's positions
    int chunk = (max(visible - oldest, 0) + splits - 1) / splits;
    int j0 = oldest + split * chunk, j1 = min(visible, j0 + chunk);
    // U keys a warp at a time: their loads issued together, one online-softmax update for the U
    constexpr int U = DPL * G >= 32 ? 2 : 4;
    float qv[G][DPL], acc[G][DPL], run_max[G], run_sum[G], qc[DPL], qs[DPL];
#pragma unroll
    for (int t = 0; t < DPL; ++t) {  // this lane's cos and sin at the token's position: its G heads share them
        int d = lane + t * R4D_WARP;
        qc[t] = qs[t] = 0.0f;
        if (FRESH && d < D) r4d_rope_cs(d, D, position, p.inv_freq, p.interleaved, qc[t], qs[t]);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float* qrow = p.q + ((long long)m * p.q_heads + kvh * G + g) * D;
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            int d = lane + t * R4D_WARP;
            qv[g][t] = d >= D ? 0.0f : FRESH ? r4d_rotate_cs(qrow, d, D, p.interleaved, qc[t], qs[t]) : qrow[d];
            acc[g][t] = 0.0f;
        }
        run_max[g] = __uint_as_float(0xff800000u);  // -inf
        run_sum[g] = 0.0f;
    }
    const int* table = p.block_tables + (long long)s * p.max_blocks;
    for (int first = j0 + warp; first < j1; first += ATT_WARPS * U) {
        float kv[U][DPL], vv[U][DPL];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int j = first + u * ATT_WARPS;
#pragma unroll
            for (int t = 0; t < DPL; ++t) kv[u][t] = vv[u][t] = 0.0f;
            if (j >= j1) continue;
            if (FRESH && j >= fresh) {  // this step's key: from the k, v rows, rotated here
                int row = step_first + (j - fresh), where = p.positions[row];
                const float* krow = p.k + (long long)row * width + (long long)kvh * D;
                const float* vrow = p.v + (long long)row * width + (long long)kvh * D;
#pragma unroll
                for (int t = 0; t < DPL; ++t) {
                    int d = lane + t * R4D_WARP;
                    if (d >= D) continue;
                    kv[u][t] = where == position ? r4d_rotate_cs(krow, d, D, p.interleaved, qc[t], qs[t])
                                                 : r4d_rotated(krow, d, D, where, p.inv_freq, p.interleaved);
                    vv[u][t] = vrow[d];
                }
            } else {
                long long slot = (long long)table[j / p.block_size] * p.block_size + j % p.block_size;
                const float* krow = p.k_cache + slot * width + (long long)kvh * D;
                const float* vrow = p.v_cache + slot * width + (long long)kvh * D;
#pragma unroll
                for (int t = 0; t < DPL; ++t) {
                    int d = lane + t * R4D_WARP;
                    if (d < D) { kv[u][t] = krow[d]; vv[u][t] = vrow[d]; }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float score[U], next = run_max[g];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dot = 0.0f;
#pragma unroll
                for (int t = 0; t < DPL; ++t) dot += qv[g][t] * kv[u][t];
                score[u] = first + u * ATT_WARPS < j1 ? r4d_warp_sum(dot) * p.scale : __uint_as_float(0xff800000u);
                next = fmaxf(next, score[u]);
            }
            float keep = expf(run_max[g] - next);
            run_sum[g] *= keep;
#pragma unroll
            for (int t = 0; t < DPL; ++t) acc[g][t] *= keep;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float weight = expf(score[u] - next);  // 0 for a key past the split
                run_sum[g] += weight;
#pragma unroll
                for (int t = 0; t < DPL; ++t) acc[g][t] += weight * vv[u][t];
            }
            run_max[g] = next;
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
        if (lane == 0) { s_max[warp][g] = run_max[g]; s_sum[warp][g] = run_sum[g]; }
#pragma unroll
        for (int t = 0; t < DPL; ++t) s_acc[warp][g][lane + t * R4D_WARP] = acc[g][t];
    }
    __syncthreads();
    // this split's (max, sum, weighted values) of each head: the warps merged
    long long group = (long long)m * p.kv_heads + kvh;
    float* mine = p.partial + (group * splits + split) * G * (D + 2);
    for (int g = 0; g < G; ++g) {
        float top = s_max[0][g];
        for (int w = 1; w < ATT_WARPS; ++w) top = fmaxf(top, s_max[w][g]);
        float* entry = mine + g * (D + 2);
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float mixed = 0.0f;
            for (int w = 0; w < ATT_WARPS; ++w)
                if (s_sum[w][g] > 0.0f) mixed += s_acc[w][g][d] * expf(s_max[w][g] - top);
            entry[2 + d] = mixed;
        }
        if (threadIdx.x == 0) {
            float total = 0.0f;
            for (int w = 0; w < ATT_WARPS; ++w) total += s_sum[w][g] > 0.0f ? s_sum[w][g] * expf(s_max[w][g] - top) : 0.0f;
            entry[0] = top;
            entry[1] = total;
        }
    }
    if (FRESH && !decode && split == 0) {  // this token's own k (rotated) and v at its slot; nothing here reads them back
        long long slot = p.slots[m];
        const float* krow = p.k + (long long)m * width + (long long)kvh * D;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            p.k_cache[slot * width + (long long)kvh * D + d] = r4d_rotated(krow, d, D, position, p.inv_freq, p.interleaved);
            p.v_cache[slot * width + (long long)kvh * D + d] = p.v[(long long)m * width + (long long)kvh * D + d];
        }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(p.counters + group, 1u) == (u32)splits - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // the (token, kv head)'s last block: the splits merged in order, their maxima and sums staged
    // first so that the value loads below stay independent
    const float* all = p.partial + group * splits * G * (D + 2);
    for (int i = threadIdx.x; i < splits * G; i += blockDim.x) {
        s_split_max[i] = r4d_load_l2(all + i * (D + 2));
        s_split_sum[i] = r4d_load_l2(all + i * (D + 2) + 1);
    }
    __syncthreads();
    // a head's splits merged by one warp, a lane a split (ATT_MAX_SPLITS <= a warp): a handful of
    // instructions where one thread's loop over the splits took a thousand
    for (int g = warp; g < G; g += ATT_WARPS) {
        float sum = lane < splits ? s_split_sum[lane * G + g] : 0.0f;
        float top = r4d_warp_max(sum > 0.0f ? s_split_max[lane * G + g] : __uint_as_float(0xff800000u));
        float weight = sum > 0.0f ? expf(s_split_max[lane * G + g] - top) : 0.0f;
        float total = r4d_warp_sum(sum * weight);
        if (lane < splits) s_split_max[lane * G + g] = weight;  // from here on: the split's weight
        if (lane == 0) s_total[g] = total;
    }
    __syncthreads();
    // every element's result first, then every store: a store to out between them would keep the
    // compiler from issuing the next element's loads early (out and partial might alias, for all it knows)
    constexpr int PER = (G * DPL * R4D_WARP + ATT_WARPS * R4D_WARP - 1) / (ATT_WARPS * R4D_WARP);
    float result[PER];
#pragma unroll
    for (int r = 0; r < PER; ++r) {
        int i = threadIdx.x + r * ATT_WARPS * R4D_WARP, g = i / D, d = i % D;
        result[r] = 0.0f;
        if (i >= G * D) continue;
        float value[ATT_MAX_SPLITS];  // every split's value issued at once, then added in split order
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; ++q)
            value[q] = q < splits && s_split_max[q * G + g] > 0.0f ? r4d_load_l2(all + (q * G + g) * (D + 2) + 2 + d) : 0.0f;
        float mixed = 0.0f;
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; ++q)
            if (q < splits && s_split_max[q * G + g] > 0.0f) mixed += value[q] * s_split_max[q * G + g];
        result[r] = mixed / s_total[g];
    }
#pragma unroll
    for (int r = 0; r < PER; ++r) {
        int i = threadIdx.x + r * ATT_WARPS * R4D_WARP;
        if (i < G * D) p.out[((long long)m * p.q_heads + kvh * G + i / D) * D + i % D] = result[r];
    }
    if (!FRESH) {
        if (threadIdx.x == 0) p.counters[group] = 0u;  // ready for the next launch (a graph replays it)
        return;
    }
    // q rotated in place from the registers that hold it: only this (token, kv head)'s blocks read
    // these heads, and they are done
    if (warp == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int t = 0; t < DPL; ++t)
                if (lane + t * R4D_WARP < D) p.q[((long long)m * p.q_heads + kvh * G + g) * D + lane + t * R4D_WARP] = qv[g][t];
    }
    if (decode) {
        // this token's k rotated by the cos and sin each lane holds for its elements, every value read
        // before any is written back; then k in place and at the token's slot, with its v
        const long long row = (long long)m * width + (long long)kvh * D, slot = (long long)p.slots[m] * width + (long long)kvh * D;
        float rotated[DPL], value[DPL];
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            int d = lane + t * R4D_WARP;
            bool mine = warp == 0 && d < D;
            rotated[t] = mine ? r4d_rotate_cs(p.k + row, d, D, p.interleaved, qc[t], qs[t]) : 0.0f;
            value[t] = mine ? p.v[row + d] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
            int d = lane + t * R4D_WARP;
            if (warp != 0 || d >= D) continue;
            p.k[row + d] = rotated[t];
            p.k_cache[slot + d] = rotated[t];
            p.v_cache[slot + d] = value[t];
        }
        if (threadIdx.x == 0) p.counters[group] = 0u;
        return;
    }
    // k rotated in place by the grid's last group: later tokens of a sequence read earlier ones' k
    if (threadIdx.x == 0) {
        p.counters[group] = 0u;
        s_last = atomicAdd(p.counters + gridDim.x * p.kv_heads, 1u) == gridDim.x * p.kv_heads - 1;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    rotate_pairs(p.k, gridDim.x * p.kv_heads, D, p.positions, p.kv_heads, p);
    if (threadIdx.x == 0) p.counters[gridDim.x * p.kv_heads] = 0u;
}

// One module per (R4D_ATT_DPL, R4D_ATT_G): head_dim <= 32 * DPL values a lane, G query heads per kv head.
#ifndef R4D_ATT_DPL
#define R4D_ATT_DPL 4
#endif
#ifndef R4D_ATT_G
#define R4D_ATT_G 1
#endif
#define ATTEND_ENTRY(FRESH, WHICH)                                                                                \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * R4D_WARP) r4d_attend_##WHICH(                        \
        float* q, float* k, const float* v, float* k_cache, float* v_cache, const int* slots, const int* positions, \
        const int* cu_seqlens, const int* context_lens, const int* block_tables, float* out, const float* inv_freq, \
        float* partial, u32* counters, int seqs, int max_blocks, int q_heads, int kv_heads, int head_dim,         \
        int block_size, int interleaved, float scale) { R4D_CHAIN_PROLOGUE();                                     \
        Attend p = {q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out,      \
                    inv_freq, partial, counters, seqs, max_blocks, q_heads, kv_heads, head_dim, block_size,       \
                    interleaved, scale};                                                                         \
        attend<R4D_ATT_DPL, R4D_ATT_G, FRESH>(p);                                                                \
    }

ATTEND_ENTRY(false, cache)
ATTEND_ENTRY(true, fresh)
