"""bench/p3_milestones.py: the last-5 accuracy at chosen rounds, by hand on a short curve and
on the committed runs whose figures the README quotes, full or light."""

import light
import p3_milestones
import pytest

from tests.bench.conftest import RESULTS


def test_last5_at_averages_the_last_five_evaluations_up_to_the_round():
    acc = [(0, 0.9), (5, 0.1), (10, 0.2), (15, 0.3), (20, 0.4), (25, 0.5), (30, 0.6), (35, 0.7)]
    assert p3_milestones.last5_at(acc, 30) == pytest.approx(40.0)  # rounds 10..30
    assert p3_milestones.last5_at(acc, 32) == pytest.approx(40.0)  # no evaluation at 31, 32
    assert p3_milestones.last5_at(acc, 10) == pytest.approx(15.0)  # two so far; round 0 not
    with pytest.raises(ValueError, match="round 4"):
        p3_milestones.last5_at(acc, 4)


def test_committed_1000_round_runs_give_the_readme_figures():
    rows = {
        (pat, m, seed): [round(v, 1) for v in values]
        for pat, m, seed, values in p3_milestones.milestones(
            RESULTS / "p3_streams_1000", [100, 300, 500, 700, 1000]
        )
    }
    assert rows[("bernoulli", "fedau", 0)] == [73.3, 81.2, 83.5, 84.8, 84.7]
    assert rows[("bernoulli", "pmfl", 1)] == [48.2, 72.1, 77.7, 82.3, 84.1]


def test_cli_prints_a_table_and_names_bad_input(tmp_path, capsys):
    assert p3_milestones.main([str(RESULTS / "p3_psi"), "--rounds", "50,300"]) is None
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| pattern | method | seed | round 50 | round 300 |"
    assert out[2].startswith("| bernoulli | pmfl | 0 | ")
    assert "comma-separated" in p3_milestones.main([str(RESULTS / "p3_psi"), "--rounds", "5O"])
    assert "no finished P3 runs" in p3_milestones.main([str(tmp_path)])


def test_light_runs_give_the_same_figures_at_milestones_and_refuse_other_rounds(tmp_path):
    """Two of the 1000-round runs the README quotes, in the light form (evaluated every 5
    rounds, thinned after round 100): the same figures at rounds up to 100 and at multiples
    of 50; a round whose last five evaluations it thinned out is refused, naming them."""
    full, thin = tmp_path / "full", tmp_path / "light"
    for run in ("bernoulli/fedau/seed0", "bernoulli/pmfl/seed1"):
        (full / run).parent.mkdir(parents=True)
        (full / run).symlink_to(RESULTS / "p3_streams_1000" / run)
        light.write_light(RESULTS / "p3_streams_1000" / run, thin / run)
    rounds = [40, 100, 200, 300, 500, 700, 950, 1000]
    assert p3_milestones.milestones(thin, rounds) == p3_milestones.milestones(full, rounds)
    with pytest.raises(ValueError, match=r"without the evaluations of rounds \[115, 125\]"):
        p3_milestones.milestones(thin, [130])
    assert "multiples of 50" in (p3_milestones.main([str(thin), "--rounds", "130"]) or "")
