/* rad_encoding.h: a weight's encoding as data, so a plugin can invent one and the core can size,
 * slice and place any encoding from the struct alone.
 *
 *   q = code | grid[code][k] | table[code];  q = -q if signed;  q -= zero;
 *   v = q * scale * scale.1 * ...;  v -= min * min.1 * ...;  w = v . T^-1 (per row, over columns)
 */
#ifndef RAD_ENCODING_H
#define RAD_ENCODING_H

#include <stdint.h>

#define RAD_PLANE_TILED 1 /* covers the weight: element (i,j) covers a [block_rows, block_cols] block */
#define RAD_PLANE_TABLE 2 /* a codebook, grid or rotation parameter; every slice carries it whole   */

#define RAD_MAX_PLANES 16

typedef struct RadPlane {
    const char* name;       /* codes, grid, table, signs, zero, scale, scale.1, min, min.1, t.perm ... */
    int32_t     dtype;      /* RAD_DT_* */
    int32_t     kind;       /* RAD_PLANE_TILED or RAD_PLANE_TABLE */
    int64_t     block_rows; /* TILED: rows one element covers; 0 = the whole extent */
    int64_t     block_cols; /* TILED: columns one element covers; 0 = the whole extent */
    int64_t     rows;       /* TABLE: its shape */
    int64_t     cols;
} RadPlane;

typedef struct RadEncoding {
    const char*     scheme;    /* "plain", "affine", or a quantiser's own (decoded by its hook) */
    const char*     transform; /* "", "fwhtN" (e.g. "fwht32"), "perm", "givens" */
    int32_t         vec;       /* V: values per code through a grid; 1 otherwise */
    int32_t         n_planes;
    const RadPlane* planes;
} RadEncoding;

#endif
