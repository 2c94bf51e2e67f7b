"""Their GNE weights against ours on the same updates, from a ``--our-gne-in-theirs`` run.

``bench/parity.py --our-gne-in-theirs`` makes FedRANE's released server step with our GNE
weights and records, each round, their weights, ours and the updates' Gram matrix
(``gne_weights.jsonl`` in their run's folder, ``bench/parity_theirs.py``). This reads those
files and reports, per seed and over its rounds, how far apart the two weight vectors are
(L1 distance), each side's largest weight and each side's distance from the Nash bargaining
fixed point ``Gp = 1/p`` (FedRANE §3.4): at the solution ``p_k·(Gp)_k`` is the same for
every client, so :func:`fixed_point_spread` (0 at the solution) measures how far a weight
vector is from it whatever its scale.

    .venv/bin/python bench/gne_compare.py RUN_FOLDER [RUN_FOLDER ...]

Each RUN_FOLDER holds a ``gne_weights.jsonl``; one line per folder is printed: how many
rounds the two agree (L1 distance under 0.01), how many their weights are exactly the
clients' sample shares (their solver's starting point: it stops there when its first convex
programme fails), read from their data files in the folder (``dataset/*/train/<k>.npz``), the
median L1 distance over the other rounds and each side's median fixed-point spread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

LOG = "gne_weights.jsonl"  # bench/parity_theirs.py GNE_LOG


def fixed_point_spread(gram: np.ndarray, w: np.ndarray) -> float:
    """max/min − 1 of ``u_k = w_k·(G w)_k`` over the clients: 0 exactly when ``w`` is a
    positive multiple of the solution of ``Gp = 1/p``; inf when some ``u_k <= 0``."""
    u = np.asarray(w, dtype=np.float64) * (np.asarray(gram, dtype=np.float64) @ w)
    return float("inf") if (u <= 0).any() else float(u.max() / u.min() - 1.0)


def round_figures(record: dict[str, Any]) -> dict[str, float]:
    """One round's figures from its record (``theirs``, ``ours``, ``gram``): the L1 distance
    of the two weight vectors, each one's largest weight and fixed-point spread (ours over
    the clients it weighs: a delta it calls negligible gets weight 0 and leaves the problem)."""
    t, o = np.asarray(record["theirs"]), np.asarray(record["ours"])
    gram = np.asarray(record["gram"])
    live = o > 0
    return {
        "l1": float(np.abs(t - o).sum()),
        "max_theirs": float(t.max()),
        "max_ours": float(o.max()),
        "spread_theirs": fixed_point_spread(gram, t),
        "spread_ours": fixed_point_spread(gram[np.ix_(live, live)], o[live]),
    }


#: Two weight vectors closer than this (L1) agree
AGREE = 1e-2


def train_sizes(run: Path) -> np.ndarray:
    """Every client's number of training samples, from their data files in ``run``
    (``dataset/<name>/train/<k>.npz``, written by ``parity_theirs.write_pfllib_data``)."""
    files = sorted(run.glob("dataset/*/train/*.npz"), key=lambda f: int(f.stem))
    sizes = []
    for f in files:
        with np.load(f, allow_pickle=True) as z:
            sizes.append(len(z["data"].item()["y"]))
    return np.array(sizes, dtype=np.float64)


def are_sample_shares(weights: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether ``weights`` (over the K clients that trained, in an order not recorded) are
    exactly the sample shares of the K largest clients (those with a full batch)."""
    k = len(weights)
    live = np.sort(sizes)[-k:]
    return bool(np.allclose(np.sort(weights), live / live.sum(), rtol=0, atol=1e-9))


def run_summary(records: list[dict[str, Any]], sizes: np.ndarray | None) -> dict[str, float]:
    """Counts over rounds: ``agree`` (L1 < :data:`AGREE`), ``sample_shares`` (theirs exactly
    the sample shares; -1 without ``sizes``), the median L1 of the rounds that do not agree
    (0 if none) and each side's median fixed-point spread."""
    rows = [round_figures(r) for r in records]
    apart = [r["l1"] for r in rows if r["l1"] >= AGREE]
    shares = (
        sum(are_sample_shares(np.asarray(r["theirs"]), sizes) for r in records)
        if sizes is not None and len(sizes)
        else -1
    )
    return {
        "rounds": float(len(rows)),
        "agree": float(len(rows) - len(apart)),
        "sample_shares": float(shares),
        "l1_apart": float(np.median(apart)) if apart else 0.0,
        "spread_theirs": float(np.median([r["spread_theirs"] for r in rows])),
        "spread_ours": float(np.median([r["spread_ours"] for r in rows])),
    }


def main() -> str | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("runs", type=Path, nargs="+", help="folders holding gne_weights.jsonl")
    args = p.parse_args()
    for run in args.runs:
        path = run / LOG
        if not path.is_file():
            return f"{path} does not exist: run bench/parity.py with --our-gne-in-theirs first"
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        if not records:
            return f"{path} holds no round"
        sizes = train_sizes(run)
        s = run_summary(records, sizes if len(sizes) else None)
        shares = "?" if s["sample_shares"] < 0 else int(s["sample_shares"])
        print(
            f"{run}: {int(s['rounds'])} rounds; the two agree in {int(s['agree'])}; theirs "
            f"are the sample shares in {shares}; L1 apart {s['l1_apart']:.3f} (median of the "
            f"others); fixed-point spread theirs {s['spread_theirs']:.3g} ours "
            f"{s['spread_ours']:.3g} (medians)"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())
