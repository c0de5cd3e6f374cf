"""The engine's side of kernel arguments: the ABI's packer (radiance.abi.kernel_args, which device
rows use too) held to the launch rules, and the chain record the engine writes before a chained
launch."""

from __future__ import annotations

import struct

from radiance.abi import RAD_CHAIN_KARG_OFF, RAD_CHAIN_REC_BYTES
from radiance.abi.kernel_args import CHAIN_FORMAT, FORMATS, PackedArgs  # noqa: F401
from radiance.abi.kernel_args import KernelArgs as _AbiKernelArgs

from .launch_rules import check_arg_bytes


class KernelArgs(_AbiKernelArgs):
    """The ABI's builder; pack() raises the launch rule's own error, naming the kernel."""

    def pack(self) -> PackedArgs:
        check_arg_bytes(self.kernel, len(self._data))
        return super().pack()


def pack_args(kernel: str, *arguments: tuple[str, object]) -> PackedArgs:
    """`pack_args("k", ("ptr", x), ("i32", n), ("f32", 0.5))`: the same as the builder."""
    builder = KernelArgs(kernel)
    for kind, value in arguments:
        if kind == "ptr":
            builder.pointer(value)
        else:
            builder.scalar(kind, value)
    return builder.pack()


def write_chain(args: PackedArgs, wait_word: int, wait_value: int, bump_word: int, bump_value: int) -> PackedArgs:
    """The engine's step before a chained launch: the record written into the reserved slot."""
    if args.chain_offset != RAD_CHAIN_KARG_OFF:
        raise ValueError(f"kernel {args.kernel!r}: its arguments hold no chain record at offset "
                         f"{RAD_CHAIN_KARG_OFF} (build them with KernelArgs(...).chain())")
    record = struct.pack(CHAIN_FORMAT, int(wait_word), int(wait_value), int(bump_word), int(bump_value))
    end = args.chain_offset + RAD_CHAIN_REC_BYTES
    return PackedArgs(args.kernel, args.data[:args.chain_offset] + record + args.data[end:], args.offsets, args.chain_offset)


def read_chain(args: PackedArgs) -> tuple[int, int, int, int]:
    """(wait word address, wait value, bump word address, bump value) of a chained kernel's args."""
    if args.chain_offset is None:
        raise ValueError(f"kernel {args.kernel!r}: its arguments hold no chain record")
    return struct.unpack_from(CHAIN_FORMAT, args.data, args.chain_offset)
