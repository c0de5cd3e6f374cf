/* q4_0: GGUF's Q4_0 as a quantiser in C (abi/rad_quant.h is the whole contract). Per group of
 * `group` columns: d = m / -8, where m is the group's value of largest magnitude (its sign kept),
 * stored as f16; code = min(15, trunc(w / d + 8.5)), a u4; w' = (code - 8) * d. That is ggml's
 * quantize_row_q4_0 (its 1/d in f32, its f32 arithmetic), so a row quantised here decodes to what
 * gguf-py's Q4_0 gives, bit for bit. The encoding is the core's `affine` (radiance's formats.q4_0:
 * u4 codes, one u8 zero of 8 for the whole weight, f16 scale a group), so the core decodes it and
 * every kernel library that reads q4_0 serves it; no decode hook is needed. */
#include <math.h>
#include <string.h>

#include "rad_plugin.h"
#include "rad_quant.h"

uint32_t rad_plugin_abi_version(void) { return RAD_ABI_VERSION; }

const RadPluginInfo* rad_plugin_info(void) {
    static const RadPluginInfo info = {RAD_PLUGIN_QUANT, "q4_0", "0.1", "GGUF's Q4_0, in C", RAD_BUILD_TARGET};
    return &info;
}

static int64_t option(const RadParam* options, int32_t n, const char* key, int64_t fallback) {
    for (int32_t i = 0; i < n; ++i)
        if (strcmp(options[i].key, key) == 0) return options[i].i;
    return fallback;
}

/* The planes live in the plugin: the engine copies the encoding it is handed. */
static RadPlane planes[3] = {
    {"codes", RAD_DT_U4, RAD_PLANE_TILED, 1, 1, 0, 0},
    {"zero", RAD_DT_U8, RAD_PLANE_TILED, 0, 0, 0, 0}, /* one value for the whole weight: 8 */
    {"scale", RAD_DT_F16, RAD_PLANE_TILED, 1, 32, 0, 0},
};

static int encoding(const char* weight, const int64_t* shape, int32_t ndim, const RadParam* options,
                    int32_t n_options, RadEncoding* out) {
    (void)weight, (void)shape, (void)ndim;
    int64_t group = option(options, n_options, "group", 32);
    if (group < 1 || group % 2) return RAD_E_INVALID;
    planes[2].block_cols = group;
    out->scheme = "affine", out->transform = "", out->vec = 1, out->n_planes = 3, out->planes = planes;
    return RAD_OK;
}

/* The zero plane covers the whole weight, so the whole weight comes in one call. */
static int64_t row_block(const RadEncoding* enc, const int64_t* shape, int32_t ndim) {
    (void)enc, (void)shape, (void)ndim;
    return 0;
}

static int quantize(const RadEncoding* enc, const float* rows, int64_t r0, int64_t n, int64_t cols,
                    const RadParam* options, int32_t n_options, RadTensor* out, int32_t n_planes) {
    (void)r0, (void)options, (void)n_options;
    if (n_planes != 3) return RAD_E_INVALID;
    int64_t group = enc->planes[2].block_cols;
    RadTensor *codes = &out[0], *zero = &out[1], *scale = &out[2];
    rad_store_bits(zero->data, RAD_DT_U8, 0, 8);
    for (int64_t r = 0; r < n; ++r) {
        const float* w = rows + r * cols;
        char* code_row = (char*)codes->data + r * codes->pitch[0];
        char* scale_row = (char*)scale->data + r * scale->pitch[0];
        for (int64_t g = 0; g * group < cols; ++g) {
            int64_t start = g * group, stop = start + group < cols ? start + group : cols;
            float amax = 0.0f, max = 0.0f;
            for (int64_t j = start; j < stop; ++j)
                if (fabsf(w[j]) > amax) amax = fabsf(w[j]), max = w[j];
            const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            rad_store_f32(scale_row, RAD_DT_F16, g, d);
            for (int64_t j = start; j < stop; ++j) {
                int q = (int)(w[j] * id + 8.5f);
                rad_store_bits(code_row, RAD_DT_U4, j, (uint64_t)(q < 15 ? q : 15));
            }
        }
    }
    return RAD_OK;
}

static const RadQuantOption options[] = {{"group", RAD_P_INT, "32", "columns that share one scale (even)"}};

static const RadQuantizerInfo quantizers[] = {{
    "q4_0", "w = (code - 8) * scale: u4 codes, an f16 scale a group, as GGUF's Q4_0", options, 1, encoding,
    row_block, quantize, NULL,
}};

int rad_quant_count(void) { return 1; }
const RadQuantizerInfo* rad_quant_at(int i) { return i == 0 ? &quantizers[0] : NULL; }
