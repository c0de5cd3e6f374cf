/* spechub_math.h: the arithmetic both of spechub's rows run, one text for the host oracle
 * (ref_spechub.cpp) and the device kernels (spechub.hip), so the two agree bit for bit by
 * construction: nothing here calls a math library (exp is our own, Cody-Waite and a Taylor
 * polynomial), every sum runs in index order in f64, and every build turns FMA contraction off
 * (-ffp-contract=off on the host and for hipcc/hiprtc, --fmad=false for nvcc/nvrtc): a fused
 * multiply-add in these ordered mass sums would move a token off the host reference.
 *
 * Plain C that nvcc, hipcc, nvrtc and hiprtc take with no headers of their own.
 *
 * The distribution of a row of logits l at temperature t > 0: z_i = l_i / t (f32), zmax their
 * maximum, w_i = sh_exp(z_i - zmax) in f64, W = w_0 + w_1 + ... in index order, p_i = w_i / W. At
 * t = 0 it is the first maximum's one-hot. A draw with uniform u takes the first i whose running
 * sum of weights exceeds u * W. Uniforms are numpy's Philox4x64-10 first double:
 * Generator(Philox(key=seed, counter=[c0, c1, c2, 0])).random(). */
#ifndef SPECHUB_MATH_H
#define SPECHUB_MATH_H

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__CUDACC_RTC__) || defined(__HIPCC_RTC__)
#define SH_FN __device__ static inline
#else
#define SH_FN static inline
#endif

typedef unsigned long long sh_u64;
typedef long long sh_i64;

/* The kernels' parameter blocks: the host row fills one and the device row passes it by value. */
typedef struct ShPropose {
    const float* logits;       /* [rows, vocab], logits_pitch floats apart */
    const float* temperature;  /* [rows] */
    const sh_u64* rng;         /* [rows, 2]: seed, counter */
    int* tokens;               /* [rows] */
    float* probs;              /* [rows, vocab], probs_pitch floats apart: the draft distribution q */
    sh_i64 vocab, rows, logits_pitch, probs_pitch;
} ShPropose;

typedef struct ShVerify {
    const float* logits;       /* [rows * (k + 1), vocab]: the target's, k + 1 positions a sequence */
    const int* drafts;         /* [rows, k] */
    const float* probs;        /* [rows * k, vocab]: each draft's q */
    const float* temperature;  /* [rows] */
    const sh_u64* rng;         /* [rows, 2] */
    int* tokens;               /* [rows, k + 1]: the accepted drafts, then the target's token, then -1 */
    int* accepted;             /* [rows]: tokens emitted, 1 to k + 1 */
    sh_i64 vocab, rows, k, logits_pitch, probs_pitch;
} ShVerify;

/* ---- a uniform double: numpy's Philox4x64-10 -------------------------------------------------- */

SH_FN sh_u64 sh_mulhi(sh_u64 a, sh_u64 b) {
    sh_u64 a0 = a & 0xffffffffull, a1 = a >> 32, b0 = b & 0xffffffffull, b1 = b >> 32;
    sh_u64 low = a0 * b0, mid1 = a1 * b0, mid2 = a0 * b1;
    sh_u64 carry = ((low >> 32) + (mid1 & 0xffffffffull) + (mid2 & 0xffffffffull)) >> 32;
    return a1 * b1 + (mid1 >> 32) + (mid2 >> 32) + carry;
}

/* The first double of Philox(key=seed, counter=[c0, c1, c2, 0]): the counter is incremented once
 * (a 256-bit add with carry) before its first block, whose first word gives (w >> 11) * 2^-53. */
