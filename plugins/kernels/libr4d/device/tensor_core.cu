// libr4d device rows: what the tensor-core kernels share (gemm_mma.cu, gemm_wgmma.cu, attention_tiles.cu):
// copies into shared memory (cp.async), ldmatrix, the mma.sync shapes, narrowing f32 to bf16 or
// e4m3, and the split-K epilogue. NVIDIA only: mma.sync from sm_80, e4m3 from sm_89; the rows hand
// these sources to nvrtc alone (device_tensor_cores.py picks the SIMT kernels elsewhere).
//
// Fragments (PTX ISA, "mma.m16n8k16" and "mma.m16n8k32"): lane l of a warp is in group g = l / 4,
// thread t = l % 4. An m16 x k A fragment is 4 words: (row g, k half 0), (row g + 8, half 0),
// (row g, half 1), (row g + 8, half 1), each word two bf16 (k 2t, 2t + 1) or four e4m3 (k 4t..4t + 3)
// of its half; a B fragment is 2 words (column g, k half 0 and 1); a C fragment 4 floats: (row g,
// columns 2t, 2t + 1), (row g + 8, the same). In bytes both element types lay a half out alike: 16
// bytes a row, a word at byte 4t. So one ldmatrix pattern serves both.

// shared memory address of a generic pointer into shared memory
__device__ __forceinline__ u32 r4d_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared without passing through registers; `full` false fills 16 zero bytes
// (a row or column past the matrix) and reads nothing, though `src` must still be a valid address
__device__ __forceinline__ void r4d_cp_async16(void* dst, const void* src, bool full) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(r4d_smem(dst)), "l"(src), "r"(full ? 16 : 0)
                 : "memory");
}
// the same, the L2 asked to fetch the 256-byte block around `src` (the next k-tiles of a streamed row
// arrive with it: fewer, larger requests to HBM)
__device__ __forceinline__ void r4d_cp_async16_l2(void* dst, const void* src, bool full) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(r4d_smem(dst)), "l"(src),
                 "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void r4d_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// wait until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void r4d_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// four 8x8 matrices of 16-byte rows: lane l gives the address of row l % 8 of matrix l / 8 and
// receives word l % 4 of row l / 4 of each matrix
__device__ __forceinline__ void r4d_ldmatrix_x4(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(r4d_smem(p)));
}

// the same with each matrix transposed: lane l receives, of each matrix, the two b16 of column
// l / 4 at rows 2(l % 4) and 2(l % 4) + 1 (a B fragment from a [k][n] tile)
__device__ __forceinline__ void r4d_ldmatrix_x4_trans(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(r4d_smem(p)));
}

// d += a . b, m16n8k16, bf16 in, f32 accumulation
__device__ __forceinline__ void r4d_mma_bf16(float* d, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a . b, m16n8k32, OCP e4m3 in, f32 accumulation (sm_89 and later)
__device__ __forceinline__ void r4d_mma_e4m3(float* d, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();  // the rows never launch an e4m3 kernel before sm_89
#endif
}

// two floats as bf16, rounded to nearest even: `lo` in the low half (the lower k)
__device__ __forceinline__ u32 r4d_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// two floats as OCP e4m3, rounded to nearest even, saturated to +-448 (NaN stays NaN): `lo` in
// the low byte. sm_89 and later.
__device__ __forceinline__ u32 r4d_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    __trap();
    return 0u;
#endif
}

// The split-K epilogue. A kernel that splits K (gridDim.z > 1) writes its tile's sums to
// partial[split][M][N]; the tile's last block to arrive (a counter per output tile) adds the
// splits in order, applies `finish` and stores, then resets the counter for the next launch (a graph
// replays it). Returns whether this block is that last block; the counter for tile (x, y) is
// counters[y * gridDim.x + x]. `last`: a shared int the block may use for the answer (gemm_wgmma.cu
// lends a word of its dynamic stages: its 64 KiB leave no room for static shared memory).
__device__ __forceinline__ bool r4d_last_split(u32* counters, int* last) {
    __threadfence();  // this block's partials visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
        *last = atomicAdd(counter, 1u) == gridDim.z - 1;
        if (*last) *counter = 0u;  // every block of the tile has counted: ready for the next launch
    }
    __syncthreads();
    bool found = *last;
    if (found) __threadfence();
    return found;
}
__device__ __forceinline__ bool r4d_last_split(u32* counters) {
    __shared__ int last;
    return r4d_last_split(counters, &last);
}

// The GEMMs' arguments (gemm_mma.cu, gemm_wgmma.cu): y[M, N] = x[M, K] . w[N, K]^T of one kind.
#define TC_BF16 0
#define TC_E4M3 1

struct TcGemm {
    const void* x;        // bf16 kind: f32 [M, K] (gemm_mma.cu) or its bf16 rows (gemm_wgmma.cu); e4m3: the codes [M, K]
    const float* x_scale; // e4m3: [M]
    const u8* w;          // [N, K] bf16 or e4m3
    const float* w_scale; // e4m3: [N] (w_stride 1) or [1] (w_stride 0)
    int w_stride;
    float* y;             // [M, N]
    float* partial;       // split K: [splits, M, N]
    u32* counters;        // split K: one a tile, zero between launches
    int M, N, K, tiles_per_split;
};

// what an output becomes: the sum itself (bf16), or scaled by its row's and its column's scales
template <int KIND>
__device__ __forceinline__ float tc_finish(const TcGemm& p, int m, int n, float sum) {
    if (KIND == TC_BF16) return sum;
    return (sum * p.x_scale[m]) * p.w_scale[(long long)n * p.w_stride];
}
