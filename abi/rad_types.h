/* rad_types.h: the constants and structs every Radiance plugin compiles against.
 * Mirrored field for field by radiance.abi (tests/test_abi_mirror.py keeps the two equal). */
#ifndef RAD_TYPES_H
#define RAD_TYPES_H

#include <stddef.h>
#include <stdint.h>

struct RadEncoding;

/* Plugin kinds: the folder of a home a plugin is found in. */
#define RAD_PLUGIN_KERNEL 1 /* kernels/       */
#define RAD_PLUGIN_ARCH   2 /* architectures/ */
#define RAD_PLUGIN_QUANT  3 /* quantizers/    */

/* Status codes. Errors are negative; RAD_LAYOUT_ANY and RAD_LINK_ENDED are positive answers. */
#define RAD_OK            0
#define RAD_E_UNSUPPORTED (-1) /* not on this machine / not this encoding / stored as is */
#define RAD_E_DTYPE       (-2) /* this encoding or dtype is not mine                    */
#define RAD_E_SHAPE       (-3) /* this shape is not mine                                */
#define RAD_E_INVALID     (-4) /* malformed arguments                                   */
#define RAD_E_NOMEM       (-5)
#define RAD_E_DEVICE      (-6) /* the card or its runtime failed                        */
#define RAD_E_INTERNAL    (-7)
#define RAD_LAYOUT_ANY    1    /* layout(): reads the bytes uninterpreted, claims no storage */
#define RAD_LINK_ENDED    2    /* launch(): a colour-2 collective ended its link-gate hold   */

/* Where a row runs. */
#define RAD_DOMAIN_HOST   1
#define RAD_DOMAIN_DEVICE 2

/* Constraint operators. LE/GE/EQ make band boundaries; DIV and IN never do. */
#define RAD_C_EQ  1
#define RAD_C_LE  2
#define RAD_C_GE  3
#define RAD_C_DIV 4
#define RAD_C_IN  5

/* Parameter types, requiredness and roles. */
#define RAD_P_INT 1
#define RAD_P_F64 2
#define RAD_P_STR 3

#define RAD_REQUIRED 0
#define RAD_OPTIONAL 1
#define RAD_DERIVED  2 /* supplied by the winning row's RAD_C_EQ */

#define RAD_PROLE_NONE      0
#define RAD_PROLE_SEQ_CHUNK 1 /* the scheduler cuts steps on this parameter        */
#define RAD_PROLE_CAPACITY  2 /* a count the kernel only bounds itself by          */

/* Operand roles. */
#define RAD_OPD_IN     1
#define RAD_OPD_OUT    2
#define RAD_OPD_INOUT  3
#define RAD_OPD_WEIGHT 4
#define RAD_OPD_WTAB   5

/* Facts the engine measures about the ranks' cards; constraints on them match facts, not params. */
#define RAD_FACT_PREFIX     "device."
#define RAD_FACT_P2P        "device.p2p"
#define RAD_FACT_ARCH       "device.arch"
#define RAD_FACT_INTEGRATED "device.integrated"
#define RAD_FACT_SAME_HOST  "device.same_host"
#define RAD_FACT_CHAIN      "device.chain" /* 1: the engine hands r4dchain rows their chain record */

/* Element types of tensors and planes. Sub-byte types are bit streams along a row, lowest bits
 * first; every row starts on a byte. */
#define RAD_DT_NONE     0
#define RAD_DT_F32      1
#define RAD_DT_F16      2
#define RAD_DT_BF16     3
#define RAD_DT_F64      4
#define RAD_DT_I8       5
#define RAD_DT_U8       6
#define RAD_DT_I16      7
#define RAD_DT_U16      8
#define RAD_DT_I32      9
#define RAD_DT_U32      10
#define RAD_DT_I64      11
#define RAD_DT_U64      12
#define RAD_DT_U1       13
#define RAD_DT_U2       14
#define RAD_DT_U4       15
#define RAD_DT_U6       16
#define RAD_DT_FP4_E2M1 17
#define RAD_DT_FP8_E4M3 18 /* OCP e4m3fn: bias 7, max 448 */
#define RAD_DT_FP8_E5M2 19
#define RAD_DT_I4       20
#define RAD_DT_U3       21
#define RAD_DT_U5       22

