// libr4d device rows: activations narrowed for the tensor-core GEMMs, after tensor_core.cu: quantised
// to e4m3 for the e4m3 GEMMs (gemm_mma.cu, gemm_wgmma.cu; NVIDIA from sm_89, cvt.rn.satfinite.e4m3x2.f32)
// and rounded to bf16 for gemm_wgmma.cu's bf16 kind (cvt.rn.bf16x2.f32, sm_80).
// x's rows as OCP e4m3 codes for the e4m3 GEMM: per row m, s_m = amax_m / 448 (1 for a row of
// zeros), codes[m, k] = e4m3(x[m, k] / s_m) rounded to nearest even; a block a row, K % 4 == 0.
extern "C" __global__ void __launch_bounds__(256) r4d_quantize_e4m3_dev(const float* x, int M, int K, u8* codes,
                                                                       float* scales) { R4D_CHAIN_PROLOGUE();
    __shared__ float s_max[32];
    __shared__ float s_scale;
    const float4* row = (const float4*)(x + (long long)blockIdx.x * K);
    float amax = 0.0f;
    for (int c = threadIdx.x; c < K / 4; c += blockDim.x) {
        float4 v = row[c];
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    amax = r4d_warp_max(amax);
    if (threadIdx.x % 32 == 0) s_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float top = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; ++w) top = fmaxf(top, s_max[w]);
        s_scale = top > 0.0f ? top / 448.0f : 1.0f;
        scales[blockIdx.x] = s_scale;
    }
    __syncthreads();
    float s = s_scale;
    u32* out = (u32*)(codes + (long long)blockIdx.x * K);
    for (int c = threadIdx.x; c < K / 4; c += blockDim.x) {
        float4 v = row[c];
        out[c] = r4d_e4m3x2(v.x / s, v.y / s) | r4d_e4m3x2(v.z / s, v.w / s) << 16;
    }
}

// x [M, K] f32 as bf16 rows for gemm_wgmma.cu, each value rounded to nearest even (as gemm_mma.cu
// narrows its x on the way into shared memory): 8 values a thread a step, a grid-stride loop over
// `count` = M * K values, count % 8 == 0 (the row asks K % 8), both 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) r4d_narrow_bf16_dev(const float* x, long long count, u16* rows) {
    R4D_CHAIN_PROLOGUE();
    const float4* from = (const float4*)x;
    uint4* into = (uint4*)rows;
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < count / 8; c += (long long)gridDim.x * blockDim.x) {
        float4 lo = from[2 * c], hi = from[2 * c + 1];
        into[c] = make_uint4(r4d_bf16x2(lo.x, lo.y), r4d_bf16x2(lo.z, lo.w), r4d_bf16x2(hi.x, hi.y), r4d_bf16x2(hi.z, hi.w));
    }
}
