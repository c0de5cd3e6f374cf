/* rad_plugin.h: helpers every plugin needs. Their definitions ship with the engine; the Python
 * mirror (radiance.abi) has the same names. */
#ifndef RAD_PLUGIN_H
#define RAD_PLUGIN_H

#include "rad_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Operand i, or NULL when it is absent (a null RadTensor.data). */
const RadTensor* rad_arg_in(const RadArgs* a, int i);

int64_t rad_tensor_rows(const RadTensor* t);      /* product of every dim but the last */
int64_t rad_tensor_lastdim(const RadTensor* t);
int64_t rad_tensor_row_pitch(const RadTensor* t); /* bytes between rows */
int32_t rad_dtype_bits(int32_t dtype);

int64_t     rad_args_geti(const RadArgs* a, const char* key);
double      rad_args_getf(const RadArgs* a, const char* key);
const char* rad_args_gets(const RadArgs* a, const char* key);
int64_t     rad_args_geti_or(const RadArgs* a, const char* key, int64_t fallback);
double      rad_args_getf_or(const RadArgs* a, const char* key, double fallback);
const char* rad_args_gets_or(const RadArgs* a, const char* key, const char* fallback);

/* Element i of a row of any core dtype, as f32 (round-to-nearest-even when narrowing), or as bits. */
float    rad_load_f32(const void* row, int32_t dtype, int64_t i);
void     rad_store_f32(void* row, int32_t dtype, int64_t i, float v);
uint64_t rad_load_bits(const void* row, int32_t dtype, int64_t i);
void     rad_store_bits(void* row, int32_t dtype, int64_t i, uint64_t bits);

/* A weight stored as the container holds it, decoded to f32 [rows, cols] by the engine's core
 * decoder (plain and affine schemes); RAD_E_UNSUPPORTED for another scheme. */
int rad_weight_f32(const RadWeightPlanes* weight, float* out);

/* Wait until *word >= value without burning a core another rank needs; 0, or RAD_E_DEVICE on
 * timeout_ns elapsed (0 = forever). */
int rad_wait_word(const volatile uint64_t* word, uint64_t value, uint64_t timeout_ns);

#ifdef __cplusplus
}
#endif

#endif
