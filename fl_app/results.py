"""What a run writes into its directory ``<output_dir>/<experiment>/<method>/seed<seed>/``, and
what is read back from it (the directory itself, its lock and what may happen to it, are
:mod:`fl_app.rundir`'s):

- ``config.yaml``: the merged config;
- ``rounds.jsonl``: one JSON object per round with every metric (appended as rounds finish);
- ``summary.json``: final, best, EMA(0.9), last-5 mean and top-5 mean of the global test
  accuracy, P-FL accuracy, dropped results, wall time, status;
- ``curves.png``: accuracy and loss per round (:func:`plot_run`).

Configs are compared key by key (:func:`config_changes`), as a resume and the comparison of
runs do.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from core.params import Config, ConfigError
from fl_app.config import CONF_DIR, load_config  # load_config: the presets, for older runs

_ABSENT = object()


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: numpy arrays and numbers as lists and Python numbers,
    tuples as lists, dict keys as strings, a non-finite float as None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


def ema(values: list[float], decay: float = 0.9) -> float:
    """Exponential moving average ``e_t = decay·e_{t−1} + (1−decay)·v_t``, ``e_1 = v_1``
    (FedRCL reports EMA(0.9) of the test accuracy)."""
    out = values[0]
    for v in values[1:]:
        out = decay * out + (1 - decay) * v
    return out


def summarize(records: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Summary statistics of a run from its per-round records."""
    accs = [r["accuracy"] for r in records if r.get("accuracy") is not None and r["round"] > 0]
    pers = [
        r["train"]["personal_accuracy"]
        for r in records
        if isinstance(r.get("train"), dict) and "personal_accuracy" in r["train"]
    ]
    out: dict[str, Any] = {
        "method": cfg["method"],
        "experiment": cfg["experiment"],
        "seed": cfg["seed"],
        "client": cfg["client"]["name"],
        "server": cfg["server"]["name"],
        "rounds_completed": max((r["round"] for r in records), default=0),
        "num_rounds": cfg["num_rounds"],
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "ema_accuracy": ema(accs) if accs else None,
        "last5_accuracy": float(np.mean(accs[-5:])) if accs else None,
        "top5_accuracy": float(np.mean(sorted(accs)[-5:])) if accs else None,
        "final_personal_accuracy": pers[-1] if pers else None,
        "last5_personal_accuracy": float(np.mean(pers[-5:])) if pers else None,
        "dropped_results": sum(
            sum(1 for f in r.get("failures", []) if f.get("kind") == "rejected") for r in records
        ),
        "failed_results": sum(
            sum(1 for f in r.get("failures", []) if f.get("kind") in ("error", "missing"))
            for r in records
        ),
    }
    # the arithmetic the clients trained on (core.training.numerics): runs of one seed with
    # the same list repeat bit for bit; with another, their floats differ from the first step
    out["numerics"] = sorted(
        {
            c["numerics"]
            for r in records
            for c in (r.get("clients") or {}).values()
            if isinstance(c, dict) and isinstance(c.get("numerics"), str)
        }
    )
    for key in ("federated_accuracy", "effective_rank", "robust_fgsm", "robust_pgd"):
        vals = [r[key] for r in records if r.get(key) is not None]
        if vals:
            out[f"final_{key}"] = vals[-1]
    return out


def _flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if a is _ABSENT or b is _ABSENT:
        return a is b
    numbers = (int, float, np.integer, np.floating)
    if all(isinstance(v, numbers) and not isinstance(v, bool) for v in (a, b)):
        return bool(a == b)  # 1 and 1.0 are the same setting
    # a JSON/YAML round trip turns tuples into lists: compare the JSON forms
    return json.dumps(jsonable(a), sort_keys=True) == json.dumps(jsonable(b), sort_keys=True)


def differing_keys(configs: Sequence[Mapping[str, Any]], ignore: frozenset[str]) -> list[str]:
    """The dotted keys outside ``ignore`` whose values are not the same (as a resume
    compares them: 1 and 1.0 alike; a key one config lacks differs) in all ``configs``,
    sorted."""
    flats = [_flatten(c) for c in configs]
    keys = sorted({k for f in flats for k in f} - ignore)
    return [
        k
        for k in keys
        if any(not _same(flats[0].get(k, _ABSENT), f.get(k, _ABSENT)) for f in flats[1:])
    ]


def _diff(
    old: Mapping[str, Any], new: Mapping[str, Any], ignore: frozenset[str]
) -> list[tuple[str, Any, Any]]:
    flat_old, flat_new = _flatten(old), _flatten(new)
    keys = list(flat_old) + [k for k in flat_new if k not in flat_old]
    return [
        (k, flat_old.get(k, _ABSENT), flat_new.get(k, _ABSENT))
        for k in keys
        if k not in ignore and not _same(flat_old.get(k, _ABSENT), flat_new.get(k, _ABSENT))
    ]


