// libr4d device rows: decode attention for batches (one query token a sequence, M == seqs) over the
// paged f32 KV cache, split over the context (flash-decoding), NVIDIA only. device_batch_rows.py's
// attention row runs it for a decode step, device_rows.py's attention and fused rope_attention rows
// for one of 2 to 8 sequences; its geometry and its scratch (a tail of the row's that no other
// kernel reaches, its counters zero between launches) are device_attention_decode.py's.
//
// Grid (seqs, kv heads, splits), AD_THREADS threads a block. A block takes one sequence's G query
// heads that share one kv head (each key and value row is read once for the G of them) over one
// chunk of the sequence's context. Sequence s takes min(gridDim.z, ceil(keys / chunk)) splits of
// equal length (chunk: the launch's argument, in keys), so a long context spreads over many blocks
// and a short one over few; the blocks past a sequence's splits return at once.
//
// Inside a block, each half-warp (AD_LANES lanes: a "stream") runs its own online softmax over
// R4D_AD_KEYS consecutive keys at a time, the streams taking turns along the chunk: lane l of a
// stream holds float4 chunks l, l + 16, ... of a head's row (D / 16 values), so the 16 lanes read a
// key's row in 16-byte loads, 256 contiguous bytes a load; the G dot products are finished by four
// xor shuffles each. No barrier in the loop: a stream's next keys are its own; the key slots (the
// block table's entries) of a stream's next keys are loaded while its current keys' rows are in
// flight. q * scale * log2(e) waits in registers (the scores in log2 units, exp2); every sum is f32.
// At the end the block's streams are merged in stream order through shared memory; with one split
// that is the output, else the block's (max, sum, weighted values) of each head go to the scratch
// and the (sequence, kv head)'s last block (a counter) merges the splits in split order: the same
// bits whichever block comes last.
//
// This step's key and value (position context - 1: in a decode step each sequence's one token is its
// last position, as the scheduler lays it out) are read from the k, v rows, and the block whose
// chunk holds that position stores them at the token's slot: no store kernel runs before this one,
// and nothing here reads that slot of the cache.
//
// Two entries: r4d_attend_decode (the attention row: q and k already rotated by the rope row) and
// r4d_attend_decode_rope (the fused rope_attention row): each block rotates q at the token's position
// in shared memory (rope's arithmetic: cos and sin in f64 rounded once, products and sums rounded
// apart), the block holding this step's key rotates it, stores it at its slot and writes it back
// into the k row, and q is written back rotated by the block that writes the output (with several
// splits the last, after every split has read q): q, k and the cache are left as rope and the
// attention row leave them.
#define AD_WARPS 4
#define AD_THREADS (AD_WARPS * 32)       // device_attention_decode.THREADS
#define AD_LANES 16                      // lanes of a stream (a key's row across them)
#define AD_STREAMS (AD_THREADS / AD_LANES)
#define AD_MAX_SPLITS 32                 // device_attention_decode.MAX_SPLITS: the merge weighs a split a lane
#ifndef R4D_AD_D
#define R4D_AD_D 128
#endif
#ifndef R4D_AD_G
#define R4D_AD_G 4
#endif
#ifndef R4D_AD_KEYS
#define R4D_AD_KEYS 4                    // keys a stream loads at once (device_attention_decode.KEYS)
#endif
#ifndef R4D_AD_AHEAD
#define R4D_AD_AHEAD 0                   // 1: a stream asks its next keys' rows into the L2 as it loads these (device_attention_decode.AHEAD)
#endif

struct AttDecode {
    float* q;                  // [seqs, q_heads * D] (rotated in place: r4d_attend_decode_rope)
    float* k;                  // [seqs, kv_heads * D]: this step's rows (the same)
    const float* v;
    float* k_cache;            // [slots, kv_heads * D]
    float* v_cache;
    const int* slots;          // [seqs]
    const int* positions;      // [seqs]
    const int* context_lens;   // [seqs]
    const int* block_tables;   // [seqs, max_blocks]
    float* out;                // [seqs, q_heads * D]
    float* partial;            // [seqs, kv_heads, gridDim.z] entries of STRIDE floats: G rows of D values, then G (max, sum)
    u32* counters;             // [seqs * kv_heads], zero between launches
    int max_blocks, q_heads, kv_heads, head_dim, block_size, chunk;  // head_dim: the module's R4D_AD_D
    float scale;
    const float* inv_freq;     // rope's [D / 2] (r4d_attend_decode_rope)
    int interleaved;           // rope's pairs: (2i, 2i + 1), else (i, i + D / 2)
};

__device__ __forceinline__ float ad_exp2(float x) {  // 2^x (ex2.approx: about 2 ulp; -inf gives +0)
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);
#endif
}

