"""FedRCL client (Seo et al., CVPR 2024): relaxed supervised contrastive learning.

Loss per batch: ``CE + L_RCL`` with ``L_RCL`` the mean over feature levels (every conv stage,
pooled and normalised) of the supervised contrastive term plus the divergence penalty
``β·log(1 + Σ_{k∈P_i} e^{(s_ik−1)/τ})`` on same-class pairs more similar than λ (paper
Eq. 5). ``beta: 0`` gives FedSCL (the paper's ablation); ``levels: last`` uses the last level
only, a list of indices (``[1, 2, 3]``) the levels it names (``ModelOutput.levels`` order: the
model's ``level_names``); ``mining: hard`` is the authors' code (hardest positive, two
hardest negatives).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from clients.base import BaseClient
from clients.losses import rcl_loss
from core.models import ModelOutput
from core.params import Config, hyper, nonnegative, one_of, positive

LEVELS_ALLOWED = "all | last | a list of distinct level indices >= 0, e.g. [1, 2, 3]"


def levels_ok(value: Any) -> bool:
    """``client.levels``: ``all``, ``last``, or a non-empty list of distinct integers >= 0
    (whether the model has those levels is :meth:`FedRCLClient.model_problem`'s check)."""
    if isinstance(value, str):
        return value in ("all", "last")
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
        and len(set(value)) == len(value)
    )


def level_indices(chosen: str | list[int], count: int) -> list[int]:
    """The indices of the levels ``client.levels`` = ``chosen`` names among a model's
    ``count`` levels: every one (``all``), the last one (``last``) or the list given."""
    if chosen == "all":
        return list(range(count))
    if chosen == "last":
        return [count - 1]
    return [int(i) for i in chosen]


@dataclasses.dataclass(frozen=True)
class FedRCLParams:
    tau: float = positive(0.05)  # temperature
    beta: float = nonnegative(1.0)  # divergence-penalty weight (0 = FedSCL)
    # similarity threshold λ of the penalty (a cosine)
    lam: float = hyper(0.7, "-1 <= x <= 1", lambda v: -1 <= v <= 1)
    mining: str = one_of("paper", "hard")  # hard: the authors' code
    # the levels contrasted: every one, the last one, or those a list of indices names
    # (hyper returns a dataclasses.field whose default is the string "all": RUF009 misreads it)
    levels: str | list[int] = hyper(  # noqa: RUF009
        "all", LEVELS_ALLOWED, levels_ok, "is not one of the choices", types=(list,)
    )
    rcl_weight: float = nonnegative(1.0)  # weight of L_RCL next to CE


class FedRCLClient(BaseClient):
    Params = FedRCLParams

    @classmethod
    def model_problem(cls, cfg: Config, model: nn.Module) -> str | None:
        """A list of ``client.levels`` must name levels the model has."""
        chosen = cfg["client"]["levels"]
        names = list(getattr(model, "level_names", []))
        if not isinstance(chosen, list) or not names:
            return None
        missing = [i for i in chosen if i >= len(names)]
        if not missing:
            return None
        valid = ", ".join(f"{i} {n}" for i, n in enumerate(names))
        return (
            f"'client.levels' = {chosen!r} names level(s) {missing} that model"
            f" {cfg['model']['name']!r} does not have; its levels are 0..{len(names) - 1}:"
            f" {valid}"
        )

    def selected_levels(self, levels: list[torch.Tensor]) -> list[torch.Tensor]:
        """The levels ``client.levels`` names, in that order (:func:`level_indices`)."""
        return [levels[i] for i in level_indices(self.hp.levels, len(levels))]

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        rcl = rcl_loss(
            self.selected_levels(out.levels),
            y,
            tau=self.hp.tau,
            beta=self.hp.beta,
            lam=self.hp.lam,
            mining=self.hp.mining,
        )
        return F.cross_entropy(out.logits, y) + self.hp.rcl_weight * rcl
