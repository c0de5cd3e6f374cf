"""The token pipe (collectives/token_pipe.py) and the first stage's side of it (ranks/fed_tokens.py):
messages in order through `depth` slots, the sender held once `depth` are unread; a feed takes
messages only as far as it needs, the rest at the end of the next step; a first stage without a
pipe refuses a feed."""

import threading

import numpy as np
import pytest

from radiance.collectives.shm import new_run_id, unlink_run
from radiance.collectives.token_pipe import TokenPipe
from radiance.ranks.fed_tokens import FedTokens


@pytest.fixture
def pipe_pair():
    run = new_run_id()
    receiving = TokenPipe.create(run, 0, max_seqs=4, depth=3)
    sending = TokenPipe.attach(run, 0, max_seqs=4, depth=3)
    yield sending, receiving
    sending.close()
    receiving.close()
    unlink_run(run)


def pairs(*tokens, first=0):
    return np.array([(first + i, token) for i, token in enumerate(tokens)], np.int32).reshape(-1, 2)


def test_messages_come_in_order_and_the_sender_waits_for_a_free_slot(pipe_pair):
    sending, receiving = pipe_pair
    for number in range(3):  # depth 3: three unread messages fit
        sending.send(pairs(10 + number, 20 + number))
    fourth = threading.Thread(target=sending.send, args=(pairs(99),))
    fourth.start()
    fourth.join(0.3)
    assert fourth.is_alive(), "the sender wrote over a message not yet read"
    assert receiving.recv().tolist() == [[0, 10], [1, 20]]
    fourth.join(10)
    assert not fourth.is_alive()
    assert [receiving.recv().tolist() for _ in range(3)] == [[[0, 11], [1, 21]], [[0, 12], [1, 22]], [[0, 99]]]
    with pytest.raises(RuntimeError, match="5 tokens do not fit"):
        sending.send(pairs(1, 2, 3, 4, 5))


def test_a_feed_takes_messages_as_far_as_it_needs(pipe_pair):
    sending, receiving = pipe_pair
    fed = FedTokens(receiving)
    fed.ran(np.zeros(4, np.int32), parts=2)  # a step of four sequences in two parts: two messages owed
    sending.send(pairs(7, 8))
    assert fed(np.array([1, 0])).tolist() == [8, 7] and fed.owed == 1  # the second part's not needed yet
    sending.send(pairs(5, 6, first=2))
    assert fed(np.array([3])).tolist() == [6] and fed.owed == 0
    fed.ran(np.zeros(2, np.int32), parts=1)
    sending.send(pairs(9))  # sequence 0's token alone
    with pytest.raises(RuntimeError, match=r"reads tokens \[1\] that the last stage did not send"):
        fed(np.array([1]))
    own = FedTokens()
    own.ran(np.array([4, 3], np.int32), parts=2)  # a rank that samples feeds from its own tokens
    assert own(np.array([1])).tolist() == [3]
    with pytest.raises(RuntimeError, match="no token pipe"):
        FedTokens(refusal="rank 0 has no token pipe")(np.array([0]))
