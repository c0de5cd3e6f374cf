// libr4d device rows: y[M, N] = x[M, K] . w[N, K]^T for the GGUF block types imported as bit-stream
// encodings (docs/ENCODINGS.md; rows_kquants.FORMATS): q4_0, q5_0, q5_1 (blocks of 32) and q2_k,
// q3_k, q4_k, q5_k, q6_k (super-blocks of 256), the planes read as stored; and their embedding.
// Entries r4d_kq_gemv_<format>_m{1,2,4,8} carry MT activation rows; a launch compiles its format's
// entries (R4D_KQ_ONLY). Decode (M <= 8) is one launch of the entry for M; prefill (M > 8) is the
// m8 entry over grid.z = ceil(M / 8) chunks of 8 rows, each chunk streaming the weight again (from
// the L2 where it fits), so both bands are the same arithmetic.
//
// A weight element is v = (code - zero) * s * d - mn * dm (s, mn: a sub-block's scale and minimum of
// SUB elements; d, dm: the super-block's f16 scale.1 and min.1, or 1 and the f16 scale / min of
// q4_0, q5_0, q5_1). s * d and mn * dm are exact in f32 (an integer of at most 8 bits times an f16),
// so each decoded value is the core decoder's; the dot product is taken per sub-block:
//   y += (s * d) * sum((code - zero) * x) - (mn * dm) * sum(x)
// in f32 with fused multiply-adds (libref's values, another summation order: docs/LIBR4D.md's GEMV
// tolerance).
//
// Work: a warp owns KQ_ROWS consecutive output rows, a block KQ_WARPS warps; lane l takes 32-element
// groups l, l + 32, ... of K. A group of b-bit codes is 4b bytes, contiguous across the warp's lanes,
// loaded in the widest pieces its alignment allows (16 bytes for 4-bit codes, 8 for 2- and 6-bit,
// 4 for 3- and 5-bit) through the read-only cache, so the pieces of one warp's loads share their
// lines. Codes become floats without integer conversion (2^23 + code, less 2^23 + zero: exact).
#ifndef KQ_WARPS
#define KQ_WARPS 4
#endif
#ifndef KQ_ROWS
#define KQ_ROWS 2
#endif

// rows_kquants.FORMATS' codes
#define KQ_Q4_0 1
#define KQ_Q5_0 2
#define KQ_Q5_1 3
#define KQ_Q2_K 4
#define KQ_Q3_K 5
#define KQ_Q4_K 6
#define KQ_Q5_K 7
#define KQ_Q6_K 8

// BITS of a code, SUB elements a scale, ZERO subtracted from a code, MINS: a minimum is subtracted,
// SUPER: an f16 scale.1 (and min.1) per 256, SCALE: how a sub-block's scale is stored (0 f16 per 32,
// 1 u4 per 16, 2 i8 per 16, 3 u6 per 32)
template <int F> struct KQ;
template <> struct KQ<KQ_Q4_0> { enum { BITS = 4, SUB = 32, ZERO = 8, MINS = 0, SUPER = 0, SCALE = 0 }; };
template <> struct KQ<KQ_Q5_0> { enum { BITS = 5, SUB = 32, ZERO = 16, MINS = 0, SUPER = 0, SCALE = 0 }; };
template <> struct KQ<KQ_Q5_1> { enum { BITS = 5, SUB = 32, ZERO = 0, MINS = 1, SUPER = 0, SCALE = 0 }; };
template <> struct KQ<KQ_Q2_K> { enum { BITS = 2, SUB = 16, ZERO = 0, MINS = 1, SUPER = 1, SCALE = 1 }; };
template <> struct KQ<KQ_Q3_K> { enum { BITS = 3, SUB = 16, ZERO = 4, MINS = 0, SUPER = 1, SCALE = 2 }; };
template <> struct KQ<KQ_Q4_K> { enum { BITS = 4, SUB = 32, ZERO = 0, MINS = 1, SUPER = 1, SCALE = 3 }; };
template <> struct KQ<KQ_Q5_K> { enum { BITS = 5, SUB = 32, ZERO = 0, MINS = 1, SUPER = 1, SCALE = 3 }; };
template <> struct KQ<KQ_Q6_K> { enum { BITS = 6, SUB = 16, ZERO = 32, MINS = 0, SUPER = 1, SCALE = 2 }; };

