// libr4d device rows: helpers every source shares (device_kernels.py puts this text in front of each
// op's source). HIP-flavoured CUDA C++: nvrtc and hiprtc both take it, no headers needed.
// Numerics: f32, IEEE round-to-nearest-even; the device layer compiles with --fmad=false, so every
// a*b+c below is a rounded product then a rounded sum, as libref computes.
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
#define R4D_WARP 64
#define R4D_SHFL_XOR(v, o) __shfl_xor((v), (o))
#else
#define R4D_WARP 32
#define R4D_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#endif

// Every kernel's first statement. A chained (r4dchain) row's kernels are programmatic dependent
// launches on Hopper: this waits until the kernel before it has finished and its writes are visible,
// then lets the next kernel launch while this one runs. Launched plainly, both are no-ops.
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define R4D_CHAIN_PROLOGUE() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define R4D_CHAIN_PROLOGUE() do { } while (0)
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// weight formats, the codes of rows.FORMAT_CODES
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q8_0 3
#define FMT_Q4_1 4
// OCP e4m3 codes with an f32 scale per row (FMT_FP8_ROW) or for the whole weight (device_formats.py)
#define FMT_FP8_ROW 5
#define FMT_FP8_TENSOR 6

__device__ __forceinline__ float r4d_bf16(u32 bits) { return __uint_as_float(bits << 16); }

__device__ __forceinline__ float r4d_f16(u32 h) {
    u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    float v;
    if (e == 0) v = (float)m * 5.9604644775390625e-8f;             // subnormal: m * 2^-24, exact
    else if (e == 31) v = __uint_as_float(0x7f800000u | (m << 13)); // inf / nan
    else v = __uint_as_float(((e + 112u) << 23) | (m << 13));
    return __uint_as_float(__float_as_uint(v) | sign);
}

// An OCP e4m3 code as f32, exactly: its sign, exponent and mantissa bits moved into an f32 whose
// exponent is 120 short (127 - 7), then scaled by 2^120, a power of two. A subnormal code becomes an
// f32 subnormal and scales exactly too. The NaN codes (0x7f, 0xff) read as 480 here (and as NaN
// through r4d_fp8x4's conversion on NVIDIA cards): no quantiser writes them.
__device__ __forceinline__ float r4d_fp8(u32 b) { return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f; }
// a norm's weight at k as stored: f32, bf16 or f16 (fmt: FMT_F32, FMT_BF16, FMT_F16)
__device__ __forceinline__ float r4d_norm_weight(const u8* weight, int fmt, int k) {
    return fmt == FMT_F32 ? ((const float*)weight)[k]
         : fmt == FMT_BF16 ? r4d_bf16(((const u16*)weight)[k]) : r4d_f16(((const u16*)weight)[k]);
}
// v as bf16 bits, rounded to nearest even (cvt.rn.bf16.f32's for every finite value and infinity; a
// NaN stays a NaN), on any card
__device__ __forceinline__ u32 r4d_bf16_bits(float v) {
    u32 b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40u;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

// The four e4m3 codes of a word (the lowest byte first) as f32, the values r4d_fp8 gives. On NVIDIA
// cards from sm_89 (R4D_FP8_CVT, on unless a build says 0) the card converts two codes at a time to
// f16x2, exactly (every e4m3 value is an f16), then each f16 to f32: 1.5 instructions a code where
// r4d_fp8 takes about six (two shifts, two masks and the multiply by 2^120, per code), which made
// the fp8 decode GEMV at M = 1 bound by instruction issue rather than by the bytes it reads.
#ifndef R4D_FP8_CVT
#define R4D_FP8_CVT 1
#endif
__device__ __forceinline__ void r4d_fp8x4(u32 word, float* w) {
#if R4D_FP8_CVT && !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 c01, c23, h0, h1, h2, h3;\n\t.reg .b32 p01, p23;\n\t"
        "mov.b32 {c01, c23}, %4;\n\t"
        "cvt.rn.f16x2.e4m3x2 p01, c01;\n\t"  // the upper code into the upper half
        "cvt.rn.f16x2.e4m3x2 p23, c23;\n\t"
        "mov.b32 {h0, h1}, p01;\n\t"
        "mov.b32 {h2, h3}, p23;\n\t"
        "cvt.f32.f16 %0, h0;\n\tcvt.f32.f16 %1, h1;\n\tcvt.f32.f16 %2, h2;\n\tcvt.f32.f16 %3, h3;\n\t}"
        : "=f"(w[0]), "=f"(w[1]), "=f"(w[2]), "=f"(w[3]) : "r"(word));
#else
    for (int i = 0; i < 4; ++i) w[i] = r4d_fp8((word >> (8 * i)) & 0xffu);
#endif
}

__device__ __forceinline__ float r4d_warp_sum(float v) {
    for (int o = R4D_WARP / 2; o > 0; o >>= 1) v += R4D_SHFL_XOR(v, o);
    return v;
}

// cos and sin of an angle in f64, rounded once to f32 (rope's arithmetic: one range reduction for both)
__device__ __forceinline__ void r4d_cos_sin(float angle, float& c, float& s) {
    double sd, cd;
    sincos((double)angle, &sd, &cd);
    c = (float)cd;
    s = (float)sd;
}

