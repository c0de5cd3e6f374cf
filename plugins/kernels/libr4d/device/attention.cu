// libr4d device rows: attention over a paged KV cache, prefill and decode tokens of several
// sequences in one launch, split over the context (flash-decoding's idea):
// - the attention row: the step's k, v rows stored at their slots (r4d_kv_store_dev), then
//   r4d_attend_*_cache over the cache;
// - the fused rope_attention row: r4d_attend_*_fresh alone. It rotates q and the step's own keys
//   itself (rope's arithmetic) and reads the keys of this step's positions from the k, v rows
//   instead of the cache (a sequence's tokens in a step are its last positions, in order, as the
//   scheduler lays them out), stores them at their slots, and leaves q and k rotated, as rope would.
// Grid (M tokens, kv heads, S splits), ATT_THREADS threads a block on every vendor. A block takes
// the G query heads that share one kv head (each key and value row is read once for the G of them)
// over its split of the token's visible positions, ATT_TILE keys at a time:
// 1. scores: ATT_LANES lanes a key, each with a few 16-byte chunks of its row, the G dot products
//    finished by three shuffles; q (rotated) waits in shared memory;
// 2. softmax: a warp a head, a lane a key: the tile's maximum, the running maximum and sum, the
//    weights written back over the scores;
// 3. values: a lane a 16-byte chunk of head_dim and every SLICES-th key of the tile, G float4 sums.
// The next tile's k chunks are loaded as soon as this tile's scores are taken and its v chunks as
// soon as this tile's values are added, so a block keeps a tile in flight. The slices are added, and
// with one split the block writes out; otherwise its partial goes to the scratch and the (token, kv
// head)'s last block (a counter) merges the splits in order.
// The splits a token takes are worked out on the card from its context: at most the grid's
// (device_kernels.attention_splits: about two blocks a multiprocessor, or R4D_ATT_SPLITS), each at
// least a tile and a whole number of tiles, so a short context is a few full blocks and a cheap
// merge; the blocks past a token's splits return at once. Everything is sized from the tensors'
// shapes and read from device arrays, so a captured launch replays with new contents.
// Latency: at short contexts a launch's time is the chain of memory round trips a block waits on
// (the bytes are few), so a block works out its split, loads its first tile's keys of earlier
// positions, asks the next R4D_ATT_AHEAD tiles' into the L2 and works out rope's cos and sin before
// the chain's wait: the kernel before it writes none of them. A split merge costs one thread's
// acquire-release atomic, not a fence in every thread, and the merging block's values of the first
// splits land in shared memory while it weighs the splits.
// A decode step (every sequence one token, M == seqs: the grid knows it without a load): the block
// whose split holds the token's own key also stores its rotated k (from shared memory, also in
// place) and its v at the token's slot; no other block reads the k, v rows, and no grid-wide step
// comes after.
#define ATT_THREADS 256                     // device_kernels.ATT_THREADS
#define ATT_WARPS (ATT_THREADS / R4D_WARP)
#define ATT_LANES 8                         // lanes that share a key's dot products
#define ATT_TILE (ATT_THREADS / ATT_LANES)  // keys a tile: device_kernels.ATT_TILE
#define ATT_MAX_SPLITS 32                   // device_kernels.ATT_MAX_SPLITS; at most a warp (the split merge takes a lane each)
#define ATT_MERGE 8                         // splits whose values the merging block loads at a time
#define ATT_EARLY 16                        // splits whose values it copies into shared memory first,
#define ATT_EARLY_FLOAT4 2048               // where they fit in 32 KB (else as many as the pool holds)
#define ATT_MAX_FRESH 8                     // device_kernels.ATT_MAX_FRESH: this step's keys of a sequence the fused row rotates (its M <= 8)
#ifndef R4D_ATT_AHEAD
#define R4D_ATT_AHEAD 2                     // tiles past the one in registers a block asks into the L2 (device_kernels.ATT_AHEAD)
#endif

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
    float* partial;  // per (token, kv head, split): G rows of head_dim weighted values, then G (max, sum)
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

