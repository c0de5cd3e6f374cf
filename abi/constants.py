"""The constants of rad_types.h, rad_encoding.h and rad_abi.h, with the C values."""

RAD_ABI_VERSION = 33

RAD_PLUGIN_KERNEL = 1
RAD_PLUGIN_ARCH = 2
RAD_PLUGIN_QUANT = 3

RAD_OK = 0
RAD_E_UNSUPPORTED = -1
RAD_E_DTYPE = -2
RAD_E_SHAPE = -3
RAD_E_INVALID = -4
RAD_E_NOMEM = -5
RAD_E_DEVICE = -6
RAD_E_INTERNAL = -7
RAD_LAYOUT_ANY = 1
RAD_LINK_ENDED = 2

RAD_DOMAIN_HOST = 1
RAD_DOMAIN_DEVICE = 2

RAD_C_EQ = 1
RAD_C_LE = 2
RAD_C_GE = 3
RAD_C_DIV = 4
RAD_C_IN = 5

RAD_P_INT = 1
RAD_P_F64 = 2
RAD_P_STR = 3

RAD_REQUIRED = 0
RAD_OPTIONAL = 1
RAD_DERIVED = 2

RAD_PROLE_NONE = 0
RAD_PROLE_SEQ_CHUNK = 1
RAD_PROLE_CAPACITY = 2

RAD_OPD_IN = 1
RAD_OPD_OUT = 2
RAD_OPD_INOUT = 3
RAD_OPD_WEIGHT = 4
RAD_OPD_WTAB = 5

RAD_FACT_PREFIX = "device."
RAD_FACT_P2P = "device.p2p"
RAD_FACT_ARCH = "device.arch"
RAD_FACT_INTEGRATED = "device.integrated"
RAD_FACT_SAME_HOST = "device.same_host"
RAD_FACT_CHAIN = "device.chain"

RAD_DT_NONE = 0
RAD_DT_F32 = 1
RAD_DT_F16 = 2
RAD_DT_BF16 = 3
RAD_DT_F64 = 4
RAD_DT_I8 = 5
RAD_DT_U8 = 6
RAD_DT_I16 = 7
RAD_DT_U16 = 8
RAD_DT_I32 = 9
RAD_DT_U32 = 10
RAD_DT_I64 = 11
RAD_DT_U64 = 12
RAD_DT_U1 = 13
RAD_DT_U2 = 14
RAD_DT_U4 = 15
RAD_DT_U6 = 16
RAD_DT_FP4_E2M1 = 17
RAD_DT_FP8_E4M3 = 18
RAD_DT_FP8_E5M2 = 19
RAD_DT_I4 = 20
RAD_DT_U3 = 21
RAD_DT_U5 = 22
RAD_DT_ENCODED = 255

RAD_MAX_DIMS = 4

RAD_CHAIN_REC_BYTES = 32
RAD_CHAIN_KARG_OFF = 0

RAD_PLANE_TILED = 1
RAD_PLANE_TABLE = 2
RAD_MAX_PLANES = 16

KIND_FOLDERS = {RAD_PLUGIN_KERNEL: "kernels", RAD_PLUGIN_ARCH: "architectures", RAD_PLUGIN_QUANT: "quantizers"}

RAD_SPLIT_NONE = 0
RAD_SPLIT_ROWS = 1
RAD_SPLIT_COLS = 2

RAD_SOURCE_GGUF = 1
RAD_SOURCE_HF = 2
RAD_SOURCE_SYNTHETIC = 3

RAD_FILL_NORMAL = 1
RAD_FILL_ONES = 2
RAD_FILL_ZEROS = 3
RAD_FILL_IDENTITY = 4

RAD_EXTENT_TOKENS = 1
RAD_EXTENT_SEQS = 2
RAD_EXTENT_SLOTS = 3

RAD_STEP_IDS = "step.ids"
RAD_STEP_POSITIONS = "step.positions"
RAD_STEP_SLOTS = "step.slots"
RAD_STEP_CU_SEQLENS = "step.cu_seqlens"
RAD_STEP_CONTEXT_LENS = "step.context_lens"
RAD_STEP_BLOCK_TABLES = "step.block_tables"
RAD_STEP_LAST_INDEX = "step.last_index"
RAD_STEP_TEMPERATURE = "step.temperature"
RAD_STEP_TOP_K = "step.top_k"
RAD_STEP_TOP_P = "step.top_p"
RAD_STEP_RNG = "step.rng"
RAD_STEP_TOKENS = "step.tokens"

RAD_MTP_SUFFIX = ".mtp"  # rad_arch.h: a family's multi-token-prediction heads, an architecture of their own
RAD_HIDDEN = "h"  # the model's residual stream after its step, f32 [tokens, hidden]
RAD_MTP_PREVIOUS = "mtp.previous"  # the heads' input the engine writes: row i the hidden state of position i
RAD_MTP_HIDDEN = "mtp.hidden"  # the heads' output: each sampled row's hidden state, f32 [seqs, hidden]

RAD_MAX_KERNEL_ARG_BYTES = 768  # a device kernel's parameter block (the spec's launch rules)
RAD_MAX_SHARED_BYTES = 65536    # static + dynamic shared memory (LDS) of one launch

RAD_CODE_SOURCE = "source"  # rad_stream.h: a code object of source text, compiled at run time
