"""strategies/replies.py: the pure parts of reply validation (the checks through a strategy's
rounds are in test_base.py)."""

import numpy as np
import pytest

from strategies.replies import cast_like, error_message

from .helpers import RAY_REASON


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        (RAY_REASON, "client 0: non-finite loss in round 1; lower client.lr"),
        ("<class 'core.data.DataError'>:<'no file\nthere'>", "DataError: no file there"),
        ("<class 'ValueError'>:<'bad'>", "ValueError: bad"),
        ("Traceback ...\n  File x\nKeyError: 'k'\n\n", "KeyError: 'k'"),
        ("", ""),
        ("x" * 900, "x" * 499 + "…"),
    ],
)
def test_error_message_keeps_the_clients_own_error_on_one_line(reason, message):
    """In simulation a client's error reaches the server as Ray's whole traceback; the
    failure record and AllClientsFailedError keep the client's message only."""
    assert error_message(reason) == message


def test_cast_like_rounds_integers_and_keeps_matching_arrays():
    """Aggregates go back to the model's dtype (StrategyBase.to_record, PMFL's update):
    float64 → float32, integer buffers rounded (2.9999999 → 3, not truncated to 2), and an
    array already in the dtype is returned as is, without a copy."""
    got = cast_like(np.array([0.1, 2.5], np.float64), np.zeros(2, np.float32))
    assert got.dtype == np.float32 and np.allclose(got, [0.1, 2.5])
    ints = cast_like(np.array([2.9999999, -1.2]), np.zeros(2, np.int64))
    assert ints.dtype == np.int64 and ints.tolist() == [3, -1]
    same = np.ones(3, np.float32)
    assert cast_like(same, np.zeros(3, np.float32)) is same
