// libr4d device rows: the streamed GEMM, y[M, N] = x[M, K] . w[N, K]^T for the few activation rows
// of a batched decode step (M = 9..64, between gemv.cu's 8 and the tile GEMMs), after
// tensor_core.cu (mma.sync m16n8k16 bf16, f32 accumulation; NVIDIA from sm_80, e4m3 weights from
// sm_89). device_streamed_gemm.py holds its geometry, device_batch_rows.py launches it.
//
// Why not a tile GEMM: at M <= 64 a step is bound by the weights' bytes (2 bytes a weight, 2 M
// flops), so the kernel is a GEMV that multiplies on tensor cores: every weight byte is read from
// HBM once, straight into registers (no shared-memory round trip, a 256-byte L2 fetch a request),
// and x, the small operand, is what goes through shared memory, once per block for all its warps.
// The MMA is "swapped": the weights are the A operand (m16: 16 weight rows a tile) and x is B
// (n8: 8 activation rows an n-tile, MT / 8 of them), so no MMA lane is wasted at M = 16 or 32.
//
// Work: a block owns GS_ROWS = 16 GS_TILES GS_WARPS consecutive weight rows (a warp GS_TILES tiles
// of 16) and one chunk of K (gridDim.z > 1 splits K; each split's sums go to the scratch, and
// r4d_streamed_reduce, launched after, adds them in split order over the whole card: a row block's
// last block adding them itself, as gemv.cu does, would read splits x M x 256 rows of partials on
// one multiprocessor, 512 KB at M = 64 and 8 splits, longer than the GEMM's own part). A k-step is
// 4 E elements of every row (E = 8 GS_CHUNKS bf16 or 16 e4m3: GS_CHUNKS or one 16-byte loads a lane
// a row): lane (g, t) loads the step's E elements t of its rows g and g + 8 of each tile. A dot
// product may add its k in any order, so those E elements fill the lane's k slots of E / 4 MMAs
// (MMA q: elements 4q .. 4q + 3 of the lane's E; slots 2t, 2t + 1 the first two, 2t + 8, 2t + 9
// the last two), and x's B fragments take the same elements of x's rows (16 bytes of bf16 a lane
// an n-tile for 2 MMAs), as gemv.cu's tensor-core path does. GS_PIPE steps of weights stay in
// flight a lane, the first loaded before the chain's wait (the weights are no kernel's output).
//
// x: f32 rows read by the block GS_STAGE elements of K at a time, rounded to bf16 (nearest even,
// the tensor-core GEMM rows' contract) into one of two shared-memory stages: stage s + 1 sits in
// registers while stage s's MMAs run and is stored after them, so its L2 latency hides under a
// stage of MMAs; one barrier a stage. Rows of a stage are padded so a warp's 16-byte reads (rows g,
// bytes 16 t of a 4 E-element window) hit every bank once a quarter warp.
#ifndef GS_WARPS
#define GS_WARPS 8
#endif
#ifndef GS_TILES
#define GS_TILES 2      // m16 tiles of weight rows a warp owns
#endif
#ifndef GS_STAGE
#define GS_STAGE 64     // K elements of x a shared-memory stage holds (a multiple of 64: a whole e4m3 step)
#endif
#ifndef GS_PIPE
#define GS_PIPE 2       // k-steps of weights a lane keeps in flight
#endif
#ifndef GS_CHUNKS
#define GS_CHUNKS 1     // bf16: 16-byte chunks a lane takes of a row a step (2: a row's 4 lanes read 128 bytes)
#endif
#define GS_THREADS (32 * GS_WARPS)
#define GS_ROWS (16 * GS_TILES * GS_WARPS)
// warps a multiprocessor the registers are held to (__launch_bounds__): MT = 64's accumulators, and
// e4m3's decoded fragments at MT = 32, leave room for 8 warps; the others for 16
// (device_streamed_gemm's blocks_a_multiprocessor). A name an entry passes: parentheses in its
// __launch_bounds__ would hide the entry from the fake card's reading of the source.
#define GS_8_WARPS (8 / GS_WARPS)
#define GS_16_WARPS (16 / GS_WARPS)
#if GS_WARPS < 1 || GS_WARPS > 8 || GS_TILES < 1 || GS_TILES > 2 || GS_STAGE % 64 || GS_STAGE > 256 || GS_PIPE < 1 || \
    GS_PIPE > 4 || GS_CHUNKS < 1 || GS_CHUNKS > 2
#error "gemm_streamed.cu: a cut outside what the kernel is written for (device_streamed_gemm.StreamedCut says which)"
#endif

#define GS_BF16 0       // the weights' kinds: bf16, e4m3 with an f32 scale a row (w_stride 1) or for all (0)
#define GS_E4M3 1

