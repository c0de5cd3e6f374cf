// spechub's own declarations, shared by its three C++ files.
#pragma once

#include "rad_plugin.h"
#include "spechub_math.h"

// The two ops' schemas and the four rows (spechub.cpp).
extern const RadOpSchema spechub_schemas[2];
extern const RadKernelInfo spechub_rows[4];

// The arguments of a launch, read into a kernel's parameter block (spechub.cpp). RAD_OK, or the
// status that refuses them.
int spechub_propose_args(const RadArgs* a, ShPropose* p);
int spechub_verify_args(const RadArgs* a, ShVerify* v);

// The host oracle (ref_spechub.cpp).
int spechub_ref_propose(const RadArgs* a);
int spechub_ref_verify(const RadArgs* a);
