/* rad_abi.h: include this. Return RAD_ABI_VERSION from rad_plugin_abi_version(); the engine refuses
 * a plugin built against another version, printing both numbers and the file. */
#ifndef RAD_ABI_H
#define RAD_ABI_H

#define RAD_ABI_VERSION 33

#include "rad_types.h"
#include "rad_encoding.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Required of every plugin. */
uint32_t             rad_plugin_abi_version(void);
const RadPluginInfo* rad_plugin_info(void);

/* Required of a kernel library. */
int                  rad_kernel_schema_count(void);
const RadOpSchema*   rad_kernel_schema_at(int i);
int                  rad_kernel_count(void);
const RadKernelInfo* rad_kernel_at(int i);

/* Optional, resolved by exact name. */
int  rad_plugin_open(void);             /* RAD_E_UNSUPPORTED declines this machine */
void rad_plugin_close(void);
int  rad_plugin_reference(void);        /* 1: an oracle library, ranked last */
int  rad_kernel_reference(int i);       /* 1: row i is an oracle row */
int  rad_kernel_concurrent(int i);      /* 1: touches only its operands and scratch */
int  rad_kernel_collective(int i);      /* 1 or 2 (colour 2 ends its own link-gate hold) */
int  rad_kernel_chain(int i);           /* 1: waits in its own prologue (name has r4dchain) */
double rad_kernel_tolerance(int i);    /* row i's agreement with libref, max|y - ref| / max|ref| over an
                                          output (0: the same bits); negative: its op's tolerance */

#ifdef __cplusplus
}
#endif

#endif