// A float4 another block of this launch wrote, read at L2 (r4d_load_l2's reasons)
__device__ __forceinline__ float4 r4d_load4_l2(const float* p) {
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
    return make_float4(r4d_load_l2(p), r4d_load_l2(p + 1), r4d_load_l2(p + 2), r4d_load_l2(p + 3));
#else
    return __ldcg((const float4*)p);
#endif
}

// sum + a . b, in the order x, y, z, w (rounded products, rounded sums: --fmad=false)
__device__ __forceinline__ float r4d_dot4(float4 a, float4 b, float sum) {
    sum += a.x * b.x;
    sum += a.y * b.y;
    sum += a.z * b.z;
    sum += a.w * b.w;
    return sum;
}

// acc * keep + w * v, element by element
__device__ __forceinline__ float4 r4d_axpy4(float w, float4 v, float4 acc) {
    return make_float4(acc.x + w * v.x, acc.y + w * v.y, acc.z + w * v.z, acc.w + w * v.w);
}

__device__ __forceinline__ float4 r4d_scale4(float4 v, float s) { return make_float4(v.x * s, v.y * s, v.z * s, v.w * s); }

// Where a block's keys are: its sequence's block table, the first of this step's positions (FRESH
// reads those from the k, v rows, row step_first + j - fresh) and the kv head's offset in a row.
struct Keys {
    const int* table;
    int fresh, step_first, width, head;
};

template <bool FRESH>
__device__ __forceinline__ const float* r4d_key_row(const Attend& p, const Keys& keys, const float* cache,
                                                    const float* rows, int j) {
    if (FRESH && j >= keys.fresh) return rows + (long long)(keys.step_first + j - keys.fresh) * keys.width + keys.head;
    long long slot = (long long)keys.table[j / p.block_size] * p.block_size + j % p.block_size;
    return cache + slot * keys.width + keys.head;
}

// 16 bytes another block wrote (read at L2) into shared memory: on NVIDIA sm_80 and later by
// cp.async, no register waiting on it, landed by r4d_copies_wait(); elsewhere a plain copy.
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define R4D_ATT_ASYNC 1
#else
#define R4D_ATT_ASYNC 0
#endif
__device__ __forceinline__ void r4d_copy16(float4* shared, const float* global) {
#if R4D_ATT_ASYNC
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(shared)), "l"(global)
                 : "memory");
#else
    *shared = r4d_load4_l2(global);
#endif
}

// this thread's r4d_copy16 landed (a barrier after it shows them to the block)
__device__ __forceinline__ void r4d_copies_wait() {
#if R4D_ATT_ASYNC
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Every thread's own fence, before the barrier ahead of r4d_arrive and after the one behind it,
// where the one thread's atomic does not carry the block's writes and reads (AMD, the host): there a
// thread's fence covers its own accesses alone. Nothing on NVIDIA.
__device__ __forceinline__ void r4d_fence_each() {
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 700
    __threadfence();
#endif
}

// Keys from..to-1 of the tile that starts at `first` into a lane's registers (registers of other keys
// keep what they hold): a score lane's chunks of key first + kk (FRESH: not this step's keys, which the
// tile reads rotated from shared memory), and a value lane's chunk vc of keys first + slice + i * SLICES.
template <int D, bool FRESH, int CL>
__device__ __forceinline__ void load_keys(const Attend& p, const Keys& keys, int first, int from, int to, int kk, int sub,
                                          float4 (&kr)[CL]) {
    const int j = first + kk;
    if (j >= from && j < to && !(FRESH && j >= keys.fresh)) {
        const float4* row = (const float4*)r4d_key_row<FRESH>(p, keys, p.k_cache, p.k, j);
#pragma unroll
        for (int i = 0; i < CL; ++i)
            if (sub + i * ATT_LANES < D / 4) kr[i] = row[sub + i * ATT_LANES];
    }
}

template <int D, bool FRESH, int KPT, int SLICES>
__device__ __forceinline__ void load_values(const Attend& p, const Keys& keys, int first, int from, int to, int slice,
                                            int vc, float4 (&vr)[KPT]) {
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
        const int t = slice + i * SLICES, key = first + t;
        if (slice < SLICES && t < ATT_TILE && key >= from && key < to)
            vr[i] = ((const float4*)r4d_key_row<FRESH>(p, keys, p.v_cache, p.v, key))[vc];
    }
}

