"""S3 — server-side cost (BENCHMARKS.md): GNE for K = 100 clients of a 1M-parameter model,
FINCH on the server's prototypes, FedAU bookkeeping for 10,000 nodes.

    .venv/bin/python bench/s3_server_cost.py [--threads 1]
Writes bench/results/s3_server_cost.json and .md. Medians of 3 repeats. ``--threads`` is
the number of BLAS/OpenMP threads, as the ServerApp sets them (``client.num_threads``,
default 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs import write_table  # noqa: E402

from core.diagnostics import delta_gram  # noqa: E402
from strategies.fedau import ParticipationWeights  # noqa: E402
from strategies.fedccl import global_signals  # noqa: E402
from strategies.gne import apply_weighted_deltas, gram_weights  # noqa: E402
from strategies.replies import ClientResult  # noqa: E402


def timed(fn, repeats: int = 3) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (ServerApp: 1)")
    threads = ap.parse_args().threads
    threadpool_limits(limits=threads)
    rng = np.random.default_rng(0)
    k, p = 100, 1_000_000
    shapes = [(500, 1000), (250, 1000), (250_000,)]  # 1M parameters in three arrays
    glob = [rng.normal(size=s).astype(np.float32) for s in shapes]
    results = [
        ClientResult(
            i,
            i,
            [g + 0.01 * rng.normal(size=g.shape).astype(np.float32) for g in glob],
            100,
            {},
            {},
            None,  # type: ignore[arg-type]  # no reply message: S3 never reads it
        )
        for i in range(k)
    ]
    client_arrays = [r.arrays for r in results]
    gram = delta_gram(glob, client_arrays)
    n = np.full(k, 100)
    rows = {
        "gne_gram_k100_1m": timed(lambda: delta_gram(glob, client_arrays), 1),
        "gne_solve_k100": timed(lambda: gram_weights(gram, n)),
        "gne_apply_k100_1m": timed(
            lambda: apply_weighted_deltas(glob, results, np.full(k, 0.01), 1.0), 1
        ),
    }
    sig = rng.normal(size=(3000, 128)).astype(np.float32)
    lab = rng.integers(0, 10, size=3000)
    rows["finch_server_3000x128"] = timed(lambda: global_signals(sig, lab, 10))
    w = ParticipationWeights(cutoff=50)
    known = np.arange(10_000)

    def bookkeeping() -> None:
        w.update(set(rng.choice(10_000, 1000, replace=False).tolist()), known)
        w.weights(range(1000))

    rows["fedau_round_10000_nodes"] = timed(bookkeeping, 10)
    out = {"k": k, "parameters": p, "threads": threads, "seconds": rows}
    print(write_table(ROOT / "bench" / "results", "s3_server_cost", out, markdown(out)), end="")


def markdown(out: dict[str, Any]) -> str:
    """The S3 table (seconds per server step) from the figures :func:`main` writes to JSON."""
    lines = [f"BLAS threads: {out['threads']}.", "", "| server step | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.4f} |" for name, sec in out["seconds"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