__device__ __forceinline__ float ad_dot4(float4 a, float4 b, float sum) {
    sum = __fmaf_rn(a.x, b.x, sum);
    sum = __fmaf_rn(a.y, b.y, sum);
    sum = __fmaf_rn(a.z, b.z, sum);
    return __fmaf_rn(a.w, b.w, sum);
}

__device__ __forceinline__ float4 ad_axpy4(float w, float4 v, float4 acc) {
    return make_float4(__fmaf_rn(w, v.x, acc.x), __fmaf_rn(w, v.y, acc.y), __fmaf_rn(w, v.z, acc.z), __fmaf_rn(w, v.w, acc.w));
}

__device__ __forceinline__ float4 ad_scale4(float4 v, float s) { return make_float4(v.x * s, v.y * s, v.z * s, v.w * s); }

// 16 bytes of the cache, read once: not kept in L1
__device__ __forceinline__ float4 ad_stream4(const float* p) {
#if defined(__CUDA_ARCH__)
    float4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
    return r;
#else
    return *(const float4*)p;
#endif
}

template <int D, int G, int U, bool ROPE>
__device__ void attend_decode(const AttDecode& p) {
    constexpr int C = D / 4;             // float4 chunks of a head's row
    constexpr int CH = C / AD_LANES;     // a lane's chunks of a row
    constexpr int STRIDE = (G * (D + 2) + 3) / 4 * 4;
    static_assert(C % AD_LANES == 0 && G * C <= 256, "attention_decode.cu: shapes (D % 64 == 0, G * D <= 1024)");
    __shared__ float4 s_acc[AD_STREAMS][G * C];   // each stream's weighted values, then the split merge's values
    __shared__ float s_max[AD_STREAMS][G], s_sum[AD_STREAMS][G];
    __shared__ float s_weight[AD_MAX_SPLITS][G], s_term[AD_MAX_SPLITS][G];
    __shared__ int s_last;
    __shared__ float4 s_q[ROPE ? G * C : 1], s_k[ROPE ? C : 1];  // q's G heads and this step's key, rotated
    __shared__ float s_cos[ROPE ? D / 2 : 1], s_sin[ROPE ? D / 2 : 1];  // rope's at the token's position
    const int s = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, stream = tid / AD_LANES, sub = tid % AD_LANES, half = stream % 2;
    const int width = p.kv_heads * D;
    // the sequence's keys and this block's share of them (blocks past its splits: nothing to do)
    const int length = p.context_lens[s], position = p.positions[s];
    const int visible = min(position, length - 1) + 1;
    int splits = min((int)gridDim.z, max(1, (visible + p.chunk - 1) / p.chunk));
    const int per = (visible + splits - 1) / splits;
    splits = (visible + per - 1) / per;
    if (split >= splits) return;
    const int j0 = split * per, j1 = min(visible, j0 + per);
    const int fresh = length - 1;  // this step's key: from the k, v rows
    // the block that stores this step's key and value: its chunk holds them (else, where the token
    // sees no key of its own, the last split)
    const bool holder = (j0 <= fresh && fresh < j1) || (fresh >= visible && split == splits - 1);
    const int* table = p.block_tables + (long long)s * p.max_blocks;
    const long long head = (long long)kvh * D;
    const float minus_inf = __uint_as_float(0xff800000u);

    // the row offsets of the stream's keys first..first + U - 1 (-1: past the chunk; -2: this step's)
    auto offsets = [&](int first, long long (&at)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int j = first + u;
            at[u] = j >= j1 ? -1 : j >= fresh ? -2
                  : ((long long)table[j / p.block_size] * p.block_size + j % p.block_size) * width + head;
        }
    };
    long long at[U];
    int first = j0 + stream * U;
    offsets(first, at);  // the table and the older keys' rows are not the kernel before's to write
    if (ROPE)  // nor rope's frequencies and the positions
        for (int i = tid; i < D / 2; i += AD_THREADS) r4d_cos_sin((float)position * p.inv_freq[i], s_cos[i], s_sin[i]);
    R4D_CHAIN_PROLOGUE();

    float* const qrow = p.q + ((long long)s * p.q_heads + kvh * G) * D;  // the G heads' rows, contiguous
    float* const krow = p.k + (long long)s * width + head;                // this step's rows
    const float* const vrow = p.v + (long long)s * width + head;
    if (ROPE) {  // q (and the holder's key) rotated in shared memory, a thread a pair
        for (int i = tid; i < G * C; i += AD_THREADS) s_q[i] = ((const float4*)qrow)[i];
        if (holder)
            for (int i = tid; i < C; i += AD_THREADS) s_k[i] = ((const float4*)krow)[i];
        __syncthreads();
        for (int i = tid; i < (G + 1) * (D / 2); i += AD_THREADS) {
            const int r = i / (D / 2), pair = i % (D / 2);
            if (r == G && !holder) break;
            float* row = r < G ? (float*)s_q + r * D : (float*)s_k;
            const int ia = p.interleaved ? 2 * pair : pair, ib = p.interleaved ? 2 * pair + 1 : pair + D / 2;
            const float c = s_cos[pair], sn = s_sin[pair], a = row[ia], b = row[ib];
            row[ia] = a * c - b * sn;
            row[ib] = a * sn + b * c;
        }
        __syncthreads();
    }
    const float4* const qsource = ROPE ? s_q : (const float4*)qrow;
    const float4* const ksource = ROPE ? s_k : (const float4*)krow;
    float4 qr[G][CH];
    {
        const float fold = p.scale * 1.4426950408889634f;
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int i = 0; i < CH; ++i) qr[g][i] = ad_scale4(qsource[g * C + sub + i * AD_LANES], fold);
    }
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 acc[G][CH];
    float run_max[G], run_sum[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        run_max[g] = minus_inf;
        run_sum[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < CH; ++i) acc[g][i] = zero;
    }
    // the loop runs while the warp's first stream has keys (both halves of a warp take the same turns:
    // the shuffles are the whole warp's); the second's keys past the chunk are masked
    for (; first - half * U < j1; first += AD_STREAMS * U) {
        float4 kr[U][CH], vr[U][CH];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int i = 0; i < CH; ++i) {
                int c = 4 * (sub + i * AD_LANES);
                kr[u][i] = vr[u][i] = zero;
                if (at[u] >= 0) {
                    kr[u][i] = ad_stream4(p.k_cache + at[u] + c);
                    vr[u][i] = ad_stream4(p.v_cache + at[u] + c);
                } else if (at[u] == -2) {
                    kr[u][i] = ksource[c / 4];
                    vr[u][i] = *(const float4*)(vrow + c);
                }
            }
        bool live[U];
