"""A rank that dies ends the launch within 5 s with a root-cause report; a dead coordinator takes
its ranks with it; Ctrl-C stops cleanly. Afterwards no process, shared-memory segment or socket
file of the launch remains (checked with psutil and the filesystem)."""

import signal
import time

import zmq

from launch_support import Launch, kill, wait_gone

LONG = ("--max-tokens", 2000, "--temperature", 0, "--max-context", 2048)


def start(model, tp=3, prompt="Once upon a time", *extra):
    return Launch("--tp", tp, "--model", model, "--prompt", prompt, *LONG, *extra)


def assert_root_cause(launch, killed_at, rank=1, how="killed by SIGKILL"):
    code, _, stderr = launch.finish(timeout=30)
    assert time.monotonic() - killed_at < 5.0, "the launch outlived a dead rank by 5 s"
    assert code != 0
    assert f"rank {rank} failed first: {how}" in stderr, stderr[-2000:]
    assert wait_gone(launch) == []


def test_rank_killed_during_load(smollm2):
    launch = start(smollm2)
    ranks = launch.wait_for_ranks(3)
    kill(ranks[1])
    assert_root_cause(launch, time.monotonic())


def test_rank_killed_during_a_step(smollm2):
    launch = start(smollm2)
    launch.wait_for_ranks(3)
    launch.read_until(" ")
    kill(launch.rank(1))
    assert_root_cause(launch, time.monotonic())


def test_rank_killed_during_a_step_running_ahead(smollm2):
    """Run ahead, the coordinator naps rather than waits on the results ring: a dead rank is still
    named within 5 s, with nothing left behind."""
    launch = start(smollm2, 3, "Once upon a time", "--run-ahead")
    launch.wait_for_ranks(3)
    launch.read_until(" ")
    kill(launch.rank(1))
    assert_root_cause(launch, time.monotonic())


def test_last_stage_killed_while_the_first_waits_for_its_tokens(smollm2):
    """Pipeline stages run ahead: the first stage waits on the token pipe for the last stage's
    tokens; the last stage killed is named within 5 s, with nothing left behind."""
    launch = start(smollm2, 1, "Once upon a time", "--pp", 2, "--run-ahead")
    launch.wait_for_ranks(2)
    launch.read_until(" ")
    kill(launch.rank(1))
    assert_root_cause(launch, time.monotonic())


def test_rank_killed_inside_a_collective(smollm2):
    launch = start(smollm2)
    launch.wait_for_ranks(3)
    launch.read_until(" ")
    kill(launch.rank(1), signal.SIGSTOP)  # its peers now wait for it inside a collective
    time.sleep(0.5)
    kill(launch.rank(1))
    assert_root_cause(launch, time.monotonic())


def test_killed_coordinator_takes_its_ranks(smollm2):
    launch = start(smollm2)
    ranks = launch.wait_for_ranks(3)
    launch.read_until(" ")
    launch.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert wait_gone(launch) == [], "ranks or their resources outlived the coordinator by 5 s"
    assert time.monotonic() - killed_at < 5.0
    assert not any(rank.is_running() and rank.status() != "zombie" for rank in ranks)


def test_ctrl_c_stops_cleanly(smollm2):
    launch = start(smollm2)
    launch.wait_for_ranks(3)
    launch.read_until(" ")
    launch.signal(signal.SIGINT)
    code, _, stderr = launch.finish(timeout=30)
    assert code == 130 and "radiance-launch: interrupted" in stderr
    assert "Traceback" not in stderr
    assert wait_gone(launch) == []


def test_unauthenticated_messages_are_dropped_and_counted(smollm2):
    launch = Launch("--tp", 3, "--model", smollm2, "--prompt", "The capital of France is", "--max-tokens", 40,
                    "--temperature", 0)
    ranks = launch.wait_for_ranks(3)
    endpoint = ranks[0].environ()["RADIANCE_COORDINATOR"]
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"rank-0")  # naming itself after a rank gains it nothing
    rogue.connect(endpoint)
    for _ in range(5):
        rogue.send_multipart([b"\x00" * 32, b"error", b'{"meta": {"error": "forged"}, "arrays": {}}'])
        rogue.send_multipart([b"stop"])
    code, stdout, stderr = launch.finish()
    rogue.close(0)
    context.term()
    assert code == 0, stderr[-2000:]
    assert stdout.strip().startswith("Paris")
    assert "forged" not in stderr
    assert "dropped 10 unauthenticated messages" in stderr


def test_too_little_shared_memory_is_a_clear_error_before_start(smollm2):
    launch = Launch("--tp", 3, "--model", smollm2, "--prompt", "hi", "--max-step-tokens", 100_000_000)
    code, stdout, stderr = launch.finish()
    assert code == 1 and stdout == ""
    assert "too little /dev/shm" in stderr
    assert wait_gone(launch) == []