// streamed once: no L1 allocation, a 256-byte L2 fetch (the host model: a plain load)
__device__ __forceinline__ uint4 gs_stream16(const u8* p) {
    uint4 v;
#if defined(__CUDA_ARCH__)
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    v = *(const uint4*)p;
#endif
    return v;
}

// four e4m3 codes (a word, the lowest k in the low byte) as two bf16x2 words, exactly (every e4m3
// value is a bf16 value): lo = elements 0, 1; hi = 2, 3
__device__ __forceinline__ void gs_e4m3_bf16(u32 word, u32& lo, u32& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    u32 h0, h1;  // e4m3x2 -> f16x2 (exact), then each f16 -> f32 -> bf16 (exact)
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h0) : "h"((unsigned short)(word & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h1) : "h"((unsigned short)(word >> 16)));
    float f[4];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f[0]) : "h"((unsigned short)(h0 & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f[1]) : "h"((unsigned short)(h0 >> 16)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f[2]) : "h"((unsigned short)(h1 & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f[3]) : "h"((unsigned short)(h1 >> 16)));
    lo = (__float_as_uint(f[0]) >> 16) | (__float_as_uint(f[1]) & 0xffff0000u);
    hi = (__float_as_uint(f[2]) >> 16) | (__float_as_uint(f[3]) & 0xffff0000u);
#else
    float f[4];
    for (int i = 0; i < 4; ++i) f[i] = r4d_fp8((word >> (8 * i)) & 0xffu);
    lo = (__float_as_uint(f[0]) >> 16) | (__float_as_uint(f[1]) & 0xffff0000u);
    hi = (__float_as_uint(f[2]) >> 16) | (__float_as_uint(f[3]) & 0xffff0000u);
#endif
}

