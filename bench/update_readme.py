"""Copy the benchmark tables of bench/results/ into README.md and the results pages of docs/.

Each table lives in one document (``DOCS``) between ``<!-- NAME -->`` and ``<!-- /NAME -->``
markers and is replaced by the current content of its results file, so the documents always
show the figures the scripts last wrote:

    .venv/bin/python bench/update_readme.py            # rewrite the stale documents
    .venv/bin/python bench/update_readme.py --check    # exit 1 if any document is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the main table of each protocol and benchmark, with its command and plot
README_TABLES = {
    "REGIMES_TABLE": "regimes.md",
    "PARITY_TABLE": "parity.md",
    "PARITY_GAINS_TABLE": "parity_gains.md",
    "P1_TABLE": "p1.md",
    "P3_STREAMS_TABLE": "p3_streams.md",
    "P4_TABLE": "p4.md",
    "S1_TABLE": "s1_overhead.md",
    "S1_P1_TABLE": "s1_overhead_p1.md",
    "S2_TABLE": "s2_method_cost.md",
    "S3_TABLE": "s3_server_cost.md",
    "S4_TABLE": "s4_memory.md",
    "S5_TABLE": "s5_gpu_sharing.md",
    "S6_TABLE": "s6_ray_cluster.md",
}
# the variants, secondary and GPU tables, beside the analysis of docs/results.md
RESULTS_TABLES = {
    "P1_ABLATION_TABLE": "p1_fedccl_ablation.md",
    "P1_FULL_TABLE": "p1_full.md",
    "P1_CLIENT_MOMENTUM_TABLE": "p1_client_momentum.md",
    "P1_DOMAINS_TABLE": "p1_domains.md",
    "P1_DOMAINS_IMB_TABLE": "p1_domains_imbalanced.md",
    "P1_ROBUST_TABLE": "p1_robust.md",
    "P1_ROBUST_EPS_TABLE": "p1_robust_eps.md",
    "P3_STREAMS_1000_TABLE": "p3_streams_1000.md",
    "P4_ALPHA005_TABLE": "p4_alpha005.md",
    "S2_RESNET_TABLE": "s2_method_cost_resnet18_gn.md",
    "S2_CUDA_TABLE": "s2_method_cost_cuda.md",
    "S2_CUDA_EAGER_TABLE": "s2_method_cost_cuda_eager.md",
    "S2_CUDA_RESNET_TABLE": "s2_method_cost_cuda_resnet18_gn.md",
    "S2_CUDA_RESNET_EAGER_TABLE": "s2_method_cost_cuda_resnet18_gn_eager.md",
    "S2_CUDA_RESNET_H100_TABLE": "s2_method_cost_cuda_resnet18_gn_h100_eager.md",
    "FROZEN_STACK_CPU_TABLE": "frozen_stack_cpu.md",
    "FROZEN_STACK_CUDA_TABLE": "frozen_stack_cuda.md",
    "FROZEN_STACK_CUDA_RESNET_TABLE": "frozen_stack_cuda_resnet18_gn.md",
    "GNE_WEIGHTS_TABLE": "gne_weights.md",
}
# P3 with the participation streams before 2026-11-26, kept out of the README
EARLIER_P3_TABLES = {
    "P3_TABLE": "p3.md",
    "P3_300_TABLE": "p3_300.md",
    "P3_1000_TABLE": "p3_1000.md",
}
# document (relative to the repository) -> its tables: marker name -> file of bench/results/
DOCS = {
    "README.md": README_TABLES,
    "docs/results.md": RESULTS_TABLES,
    "docs/p3-earlier-streams.md": EARLIER_P3_TABLES,
}
TABLES = {key: name for tables in DOCS.values() for key, name in tables.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="only say whether a document is stale")
    args = p.parse_args(argv)
    rendered = {}  # every document first, so a bad one leaves all of them as they were
    for doc, tables in DOCS.items():
        old = (ROOT / doc).read_text()
        new = render(old, ROOT / "bench" / "results", tables, doc)
        if new != old:
            rendered[doc] = new
    stale = list(rendered)
    if not args.check:
        for doc, new in rendered.items():
            (ROOT / doc).write_text(new)
    if not stale:
        print("every table is current: " + ", ".join(DOCS))
        return 0
    if args.check:
        print(f"stale: {', '.join(stale)}: run bench/update_readme.py", file=sys.stderr)
        return 1
    print(f"tables updated from bench/results/ in {', '.join(stale)}")
    return 0


def render(
    text: str, results: Path, tables: dict[str, str] = README_TABLES, doc: str = "README.md"
) -> str:
    """``text`` (the document ``doc``) with each of ``tables``' blocks between its markers
    replaced by its file in ``results``; SystemExit names a missing or misordered pair of
    markers."""
    for key, name in tables.items():
        start, end = f"<!-- {key} -->", f"<!-- /{key} -->"
        i = text.find(start)
        j = text.find(end, i + 1) if i >= 0 else -1
        if j < 0:
            raise SystemExit(f"{doc} has no {start} ... {end} markers (in that order)")
        table = (results / name).read_text().strip()
        text = f"{text[:i]}{start}\n{table}\n{end}{text[j + len(end) :]}"
    return text


if __name__ == "__main__":
    sys.exit(main())