SH_FN double sh_uniform(sh_u64 seed, sh_u64 c0, sh_u64 c1, sh_u64 c2) {
    sh_u64 c3 = 0;
    c0 += 1;
    if (c0 == 0 && ++c1 == 0 && ++c2 == 0) ++c3;
    sh_u64 k0 = seed, k1 = 0;
    for (int round = 0; round < 10; ++round) {
        sh_u64 hi0 = sh_mulhi(0xD2E7470EE14C6C93ull, c0), lo0 = 0xD2E7470EE14C6C93ull * c0;
        sh_u64 hi1 = sh_mulhi(0xCA5A826395121157ull, c2), lo1 = 0xCA5A826395121157ull * c2;
        sh_u64 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
        k0 += 0x9E3779B97F4A7C15ull, k1 += 0xBB67AE8584CAA73Bull;
    }
    return (double)(c0 >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- exp(x) for x <= 0 ----------------------------------------------------------------------- */

SH_FN double sh_pow2(int k) { /* 2^k, -1022 <= k <= 1023 */
    union { sh_u64 bits; double value; } v;
    v.bits = (sh_u64)(k + 1023) << 52;
    return v.value;
}

SH_FN double sh_exp(double x) {
    if (x < -708.0) return 0.0; /* below the normal range: spechub's weight is 0 there */
    double kd = x * 1.4426950408889634;
    int k = (int)(kd < 0 ? kd - 0.5 : kd + 0.5);
    double r = (x - (double)k * 6.93147180369123816490e-01) - (double)k * 1.90821492927058770002e-10;
    double p = 1.0 / 479001600.0; /* the Taylor polynomial of degree 12, Horner form */
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return p * sh_pow2(k);
}

/* ---- one row's distribution ------------------------------------------------------------------ */

SH_FN sh_i64 sh_argmax(const float* l, sh_i64 n) { /* the first maximum */
    sh_i64 best = 0;
    for (sh_i64 i = 1; i < n; ++i)
        if (l[i] > l[best]) best = i;
    return best;
}

SH_FN float sh_zmax(const float* l, sh_i64 n, float t) {
    float best = l[0] / t;
    for (sh_i64 i = 1; i < n; ++i) {
        float z = l[i] / t;
        if (z > best) best = z;
    }
    return best;
}

SH_FN double sh_weight(const float* l, sh_i64 i, float t, float zmax) {
    return sh_exp((double)(l[i] / t) - (double)zmax);
}

SH_FN double sh_total(const float* l, sh_i64 n, float t, float zmax) {
    double total = 0.0;
    for (sh_i64 i = 0; i < n; ++i) total += sh_weight(l, i, t, zmax);
    return total;
}

/* The first i whose running sum of weights exceeds u * total (the last where rounding runs out). */
SH_FN sh_i64 sh_draw(const float* l, sh_i64 n, float t, float zmax, double total, double u) {
    double threshold = u * total, running = 0.0;
    for (sh_i64 i = 0; i < n; ++i) {
        running += sh_weight(l, i, t, zmax);
        if (running > threshold) return i;
    }
    return n - 1;
}

/* ---- the two ops, one row (propose) or one sequence (verify) at a time ----------------------- */

/* The draft token of row r and its distribution q: the first maximum and its one-hot at t = 0,
 * else a draw with u(seed, [counter, 1, 0]) and q_i = f32(w_i / W). */
SH_FN void sh_propose_row(const ShPropose* p, sh_i64 r) {
    const float* l = p->logits + r * p->logits_pitch;
    float* q = p->probs + r * p->probs_pitch;
    float t = p->temperature[r];
    if (!(t > 0.0f)) {
        sh_i64 best = sh_argmax(l, p->vocab);
        for (sh_i64 i = 0; i < p->vocab; ++i) q[i] = i == best ? 1.0f : 0.0f;
        p->tokens[r] = (int)best;
        return;
    }
    float zmax = sh_zmax(l, p->vocab, t);
    double total = sh_total(l, p->vocab, t, zmax);
    for (sh_i64 i = 0; i < p->vocab; ++i) q[i] = (float)(sh_weight(l, i, t, zmax) / total);
    p->tokens[r] = (int)sh_draw(l, p->vocab, t, zmax, total, sh_uniform(p->rng[2 * r], p->rng[2 * r + 1], 1, 0));
}

/* A draft d at position j is accepted where u(seed, [counter, 2, j]) * q_d < p_d (at t = 0: where it
 * is the target's first maximum). The first rejected position takes a draw from the residual
 * max(0, p_i - q_i) with u(seed, [counter, 3, j]) (from p where the residual is empty; at t = 0 the
 * first maximum); with every draft accepted, position k adds a draw from p with u(seed, [counter, 3, k]). */
SH_FN void sh_verify_row(const ShVerify* v, sh_i64 s) {
    sh_i64 n = v->vocab, k = v->k;
    float t = v->temperature[s];
    sh_u64 seed = v->rng[2 * s], counter = v->rng[2 * s + 1];
    int* out = v->tokens + s * (k + 1);
    for (sh_i64 j = 0; j <= k; ++j) out[j] = -1;
    for (sh_i64 j = 0; j <= k; ++j) {
        const float* l = v->logits + (s * (k + 1) + j) * v->logits_pitch;
        if (!(t > 0.0f)) {
            int best = (int)sh_argmax(l, n);
            out[j] = best;
            if (j == k || v->drafts[s * k + j] != best) {
                v->accepted[s] = (int)(j + 1);
                return;
            }
            continue;
        }
        float zmax = sh_zmax(l, n, t);
        double total = sh_total(l, n, t, zmax);
        if (j == k) {
            out[j] = (int)sh_draw(l, n, t, zmax, total, sh_uniform(seed, counter, 3, (sh_u64)j));
            v->accepted[s] = (int)(k + 1);
            return;
        }
        int d = v->drafts[s * k + j];
        const float* q = v->probs + (s * k + j) * v->probs_pitch;
        double p_d = sh_weight(l, d, t, zmax) / total;
        if (sh_uniform(seed, counter, 2, (sh_u64)j) * (double)q[d] < p_d) {
            out[j] = d;
            continue;
        }
        double residual = 0.0;
        for (sh_i64 i = 0; i < n; ++i) {
            double r = sh_weight(l, i, t, zmax) / total - (double)q[i];
            residual += r > 0.0 ? r : 0.0;
        }
        double u = sh_uniform(seed, counter, 3, (sh_u64)j);
        int token = (int)(n - 1);
        if (residual > 0.0) {
            double threshold = u * residual, running = 0.0;
            for (sh_i64 i = 0; i < n; ++i) {
                double r = sh_weight(l, i, t, zmax) / total - (double)q[i];
                running += r > 0.0 ? r : 0.0;
                if (running > threshold) {
                    token = (int)i;
                    break;
                }
            }
        } else {
            token = (int)sh_draw(l, n, t, zmax, total, u);
        }
        out[j] = token;
        v->accepted[s] = (int)(j + 1);
        return;
    }
}

#endif
