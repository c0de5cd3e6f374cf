"""The on-disk compile cache: hit, miss, corrupt entry recompiled, another target, atomic files."""

from radiance.device import CompileCache
from radiance.device.compile_cache import cache_key, default_root
from radiance.device.fake import FakeDevice

SOURCE = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }'


def test_a_second_compile_of_the_same_source_is_a_hit(tmp_path):
    device = FakeDevice(cache=CompileCache(tmp_path))
    first = device.compile(SOURCE)
    assert (device.compiles, device.cache.last) == (1, "miss")
    assert device.compile(SOURCE) == first
    assert (device.compiles, device.cache.last, device.cache.hits) == (1, "hit", 1)
    # A new process (a new device and cache object) finds it on disk.
    again = FakeDevice(cache=CompileCache(tmp_path))
    assert again.compile(SOURCE) == first and again.compiles == 0


def test_another_source_target_compiler_or_option_misses(tmp_path):
    cache = CompileCache(tmp_path)
    FakeDevice(cache=cache).compile(SOURCE)
    for device, source, options in [(FakeDevice(cache=cache), SOURCE + " ", ()),
                                    (FakeDevice(cache=cache, target="fake_80"), SOURCE, ()),
                                    (FakeDevice(cache=cache, compiler_version="fake-other"), SOURCE, ()),
                                    (FakeDevice(cache=cache), SOURCE, ("-DFAST",))]:
        device.compile(source, options)
        assert device.compiles == 1 and cache.last == "miss"
    assert len({cache_key(SOURCE, t, "c") for t in ("sm_90", "sm_80", "gfx942")}) == 3


def test_a_corrupt_entry_is_recompiled_and_replaced(tmp_path):
    cache = CompileCache(tmp_path)
    device = FakeDevice(cache=cache)
    good = device.compile(SOURCE)
    [entry] = list(tmp_path.rglob("*.bin"))
    blob = bytearray(entry.read_bytes())
    blob[-3] ^= 0xFF
    entry.write_bytes(bytes(blob))
    assert device.compile(SOURCE) == good
    assert (device.compiles, cache.corrupt, cache.last) == (2, 1, "corrupt")
    assert device.compile(SOURCE) == good and cache.last == "hit"  # the entry was rewritten
    entry.write_bytes(b"RADKC1\n")  # truncated header
    assert device.compile(SOURCE) == good and cache.corrupt == 2


def test_entries_are_written_whole_and_leave_no_temporary_files(tmp_path):
    cache = CompileCache(tmp_path)
    FakeDevice(cache=cache, target="gfx942:sramecc+:xnack-").compile(SOURCE)
    files = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].startswith("gfx942_sramecc+_xnack-/") and files[0].endswith(".bin")


def test_the_default_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("RADIANCE_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_root() == tmp_path / "radiance" / "kernels"
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "k"))
    assert default_root() == tmp_path / "k"