#define RAD_DT_ENCODED  255 /* a weight operand whose RadTensor.data is a RadWeightPlanes */

#define RAD_MAX_DIMS 4

/* Chained launches: a record of RAD_CHAIN_REC_BYTES at RAD_CHAIN_KARG_OFF of a r4dchain row's
 * kernel arguments: wait until *wait_word >= wait_value, run, then *bump_word = bump_value. */
#define RAD_CHAIN_REC_BYTES 32
#define RAD_CHAIN_KARG_OFF  0

/* The launch rules of a device kernel: its parameter block, and static + dynamic shared memory. */
#define RAD_MAX_KERNEL_ARG_BYTES 768
#define RAD_MAX_SHARED_BYTES     65536

typedef struct RadPluginInfo {
    uint32_t    kind;         /* RAD_PLUGIN_* */
    const char* name;
    const char* version;
    const char* description;
    const char* build_target; /* printed, not trusted: "gfx1100", "host", "" */
} RadPluginInfo;

typedef struct RadConstraint {
    const char* key;  /* a parameter of the op's schema, or a device.* fact */
    int32_t     op;   /* RAD_C_* */
    int64_t     ival; /* EQ/LE/GE/DIV on an integer */
    const char* sval; /* EQ on a string; IN: the set, separated by spaces or commas */
} RadConstraint;

#define RAD_CEQ(k, v)  {(k), RAD_C_EQ, (v), NULL}
#define RAD_CEQS(k, s) {(k), RAD_C_EQ, 0, (s)}
#define RAD_CLE(k, v)  {(k), RAD_C_LE, (v), NULL}
#define RAD_CGE(k, v)  {(k), RAD_C_GE, (v), NULL}
#define RAD_CDIV(k, v) {(k), RAD_C_DIV, (v), NULL}
#define RAD_CIN(k, s)  {(k), RAD_C_IN, 0, (s)}

typedef struct RadParamSpec {
    const char* name;
    int32_t     type; /* RAD_P_*            */
    int32_t     req;  /* RAD_REQUIRED/OPTIONAL/DERIVED */
    int32_t     role; /* RAD_PROLE_*        */
} RadParamSpec;

typedef struct RadOperandSpec {
    const char* name;
    int32_t     role;  /* RAD_OPD_* */
    int32_t     fixed; /* 1: extent does not follow the ranged extent (weights, tables) */
} RadOperandSpec;

typedef struct RadOpSchema {
    const char*           op;
    const RadParamSpec*   params;   /* params[0] is the ranged extent */
    int32_t               n_params;
    const RadOperandSpec* operands; /* RadArgs.t is positional in this order */
    int32_t               n_operands;
    const char*           doc;
} RadOpSchema;

typedef struct RadTensor {
    void*   data;                  /* NULL: an absent optional operand */
    int32_t dtype;                 /* RAD_DT_* */
    int32_t ndim;
    int64_t shape[RAD_MAX_DIMS];   /* the extent the caller narrowed it to */
    int64_t pitch[RAD_MAX_DIMS];   /* bytes between consecutive indices of each dim */
} RadTensor;

/* A weight operand stored as the container holds it (layout() said RAD_E_UNSUPPORTED): its
 * encoding and every plane, each a RadTensor of the plane's raw bytes [plane rows, row bytes]. */
typedef struct RadWeightPlanes {
    const struct RadEncoding* encoding;
    int64_t                   rows;
    int64_t                   cols;
    int32_t                   n_planes;
    const RadTensor*          planes; /* in encoding->planes order */
} RadWeightPlanes;

typedef struct RadParam {
    const char* key;
    int32_t     type; /* RAD_P_* */
    int64_t     i;
    double      f;
    const char* s;
} RadParam;

typedef void* RadStream; /* the engine's own queue on a card; NULL on the host */

