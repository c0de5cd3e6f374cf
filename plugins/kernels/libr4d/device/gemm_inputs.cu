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

// x's M <= 8 activation rows as the 16 bf16 rows gemm_skinny.cu's decode band reads: row m the value v
// rounded to bf16 (nearest even), row 8 + m the remainder v - bf16(v) rounded again, rows M..7 and
// 8 + M..15 zero. With a norm (1: rmsnorm of row m; 2: of row index[m] of x's x_rows, NaN where the
// index is out of range, the row written to `gathered` as take_rows leaves it) v is gemv.cu's folded
// norm, (x * scale) * w with the scale from r4d_row_squares' canonical order (rmsnorm's bits), also
// written to `normed`, as the chain leaves it; the norm's weight as stored (norm_fmt: f32, f16, bf16).
// A block a row slot m of the 8, 256 threads, K % 4 == 0, x's and the outputs' rows 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) r4d_split_bf16_dev(const float* x, int M, int K, int norm,
                                                                    const u8* norm_weight, int norm_fmt, float eps,
                                                                    float* normed, const int* index, float* gathered,
                                                                    int x_rows, u16* rows) {
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // R4D_CHAIN_PROLOGUE's two steps the other way round: the skinny kernel after this one may launch at once
    // (it streams weights, no kernel's output, until its own wait, which waits for this kernel, which waits
    // for the one before), so its blocks take the multiprocessors the kernel before frees as they free them
    // and stream while it drains, as a chain of GEMVs does; this kernel's 8 small blocks fit beside either
    asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;" ::: "memory");
#endif
    __shared__ float s_scale;
    int m = blockIdx.x;
    uint2* hi = (uint2*)(rows + (long long)m * K);
    uint2* lo = (uint2*)(rows + (long long)(8 + m) * K);
    if (m >= M) {
        for (int c = threadIdx.x; c < K / 4; c += blockDim.x) hi[c] = lo[c] = make_uint2(0u, 0u);
        return;
    }
    int row = m;
    if (norm == 2) {
        row = index[m];
        row = (row < 0 || row >= x_rows) ? -1 : row;
    }
    const float4* from = (const float4*)(x + (long long)max(row, 0) * K);
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__)
    // every thread asks for some of the row's lines first (as gemv.cu's folded norm): the one warp summing
    // in the canonical order then finds them in L1, not one L2 round trip after another
    if (norm)
        for (int c = threadIdx.x; c < K / 32; c += blockDim.x)
            asm volatile("prefetch.global.L1 [%0];" ::"l"((const float*)from + 32 * c));
#endif
    if (norm && threadIdx.x < 32) {
        float total = r4d_row_squares((const float*)from, K);
        if (threadIdx.x == 0) s_scale = 1.0f / sqrtf(total / (float)K + eps);
    }
    if (norm) __syncthreads();
    float scale = norm ? s_scale : 1.0f;
    for (int c = threadIdx.x; c < K / 4; c += blockDim.x) {
        float4 h = row < 0 ? make_float4(__uint_as_float(0x7fc00000u), __uint_as_float(0x7fc00000u),
                                         __uint_as_float(0x7fc00000u), __uint_as_float(0x7fc00000u)) : from[c];
        float v[4] = {h.x, h.y, h.z, h.w};
        if (norm == 2) ((float4*)(gathered + (long long)m * K))[c] = h;
        if (norm) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int k = 4 * c + e;
                v[e] = (v[e] * scale) * r4d_norm_weight(norm_weight, norm_fmt, k);
            }
            ((float4*)(normed + (long long)m * K))[c] = make_float4(v[0], v[1], v[2], v[3]);
        }
        u32 h01 = r4d_bf16x2(v[0], v[1]), h23 = r4d_bf16x2(v[2], v[3]);
        float r0 = v[0] - __uint_as_float(h01 << 16), r1 = v[1] - __uint_as_float(h01 & 0xffff0000u);
        float r2 = v[2] - __uint_as_float(h23 << 16), r3 = v[3] - __uint_as_float(h23 & 0xffff0000u);
        hi[c] = make_uint2(h01, h23);
        lo[c] = make_uint2(r4d_bf16x2(r0, r1), r4d_bf16x2(r2, r3));
    }
}
