// libr4d device rows: sliding_attention (docs/OPS.md), attention.cu's kernel over a window of the
// context: token p sees the keys of positions p - window < j <= p. device_kernels.py puts common.cu,
// then attention.cu (its store kernel and attend()), then this entry; the splits share out the
// window's keys, not the whole context's.
extern "C" __global__ void __launch_bounds__(ATT_THREADS) r4d_attend_window(
    float* q, float* k, const float* v, float* k_cache, float* v_cache, const int* slots, const int* positions,
    const int* cu_seqlens, const int* context_lens, const int* block_tables, float* out, const float* inv_freq,
    float* partial, u32* counters, int seqs, int max_blocks, int q_heads, int kv_heads, int head_dim, int block_size,
    int interleaved, float scale, int window) {  // attend() waits on the chain
    Attend p = {q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out, inv_freq,
                partial, counters, seqs, max_blocks, q_heads, kv_heads, head_dim, block_size, interleaved, scale, window};
    attend<R4D_ATT_D, R4D_ATT_G, false>(p);
}
