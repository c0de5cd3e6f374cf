/* rad_arch.h: the contract of an architecture plugin (kind RAD_PLUGIN_ARCH): one model family at
 * one weight format. It validates the hyper-parameters it reads from the container and declares,
 * as data, the weights, the graph of one step and its tensor-parallel plan. It never knows a rank:
 * extents are declared whole, and `split` says what the engine divides among the ranks.
 *
 * Its import hooks are how rad-convert reads the family's checkpoints without knowing the family:
 * which sources it takes, the hyper-parameters a source gives, and the weights those call for, with
 * their names in GGUF files and Hugging Face folders (and a synthetic model's shape options). */
#ifndef RAD_ARCH_H
#define RAD_ARCH_H

#include "rad_abi.h"

/* How a weight [rows, cols] is divided among ranks. */
#define RAD_SPLIT_NONE 0 /* replicated                                              */
#define RAD_SPLIT_ROWS 1 /* rows (a gemm's output features): column-parallel, vocab-parallel */
#define RAD_SPLIT_COLS 2 /* columns (a gemm's input features): row-parallel     */

/* A split extent is divided evenly among the ranks. One declared as `parts` equal parts (heads) is
 * never cut inside a part: with as many parts as ranks or more (parts % world == 0) each rank takes
 * parts / world of them; with fewer (world % parts == 0) each part is replicated on world / parts
 * ranks, rank r taking part r * parts / world (the KV heads when the ranks outnumber them, as vLLM
 * does). parts 0: no parts, the rows or columns divided evenly. A node's `split` names a parameter
 * made of parts as "N/4" (N in 4 parts: "kv_heads/1" is one KV head); a bare name is divided evenly. */

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

/* Multi-token-prediction heads (speculative decoding with the model's own draft). A family whose
 * models may carry them declares a second architecture, its name and RAD_MTP_SUFFIX ("llama.mtp"):
 * the graph of one step of the heads, declared from the same container (check or declare answering
 * a reason: the model has none). The heads' step takes the step inputs, its ids one position ahead
 * (row i: the token after position i), and RAD_MTP_PREVIOUS, which the engine fills: row i the
 * hidden state of position i, the model's RAD_HIDDEN after its step (or the heads' own
 * RAD_MTP_HIDDEN when they draft on from their own draft). Its sample node's logits are the draft's. */
#define RAD_MTP_SUFFIX   ".mtp"
#define RAD_HIDDEN       "h"            /* the model's graph: f32 [tokens, hidden], the residual stream */
#define RAD_MTP_PREVIOUS "mtp.previous" /* the heads' graph: f32 [tokens, hidden], the engine writes it */
#define RAD_MTP_HIDDEN   "mtp.hidden"   /* the heads' graph: f32 [seqs, hidden], each sampled row's     */

typedef struct RadWeightDecl {
    const char* name;   /* how the graph names it                              */
    const char* source; /* the container's weight it reads ("" = name)         */
    int32_t     split;  /* RAD_SPLIT_*                                          */
    int32_t     parts;  /* the split axis as this many parts (above); 0 = rows or columns */
} RadWeightDecl;