// The cache rows of key first + kk (below `to`) asked into the L2, a 128-byte line a lane of the
// key's ATT_LANES: a later tile's loads then wait on the L2, not on HBM.
template <int D, bool FRESH>
__device__ __forceinline__ void prefetch_rows(const Attend& p, const Keys& keys, int first, int to, int kk, int sub) {
    constexpr int LINES = (D * 4 + 127) / 128;  // a row's lines
    const int j = first + kk;
    if (j >= to) return;
    const float* k = r4d_key_row<false>(p, keys, p.k_cache, p.k, j);
    const float* v = k - p.k_cache + p.v_cache;  // the same slot of the v cache
    for (int line = sub; line < 2 * LINES; line += ATT_LANES)
        r4d_prefetch_l2((line < LINES ? k : v) + (line % LINES) * 32);
}

template <int D, int G, bool FRESH>
__device__ void attend(const Attend& p) {
    constexpr int C = D / 4;                               // 16-byte chunks of a head's row
    constexpr int CL = (C + ATT_LANES - 1) / ATT_LANES;    // a score lane's chunks of its key
    constexpr int SLICES = ATT_THREADS / C;                // value lanes over a tile's keys (a chunk each)
    constexpr int KPT = (ATT_TILE + SLICES - 1) / SLICES;  // a value lane's keys of a tile
    constexpr int HPW = (G + ATT_WARPS - 1) / ATT_WARPS;   // heads a warp keeps the softmax of
    // floats of a (token, kv head, split)'s partial: G rows of D weighted values, then G (max, sum),
    // rounded to a whole number of float4 so every row stays 16-byte aligned
    constexpr int STRIDE = (G * (D + 2) + 3) / 4 * 4;
    // splits' values the merging block copies into the pool while it weighs them
    constexpr int EARLY = ATT_EARLY * G * C <= ATT_EARLY_FLOAT4 ? ATT_EARLY : SLICES < ATT_EARLY ? SLICES : ATT_EARLY;
    constexpr int POOL_A = SLICES * G * C > (FRESH ? ATT_MAX_FRESH * C : 0) ? SLICES * G * C : ATT_MAX_FRESH * C;
    constexpr int POOL = POOL_A > EARLY * G * C ? POOL_A : EARLY * G * C;
    static_assert(D % 4 == 0 && C <= ATT_THREADS && ATT_TILE <= R4D_WARP && ATT_MAX_SPLITS <= R4D_WARP, "attention's cut");
    __shared__ float4 s_q[G * C];                  // the G heads' q (rotated: FRESH)
    // this step's keys of the sequence, rotated (FRESH; read by the tiles), then each slice's
    // weighted values (after the last tile: the loop's barriers lie between), then (the merging
    // block) the first EARLY splits' values
    __shared__ float4 s_pool[POOL];
    float4* const s_fresh = s_pool;
    float4* const s_acc = s_pool;
    __shared__ float s_cos[D / 2], s_sin[D / 2];   // rope's cos and sin at the token's position (FRESH)
    __shared__ float s_score[G][ATT_TILE];         // a tile's scores, then its weights
    __shared__ float s_keep[G];                    // what the tile's new maximum scales the sums by
    __shared__ float s_max[G], s_sum[G];
    __shared__ int s_last;
    __shared__ float s_split_max[ATT_MAX_SPLITS * G], s_split_sum[ATT_MAX_SPLITS * G], s_total[G];
    const int tid = threadIdx.x, lane = tid % R4D_WARP, warp = tid / R4D_WARP;
    const int m = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const bool decode = FRESH && (int)gridDim.x == p.seqs;  // one token a sequence: no token reads another's k
    const int width = p.kv_heads * D;

    // Before the chain's wait: nothing here reads what the kernel before wrote (the step's inputs and
    // tables, inv_freq, and the cache rows of positions before this step's, which no kernel of this
    // step writes: the plain row's store writes this step's slots alone), so the split's first tile
    // is in flight while that kernel drains.
    int s = 0;  // the sequence token m belongs to: m itself in a decode step, else independent loads, no chain
    if (decode) s = m;
    else
        for (int t = 1; t < p.seqs; ++t) s += p.cu_seqlens[t] <= m;
    const int length = p.context_lens[s], position = p.positions[m];
    const int visible = min(position, length - 1) + 1;
    const int oldest = p.window > 0 ? max(0, position - p.window + 1) : 0;  // the first key a window lets in
    const Keys keys = {p.block_tables + (long long)s * p.max_blocks, length - (p.cu_seqlens[s + 1] - p.cu_seqlens[s]),
                       p.cu_seqlens[s], width, kvh * D};
    // this token's splits: at most the grid's, whole tiles, at least a tile each
    const int count = max(visible - oldest, 0);
    int splits = min((int)gridDim.z, max(1, (count + ATT_TILE - 1) / ATT_TILE));
    const int chunk = max(1, ((count + splits - 1) / splits + ATT_TILE - 1) / ATT_TILE) * ATT_TILE;
    splits = max(1, (count + chunk - 1) / chunk);
    if (split >= splits) return;  // reads nothing the kernel before wrote: no wait needed
    const int j0 = oldest + split * chunk, j1 = min(visible, j0 + chunk);

    // score lane: key kk of a tile, chunks sub, sub + ATT_LANES, ...; value lane: chunk vc of the
    // keys slice, slice + SLICES, ... of a tile (lanes past SLICES * C idle there)
    const int kk = tid / ATT_LANES, sub = tid % ATT_LANES, vc = tid % C, slice = tid / C;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 kr[CL], vr[KPT];
#pragma unroll
    for (int i = 0; i < CL; ++i) kr[i] = zero;
#pragma unroll
    for (int i = 0; i < KPT; ++i) vr[i] = zero;
    load_keys<D, FRESH, CL>(p, keys, j0, j0, min(j1, keys.fresh), kk, sub, kr);
    load_values<D, FRESH, KPT, SLICES>(p, keys, j0, j0, min(j1, keys.fresh), slice, vc, vr);
#pragma unroll
    for (int t = 1; t <= R4D_ATT_AHEAD; ++t)
        prefetch_rows<D, FRESH>(p, keys, j0 + t * ATT_TILE, min(j1, keys.fresh), kk, sub);
    if (FRESH)
        for (int i = tid; i < D / 2; i += ATT_THREADS) r4d_cos_sin((float)position * p.inv_freq[i], s_cos[i], s_sin[i]);
    R4D_CHAIN_PROLOGUE();
    // the first tile's keys of this step (the plain row's store, or FRESH's k, v rows, wrote them)
    if (keys.fresh < j1) {
        load_keys<D, FRESH, CL>(p, keys, j0, max(j0, keys.fresh), j1, kk, sub, kr);
        load_values<D, FRESH, KPT, SLICES>(p, keys, j0, max(j0, keys.fresh), j1, slice, vc, vr);
    }

    // q of the G heads (contiguous in the row) and (FRESH, where this split sees them) this step's
    // keys of the sequence, rotated in shared memory a thread a pair: a key at the token's position
    // by the cos and sin q takes (all a decode step has), one at another position by its own
    const float4* qrows = (const float4*)(p.q + ((long long)m * p.q_heads + kvh * G) * D);
    for (int i = tid; i < G * C; i += ATT_THREADS) s_q[i] = qrows[i];
    const bool fresh_here = FRESH && j1 > keys.fresh;
    const int step = fresh_here ? max(0, min(length - keys.fresh, ATT_MAX_FRESH)) : 0;  // this step's tokens of the sequence
    // a decode step: the token's k and v go to its slot from the one block that reads them (in a
    // decode step no other block reads the k, v rows, so it also leaves k rotated in place)
    const long long row = (long long)m * width + keys.head;
    const long long slot = decode && fresh_here ? (long long)p.slots[m] * width + keys.head : 0;
    if (FRESH) {
        for (int i = tid; i < step * C; i += ATT_THREADS)
            s_fresh[i] = ((const float4*)(p.k + (long long)(keys.step_first + i / C) * width + keys.head))[i % C];
        if (decode && fresh_here)
            for (int i = tid; i < C; i += ATT_THREADS) ((float4*)(p.v_cache + slot))[i] = ((const float4*)(p.v + row))[i];
        __syncthreads();
        for (int i = tid; i < (G + step) * (D / 2); i += ATT_THREADS) {
            int r = i / (D / 2), pair = i % (D / 2);
            float* rotated = r < G ? (float*)s_q + r * D : (float*)s_fresh + (r - G) * D;
            int ia = p.interleaved ? 2 * pair : pair, ib = p.interleaved ? 2 * pair + 1 : pair + D / 2;
            int where = r < G ? position : p.positions[keys.step_first + r - G];
            float c = s_cos[pair], sn = s_sin[pair];
            if (where != position) r4d_cos_sin((float)where * p.inv_freq[pair], c, sn);
            float a = rotated[ia], b = rotated[ib];
            rotated[ia] = a * c - b * sn;
            rotated[ib] = a * sn + b * c;
        }
    }
    __syncthreads();
    if (decode && fresh_here)  // s_fresh's one row: the token's k, rotated
        for (int i = tid; i < C; i += ATT_THREADS) {
            ((float4*)(p.k + row))[i] = s_fresh[i];
            ((float4*)(p.k_cache + slot))[i] = s_fresh[i];
        }

    float4 acc[G];
    float run_max[HPW], run_sum[HPW];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = zero;
#pragma unroll
    for (int r = 0; r < HPW; ++r) {
        run_max[r] = __uint_as_float(0xff800000u);  // -inf
        run_sum[r] = 0.0f;
    }
    for (int first = j0; first < j1; first += ATT_TILE) {
        const int next = first + ATT_TILE, j = first + kk;
        // 1. scores; this step's keys from the rotated rows in shared memory
        if (FRESH && j < j1 && j >= keys.fresh)
#pragma unroll
            for (int i = 0; i < CL; ++i)
                if (sub + i * ATT_LANES < C) kr[i] = s_fresh[(j - keys.fresh) * C + sub + i * ATT_LANES];
        float dot[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            dot[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < CL; ++i)
                if (sub + i * ATT_LANES < C) dot[g] = r4d_dot4(s_q[g * C + sub + i * ATT_LANES], kr[i], dot[g]);
        }
#pragma unroll
        for (int o = ATT_LANES / 2; o > 0; o >>= 1)
#pragma unroll
            for (int g = 0; g < G; ++g) dot[g] += R4D_SHFL_XOR(dot[g], o);
        if (sub == 0)
#pragma unroll
            for (int g = 0; g < G; ++g) s_score[g][kk] = j < j1 ? dot[g] * p.scale : __uint_as_float(0xff800000u);
        // the next tile's keys in flight from here (a lane of a key past the split keeps an earlier
        // key's chunks: its score is -inf, its weight 0)
        if (next < j1) load_keys<D, FRESH, CL>(p, keys, next, next, j1, kk, sub, kr);
        if (R4D_ATT_AHEAD > 0 && next + R4D_ATT_AHEAD * ATT_TILE < j1)  // the tile R4D_ATT_AHEAD past the next one
            prefetch_rows<D, FRESH>(p, keys, next + R4D_ATT_AHEAD * ATT_TILE, min(j1, keys.fresh), kk, sub);
        __syncthreads();
        // 2. softmax: warp w keeps heads w, w + ATT_WARPS, ...; a key a lane (-inf past the split: weight 0)
#pragma unroll
        for (int r = 0; r < HPW; ++r) {
            int g = warp + r * ATT_WARPS;
            if (g >= G) continue;
            float score = lane < ATT_TILE ? s_score[g][lane] : __uint_as_float(0xff800000u);
            float top = fmaxf(run_max[r], r4d_warp_max(score));  // finite: a tile holds a key at least
            float keep = expf(run_max[r] - top), weight = expf(score - top);
            run_sum[r] = run_sum[r] * keep + r4d_warp_sum(weight);
            run_max[r] = top;
            if (lane < ATT_TILE) s_score[g][lane] = weight;
            if (lane == 0) s_keep[g] = keep;
        }
        __syncthreads();
        // 3. values
        if (slice < SLICES) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float4 sum = r4d_scale4(acc[g], s_keep[g]);
#pragma unroll
                for (int i = 0; i < KPT; ++i)
                    if (slice + i * SLICES < ATT_TILE) sum = r4d_axpy4(s_score[g][slice + i * SLICES], vr[i], sum);
                acc[g] = sum;
            }
        }
        if (next < j1) load_values<D, FRESH, KPT, SLICES>(p, keys, next, next, j1, slice, vc, vr);
        // the next tile's scores overwrite s_score and s_keep: every warp must be done reading them
        __syncthreads();
    }
    if (slice < SLICES)
