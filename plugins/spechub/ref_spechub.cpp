// spechub's host oracle: every row (or sequence) in order through spechub_math.h, on the host's
// memory. rad_kernel_reference marks these rows: they serve only with
// --debug-accept-reference-kernels, and they are what the device rows are checked against.
#include "spechub.h"

int spechub_ref_propose(const RadArgs* a) {
    ShPropose p;
    int status = spechub_propose_args(a, &p);
    if (status != RAD_OK) return status;
    for (sh_i64 r = 0; r < p.rows; ++r) sh_propose_row(&p, r);
    return RAD_OK;
}

int spechub_ref_verify(const RadArgs* a) {
    ShVerify v;
    int status = spechub_verify_args(a, &v);
    if (status != RAD_OK) return status;
    for (sh_i64 s = 0; s < v.rows; ++s) sh_verify_row(&v, s);
    return RAD_OK;
}
