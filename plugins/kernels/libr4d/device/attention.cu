// libr4d device rows: attention over a paged KV cache, prefill and decode tokens of several
// sequences in one launch. Two kernels in order on the queue: the k, v rows of the step stored at
// their slots, then one block per (token, query head): each warp walks every ATT_WARPS-th visible
// key with an online softmax (running max, sum, weighted values), the warps merged at the end.
// Everything is sized from the tensors' shapes and read from device arrays (cu_seqlens,
// context_lens, block_tables, positions, slots), so a captured launch replays with new contents.
#define ATT_WARPS 8
#define ATT_MAX_DPL 8  // head_dim <= ATT_MAX_DPL * R4D_WARP

// k_cache[slots[m]] = k[m], v_cache[slots[m]] = v[m]; grid (ceil(width / blockDim.x), M)
extern "C" __global__ void r4d_kv_store_dev(const float* k, const float* v, float* k_cache, float* v_cache,
                                            const int* slots, int width) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    long long slot = slots[m];
    k_cache[slot * width + c] = k[(long long)m * width + c];
    v_cache[slot * width + c] = v[(long long)m * width + c];
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * R4D_WARP) r4d_attention_dev(
        const float* q, const float* k_cache, const float* v_cache, const int* positions, const int* cu_seqlens,
        const int* context_lens, const int* block_tables, float* out, int seqs, int max_blocks, int q_heads,
        int kv_heads, int head_dim, int block_size, float scale) { R4D_CHAIN_PROLOGUE();
    __shared__ float s_max[ATT_WARPS], s_sum[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAX_DPL * R4D_WARP];
    int m = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    int s = 0;
    while (s + 1 < seqs && cu_seqlens[s + 1] <= m) ++s;  // the sequence token m belongs to
    int length = context_lens[s], position = positions[m];
    int last = min(position, length - 1);
    int kvh = h / (q_heads / kv_heads), width = kv_heads * head_dim;
    const float* qrow = q + ((long long)m * q_heads + h) * head_dim;
    float qv[ATT_MAX_DPL], acc[ATT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; ++i) {
        int d = lane + i * R4D_WARP;
        qv[i] = d < head_dim ? qrow[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float run_max = __uint_as_float(0xff800000u), run_sum = 0.0f;  // -inf, 0
    const int* table = block_tables + (long long)s * max_blocks;
    for (int j = warp; j <= last; j += ATT_WARPS) {
        long long slot = (long long)table[j / block_size] * block_size + j % block_size;
        const float* krow = k_cache + slot * width + (long long)kvh * head_dim;
        const float* vrow = v_cache + slot * width + (long long)kvh * head_dim;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; ++i) {
            int d = lane + i * R4D_WARP;
            if (d < head_dim) dot += qv[i] * krow[d];
        }
        float score = r4d_warp_sum(dot) * scale;
        float next = fmaxf(run_max, score);
        float keep = expf(run_max - next), weight = expf(score - next);
        run_sum = run_sum * keep + weight;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; ++i) {
            int d = lane + i * R4D_WARP;
            if (d < head_dim) acc[i] = acc[i] * keep + weight * vrow[d];
        }
        run_max = next;
    }
    if (lane == 0) { s_max[warp] = run_max; s_sum[warp] = run_sum; }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; ++i) {
        int d = lane + i * R4D_WARP;
        if (d < head_dim) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float top = s_max[0];
    for (int w = 1; w < ATT_WARPS; ++w) top = fmaxf(top, s_max[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w) total += s_sum[w] > 0.0f ? s_sum[w] * expf(s_max[w] - top) : 0.0f;
    float* orow = out + ((long long)m * q_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float mixed = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w)
            if (s_sum[w] > 0.0f) mixed += s_acc[w][d] * expf(s_max[w] - top);
        orow[d] = mixed / total;
    }
}