template <int KIND, int MT>
__device__ void gs_gemm(const float* x, const u8* w, const float* w_scale, int w_stride, float* y, float* partial,
                        int M, int N, int K, int k_chunk) {
    enum {
        EB = KIND == GS_BF16 ? 2 : 1,   // bytes a weight
        CH = KIND == GS_BF16 ? GS_CHUNKS : 1,  // 16-byte chunks a lane a row a step (e4m3: one, 16 elements)
        E = 16 * CH / EB,               // elements a lane takes of a row a step: 8 or 16
        STEP = 4 * E,                   // K elements a step
        MMAS = E / 4,                   // MMAs a step a (tile, n-tile)
        STEPS = GS_STAGE / STEP,        // steps a stage
        NT = MT / 8,                    // n-tiles
        PAD = E == 8 ? 32 : 8,          // bf16 elements after each stage row: row strides of 64 or 16 bytes mod 128
        WIDTH = GS_STAGE + PAD,         // a stage row's elements
        FLOAT4S = MT * GS_STAGE / 4,    // x's float4s a stage
        LOADS = (FLOAT4S + GS_THREADS - 1) / GS_THREADS,
    };
    __shared__ uint4 gs_words[2 * MT * WIDTH / 8];  // the stages, 16-byte aligned: [2][MT][WIDTH] bf16
    u16 (*gs_x)[MT][WIDTH] = reinterpret_cast<u16 (*)[MT][WIDTH]>(gs_words);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    long long base = (long long)blockIdx.x * GS_ROWS + warp * 16 * GS_TILES;  // the warp's first weight row
    int k_begin = (int)blockIdx.z * k_chunk, k_end = min(K, k_begin + k_chunk);
    int steps = (k_end - k_begin + STEP - 1) / STEP, stages = (k_end - k_begin + GS_STAGE - 1) / GS_STAGE;
    const u8* rows[GS_TILES][2];  // the lane's rows g and g + 8 of each tile (past N: row N - 1, stored nowhere)
#pragma unroll
    for (int i = 0; i < GS_TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            rows[i][h] = w + min(base + 16 * i + 8 * h + g, (long long)N - 1) * K * EB + (long long)(k_begin + t * E) * EB;
    // the weights' first steps, before waiting on the kernel this one is chained to
    uint4 v[GS_PIPE][GS_TILES][2][CH];
#pragma unroll
    for (int p = 0; p < GS_PIPE; ++p)
#pragma unroll
        for (int i = 0; i < GS_TILES; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int c = 0; c < CH; ++c)
                    v[p][i][h][c] = k_begin + p * STEP + t * E + 8 * c < k_end ? gs_stream16(rows[i][h] + p * STEP * EB + 16 * c)
                                                                              : make_uint4(0u, 0u, 0u, 0u);
    R4D_CHAIN_PROLOGUE();
    // x's stage `s` into registers: float4 j of thread i is float4 i + j GS_THREADS of the stage,
    // row / (GS_STAGE / 4), column % (GS_STAGE / 4); past M or the chunk: zeros
    float4 staged[LOADS];
    auto load_stage = [&](int s) {
#pragma unroll
        for (int j = 0; j < LOADS; ++j) {
            int f = threadIdx.x + j * GS_THREADS, m = f / (GS_STAGE / 4), k = k_begin + s * GS_STAGE + f % (GS_STAGE / 4) * 4;
            staged[j] = f < FLOAT4S && m < M && k < k_end && s < stages ? __ldg((const float4*)(x + (long long)m * K + k))
                                                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    auto store_stage = [&](int s) {
#pragma unroll
        for (int j = 0; j < LOADS; ++j) {
            int f = threadIdx.x + j * GS_THREADS;
            if (f < FLOAT4S)
                *(uint2*)&gs_x[s & 1][f / (GS_STAGE / 4)][f % (GS_STAGE / 4) * 4] =
                    make_uint2(r4d_bf16x2(staged[j].x, staged[j].y), r4d_bf16x2(staged[j].z, staged[j].w));
        }
    };
    load_stage(0);
    store_stage(0);
    load_stage(1);
    __syncthreads();
    float d[GS_TILES][NT][4];
#pragma unroll
    for (int i = 0; i < GS_TILES; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) d[i][j][0] = d[i][j][1] = d[i][j][2] = d[i][j][3] = 0.0f;
    for (int s0 = 0; s0 < steps; s0 += GS_PIPE) {
#pragma unroll
        for (int p = 0; p < GS_PIPE; ++p) {
            int s = s0 + p;
            if (s >= steps) break;  // the same for the whole block
            if (s > 0 && s % STEPS == 0) {
                // stage s / STEPS begins: every warp is past stage s / STEPS - 2's reads (the last
                // barrier), so its buffer takes the registers' stage; the barrier makes it whole;
                // then the stage after it into the registers, to land under this stage's MMAs
                store_stage(s / STEPS);
                __syncthreads();
                load_stage(s / STEPS + 1);
            }
            // this step's weights (rows g and g + 8 of each tile); the slot refilled GS_PIPE steps ahead
            u32 lo[GS_TILES][4 * CH], hi[GS_TILES][4 * CH];  // the lane's words of rows g, g + 8, in k order
#pragma unroll
            for (int i = 0; i < GS_TILES; ++i)
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    lo[i][4 * c] = v[p][i][0][c].x; lo[i][4 * c + 1] = v[p][i][0][c].y;
                    lo[i][4 * c + 2] = v[p][i][0][c].z; lo[i][4 * c + 3] = v[p][i][0][c].w;
                    hi[i][4 * c] = v[p][i][1][c].x; hi[i][4 * c + 1] = v[p][i][1][c].y;
                    hi[i][4 * c + 2] = v[p][i][1][c].z; hi[i][4 * c + 3] = v[p][i][1][c].w;
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        v[p][i][h][c] = k_begin + (s + GS_PIPE) * STEP + t * E + 8 * c < k_end
                                            ? gs_stream16(rows[i][h] + (long long)(s + GS_PIPE) * STEP * EB + 16 * c)
                                            : make_uint4(0u, 0u, 0u, 0u);
                }
            const u16* stage = &gs_x[(s / STEPS) & 1][0][(s % STEPS) * STEP + t * E];
            // 16 bytes of x (8 elements) a lane an n-tile feed MMAs q = 2c and 2c + 1: their A
            // fragments first (e4m3: decoded to bf16 here, two MMAs' worth live at a time)
#pragma unroll
            for (int c = 0; c < E / 8; ++c) {
                u32 a[GS_TILES][2][4];
#pragma unroll
                for (int i = 0; i < GS_TILES; ++i)
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        int q = 2 * c + r;
                        if (KIND == GS_BF16) {
                            a[i][r][0] = lo[i][2 * q]; a[i][r][2] = lo[i][2 * q + 1];
                            a[i][r][1] = hi[i][2 * q]; a[i][r][3] = hi[i][2 * q + 1];
                        } else {
                            gs_e4m3_bf16(lo[i][q], a[i][r][0], a[i][r][2]);
                            gs_e4m3_bf16(hi[i][q], a[i][r][1], a[i][r][3]);
                        }
                    }
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    uint4 chunk = *(const uint4*)(stage + (8 * j + g) * WIDTH + 8 * c);  // x row 8j + g
                    u32 b[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
                    for (int r = 0; r < 2; ++r)
#pragma unroll
                        for (int i = 0; i < GS_TILES; ++i) r4d_mma_bf16(d[i][j], a[i][r], b + 2 * r);
                }
            }
        }
    }
    // C: lane (g, t) holds (weight row 16 i + g, x rows 8 j + 2 t, + 1) and weight row 16 i + g + 8's
    // same; split: this split's sums into partial[split][M][N], for r4d_streamed_reduce
    bool split = gridDim.z > 1;
#pragma unroll
    for (int i = 0; i < GS_TILES; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                long long n = base + 16 * i + 8 * (c >> 1) + g;
                int m = 8 * j + 2 * t + (c & 1);
                if (m >= M || n >= N) continue;
                if (split) partial[((long long)blockIdx.z * M + m) * N + n] = d[i][j][c];
                else y[(long long)m * N + n] = KIND == GS_BF16 ? d[i][j][c] : d[i][j][c] * w_scale[n * w_stride];
            }
}

#define GS_ENTRY(KIND, MT, BLOCKS, NAME)                                                                          \
    extern "C" __global__ void __launch_bounds__(GS_THREADS, BLOCKS) NAME(const float* x, const u8* w,         \
                                                                          const float* w_scale, int w_stride,  \
                                                                          float* y, float* partial, int M,     \
                                                                          int N, int K, int k_chunk) {         \
        gs_gemm<KIND, MT>(x, w, w_scale, w_stride, y, partial, M, N, K, k_chunk);                             \
    }

// The splits' sums of a split launch, y = sum over s in order of partial[s] (then e4m3's row scale,
// w_scale[n * w_stride]; bf16: w_scale null), 4 outputs of the flattened [M, N] a thread (one where
// M N % 4 != 0), a grid-stride loop; every split's 16 bytes loaded before the sum, so a thread keeps
// up to GS_MAX_SPLITS loads in flight.
#define GS_MAX_SPLITS 16  // device_streamed_gemm.MAX_SPLITS
extern "C" __global__ void __launch_bounds__(256) r4d_streamed_reduce(const float* partial, const float* w_scale,
                                                                      int w_stride, float* y, int M, int N, int splits) {
    R4D_CHAIN_PROLOGUE();
    long long count = (long long)M * N, plane = count;
    bool quads = count % 4 == 0;  // every split's plane starts 16-byte aligned
    long long units = quads ? count / 4 : count;
    for (long long u = blockIdx.x * (long long)blockDim.x + threadIdx.x; u < units; u += (long long)gridDim.x * blockDim.x) {
        if (quads) {
            float4 part[GS_MAX_SPLITS];
#pragma unroll
            for (int s = 0; s < GS_MAX_SPLITS; ++s)
                if (s < splits) part[s] = __ldcg((const float4*)(partial + s * plane) + u);
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int s = 0; s < GS_MAX_SPLITS; ++s)
                if (s < splits) { sum.x += part[s].x; sum.y += part[s].y; sum.z += part[s].z; sum.w += part[s].w; }
            float out[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                long long at = 4 * u + e;
                y[at] = w_scale ? out[e] * w_scale[(at % N) * w_stride] : out[e];
            }
        } else {
            float sum = 0.0f;
            for (int s = 0; s < splits; ++s) sum += __ldcg(partial + s * plane + u);
            y[u] = w_scale ? sum * w_scale[(u % N) * w_stride] : sum;
        }
    }
}

