"""Packing kernel arguments (natural alignment, the 768-byte rule) and the chain record."""

import struct

import numpy as np
import pytest

from radiance.abi import RAD_CHAIN_KARG_OFF, RAD_CHAIN_REC_BYTES
from radiance.device import KernelArgs, LaunchRuleError, pack_args, read_chain, write_chain
from radiance.device.base import Allocation


def test_arguments_sit_at_their_natural_alignment_like_a_c_parameter_list():
    args = KernelArgs("k").i32(7).pointer(0x7F0000001000).f32(0.5).scalar("u8", 3).f64(2.0).scalar("f16", 1.5).pack()
    assert args.offsets == (0, 8, 16, 20, 24, 32)
    assert len(args.data) == 34
    assert struct.unpack_from("<i", args.data, 0)[0] == 7
    assert struct.unpack_from("<Q", args.data, 8)[0] == 0x7F0000001000
    assert struct.unpack_from("<f", args.data, 16)[0] == 0.5
    assert args.data[20] == 3
    assert struct.unpack_from("<d", args.data, 24)[0] == 2.0
    assert struct.unpack_from("<e", args.data, 32)[0] == 1.5
    assert args.data[4:8] == b"\0\0\0\0"  # padding is zero


def test_the_tuple_form_and_allocations_pack_the_same_bytes():
    buffer = Allocation(0x10000, 256, "x")
    assert pack_args("k", ("ptr", buffer), ("i32", 4)) == KernelArgs("k").pointer(0x10000).i32(4).pack()


def test_a_struct_by_value_takes_its_own_alignment():
    args = KernelArgs("k").scalar("u8", 1).raw(bytes(range(16)), 16).pack()
    assert args.offsets == (0, 16) and args.data[16:32] == bytes(range(16))


def test_768_bytes_of_arguments_pass_and_one_more_is_refused_naming_the_kernel():
    fits = KernelArgs("wide").raw(bytes(768), 8).pack()
    assert len(fits) == 768
    with pytest.raises(LaunchRuleError, match=r"kernel 'too_wide': 769 bytes of kernel arguments, over the 768-byte limit"):
        KernelArgs("too_wide").raw(bytes(768), 8).scalar("u8", 1).pack()


def test_a_value_out_of_range_names_the_kernel_and_the_argument():
    with pytest.raises(ValueError, match=r"kernel 'k': argument 1 \(i32\)"):
        KernelArgs("k").i32(1).i32(1 << 40)
    with pytest.raises(ValueError, match="unknown argument kind 'f128'"):
        KernelArgs("k").scalar("f128", 1.0)


def test_the_chain_record_is_32_bytes_at_its_offset_in_the_arguments():
    args = KernelArgs("all_reduce_r4dchain").chain().pointer(0xAAAA).i32(5).pack()
    assert RAD_CHAIN_REC_BYTES == 32 and args.chain_offset == RAD_CHAIN_KARG_OFF == 0
    assert args.offsets == (0, 32, 40)
    chained = write_chain(args, wait_word=0x1000, wait_value=7, bump_word=0x2000, bump_value=8)
    assert read_chain(chained) == (0x1000, 7, 0x2000, 8)
    assert chained.data[RAD_CHAIN_KARG_OFF:RAD_CHAIN_KARG_OFF + 32] == struct.pack("<4Q", 0x1000, 7, 0x2000, 8)
    assert chained.data[32:] == args.data[32:]  # the row's own arguments are untouched
    words = np.frombuffer(chained.data[:32], np.uint64)
    assert list(words) == [0x1000, 7, 0x2000, 8]  # what RadChainRec's four uint64 fields read


def test_a_chain_record_must_come_first_and_must_exist_to_be_written():
    with pytest.raises(ValueError, match="must be the first argument"):
        KernelArgs("k").i32(1).chain()
    with pytest.raises(ValueError, match="kernel 'plain': its arguments hold no chain record"):
        write_chain(KernelArgs("plain").i32(1).pack(), 1, 2, 3, 4)
