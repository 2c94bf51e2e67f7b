"""Configuration: YAML presets merged in a fixed order, overridden from the command line,
validated once before anything trains.

Merge order (later wins): ``conf/base.yaml`` → ``conf/datasets/<dataset>.yaml`` →
``conf/methods/<method>.yaml`` → ``conf/experiments/<experiment>.yaml`` (and its
``per_method.<method>`` block) → dotted overrides (``set='client.lr=0.1 data.alpha=0.5'``).

Every key must exist in ``conf/base.yaml`` or be a hyperparameter declared by the chosen
client class, the chosen aggregator (``server.name``) or the payload exchange the client
brings (the ``server`` section holds both of the last two: their ``Params`` dataclasses);
values must have the default's type (a float may be written ``1e-3``, which YAML reads as a
string). Hyperparameters declare their range with :func:`hyper` and its shorthands
(:func:`positive`, :func:`nonnegative`, :func:`at_least`, :func:`below_one`,
:func:`unit_interval`, :func:`one_of`). Errors are
:class:`ConfigError` and name the key, the bad value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import shlex
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import yaml

from core.data import DATASETS, PARTITIONS
from core.params import NOT_A_CHOICE, Config, ConfigError
from fl_app import registry

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SECTIONS_WITH_PARAMS = ("client", "server")

OWN_OPTIONS = ("seed", "output_dir", "experiment", "method")  # set by options, not in SET


def available(kind: str) -> list[str]:
    """Names of the presets of one kind (``datasets``, ``methods`` or ``experiments``)."""
    return sorted(p.stem for p in (CONF_DIR / kind).glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys, got {type(data).__name__}")
    return data


def _preset(kind: str, name: str) -> dict[str, Any]:
    path = CONF_DIR / kind / f"{name}.yaml"
    if name not in available(kind):  # a name, not a path: "../methods/moon" is no experiment
        singular = kind.rstrip("s")
        raise ConfigError(
            f"unknown {singular} {name!r}; choose one of {', '.join(available(kind))} "
            f"(the files conf/{kind}/<name>.yaml of the app)"
        )
    return _read_yaml(path)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated recursively with ``override`` (neither is modified)."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_overrides(text: str | list[str] | None) -> dict[str, Any]:
    """Parse ``"a.b=1 c='x y'"`` (or a list of ``key=value``) into a nested mapping.

    Values are read as YAML scalars/flow collections: ``0.1`` is a float, ``true`` a bool,
    ``null`` is None, ``[6, 16]`` a list. Quote values that contain spaces.
    """
    try:
        items = shlex.split(text) if isinstance(text, str) else list(text or [])
    except ValueError as err:  # shlex: "No closing quotation", "No escaped character"
        raise ConfigError(
            f"overrides {text!r}: {err}: quote each value that holds spaces once, e.g. "
            "SET=\"data.root='/my data' client.lr=0.1\""
        ) from err
    nested: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. client.lr=0.1)"
            )
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            hint = (
                f" (a list or mapping is one value: write it without spaces, {key}=[6,16], "
                f"or quote it, {key}='[6, 16]')"
                if raw.lstrip()[:1] in ("[", "{")
                else ""
            )
            raise ConfigError(f"override {item!r}: cannot read value {raw!r}{hint}: {err}") from err
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return nested


def load_config(
    experiment: str | None = None,
    method: str | None = None,
    overrides: str | list[str] | dict[str, Any] | None = None,
) -> Config:
    """Build the merged, validated configuration of one run.

    ``experiment`` and ``method`` default to the values in base.yaml (or in the overrides).
    Raises :class:`ConfigError` for unknown presets, unknown keys and bad values.
    """
    cli = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    base = _read_yaml(CONF_DIR / "base.yaml")
    experiment = experiment or cli.get("experiment") or base["experiment"]
    method = method or cli.get("method") or base["method"]
    exp = _preset("experiments", str(experiment))
    per_method = exp.pop("per_method", {}) or {}
    meth = _preset("methods", str(method))
    dataset = (
        (cli.get("data") or {}).get("dataset")
        or (exp.get("data") or {}).get("dataset")
        or base["data"]["dataset"]
    )
    cfg = deep_merge(base, _preset("datasets", str(dataset)))
    cfg = deep_merge(cfg, meth)
    cfg = deep_merge(cfg, exp)
    cfg = deep_merge(cfg, per_method.get(method, {}) or {})
    typed_client = cli.get("client")
    client = cfg["client"]["name"]
    if isinstance(typed_client, Mapping):
        client = typed_client.get("name", client)
    exchange_keys = _exchange_keys(client)
    for section in SECTIONS_WITH_PARAMS:
        typed, preset = cli.get(section), cfg[section]
        if isinstance(typed, Mapping) and typed.get("name", preset["name"]) != preset["name"]:
            # the exchange's keys belong to the client, which stays (see _exchange_keys)
            keep = exchange_keys if section == "server" else set()
            cfg[section] = _without_preset_params(preset, base[section], keep)
    if client != cfg["client"]["name"]:  # the preset's client exchanged its payload
        dropped = _exchange_keys(cfg["client"]["name"]) - exchange_keys
        cfg["server"] = {k: v for k, v in cfg["server"].items() if k not in dropped}
    cfg = deep_merge(cfg, cli)
    cfg["experiment"], cfg["method"] = str(experiment), str(method)
    return validate(cfg, base)


def _without_preset_params(
    preset: Mapping[str, Any],
    base: Mapping[str, Any],
    keep: set[str] | frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """``SET="server.name=fedau"`` on a preset with another server: the preset's
    hyperparameters are those of the class it names, not of the chosen one (PMFL's
    ``history: 3`` would make FedAU PMFL's server), so only the base keys (and ``keep``:
    the server keys of the client's payload exchange, e.g. FedCCL's ``server_signals``,
    which do not depend on the aggregator) stay; the chosen class starts from its own
    defaults, and keys typed on the command line still apply."""
    return {k: v for k, v in preset.items() if k in base or k in keep}


def _exchange_keys(client: Any) -> set[str]:
    """The ``server`` keys of the payload exchange that client ``client`` brings (empty: it
    brings none, or the name is unknown, which :func:`validate` reports)."""
    try:
        exchange = registry.exchange_class(registry.exchange_name(str(client)))
    except ConfigError:
        return set()
    return set() if exchange is None else {f.name for f in dataclasses.fields(exchange.Params)}


# Keys for which .inf means "no limit" (every other float must be finite).
INFINITE_OK = frozenset({"server.max_update_norm"})

# The type of each key whose default is null (null = "off" / "the default location"): a
# value given for one must have it, as keys with a typed default must have theirs.
NULL_DEFAULT_TYPES: dict[str, Any] = {
    "data.root": "",
    "data.train_subset": 1,
    "data.test_subset": 1,
    "data.partition_file": "",
    "client.steps": 1,
    "client.grad_clip": 1.0,
}


def _type_ok(default: Any, value: Any, nullable: bool = False) -> bool:
    """Whether ``value`` has the type of ``default`` (any type where ``default`` is None;
    null only where ``nullable``; an int where a float is expected)."""
    if value is None:
        return nullable
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _parse_float(value: Any) -> Any:
    """``'1e-3'`` (YAML 1.1 reads exponents without a dot as strings) as 0.001; other
    values unchanged."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        if math.isfinite(number):
            return number
    return value


