"""strategies/fedavg.py: FedAvg, FedAvgM and FedAdam by hand, and each server optimiser step
against Flower's own FedAvgM/FedAdam on the same replies."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvgM

from strategies.fedavg import FedAdamStrategy, FedAvgMStrategy, FedAvgStrategy

from .helpers import (
    TEMPLATE,
    FakeGrid,
    arrays_of,
    filled,
    make_strategy,
    random_round,
    reply,
    train_messages,
)


def _two_rounds(s, rng, w0, ns):
    """Two aggregate rounds as run() drives them; returns the client arrays and new globals."""
    out = []
    w = w0
    for rnd in (1, 2):
        clients = random_round(rng, w, ns, scale=0.5)
        msgs = train_messages(s, server_round=rnd, arrays=w)
        new, _ = s.aggregate_train(rnd, [reply(msgs[p], p, clients[p], n=ns[p]) for p in range(3)])
        w = arrays_of(new)
        out.append((clients, w))
    return out


def _avg(clients, ns):
    return {k: np.average([np.asarray(c[k], np.float64) for c in clients], 0, ns) for k in TEMPLATE}


def test_fedavgm_two_rounds_match_server_momentum_by_hand():
    """FedAvgM (Flower's convention, as torch.optim.SGD): Δ_t = weighted mean − x_t,
    v_1 = Δ_1, v_t = β·v_{t−1} + Δ_t, x_{t+1} = x_t + η·v_t, with β = server_momentum and
    η = server_lr taken from the config."""
    lr, beta = 0.7, 0.6
    s = make_strategy(
        FedAvgMStrategy,
        overrides=f"server.name=fedavgm server.server_lr={lr} server.server_momentum={beta}",
    )
    rng = np.random.default_rng(5)
    w0 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    ns = [10, 25, 4]
    (c1, w1), (c2, w2) = _two_rounds(s, rng, w0, ns)
    for k in TEMPLATE:
        d1 = _avg(c1, ns)[k] - w0[k]
        np.testing.assert_allclose(w1[k], w0[k] + lr * d1, rtol=1e-5, atol=1e-6)
        v2 = beta * d1 + (_avg(c2, ns)[k] - w1[k])
        np.testing.assert_allclose(w2[k], w1[k] + lr * v2, rtol=1e-5, atol=1e-6)
        # Flower keeps the buffer in pseudo-gradient sign (x_t − mean), i.e. −v_t
        np.testing.assert_allclose(
            s.state_dict()["momentum_vector"][list(TEMPLATE).index(k)], -v2, rtol=1e-5, atol=1e-6
        )


def test_fedadam_two_rounds_match_adam_by_hand():
    """FedAdam (Reddi et al. 2021, Alg. 2, as Flower implements it): Δ_t = weighted mean −
    x_t, m_t = β1·m + (1−β1)·Δ_t, v_t = β2·v + (1−β2)·Δ_t², x_{t+1} = x_t + η_t·m_t /
    (√v_t + τ). Flower adds an Adam-style bias correction that Reddi et al. do not have,
    η_t = η·√(1−β2^(t+1)) / (1−β1^(t+1)) with t the server round."""
    eta, b1, b2, tau = 0.05, 0.8, 0.95, 0.02
    s = make_strategy(
        FedAdamStrategy,
        overrides=(
            f"server.name=fedadam server.server_lr={eta} server.beta_1={b1} "
            f"server.beta_2={b2} server.tau={tau}"
        ),
    )
    rng = np.random.default_rng(8)
    w0 = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in TEMPLATE.items()}
    ns = [10, 25, 4]
    (c1, w1), (c2, w2) = _two_rounds(s, rng, w0, ns)
    for k in TEMPLATE:
        m = v = 0.0
        x = w0[k].astype(np.float64)
        for t, (clients, got) in enumerate(((c1, w1), (c2, w2)), start=1):
            d = _avg(clients, ns)[k] - x
            m = b1 * m + (1 - b1) * d
            v = b2 * v + (1 - b2) * d**2
            eta_t = eta * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
            x = x + eta_t * m / (np.sqrt(v) + tau)
            np.testing.assert_allclose(got[k], x, rtol=1e-5, atol=1e-6)
            assert got[k].dtype == np.float32  # computed in float64, sent as the model holds it
            x = np.asarray(got[k], np.float64)  # the next round starts from what was sent
        np.testing.assert_allclose(s.state_dict()["m_t"][k], m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s.state_dict()["v_t"][k], v, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    ("cls", "method"),
    [(FedAvgStrategy, "fedavg"), (FedAvgMStrategy, "fedavg_m"), (FedAdamStrategy, "fedavg_adam")],
)
def test_uniform_weighting_takes_the_plain_mean(cls, method):
    """``server.weighting: uniform`` (FedRCL's server, skynbe/FedRCL servers/base.py) weighs
    every result 1 whatever its sample count, with each Flower aggregation; ``samples`` (the
    default) weighs by num-examples. The clients' metrics stay sample-weighted. FedAvgM's
    first step (no momentum yet) and FedAdam's are functions of the same mean."""
    means = {}
    for weighting in ("samples", "uniform"):
        s = make_strategy(cls, method, overrides=f"server.weighting={weighting}")
        assert s.cfg["server"]["weighting"] == weighting
        msgs = train_messages(s)
        new, _ = s.aggregate_train(
            1,
            [
                reply(msgs[0], 0, filled(1.0), n=10, train_loss=1.0),
                reply(msgs[1], 1, filled(4.0), n=30, train_loss=3.0),
                reply(msgs[2], 2, filled(-2.0), n=60, train_loss=0.0),
            ],
        )
        means[weighting] = arrays_of(new)["w"]
        assert s.record["train"]["train_loss"] == pytest.approx((10 + 90) / 100)
        assert s.record["clients"]["1"]["num_examples"] == 30
    if cls is FedAvgStrategy:
        np.testing.assert_allclose(
            means["samples"], (10 * 1.0 + 30 * 4.0 - 60 * 2.0) / 100, rtol=1e-6
        )
        np.testing.assert_allclose(means["uniform"], (1.0 + 4.0 - 2.0) / 3, rtol=1e-6)
    elif cls is FedAvgMStrategy:  # first round: W + η·Δ̄ with η = 1
        np.testing.assert_allclose(means["samples"], 0.1, rtol=1e-6)
        np.testing.assert_allclose(means["uniform"], 1.0, rtol=1e-6)
    else:  # FedAdam moves each weight by ≈ η·sign(Δ̄) in its first step: both means are > 0
        assert (means["samples"] > 0).all() and (means["uniform"] > 0).all()
        assert not np.allclose(means["samples"], means["uniform"])


def _flower_rounds(flower, rounds):
    """Flower's own strategy driven as its ``start`` drives it, over ``rounds``: a list of
    (replies builder, arrays) where the builder makes the replies to the messages sent."""
    arrays = ArrayRecord({k: Array(v) for k, v in TEMPLATE.items()})
    out = []
    for rnd, make_replies in enumerate(rounds, start=1):
        msgs = list(
            flower.configure_train(rnd, arrays, ConfigRecord({}), FakeGrid([100, 101, 102]))
        )
        replies = make_replies(msgs)
        for r in replies:  # what Flower's quickstart clients send: arrays and metrics only
            r.content = RecordDict({"arrays": r.content["arrays"], "metrics": r.content["metrics"]})
        new, _ = flower.aggregate_train(rnd, replies)
        arrays = ArrayRecord({k: Array(new[k].numpy().astype(np.float32)) for k in TEMPLATE})
        out.append(arrays_of(arrays))
    return out


@pytest.mark.parametrize(
    ("ours", "flower", "overrides"),
    [
        (
            FedAvgMStrategy,
            lambda: FedAvgM(server_learning_rate=0.7, server_momentum=0.6),
            "server.name=fedavgm server.server_lr=0.7 server.server_momentum=0.6",
        ),
        (
            FedAvgMStrategy,
            lambda: FedAvgM(server_learning_rate=0.5, server_momentum=0.0),
            "server.name=fedavgm server.server_lr=0.5 server.server_momentum=0.0",
        ),
        (
            FedAdamStrategy,
            lambda: FedAdam(eta=0.05, beta_1=0.8, beta_2=0.95, tau=0.02),
            "server.name=fedadam server.server_lr=0.05 server.beta_1=0.8 server.beta_2=0.95 "
            "server.tau=0.02",
        ),
    ],
    ids=["fedavgm", "fedavgm-no-momentum", "fedadam"],
)
def test_the_server_optimisers_step_as_flowers_own(ours, flower, overrides):
    """Three rounds of our FedAvgM/FedAdam and of Flower's, on the same replies: the same
    global models, to the bit (our steps are pure functions that hold their state themselves;
    this fails if Flower changes its FedAvgM/FedAdam arithmetic)."""
    rng = np.random.default_rng(4)
    ns = [10, 25, 4]
    updates = [random_round(rng, TEMPLATE, ns, scale=0.5) for _ in range(3)]

    def builder(clients):
        return lambda msgs: [reply(msgs[p], p, clients[p], n=ns[p]) for p in range(3)]

    theirs = _flower_rounds(flower(), [builder(u) for u in updates])
    s = make_strategy(ours, overrides=overrides)
    w = dict(TEMPLATE)
    for rnd, clients in enumerate(updates, start=1):
        msgs = train_messages(s, server_round=rnd, arrays=w)
        new, _ = s.aggregate_train(rnd, builder(clients)(msgs))
        w = arrays_of(new)
        for k in TEMPLATE:
            np.testing.assert_array_equal(w[k], theirs[rnd - 1][k], err_msg=f"round {rnd} {k}")


@pytest.mark.parametrize(
    ("cls", "overrides"),
    [
        (FedAvgMStrategy, "server.name=fedavgm server.server_lr=0.7 server.server_momentum=0.6"),
        (FedAdamStrategy, "server.name=fedadam server.server_lr=0.05"),
    ],
)
def test_a_resumed_server_optimiser_continues_as_if_never_stopped(cls, overrides):
    """The optimiser state survives a checkpoint: round 3 after ``load_state_dict`` of the
    state after round 2 gives the same global model as round 3 of the uninterrupted run."""
    rng = np.random.default_rng(9)
    ns = [10, 25, 4]
    a = make_strategy(cls, overrides=overrides)
    w = dict(TEMPLATE)
    rounds = [random_round(rng, TEMPLATE, ns, scale=0.5) for _ in range(3)]
    for rnd, clients in enumerate(rounds[:2], start=1):
        msgs = train_messages(a, server_round=rnd, arrays=w)
        w = arrays_of(
            a.aggregate_train(rnd, [reply(msgs[p], p, clients[p], n=ns[p]) for p in range(3)])[0]
        )
    b = make_strategy(cls, overrides=overrides)
    b.load_state_dict(a.state_dict())
    got = []
    for s in (a, b):
        msgs = train_messages(s, server_round=3, arrays=w)
        new, _ = s.aggregate_train(3, [reply(msgs[p], p, rounds[2][p], n=ns[p]) for p in range(3)])
        got.append(arrays_of(new))
    for k in TEMPLATE:
        np.testing.assert_array_equal(got[0][k], got[1][k])
