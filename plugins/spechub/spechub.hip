// spechub's device kernels: one thread walks one row (propose) or one sequence (verify) through
// spechub_math.h, the very text the host oracle runs, so the device rows agree with it bit for bit.
// The ordered f64 sums are the point of the example, not speed: a row is serial by definition.
// Built ahead of time by nvcc (--fmad=false) and hipcc (-ffp-contract=off), or at run time from
// the source the plugin carries (nvrtc, hiprtc, with the same options).
#include "spechub_math.h"

extern "C" __global__ void spechub_propose(ShPropose p) {
    sh_i64 r = (sh_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < p.rows) sh_propose_row(&p, r);
}

extern "C" __global__ void spechub_verify(ShVerify v) {
    sh_i64 s = (sh_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (s < v.rows) sh_verify_row(&v, s);
}