def _check_keys(
    cfg: MutableMapping[str, Any],
    schema: Mapping[str, Any],
    prefix: str,
    root: Mapping[str, Any] | None = None,
    also: Mapping[str, tuple[type, ...]] | None = None,
) -> None:
    """Refuse unknown keys and values of the wrong type in ``cfg`` against ``schema`` (the
    defaults), recursively; ``root`` is the whole schema (for suggestions); ``also``: the
    dotted keys that may also take values of other types (:func:`hyper`'s ``types``)."""
    root = schema if root is None else root
    also = also or {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if key not in schema:
            raise ConfigError(_unknown_key(path, schema, prefix, root))
        default = schema[key]
        typed_like = NULL_DEFAULT_TYPES.get(path) if default is None else default
        if isinstance(typed_like, float):
            cfg[key] = value = _parse_float(value)
            if (
                isinstance(value, float)
                and not math.isfinite(value)
                and not (value == math.inf and path in INFINITE_OK)
            ):
                example = f" such as the default {default!r}" if default is not None else ""
                raise ConfigError(
                    f"{path!r} = {value!r} is not a finite number; give a number{example}"
                )
        if isinstance(default, Mapping):
            if not isinstance(value, MutableMapping):
                raise ConfigError(f"{path!r} must be a mapping, got {value!r}")
            _check_keys(value, default, f"{path}.", root, also)
        elif not _type_ok(typed_like, value, nullable=default is None) and not (
            value is not None and isinstance(value, also.get(path, ()))
        ):
            expected = (
                f"null or {type(typed_like).__name__}"
                if default is None
                else f"{type(default).__name__} like the default {default!r}"
            )
            expected += "".join(f" or {t.__name__}" for t in also.get(path, ()))
            quote = " (quote a value YAML reads as another type: '2024')"
            raise ConfigError(
                f"{path!r} = {value!r} has type {type(value).__name__}; expected {expected}"
                f"{quote if default is None and isinstance(typed_like, str) else ''}"
            )


def _unknown_key(path: str, schema: Mapping[str, Any], prefix: str, root: Mapping[str, Any]) -> str:
    """The error for an unknown key: the keys allowed where it was given, and, for a method
    hyperparameter of another client or server class or a key with its own option, where it
    belongs; otherwise the key of ``root`` (the whole schema) it may have meant."""
    key = path.rpartition(".")[2]
    hidden = OWN_OPTIONS if not prefix else ()  # listed at top level, but refused in SET
    allowed = ", ".join(k for k in sorted(schema) if k not in hidden)
    msg = f"unknown key {path!r}; allowed keys here: {allowed}"
    if not prefix and key == "resume":
        msg += " (to resume use RESUME=1 with make, --resume with python -m fl_app.launch)"
    section = prefix.rstrip(".")
    if section in SECTIONS_WITH_PARAMS:
        if section == "server":
            for exchange, clients in registry.clients_with_exchange_param(key).items():
                return (
                    f"{msg}. {key!r} is a hyperparameter of the {exchange} payload exchange, "
                    f"which client.name {' | '.join(clients)} brings (with any server.name): "
                    "choose a METHOD with such a client (or set client.name), or drop the key"
                )
        owners = registry.names_with_param(section, key)
        if owners:
            return (
                f"{msg}. {key!r} is a hyperparameter of {section}.name "
                f"{' | '.join(owners)}: choose a METHOD with that {section} (or set "
                f"{section}.name)"
            )
    return msg + _did_you_mean(path, root)


def _leaf_keys(schema: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every dotted key of ``schema`` that holds a value (not a section)."""
    out: list[str] = []
    for key, value in schema.items():
        if isinstance(value, Mapping):
            out += _leaf_keys(value, f"{prefix}{key}.")
        elif not (not prefix and key in OWN_OPTIONS):
            out.append(f"{prefix}{key}")
    return out


def _did_you_mean(path: str, root: Mapping[str, Any]) -> str:
    """`` (did you mean client.lr?)`` for an unknown dotted key: the keys of the whole config
    with the same name in another section (``lr`` → ``client.lr``), else close spellings of
    the name in the same section (``data.alpah`` → ``data.alpha``); empty when none is."""
    keys = _leaf_keys(root)
    section, _, last = path.rpartition(".")
    same = [k for k in keys if k.rpartition(".")[2] == last and k != path]
    if not same:
        here = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == section}
        same = [here[m] for m in difflib.get_close_matches(last, list(here), n=3, cutoff=0.75)]
    return f" (did you mean {' or '.join(same[:3])}?)" if same else ""


def _section_fields(section: str, name: str, client: str) -> list[dataclasses.Field[Any]]:
    """The hyperparameters of ``section`` whose class is ``name``: the client's ``Params``
    fields; for the server, the aggregator's and those of the exchange ``client`` brings
    (:func:`fl_app.registry.server_fields`)."""
    if section == "server":
        return registry.server_fields(name, client)
    return list(dataclasses.fields(registry.params_class(section, name)))


def _params_defaults(section: str, name: str, client: str) -> dict[str, Any]:
    """Every hyperparameter of ``section`` (see :func:`_section_fields`) with its default."""
    return {f.name: _field_default(f) for f in _section_fields(section, name, client)}


def _field_default(f: dataclasses.Field[Any]) -> Any:
    """A hyperparameter's default (every field of a Params dataclass must have one)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if callable(f.default_factory):
        return f.default_factory()
    raise TypeError(f"hyperparameter {f.name!r} has no default: give it one")


def validate(cfg: Config, base: Config | None = None) -> Config:
    """Check the client/server pairing, keys, types and ranges; fill method hyperparameter
    defaults. Returns ``cfg``."""
    base = base if base is not None else _read_yaml(CONF_DIR / "base.yaml")
    schema = copy.deepcopy(base)
    names: dict[str, str] = {}
    for section in SECTIONS_WITH_PARAMS:  # the client first: the server's keys depend on it
        if not isinstance(cfg.get(section, {}), Mapping):
            raise ConfigError(
                f"{section!r} = {cfg[section]!r} must be a mapping of keys;"
                f" set its keys one by one, e.g. {section}.name=... or {section}.lr=0.1"
            )
        names[section] = cfg.get(section, {}).get("name", base[section]["name"])
        params = _params_defaults(section, names[section], names["client"])
        schema[section].update(params)
        cfg[section] = {**params, **cfg.get(section, {})}
    # the pairing first: with a mismatched server the preset's server keys would be reported
    # as unknown, which hides the real mistake
    registry.check_pairing(names["client"], names["server"])
    fields = {s: _section_fields(s, names[s], names["client"]) for s in SECTIONS_WITH_PARAMS}
    also = {
        f"{section}.{f.name}": f.metadata["types"]
        for section in SECTIONS_WITH_PARAMS
        for f in fields[section]
        if f.metadata.get("types")
    }
    _check_keys(cfg, schema, "", also=also)
    _check_ranges(cfg)
    for section in SECTIONS_WITH_PARAMS:
        for field in fields[section]:
            rng, value = field.metadata.get("range"), cfg[section][field.name]
            if rng is not None and value is not None:
                _require(rng.ok(value), f"{section}.{field.name}", value, rng.allowed, rng.problem)
    _check_model(cfg, registry.resolve("client", cfg["client"]["name"]))
    return cfg


def _check_model(cfg: Config, client_cls: Any) -> None:
    """Build the client's model on the meta device (shapes only, no memory): a model section
    that cannot work with the data or the method (a kernel larger than the feature map,
    FedRANE with a projection head) fails here, not in the ServerApp after Flower started;
    so does a method setting that does not fit the model (the client's ``model_problem``:
    FedRCL's ``client.levels`` naming a level the model does not have)."""
    import torch

    try:
        with torch.device("meta"):
            model = client_cls.build_model(cfg)
    except (ValueError, RuntimeError) as err:
        raise ConfigError(
            f"the model section does not fit data {cfg['data']['dataset']!r} and client"
            f" {cfg['client']['name']!r}: {err}"
        ) from err
    problem = client_cls.model_problem(cfg, model)
    if problem:
        raise ConfigError(problem)


def _require(
    cond: bool, key: str, value: Any, allowed: str, problem: str = "is out of range"
) -> None:
    if not cond:
        raise ConfigError(f"{key!r} = {value!r} {problem}; allowed: {allowed}")


def _choice(value: Any, key: str, choices: tuple[str, ...]) -> None:
    _require(value in choices, key, value, " | ".join(choices), NOT_A_CHOICE)


def _check_ranges(cfg: Config) -> None:

    d, m, c, s, e = cfg["data"], cfg["model"], cfg["client"], cfg["server"], cfg["evaluation"]
    _require(cfg["num_rounds"] >= 1, "num_rounds", cfg["num_rounds"], "an integer >= 1")
    _require(cfg["num_clients"] >= 1, "num_clients", cfg["num_clients"], "an integer >= 1")
    _require(cfg["seed"] >= 0, "seed", cfg["seed"], "an integer >= 0")
    _choice(d["dataset"], "data.dataset", DATASETS)
    _choice(d["partition"], "data.partition", PARTITIONS)
    _require(d["alpha"] > 0, "data.alpha", d["alpha"], "a number > 0")
    _require(0 <= d["test_fraction"] < 1, "data.test_fraction", d["test_fraction"], "0 <= x < 1")
    if d["test_fraction"] == 0 and (c["personalized_eval"] or e["federated"]):
        raise ConfigError(
            "'data.test_fraction' = 0 leaves clients no local test split, but"
            " client.personalized_eval or evaluation.federated evaluates on it: set both to"
            " false (the global test set is still evaluated) or use a fraction > 0"
        )
    for key in ("min_partition_size", "classes_per_client", "shards_per_client"):
        low = 0 if key == "min_partition_size" else 1
        _require(d[key] >= low, f"data.{key}", d[key], f"an integer >= {low}")
    _require(
        d["classes_per_client"] <= d["num_classes"],
        "data.classes_per_client",
        d["classes_per_client"],
        f"at most data.num_classes = {d['num_classes']}",
    )
    _require(d["num_classes"] >= 2, "data.num_classes", d["num_classes"], "an integer >= 2")
    for key in ("channels", "image_size"):
        _require(d[key] >= 1, f"data.{key}", d[key], "an integer >= 1")
    for key in ("train_subset", "test_subset"):
        _require(d[key] is None or d[key] >= 1, f"data.{key}", d[key], "null or an integer >= 1")
    if d["train_subset"] is not None:  # found here, not after the federation's start-up
        _require(
            d["train_subset"] >= cfg["num_clients"],
            "data.train_subset",
            d["train_subset"],
            f"at least num_clients = {cfg['num_clients']} (one training sample per client)",
        )
    if d["dataset"] == "digits" and d["root"] is not None:  # it would be ignored
        raise ConfigError(
            f"'data.root' = {d['root']!r}, but data.dataset=digits ships with scikit-learn and "
            "reads no files: leave data.root out, or choose a dataset that is read from it"
        )
    _choice(d["domain"], "data.domain", ("none", "rotation", "contrast", "noise", "mixed"))
    _choice(d["size_skew"], "data.size_skew", ("linear", "square", "exponential"))
    _choice(m["name"], "model.name", ("cnn", "resnet18_gn"))
    _require(m["projection_dim"] >= 0, "model.projection_dim", m["projection_dim"], ">= 0")
    _require(
        bool(m["channels"]) and all(isinstance(x, int) and x >= 1 for x in m["channels"]),
        "model.channels",
        m["channels"],
        "a non-empty list of integers >= 1, e.g. [6, 16]",
    )
    _require(
        all(isinstance(x, int) and x >= 1 for x in m["hidden"]),
        "model.hidden",
        m["hidden"],
        "a list of integers >= 1 (fc widths before h), e.g. [] or [120]",
    )
    for key in ("kernel_size", "feature_dim"):
        _require(m[key] >= 1, f"model.{key}", m[key], "an integer >= 1")
    _require(m["padding"] >= 0, "model.padding", m["padding"], "an integer >= 0")
    _choice(m["norm"], "model.norm", ("none", "group"))
    _require(c["lr"] > 0, "client.lr", c["lr"], "a number > 0")
    _require(0 < c["lr_decay"] <= 1, "client.lr_decay", c["lr_decay"], "0 < x <= 1")
    _require(0 <= c["momentum"] < 1, "client.momentum", c["momentum"], "0 <= x < 1")
    _require(c["weight_decay"] >= 0, "client.weight_decay", c["weight_decay"], ">= 0")
    if c["keep_optimizer_state"] and c["momentum"] == 0:
        raise ConfigError(
            "client.keep_optimizer_state=true keeps SGD's momentum buffers from round to"
            " round, but client.momentum is 0 (SGD then keeps no state): set client.momentum"
            " > 0, or leave keep_optimizer_state false"
        )
    _require(c["batch_size"] >= 1, "client.batch_size", c["batch_size"], "an integer >= 1")
    _require(c["epochs"] >= 1, "client.epochs", c["epochs"], "an integer >= 1")
    _require(c["steps"] is None or c["steps"] >= 1, "client.steps", c["steps"], "null or >= 1")
    _require(
        c["grad_clip"] is None or c["grad_clip"] > 0, "client.grad_clip", c["grad_clip"], "> 0"
    )
    dev = str(c["device"])
    _require(
        dev in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", dev) is not None,
        "client.device",
        dev,
        "auto | cpu | cuda | cuda:N",
        NOT_A_CHOICE,
    )
    _require(c["num_threads"] >= 1, "client.num_threads", c["num_threads"], ">= 1")
    _choice(c["precision"], "client.precision", ("fp32", "bf16"))
    _require(c["adv_eps"] > 0, "client.adv_eps", c["adv_eps"], "a number > 0")
    _require(c["adv_alpha"] > 0, "client.adv_alpha", c["adv_alpha"], "a number > 0")
    _require(c["adv_steps"] >= 1, "client.adv_steps", c["adv_steps"], "an integer >= 1")
    _choice(s["weighting"], "server.weighting", ("samples", "uniform"))
    patterns = ("all", "uniform", "bernoulli", "markov", "cyclic")
    _choice(s["participation"], "server.participation", patterns)
    _require(0 < s["fraction"] <= 1, "server.fraction", s["fraction"], "0 < x <= 1")
    _require(s["min_clients"] >= 1, "server.min_clients", s["min_clients"], ">= 1")
    if s["participation"] != "uniform" and s["fraction"] != 1:
        raise ConfigError(
            f"'server.fraction' = {s['fraction']!r} applies only to"
            f" server.participation=uniform, but participation is {s['participation']!r}:"
            " set server.participation=uniform, or leave fraction at 1.0"
            " (bernoulli/markov/cyclic take server.participation_mean)"
        )
    if s["participation"] == "uniform":
        _require(
            s["min_clients"] <= cfg["num_clients"],
            "server.min_clients",
            s["min_clients"],
            f"at most num_clients = {cfg['num_clients']}",
        )
    _require(
        s["participation_beta"] > 0, "server.participation_beta", s["participation_beta"], "> 0"
    )
    _require(
        0 < s["participation_mean"] <= 1,
        "server.participation_mean",
        s["participation_mean"],
        "0 < x <= 1",
    )
    _require(
        0 <= s["participation_floor"] <= s["participation_mean"],
        "server.participation_floor",
        s["participation_floor"],
        f"0 <= x <= server.participation_mean = {s['participation_mean']}",
    )
    _require(0 < s["markov_p01"] <= 1, "server.markov_p01", s["markov_p01"], "0 < x <= 1")
    _require(s["cyclic_period"] >= 1, "server.cyclic_period", s["cyclic_period"], ">= 1")
    _require(s["round_timeout"] > 0, "server.round_timeout", s["round_timeout"], "> 0")
    _require(s["wait_for_nodes"] > 0, "server.wait_for_nodes", s["wait_for_nodes"], "> 0")
    _require(s["checkpoint_every"] >= 1, "server.checkpoint_every", s["checkpoint_every"], ">= 1")
    _require(s["max_update_norm"] > 0, "server.max_update_norm", s["max_update_norm"], "> 0")
    _require(s["max_payload_rows"] >= 1, "server.max_payload_rows", s["max_payload_rows"], ">= 1")
    _require(e["batch_size"] >= 1, "evaluation.batch_size", e["batch_size"], "an integer >= 1")
    _require(e["every"] >= 1, "evaluation.every", e["every"], ">= 1")
    _require(0 < e["fraction"] <= 1, "evaluation.fraction", e["fraction"], "0 < x <= 1")
    _require(e["robust_eps"] > 0, "evaluation.robust_eps", e["robust_eps"], "a number > 0")
    _require(
        e["robust_steps"] >= 1, "evaluation.robust_steps", e["robust_steps"], "an integer >= 1"
    )
    _require(e["robust_samples"] >= 1, "evaluation.robust_samples", e["robust_samples"], ">= 1")


def participation_warning(cfg: Config) -> str | None:
    """A warning for a valid config whose ``bernoulli``/``markov``/``cyclic`` participation
    expects fewer than one participant a round (λ = ``num_clients × participation_mean``,
    the sum of the p_k it draws): a round then trains nobody with probability at least
    1 − λ (the expected count bounds the chance of anyone). None otherwise."""
    s, n = cfg["server"], cfg["num_clients"]
    expected = n * s["participation_mean"]
    if s["participation"] in ("all", "uniform") or expected >= 1:
        return None
    return (
        f"server.participation={s['participation']} with num_clients={n} and "
        f"server.participation_mean={s['participation_mean']} expects {expected:.2g} "
        f"participants a round: at least {1 - expected:.0%} of rounds will train nobody; "
        f"raise participation_mean to at least {math.ceil(100 / n) / 100:g} or add clients"
    )


def reject_own_options(overrides: Mapping[str, Any]) -> None:
    """Keys that have their own option may not be overridden in ``set``: the launcher and
    the ServerApp would disagree on the run's directory (ConfigError naming the option)."""
    for key in OWN_OPTIONS:
        if key in overrides:
            flag = key.replace("_", "-")
            raise ConfigError(
                f"{key!r} cannot be given in SET / --set: use {key.upper()}=... with make,"
                f" --{flag} with python -m fl_app.launch, or the run config key {flag!r}"
                " with flwr run"
            )


def config_from_run_config(run_config: Mapping[str, Any]) -> Config:
    """Build the config from Flower's run config (the keys declared in pyproject.toml)."""
    overrides = parse_overrides(str(run_config.get("set", "") or ""))
    reject_own_options(overrides)
    for key, target in (("seed", "seed"), ("output-dir", "output_dir")):
        if key in run_config and target not in overrides:
            overrides[target] = run_config[key]
    return load_config(
        experiment=str(run_config.get("experiment") or "") or None,
        method=str(run_config.get("method") or "") or None,
        overrides=overrides,
    )


def run_flag(run_config: Mapping[str, Any], key: str) -> bool:
    """A true/false key of Flower's run config (``resume``): a TOML bool, or the string
    ``true``/``false`` (``--run-config "resume='false'"`` passes a string, which ``bool``
    would read as true); ConfigError otherwise."""
    value = run_config.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"run config {key}={value!r}: use true or false (--run-config '{key}=true')")


def run_dir(cfg: Config) -> Path:
    """``<output_dir>/<experiment>/<method>/seed<seed>`` (absolute)."""
    root = Path(cfg["output_dir"]).expanduser()
    return (root / cfg["experiment"] / cfg["method"] / f"seed{cfg['seed']}").resolve()


def dump(cfg: Config) -> str:
    """The config as YAML text (what a run saves as config.yaml)."""
    return yaml.safe_dump(cfg, sort_keys=False)