// One entry a compile (-DGS_ONLY=1..6, device_streamed_gemm.options; 0: all, the compile tests)
#ifndef GS_ONLY
#define GS_ONLY 0
#endif
#if GS_ONLY == 0 || GS_ONLY == 1
GS_ENTRY(GS_BF16, 16, GS_16_WARPS, r4d_streamed_gemm_bf16_m16)
#endif
#if GS_ONLY == 0 || GS_ONLY == 2
GS_ENTRY(GS_BF16, 32, GS_16_WARPS, r4d_streamed_gemm_bf16_m32)
#endif
#if GS_ONLY == 0 || GS_ONLY == 3
GS_ENTRY(GS_BF16, 64, GS_8_WARPS, r4d_streamed_gemm_bf16_m64)
#endif
#if GS_ONLY == 0 || GS_ONLY == 4
GS_ENTRY(GS_E4M3, 16, GS_16_WARPS, r4d_streamed_gemm_e4m3_m16)
#endif
#if GS_ONLY == 0 || GS_ONLY == 5
GS_ENTRY(GS_E4M3, 32, GS_8_WARPS, r4d_streamed_gemm_e4m3_m32)
#endif
#if GS_ONLY == 0 || GS_ONLY == 6
GS_ENTRY(GS_E4M3, 64, GS_8_WARPS, r4d_streamed_gemm_e4m3_m64)
#endif
