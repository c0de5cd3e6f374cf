"""A launch over two nodes, simulated on this machine as two network namespaces joined by a veth
pair, each with its own /dev/shm (nodes_support.py): node 0 runs the coordinator and its ranks,
node 1 an agent and its ranks, TP inside a node and the pipeline stage boundary between them over
the CURVE link. Greedy tokens are TP 1's; a killed agent or rank ends the launch within 10 s naming
it, with nothing left on either node; every TCP socket is between the two nodes' addresses; and a
client without the launch's key cannot get a message through."""

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from nodes_support import ADDRESSES, Nodes, alive, generate_command, python_processes, ranks_of, why_not

REASON = why_not()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"two nodes cannot be simulated here: {REASON}")
PROMPT = "The capital of France is"


@pytest.fixture
def nodes(tmp_path):
    made = Nodes(tmp_path)
    yield made
    made.close()


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """SmolLM2's widths (hidden 576, ffn 1536, vocab 49152) with 8 heads and 4 KV heads, since its 9
    and 3 do not split over TP 2, and 8 layers, seeded random weights."""
    from radiance.convert.api import convert_synthetic
    from radiance.convert.synthetic import LlamaShape

    path = tmp_path_factory.mktemp("wide") / "wide.rad"
    convert_synthetic(path, LlamaShape(hidden=576, layers=8, heads=8, kv_heads=4, ffn=1536, vocab=49152,
                                       context=2048), seed=11)
    return path


def placement(nodes, node, port):
    return ("--nnodes", 2, "--node-rank", node, "--master-addr", ADDRESSES[0], "--master-port", port,
            "--keys", nodes.nodes[0].tmp.parent.parent / "keys")


def start(nodes, model, tp, pp, *extra, port=29611):
    """Node 1's agent, then node 0: the same command line but for --node-rank, as under torchrun."""
    args = ("--tp", tp, "--pp", pp, "--model", model, *extra)
    second = nodes.nodes[1].launch(*placement(nodes, 1, port), *args)
    first = nodes.nodes[0].launch(*placement(nodes, 0, port), *args)
    return first, second


def finish(process, timeout=240):
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")


