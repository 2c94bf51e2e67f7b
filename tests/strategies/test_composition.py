"""Every client × every aggregator, two rounds each through the real ServerApp in-process.

The server is composed: ``server.name`` names the aggregator, the client brings its payload
exchange (FedCCL's signals). So any pair is a YAML change; this runs all of them on the
smallest data the tiny preset allows and fails on a pair that breaks: a client that errors,
a model that does not move, an aggregator that is not the one named, or FedCCL's signals
that do not reach the clients in round 2.
"""

import json

import pytest

from fl_app import registry

# the methods whose preset is the client alone (the method preset of the same name)
CLIENTS = sorted(registry.CLIENTS)
AGGREGATORS = list(registry.SERVERS)
#: the smallest run: 120 training and 60 test samples, one local step, no local evaluation
FAST = (
    "data.train_subset=120 data.test_subset=60 client.steps=1 client.batch_size=16 "
    "client.personalized_eval=false"
)
#: aggregator → a key of its strategy state in the checkpoint, or of the round record, that
#: only it writes (None, or not listed: none checked; plain FedAvg writes neither)
MARK = {
    "fedavg": None,
    "fedavgm": ("state", "momentum_vector"),
    "fedadam": ("state", "m_t"),
    "gne": ("record", "gne_status"),
    "fedau": ("state", "weights"),
    "pmfl": ("state", "history"),
}


def test_the_pairs_cover_every_registered_client_and_aggregator():
    """The pairs come from the registry, so a new client or aggregator is paired with all."""
    assert set(MARK) <= set(AGGREGATORS)
    assert {"fedavg", "fedprox", "moon", "fedrcl", "fedrane", "fedccl", "pmfl"} <= set(CLIENTS)


@pytest.mark.parametrize("server", AGGREGATORS)
@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_runs_two_rounds_with_every_aggregator(run_in_process, client, server):
    res = run_in_process(client, set_=f"{FAST} server.name={server}")
    summary, records = res["summary"], res["records"]
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    assert (summary["client"], summary["server"]) == (client, server)
    assert [r["round"] for r in records] == [0, 1, 2]
    for rec in records[1:]:
        # every client's result aggregated (the fixture also asserts no failures) and the
        # global model moved
        assert rec["num_results"] == 3 and sorted(rec["clients"]) == ["0", "1", "2"]
        assert rec["global_update_norm"] > 0
    assert records[-1]["accuracy"] is not None

    state = json.loads((res["dir"] / "checkpoint.json").read_text())["strategy"]
    mark = MARK.get(server)
    if mark is not None:
        where, key = mark
        assert key in (state if where == "state" else records[2]), (server, mark)

    train = [m for m in res["grid"].sent if m.metadata.message_type == "train"]
    assert len(train) == 6
    exchange = registry.exchange_name(client)
    if exchange is None:  # no payload either way
        assert all("payload" not in m.content.array_records for m in train)
        assert "exchange" not in state
        return
    assert exchange == "signals"
    # round 1 is CE only; round 2 carries the signals, and the clients used them
    assert all("payload" not in m.content.array_records for m in train[:3])
    assert all(
        set(m.content["payload"])
        == {"local_signals", "local_labels", "global_signals", "global_mask"}
        for m in train[3:]
    )
    assert records[1]["num_local_signals"] > 0 and records[1]["classes_with_signal"] > 0
    assert all(c["received_signals"] > 0 for c in records[2]["clients"].values())
    assert set(state["exchange"]) == {"local", "global_sig", "global_mask"}


def _trained(records):
    """What a run trained, without its timings: per round the accuracy, the clients' losses
    and signal counts, the global update's norm."""
    return [
        (
            r.get("accuracy"),
            r.get("global_update_norm"),
            {p: (c["train_loss"], c["num_signals"]) for p, c in r.get("clients", {}).items()},
        )
        for r in records
    ]


@pytest.mark.parametrize(("method", "server"), [("fedccl_m", "fedavgm"), ("fedccl_au", "fedau")])
def test_a_former_fedccl_server_name_is_its_aggregator_with_the_signals(
    run_in_process, method, server
):
    """``fedcclm``/``fedcclau`` (the presets' names, kept so that committed runs load and
    resume) train exactly what FedCCL's client with ``server.name=fedavgm``/``fedau`` does."""
    alias = run_in_process(method, set_=FAST)
    composed = run_in_process("fedccl", set_=f"{FAST} server.name={server}")
    assert alias["summary"]["server"] == method.replace("_", "")  # fedcclm, fedcclau
    assert _trained(alias["records"]) == _trained(composed["records"])
    assert alias["records"][2]["clients"]["0"]["received_signals"] > 0
