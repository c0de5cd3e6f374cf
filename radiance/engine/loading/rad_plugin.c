/* The engine's definitions of rad_plugin.h's helpers, which a C plugin calls and never links: the
 * engine builds this file once (radiance/engine/loading/helpers.py) and loads it with RTLD_GLOBAL
 * before it opens any .so plugin, so the dynamic linker binds each plugin's undefined rad_* symbol
 * here, as the specification's engine binary serves them. Every helper computes what radiance.abi's
 * Python helper of the same name computes, bit for bit (tests/test_c_helpers.py holds them to it):
 * narrowing rounds to nearest even, as numpy and ml_dtypes cast. Built with -ffp-contract=off. */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "rad_plugin.h"

/* ---- operands and parameters ------------------------------------------------------------------ */

const RadTensor* rad_arg_in(const RadArgs* a, int i) {
    if (!a || i < 0 || i >= a->n_t || !a->t[i].data) return NULL;
    return &a->t[i];
}

int64_t rad_tensor_rows(const RadTensor* t) {
    int64_t rows = 1;
    for (int32_t d = 0; d + 1 < t->ndim; ++d) rows *= t->shape[d];
    return rows;
}

int64_t rad_tensor_lastdim(const RadTensor* t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

int64_t rad_tensor_row_pitch(const RadTensor* t) { return t->ndim >= 2 ? t->pitch[t->ndim - 2] : 0; }

int32_t rad_dtype_bits(int32_t dtype) {
    switch (dtype) {
    case RAD_DT_F32: case RAD_DT_I32: case RAD_DT_U32: return 32;
    case RAD_DT_F16: case RAD_DT_BF16: case RAD_DT_I16: case RAD_DT_U16: return 16;
    case RAD_DT_F64: case RAD_DT_I64: case RAD_DT_U64: return 64;
    case RAD_DT_I8: case RAD_DT_U8: case RAD_DT_FP8_E4M3: case RAD_DT_FP8_E5M2: return 8;
    case RAD_DT_U1: return 1;
    case RAD_DT_U2: return 2;
    case RAD_DT_U4: case RAD_DT_I4: case RAD_DT_FP4_E2M1: return 4;
    case RAD_DT_U6: return 6;
    default: return 0;
    }
}

static const RadParam* find(const RadArgs* a, const char* key) {
    for (int32_t i = 0; a && key && i < a->n_params; ++i)
        if (a->params[i].key && strcmp(a->params[i].key, key) == 0) return &a->params[i];
    return NULL;
}

/* A missing key reads as 0, 0.0 or NULL; the _or forms say what instead. */
int64_t rad_args_geti_or(const RadArgs* a, const char* key, int64_t fallback) {
    const RadParam* p = find(a, key);
    if (!p) return fallback;
    return p->type == RAD_P_F64 ? (int64_t)p->f : p->i;
}

double rad_args_getf_or(const RadArgs* a, const char* key, double fallback) {
    const RadParam* p = find(a, key);
    if (!p) return fallback;
    return p->type == RAD_P_INT ? (double)p->i : p->f;
}

const char* rad_args_gets_or(const RadArgs* a, const char* key, const char* fallback) {
    const RadParam* p = find(a, key);
    return p && p->type == RAD_P_STR ? p->s : fallback;
}

int64_t rad_args_geti(const RadArgs* a, const char* key) { return rad_args_geti_or(a, key, 0); }
double rad_args_getf(const RadArgs* a, const char* key) { return rad_args_getf_or(a, key, 0.0); }
const char* rad_args_gets(const RadArgs* a, const char* key) { return rad_args_gets_or(a, key, NULL); }

/* ---- elements of any core dtype ---------------------------------------------------------------- */

uint64_t rad_load_bits(const void* row, int32_t dtype, int64_t i) {
    const uint8_t* bytes = (const uint8_t*)row;
    int32_t bits = rad_dtype_bits(dtype);
    uint64_t value = 0;
    if (bits >= 8) {
        memcpy(&value, bytes + i * (bits / 8), (size_t)(bits / 8)); /* little endian */
        return value;
    }
    int64_t start = i * bits;
    int64_t first = start / 8, last = (start + bits - 1) / 8;
    for (int64_t b = last; b >= first; --b) value = (value << 8) | bytes[b];
    return (value >> (start % 8)) & ((1u << bits) - 1);
}

void rad_store_bits(void* row, int32_t dtype, int64_t i, uint64_t value) {
    uint8_t* bytes = (uint8_t*)row;
    int32_t bits = rad_dtype_bits(dtype);
    if (bits >= 8) {
        memcpy(bytes + i * (bits / 8), &value, (size_t)(bits / 8));
        return;
    }
    int64_t start = i * bits, first = start / 8, last = (start + bits - 1) / 8;
    uint64_t window = 0, mask = (((uint64_t)1 << bits) - 1) << (start % 8);
    for (int64_t b = last; b >= first; --b) window = (window << 8) | bytes[b];
    window = (window & ~mask) | ((value << (start % 8)) & mask);
    for (int64_t b = first; b <= last; ++b, window >>= 8) bytes[b] = (uint8_t)window;
}

/* A small binary float: `ebits` exponent bits, `mbits` mantissa bits, bias 2^(ebits-1) - 1.
 * IEEE: the top exponent is inf/NaN. FN (e4m3fn): only S.1111.111 is NaN, no inf, overflow is NaN.
 * SATURATE (e2m1fn): no inf or NaN, overflow saturates, NaN stores as -0 (ml_dtypes' choice). */
enum { IEEE, FN, SATURATE };
typedef struct { int ebits, mbits, kind; } Small;

static const Small F16 = {5, 10, IEEE}, BF16 = {8, 7, IEEE}, E5M2 = {5, 2, IEEE}, E4M3 = {4, 3, FN},
                   E2M1 = {2, 1, SATURATE};

static double small_max(Small f) {
    int bias = (1 << (f.ebits - 1)) - 1;
    int emax = (f.kind == IEEE ? (1 << f.ebits) - 2 : (1 << f.ebits) - 1) - bias;
    double top = f.kind == FN ? 2.0 - 2.0 / (1 << f.mbits) : 2.0 - 1.0 / (1 << f.mbits); /* FN: 1.110 */
    return ldexp(top, emax);
}

static uint32_t small_from_f32(float x, Small f) {
    int bias = (1 << (f.ebits - 1)) - 1, emin = 1 - bias, total = 1 + f.ebits + f.mbits;
    uint32_t sign = signbit(x) ? 1u << (total - 1) : 0, top = (1u << (total - 1)) - 1;
    if (isnan(x)) {
        if (f.kind == SATURATE) return 1u << (total - 1);
        if (f.kind == FN) return sign | top;
        return sign | ((((1u << f.ebits) - 1) << f.mbits) | (1u << (f.mbits - 1)));
    }
    double a = fabs((double)x), max = small_max(f);
    if (a == 0) return sign;
    int e2;
    frexp(a, &e2); /* a = m * 2^e2, m in [0.5, 1): the leading bit's exponent is e2 - 1 */
    int e = e2 - 1 < emin ? emin : e2 - 1;
    double quantum = ldexp(1.0, e - f.mbits);
    double value = nearbyint(a / quantum) * quantum; /* ties to even: the default rounding mode */
    if (isinf(a) || value > max) {
        if (f.kind == SATURATE) value = max;
        else if (f.kind == FN) return sign | top;
        else return sign | (((1u << f.ebits) - 1) << f.mbits);
    }
    if (value < ldexp(1.0, emin)) return sign | (uint32_t)(value / ldexp(1.0, emin - f.mbits));
    frexp(value, &e2);
    uint32_t mant = (uint32_t)(value / ldexp(1.0, e2 - 1 - f.mbits)) - (1u << f.mbits);
    return sign | ((uint32_t)(e2 - 1 + bias) << f.mbits) | mant;
}

static float small_to_f32(uint32_t bits, Small f) {
    int bias = (1 << (f.ebits - 1)) - 1, total = 1 + f.ebits + f.mbits;
    uint32_t exp = (bits >> f.mbits) & ((1u << f.ebits) - 1), mant = bits & ((1u << f.mbits) - 1);
    double sign = (bits >> (total - 1)) & 1 ? -1.0 : 1.0;
    if (f.kind == IEEE && exp == (1u << f.ebits) - 1) return mant ? NAN : (float)(sign * INFINITY);
    if (f.kind == FN && exp == (1u << f.ebits) - 1 && mant == (1u << f.mbits) - 1) return NAN;
    if (exp == 0) return (float)(sign * ldexp((double)mant, 1 - bias - f.mbits));
    return (float)(sign * ldexp((double)(mant | (1u << f.mbits)), (int)exp - bias - f.mbits));
}

float rad_load_f32(const void* row, int32_t dtype, int64_t i) {
    uint64_t b = rad_load_bits(row, dtype, i);
    switch (dtype) {
    case RAD_DT_F32: { float v; uint32_t w = (uint32_t)b; memcpy(&v, &w, 4); return v; }
    case RAD_DT_F64: { double v; memcpy(&v, &b, 8); return (float)v; }
    case RAD_DT_F16: return small_to_f32((uint32_t)b, F16);
    case RAD_DT_BF16: { float v; uint32_t w = (uint32_t)b << 16; memcpy(&v, &w, 4); return v; }
    case RAD_DT_FP8_E4M3: return small_to_f32((uint32_t)b, E4M3);
    case RAD_DT_FP8_E5M2: return small_to_f32((uint32_t)b, E5M2);
    case RAD_DT_FP4_E2M1: return small_to_f32((uint32_t)b, E2M1);
    case RAD_DT_I8: return (float)(int8_t)b;
    case RAD_DT_I16: return (float)(int16_t)b;
    case RAD_DT_I32: return (float)(int32_t)b;
    case RAD_DT_I64: return (float)(int64_t)b;
    case RAD_DT_I4: return (float)(b >= 8 ? (int64_t)b - 16 : (int64_t)b);
    default: return (float)b; /* unsigned integers and codes */
    }
}

void rad_store_f32(void* row, int32_t dtype, int64_t i, float v) {
    uint64_t b;
    switch (dtype) {
    case RAD_DT_F32: { uint32_t w; memcpy(&w, &v, 4); b = w; break; }
    case RAD_DT_F64: { double d = v; memcpy(&b, &d, 8); break; }
    case RAD_DT_F16: b = small_from_f32(v, F16); break;
    case RAD_DT_BF16: b = small_from_f32(v, BF16); break;
    case RAD_DT_FP8_E4M3: b = small_from_f32(v, E4M3); break;
    case RAD_DT_FP8_E5M2: b = small_from_f32(v, E5M2); break;
    case RAD_DT_FP4_E2M1: b = small_from_f32(v, E2M1); break;
    case RAD_DT_U64: b = (uint64_t)v; break;
    default: b = (uint64_t)(int64_t)v; break; /* truncation toward zero, then the type's bits */
    }
    int32_t bits = rad_dtype_bits(dtype);
    rad_store_bits(row, dtype, i, bits >= 64 ? b : b & (((uint64_t)1 << bits) - 1));
}

/* ---- served by the engine ---------------------------------------------------------------------- */

/* The engine's core decoder (plain and affine schemes), handed in through rad_engine_set_decoder
 * when the engine loads this library. */
typedef int (*RadEngineDecodeFn)(const RadWeightPlanes* weight, float* out);
static RadEngineDecodeFn engine_decode;

void rad_engine_set_decoder(RadEngineDecodeFn decode) { engine_decode = decode; }

int rad_weight_f32(const RadWeightPlanes* weight, float* out) {
    if (!weight || !out) return RAD_E_INVALID;
    return engine_decode ? engine_decode(weight, out) : RAD_E_INTERNAL;
}

/* radiance.abi.rad_backoff's pauses: spin, then yield the core, then sleep up to 200 us. */
int rad_wait_word(const volatile uint64_t* word, uint64_t value, uint64_t timeout_ns) {
    struct timespec now, start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long pause_ns = 0;
    for (uint64_t spins = 1;; ++spins) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= value) return RAD_OK;
        if (timeout_ns) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            uint64_t elapsed = (uint64_t)(now.tv_sec - start.tv_sec) * 1000000000ull +
                               (uint64_t)(now.tv_nsec - start.tv_nsec);
            if (elapsed > timeout_ns) return RAD_E_DEVICE;
        }
        if (spins >= 256) {
            pause_ns = pause_ns ? (pause_ns * 2 > 200000 ? 200000 : pause_ns * 2) : 2000;
            struct timespec pause = {0, pause_ns};
            nanosleep(&pause, NULL);
        } else if (spins >= 64) {
            sched_yield();
        }
    }
}
