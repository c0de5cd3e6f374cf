/* rad_quant.h: the whole contract of a quantiser plugin (kind RAD_PLUGIN_QUANT). */
#ifndef RAD_QUANT_H
#define RAD_QUANT_H

#include "rad_abi.h"

typedef struct RadQuantOption {
    const char* key;
    int32_t     type;  /* RAD_P_INT | RAD_P_F64 | RAD_P_STR */
    const char* deflt; /* the default, as text */
    const char* doc;
} RadQuantOption;

/* The encoding this quantiser would write for a weight of this name and shape. */
typedef int (*RadQuantEncodingFn)(const char* weight, const int64_t* shape, int32_t ndim,
                                  const RadParam* options, int32_t n_options, RadEncoding* out);
/* Rows handed to one quantize() call; 0 = the whole weight. */
typedef int64_t (*RadQuantRowBlockFn)(const RadEncoding* enc, const int64_t* shape, int32_t ndim);
/* Logical rows [r0, r0+n) of the f32 source -> the canonical planes of those rows. */
typedef int (*RadQuantizeFn)(const RadEncoding* enc, const float* rows, int64_t r0, int64_t n,
                             int64_t cols, const RadParam* options, int32_t n_options,
                             RadTensor* planes_out, int32_t n_planes);
/* Only for a scheme of its own; RAD_E_UNSUPPORTED for an encoding it did not write. */
typedef int (*RadQuantDecodeFn)(const RadEncoding* enc, const RadTensor* planes, int32_t n_planes,
                                float* out, int64_t rows, int64_t cols);

typedef struct RadQuantizerInfo {
    const char*           name; /* what a recipe names */
    const char*           doc;
    const RadQuantOption* options;
    int32_t               n_options;
    RadQuantEncodingFn    encoding;
    RadQuantRowBlockFn    row_block;
    RadQuantizeFn         quantize;
    RadQuantDecodeFn      decode;
} RadQuantizerInfo;

int                     rad_quant_count(void);
const RadQuantizerInfo* rad_quant_at(int i);

#endif
