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

// y = (x * (1 / sqrt(sum(x*x) / n + eps))) * w over one row, by one warp (the sum in r4d_row_squares'
// order, which the GEMVs with a folded norm share)
// Each lane loads 8 values (8 float4 where rows are 16-byte aligned) before it stores any: y may be
// x itself, and a store the compiler cannot prove apart from the next load would otherwise make
// every load wait for the store before it (45 us for one 4096-row on an H200, now a few round trips).
__device__ __forceinline__ void r4d_rmsnorm_row(const float* row, const float* w, float* out, int n, float eps) {
    int lane = threadIdx.x % R4D_WARP;
    float scale = 1.0f / sqrtf(r4d_row_squares(row, n) / (float)n + eps);
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

// rmsnorm: a warp per row of M (norm_grid)
extern "C" __global__ void r4d_rmsnorm_dev(const float* x, const float* w, float* y, int M, int n, float eps) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.x * (blockDim.x / R4D_WARP) + threadIdx.x / R4D_WARP;
    if (m >= M) return;
    r4d_rmsnorm_row(x + (long long)m * n, w, y + (long long)m * n, n, eps);
}

// row += add over n4 float4s, a warp's lanes across them (r4d_add_dev's sums): R4D_NORM_BATCH float4s a
// lane loaded before it stores any (a store could alias the next loads as far as the compiler knows:
// one at a time would leave a lane one load in flight). Both add + norm kernels' first pass.
#define R4D_NORM_BATCH 4
__device__ __forceinline__ void r4d_add_row4(float4* row, const float4* add, int n4, int lane) {
    for (int base = lane; base < n4; base += R4D_NORM_BATCH * R4D_WARP) {
        float4 a[R4D_NORM_BATCH], b[R4D_NORM_BATCH];
#pragma unroll
        for (int u = 0; u < R4D_NORM_BATCH; ++u)
            if (base + u * R4D_WARP < n4) {
                a[u] = row[base + u * R4D_WARP];
                b[u] = add[base + u * R4D_WARP];
            }
#pragma unroll
        for (int u = 0; u < R4D_NORM_BATCH; ++u)
            if (base + u * R4D_WARP < n4)
                row[base + u * R4D_WARP] = make_float4(a[u].x + b[u].x, a[u].y + b[u].y, a[u].z + b[u].z, a[u].w + b[u].w);
    }
}

// The norm of the fused prefill rows (device_prefill_rows.py), the norm's weight as stored (fmt:
// FMT_F32, FMT_BF16, FMT_F16): where `x` is given, residual += x first (the add of add_rmsnorm's
// chains); then y = (residual * scale) * w with r4d_rmsnorm_row's scale (the bits of r4d_add_dev then
// r4d_rmsnorm_dev, as the chain leaves `residual` and `normed`), and where `rows` is given the same
// values rounded to bf16 (nearest even) into it, the tensor-core GEMMs' x. A warp a row (norm_grid),
// n % 4 == 0, residual, x, y 16-byte and rows 8-byte aligned.
extern "C" __global__ void r4d_add_rmsnorm_bf16_dev(float* residual, const float* x, const u8* w, int fmt, float* y,
                                                    u16* rows, int M, int n, float eps) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.x * (blockDim.x / R4D_WARP) + threadIdx.x / R4D_WARP, lane = threadIdx.x % R4D_WARP, n4 = n / 4;
    float4* row = (float4*)(residual + (long long)m * n);
    if (x && m < M) r4d_add_row4(row, (const float4*)(x + (long long)m * n), n4, lane);
    __syncthreads();  // every lane's sums in before any lane reads the row back
    if (m >= M) return;
    float scale = 1.0f / sqrtf(r4d_row_squares((const float*)row, n) / (float)n + eps);
    for (int base = lane; base < n4; base += R4D_NORM_BATCH * R4D_WARP) {
        float4 h[R4D_NORM_BATCH];
#pragma unroll
        for (int u = 0; u < R4D_NORM_BATCH; ++u)
            if (base + u * R4D_WARP < n4) h[u] = row[base + u * R4D_WARP];
#pragma unroll
        for (int u = 0; u < R4D_NORM_BATCH; ++u) {
            int c = base + u * R4D_WARP;
            if (c >= n4) continue;
            float4 v = make_float4((h[u].x * scale) * r4d_norm_weight(w, fmt, 4 * c), (h[u].y * scale) * r4d_norm_weight(w, fmt, 4 * c + 1),
                                   (h[u].z * scale) * r4d_norm_weight(w, fmt, 4 * c + 2), (h[u].w * scale) * r4d_norm_weight(w, fmt, 4 * c + 3));
            ((float4*)(y + (long long)m * n))[c] = v;
            if (rows)
                ((uint2*)(rows + (long long)m * n))[c] = make_uint2(r4d_bf16_bits(v.x) | r4d_bf16_bits(v.y) << 16,
                                                                     r4d_bf16_bits(v.z) | r4d_bf16_bits(v.w) << 16);
        }
    }
}

