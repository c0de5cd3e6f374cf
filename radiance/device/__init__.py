"""radiance.device: the device layer of a card rank. One interface (base.Device) and its
backends: `cuda` (cuda-bindings: driver API + nvrtc), `hip` (hip-python: hip + hiprtc) and `fake`
(host memory, for tests). Importing this package imports no GPU library: selection.open_device
imports the one backend that the rank's card needs."""

from .base import Allocation, Device, DeviceError, Kernel, Module  # noqa: F401
from .budget import DeviceBudget, DeviceMemoryError  # noqa: F401
from .compile_cache import CompileCache  # noqa: F401
from .kernel_args import KernelArgs, PackedArgs, pack_args, read_chain, write_chain  # noqa: F401
from .launch_rules import MAX_KERNEL_ARG_BYTES, MAX_SHARED_BYTES, LaunchRuleError  # noqa: F401
from .selection import backend_name, open_device  # noqa: F401
