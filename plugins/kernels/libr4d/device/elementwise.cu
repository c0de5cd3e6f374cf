// libr4d device rows: embedding, rmsnorm, rope, add, silu_mul, take_rows on f32 activations.
// Exact where libref is exact (embedding, add, take_rows); rmsnorm sums in parallel; rope and
// silu_mul take cos/sin/exp in f64 rounded once to f32, as libref does.

// y[m, :] = decode(table[ids[m], :]); grid (ceil(n / blockDim.x), M)
extern "C" __global__ void r4d_embedding_dev(const int* ids, const u8* codes, const u16* scale, const u16* minimum,
                                             int fmt, int vocab, int n, float* y) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    int id = ids[m];
    R4DWeight w = {codes, scale, minimum, fmt, vocab, n};
    y[(long long)m * n + c] = (id >= 0 && id < vocab) ? r4d_weight_at(w, id, c) : __uint_as_float(0x7fc00000u);
}

// y = (x * (1 / sqrt(sum(x*x) / n + eps))) * w, one warp per row of M (the sum in r4d_row_squares'
// order, which the GEMVs with a folded norm share)
// Each lane loads 8 values (8 float4 where rows are 16-byte aligned) before it stores any: y may be
// x itself, and a store the compiler cannot prove apart from the next load would otherwise make
// every load wait for the store before it (45 us for one 4096-row on an H200, now a few round trips).
extern "C" __global__ void r4d_rmsnorm_dev(const float* x, const float* w, float* y, int M, int n, float eps) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.x * (blockDim.x / R4D_WARP) + threadIdx.x / R4D_WARP, lane = threadIdx.x % R4D_WARP;
    if (m >= M) return;
    const float* row = x + (long long)m * n;
    float scale = 1.0f / sqrtf(r4d_row_squares(row, n) / (float)n + eps);
    float* out = y + (long long)m * n;
    if (n % 4 == 0 && (((unsigned long long)row | (unsigned long long)w | (unsigned long long)out) & 15) == 0) {
        int quads = n / 4;
        for (int base = lane; base < quads; base += 8 * R4D_WARP) {
            float4 a[8], b[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int c = base + u * R4D_WARP;
                if (c < quads) { a[u] = ((const float4*)row)[c]; b[u] = ((const float4*)w)[c]; }
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int c = base + u * R4D_WARP;
                if (c < quads)
                    ((float4*)out)[c] = make_float4((a[u].x * scale) * b[u].x, (a[u].y * scale) * b[u].y,
                                                    (a[u].z * scale) * b[u].z, (a[u].w * scale) * b[u].w);
            }
        }
        return;
    }
    for (int base = lane; base < n; base += 8 * R4D_WARP) {
        float a[8], b[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int c = base + u * R4D_WARP;
            a[u] = c < n ? row[c] : 0.0f;
            b[u] = c < n ? w[c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (base + u * R4D_WARP < n) out[base + u * R4D_WARP] = (a[u] * scale) * b[u];
    }
}

// Rotate q [M, q_heads*d] and k [M, kv_heads*d] in place; grid (M), any block. Thread t takes pair
// lane = t % W (W = min(half, blockDim.x)), then lane + W, ..., and for each pair's angle (its cos and
// sin computed once) the heads group, group + groups, ... (groups = blockDim.x / W): every (pair,
// head) once, and a token's angles computed `groups` times, not once a head.
extern "C" __global__ void r4d_rope_dev(float* q, float* k, const int* positions, const float* inv_freq,
                                        int q_heads, int kv_heads, int head_dim, int interleaved) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.x, half = head_dim / 2, heads = q_heads + kv_heads;
    int width = min(half, (int)blockDim.x), groups = (int)blockDim.x / width;
    int lane = threadIdx.x % width, group = threadIdx.x / width;
    if (group >= groups) return;
    float pos = (float)positions[m];
    for (int i = lane; i < half; i += width) {
        float angle = pos * inv_freq[i];
        float c, s;
        r4d_cos_sin(angle, c, s);
        int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        for (int h = group; h < heads; h += groups) {
            float* base = h < q_heads ? q + ((long long)m * q_heads + h) * head_dim
                                      : k + ((long long)m * kv_heads + (h - q_heads)) * head_dim;
            float a = base[ia], b = base[ib];
            base[ia] = a * c - b * s;
            base[ib] = a * s + b * c;
        }
    }
}

// Elementwise over count = M*n values, grid-stride. Where all three are 16-byte aligned a thread takes
// 4 values a step (float4: a quarter of the load and store instructions; each value's arithmetic as
// the scalar loop's, so the same bits), the last count % 4 one at a time. y may be a or b itself
// (the residual add), never a shifted view of them.
__device__ __forceinline__ bool r4d_aligned3(const void* a, const void* b, const void* c) {
    return (((unsigned long long)a | (unsigned long long)b | (unsigned long long)c) & 15) == 0;
}

__device__ __forceinline__ float r4d_silu_mul(float g, float u) {
    float sig = (float)(1.0 / (1.0 + exp(-(double)g)));
    return (g * sig) * u;
}

extern "C" __global__ void r4d_add_dev(const float* a, const float* b, float* y, long long count) { R4D_CHAIN_PROLOGUE();
    long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (r4d_aligned3(a, b, y)) {
        done = count / 4 * 4;
        for (long long i = first; i < count / 4; i += stride) {
            float4 u = ((const float4*)a)[i], v = ((const float4*)b)[i];
            ((float4*)y)[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
        }
    }
    for (long long i = done + first; i < count; i += stride) y[i] = a[i] + b[i];
}

extern "C" __global__ void r4d_silu_mul_dev(const float* gate, const float* up, float* y, long long count) { R4D_CHAIN_PROLOGUE();
    long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (r4d_aligned3(gate, up, y)) {
        done = count / 4 * 4;
        for (long long i = first; i < count / 4; i += stride) {
            float4 g = ((const float4*)gate)[i], u = ((const float4*)up)[i];
            ((float4*)y)[i] = make_float4(r4d_silu_mul(g.x, u.x), r4d_silu_mul(g.y, u.y), r4d_silu_mul(g.z, u.z),
                                          r4d_silu_mul(g.w, u.w));
        }
    }
    for (long long i = done + first; i < count; i += stride) y[i] = r4d_silu_mul(gate[i], up[i]);
}

// y[m, :] = x[index[m], :]; grid (ceil(n / blockDim.x), M); rows = x's row count
extern "C" __global__ void r4d_take_rows_dev(const float* x, const int* index, float* y, int n, int rows) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    int r = index[m];
    y[(long long)m * n + c] = (r >= 0 && r < rows) ? x[(long long)r * n + c] : __uint_as_float(0x7fc00000u);
}