#pragma unroll
        for (int u = 0; u < U; ++u) live[u] = at[u] != -1;
        offsets(first + AD_STREAMS * U, at);  // the next keys' slots, under this tile's loads
        if (R4D_AD_AHEAD) {  // and their rows into the L2: a 128-byte line a lane, K's then V's
            constexpr int LINES = D * 4 / 128;
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (at[u] >= 0 && sub < 2 * LINES)
                    r4d_prefetch_l2((sub < LINES ? p.k_cache : p.v_cache) + at[u] + 32 * (sub % LINES));
        }
        float score[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < CH; ++i) dot = ad_dot4(qr[g][i], kr[u][i], dot);
#pragma unroll
                for (int o = AD_LANES / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                score[u][g] = live[u] ? dot : minus_inf;
            }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float top = run_max[g];
#pragma unroll
            for (int u = 0; u < U; ++u) top = fmaxf(top, score[u][g]);
            const float base = top == minus_inf ? 0.0f : top;  // no key yet: every weight 0
            const float keep = ad_exp2(run_max[g] - base);
            float sum = run_sum[g] * keep;
#pragma unroll
            for (int i = 0; i < CH; ++i) acc[g][i] = ad_scale4(acc[g][i], keep);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float w = ad_exp2(score[u][g] - base);
                sum += w;