def _absent(*values: Any) -> bool:
    return any(v is _ABSENT for v in values)


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(jsonable(value))


def _change(key: str, old: Any, new: Any) -> str:
    return f"{key}: {_show(old)} -> {_show(new)}"


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], ignore: frozenset[str] = frozenset()
) -> list[str]:
    """The dotted keys whose values differ between two nested configs, as
    ``"key: old -> new"`` (values in JSON: ``0.01``, ``"all"``, ``[6, 16]``, ``null``; a key
    only one side has shows ``(absent)``), in ``old``'s key order, then keys only ``new``
    has; keys in ``ignore`` are left out. Pure: neither config is modified."""
    return [_change(*d) for d in _diff(old, new, ignore)]


def split_config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], ignore: frozenset[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """:func:`config_changes` in two, each in its order: the keys both configs have whose
    values differ, and the keys only one of them has (the code added or removed them since
    the other was written)."""
    diffs = _diff(old, new, ignore)
    return (
        [_change(*d) for d in diffs if not _absent(*d[1:])],
        [_change(*d) for d in diffs if _absent(*d[1:])],
    )


#: What makes two runs' training comparable (BENCHMARKS.md: every Δ compares runs on the
#: same model, projection head included, and the same client optimiser): every ``model.*``
#: key and these client keys.
OPTIMISER_KEYS = (
    "client.epochs",
    "client.steps",
    "client.batch_size",
    "client.lr",
    "client.lr_decay",
    "client.momentum",
    "client.weight_decay",
    "client.grad_clip",
)


def training_setup(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The model and client-optimiser settings of a config, flattened (``model.name``,
    ``client.lr``, …): two runs whose setups differ trained different models or with
    different optimisers, so a Δ between them is not the method's."""
    flat = _flatten(cfg)
    keys = [k for k in flat if k.startswith("model.")] + list(OPTIMISER_KEYS)
    return {k: flat.get(k, _ABSENT) for k in keys}


def setup_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``"key: a -> b"`` for every model or client-optimiser setting in which configs ``a``
    and ``b`` differ (:func:`training_setup`); empty when a Δ between them is fair. A key
    one config lacks (a run from before the key existed) counts as its ``conf/base.yaml``
    default, which is what that run trained with."""
    sa, sb = training_setup(a), training_setup(b)
    defaults = training_setup(_base_defaults())
    for s in (sa, sb):
        for key, value in defaults.items():
            if s.get(key, _ABSENT) is _ABSENT:
                s[key] = value
    return [
        _change(k, sa.get(k, _ABSENT), sb.get(k, _ABSENT))
        for k in list(sa) + [k for k in sb if k not in sa]
        if not _same(sa.get(k, _ABSENT), sb.get(k, _ABSENT))
    ]


def _base_defaults() -> dict[str, Any]:
    """``conf/base.yaml`` as it is (every key's default)."""
    with (CONF_DIR / "base.yaml").open() as f:
        base: dict[str, Any] = yaml.safe_load(f)
    return base


def plain_fedavg(cfg: Mapping[str, Any]) -> bool:
    """Whether a config is FedAvg itself: plain cross-entropy clients (no adversarial
    training) averaged by the plain FedAvg server, on whatever model it names; the baseline
    a method's Δ is taken against when its :func:`training_setup` is the method's."""
    c, s = cfg.get("client", {}), cfg.get("server", {})
    return c.get("name") == "fedavg" and not c.get("adversarial") and s.get("name") == "fedavg"


def run_setup_config(run: Path, summary: Mapping[str, Any]) -> Config | None:
    """The config the run in ``run`` trained with: its ``config.yaml``, else (runs committed
    with their summary and round log only) what its experiment and method presets give
    today; None when neither can be had (a method without a preset)."""
    cfg = saved_run_config(run)
    if cfg is not None:
        return cfg

    try:
        return load_config(summary.get("experiment"), summary.get("method"))
    except (ConfigError, OSError, ValueError, TypeError):
        return None


def matched_baseline(
    method: str, configs: Mapping[str, Mapping[str, Any] | None], baseline: str
) -> tuple[str | None, list[str]]:
    """The run group a ``method``'s Δ is taken against, and why not ``baseline`` itself:
    ``baseline`` when it trained the same model with the same client optimiser
    (:func:`setup_differences`), else another group of ``baseline``'s kind (the same client
    and server, e.g. ``fedavg_head`` for ``fedavg``) that did, else None. The list holds
    the settings in which ``baseline`` differs (empty when it is the match). ``configs``:
    each group's config (None: unknown, which matches nothing); without a run of
    ``baseline`` its kind is plain FedAvg (:func:`plain_fedavg`)."""
    mine, base = configs.get(method), configs.get(baseline)
    if mine is None:
        return None, ["(the method's config is unknown)"]
    differ = ["(no run of the baseline)"] if base is None else setup_differences(base, mine)
    if not differ:
        return baseline, []

    def kind(c: Mapping[str, Any]) -> tuple[Any, ...]:
        cl, sv = c.get("client", {}), c.get("server", {})
        return cl.get("name"), bool(cl.get("adversarial")), sv.get("name")

    def same_kind(c: Mapping[str, Any]) -> bool:  # without a run of the baseline: FedAvg's
        return kind(c) == kind(base) if base is not None else plain_fedavg(c)

    for other, cfg in sorted(configs.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if other in (method, baseline) or cfg is None or not same_kind(cfg):
            continue
        if not setup_differences(cfg, mine):
            return other, differ
    return None, differ


def run_completed(summary: Mapping[str, Any]) -> bool:
    """Whether a run's summary is that of a run that finished all its rounds (the runs the
    results tables and ``fl_app.compare`` count)."""
    return summary.get("status") == "completed" and summary.get(
        "rounds_completed", 0
    ) >= summary.get("num_rounds", 0)


def last_logged_round(path: Path) -> int:
    """The last round in the round log of the run directory ``path`` (plain or gzipped);
    lines that are not round records are skipped; -1 when there is none."""
    try:
        log = read_round_log(path)
    except (OSError, ValueError):
        return -1
    rounds = -1
    for line in log.splitlines():
        try:
            rounds = max(rounds, int(json.loads(line)["round"]))
        except (ValueError, KeyError, TypeError):
            continue
    return rounds


def read_summary(path: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of the run directory ``path``; None when there is none; a
    ValueError naming the file when it cannot be read or is not a JSON object."""
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        return None
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{summary_path}: not a run summary ({err})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path}: not a run summary (not a JSON object)")
    return summary


def saved_run_config(path: Path) -> Config | None:
    """The config saved in ``path/config.yaml`` (None when missing or unreadable)."""
    try:
        data = yaml.safe_load((path / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def read_rounds(path: Path) -> list[dict[str, Any]]:
    """The records of a ``rounds.jsonl`` (none when the file is missing)."""
    return parse_rounds(path.read_text()) if path.is_file() else []


def parse_rounds(log: str | bytes) -> list[dict[str, Any]]:
    """The round records of a round log: one JSON object a line, blank lines skipped."""
    return [json.loads(line) for line in log.splitlines() if line.strip()]


Curve = list[tuple[int, float]]  # (round, value) pairs of one run


#: A run directory's round log (``rounds.jsonl``; gzipped in the copies committed under
#: ``bench/results/``) and the light form's curve (``bench/light.py``: committed runs keep
#: only the global model's figures of some rounds).
ROUND_LOG = "rounds.jsonl"
ROUND_LOGS = (ROUND_LOG, ROUND_LOG + ".gz")
CURVE = "curve.json"


class LightRunError(ValueError):
    """A run that cannot be made light (not completed, no round log), a ``curve.json`` that
    cannot be read, or a light run given to a script that needs per-client records."""


def read_round_log(run: Path) -> bytes:
    """A run directory's round log: ``rounds.jsonl``, or the gzipped ``rounds.jsonl.gz`` of
    the copies committed under ``bench/results/``."""
    plain, gzipped = (run / name for name in ROUND_LOGS)
    return plain.read_bytes() if plain.is_file() else gzip.decompress(gzipped.read_bytes())


def has_round_log(run: Path) -> bool:
    """Whether the run directory holds a round log (``rounds.jsonl`` or its gzipped copy)."""
    return any((run / name).is_file() for name in ROUND_LOGS)


def read_curve(run: Path) -> dict[str, Any]:
    """The ``curve.json`` of the run directory ``run``; :class:`LightRunError` naming the file
    when it is missing or is not a light curve."""
    path = run / CURVE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LightRunError(f"{path}: not a light run's curve ({err})") from None
    records = data.get("records") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("round"), int) for r in records
    ):
        raise LightRunError(f"{path}: not a light run's curve (no list of round records)")
    return data


def read_records(run: Path) -> list[dict[str, Any]]:
    """The round records of a run directory in either form: its round log's records (every
    figure of every round), else its light records (``curve.json``: the global model's
    figures of the kept rounds). :class:`LightRunError` naming the files when it has
    neither."""
    if has_round_log(run):
        return parse_rounds(read_round_log(run))
    if (run / CURVE).is_file():
        return list(read_curve(run)["records"])
    raise LightRunError(f"{run}: no round log ({', '.join(ROUND_LOGS)}) and no {CURVE}")


def curve(records: list[dict[str, Any]], key: str = "accuracy") -> Curve:
    """``[(round, value), ...]`` of the round records that carry ``key``."""
    return [(r["round"], r[key]) for r in records if r.get(key) is not None]


def mean_curve(curves: list[Curve]) -> tuple[list[int], list[float]]:
    """The rounds that every one of several runs' curves has, and the mean value over the
    runs at each of them (curves evaluated on other rounds are aligned by round number)."""
    common = set.intersection(*(set(r for r, _ in c) for c in curves))
    rounds = sorted(common)
    values = [dict(c) for c in curves]
    return rounds, [sum(v[r] for v in values) / len(values) for r in rounds]


def write_summary(
    directory: Path,
    records: list[dict[str, Any]],
    cfg: Config,
    status: str,
    wall: float,
    reason: str | None = None,
) -> dict[str, Any]:
    """Write ``directory/summary.json`` (:func:`summarize` of ``records`` with ``status``,
    ``wall_seconds`` and, when given, ``reason``: why a run stopped), replaced atomically,
    and return it."""
    summary = summarize(records, cfg)
    summary["status"] = status
    summary["wall_seconds"] = wall
    if reason is not None:
        summary["reason"] = reason
    tmp = directory / "summary.json.tmp"
    tmp.write_text(json.dumps(jsonable(summary), indent=2) + "\n")
    tmp.replace(directory / "summary.json")
    return summary


def plot_run(records: list[dict[str, Any]], directory: Path, title: str) -> None:
    """The plots of a finished run in ``directory``: accuracy and loss per round, and the
    diagnostics its rounds recorded (cosines, aggregation weights, update deviation)."""
    plot_curves(records, directory / "curves.png", title=title)
    plot_client_matrix(
        records,
        "cos_global_client",
        directory / "cos_global.png",
        "cos(global update, client update)  [FedRANE Fig. 3]",
    )
    plot_client_matrix(
        records,
        "aggregation_weights",
        directory / "aggregation_weights.png",
        "aggregation weight",
    )
    plot_series(
        records,
        "update_deviation",
        directory / "update_deviation.png",
        "update deviation Dev^t = Σ_k (1 − cos(Δ_k, mean Δ))  [PMFL Def. 1]",
    )


def plot_curves(records: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Global test accuracy/loss (and P-FL accuracy when present) per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = [r for r in records if r.get("accuracy") is not None]
    tr = [r for r in records if isinstance(r.get("train"), dict) and r["train"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot([r["round"] for r in ev], [r["accuracy"] for r in ev], label="global test (G-FL)")
    pers = [
        (r["round"], r["train"]["personal_accuracy"])
        for r in tr
        if "personal_accuracy" in r["train"]
    ]
    if pers:
        ax1.plot(*zip(*pers, strict=True), label="local models (P-FL)")
    _round_axis(ax1)
    ax1.set_ylabel("accuracy")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot([r["round"] for r in ev], [r.get("loss") for r in ev], label="global test loss")
    ax2.plot(
        [r["round"] for r in tr],
        [r["train"].get("train_loss") for r in tr],
        label="client train loss",
    )
    _round_axis(ax2)
    ax2.set_ylabel("loss")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _round_axis(ax: Any) -> None:
    """Label the x axis "round", with whole-number ticks only (no round 0.5)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_series(records: list[dict[str, Any]], key: str, path: Path, label: str) -> None:
    """Line plot over rounds of a per-round number recorded under ``key`` (rounds without it
    are left out); nothing is written if no round has it."""
    points = [(r["round"], r[key]) for r in records if isinstance(r.get(key), int | float)]
    if not points:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*points, strict=True), marker="." if len(points) <= 50 else None)
    _round_axis(ax)
    ax.set_ylabel(key)
    ax.set_title(label, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_client_matrix(records: list[dict[str, Any]], key: str, path: Path, label: str) -> None:
    """Heatmap (round × client) of a per-client value recorded under ``key`` each round
    (blank where a client did not take part); nothing is written if no round has it."""
    rows = [(r["round"], r[key]) for r in records if isinstance(r.get(key), dict) and r[key]]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = sorted({int(c) for _, v in rows for c in v})
    col = {c: i for i, c in enumerate(clients)}
    mat = np.full((len(rows), len(clients)), np.nan)
    for i, (_, vals) in enumerate(rows):
        for c, v in vals.items():
            mat[i, col[int(c)]] = v if v is not None else np.nan
    fig, ax = plt.subplots(figsize=(min(12, 2 + 0.25 * len(clients)), 4))
    im = ax.imshow(
        mat.T,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        extent=(rows[0][0] - 0.5, rows[-1][0] + 0.5, len(clients) - 0.5, -0.5),
    )
    _round_axis(ax)
    ax.set_ylabel("client (partition id)")
    if len(clients) <= 20:
        ax.set_yticks(range(len(clients)), [str(c) for c in clients])
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
