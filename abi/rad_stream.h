/* rad_stream.h: what a device row's launch may do on a card, in C. On a card RadArgs.stream points
 * at a RadStreamTable the engine serves (on the host it is NULL): its own queue and the calls that
 * reach it. A launch loads its kernels from a code object the plugin carries, launches them in
 * order, copies and sets memory asynchronously; nothing here allocates (device memory comes from the
 * `scratch` hook) or synchronises, so a step's launches can be captured into a graph and replayed.
 * The engine checks each kernel as it checks its own: at most RAD_MAX_KERNEL_ARG_BYTES of
 * parameters, RAD_MAX_SHARED_BYTES of static + dynamic shared memory, no device printf or assert. */
#ifndef RAD_STREAM_H
#define RAD_STREAM_H

#include "rad_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One code object a plugin carries: built for a card target by nvcc (a cubin) or hipcc/clang (a
 * code object), or RAD_CODE_SOURCE: HIP-flavoured C++ that the engine compiles at run time for the
 * card it has (nvrtc, hiprtc), with the options the plugin passes. */
#define RAD_CODE_SOURCE "source"

typedef struct RadCodeObject {
    const char* target; /* "sm_90", "gfx90a", "gfx1030", or RAD_CODE_SOURCE */
    const void* data;
    int64_t     bytes;
} RadCodeObject;

typedef struct RadStreamTable {
    uint32_t    size;            /* sizeof(RadStreamTable) as the engine filled it */
    const char* vendor;          /* "cuda", "hip" ("fake": the engine's test card, which takes source) */
    const char* target;          /* the card's: "sm_90", "gfx942:sramecc+:xnack-" */
    int32_t     multiprocessors;
    void*       queue;           /* the engine's own queue: hand it back to every call */
    /* A module from a code object's bytes: an ELF the card runs, or source text compiled with
     * `options` (space separated; NULL for none). The same bytes again answer the same module. */
    int (*module)(void* queue, const void* image, int64_t bytes, const char* options, void** module);
    int (*kernel)(void* queue, void* module, const char* name, void** kernel);
    /* `params`: the kernel's parameter block, `bytes` long, laid out as its parameter list;
     * `offsets`: where each parameter starts in it, or NULL for a kernel that takes one struct by
     * value (offset 0, the usual way: fill the struct, pass its address and sizeof). */
    int (*launch)(void* queue, void* kernel, const uint32_t grid[3], const uint32_t block[3],
                  const void* params, int64_t bytes, const uint32_t* offsets, int32_t n_offsets,
                  int64_t shared_bytes);
    int (*copy)(void* queue, void* dst, const void* src, int64_t bytes);    /* device to device */
    int (*memset32)(void* queue, void* dst, uint32_t value, int64_t count); /* count 32-bit words */
    /* The first error since the last call, as one line naming the kernel and the rule, then cleared
     * (hipGetLastError's semantics): its status, or RAD_OK with "" when there was none. */
    int (*last_error)(void* queue, char* message, int64_t bytes);
} RadStreamTable;

/* AMD's generic target a chip's code objects also run as (LLVM's AMDGPU generic targets), or NULL:
 * "gfx10-3-generic" for "gfx1036" or "gfx1036:xnack-". No libc, so it compiles anywhere. */
static inline const char* rad_target_family(const char* target) {
    static const char* const families[][2] = {
        {"gfx9-generic", " gfx900 gfx902 gfx904 gfx906 gfx909 gfx90c "},
        {"gfx9-4-generic", " gfx940 gfx941 gfx942 gfx950 "},
        {"gfx10-1-generic", " gfx1010 gfx1011 gfx1012 gfx1013 "},
        {"gfx10-3-generic", " gfx1030 gfx1031 gfx1032 gfx1033 gfx1034 gfx1035 gfx1036 "},
        {"gfx11-generic", " gfx1100 gfx1101 gfx1102 gfx1103 gfx1150 gfx1151 gfx1152 gfx1153 "},
        {"gfx12-generic", " gfx1200 gfx1201 "},
    };
    for (int f = 0; f < (int)(sizeof families / sizeof families[0]); ++f) {
        for (const char* chips = families[f][1]; *chips; ++chips) {
            if (*chips != ' ') continue;
            const char *want = chips + 1, *have = target;
            while (*want != ' ' && *want && *want == *have) ++want, ++have;
            if (*want == ' ' && want != chips + 1 && (!*have || *have == ':')) return families[f][0];
        }
    }
    return NULL;
}

/* The code object for this card, in the order the card accepts targets: the one built for its
 * target (the chip alone matches too: "gfx942" for "gfx942:sramecc+:xnack-"), then the one built for
 * the chip's family ("gfx10-3-generic" for gfx1036), else the source; NULL when the plugin carries
 * none of them. */
static inline const RadCodeObject* rad_code_object_for(const RadStreamTable* s, const RadCodeObject* objects,
                                                       int32_t n) {
    const RadCodeObject *source = NULL, *generic = NULL;
    const char* family = rad_target_family(s->target);
    for (int32_t i = 0; i < n; ++i) {
        const char *want = objects[i].target, *have = s->target;
        while (*want && *want == *have) ++want, ++have;
        if (!*want && (!*have || *have == ':')) return &objects[i];
        want = objects[i].target, have = family ? family : "";
        while (*want && *want == *have) ++want, ++have;
        if (family && !*want && !*have && !generic) generic = &objects[i];
        want = objects[i].target, have = RAD_CODE_SOURCE;
        while (*want && *want == *have) ++want, ++have;
        if (!*want && !*have && !source) source = &objects[i];
    }
    return generic ? generic : source;
}

#ifdef __cplusplus
}
#endif

#endif
