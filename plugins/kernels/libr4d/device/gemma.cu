// libr4d device rows: the ops Gemma 3 adds to the vocabulary (docs/OPS.md) besides sliding_attention
// (attention_window.cu): the embedding's scale, rmsnorm over each head of q and k, and GeGLU's
// gelu_tanh(gate) * up. Each computes libref's arithmetic: the scale a rounded f32 product (bit for
// bit), the head norm in the canonical order of r4d_row_squares (common.cu), gelu_tanh in f64 in
// numpy's order of operations rounded once to f32.

// y = x * scale over count values (y may be x); a grid-stride loop
extern "C" __global__ void r4d_scale_dev(const float* x, float* y, long long count, float scale) { R4D_CHAIN_PROLOGUE();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i] * scale;
}

// y[m, h*D:(h+1)*D] = (x * (1 / sqrt(sum(x*x) / D + eps))) * w for each of `heads` heads of D values
// (y may be x); rows `pitch` floats apart. A warp per (row, head), four a block.
extern "C" __global__ void r4d_rmsnorm_heads_dev(const float* x, const float* w, float* y, int M, int heads, int D,
                                                 long long pitch, float eps) { R4D_CHAIN_PROLOGUE();
    long long item = (long long)blockIdx.x * (blockDim.x / R4D_WARP) + threadIdx.x / R4D_WARP;
    if (item >= (long long)M * heads) return;
    long long at = (item / heads) * pitch + (item % heads) * D;
    const float* row = x + at;
    float scale = 1.0f / sqrtf(r4d_row_squares(row, D) / (float)D + eps);
    float* out = y + at;
    for (int c = threadIdx.x % R4D_WARP; c < D; c += R4D_WARP) out[c] = (row[c] * scale) * w[c];
}

// y = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) in f64
// as numpy evaluates it (left to right), rounded once to f32 (y may be gate)
extern "C" __global__ void r4d_gelu_tanh_mul_dev(const float* gate, const float* up, float* y, long long count) {
    R4D_CHAIN_PROLOGUE();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
        double g = (double)gate[i];
        double inner = 0.7978845608028654 * (g + 0.044715 * g * g * g);
        float gelu = (float)(0.5 * g * (1.0 + tanh(inner)));
        y[i] = gelu * up[i];
    }
}