typedef struct RadBufferDecl {
    const char* name;
    int32_t     dtype;  /* RAD_DT_* */
    int32_t     extent; /* RAD_EXTENT_*: what its rows follow                   */
    int64_t     cols;   /* whole, before any split                               */
    int32_t     split;  /* 1: cols divided among ranks                           */
    int32_t     parts;  /* the columns as this many parts (above); 0 = columns   */
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
    const char*        split;      /* parameters divided among ranks, separated by spaces; "N/4": N in 4 parts */
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

/* ---- import: the family's checkpoints, for rad-convert ---------------------------------------- */

/* Where a checkpoint comes from. */
#define RAD_SOURCE_GGUF      1 /* a GGUF file                                              */
#define RAD_SOURCE_HF        2 /* a Hugging Face folder: config.json, *.safetensors         */
#define RAD_SOURCE_SYNTHETIC 3 /* rad-convert --synthetic NAME: seeded random weights       */

/* A synthetic model's values for a weight. */
#define RAD_FILL_NORMAL 1 /* N(0, 0.02) */
#define RAD_FILL_ONES   2
#define RAD_FILL_ZEROS  3
#define RAD_FILL_IDENTITY 4 /* ones on the diagonal of a square matrix, zeros elsewhere */

/* What a source holds, in its own names. The hyper-parameters' keys the engine itself reads
 * (context, vocab) come from hyper(); the tokenizer's (bos_token_id, eos_token_ids, add_bos) the
 * converter adds, reading the source's tokenizer. */
typedef struct RadSourceInfo {
    int32_t              kind;      /* RAD_SOURCE_*                                               */
    const char*          family;    /* GGUF: general.architecture; HF: one of config.json's architectures;
                                       synthetic: the name asked for                               */
    const RadParam*      meta;      /* GGUF: every metadata key but tokenizer.*; HF: config.json's keys;
                                       synthetic: every option of `synthetic` (below). A list or a
                                       table is RAD_P_STR JSON text; a boolean RAD_P_INT 0 or 1    */
    int32_t              n_meta;
    const RadWeightInfo* tensors;   /* the source's tensors, its names; format: the GGUF type (Q4_K)
                                       or the safetensors dtype (BF16); none for synthetic          */
    int32_t              n_tensors;
    /* A tensor's values decoded to f32, row after row: RAD_OK, or RAD_E_SHAPE when `count` is not
     * its element count. For small tables a family keeps as hyper-parameters (rope_freqs). */
    int (*read_f32)(void* reader, const char* tensor, float* out, int64_t count);
    void*                reader;
} RadSourceInfo;

/* A weight a model of some hyper-parameters holds, and where each source keeps it. */
typedef struct RadWeightSpec {
    const char* name;      /* the container's; "" = a tensor a source may hold that is not kept     */
    const char* gguf;      /* its GGUF tensor ("" = none)                                          */
    const char* hf;        /* its Hugging Face tensor ("" = none)                                  */
    int32_t     ndim;      /* 1: a vector [cols] (rows 1); 2: [rows, cols]; 0: any shape (not kept) */
    int64_t     rows;
    int64_t     cols;
    int32_t     optional;  /* 1: a source may lack it                                              */
    int32_t     fill;      /* RAD_FILL_*: a synthetic model's values                               */
    double      hf_offset; /* added to a Hugging Face tensor's values on import (a norm kept as w,
                              applied as 1 + w)                                                    */
} RadWeightSpec;

/* One shape option of a synthetic model: `rad-convert --synthetic NAME --KEY VALUE`. */
typedef struct RadArchOption {
    const char* key;
    int32_t     type;  /* RAD_P_INT | RAD_P_F64 | RAD_P_STR; a 0/1 RAD_P_INT is a flag (--KEY, --no-KEY) */
    const char* deflt; /* the default, as text */
    const char* doc;
} RadArchOption;

/* 1 when this architecture reads the checkpoints of `family` from a source of that kind. */
typedef int (*RadArchTakesFn)(int32_t kind, const char* family);
/* The hyper-parameters of the model a source holds (what check() reads), in the plugin's memory
 * until its next call; non-zero with a one-line reason in `error`. */
typedef int (*RadArchHyperFn)(const RadSourceInfo* source, const RadParam** out, int32_t* n_out,
                              char* error, int32_t error_bytes);
/* Every weight such a model holds, in the container's order. */
typedef int (*RadArchWeightsFn)(const RadParam* hyper, int32_t n, const RadWeightSpec** out,
                                int32_t* n_out);

typedef struct RadArchInfo {
    const char*          name; /* the container's `architecture` */
    const char*          doc;
    RadArchCheckFn       check;
    RadArchDeclareFn     declare;
    /* import, optional (takes, hyper and weights together): an architecture without them serves
     * containers only */
    RadArchTakesFn       takes;
    RadArchHyperFn       hyper;
    RadArchWeightsFn     weights;
    const RadArchOption* synthetic; /* a synthetic model's shape options, with their defaults */
    int32_t              n_synthetic;
} RadArchInfo;

int                rad_arch_count(void);
const RadArchInfo* rad_arch_at(int i);

#endif
