// libr4d device rows: sample, one block of SAMPLE_THREADS per row of logits [M, vocab].
// temperature <= 0: the first maximum (a NaN counts as the largest, the first NaN wins: np.argmax).
// temperature > 0: libref's procedure (docs/OPS.md, plugins/kernels/libr4d/sample.py explains the
// head): s = logits / temperature; the values within 20 of the maximum (every other weight
// exp(s - max) < 2**-25 leaves the running f32 sum, which starts at 1, unchanged) keyed
// (order-preserving bits of -s) << 32 | index and bitonic-sorted in the row's scratch (tile by tile
// in shared memory where a pass allows), which is the stable descending order; the top_k first; weights exp(s - s0) in f64 rounded to f32 (every
// thread) and their running sum in order (one thread over the contiguous weights: the order is the
// contract); the top_p cut; u from Philox4x64-10 (device_philox.py is its host mirror); the first
// running sum above f32(u) * total (the cut and that index: a minimum over every thread's first hit).
// Non-finite logits at temperature > 0 are not reproduced (docs/LIBR4D.md).
#define SAMPLE_THREADS 1024

__device__ __forceinline__ u64 r4d_key(float s, int index) {
    u32 bits = __float_as_uint(-s + 0.0f);  // -0.0 -> +0.0, as argsort compares them equal
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((u64)bits << 32) | (u32)index;
}

#define SAMPLE_TILE 4096  // keys a block sorts in shared memory at a time (32 KB)

// The bitonic passes of `size` from `stride` down to 1 over the keys [base, base + tile) held in
// shared memory `t`; each pair's direction is its global index's (ascending where (base + i) & size is 0).
__device__ void r4d_tile_passes(u64* t, int base, int tile, int size, int stride) {
    for (; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < tile; i += blockDim.x) {
            int j = i ^ stride;
            if (j > i) {
                u64 a = t[i], b = t[j];
                if ((a > b) == (((base + i) & size) == 0)) { t[i] = b; t[j] = a; }
            }
        }
        __syncthreads();
    }
}

// keys[0, span) sorted ascending (span a power of two) by a bitonic network. A pass whose pairs lie
// within aligned tiles of SAMPLE_TILE keys (stride below the tile) runs in shared memory, a tile at
// a time, with the passes after it of the same size; only the strides of a tile or more go through
// global memory (15 of the 153 passes of 2**17 keys). The keys are unique (the index is in their low
// bits), so the order is the one any sort gives.
__device__ void r4d_sort_keys(u64* keys, int span, u64* t) {
    int tile = min(span, SAMPLE_TILE);
    for (int base = 0; base < span; base += tile) {  // every size up to the tile's, tile by tile
        for (int i = threadIdx.x; i < tile; i += blockDim.x) t[i] = keys[base + i];
        __syncthreads();
        for (int size = 2; size <= tile; size <<= 1) r4d_tile_passes(t, base, tile, size, size >> 1);
        for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = t[i];
        __syncthreads();
    }
    for (int size = tile << 1; size <= span; size <<= 1) {
        for (int stride = size >> 1; stride >= tile; stride >>= 1) {  // pairs across tiles: global memory
            for (int i = threadIdx.x; i < span; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    u64 a = keys[i], b = keys[j];
                    if ((a > b) == ((i & size) == 0)) { keys[i] = b; keys[j] = a; }
                }
            }
            __syncthreads();
        }
        for (int base = 0; base < span; base += tile) {  // the strides below the tile's, tile by tile
            for (int i = threadIdx.x; i < tile; i += blockDim.x) t[i] = keys[base + i];
            __syncthreads();
            r4d_tile_passes(t, base, tile, size, tile >> 1);
            for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = t[i];
            __syncthreads();
        }
    }
}

__device__ double r4d_philox_uniform(u64 seed, u64 step) {
    u64 c0 = step + 1, c1 = (step + 1 == 0) ? 1 : 0, c2 = 0, c3 = 0, k0 = seed, k1 = 0;
    for (int r = 0; r < 10; ++r) {
        u64 lo0 = 0xD2E7470EE14C6C93ull * c0, hi0 = __umul64hi(0xD2E7470EE14C6C93ull, c0);
        u64 lo1 = 0xCA5A826395121157ull * c2, hi1 = __umul64hi(0xCA5A826395121157ull, c2);
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
        k0 += 0x9E3779B97F4A7C15ull; k1 += 0xBB67AE8584CAA73Bull;
    }
    return (double)(c0 >> 11) * (1.0 / 9007199254740992.0);
}