// add then rmsnorm, fused (add(residual, x, residual) + rmsnorm(residual, w, y)): residual += x, then
// y = rmsnorm(residual) * w, a warp per row of M (norm_grid), bit for bit r4d_add_dev then
// r4d_rmsnorm_dev (the same sums; the norm is r4d_rmsnorm_row itself). The row's sums are written
// before the norm reads them back (from L2: one pass over HBM fewer than the two launches, which
// read the residual again); a block barrier between, so that every lane sees every lane's sums.
extern "C" __global__ void r4d_add_rmsnorm_dev(float* residual, const float* x, const float* w, float* y, int M, int n,
                                               float eps) { R4D_CHAIN_PROLOGUE();
    int m = blockIdx.x * (blockDim.x / R4D_WARP) + threadIdx.x / R4D_WARP, lane = threadIdx.x % R4D_WARP;
    float* row = residual + (long long)m * n;
    const float* add = x + (long long)m * n;
    if (m < M) {
        if (n % 4 == 0 && (((unsigned long long)row | (unsigned long long)add) & 15) == 0) {
            r4d_add_row4((float4*)row, (const float4*)add, n / 4, lane);
        } else {
            for (int c = lane; c < n; c += R4D_WARP) row[c] = row[c] + add[c];
        }
    }
    __syncthreads();
    if (m < M) r4d_rmsnorm_row(row, w, y + (long long)m * n, n, eps);
}

// Rotate q [M, q_heads*d] and k [M, kv_heads*d] in place; grid (M), any block. A token's angles are
// worked out once (R4D_ROPE_CHUNK pairs at a time, into shared memory), then every (head, pair) of
// the token rotated. Where q and k are 16-byte aligned and d allows it, a thread takes 4 values a step
// (float4: pairs i..i+3 and i + d/2..i + d/2 + 3, or interleaved two whole pairs) and loads
// R4D_ROPE_BATCH steps before it stores any (the stores could alias the next loads as far as the
// compiler knows: one step at a time would leave a thread one load in flight). Each value's
// arithmetic is the scalar loop's: the same bits either way (no contraction: common.cu).
#define R4D_ROPE_CHUNK 512
#define R4D_ROPE_BATCH 4
__device__ __forceinline__ float* r4d_rope_head(float* q, float* k, int m, int h, int q_heads, int kv_heads, int head_dim) {
    return h < q_heads ? q + ((long long)m * q_heads + h) * head_dim : k + ((long long)m * kv_heads + (h - q_heads)) * head_dim;
}

