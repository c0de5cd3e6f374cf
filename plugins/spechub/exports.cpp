// spechub's export block: everything the engine resolves by name. Copy this file to start a
// kernel library of your own; the rest of spechub is what the tables below point at.
#include "spechub.h"

extern "C" {

uint32_t rad_plugin_abi_version(void) { return RAD_ABI_VERSION; }  // the macro: a mismatch is refused

const RadPluginInfo* rad_plugin_info(void) {
    // RAD_BUILD_TARGET: what rad_add_plugin built the device code for ("host sm_90 cuda hip", ...)
    static const RadPluginInfo info = {RAD_PLUGIN_KERNEL, "spechub", "0.1",
                                       "multi-token-prediction draft and verify (speculative decoding)",
                                       RAD_BUILD_TARGET};
    return &info;
}

int rad_kernel_schema_count(void) { return 2; }
const RadOpSchema* rad_kernel_schema_at(int i) { return i >= 0 && i < 2 ? &spechub_schemas[i] : nullptr; }
int rad_kernel_count(void) { return 4; }
const RadKernelInfo* rad_kernel_at(int i) { return i >= 0 && i < 4 ? &spechub_rows[i] : nullptr; }

// The device rows (0, 1) serve; the host rows (2, 3) are the oracle, so the reference gate keeps
// them out of serving unless asked and never refuses the device rows.
int rad_kernel_reference(int i) { return i >= 2; }

// Each launch touches only its own operands.
int rad_kernel_concurrent(int i) { (void)i; return 1; }

}  // extern "C"
