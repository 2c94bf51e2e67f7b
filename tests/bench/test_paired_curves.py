import paired_curves
import pytest


def test_paired_differences_keeps_shared_rounds_in_points():
    method = [(0, 0.10), (5, 0.60), (10, 0.70), (50, 0.80)]
    baseline = [(0, 0.10), (5, 0.50), (50, 0.85)]
    got = paired_curves.paired_differences(method, baseline)
    assert [r for r, _ in got] == [0, 5, 50]
    assert [round(d, 6) for _, d in got] == [0.0, 10.0, -5.0]


def test_lead_counts_strictly_ahead_from_the_round_on():
    diffs = [(5, 3.0), (50, 1.0), (55, 0.0), (60, -2.0), (65, 4.0)]
    assert paired_curves.lead(diffs) == (2, 4, 0.75)
    assert paired_curves.lead(diffs, from_round=60) == (1, 2, 1.0)
    with pytest.raises(ValueError, match="round 70"):
        paired_curves.lead(diffs, from_round=70)


def test_committed_moon_seed0_matches_the_readme(capsys):
    paired_curves.main(["regime_fedrcl", "moon", "fedavg_head", "0"])
    out = capsys.readouterr().out
    assert "ahead in 11 of 32 (mean -0.12)" in out
    assert "r10 +0.78" in out