def tp1_text(model, max_tokens):
    done = subprocess.run([sys.executable, "-m", "radiance.tools.generate", "--model", str(model), "--prompt", PROMPT,
                           "--max-tokens", str(max_tokens), "--temperature", "0"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def assert_nothing_left(nodes, processes, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(processes) and not any(node.left() for node in nodes.nodes):
            break
        time.sleep(0.1)
    assert alive(processes) == [], "processes of the launch outlived it"
    assert [node.left() for node in nodes.nodes] == [[], []], "files of the launch outlived it"
    assert not (nodes.nodes[0].tmp.parent.parent / "keys").exists(), "the launch's key file outlived it"


def token_ids(command, node=None, timeout=240):
    environment = node.environment() if node else None
    done = subprocess.run(node.command(*command) if node else command, capture_output=True, text=True,
                          timeout=timeout, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def test_tp2_pp2_over_two_nodes_gives_tp1_tokens(nodes, wide_model):
    expected, _ = token_ids(generate_command({"model": str(wide_model)}, PROMPT, 16))
    port, keys = 29617, nodes.nodes[0].tmp.parent.parent / "keys"
    second = nodes.nodes[1].launch(*placement(nodes, 1, port), "--tp", 2, "--pp", 2, "--model", wide_model,
                                   "--prompt", PROMPT)
    fields = {"model": str(wide_model), "tp": 2, "pp": 2, "nnodes": 2, "node_rank": 0, "master_addr": ADDRESSES[0],
              "master_port": port, "keys": str(keys), "launched": True}
    got, stderr = token_ids(generate_command(fields, PROMPT, 16), nodes.nodes[0])
    assert finish(second)[0] == 0
    assert got["ids"] == expected["ids"]
    for (ids, values), (their_ids, their_values) in zip(got["top"], expected["top"], strict=True):
        assert ids == their_ids  # each step's logits ranked alike: every activation crossed the link
        np.testing.assert_allclose(values, their_values, rtol=1e-4, atol=1e-4)
    assert "over the CURVE link (device.same_host = 0" in stderr
    assert "node 1 (ranks 2-3" in stderr and "joined" in stderr


def test_smollm2_pp2_over_two_nodes_gives_tp1_tokens(nodes, smollm2):
    """The real model, one stage a node (its 9 heads do not split over TP 2)."""
    expected = tp1_text(smollm2, 24)
    first, second = start(nodes, smollm2, 1, 2, "--prompt", PROMPT, "--max-tokens", 24, "--temperature", 0)
    code, stdout, stderr = finish(first)
    assert code == 0, stderr[-3000:]
    assert finish(second)[0] == 0
    assert stdout == expected and "Paris" in stdout


def long_run(nodes, model):
    first, second = start(nodes, model, 2, 2, "--prompt", PROMPT, "--max-tokens", 2000, "--temperature", 0,
                          "--max-context", 2048)
    deadline = time.monotonic() + 180
    while len(ranks_of(first)) < 2 or len(ranks_of(second)) < 2:
        assert time.monotonic() < deadline and first.poll() is None, "the ranks did not start"
        time.sleep(0.1)
    processes = python_processes(first) + python_processes(second)
    assert first.stdout.read(1), "no token came"  # the generation is under way on both nodes
    return first, second, processes


def assert_sockets_between_the_nodes(nodes):
    """Every TCP socket of either node: listening on, or connected between, the nodes' addresses."""
    for node in nodes.nodes:
        sockets = node.sockets()
        assert sockets, f"node {node.index} has no TCP socket during the launch"
        for state, local, peer in sockets:
            assert local.rsplit(":", 1)[0] in ADDRESSES, (node.index, state, local, peer)
            if state != "LISTEN":
                assert peer.rsplit(":", 1)[0] in ADDRESSES, (node.index, state, local, peer)


def test_killed_agent_ends_the_launch_naming_its_node(nodes, tiny_model):
    first, second, processes = long_run(nodes, tiny_model)
    assert_sockets_between_the_nodes(nodes)
    agent = python_processes(second)[0]
    assert "radiance.tools.launch" in " ".join(agent.cmdline())
    agent.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    code, _, stderr = finish(first, timeout=30)
    assert time.monotonic() - killed < 10.0, "the launch outlived a dead node by 10 s"
    assert code != 0
    assert "node 1 (ranks 2-3, agent pid" in stderr and "failed first: its agent is gone" in stderr, stderr[-2000:]
    assert_nothing_left(nodes, processes)


def test_killed_rank_on_the_other_node_is_named(nodes, tiny_model):
    first, second, processes = long_run(nodes, tiny_model)
    victim = next(rank for rank in ranks_of(second) if rank.environ()["RADIANCE_RANK"] == "3")
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    code, _, stderr = finish(first, timeout=30)
    assert time.monotonic() - killed < 10.0, "the launch outlived a dead rank by 10 s"
    assert code != 0
    assert "rank 3 on node 1 failed first: killed by SIGKILL" in stderr, stderr[-2000:]
    assert finish(second, timeout=30)[0] != 0
    assert_nothing_left(nodes, processes)


def test_a_client_without_the_key_cannot_connect(tmp_path, tiny_model):
    """Node 0 alone, on the loopback: a client with a key of its own (it knows the server's public
    key, even) gets nothing through; one with the launch's key does, and is answered."""
    from radiance.collectives.curve import LaunchKeys, client
    from radiance.collectives.wire import Wire

    keys_file, port = tmp_path / "keys", 29653
    node0 = subprocess.Popen([sys.executable, "-m", "radiance.tools.launch", "--nnodes", "2", "--node-rank", "0",
                              "--master-addr", "127.0.0.1", "--master-port", str(port), "--keys", str(keys_file),
                              "--tp", "2", "--model", str(tiny_model), "--prompt", PROMPT, "--stage-timeout", "20"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        keys = LaunchKeys.read(keys_file, wait_s=60)
        stranger = LaunchKeys.make()
        context = zmq.Context()
        endpoint = f"tcp://127.0.0.1:{port}"
        # A stranger who knows the server's public key but holds a client key of its own.
        intruder = context.socket(zmq.DEALER)
        intruder.curve_serverkey = keys.server_public.encode()
        intruder.curve_publickey, intruder.curve_secretkey = (stranger.client_public.encode(),
                                                              stranger.client_secret.encode())
        intruder.connect(endpoint)
        Wire(intruder, keys.signing).send("join", {"node": 1, "pid": 1, "address": "127.0.0.1"})
        time.sleep(3)
        assert node0.poll() is None
        # The launch's key gets through: a join as a node the launch does not have ends it, named.
        member = client(context.socket(zmq.DEALER), keys)
        member.connect(endpoint)
        Wire(member, keys.signing).send("join", {"node": 7, "pid": 1, "address": "127.0.0.1"})
        code, _, stderr = finish(node0, timeout=60)
        for socket in (intruder, member):
            socket.close(0)
        context.term()
    finally:
        if node0.poll() is None:
            node0.kill()
            node0.communicate()
    assert code != 0
    assert "a node joined as node 7" in stderr, stderr[-2000:]
    assert "node 1 (" not in stderr, "the stranger's join was taken"
    assert re.search(r"refused \d+ connections? without the launch's key", stderr), stderr[-2000:]
    assert not keys_file.exists()
