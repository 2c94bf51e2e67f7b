import re
from pathlib import Path

import pytest
import yaml

from core.params import ConfigError
from fl_app import registry
from fl_app.config import (
    NULL_DEFAULT_TYPES,
    load_config,
    parse_overrides,
    participation_warning,
    run_dir,
)

ROOT = Path(__file__).resolve().parents[2]


def test_merge_order_experiment_over_method_over_base():
    cfg = load_config("smoke", "fedprox")
    assert cfg["num_clients"] == 3 and cfg["num_rounds"] == 3  # experiment
    assert cfg["client"]["name"] == "fedprox" and cfg["client"]["mu"] == 0.001  # method
    assert cfg["client"]["weight_decay"] == 0.0  # base
    assert cfg["data"]["channels"] == 1  # dataset preset


def test_overrides_win_and_are_typed():
    cfg = load_config("smoke", "fedprox", "client.mu=0.5 data.alpha=2 model.channels=[4,8]")
    assert cfg["client"]["mu"] == 0.5
    assert cfg["data"]["alpha"] == 2
    assert cfg["model"]["channels"] == [4, 8]


def test_every_null_default_has_a_type():
    """A key whose default is null is type-checked like the others (``client.steps=2.5``
    used to pass and then loop forever collecting batches): each has an entry."""
    base = yaml.safe_load((ROOT / "conf" / "base.yaml").read_text())
    nulls = {
        f"{section}.{key}"
        for section, values in base.items()
        if isinstance(values, dict)
        for key, value in values.items()
        if value is None
    }
    assert nulls == set(NULL_DEFAULT_TYPES)


def test_null_default_keys_take_values_of_their_type():
    cfg = load_config("smoke", "fedavg", "client.steps=5 client.grad_clip=1 data.train_subset=100")
    assert (cfg["client"]["steps"], cfg["client"]["grad_clip"]) == (5, 1)
    assert load_config("smoke", "fedavg", "client.grad_clip=1e-3")["client"]["grad_clip"] == 1e-3
    assert load_config("smoke", "fedavg", "client.steps=null")["client"]["steps"] is None