// silu(g) * u as libref computes it: the sigmoid in f64 rounded once to f32 (silu_mul, and every
// fused row's epilogue of it, give the same bits)
__device__ __forceinline__ float r4d_silu_mul(float g, float u) {
    float sig = (float)(1.0 / (1.0 + exp(-(double)g)));
    return (g * sig) * u;
}

__device__ __forceinline__ float r4d_warp_max(float v) {
    for (int o = R4D_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, R4D_SHFL_XOR(v, o));
    return v;
}

// Sum over the block (any blockDim.x up to 1024); every thread gets the total. `shared` holds 32 floats.
__device__ float r4d_block_sum(float v, float* shared) {
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP, warps = (blockDim.x + R4D_WARP - 1) / R4D_WARP;
    v = r4d_warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += shared[w];
    return total;
}

// A value another block of this launch wrote (its writes fenced, then counted): read at L2, past
// this SM's L1. Not volatile: independent loads stay in flight together.
__device__ __forceinline__ float r4d_load_l2(const float* p) {
#if defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
    return __builtin_nontemporal_load(p);
#else
    return __ldcg(p);
#endif
}

// The 128-byte line at p asked into the L2, nothing waiting on it (AMD and the host model: no
// prefetch; the load that follows fetches it)
__device__ __forceinline__ void r4d_prefetch_l2(const void* p) {
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

// (a, ia) ranks before (b, ib) in np.argmax's order: the larger value, a NaN above everything, the
// lower index among equals
__device__ __forceinline__ bool r4d_better(float a, int ia, float b, int ib) {
    bool na = a != a, nb = b != b;
    if (na != nb) return na;
    if (na || a == b) return ia < ib;
    return a > b;
}

// The sum of squares of a row in the order every rmsnorm of libr4d's device rows uses, so a norm
// folded into another kernel computes the standalone row's bits: lane l adds the elements of
// 4-element chunks l, l + R4D_WARP, ... in order, then the warp's tree. One warp; every lane gets it.
// Rows of a multiple of 4 (every model's hidden size) load 8 chunks at a time, so the one warp is
// not waiting on one load after another; the order of the sum is the same.
__device__ __forceinline__ float r4d_row_squares(const float* row, int n) {
    int lane = threadIdx.x % R4D_WARP;
    float sum = 0.0f;
    if (n % 4 == 0 && ((unsigned long long)row & 15) == 0) {
        const float4* chunks = (const float4*)row;
        int count = n / 4, c = lane;
        for (; c + 7 * R4D_WARP < count; c += 8 * R4D_WARP) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) v[u] = chunks[c + u * R4D_WARP];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                sum += v[u].x * v[u].x; sum += v[u].y * v[u].y; sum += v[u].z * v[u].z; sum += v[u].w * v[u].w;
            }
        }
        for (; c < count; c += R4D_WARP) {
            float4 v = chunks[c];
            sum += v.x * v.x; sum += v.y * v.y; sum += v.z * v.z; sum += v.w * v.w;
        }
        return r4d_warp_sum(sum);
    }
    for (int c = lane * 4; c < n; c += R4D_WARP * 4)
        for (int i = c; i < min(c + 4, n); ++i) sum += row[i] * row[i];
    return r4d_warp_sum(sum);
}

// One element of a weight as the core decoder computes it: code*scale (q8_0; fp8, an f32 scale),
// code*scale - min (q4_1, where min holds -m), or the plain value. Planes row-major as the container stores them.
struct R4DWeight {
    const u8* codes;
    const u16* scale;
    const u16* minimum;
    int fmt, rows, cols;
};

__device__ __forceinline__ float r4d_weight_at(const R4DWeight& w, long long r, int c) {
    switch (w.fmt) {
    case FMT_F32: return ((const float*)w.codes)[r * w.cols + c];
    case FMT_F16: return r4d_f16(((const u16*)w.codes)[r * w.cols + c]);
    case FMT_BF16: return r4d_bf16(((const u16*)w.codes)[r * w.cols + c]);
    case FMT_Q8_0: {
        float q = (float)((const signed char*)w.codes)[r * w.cols + c];
        return q * r4d_f16(w.scale[r * (w.cols / 32) + c / 32]);
    }
    case FMT_FP8_ROW:
    case FMT_FP8_TENSOR:
        return r4d_fp8(w.codes[r * w.cols + c]) * ((const float*)w.scale)[w.fmt == FMT_FP8_ROW ? r : 0];
    default: {
        u8 byte = w.codes[r * ((w.cols + 1) / 2) + c / 2];
        float q = (float)((c & 1) ? (byte >> 4) : (byte & 15));
        long long b = r * (w.cols / 32) + c / 32;
        return q * r4d_f16(w.scale[b]) - r4d_f16(w.minimum[b]);
    }
    }
}

// The count at `counter` before this block's arrival, which releases the block's writes and acquires
// those of the blocks that arrived before it, at the device's scope (the split merges of attention.cu
// and attention_decode.cu). One thread calls it between two
// barriers (the first carries the other threads' writes into the release, the second the acquire
// out to them): one atomic round trip, where a __threadfence() in every thread costs each a
// sequentially consistent fence.
__device__ __forceinline__ u32 r4d_arrive(u32* counter) {
#if !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    u32 before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    return before;
#else
    __threadfence();
    u32 before = atomicAdd(counter, 1u);
    __threadfence();
    return before;
#endif
}