typedef struct RadChainRec {
    uint64_t wait_word;  /* address of the word to wait on */
    uint64_t wait_value;
    uint64_t bump_word;  /* address of the word to set once done */
    uint64_t bump_value;
} RadChainRec;

/* The engine's transport to a peer on another host, for the rows that move bytes there
 * (send/recv at a pipeline stage boundary when device.same_host == 0): each call moves `bytes`
 * bytes in order and returns RAD_OK, or an error status once the peer is gone. */
typedef struct RadLink {
    void* ctx;
    int (*send)(void* ctx, const void* data, int64_t bytes);
    int (*recv)(void* ctx, void* data, int64_t bytes);
} RadLink;

/* What a collective row reaches of its peers: mapped buffers (IPC on a card, shared memory on
 * the host), one per rank, and the flag words it waits on. */
typedef struct RadPeers {
    int32_t            rank;
    int32_t            world_size;
    void**             buffers;      /* [world_size] */
    int64_t            buffer_bytes;
    volatile uint64_t** flags;       /* [world_size] */
    uint64_t           epoch;        /* bumped once per collective launch */
    const RadLink*     link;         /* a peer beyond shared memory; NULL where the buffers reach it */
} RadPeers;

typedef struct RadArgs {
    RadTensor*         t;            /* positional, the schema's operand order */
    int32_t            n_t;
    const RadParam*    params;       /* the resolved geometry */
    int32_t            n_params;
    void*              scratch;
    int64_t            scratch_bytes;
    void*              instance;     /* what init() returned */
    RadStream          stream;
    RadPeers*          peers;        /* collectives only */
    volatile uint64_t* link_gate;    /* colour 2 ends the hold by storing 0 here */
    RadChainRec*       chain;        /* r4dchain rows only */
} RadArgs;

typedef struct RadTunable {
    const char* name;
    const char* values; /* legal values, separated by spaces */
    int64_t     deflt;  /* must be launchable */
} RadTunable;

typedef int     (*RadLaunchFn)(const RadArgs* a);
typedef int     (*RadInitFn)(const RadParam* geometry, int32_t n, void** instance);
typedef void    (*RadFiniFn)(void* instance);
typedef int64_t (*RadScratchFn)(const RadParam* geometry, int32_t n);
typedef int     (*RadLayoutFn)(const char* weight, const struct RadEncoding* enc,
                               const RadParam* geometry, int32_t n);
/* relayout: called twice. First with out->data NULL and out->shape the weight's [rows, cols]: set
 * out's dtype, ndim and shape (the stored form); the engine allocates it and calls again to fill it.
 * unrelayout, the inverse: planes is the stored form (n_planes 1), out the encoding's planes, each
 * [plane rows, row bytes] allocated by the engine. */
typedef int     (*RadRelayoutFn)(const struct RadEncoding* enc, const RadTensor* planes,
                                 int32_t n_planes, RadTensor* out);
typedef int     (*RadOpdShapeFn)(const RadParam* geometry, int32_t n, RadTensor* operands,
                                 int32_t n_operands);
typedef int     (*RadTuneValidFn)(const RadParam* geometry, int32_t n);

typedef struct RadKernelInfo {
    const char*          name;
    const char*          op;
    const char*          family;
    const char*          computes;
    const char*          shape;
    const char*          dtypes;
    int32_t              domain;   /* RAD_DOMAIN_* */
    int32_t              priority; /* ties inside one plugin, highest first */
    const RadConstraint* constraints;
    int32_t              n_constraints;
    RadLaunchFn          launch;
    RadInitFn            init;
    RadFiniFn            fini;
    RadScratchFn         scratch;
    RadLayoutFn          layout;
    RadRelayoutFn        relayout;
    RadRelayoutFn        unrelayout;
    RadOpdShapeFn        opd_shape;
    const char*          replaces; /* the exact chain, ops joined by '+' */
    const RadTunable*    tunables;
    int32_t              n_tunables;
    RadTuneValidFn       tune_valid;
} RadKernelInfo;

#endif