def test_parse_overrides_nested_and_quoted():
    assert parse_overrides("a.b=1 c='x y' d=null e=true") == {
        "a": {"b": 1},
        "c": "x y",
        "d": None,
        "e": True,
    }
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides("client.lr")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("client.lrr=0.1", "unknown key 'client.lrr'"),
        ("data.alpha=0", "'data.alpha' = 0 is out of range"),
        ("client.lr=-1", "'client.lr' = -1 is out of range"),
        ("server.fraction=1.5", "'server.fraction' = 1.5 is out of range"),
        ("data.test_fraction=1", "'data.test_fraction' = 1 is out of range"),
        ("data.test_fraction=0", "leaves clients no local test split.*set both to false"),
        ("client.epochs=abc", "'client.epochs' = 'abc' has type str"),
        ("data.dataset=imagenet", "unknown dataset .imagenet."),
        ("client.name=nope", "unknown client.name 'nope'"),
        ("data.root=2024", "'data.root' = 2024 has type int; expected null or str.*'2024'"),
        # keys whose default is null still have a type
        ("client.steps=2.5", "'client.steps' = 2.5 has type float; expected null or int"),
        ("client.steps=abc", "'client.steps' = 'abc' has type str; expected null or int"),
        ("data.train_subset=abc", "'data.train_subset' = 'abc' has type str"),
        ("client.grad_clip=abc", "'client.grad_clip' = 'abc' has type str"),
        ("data.partition_file=5", "'data.partition_file' = 5 has type int"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("smoke", "fedavg", overrides)


@pytest.mark.parametrize(
    ("method", "overrides", "message"),
    [
        ("fedavg", "seed=-1", "'seed' = -1 is out of range"),
        ("fedavg", "server.checkpoint_every=0", "'server.checkpoint_every' = 0"),
        ("fedavg", "evaluation.batch_size=0", "'evaluation.batch_size' = 0"),
        ("fedavg", "server.max_update_norm=0", "'server.max_update_norm' = 0"),
        ("fedavg", "model.channels=[6,-1]", "'model.channels' = \\[6, -1\\]"),
        ("fedavg", "model.feature_dim=0", "'model.feature_dim' = 0"),
        # a model that cannot be built is refused with the config, not in the ServerApp
        ("fedavg", "model.kernel_size=13", "after stage 2 of model.channels .6, 16. with"),
        ("fedavg", "model.channels=[6,16,32]", "no feature map after stage 3"),
        ("fedrane", "model.projection_dim=64", "client 'fedrane'.*set model.projection_dim=0"),
        ("fedavg", "server.markov_p01=2", "'server.markov_p01' = 2"),
        ("fedavg", "server.participation_floor=0.5", "participation_floor.*<= server.part"),
        ("fedavg", "server.fraction=0.3", "applies only to server.participation=uniform"),
        ("fedavg", "server.participation=uniform server.min_clients=9", "at most num_clients"),
        # method hyperparameters: the range each Params field declares
        ("fedprox", "client.mu=-1", "'client.mu' = -1 is out of range; allowed: a number >= 0"),
        ("moon", "client.tau=0", "'client.tau' = 0 is out of range; allowed: a number > 0"),
        ("moon", "client.buffer_size=0", "'client.buffer_size' = 0.*an integer >= 1"),
        ("fedrcl", "client.mining=foo", "'client.mining' = 'foo'.*allowed: paper \\| hard"),
        ("fedrcl", "client.lam=1.5", "'client.lam' = 1.5"),
        ("fedccl", "client.signals=foo", "'client.signals' = 'foo'.*finch \\| mean"),
        ("fedccl", "server.server_signals=foo", "'server.server_signals' = 'foo'"),
        ("fedrane", "client.lam_r=0", "'client.lam_r' = 0"),
        ("pmfl", "server.cutoff=0", "'server.cutoff' = 0"),
        ("pmfl", "server.psi_start=1.5", "'server.psi_start' = 1.5.*0 <= x <= 1"),
        ("fedavg_m", "server.server_momentum=1.5", "'server.server_momentum' = 1.5"),
        ("fedavg_m", "server.server_lr=0", "'server.server_lr' = 0"),
        ("fedavg_adam", "server.tau=0", "'server.tau' = 0"),
        ("fedavg_adam", "server.beta_2=2", "'server.beta_2' = 2"),
    ],
)
def test_out_of_range_values_are_rejected_before_anything_runs(method, overrides, message):
    """Each of these trained silently wrong (a negative proximal weight, a server that never
    moves, a NaN global model) or failed every client every round."""
    with pytest.raises(ConfigError, match=message):
        load_config("smoke", method, overrides)


def test_exponent_floats_written_without_a_dot_are_read_as_floats():
    """YAML 1.1 reads 1e-3 as a string; a float key takes it as 0.001."""
    cfg = load_config("smoke", "fedprox", "client.lr=1e-3 client.mu=5e-4")
    assert cfg["client"]["lr"] == 0.001 and cfg["client"]["mu"] == 0.0005
    with pytest.raises(ConfigError, match="'client.lr' = 'fast' has type str"):
        load_config("smoke", "fedprox", "client.lr=fast")
    with pytest.raises(ConfigError, match="'client.epochs' = '1e3' has type str"):
        load_config("smoke", "fedprox", "client.epochs=1e3")  # an int key stays strict


def test_unknown_presets_list_choices():
    with pytest.raises(ConfigError, match="unknown experiment 'nope'; choose one of .*smoke"):
        load_config("nope", "fedavg")
    with pytest.raises(ConfigError, match="unknown method 'nope'; choose one of .*fedprox"):
        load_config("smoke", "nope")


def test_method_key_of_another_method_is_rejected_with_the_classes_that_have_it():
    with pytest.raises(
        ConfigError, match="unknown key 'client.mu'.*of client.name fedprox \\| moon:"
    ):
        load_config("smoke", "fedavg", "client.mu=1")
    with pytest.raises(
        ConfigError,
        match="'cutoff' is a hyperparameter of server.name fedau \\| fedcclau \\| pmfl:",
    ):
        load_config("smoke", "fedavg", "server.cutoff=3")


@pytest.mark.parametrize(
    ("over", "hint"),
    [
        ("lr=0.1", "(did you mean client.lr?)"),
        ("rounds=3", "(did you mean num_rounds?)"),
        ("data.alpah=0.3", "(did you mean data.alpha?)"),
        ("client.momentun=0.9", "(did you mean client.momentum?)"),
        ("client.nope=1", "weight_decay"),  # nothing close: no guess
        ("client.temperature=1", "weight_decay"),
        ("client.tau=1", "(or set client.name)"),  # another method's: says where, no guess
    ],
)
def test_an_unknown_key_suggests_the_key_meant(over, hint):
    with pytest.raises(ConfigError) as err:
        load_config("smoke", "fedavg", over)
    assert str(err.value).endswith(hint)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ("client.lr=.inf", "'client.lr' = inf is not a finite number"),
        ("data.alpha=.nan", "'data.alpha' = nan is not a finite number"),
        ("client.device=cuda:abc", "'client.device' = 'cuda:abc' is not one of the choices"),
        ("client.device=cuda:-1", "'client.device' = 'cuda:-1' is not one of the choices"),
        ("client.lr='0.1", "No closing quotation: quote each value that holds spaces once"),
        ("model.channels=[6, 16]", "write it without spaces, model.channels=[6,16], or quote"),
        ("client.lr=null", "'client.lr' = None has type NoneType; expected float"),
        ("server.max_update_norm=null", "'server.max_update_norm' = None has type NoneType"),
        ("client.grad_clip=.inf", "'client.grad_clip' = inf is not a finite number; give a number"),
        ("data.dataset=digits data.root=/x", "data.dataset=digits ships with scikit-learn"),
    ],
)
def test_values_and_quoting_that_used_to_slip_through_or_crash(over, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("smoke", "fedavg", over)


def test_null_and_infinity_where_they_mean_something():
    """Null where the default is null (off / the default place); .inf only for the update
    norm filter, where it switches the filter off."""
    cfg = load_config("smoke", "fedavg", "client.steps=null data.root=null")
    assert cfg["client"]["steps"] is None and cfg["data"]["root"] is None
    cfg = load_config("smoke", "fedavg", "server.max_update_norm=.inf")
    assert cfg["server"]["max_update_norm"] == float("inf")


def test_a_preset_is_named_not_reached_by_a_path():
    """``--experiment ../methods/moon`` loaded MOON's method file as the experiment."""
    with pytest.raises(ConfigError, match="unknown experiment '../methods/moon'"):
        load_config("../methods/moon", "fedavg")
    assert load_config("smoke", "fedavg", "client.device=cuda:1")["client"]["device"] == "cuda:1"


def test_top_level_unknown_key_lists_only_keys_that_set_may_change():
    """``experiment``/``method``/``seed``/``output_dir`` have their own options (refused in
    SET), so they are not offered; ``resume`` is pointed to its option."""
    with pytest.raises(ConfigError) as err:
        load_config("smoke", "fedavg", "resume=true")
    listed = str(err.value).split("allowed keys here: ")[1].split(" (")[0].split(", ")
    assert listed == [
        "client",
        "data",
        "evaluation",
        "model",
        "num_clients",
        "num_rounds",
        "server",
    ]
    assert "RESUME=1 with make" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("client.mining=foo", "'client.mining' = 'foo' is not one of the choices; allowed: paper"),
        ("server.participation=x", "'server.participation' = 'x' is not one of the choices"),
        ("client.device=tpu", "'client.device' = 'tpu' is not one of the choices"),
        (
            "model.name=vgg",
            "'model.name' = 'vgg' is not one of the choices; allowed: cnn \\| resnet18_gn",
        ),
    ],
)
def test_a_value_outside_a_list_of_choices_is_called_so(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("smoke", "fedrcl", overrides)


def test_run_dir_layout(tmp_path):
    cfg = load_config("smoke", "fedavg", {"output_dir": str(tmp_path), "seed": 3})
    assert run_dir(cfg) == tmp_path / "smoke" / "fedavg" / "seed3"


def _presets(kind: str) -> list[str]:
    root = Path(__file__).resolve().parents[2] / "conf" / kind
    return sorted(p.stem for p in root.glob("*.yaml"))


@pytest.mark.parametrize("experiment", _presets("experiments"))
def test_every_method_preset_validates_in_every_experiment(experiment):
    """Each method works in each protocol preset (smoke, P1, P3, P4, ...) as far as the
    config goes: merged and validated, its client and server classes resolvable."""
    for method in _presets("methods"):
        cfg = load_config(experiment, method)
        assert cfg["method"] == method and cfg["experiment"] == experiment
        registry.resolve("client", cfg["client"]["name"])
        registry.resolve("server", cfg["server"]["name"])


@pytest.mark.parametrize(
    ("method", "server", "fits"),
    [
        # a former FedCCL server name (an alias: an aggregator + FedCCL's signals) with a
        # client that sends no signals
        ("fedavg", "fedccl", "fedavg, fedavgm, fedadam, gne, fedau, pmfl"),  # signals missing
        ("moon", "fedcclgne", "fedavg, fedavgm, fedadam, gne, fedau, pmfl"),
    ],
)
def test_client_and_server_payloads_must_match(method, server, fits):
    with pytest.raises(ConfigError, match=f"cannot take; choose server.name from: {fits}$"):
        load_config("tiny", method, f"server.name={server}")


@pytest.mark.parametrize("server", ["fedavg", "fedavgm", "fedadam", "gne", "fedau", "pmfl"])
def test_fedccl_signals_go_with_any_aggregator(server):
    """The exchange is the client's: FedCCL with any aggregator is a YAML change (it used to
    need a combination server class), its ``server_signals`` kept from the preset."""
    cfg = load_config("tiny", "fedccl", f"server.name={server} server.server_signals=mean")
    assert cfg["server"]["name"] == server and cfg["server"]["server_signals"] == "mean"
    assert load_config("tiny", "fedccl_m", f"server.name={server}")["server"]["server_signals"]


def test_former_fedccl_server_names_are_aliases_with_their_aggregators_keys():
    cfg = load_config("tiny", "fedccl_m")
    assert cfg["server"]["name"] == "fedcclm"  # kept as written: saved configs still match
    assert {"server_lr", "server_momentum", "server_signals"} <= set(cfg["server"])
    assert load_config("tiny", "fedccl_au")["server"]["cutoff"] == 50


def test_an_exchange_key_without_a_client_that_brings_it_names_what_to_do():
    with pytest.raises(
        ConfigError,
        match="'server_signals' is a hyperparameter of the signals payload exchange, which "
        "client.name fedccl brings \\(with any server.name\\): choose a METHOD",
    ):
        load_config("tiny", "fedavg", "server.server_signals=finch")
    # a preset's exchange key goes with its client: another client drops it
    cfg = load_config("tiny", "fedccl", "client.name=fedavg server.name=fedavgm")
    assert "server_signals" not in cfg["server"]


def test_choosing_another_server_or_client_drops_the_presets_hyperparameters():
    """PMFL's preset sets ``server.history: 3``; with ``server.name=fedau`` that would make
    FedAU PMFL's server, and with ``server.name=fedavg`` it was an unknown key."""
    assert load_config("p3", "pmfl", "server.name=fedau")["server"]["history"] == 1
    assert "history" not in load_config("p3", "pmfl", "server.name=fedavg")["server"]
    assert load_config("p3", "pmfl", "server.name=pmfl")["server"]["history"] == 3
    cfg = load_config("p3", "pmfl", "server.name=fedau server.cutoff=7 client.name=moon")
    assert cfg["server"]["cutoff"] == 7 and cfg["client"]["mu"] == 5.0  # typed / class default
    assert cfg["server"]["participation"] == "bernoulli"  # base keys of the preset stay
    with pytest.raises(ConfigError, match="unknown key 'client.beta'"):  # typed: checked
        load_config("smoke", "fedrcl", "client.name=moon client.beta=1")


def test_a_section_given_a_value_is_a_clear_error():
    with pytest.raises(ConfigError, match="'client' = 5 must be a mapping of keys"):
        load_config("smoke", "fedavg", "client=5")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), ("false", False), (" True ", True), (None, "error")],
)
def test_run_flag_reads_bools_and_their_strings_only(value, expected):
    """``--run-config "resume='false'"`` passes a string: ``bool('false')`` would resume."""
    from fl_app.config import run_flag

    assert run_flag({}, "resume") is False
    if expected == "error":
        with pytest.raises(ConfigError, match="resume=None: use true or false"):
            run_flag({"resume": value}, "resume")
        return
    assert run_flag({"resume": value}, "resume") is expected
    with pytest.raises(ConfigError, match="resume=1"):
        run_flag({"resume": 1}, "resume")