struct KqWeight {
    const u8* codes;   // [N, K * BITS / 8]
    const u8* scale;   // f16 [N, K / 32] | u4, i8 [N, K / 16] | u6 [N, K / 32]
    const u8* scale1;  // f16 [N, K / 256] (k-quants)
    const u8* mn;      // as scale (q5_1: f16, holding -m; q2_k: u4; q4_k, q5_k: u6)
    const u8* mn1;     // f16 [N, K / 256] (q2_k, q4_k, q5_k)
};

// an f16 of a plane as f32: the card's conversion instruction on NVIDIA (exact, as r4d_f16 is)
__device__ __forceinline__ float kq_f16(const u8* plane, long long i) {
    u16 h = __ldg((const u16*)plane + i);
#if defined(__CUDA_ARCH__) && !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return r4d_f16(h);
#endif
}

// element i of a little-endian stream of 6-bit values
__device__ __forceinline__ u32 kq_u6(const u8* plane, long long i) {
    long long bit = 6 * i;
    u32 lo = __ldg(plane + (bit >> 3)), shift = (u32)(bit & 7);
    if (shift > 2) lo |= (u32)__ldg(plane + (bit >> 3) + 1) << 8;
    return (lo >> shift) & 63u;
}

// the 4 * BITS bytes of 32-element group g of row n as words (BITS words)
template <int BITS>
__device__ __forceinline__ void kq_group(const u8* codes, long long n, int K, int g, u32* word) {
    const u8* p = codes + n * ((long long)K * BITS / 8) + (long long)g * 4 * BITS;
    if (BITS == 4) {
        uint4 v = __ldg((const uint4*)p);
        word[0] = v.x; word[1] = v.y; word[2] = v.z; word[3] = v.w;
    } else if (BITS == 2 || BITS == 6) {
#pragma unroll
        for (int i = 0; i < BITS / 2; ++i) {
            uint2 v = __ldg((const uint2*)p + i);
            word[2 * i] = v.x; word[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < BITS; ++i) word[i] = __ldg((const u32*)p + i);
    }
}

// code i (a constant after unrolling) of a group as the float code - ZERO, exactly
template <int BITS, int ZERO>
__device__ __forceinline__ float kq_code(const u32* word, int i) {
    const int bit = i * BITS, at = bit >> 5, shift = bit & 31;
    u32 v = word[at] >> shift;
    if (shift + BITS > 32) v |= word[at + 1] << (32 - shift);
    return __uint_as_float(0x4B000000u | (v & ((1u << BITS) - 1u))) - (8388608.0f + (float)ZERO);
}

// sub-block h of group g of row n: its scale s * d and minimum mn * dm (both exact in f32)
template <int F>
__device__ __forceinline__ void kq_scales(const KqWeight& w, long long n, int K, int g, int h, float& d, float& m) {
    typedef KQ<F> T;
    long long sub = n * (K / T::SUB) + (long long)g * (32 / T::SUB) + h;
    float s, mn = 0.0f;
    if (T::SCALE == 0) {
        s = kq_f16(w.scale, sub);
        if (T::MINS) mn = kq_f16(w.mn, sub);
    } else if (T::SCALE == 1) {
        u32 sb = __ldg(w.scale + (sub >> 1)), mb = __ldg(w.mn + (sub >> 1)), shift = (u32)(sub & 1) * 4;
        s = (float)((sb >> shift) & 15u);
        mn = (float)((mb >> shift) & 15u);
    } else if (T::SCALE == 2) {
        s = (float)(signed char)__ldg(w.scale + sub);
    } else {
        s = (float)kq_u6(w.scale, sub);
        mn = (float)kq_u6(w.mn, sub);
    }
    if (T::SUPER) {
        long long super = n * (K / 256) + g / 8;
        s = s * kq_f16(w.scale1, super);
        if (T::MINS) mn = mn * kq_f16(w.mn1, super);
    }
    d = s;
    m = mn;
}

template <int F, int MT>
__device__ void kq_gemv(const float* x, int M, int K, const KqWeight& w, float* y, int N) {
    typedef KQ<F> T;
    const int S = 32 / T::SUB;  // sub-blocks a group
    int lane = threadIdx.x % R4D_WARP, warp = threadIdx.x / R4D_WARP;
    long long first = ((long long)blockIdx.x * KQ_WARPS + warp) * KQ_ROWS;
    int m0 = blockIdx.z * MT;  // this chunk's first activation row
    const int groups = K / 32;
    long long row[KQ_ROWS];
#pragma unroll
    for (int r = 0; r < KQ_ROWS; ++r) row[r] = min(first + r, (long long)N - 1);  // past N: row N-1, stored nowhere
#if defined(__CUDA_ARCH__) && !defined(__HIPCC_RTC__) && !defined(__HIP_PLATFORM_AMD__)
    // the first two rounds of each row's codes asked into the L2 before waiting on the kernel this one
    // is chained to: weights depend on no kernel, so a chained GEMV streams while that one drains
    if (first < N)
#pragma unroll
        for (int r = 0; r < KQ_ROWS; ++r)
            for (int g = lane; g < min(groups, 2 * R4D_WARP); g += R4D_WARP)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(w.codes + row[r] * ((long long)K * T::BITS / 8) +
                                                              (long long)g * 4 * T::BITS));
#endif
    R4D_CHAIN_PROLOGUE();
    if (first >= N) return;
    const float* xr[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) xr[m] = x + (long long)min(m0 + m, M - 1) * K;
    float acc[KQ_ROWS][MT];
#pragma unroll
    for (int r = 0; r < KQ_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
#pragma unroll 2
    for (int g = lane; g < groups; g += R4D_WARP) {
        u32 word[KQ_ROWS][T::BITS];
#pragma unroll
        for (int r = 0; r < KQ_ROWS; ++r) kq_group<T::BITS>(w.codes, row[r], K, g, word[r]);
        float d[KQ_ROWS][S], mn[KQ_ROWS][S];
#pragma unroll
        for (int r = 0; r < KQ_ROWS; ++r)
#pragma unroll
            for (int h = 0; h < S; ++h) kq_scales<F>(w, row[r], K, g, h, d[r][h], mn[r][h]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const float4* xv = (const float4*)(xr[m] + (long long)g * 32);
#pragma unroll
            for (int h = 0; h < S; ++h) {
                float part[KQ_ROWS], xs = 0.0f;
#pragma unroll
                for (int r = 0; r < KQ_ROWS; ++r) part[r] = 0.0f;
#pragma unroll
                for (int j = h * (T::SUB / 4); j < (h + 1) * (T::SUB / 4); ++j) {
                    float4 a = __ldg(xv + j);
                    if (T::MINS) xs += (a.x + a.y) + (a.z + a.w);
#pragma unroll
                    for (int r = 0; r < KQ_ROWS; ++r) {
                        float p = part[r];
                        p = __fmaf_rn(a.x, kq_code<T::BITS, T::ZERO>(word[r], 4 * j), p);
                        p = __fmaf_rn(a.y, kq_code<T::BITS, T::ZERO>(word[r], 4 * j + 1), p);
                        p = __fmaf_rn(a.z, kq_code<T::BITS, T::ZERO>(word[r], 4 * j + 2), p);
                        p = __fmaf_rn(a.w, kq_code<T::BITS, T::ZERO>(word[r], 4 * j + 3), p);
                        part[r] = p;
                    }
                }
#pragma unroll
                for (int r = 0; r < KQ_ROWS; ++r) {
                    float a = __fmaf_rn(d[r][h], part[r], acc[r][m]);
                    acc[r][m] = T::MINS ? __fmaf_rn(-mn[r][h], xs, a) : a;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < KQ_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float total = r4d_warp_sum(acc[r][m]);
            if (lane == 0 && first + r < N && m0 + m < M) y[(long long)(m0 + m) * N + first + r] = total;
        }
}

// y[m, :] = decode(table[ids[m], :]) for the embedding: each value the core decoder's bit for bit,
// (code - zero) * (s * d) - mn * dm with both products exact but the last, as (code - zero) * s * d
// rounds once; a NaN row for an id outside the table (r4d_embedding_dev's rule). Grid
// (ceil(n / blockDim.x), M).
template <int F>
__device__ void kq_embedding(const int* ids, const KqWeight& w, int vocab, int n, float* y) {
    typedef KQ<F> T;
    int m = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    R4D_CHAIN_PROLOGUE();
    if (c >= n) return;
    int id = ids[m];
    float value = __uint_as_float(0x7fc00000u);
    if (id >= 0 && id < vocab) {
        long long bit = ((long long)id * n + c) * T::BITS;  // rows start on a byte: n * BITS is whole bytes
        u32 code = __ldg(w.codes + (bit >> 3)), shift = (u32)(bit & 7);
        if (shift + T::BITS > 8) code |= (u32)__ldg(w.codes + (bit >> 3) + 1) << 8;
        code = (code >> shift) & ((1u << T::BITS) - 1u);
        float d, mn;
        kq_scales<F>(w, id, n, c / 32, (c % 32) / T::SUB, d, mn);
        value = ((float)code - (float)T::ZERO) * d;
        if (T::MINS) value = value - mn;
    }
    y[(long long)m * n + c] = value;
}

#define KQ_EMBEDDING(F, NAME)                                                                                     \
    extern "C" __global__ void NAME(const int* ids, const u8* codes, const u8* scale, const u8* scale1,          \
                                    const u8* mn, const u8* mn1, int vocab, int n, float* y) {                    \
        KqWeight w = {codes, scale, scale1, mn, mn1};                                                             \
        kq_embedding<F>(ids, w, vocab, n, y);                                                                     \
    }

#define KQ_ENTRY(F, MT, NAME)                                                                                     \
    extern "C" __global__ void __launch_bounds__(KQ_WARPS * R4D_WARP) NAME(                                         \
        const float* x, int M, int K, const u8* codes, const u8* scale, const u8* scale1, const u8* mn,           \
        const u8* mn1, float* y, int N) {                                                                         \
        KqWeight w = {codes, scale, scale1, mn, mn1};                                                             \
        kq_gemv<F, MT>(x, M, K, w, y, N);                                                                         \
    }

// A launch compiles only its format's entries, the GEMVs and the embedding (-DR4D_KQ_ONLY=code,
// device_gguf_rows.options); 0 (a
// reader, the AMD build test, the fake card's compiler) sees every entry
#ifndef R4D_KQ_ONLY
#define R4D_KQ_ONLY 0
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q4_0
KQ_ENTRY(KQ_Q4_0, 1, r4d_kq_gemv_q4_0_m1)
KQ_ENTRY(KQ_Q4_0, 2, r4d_kq_gemv_q4_0_m2)
KQ_ENTRY(KQ_Q4_0, 4, r4d_kq_gemv_q4_0_m4)
KQ_ENTRY(KQ_Q4_0, 8, r4d_kq_gemv_q4_0_m8)
KQ_EMBEDDING(KQ_Q4_0, r4d_kq_embedding_q4_0)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q5_0
KQ_ENTRY(KQ_Q5_0, 1, r4d_kq_gemv_q5_0_m1)
KQ_ENTRY(KQ_Q5_0, 2, r4d_kq_gemv_q5_0_m2)
KQ_ENTRY(KQ_Q5_0, 4, r4d_kq_gemv_q5_0_m4)
KQ_ENTRY(KQ_Q5_0, 8, r4d_kq_gemv_q5_0_m8)
KQ_EMBEDDING(KQ_Q5_0, r4d_kq_embedding_q5_0)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q5_1
KQ_ENTRY(KQ_Q5_1, 1, r4d_kq_gemv_q5_1_m1)
KQ_ENTRY(KQ_Q5_1, 2, r4d_kq_gemv_q5_1_m2)
KQ_ENTRY(KQ_Q5_1, 4, r4d_kq_gemv_q5_1_m4)
KQ_ENTRY(KQ_Q5_1, 8, r4d_kq_gemv_q5_1_m8)
KQ_EMBEDDING(KQ_Q5_1, r4d_kq_embedding_q5_1)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q2_K
KQ_ENTRY(KQ_Q2_K, 1, r4d_kq_gemv_q2_k_m1)
KQ_ENTRY(KQ_Q2_K, 2, r4d_kq_gemv_q2_k_m2)
KQ_ENTRY(KQ_Q2_K, 4, r4d_kq_gemv_q2_k_m4)
KQ_ENTRY(KQ_Q2_K, 8, r4d_kq_gemv_q2_k_m8)
KQ_EMBEDDING(KQ_Q2_K, r4d_kq_embedding_q2_k)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q3_K
KQ_ENTRY(KQ_Q3_K, 1, r4d_kq_gemv_q3_k_m1)
KQ_ENTRY(KQ_Q3_K, 2, r4d_kq_gemv_q3_k_m2)
KQ_ENTRY(KQ_Q3_K, 4, r4d_kq_gemv_q3_k_m4)
KQ_ENTRY(KQ_Q3_K, 8, r4d_kq_gemv_q3_k_m8)
KQ_EMBEDDING(KQ_Q3_K, r4d_kq_embedding_q3_k)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q4_K
KQ_ENTRY(KQ_Q4_K, 1, r4d_kq_gemv_q4_k_m1)
KQ_ENTRY(KQ_Q4_K, 2, r4d_kq_gemv_q4_k_m2)
KQ_ENTRY(KQ_Q4_K, 4, r4d_kq_gemv_q4_k_m4)
KQ_ENTRY(KQ_Q4_K, 8, r4d_kq_gemv_q4_k_m8)
KQ_EMBEDDING(KQ_Q4_K, r4d_kq_embedding_q4_k)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q5_K
KQ_ENTRY(KQ_Q5_K, 1, r4d_kq_gemv_q5_k_m1)
KQ_ENTRY(KQ_Q5_K, 2, r4d_kq_gemv_q5_k_m2)
KQ_ENTRY(KQ_Q5_K, 4, r4d_kq_gemv_q5_k_m4)
KQ_ENTRY(KQ_Q5_K, 8, r4d_kq_gemv_q5_k_m8)
KQ_EMBEDDING(KQ_Q5_K, r4d_kq_embedding_q5_k)
#endif
#if R4D_KQ_ONLY == 0 || R4D_KQ_ONLY == KQ_Q6_K
KQ_ENTRY(KQ_Q6_K, 1, r4d_kq_gemv_q6_k_m1)
KQ_ENTRY(KQ_Q6_K, 2, r4d_kq_gemv_q6_k_m2)
KQ_ENTRY(KQ_Q6_K, 4, r4d_kq_gemv_q6_k_m4)
KQ_ENTRY(KQ_Q6_K, 8, r4d_kq_gemv_q6_k_m8)
KQ_EMBEDDING(KQ_Q6_K, r4d_kq_embedding_q6_k)
#endif
