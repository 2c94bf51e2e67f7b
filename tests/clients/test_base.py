import numpy as np
import pytest
import torch

from clients.base import states_problem


def test_fit_trains_and_reports(make_client, global_weights):
    c = make_client("fedavg", overrides="client.epochs=3")
    w0 = global_weights(c)
    loss0, _, _ = c.evaluate(w0, {})
    new, n, metrics = c.fit(w0, {"server-round": 1})
    assert n == len(c.data.train)
    assert [a.shape for a in new] == [a.shape for a in w0]
    assert metrics["steps"] in (3 * (n // 32), 3 * -(-n // 32))
    assert 0 <= metrics["personal_accuracy"] <= 1
    loss1, _, m1 = c.evaluate(new, {})
    assert loss1 < loss0 and m1["accuracy"] > 0.15


def test_no_local_test_split_trains_on_the_whole_partition(make_client, global_weights):
    """data.test_fraction=0 (FedCCL's P1 protocol): every sample trains, no P-FL metric."""
    split = make_client("fedavg")
    full = make_client("fedavg", overrides="data.test_fraction=0 client.personalized_eval=false")
    assert len(full.data.test) == 0
    assert len(full.data.train) == len(split.data.train) + len(split.data.test)
    _, n, metrics = full.fit(global_weights(full), {"server-round": 1})
    assert n == len(full.data.train) and "personal_accuracy" not in metrics


def test_same_seed_same_result_on_cpu(make_client, global_weights):
    w0 = global_weights(make_client())
    a = make_client().fit(w0, {"server-round": 2})[0]
    b = make_client().fit(w0, {"server-round": 2})[0]
    c = make_client().fit(w0, {"server-round": 3})[0]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_steps_mode_runs_exact_number_of_batches(make_client, global_weights):
    c = make_client("fedavg", overrides="client.steps=7 client.batch_size=8")
    _, _, m = c.fit(global_weights(c), {"server-round": 1})
    assert m["steps"] == 7


def test_lr_decay_per_round(make_client):
    c = make_client("fedavg", overrides="client.lr=0.1 client.lr_decay=0.5")
    c.round = 3
    assert c.lr() == 0.1 * 0.25


def test_non_finite_loss_fails_the_round_before_anything_is_saved(make_client, global_weights):
    c = make_client("moon")
    w0 = global_weights(c)
    w0[0] = np.full_like(w0[0], np.nan)
    with pytest.raises(FloatingPointError, match="non-finite loss in round 2; lower client.lr"):
        c.fit(w0, {"server-round": 2})
    assert c.store.load(c.pid, "moon_prev") is None


def test_non_finite_weights_after_the_last_step_fail_the_round_before_anything_is_saved(
    make_client, global_weights
):
    """One step at a huge lr and weight decay: its loss (computed before the update) is
    finite, the weights it leaves are not. MOON must not store them as its previous model
    (every later round of the node would fail on them)."""
    c = make_client("moon", overrides="client.steps=1 client.lr=1e30 client.weight_decay=1e20")
    with pytest.raises(FloatingPointError, match="non-finite weights after the last step of"):
        c.fit(global_weights(c), {"server-round": 1})
    assert c.store.versions(c.pid, "moon_prev") == []


def test_states_problem_names_what_does_not_fit_the_model(make_client):
    ref = make_client("fedavg").model.state_dict()
    name = next(iter(ref))
    good = {k: v.clone() for k, v in ref.items()}
    assert states_problem([good, good], ref) is None and states_problem([], ref) is None
    nan = {**good, name: torch.full_like(good[name], float("nan"))}
    short = {**good, name: good[name][:1]}
    cases = {
        "expected a list of model states, found dict": good,
        "entry 0 is not a state dict of this model": [{"w": torch.ones(1)}],
        f"entry 1: {name} is (1, ": [good, short],
        f"entry 0: {name} holds NaN or Inf": [nan],
        f"entry 0: {name} is {tuple(good[name].shape)} torch.float64, expected": [
            {**good, name: good[name].double()}
        ],
    }
    for message, value in cases.items():
        found = states_problem(value, ref)
        assert found is not None and found.startswith(message), (message, found)


@pytest.mark.parametrize("n", [1, 2, 6])
def test_frozen_stack_loop_and_vmap_match_separate_forwards(make_client, n):
    from clients.base import FrozenStack

    model = make_client("pmfl").model
    states = []
    for i in range(n):
        torch.manual_seed(i)
        states.append({k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()})
    stack = FrozenStack(model, states, torch.device("cpu"))
    x = torch.randn(5, *make_client("pmfl").data.train.x.shape[1:])
    expected = []
    for st in states:
        model.load_state_dict(st)
        with torch.no_grad():
            expected.append(model(x).z)
    expected = torch.stack(expected)
    torch.testing.assert_close(stack.z(x), expected)  # CPU default: the loop
    torch.testing.assert_close(stack.z(x, vmapped=True), expected, rtol=1e-5, atol=1e-5)


_DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    ),
]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("vmapped", [False, True])
def test_frozen_stack_gives_identical_models_identical_bits(make_client, device, vmapped):
    """PMFL's buffer holds a bitwise copy of the global model (the iterate of step 0) in the
    same stack as the global model (slot 0); its similarity must tie with the global's
    exactly, since ``s_h >= s_g`` makes it a positive. Neither the loop nor a batched
    (vmapped, CUDA) evaluation may break that tie."""
    from clients.base import FrozenStack

    client = make_client("pmfl")
    model = client.model.to(device)
    same = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    other = {k: v + 0.05 * torch.randn_like(v) for k, v in same.items()}
    stack = FrozenStack(model, [same, other, same, other, same], torch.device(device))
    x = torch.randn(64, *client.data.train.x.shape[1:], device=device)
    z = stack.z(x, vmapped=vmapped)
    assert torch.equal(z[0], z[2]) and torch.equal(z[0], z[4])
    assert not torch.equal(z[0], z[1])