#pragma unroll
        for (int g = 0; g < G; ++g) s_acc[(slice * G + g) * C + vc] = acc[g];
#pragma unroll
    for (int r = 0; r < HPW; ++r) {
        int g = warp + r * ATT_WARPS;
        if (g < G && lane == 0) { s_max[g] = run_max[r]; s_sum[g] = run_sum[r]; }
    }
    __syncthreads();

    // the split's weighted values of each head, the slices added in order: out itself where the
    // token has one split, else this split's partial
    const long long group = (long long)m * p.kv_heads + kvh;
    float* const out = p.out + ((long long)m * p.q_heads + kvh * G) * D;  // the G heads' rows, contiguous
    float* const mine = p.partial + (group * gridDim.z + split) * STRIDE;
    for (int i = tid; i < G * C; i += ATT_THREADS) {
        int g = i / C, c = i % C;
        float4 mixed = s_acc[g * C + c];
#pragma unroll
        for (int sl = 1; sl < SLICES; ++sl) {
            float4 more = s_acc[(sl * G + g) * C + c];
            mixed = make_float4(mixed.x + more.x, mixed.y + more.y, mixed.z + more.z, mixed.w + more.w);
        }
        if (splits == 1) {
            float total = s_sum[g];
            ((float4*)out)[i] = make_float4(mixed.x / total, mixed.y / total, mixed.z / total, mixed.w / total);
        } else {
            ((float4*)mine)[i] = mixed;
        }
    }
    if (splits > 1 && tid < G) {
        mine[G * D + 2 * tid] = s_max[tid];
        mine[G * D + 2 * tid + 1] = s_sum[tid];
    }
    if (FRESH && !decode && split == 0) {  // this token's own k (rotated) and v at its slot; nothing here reads them back
        long long at = (long long)p.slots[m] * width + keys.head;
        for (int d = tid; d < D; d += ATT_THREADS) {
            int pair = p.interleaved ? d / 2 : d % (D / 2);
            p.k_cache[at + d] = r4d_rotate_cs(p.k + row, d, D, p.interleaved, s_cos[pair], s_sin[pair]);
            p.v_cache[at + d] = p.v[row + d];
        }
    }
    if (splits > 1) {
        r4d_fence_each();
        __syncthreads();
        if (tid == 0) s_last = r4d_arrive(p.counters + group) == (u32)splits - 1;
        __syncthreads();
        if (!s_last) return;
        r4d_fence_each();
        // the (token, kv head)'s last block merges the splits in order. The first `early` splits'
        // values are copied into the pool (free since the partial was written) while the splits'
        // maxima and sums load and are weighed, so both wait on one round trip.
        const float* all = p.partial + group * gridDim.z * STRIDE;
        const int early = min(splits, EARLY);
        for (int i = tid; i < early * G * C; i += ATT_THREADS)
            r4d_copy16(s_pool + i, all + (i / (G * C)) * STRIDE + 4 * (i % (G * C)));
        for (int i = tid; i < splits * G; i += ATT_THREADS) {
            int q = i / G, g = i % G;
            s_split_max[i] = r4d_load_l2(all + q * STRIDE + G * D + 2 * g);
            s_split_sum[i] = r4d_load_l2(all + q * STRIDE + G * D + 2 * g + 1);
        }
        r4d_copies_wait();
        __syncthreads();
        // a head's splits weighed by one warp, a lane a split
        for (int g = warp; g < G; g += ATT_WARPS) {
            float sum = lane < splits ? s_split_sum[lane * G + g] : 0.0f;
            float top = r4d_warp_max(sum > 0.0f ? s_split_max[lane * G + g] : __uint_as_float(0xff800000u));
            float weight = sum > 0.0f ? expf(s_split_max[lane * G + g] - top) : 0.0f;
            float total = r4d_warp_sum(sum * weight);
            if (lane < splits) s_split_max[lane * G + g] = weight;  // from here on: the split's weight
            if (lane == 0) s_total[g] = total;
        }
        __syncthreads();
        // a float4 of the output a thread, added in split order: the early splits from the pool, the
        // rest ATT_MERGE at a time from the scratch
        for (int i = tid; i < G * C; i += ATT_THREADS) {
            int g = i / C;
            float4 mixed = zero;
            for (int q = 0; q < early; ++q)
                if (s_split_max[q * G + g] > 0.0f) mixed = r4d_axpy4(s_split_max[q * G + g], s_pool[q * G * C + i], mixed);
            for (int q0 = early; q0 < splits; q0 += ATT_MERGE) {
                float4 value[ATT_MERGE];
#pragma unroll
                for (int u = 0; u < ATT_MERGE; ++u)
                    value[u] = q0 + u < splits ? r4d_load4_l2(all + (q0 + u) * STRIDE + 4 * i) : zero;
#pragma unroll
                for (int u = 0; u < ATT_MERGE; ++u)
                    if (q0 + u < splits && s_split_max[(q0 + u) * G + g] > 0.0f)
                        mixed = r4d_axpy4(s_split_max[(q0 + u) * G + g], value[u], mixed);
            }
            float total = s_total[g];
            ((float4*)out)[i] = make_float4(mixed.x / total, mixed.y / total, mixed.z / total, mixed.w / total);
        }
        if (tid == 0) p.counters[group] = 0u;  // ready for the next launch (a graph replays it)
    }
    if (!FRESH) return;
    // q rotated, in place: only this (token, kv head)'s blocks read these heads, and they are done
    float4* qout = (float4*)(p.q + ((long long)m * p.q_heads + kvh * G) * D);
    for (int i = tid; i < G * C; i += ATT_THREADS) qout[i] = s_q[i];
    if (decode) return;  // k, v stored and k rotated by the block that read them
    // k rotated in place by the grid's last group: later tokens of a sequence read earlier ones' k
    r4d_fence_each();
    __syncthreads();
    if (tid == 0) s_last = r4d_arrive(p.counters + gridDim.x * p.kv_heads) == gridDim.x * p.kv_heads - 1;
    __syncthreads();
    if (!s_last) return;
    r4d_fence_each();
    rotate_pairs(p.k, gridDim.x * p.kv_heads, D, p.positions, p.kv_heads, p);
    if (tid == 0) p.counters[gridDim.x * p.kv_heads] = 0u;
}

// One module per (R4D_ATT_D, R4D_ATT_G): head_dim (a multiple of 4), G query heads per kv head.
#ifndef R4D_ATT_D
#define R4D_ATT_D 128
#endif
#ifndef R4D_ATT_G
#define R4D_ATT_G 1
#endif
#define ATTEND_ENTRY(FRESH, WHICH)                                                                                \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) r4d_attend_##WHICH(                                 \
        float* q, float* k, const float* v, float* k_cache, float* v_cache, const int* slots, const int* positions, \
        const int* cu_seqlens, const int* context_lens, const int* block_tables, float* out, const float* inv_freq, \
        float* partial, u32* counters, int seqs, int max_blocks, int q_heads, int kv_heads, int head_dim,         \
        int block_size, int interleaved, float scale) { /* attend() waits on the chain */                          \
        Attend p = {q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out,      \
                    inv_freq, partial, counters, seqs, max_blocks, q_heads, kv_heads, head_dim, block_size,       \
                    interleaved, scale};                                                                         \
        attend<R4D_ATT_D, R4D_ATT_G, FRESH>(p);                                                                  \
    }

ATTEND_ENTRY(false, cache)
ATTEND_ENTRY(true, fresh)
