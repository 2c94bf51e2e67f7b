"""bench/regimes.py: the verdict rule declared before the runs, the refusal of a Δ without
a matched FedAvg, and the committed regime table rebuilt from the committed runs."""

import json

import pytest
import regimes
from runs import lossy_lines

from tests.bench.conftest import RESULTS, light_copy


@pytest.mark.parametrize(
    ("deltas", "want"),
    [
        ([0.5, 0.1, -2.0], "reproduced"),
        ([0.5, 0.1, 0.2], "reproduced"),
        ([-0.5, -0.1, -0.2], "reversed"),
        ([-0.5, 0.1, -0.2], "not reproduced"),
        ([0.0, 0.0, 1.0], "not reproduced"),
        ([0.5, 0.1], "pending (2 of 3 seeds)"),
    ],
)
def test_verdict_rule(deltas, want):
    assert regimes.verdict(deltas) == want


def _summary(method: str, seed: int, acc: float, experiment: str = "p1") -> dict:
    return {"method": method, "experiment": experiment, "seed": seed, "last5_accuracy": acc}


def test_rows_pair_seeds_with_fedavg_on_the_same_model_only(tmp_path):
    """MOON is compared with fedavg_head (same head), never with plain fedavg; without a
    fedavg_head run it gets no Δ and no verdict."""
    p = regimes.Protocol("R-X", "p1", "X", "moon", "claim", ("moon", "fedprox"), ("x",))
    runs = {
        m: [(_summary(m, k, a), [], tmp_path / m / f"seed{k}") for k, a in accs.items()]
        for m, accs in {
            "moon": {0: 0.80, 1: 0.70, 2: 0.75},
            "fedavg": {0: 0.10, 1: 0.10, 2: 0.10},
            "fedprox": {0: 0.20, 1: 0.05, 2: 0.30},
        }.items()
    }
    rows = {r["method"]: r for r in regimes.protocol_rows(p, runs)}
    assert rows["moon"]["baseline"] is None and rows["moon"]["delta"] == []
    assert rows["moon"]["verdict"] == "no matched FedAvg run"
    assert rows["fedprox"]["baseline"] == "fedavg"
    assert rows["fedprox"]["delta"] == pytest.approx([10.0, -5.0, 20.0])
    assert rows["fedprox"]["verdict"] == "reproduced"
    runs["fedavg_head"] = [
        (_summary("fedavg_head", k, 0.72), [], tmp_path / f"h{k}") for k in (0, 1)
    ]
    rows = {r["method"]: r for r in regimes.protocol_rows(p, runs)}
    assert rows["moon"]["baseline"] == "fedavg_head" and rows["moon"]["seeds"] == [0, 1]
    assert rows["moon"]["delta"] == pytest.approx([8.0, -2.0])
    assert rows["moon"]["verdict"] == "pending (2 of 3 seeds)"
    assert rows["moon"]["claim"] == "claim" and rows["fedprox"]["claim"] is None


def test_committed_regime_table_is_rebuilt_from_its_runs(rebuild):
    err, out = rebuild(regimes, "--committed", RESULTS)
    assert err is None
    assert (out / "regimes.md").read_text() == (RESULTS / "regimes.md").read_text()
    got = json.loads((out / "regimes.json").read_text())
    assert got == json.loads((RESULTS / "regimes.json").read_text())
    keys = {"protocol", "method", "seeds", "accuracy", "baseline", "baseline_accuracy"}
    assert all(keys | {"delta", "verdict"} <= set(r) for r in got)


def test_light_runs_give_the_same_rows(rebuild, tmp_path):
    """The committed regime runs (MOON's regime with its matched FedAvg, PMFL's readings on
    P3) give the same table from their light form as from the full runs."""
    dirs = ("regimes/regime_moon", "regimes/p3")
    full, light = tmp_path / "full", tmp_path / "light"
    for d in dirs:
        (full / d).parent.mkdir(parents=True, exist_ok=True)
        (full / d).symlink_to(RESULTS / d)
        light_copy(tmp_path, d)
    tables = []
    for committed in (full, light):
        err, out = rebuild(regimes, "--committed", committed)
        assert err is None
        tables.append(((out / "regimes.md").read_text(), (out / "regimes.json").read_text()))
    assert tables[0] == tables[1]
    assert "| R-MOON | moon |" in tables[1][0] and "fedavg_head" in tables[1][0]


def test_runs_that_lost_client_results_are_marked_and_listed(tmp_path):
    """A run whose summary counts failed or dropped results gets a † on its per-seed value,
    in the method's cell or the baseline's, and a line under the table naming it, with the
    rounds and reasons its light curve keeps."""
    p = regimes.Protocol("R-X", "p1", "X", "fedprox", "claim", ("fedprox",), ("x",))
    runs = {
        m: [(_summary(m, k, 0.5), [], tmp_path / m / f"seed{k}") for k in (0, 1, 2)]
        for m in ("fedprox", "fedavg")
    }
    runs["fedprox"][1][0]["failed_results"] = 4
    runs["fedavg"][2][0]["dropped_results"] = 1
    light = tmp_path / "fedprox" / "seed1"
    light.mkdir(parents=True)
    lost = [{"round": 4, "counts": {"missing": 4}, "reasons": ["no reply before timeout"]}]
    (light / "curve.json").write_text(json.dumps({"records": [], "lost_results": lost}))
    (row,) = regimes.protocol_rows(p, runs)
    assert row["lost_results"] == [0, 4, 0] and row["baseline_lost_results"] == [0, 0, 1]
    lossy = lossy_lines("R-X ", runs)
    assert lossy == [
        "R-X fedavg seed 2: 1 client result lost",
        "R-X fedprox seed 1: 4 client results lost (round 4: 4 missing — no reply before timeout)",
    ]
    table = regimes.markdown([row], lossy)
    assert "| 50.0 / 50.0† / 50.0 (50.00) | fedavg | 50.0 / 50.0 / 50.0† |" in table
    assert table.endswith("\n- " + lossy[1] + "\n") and "† A run whose rounds" in table
    assert "†" not in regimes.markdown(
        [{**row, "lost_results": [0] * 3, "baseline_lost_results": [0] * 3}]
    )
