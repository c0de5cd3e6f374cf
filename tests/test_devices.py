"""Which cards a launch sees and how a rank is pinned to one. No card here: the sysfs and procfs
trees the readers walk are written into a temporary folder, shaped as the drivers write them."""

import pytest

from radiance.launch import devices
from radiance.launch.spawn import rank_environment

AMD_GPU = "cpu_cores_count 0\nsimd_count 304\ngfx_target_version 90402\nunique_id {uid}\n"
AMD_APU = "cpu_cores_count 16\nsimd_count 24\ngfx_target_version 110003\nunique_id {uid}\n"
AMD_CPU = "cpu_cores_count 64\nsimd_count 0\n"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    kfd, nvidia = tmp_path / "kfd", tmp_path / "nvidia"
    monkeypatch.setattr(devices, "KFD_NODES", kfd)
    monkeypatch.setattr(devices, "NVIDIA_GPUS", nvidia)
    for variable in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)

    def amd(*nodes):
        for i, text in enumerate(nodes):
            (kfd / str(i)).mkdir(parents=True)
            (kfd / str(i) / "properties").write_text(text.format(uid=1000 + i))

    def nv(count):
        for i in range(count):
            folder = nvidia / f"0000:{0x18 + i:02x}:00.0"
            folder.mkdir(parents=True)
            folder.joinpath("information").write_text(f"Model: NVIDIA H200\nGPU UUID: GPU-aaaa{i}\nBus Location: x\n")
    return amd, nv


def test_no_card_means_host_ranks(machine):
    assert devices.visible_cards() == []


def test_discrete_cards_win_over_integrated_and_keep_the_first_architecture(machine):
    amd, _ = machine
    amd(AMD_CPU, AMD_APU, AMD_GPU, AMD_GPU)
    cards = devices.visible_cards()
    assert [(c.arch, c.integrated) for c in cards] == [("gfx942", False), ("gfx942", False)]


def test_integrated_only_when_nothing_else(machine):
    amd, _ = machine
    amd(AMD_CPU, AMD_APU)
    assert [(c.arch, c.integrated) for c in devices.visible_cards()] == [("gfx1103", True)]


def test_rocr_then_hip_visibility_each_by_its_own_rules(machine, monkeypatch):
    amd, _ = machine
    amd(AMD_GPU, AMD_GPU, AMD_GPU, AMD_GPU)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "3,1,2")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,2")  # indices into what ROCR left: cards 1 and 2
    assert [c.index for c in devices.visible_cards()] == [1, 2]
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "7")
    with pytest.raises(ValueError, match="HIP_VISIBLE_DEVICES=7: '7' names no card"):
        devices.visible_cards()


def test_cuda_visibility_out_of_order_and_cut_at_the_first_unknown(machine, monkeypatch):
    _, nv = machine
    nv(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1,9,2")
    cards = devices.visible_cards()
    assert [c.index for c in cards] == [3, 1]
    assert [c.bus_id for c in cards] == ["0000:1b:00.0", "0000:19:00.0"]


def test_amd_rank_sees_only_rocr(machine, monkeypatch):
    amd, _ = machine
    amd(AMD_GPU, AMD_GPU)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    card = devices.visible_cards()[1]
    environment = rank_environment(1, 2, card, 4, {})
    assert environment["ROCR_VISIBLE_DEVICES"] == "1"
    assert "HIP_VISIBLE_DEVICES" not in environment and "CUDA_VISIBLE_DEVICES" not in environment
    assert (environment["RADIANCE_RANK"], environment["RANK"], environment["LOCAL_RANK"]) == ("1", "1", "1")
    assert (environment["RADIANCE_WORLD_SIZE"], environment["WORLD_SIZE"]) == ("2", "2")
    assert environment["OMP_NUM_THREADS"] == environment["RADIANCE_THREADS"] == "4"


def test_nvidia_rank_is_pinned_by_uuid(machine):
    _, nv = machine
    nv(2)
    environment = rank_environment(0, 1, devices.visible_cards()[1], 1, {})
    assert environment["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa1"


def test_host_rank_sees_no_card(machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert "CUDA_VISIBLE_DEVICES" not in rank_environment(0, 2, None, 1, {})


def test_one_rank_in_process_pins_itself_to_the_first_visible_card(machine, monkeypatch):
    _, nv = machine
    nv(3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")  # the user's choice of cards, out of order
    environ = {"CUDA_VISIBLE_DEVICES": "2,1", "HOME": "/root"}
    card = devices.pin_this_process(environ)
    assert card.index == 2 and environ == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa2", "HOME": "/root"}


def test_a_process_already_given_one_card_or_none_is_left_alone(machine, monkeypatch):
    _, nv = machine
    nv(2)
    environ = {"CUDA_VISIBLE_DEVICES": "1"}
    assert devices.pin_this_process(environ) is None and environ == {"CUDA_VISIBLE_DEVICES": "1"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every card hidden
    environ = {"CUDA_VISIBLE_DEVICES": ""}
    assert devices.pin_this_process(environ) is None and environ == {"CUDA_VISIBLE_DEVICES": ""}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    nv_free = {}
    assert devices.pin_this_process(nv_free).index == 0 and nv_free == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa0"}
