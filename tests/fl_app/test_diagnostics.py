import numpy as np
import pytest

from fl_app.diagnostics import cosine_to_global, effective_rank, update_deviation


def test_effective_rank_extremes():
    assert effective_rank(np.eye(7)) == pytest.approx(7.0)
    assert effective_rank(np.outer(np.arange(1, 6), np.ones(4))) == pytest.approx(1.0)
    assert effective_rank(np.diag([1.0, 1.0, 0.0])) == pytest.approx(2.0)


def test_update_deviation_and_cosines():
    same = np.tile([1.0, 2.0], (3, 1))
    assert update_deviation(same) == pytest.approx(0.0)
    opposite = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert update_deviation(opposite) == pytest.approx(2.0)  # zero mean: cos 0 each
    np.testing.assert_allclose(cosine_to_global(np.array([1.0, 0.0]), opposite), [1.0, -1.0])
