"""Packing kernel arguments (for a device row and for the engine alike) into the byte buffer a launch takes, and the chain record in it.

Each argument sits at the next offset aligned to its natural alignment (what the C compiler does
for a kernel's parameter list), so the buffer is the kernel's parameter block byte for byte. The
backends hand the driver one pointer per argument into this buffer. A chained (`r4dchain`) kernel
takes a RadChainRec by value as its first parameter: RAD_CHAIN_REC_BYTES at RAD_CHAIN_KARG_OFF.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .constants import RAD_CHAIN_KARG_OFF, RAD_CHAIN_REC_BYTES, RAD_MAX_KERNEL_ARG_BYTES

# kind -> struct format (little endian); the size is the natural alignment.
FORMATS = {"ptr": "<Q", "i8": "<b", "u8": "<B", "i16": "<h", "u16": "<H", "f16": "<e", "i32": "<i",
           "u32": "<I", "f32": "<f", "i64": "<q", "u64": "<Q", "f64": "<d"}
CHAIN_FORMAT = "<QQQQ"  # wait word address, wait value, bump word address, bump value
assert struct.calcsize(CHAIN_FORMAT) == RAD_CHAIN_REC_BYTES


@dataclass(frozen=True)
class PackedArgs:
    """The parameter block of one kernel: `data`, each argument's offset, and where the chain
    record sits (None for a kernel without one)."""
    kernel: str
    data: bytes
    offsets: tuple[int, ...]
    chain_offset: int | None = None

    def __len__(self) -> int:
        return len(self.data)


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


class KernelArgs:
    """A builder: `KernelArgs("rmsnorm").pointer(x).pointer(y).i32(n).f32(eps).pack()`."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self._data = bytearray()
        self._offsets: list[int] = []
        self._chain_offset: int | None = None

    def _put(self, raw: bytes, alignment: int) -> "KernelArgs":
        offset = _align(len(self._data), alignment)
        self._data.extend(b"\x00" * (offset - len(self._data)))
        self._data.extend(raw)
        self._offsets.append(offset)
        return self

    def scalar(self, kind: str, value) -> "KernelArgs":
        if kind not in FORMATS:
            raise ValueError(f"kernel {self.kernel!r}: unknown argument kind {kind!r} (known: {', '.join(FORMATS)})")
        fmt = FORMATS[kind]
        try:
            raw = struct.pack(fmt, value)
        except struct.error as error:
            raise ValueError(f"kernel {self.kernel!r}: argument {len(self._offsets)} ({kind}) = {value!r}: {error}") from None
        return self._put(raw, struct.calcsize(fmt))

    def pointer(self, value) -> "KernelArgs":
        """A device address: an int, or anything with a `.ptr` (an Allocation)."""
        return self.scalar("ptr", int(getattr(value, "ptr", value)))

    def i32(self, value: int) -> "KernelArgs":
        return self.scalar("i32", int(value))

    def u32(self, value: int) -> "KernelArgs":
        return self.scalar("u32", int(value))

    def i64(self, value: int) -> "KernelArgs":
        return self.scalar("i64", int(value))

    def u64(self, value: int) -> "KernelArgs":
        return self.scalar("u64", int(value))

    def f32(self, value: float) -> "KernelArgs":
        return self.scalar("f32", float(value))

    def f64(self, value: float) -> "KernelArgs":
        return self.scalar("f64", float(value))

    def raw(self, data: bytes, alignment: int) -> "KernelArgs":
        """A struct passed by value: its bytes as C lays them out, and its alignment."""
        if alignment not in (1, 2, 4, 8, 16):
            raise ValueError(f"kernel {self.kernel!r}: alignment {alignment} is not a power of two up to 16")
        return self._put(bytes(data), alignment)

    def chain(self, wait_word: int = 0, wait_value: int = 0, bump_word: int = 0, bump_value: int = 0) -> "KernelArgs":
        """Reserve (and fill) the RadChainRec; it must be the first argument, at RAD_CHAIN_KARG_OFF."""
        if self._offsets:
            raise ValueError(f"kernel {self.kernel!r}: the chain record must be the first argument "
                             f"(offset {RAD_CHAIN_KARG_OFF}), {len(self._offsets)} argument(s) come before it")
        self._put(struct.pack(CHAIN_FORMAT, wait_word, wait_value, bump_word, bump_value), 8)
        self._chain_offset = self._offsets[-1]
        assert self._chain_offset == RAD_CHAIN_KARG_OFF
        return self

    def pack(self) -> PackedArgs:
        if len(self._data) > RAD_MAX_KERNEL_ARG_BYTES:
            raise ValueError(f"kernel {self.kernel!r}: {len(self._data)} bytes of kernel arguments, over the "
                             f"{RAD_MAX_KERNEL_ARG_BYTES}-byte launch rule")
        return PackedArgs(self.kernel, bytes(self._data), tuple(self._offsets), self._chain_offset)

