// libr4d device rows: the prefill GEMM, y[M, N] = x[M, K] . w[N, K]^T for larger M. A tiled f32 SIMT
// kernel: 64x64 output tiles, 256 threads of 4x4 outputs each, K in steps of 16 through shared
// memory; each weight element is decoded as the core decoder does (r4d_weight_at) while its tile
// is loaded, so every format shares one kernel. f32 accumulation in k order per thread (each output
// is one thread's ordered sum over K, products rounded: exactly libref's order and rounding).
#define GM_BM 64
#define GM_BN 64
#define GM_BK 16

extern "C" __global__ void __launch_bounds__(256) r4d_gemm_dev(const float* __restrict__ x, const u8* codes,
                                                               const u16* scale, const u16* minimum, int fmt,
                                                               float* __restrict__ y, int M, int N, int K) { R4D_CHAIN_PROLOGUE();
    __shared__ float4 As[GM_BK][GM_BM / 4];
    __shared__ float4 Ws[GM_BK][GM_BN / 4];
    float* as = (float*)As;
    float* ws = (float*)Ws;
    R4DWeight w = {codes, scale, minimum, fmt, N, K};
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int m0 = blockIdx.y * GM_BM, n0 = blockIdx.x * GM_BN;
    int lr = tid / 4, lk = (tid % 4) * 4;  // the loader's row of the tile and first k
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GM_BK) {
        int m = m0 + lr, n = n0 + lr;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int k = k0 + lk + i;
            as[(lk + i) * GM_BM + lr] = (m < M && k < K) ? x[(long long)m * K + k] : 0.0f;
            ws[(lk + i) * GM_BN + lr] = (n < N && k < K) ? r4d_weight_at(w, n, k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GM_BK; ++kk) {
            float4 a = As[kk][ty], b = Ws[kk][tx];
            float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int m = m0 + ty * 4 + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int n = n0 + tx * 4 + j;
            if (n < N) y[(long long)m * N + n] = acc[i][j];
        }
    }
}
