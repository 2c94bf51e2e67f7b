"""Copy the benchmark tables of bench/results/ into README.md.

Each table lives in the README between ``<!-- NAME -->`` and ``<!-- /NAME -->`` markers and is
replaced by the current content of its results file, so the README always shows the figures
the scripts last wrote:

    .venv/bin/python bench/update_readme.py            # rewrite README.md
    .venv/bin/python bench/update_readme.py --check    # exit 1 if README.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLES = {
    "P1_TABLE": "p1.md",
    "P1_ABLATION_TABLE": "p1_fedccl_ablation.md",
    "P1_FULL_TABLE": "p1_full.md",
    "P1_DOMAINS_TABLE": "p1_domains.md",
    "P1_DOMAINS_IMB_TABLE": "p1_domains_imbalanced.md",
    "P1_ROBUST_TABLE": "p1_robust.md",
    "P1_ROBUST_EPS_TABLE": "p1_robust_eps.md",
    "P3_TABLE": "p3.md",
    "P3_300_TABLE": "p3_300.md",
    "P3_1000_TABLE": "p3_1000.md",
    "P3_STREAMS_TABLE": "p3_streams.md",
    "P3_STREAMS_1000_TABLE": "p3_streams_1000.md",
    "P4_TABLE": "p4.md",
    "P4_ALPHA005_TABLE": "p4_alpha005.md",
    "S1_TABLE": "s1_overhead.md",
    "S1_P1_TABLE": "s1_overhead_p1.md",
    "S2_TABLE": "s2_method_cost.md",
    "S2_RESNET_TABLE": "s2_method_cost_resnet18_gn.md",
    "S2_CUDA_TABLE": "s2_method_cost_cuda.md",
    "S2_CUDA_EAGER_TABLE": "s2_method_cost_cuda_eager.md",
    "S2_CUDA_RESNET_TABLE": "s2_method_cost_cuda_resnet18_gn.md",
    "FROZEN_STACK_CPU_TABLE": "frozen_stack_cpu.md",
    "FROZEN_STACK_CUDA_TABLE": "frozen_stack_cuda.md",
    "FROZEN_STACK_CUDA_RESNET_TABLE": "frozen_stack_cuda_resnet18_gn.md",
    "S3_TABLE": "s3_server_cost.md",
    "S4_TABLE": "s4_memory.md",
    "S5_TABLE": "s5_gpu_sharing.md",
    "GNE_WEIGHTS_TABLE": "gne_weights.md",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="only say whether README.md is stale")
    args = p.parse_args(argv)
    readme_path = ROOT / "README.md"
    old = readme_path.read_text()
    new = render(old, ROOT / "bench" / "results")
    if new == old:
        print("README.md: every table is current")
        return 0
    if args.check:
        print("README.md is stale: run bench/update_readme.py", file=sys.stderr)
        return 1
    readme_path.write_text(new)
    print("README.md: tables updated from bench/results/")
    return 0


def render(readme: str, results: Path) -> str:
    """``readme`` with each table block between its markers replaced by the table file in
    ``results``; SystemExit names a missing or misordered pair of markers."""
    for key, name in TABLES.items():
        start, end = f"<!-- {key} -->", f"<!-- /{key} -->"
        i = readme.find(start)
        j = readme.find(end, i + 1) if i >= 0 else -1
        if j < 0:
            raise SystemExit(f"README.md has no {start} ... {end} markers (in that order)")
        table = (results / name).read_text().strip()
        readme = f"{readme[:i]}{start}\n{table}\n{end}{readme[j + len(end) :]}"
    return readme


if __name__ == "__main__":
    sys.exit(main())
