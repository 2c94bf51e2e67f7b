import json

import numpy as np
import pytest
from gne_compare import (
    are_sample_shares,
    fixed_point_spread,
    main,
    round_figures,
    run_summary,
    train_sizes,
)

from strategies.gne import gram_weights


def _gram(seed: int = 0, k: int = 5) -> np.ndarray:
    d = np.random.default_rng(seed).normal(size=(k, 40)) * np.arange(1, k + 1)[:, None]
    return d @ d.T


def test_fixed_point_spread_is_zero_at_the_nash_solution_only():
    gram = _gram()
    ours, status = gram_weights(gram, np.ones(5))
    assert status == "nash" and fixed_point_spread(gram, ours) < 1e-3  # eps·I ridge
    assert fixed_point_spread(gram, 3.0 * ours) < 1e-3  # any scale
    assert fixed_point_spread(gram, np.full(5, 0.2)) > 0.1  # uniform weights are not it
    assert fixed_point_spread(-np.eye(5), np.full(5, 0.2)) == float("inf")


def test_round_figures_and_summary():
    gram = _gram()
    ours, _ = gram_weights(gram, np.ones(5))
    rec = {"theirs": [0.2] * 5, "ours": ours.tolist(), "gram": gram.tolist()}
    fig = round_figures(rec)
    assert fig["l1"] == pytest.approx(np.abs(0.2 - ours).sum())
    assert fig["max_theirs"] == 0.2 and fig["max_ours"] == pytest.approx(ours.max())
    assert fig["spread_ours"] < 1e-3 < fig["spread_theirs"]
    same = {**rec, "theirs": ours.tolist()}
    s = run_summary([rec, same, same], np.array([5.0, 5, 5, 5, 5]))
    assert (s["rounds"], s["agree"], s["sample_shares"]) == (3, 2, 1)  # rec: equal sizes
    assert s["l1_apart"] == pytest.approx(fig["l1"]) and s["spread_ours"] < 1e-3
    assert run_summary([rec], None)["sample_shares"] == -1


def test_sample_shares_are_those_of_the_largest_clients_in_any_order():
    sizes = np.array([10.0, 300, 50, 100, 5])  # 10 and 5 without a full batch: out
    assert are_sample_shares(np.array([100, 300, 50]) / 450, sizes)
    assert not are_sample_shares(np.array([0.2, 0.5, 0.3]), sizes)


def _write_their_data(root, sizes):
    train = root / "dataset" / "fmnist" / "train"
    train.mkdir(parents=True)
    for k, n in enumerate(sizes):
        with (train / f"{k}.npz").open("wb") as fh:
            np.savez(fh, data=np.array({"x": np.zeros((n, 2)), "y": np.zeros(n)}, dtype=object))


def test_main_reads_each_folder_and_refuses_a_missing_log(tmp_path, monkeypatch, capsys):
    gram = _gram()
    ours, _ = gram_weights(gram, np.ones(5))
    rec = {"theirs": [0.2] * 5, "ours": ours.tolist(), "gram": gram.tolist(), "status": "nash"}
    (tmp_path / "gne_weights.jsonl").write_text(json.dumps(rec) + "\n")
    _write_their_data(tmp_path, [7] * 5 + [3])  # the sixth has no full batch
    assert list(train_sizes(tmp_path)) == [7] * 5 + [3]
    monkeypatch.setattr("sys.argv", ["gne_compare.py", str(tmp_path)])
    out = (main(), capsys.readouterr().out)
    assert out[0] is None and "agree in 0; theirs are the sample shares in 1;" in out[1]
    monkeypatch.setattr("sys.argv", ["gne_compare.py", str(tmp_path / "none")])
    assert "does not exist" in main()
