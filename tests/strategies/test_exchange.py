"""strategies.exchange: the payload exchange is its own part, held by any aggregator.

A user-written exchange (not one the registry knows) is composed with FedAvg and GNE, and
every hook the strategy delegates is observed: the round config and the payload it sends,
the check that decides each reply's payload, the record it adds after aggregation, and its
state in the checkpoint. The base class's defaults are those of a strategy without one."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from flwr.app import Array

from core.params import nonnegative
from fl_app.config import load_config
from strategies.exchange import NoExchangeParams, PayloadExchange
from strategies.fedau import FedAUStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.gne import GNEStrategy
from strategies.nodes import NodeRegistry
from strategies.replies import ClientResult, RejectedResult, decode_payload

from .helpers import TEMPLATE, arrays_of, filled, make_strategy, reply, train_messages


class _Tally(PayloadExchange):
    """Counts what each partition reported (one int64 array ``count`` of shape (1,)) and
    sends every participant the running total; no server-side hyperparameters."""

    name = "tally"

    def __init__(self, cfg: dict[str, Any], nodes: NodeRegistry) -> None:
        super().__init__(cfg, nodes)
        self.total = 0
        self.rounds_seen: list[int] = []

    def round_config(self, server_round: int) -> dict[str, Any]:
        return {"tally-round": server_round}

    def payload_for(self, server_round: int, pid: int) -> dict[str, np.ndarray]:
        return {"total": np.array([self.total], np.int64)}

    def check_payload(self, pid: int, payload: dict[str, Array]) -> dict[str, np.ndarray]:
        if set(payload) != {"count"}:
            raise RejectedResult(f"tally payload must be exactly ['count'], got {sorted(payload)}")
        out = decode_payload(payload)
        if out["count"].shape != (1,) or out["count"][0] < 0:
            raise RejectedResult("tally count must be one integer >= 0")
        return out

    def after_aggregate(self, server_round: int, results: list[ClientResult]) -> dict[str, Any]:
        self.rounds_seen.append(server_round)
        self.total += sum(int(r.payload["count"][0]) for r in results)
        return {"tally_total": self.total}

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total = int(state["total"])


METHOD: dict[type, str] = {  # a method whose config names each aggregator as its server
    FedAvgStrategy: "fedavg",
    GNEStrategy: "fedrane_wo_lra",
    FedAUStrategy: "fedau",
}


def _with(cls: type, exchange_cls: type = _Tally) -> Any:
    """``cls`` over 3 nodes, holding an exchange of ``exchange_cls`` built on its nodes."""
    s = make_strategy(cls, method=METHOD[cls])
    s.exchange = exchange_cls(s.cfg, s.nodes)
    return s


def _count(n: int) -> dict[str, np.ndarray]:
    return {"count": np.array([n], np.int64)}


@pytest.mark.parametrize("cls", [FedAvgStrategy, GNEStrategy])
def test_an_exchange_of_ones_own_is_composed_with_any_aggregator(cls):
    s = _with(cls)
    msgs = train_messages(s)
    assert all(m.content["config"]["tally-round"] == 1 for m in msgs)
    assert all(m.content["payload"]["total"].numpy().tolist() == [0] for m in msgs)
    s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, filled(1.0), payload=_count(2)),
            reply(msgs[1], 1, filled(3.0), payload=_count(5)),
        ],
    )
    assert s.record["num_results"] == 2 and s.record["tally_total"] == 7
    assert s.exchange.rounds_seen == [1]
    nxt = train_messages(s, 2)
    assert nxt[0].content["config"]["tally-round"] == 2
    assert nxt[0].content["payload"]["total"].numpy().tolist() == [7]


def test_the_exchange_decides_which_payloads_are_dropped_and_the_aggregator_never_sees_them():
    s = _with(FedAvgStrategy)
    msgs = train_messages(s)
    arrays, _ = s.aggregate_train(
        1,
        [
            reply(msgs[0], 0, filled(1.0), payload=_count(2)),
            reply(msgs[1], 1, filled(9.0), payload={"count": np.array([-1], np.int64)}),
            reply(msgs[2], 2, filled(9.0)),  # no payload at all
        ],
    )
    reasons = [f["reason"] for f in s.record["failures"]]
    assert any("count must be one integer >= 0" in r for r in reasons)
    assert any("must be exactly ['count'], got []" in r for r in reasons)
    assert s.record["num_results"] == 1 and s.record["tally_total"] == 2
    # only partition 0's model entered the mean
    assert all(np.allclose(v, 1.0) for v in arrays_of(arrays).values())


def test_the_exchange_state_sits_under_its_own_key_in_the_checkpoint():
    s = _with(FedAUStrategy)
    s.exchange.total = 11
    state = s.state_dict()
    assert state["exchange"] == {"total": 11}
    assert set(state) - {"exchange"}  # FedAU's own state beside it, not mixed into it
    fresh = _with(FedAUStrategy)
    fresh.load_state_dict(state)
    assert fresh.exchange.total == 11


def test_the_base_exchange_behaves_as_a_strategy_without_one_but_refuses_any_payload():
    cfg = load_config("tiny", "fedavg", "num_clients=2")
    base = PayloadExchange(cfg, NodeRegistry(2))
    assert base.round_config(1) == {} and base.payload_for(1, 0) == {}
    assert base.after_aggregate(1, []) == {} and base.state_dict() == {}
    assert base.hp == NoExchangeParams()
    with pytest.raises(RejectedResult, match="the base exchange takes no payload"):
        base.check_payload(0, {"x": Array(np.zeros(1, np.float32))})


def test_an_exchange_reads_its_hyperparameters_from_the_server_section():
    @dataclasses.dataclass(frozen=True)
    class Params:
        weight: float = nonnegative(0.5)

    class Weighted(PayloadExchange):
        pass

    Weighted.Params = Params
    cfg = load_config("tiny", "fedavg", "num_clients=2")
    cfg["server"]["weight"] = 2.0  # as fl_app.config puts a validated key there
    assert Weighted(cfg, NodeRegistry(2)).hp == Params(weight=2.0)
    del cfg["server"]["weight"]
    with pytest.raises(KeyError, match="weight"):  # the config must hold every key
        Weighted(cfg, NodeRegistry(2))


def test_without_an_exchange_a_payload_is_a_rejected_result():
    s = make_strategy(FedAvgStrategy)
    assert s.exchange is None
    msgs = train_messages(s)
    s.aggregate_train(
        1,
        [reply(msgs[0], 0, TEMPLATE, payload=_count(1)), reply(msgs[1], 1, TEMPLATE)],
    )
    reasons = [f["reason"] for f in s.record["failures"]]
    assert "unexpected payload arrays ['count']" in reasons[0]
    assert s.record["num_results"] == 1