#pragma unroll
                for (int i = 0; i < CH; ++i) acc[g][i] = ad_axpy4(w, vr[u][i], acc[g][i]);
            }
            run_sum[g] = sum;
            run_max[g] = top;
        }
    }
    // this step's k and v at the token's slot, by the holder (nothing in this launch reads them
    // there), and the rotated k back into its row (no other block reads the row)
    if (holder && tid < 2 * C) {
        const long long slot = (long long)p.slots[s] * width + head;
        const int c = tid % C;
        if (tid < C) {
            const float4 key = ksource[c];
            ((float4*)(p.k_cache + slot))[c] = key;
            if (ROPE) ((float4*)krow)[c] = key;
        } else {
            ((float4*)(p.v_cache + slot))[c] = ((const float4*)vrow)[c];
        }
    }
    // the streams merged in stream order
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int i = 0; i < CH; ++i) s_acc[stream][g * C + sub + i * AD_LANES] = acc[g][i];
        if (sub == 0) { s_max[stream][g] = run_max[g]; s_sum[stream][g] = run_sum[g]; }
    }
    __syncthreads();
    const long long pair = (long long)s * p.kv_heads + kvh;
    float* const out = p.out + ((long long)s * p.q_heads + kvh * G) * D;  // the G heads' rows, contiguous
    float* const mine = p.partial + (pair * gridDim.z + split) * STRIDE;
    for (int i = tid; i < G * C; i += AD_THREADS) {
        const int g = i / C;
        float top = minus_inf;
#pragma unroll
        for (int t = 0; t < AD_STREAMS; ++t)
            if (s_sum[t][g] > 0.0f) top = fmaxf(top, s_max[t][g]);
        float4 mixed = zero;
        float total = 0.0f;
#pragma unroll
        for (int t = 0; t < AD_STREAMS; ++t) {
            if (!(s_sum[t][g] > 0.0f)) continue;
            const float w = ad_exp2(s_max[t][g] - top);
            total = __fmaf_rn(s_sum[t][g], w, total);
            mixed = ad_axpy4(w, s_acc[t][i], mixed);
        }
        if (splits == 1) {
            const float inverse = 1.0f / total;
            ((float4*)out)[i] = ad_scale4(mixed, inverse);
            if (ROPE) ((float4*)qrow)[i] = s_q[i];  // every thread of the block read q before the barrier above
        } else {
            ((float4*)mine)[i] = mixed;
            if (i % C == 0) { mine[G * D + 2 * g] = top; mine[G * D + 2 * g + 1] = total; }
        }
    }
    if (splits == 1) return;
    __syncthreads();  // every thread's partial written before the one arrival releases them
    if (tid == 0) s_last = r4d_arrive(p.counters + pair) == (u32)splits - 1;
    __syncthreads();
    if (!s_last) return;
    // the last block: each head's splits weighed by one warp (a lane a split), then the values added
    // in split order
    const float* all = p.partial + pair * gridDim.z * STRIDE;
    for (int g = tid / 32; g < G; g += AD_WARPS) {
        const int lane = tid % 32;
        float top = lane < splits ? r4d_load_l2(all + lane * STRIDE + G * D + 2 * g) : minus_inf;
        float sum = lane < splits ? r4d_load_l2(all + lane * STRIDE + G * D + 2 * g + 1) : 0.0f;
        float most = r4d_warp_max(sum > 0.0f ? top : minus_inf);
        float w = sum > 0.0f ? ad_exp2(top - most) : 0.0f;
        if (lane < splits) s_weight[lane][g] = w;
        if (lane < splits) s_term[lane][g] = sum * w;
    }
    __syncthreads();
    for (int i = tid; i < G * C; i += AD_THREADS) {
        const int g = i / C;
        float total = 0.0f;
        for (int z = 0; z < splits; ++z) total += s_term[z][g];  // in split order
        float4 mixed = zero;
        for (int z0 = 0; z0 < splits; z0 += 8) {
            float4 value[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) value[u] = z0 + u < splits ? __ldcg((const float4*)(all + (z0 + u) * STRIDE) + i) : zero;
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (z0 + u < splits) mixed = ad_axpy4(s_weight[z0 + u][g], value[u], mixed);
        }
        ((float4*)out)[i] = ad_scale4(mixed, 1.0f / total);
        if (ROPE) ((float4*)qrow)[i] = s_q[i];  // every split has read q: it has arrived
    }
    if (tid == 0) p.counters[pair] = 0u;  // ready for the next launch (a graph replays it)
}

extern "C" __global__ void __launch_bounds__(AD_THREADS) r4d_attend_decode(
    float* q, float* k, const float* v, float* k_cache, float* v_cache, const int* slots,
    const int* positions, const int* context_lens, const int* block_tables, float* out, float* partial, u32* counters,
    int max_blocks, int q_heads, int kv_heads, int head_dim, int block_size, int chunk, float scale) {  // waits on the chain inside
    AttDecode p = {q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out, partial, counters,
                   max_blocks, q_heads, kv_heads, head_dim, block_size, chunk, scale, nullptr, 0};
    attend_decode<R4D_AD_D, R4D_AD_G, R4D_AD_KEYS, false>(p);
}

extern "C" __global__ void __launch_bounds__(AD_THREADS) r4d_attend_decode_rope(
    float* q, float* k, const float* v, float* k_cache, float* v_cache, const int* slots,
    const int* positions, const int* context_lens, const int* block_tables, float* out, float* partial, u32* counters,
    int max_blocks, int q_heads, int kv_heads, int head_dim, int block_size, int chunk, float scale,
    const float* inv_freq, int interleaved) {  // waits on the chain inside
    AttDecode p = {q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out, partial, counters,
                   max_blocks, q_heads, kv_heads, head_dim, block_size, chunk, scale, inv_freq, interleaved};
    attend_decode<R4D_AD_D, R4D_AD_G, R4D_AD_KEYS, true>(p);
}