extern "C" __global__ void r4d_rope_dev(float* q, float* k, const int* positions, const float* inv_freq,
                                        int q_heads, int kv_heads, int head_dim, int interleaved) { R4D_CHAIN_PROLOGUE();
    __shared__ float4 rope_cos4[R4D_ROPE_CHUNK / 4], rope_sin4[R4D_ROPE_CHUNK / 4];
    float* rope_cos = (float*)rope_cos4;
    float* rope_sin = (float*)rope_sin4;
    int m = blockIdx.x, half = head_dim / 2, heads = q_heads + kv_heads;
    float pos = (float)positions[m];
    bool vector = ((((unsigned long long)q | (unsigned long long)k) & 15) == 0) && head_dim % 4 == 0 &&
                  (interleaved || half % 4 == 0);
    for (int base = 0; base < half; base += R4D_ROPE_CHUNK) {
        int pairs = min(R4D_ROPE_CHUNK, half - base);
        if (base > 0) __syncthreads();  // every thread is done with the last chunk's angles
        for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
            float c, sn;
            r4d_cos_sin(pos * inv_freq[base + i], c, sn);
            rope_cos[i] = c;
            rope_sin[i] = sn;
        }
        __syncthreads();
        if (vector) {
            int steps = interleaved ? pairs / 2 : pairs / 4, items = heads * steps;
            for (int first = threadIdx.x; first < items; first += R4D_ROPE_BATCH * blockDim.x) {
                float4 a[R4D_ROPE_BATCH], b[R4D_ROPE_BATCH];
#pragma unroll
                for (int u = 0; u < R4D_ROPE_BATCH; ++u) {
                    int item = first + u * blockDim.x;
                    if (item >= items) continue;
                    float* row = r4d_rope_head(q, k, m, item / steps, q_heads, kv_heads, head_dim);
                    int j = item % steps;
                    if (interleaved) {
                        a[u] = *(const float4*)(row + 2 * base + 4 * j);
                    } else {
                        a[u] = *(const float4*)(row + base + 4 * j);
                        b[u] = *(const float4*)(row + half + base + 4 * j);
                    }
                }
#pragma unroll
                for (int u = 0; u < R4D_ROPE_BATCH; ++u) {
                    int item = first + u * blockDim.x;
                    if (item >= items) continue;
                    float* row = r4d_rope_head(q, k, m, item / steps, q_heads, kv_heads, head_dim);
                    int j = item % steps;
                    if (interleaved) {  // pairs 2j and 2j + 1 of the chunk: (x, y), (z, w)
                        float c0 = rope_cos[2 * j], s0 = rope_sin[2 * j], c1 = rope_cos[2 * j + 1], s1 = rope_sin[2 * j + 1];
                        float4 v = a[u];
                        *(float4*)(row + 2 * base + 4 * j) = make_float4(v.x * c0 - v.y * s0, v.x * s0 + v.y * c0,
                                                                         v.z * c1 - v.w * s1, v.z * s1 + v.w * c1);
                    } else {  // pairs 4j..4j + 3 of the chunk
                        float4 c = rope_cos4[j], sn = rope_sin4[j], x = a[u], y = b[u];
                        *(float4*)(row + base + 4 * j) = make_float4(x.x * c.x - y.x * sn.x, x.y * c.y - y.y * sn.y,
                                                                     x.z * c.z - y.z * sn.z, x.w * c.w - y.w * sn.w);
                        *(float4*)(row + half + base + 4 * j) = make_float4(x.x * sn.x + y.x * c.x, x.y * sn.y + y.y * c.y,
                                                                            x.z * sn.z + y.z * c.z, x.w * sn.w + y.w * c.w);
                    }
                }
            }
        } else {
            for (int item = threadIdx.x; item < heads * pairs; item += blockDim.x) {
                float* row = r4d_rope_head(q, k, m, item / pairs, q_heads, kv_heads, head_dim);
                int i = item % pairs, ia = interleaved ? 2 * (base + i) : base + i, ib = interleaved ? ia + 1 : ia + half;
                float a = row[ia], b = row[ib], c = rope_cos[i], sn = rope_sin[i];
                row[ia] = a * c - b * sn;
                row[ib] = a * sn + b * c;
            }
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
