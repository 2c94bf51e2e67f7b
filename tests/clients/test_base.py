import numpy as np
import pytest
import torch

from clients.base import OPTIMIZER_STATE_KEY, optimizer_state_problem, states_problem
from core.state import StateStore
from fl_app import registry
from fl_app.config import ConfigError, load_config

from .updates import update_cosine, update_relative_difference


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


def test_drop_last_drops_the_partial_batch(make_client, global_weights):
    """``client.drop_last``: only full batches train; a client with fewer samples than a
    batch takes no step and sends the global weights back unchanged (GNE then leaves it out:
    its delta is zero), with its sample count."""
    keep = make_client("fedavg", overrides="client.batch_size=32")
    drop = make_client("fedavg", overrides="client.batch_size=32 client.drop_last=true")
    n = len(drop.data.train)
    assert n % 32, "the test needs a partial batch"
    w0 = global_weights(drop)
    assert drop.fit(w0, {"server-round": 1})[2]["steps"] == 2 * (n // 32)
    assert keep.fit(w0, {"server-round": 1})[2]["steps"] == 2 * -(-n // 32)
    tiny = make_client("fedavg", overrides=f"client.batch_size={n + 1} client.drop_last=true")
    new, m, metrics = tiny.fit(w0, {"server-round": 1})
    assert metrics["steps"] == 0 and m == n
    assert all(np.array_equal(a, b) for a, b in zip(new, w0, strict=True))


@pytest.mark.parametrize("method", ["moon", "pmfl", "fedrcl", "fedrane", "fedccl", "fedprox"])
def test_a_client_without_a_full_batch_completes_its_round(make_client, global_weights, method):
    """Every method's round ends cleanly when ``drop_last`` leaves a client no step (its
    state, payloads and metrics are made from the unchanged global model)."""
    c = make_client(method, overrides="client.batch_size=100000 client.drop_last=true")
    w0 = global_weights(c)
    for rnd in (1, 2):
        new, _, metrics = c.fit(w0, {"server-round": rnd})
        assert metrics["steps"] == 0 and all(np.isfinite(a).all() for a in new)


def _two_rounds_with_one_optimizer(make_client, global_weights, overrides):
    """The reference of ``keep_optimizer_state``: one client object and ONE optimizer for
    rounds 1 and 2 (a PFLlib client), its learning rate set to each round's."""
    c = make_client("fedavg", overrides=overrides)
    opt = c.make_optimizer()

    def kept() -> torch.optim.Optimizer:
        for group in opt.param_groups:
            group["lr"] = c.lr()
        return opt

    c.make_optimizer = kept
    w1 = c.fit(global_weights(c), {"server-round": 1})[0]
    w2 = [a * 0.5 for a in w1]  # a "global model" other than the client's own
    return w2, c.fit(w2, {"server-round": 2})[0]


def test_keep_optimizer_state_carries_the_momentum_to_the_next_round(
    make_client, global_weights, tmp_path
):
    """Clients rebuilt every round (as Flower's are) with ``keep_optimizer_state`` train
    round 2 exactly as one client object keeping its optimizer does; without it, round 2
    starts with no momentum and ends elsewhere."""
    overrides = "client.lr_decay=0.5 client.keep_optimizer_state=true"
    w2, reference = _two_rounds_with_one_optimizer(make_client, global_weights, overrides)
    from core.state import StateStore

    store = StateStore(tmp_path / "kept")
    first = make_client("fedavg", overrides=overrides, store=store)
    first.fit(global_weights(first), {"server-round": 1})
    saved = store.load(0, OPTIMIZER_STATE_KEY)
    assert set(saved) == {n for n, _ in first.model.named_parameters()}
    assert all(set(s) == {"momentum_buffer"} for s in saved.values())
    second = make_client("fedavg", overrides=overrides, store=store)
    kept = second.fit(w2, {"server-round": 2})[0]
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(kept, reference, strict=True))
    fresh = make_client("fedavg", overrides="client.lr_decay=0.5").fit(w2, {"server-round": 2})
    assert not all(np.allclose(a, b, atol=1e-3) for a, b in zip(fresh[0], reference, strict=True))


def test_keep_optimizer_state_skips_a_state_of_another_model(make_client, global_weights, caplog):
    c = make_client("fedavg", overrides="client.keep_optimizer_state=true")
    c.store.save(c.pid, OPTIMIZER_STATE_KEY, {"conv.weight": {"momentum_buffer": torch.ones(2)}})
    _, _, metrics = c.fit(global_weights(c), {"server-round": 2})
    assert "'conv.weight' is not a parameter of this model" in caplog.text
    assert metrics["steps"] > 0
    assert set(c.store.load(c.pid, OPTIMIZER_STATE_KEY)) != {"conv.weight"}  # replaced


def test_optimizer_state_problem_names_what_does_not_fit(make_client):
    params = dict(make_client().model.named_parameters())
    name, ref = next(iter(params.items()))
    ok = {name: {"momentum_buffer": torch.zeros_like(ref)}}
    assert optimizer_state_problem(ok, params) is None
    assert optimizer_state_problem({}, params) is None  # no parameter took a step
    assert "expected a dict" in optimizer_state_problem([ok], params)
    assert "not a parameter" in optimizer_state_problem({"x": {}}, params)
    bad = {name: {"momentum_buffer": torch.zeros(3)}}
    assert f"{name}.momentum_buffer is (3,)" in optimizer_state_problem(bad, params)
    nan = {name: {"momentum_buffer": torch.full_like(ref, float("nan"))}}
    assert "NaN or Inf" in optimizer_state_problem(nan, params)


def test_keep_optimizer_state_needs_momentum_and_marks_the_client_stateful():
    with pytest.raises(ConfigError, match="client.momentum is 0"):
        load_config("tiny", "fedavg", "client.keep_optimizer_state=true client.momentum=0")
    fedavg = registry.resolve("client", "fedavg")
    assert not fedavg.keeps_state(load_config("tiny", "fedavg", ""))
    assert fedavg.keeps_state(load_config("tiny", "fedavg", "client.keep_optimizer_state=true"))
    assert registry.resolve("client", "moon").keeps_state(load_config("tiny", "moon", ""))


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


# ------------------------------------------------------- precision and memory layout
def _second_conv(model: torch.nn.Module) -> torch.nn.Module:
    """The model's second convolution: its input has several channels (with one channel an
    NCHW tensor is also channels-last), and its layout is what the first one passed on."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)][1]


def _seen_by_first_conv(client, global_weights) -> tuple[list, list, list, int]:
    """One round of ``client``: the dtypes of its second convolution's outputs and the memory
    layouts of its inputs (channels-last or not), call by call, the returned weights and the
    number of training steps (the calls after them are the personal evaluation's)."""
    dtypes, layouts = [], []
    conv = _second_conv(client.model)
    conv.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    conv.register_forward_pre_hook(
        lambda m, i: layouts.append(i[0].is_contiguous(memory_format=torch.channels_last))
    )
    new, _, metrics = client.fit(global_weights(client), {"server-round": 1})
    assert np.isfinite(metrics["train_loss"])
    return dtypes, layouts, new, metrics["steps"]


def test_bf16_autocasts_the_training_forward_pass_and_keeps_fp32_weights(
    make_client, global_weights
):
    """``client.precision=bf16``: the training steps' convolutions run in bfloat16 (the
    personal evaluation after them does not), the weights sent back are fp32, and the update
    is the fp32 update up to bf16 rounding; ``fp32`` (the default) autocasts nothing."""
    fp32, _, w32, _ = _seen_by_first_conv(make_client("fedavg"), global_weights)
    c = make_client("fedavg", overrides="client.precision=bf16")
    bf16, _, w16, steps = _seen_by_first_conv(c, global_weights)
    assert set(fp32) == {torch.float32}
    assert bf16[:steps] == [torch.bfloat16] * steps and set(bf16[steps:]) == {torch.float32}
    assert all(a.dtype == np.float32 for a in w16)
    assert 0.98 < update_cosine(w32, w16, global_weights(c)) < 1 - 1e-9  # close, not the same


@pytest.mark.parametrize("method", ["moon", "pmfl", "fedrcl", "fedrane", "fedccl", "fedprox"])
def test_every_method_trains_two_rounds_in_bf16_and_channels_last(
    make_client, global_weights, tmp_path, method
):
    """Each method's loss (fp32 inside autocast), state (MOON's and PMFL's models saved from a
    channels-last model) and payloads work with both options, round 2 reading round 1's
    state. One step a round, so that the two updates can be compared: the step points where
    the default settings' does, up to bf16 rounding (over many steps the two trajectories
    drift apart, as any two runs that differ by rounding do; whether bf16 changes accuracy
    beyond seed noise is measured on a GPU run, not here)."""
    one_step = "client.steps=1 client.batch_size=32"
    plain = make_client(method, overrides=one_step, store=StateStore(tmp_path / "plain"))
    both = make_client(
        method,
        overrides=f"{one_step} client.precision=bf16 client.channels_last=true",
        store=StateStore(tmp_path / "both"),
    )
    w0 = global_weights(both)
    for rnd in (1, 2):
        ref = plain.fit(w0, {"server-round": rnd})[0]
        new, _, metrics = both.fit(w0, {"server-round": rnd})
        assert np.isfinite(metrics["train_loss"]) and all(a.flags.c_contiguous for a in new)
        assert update_cosine(ref, new, w0) > 0.98  # measured: 0.991 (FedRANE) to 0.99999


def test_channels_last_changes_the_layout_not_the_update(make_client, global_weights):
    """``client.channels_last``: convolution weights and every training batch are in NHWC
    order; the weights sent back are in the standard order. One step's update equals the
    default layout's to float rounding (another convolution algorithm, the same math). Over
    a whole round (22 steps on the tiny experiment) the rounding differences grow, as in any
    two runs that differ by rounding, so the round's update is compared by its relative
    difference (measured 4.7e-4 on an AVX512 Intel Xeon, where an elementwise 1e-4
    comparison fails; 3e-7 with ``ATEN_CPU_CAPABILITY=default``), which a wrong layout
    would put near 1."""
    c = make_client("fedavg", overrides="client.channels_last=true")
    conv = _second_conv(c.model)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()
    _, nhwc, new, steps = _seen_by_first_conv(c, global_weights)
    assert steps > 1 and nhwc[:steps] == [True] * steps
    _, nchw, ref, _ = _seen_by_first_conv(make_client("fedavg"), global_weights)
    assert not any(nchw)
    assert all(a.flags.c_contiguous for a in new)
    assert update_relative_difference(new, ref, global_weights(c)) < 5e-3

    one_step = "client.steps=1"
    _, _, new1, _ = _seen_by_first_conv(
        make_client("fedavg", overrides=f"{one_step} client.channels_last=true"), global_weights
    )
    _, _, ref1, _ = _seen_by_first_conv(make_client("fedavg", overrides=one_step), global_weights)
    assert all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(new1, ref1, strict=True))


def test_precision_is_refused_outside_its_choices():
    with pytest.raises(ConfigError, match=r"client\.precision.*'fp16'.*fp32 \| bf16"):
        load_config("tiny", "fedavg", "client.precision=fp16")
