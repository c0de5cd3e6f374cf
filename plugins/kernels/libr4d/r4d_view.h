/* libr4d: an operand as the Python side hands it over (r4d.c's Arr, native.Header) and a row-major
 * [rows, cols] f32 view of it, shared by r4d_kquants.c and r4d_gemma.c (r4d.c's own mat() is the
 * same check). Return codes are RAD_OK / RAD_E_SHAPE / RAD_E_INVALID's values. */
#ifndef R4D_VIEW_H
#define R4D_VIEW_H

#include <stdint.h>

typedef struct {
    intptr_t refcnt;
    void *type;
    char *data;
    int nd;
    int64_t *dims;
    int64_t *strides;
} ViewArr;

typedef struct {
    char *p;
    int64_t rows, pitch;
} ViewMat;

/* a row-major [rows, cols] f32 view with at least `need` rows: 0, -3 (shape) or -4 (no data) */
static int view_mat(const ViewArr *a, int64_t cols, int64_t need, ViewMat *m) {
    if (!a || !a->data) return -4;
    if (a->nd >= 2) {
        const int nd = a->nd;
        if (a->dims[nd - 1] != cols || a->strides[nd - 1] != 4) return -3;
        int64_t rows = 1;
        for (int i = 0; i < nd - 1; i++) rows *= a->dims[i];
        for (int i = 0; i < nd - 2; i++)
            if (a->dims[i] > 1 && a->strides[i] != a->dims[i + 1] * a->strides[i + 1]) return -3;
        m->rows = rows;
        m->pitch = a->strides[nd - 2];
    } else if (a->nd == 1) {
        if (a->strides[0] != 4 || a->dims[0] % cols) return -3;
        m->rows = a->dims[0] / cols;
        m->pitch = cols * 4;
    } else {
        return -3;
    }
    if (m->rows < need) return -3;
    m->p = a->data;
    return 0;
}

#define VIEW_ROW(m, i) ((float *)((m).p + (int64_t)(i) * (m).pitch))

#endif