def test_more_clients_than_training_samples_is_a_config_error():
    """Found when the config loads, not after a federation of 5000 nodes has started."""
    with pytest.raises(ConfigError, match="train_subset' = 3000 .*at least num_clients = 5000"):
        load_config("smoke", "fedavg", "num_clients=5000")
    assert load_config("smoke", "fedavg", "num_clients=6 data.train_subset=6")["num_clients"] == 6


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        ("server.participation=bernoulli server.participation_mean=0.2", True),  # 0.6 a round
        ("server.participation=markov server.participation_mean=0.2 num_clients=4", True),
        ("server.participation=cyclic server.participation_mean=0.34", False),  # 1.02
        ("server.participation=uniform server.fraction=0.1", False),  # min_clients 1 each round
        ("server.participation=all", False),
    ],
)
def test_participation_expecting_under_one_participant_a_round_is_warned(overrides, warned):
    """Valid (a user may mean it), but named: ``smoke`` has 3 clients."""
    warning = participation_warning(load_config("smoke", "fedavg", overrides))
    if not warned:
        assert warning is None
        return
    assert warning is not None
    n = load_config("smoke", "fedavg", overrides)["num_clients"]
    expected = {
        3: ("0.6 participants", "40% of rounds", "at least 0.34 or"),
        4: ("0.8", "20%", "0.25"),
    }
    for part in expected[n]:
        assert part in warning, warning
    # the advised mean is enough: it silences the warning
    advised = re.search(r"at least ([0-9.]+) or add clients", warning)
    assert advised is not None
    fixed = f"{overrides} server.participation_mean={advised[1]}"
    assert participation_warning(load_config("smoke", "fedavg", fixed)) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            "model.norm=batch",
            r"'model.norm' = 'batch' is not one of the choices; allowed: none \| group",
        ),
        ("model.padding=-1", r"'model.padding' = -1 is out of range; allowed: an integer >= 0"),
        ("model.norm=group model.channels=[6,15]", r"cannot split into 2 groups"),
        ("model.channels=[8,8,8]", r"no feature map after stage 3.*more padding"),
    ],
)
def test_cnn_padding_and_norm_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("smoke", "fedavg", overrides)
    cfg = load_config(
        "smoke", "fedavg", "model.channels=[8,8,8] model.kernel_size=3 model.padding=1"
    )
    assert (cfg["model"]["padding"], cfg["model"]["norm"]) == (1, "none")
