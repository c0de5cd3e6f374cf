/* rad_arch.h: the contract of an architecture plugin (kind RAD_PLUGIN_ARCH): one model family at
 * one weight format. It validates the hyper-parameters it reads from the container and declares,
 * as data, the weights, the graph of one step and its tensor-parallel plan. It never knows a rank:
 * extents are declared whole, and `split` says what the engine divides among the ranks. */
#ifndef RAD_ARCH_H
#define RAD_ARCH_H

#include "rad_abi.h"

/* How a weight [rows, cols] is divided among ranks. */
#define RAD_SPLIT_NONE 0 /* replicated                                              */
#define RAD_SPLIT_ROWS 1 /* rows (a gemm's output features): column-parallel, vocab-parallel */
#define RAD_SPLIT_COLS 2 /* columns (a gemm's input features): row-parallel     */

/* What a buffer's rows, or a node's ranged extent, follow. */
#define RAD_EXTENT_TOKENS 1 /* the tokens of this step                         */
#define RAD_EXTENT_SEQS   2 /* the sequences of this step                      */
#define RAD_EXTENT_SLOTS  3 /* the KV cache's slots (a cache buffer)           */

/* Buffers the engine fills (or reads) every step; a graph names them as operands. */
#define RAD_STEP_IDS          "step.ids"          /* i32 [tokens]                 */
#define RAD_STEP_POSITIONS    "step.positions"    /* i32 [tokens]                 */
#define RAD_STEP_SLOTS        "step.slots"        /* i32 [tokens]                 */
#define RAD_STEP_CU_SEQLENS   "step.cu_seqlens"   /* i32 [seqs + 1]               */
#define RAD_STEP_CONTEXT_LENS "step.context_lens" /* i32 [seqs]                   */
#define RAD_STEP_BLOCK_TABLES "step.block_tables" /* i32 [seqs, max blocks]       */
#define RAD_STEP_LAST_INDEX   "step.last_index"   /* i32 [seqs]: each one's last token */
#define RAD_STEP_TEMPERATURE  "step.temperature"  /* f32 [seqs]                   */
#define RAD_STEP_TOP_K        "step.top_k"        /* i32 [seqs]                   */
#define RAD_STEP_TOP_P        "step.top_p"        /* f32 [seqs]                   */
#define RAD_STEP_RNG          "step.rng"          /* u64 [seqs, 2]: seed, step    */
#define RAD_STEP_TOKENS       "step.tokens"       /* i32 [seqs]: the sampled ones */

typedef struct RadWeightDecl {
    const char* name;   /* how the graph names it                              */
    const char* source; /* the container's weight it reads ("" = name)         */
    int32_t     split;  /* RAD_SPLIT_*                                          */
} RadWeightDecl;

typedef struct RadBufferDecl {
    const char* name;
    int32_t     dtype;  /* RAD_DT_* */
    int32_t     extent; /* RAD_EXTENT_*: what its rows follow                   */
    int64_t     cols;   /* whole, before any split                               */
    int32_t     split;  /* 1: cols divided among ranks                           */
} RadBufferDecl;

typedef struct RadTableDecl {
    const char* name;
    RadTensor   table;  /* a small constant the architecture computes (rope frequencies) */
} RadTableDecl;

typedef struct RadNodeDecl {
    const char*        op;
    const char*        name;       /* e.g. "layers.3.attn.q", for logs and /graph            */
    int32_t            extent;     /* RAD_EXTENT_*: the ranged extent (params[0]) follows it */
    const RadParam*    params;     /* every parameter but the ranged extent, whole           */
    int32_t            n_params;
    const char*        split;      /* parameters divided among ranks, separated by spaces    */
    const char* const* operands;   /* buffer, weight, table or step names; "" = absent        */
    int32_t            n_operands;
} RadNodeDecl;

typedef struct RadGraphDecl {
    const RadWeightDecl* weights;
    int32_t              n_weights;
    const RadTableDecl*  tables;
    int32_t              n_tables;
    const RadBufferDecl* buffers;
    int32_t              n_buffers;
    const RadNodeDecl*   nodes; /* in execution order */
    int32_t              n_nodes;
} RadGraphDecl;

/* A weight as the container holds it, for declare(). */
typedef struct RadWeightInfo {
    const char* name;
    int64_t     rows;
    int64_t     cols;   /* 1-D weights: rows = 1 */
    const char* format; /* q4_1, q8_0, f32, bf16, ... */
} RadWeightInfo;

/* 0, or non-zero with a one-line reason in `error`. */
typedef int (*RadArchCheckFn)(const RadParam* hyper, int32_t n, char* error, int32_t error_bytes);
typedef int (*RadArchDeclareFn)(const RadParam* hyper, int32_t n, const RadWeightInfo* weights,
                                int32_t n_weights, RadGraphDecl* out);

typedef struct RadArchInfo {
    const char*      name; /* the container's `architecture` */
    const char*      doc;
    RadArchCheckFn   check;
    RadArchDeclareFn declare;
} RadArchInfo;

int                rad_arch_count(void);
const RadArchInfo* rad_arch_at(int i);

#endif
