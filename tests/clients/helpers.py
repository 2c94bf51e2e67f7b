"""Shared pieces of the client tests."""

from __future__ import annotations

from typing import Any

from fl_app.prototypes import global_signals


def next_round_config(metrics: dict[str, Any]) -> dict[str, Any]:
    """The next round's FedCCL config from this round's local signals (the server's
    averaged global signals); empty for a method that sends none."""
    if "signals" not in metrics:
        return {}
    sig, lab = metrics["signals"], metrics["signal_labels"]
    u, mask = global_signals(sig, lab, 10, "mean")
    return {"local_signals": sig, "local_labels": lab, "global_signals": u, "global_mask": mask}
