/* libr4d: an operand as native.Header hands it over, and a row-major view of it. One definition
 * for every C file built into the library (r4d.c, r4d_kquants.c, r4d_gemma.c). Return codes are
 * RAD_OK / RAD_E_SHAPE / RAD_E_INVALID's values. */
#ifndef R4D_VIEW_H
#define R4D_VIEW_H

#include <stdint.h>

/* An operand: shaped like the head of numpy's PyArrayObject (PyObject_HEAD, then data, nd,
 * dimensions, strides); native.Header fills it from a numpy array. */
typedef struct {
    intptr_t refcnt;
    void *type;
    char *data;
    int nd;
    int64_t *dims;
    int64_t *strides;
} Arr;

typedef struct {
    char *p;
    int64_t rows;
    int64_t pitch; /* bytes from one row to the next */
} Mat;

/* a row-major [rows, cols] view of elements of `esz` bytes, at least `need` rows: 0, -3 (shape)
 * or -4 (no data) */
static int mat(const Arr *a, int64_t cols, int64_t esz, int64_t need, Mat *m) {
    if (!a || !a->data) return -4;
    if (a->nd >= 2) {
        int nd = a->nd;
        if (a->dims[nd - 1] != cols || a->strides[nd - 1] != esz) return -3;
        int64_t rows = 1;
        for (int i = 0; i < nd - 1; i++) rows *= a->dims[i];
        /* outer dimensions must stack rows evenly */
        for (int i = 0; i < nd - 2; i++)
            if (a->dims[i] > 1 && a->strides[i] != a->dims[i + 1] * a->strides[i + 1]) return -3;
        m->rows = rows;
        m->pitch = a->strides[nd - 2];
    } else if (a->nd == 1) {
        if (a->strides[0] != esz || a->dims[0] % cols) return -3;
        m->rows = a->dims[0] / cols;
        m->pitch = cols * esz;
    } else {
        return -3;
    }
    if (m->rows < need) return -3;
    m->p = a->data;
    return 0;
}

#define ROW(m, i, T) ((T *)((m).p + (int64_t)(i) * (m).pitch))

#endif
