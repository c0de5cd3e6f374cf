"""radiance.abi: the plugin ABI. The C headers beside this file (rad_abi.h, rad_types.h,
rad_encoding.h, rad_plugin.h, rad_quant.h) and their Python mirror: the same names, the same
numbers. A plugin imports nothing of radiance's but this package."""

from pathlib import Path

from .arch import (  # noqa: F401
    RadArchInfo, RadArchOption, RadBufferDecl, RadGraphDecl, RadNodeDecl, RadSourceInfo, RadTableDecl, RadWeightDecl,
    RadWeightInfo, RadWeightSpec,
)
from .constants import *  # noqa: F401,F403
from .dtypes import BITS, BY_NAME, NAMES, NUMPY, UNPACKED, dtype_bits, dtype_from_numpy, row_bytes  # noqa: F401
from .encoding import RadEncoding, RadPlane  # noqa: F401
from .packing import pack_bits, unpack_bits  # noqa: F401
from .plugin import (  # noqa: F401
    engine_defines_weight_decoder, rad_arg_in, rad_args_getf, rad_args_getf_or, rad_args_geti, rad_args_geti_or,
    rad_args_gets, rad_args_gets_or, rad_backoff, rad_dtype_bits, rad_load_bits, rad_load_f32, rad_store_bits,
    rad_store_f32, rad_tensor, rad_tensor_lastdim, rad_tensor_row_pitch, rad_tensor_rows, rad_wait_word,
    rad_weight_f32, rad_weight_from_f32,
)
from .kernel_args import KernelArgs, PackedArgs  # noqa: F401
from .graph_builder import GraphBuilder  # noqa: F401
from .step import PLANNED, STEP_INPUTS, StepInput  # noqa: F401
from .shapes import SIZED_OPS, operand_shapes, vocabulary_opd_shape  # noqa: F401
from .stream import RadCodeObject, RadStream, RadStreamTable, rad_device_tensor  # noqa: F401
from .quant import RadQuantizerInfo, RadQuantOption  # noqa: F401
from .types import (  # noqa: F401
    RAD_CDIV, RAD_CEQ, RAD_CEQS, RAD_CGE, RAD_CIN, RAD_CLE, RadArgs, RadChainRec, RadConstraint,
    RadKernelInfo, RadOperandSpec, RadOpSchema, RadParam, RadParamSpec, RadLink, RadPeers, RadPluginInfo,
    RadTensor, RadTunable, RadWeightPlanes,
)

HEADERS_DIR = Path(__file__).resolve().parent
HEADERS = ("rad_abi.h", "rad_types.h", "rad_encoding.h", "rad_plugin.h", "rad_quant.h", "rad_arch.h", "rad_stream.h")
STRUCTS = (
    RadPluginInfo, RadConstraint, RadParamSpec, RadOperandSpec, RadOpSchema, RadTensor, RadParam,
    RadWeightPlanes, RadChainRec, RadLink, RadPeers, RadArgs, RadTunable, RadKernelInfo, RadPlane, RadEncoding,
    RadQuantOption, RadQuantizerInfo, RadWeightDecl, RadBufferDecl, RadTableDecl, RadNodeDecl, RadGraphDecl,
    RadWeightInfo, RadSourceInfo, RadWeightSpec, RadArchOption, RadArchInfo, RadCodeObject, RadStreamTable,
)