// scratch per row: `padded` u64 keys (padded = a power of two >= vocab), then vocab f32 running sums.
// `best`, `best_index` [groups, M]: where a fused lm head GEMV left each row group's first maximum
// (r4d_gemv, mode 3), the greedy rows reduce those instead of the logits; null: the logits.
__device__ void r4d_sample(const float* logits, const float* temperature, const int* top_k, const float* top_p,
                           const u64* rng, int* tokens, int vocab, u8* scratch, int padded, const float* best_of,
                           const int* best_index, int groups) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    __shared__ int s_count, s_result, s_first;
    __shared__ float s_total;
    __shared__ u64 s_tile[SAMPLE_TILE];
    int row = blockIdx.x, tid = threadIdx.x, lane = tid % R4D_WARP, warp = tid / R4D_WARP;
    int warps = blockDim.x / R4D_WARP;
    const float* x = logits + (long long)row * vocab;
    float t = temperature[row];
    if (!(t > 0.0f)) {  // greedy: the first maximum
        float best = __uint_as_float(0xff800000u);
        int where = 0x7fffffff;
        if (best_of) {
            for (int g = tid; g < groups; g += blockDim.x) {
                float value = best_of[(long long)g * gridDim.x + row];
                int at = best_index[(long long)g * gridDim.x + row];
                if (r4d_better(value, at, best, where)) { best = value; where = at; }
            }
        } else {
            for (int i = tid; i < vocab; i += blockDim.x)
                if (r4d_better(x[i], i, best, where)) { best = x[i]; where = i; }
        }
        for (int o = R4D_WARP / 2; o > 0; o >>= 1) {
            float b = R4D_SHFL_XOR(best, o);
            int wb = R4D_SHFL_XOR(where, o);
            if (r4d_better(b, wb, best, where)) { best = b; where = wb; }
        }
        if (lane == 0) { s_val[warp] = best; s_idx[warp] = where; }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < warps; ++w)
                if (r4d_better(s_val[w], s_idx[w], best, where)) { best = s_val[w]; where = s_idx[w]; }
            tokens[row] = where;
        }
        return;
    }
    u64* keys = (u64*)(scratch + (long long)row * ((long long)padded * 8 + (long long)vocab * 4));
    float* running = (float*)(keys + padded);
    float top = __uint_as_float(0xff800000u);
    for (int i = tid; i < vocab; i += blockDim.x) top = fmaxf(top, x[i] / t);
    top = r4d_warp_max(top);
    if (lane == 0) s_val[warp] = top;
    if (tid == 0) s_count = 0;
    __syncthreads();
    top = s_val[0];
    for (int w = 1; w < warps; ++w) top = fmaxf(top, s_val[w]);
    for (int i = tid; i < vocab; i += blockDim.x) {
        float s = x[i] / t;
        if (s - top >= -20.0f) keys[atomicAdd(&s_count, 1)] = r4d_key(s, i);
    }
    __syncthreads();
    int count = s_count, span = 1;
    while (span < count) span <<= 1;
    for (int i = count + tid; i < span; i += blockDim.x) keys[i] = ~0ull;
    __syncthreads();
    r4d_sort_keys(keys, span, s_tile);
    int k = top_k[row];
    bool cut_k = k > 0 && k < vocab;
    int n = cut_k ? min(k, count) : count;
    bool partial = cut_k ? k > count : count < vocab;
    // The weights, every thread: weight j is a function of key j alone, the same expression libref
    // rounds; only their running sum is serial (f32 additions in order are the contract).
    float first = x[(u32)keys[0]] / t;
    for (int j = tid; j < n; j += blockDim.x) {
        float s = x[(u32)keys[j]] / t;
        running[j] = (float)exp((double)(s - first));
    }
    __syncthreads();
    if (tid == 0) {  // in place, over contiguous weights: the loads run ahead of the dependent adds
        float sum = 0.0f;
        #pragma unroll 8
        for (int j = 0; j < n; ++j) {
            sum += running[j];
            running[j] = sum;
        }
        s_total = sum;
    }
    __syncthreads();
    // The first index where a condition holds, found by every thread (a minimum of the indices
    // that hold): what libref's scan in order finds.
    float p = top_p[row];
    if (p > 0.0f && p < 1.0f) {
        float target = p * s_total;
        if (tid == 0) s_first = n - 1;
        __syncthreads();
        for (int j = tid; j < n - 1; j += blockDim.x)
            if (!(running[j] < target)) { atomicMin(&s_first, j); break; }
        __syncthreads();
        n = s_first + 1;
        partial = false;  // libref cuts its order there
        __syncthreads();  // every thread has read s_first before it is set again
    }
    float threshold = (float)r4d_philox_uniform(rng[2 * row], rng[2 * row + 1]) * running[n - 1];
    if (tid == 0) s_first = n;
    __syncthreads();
    for (int j = tid; j < n; j += blockDim.x)
        if (running[j] > threshold) { atomicMin(&s_first, j); break; }
    __syncthreads();
    if (tid == 0) {
        int index = s_first;
        s_result = index < n ? (int)(u32)keys[index] : (!partial ? (int)(u32)keys[n - 1] : -1);
    }
    __syncthreads();
    if (s_result >= 0 || !partial) {
        if (tid == 0) tokens[row] = s_result;
        return;
    }
    // f32(u) rounded to 1: libref takes the last of its order. Without top_k: the highest index of
    // the smallest value; with top_k past the head: the k-th smallest key of all (a radix select).
    if (!cut_k) {
        float low = __uint_as_float(0x7f800000u);
        int where = -1;
        for (int i = tid; i < vocab; i += blockDim.x) {
            float s = x[i] / t;
            if (s < low || (s == low && i > where)) { low = s; where = i; }
        }
        for (int o = R4D_WARP / 2; o > 0; o >>= 1) {
            float b = R4D_SHFL_XOR(low, o);
            int wb = R4D_SHFL_XOR(where, o);
            if (b < low || (b == low && wb > where)) { low = b; where = wb; }
        }
        if (lane == 0) { s_val[warp] = low; s_idx[warp] = where; }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < warps; ++w)
                if (s_val[w] < low || (s_val[w] == low && s_idx[w] > where)) { low = s_val[w]; where = s_idx[w]; }
            tokens[row] = where;
        }
        return;
    }
    u64 prefix = 0;
    int wanted = k;
    for (int bit = 63; bit >= 0; --bit) {
        u64 high = bit == 63 ? 0 : (prefix >> (bit + 1));
        int local = 0;
        for (int i = tid; i < vocab; i += blockDim.x) {
            u64 key = r4d_key(x[i] / t, i);
            if ((bit == 63 || (key >> (bit + 1)) == high) && !((key >> bit) & 1)) ++local;
        }
        float total = r4d_block_sum((float)local, s_val);  // counts < 2**24: exact in f32
        if (wanted > (int)total) { wanted -= (int)total; prefix |= 1ull << bit; }
    }
    if (tid == 0) tokens[row] = (int)(u32)prefix;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) r4d_sample_dev(
        const float* logits, const float* temperature, const int* top_k, const float* top_p, const u64* rng,
        int* tokens, int vocab, u8* scratch, int padded) { R4D_CHAIN_PROLOGUE();
    r4d_sample(logits, temperature, top_k, top_p, rng, tokens, vocab, scratch, padded, nullptr, nullptr, 0);
}

// after a fused lm head: M = gridDim.x rows, each row group's maximum in best / best_index
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) r4d_sample_groups_dev(
        const float* logits, const float* temperature, const int* top_k, const float* top_p, const u64* rng,
        int* tokens, int vocab, u8* scratch, int padded, const float* best, const int* best_index, int groups) {
    R4D_CHAIN_PROLOGUE();
    r4d_sample(logits, temperature, top_k, top_p, rng, tokens, vocab, scratch, padded, best, best_index, groups);
}
