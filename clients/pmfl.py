"""PMFL client (historical model contrast): contrast with the global model and the client's
N most recent local iterates.

Per step and sample: ``z`` (current model), ``Z_g`` (global model, frozen) and ``z_j`` for
every buffered iterate (frozen). Threshold (``threshold``): ``current`` (default) is
``μ_i = sim(z_i, Z_g,i)`` (detached; the paper's ``Sim(z^{tE}, Z^t)`` is identically 1
because ``w^{tE} = W^t``, so the current representation is used); ``literal`` is the paper's
``μ = Sim(z^{tE}, Z^t) = 1``, which makes every historical representation a negative unless
its cosine to ``z`` is at least 1. Historical representations at least as similar as μ are
positives, the rest negatives (see ``clients.losses.pmfl_loss``). Loss ``CE + λ·ℓ_con``.
The buffer is the paper's ``S = {w^{tE+e−N}, …, w^{tE+e−1}}`` (PMFL §IV): at step ``e`` it
holds the N iterates before the current one, never the current model itself, so each step
pushes the iterate it started from (``w^{tE+e}``, the global model at ``e = 0``) once its
loss is computed. The buffer is kept per node across rounds in the disk-backed state store;
the round's final iterate is not in it (the paper overwrites it with the next global model).

When the round's steps replay a CUDA graph (``BaseClient.graphed()``), the buffer is fixed
in size instead of growing: all N slots exist from the start, those not yet filled hold the
global model and are masked out of the loss, and the fill count and the oldest slot are
device tensors that each step updates itself (the same rule, the same losses and weights:
``tests/clients/test_pmfl.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from clients.base import BaseClient, FrozenStack
from clients.losses import pmfl_loss
from core.models import ModelOutput
from core.params import at_least, nonnegative, one_of, positive

STATE_KEY = "pmfl_buffer"


@dataclasses.dataclass(frozen=True)
class PMFLParams:
    lam: float = nonnegative(0.5)  # weight λ of the contrastive term (0 = the w/o MCT ablation)
    tau: float = positive(0.5)  # temperature
    buffer_size: int = at_least(1, default=5)  # N most recent local iterates
    # μ: current = sim(z, Z_g) (the project's reading); literal = Sim(z^{tE}, Z^t) = 1 (paper
    # §IV-C2 as written: every historical model a negative)
    threshold: str = one_of("current", "literal")


class PMFLClient(BaseClient):
    Params = PMFLParams
    KEEPS_STATE = True  # the buffer of local iterates

    def setup_round(self, config: dict[str, Any]) -> None:
        states: list[dict[str, torch.Tensor]] = []
        if self.hp.lam > 0:  # the newest N (buffer_size may shrink)
            states = self.load_states(STATE_KEY)[-self.hp.buffer_size :]
        # slot 0: the global model; slots 1..: the ring buffer of local iterates, oldest at
        # self.oldest once full
        glob = self.state_dict_cpu()
        self.oldest = 1
        #: With a CUDA graph the step's tensors must stay fixed: all N slots exist from the
        #: start (the missing ones hold the global model and are masked out of the loss), and
        #: the fill count and the oldest slot are device tensors the step updates itself
        #: (``ring``); otherwise the stack grows and both are Python ints
        self.ring: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.graphed() and self.hp.lam > 0:
            pad = [glob] * (self.hp.buffer_size - len(states))
            self.frozen = FrozenStack(self.model, [glob, *states, *pad], self.device)
            self.ring = (
                torch.tensor(len(states), device=self.device),
                torch.ones((), dtype=torch.long, device=self.device),
            )
            self.slots = torch.arange(1, self.hp.buffer_size + 1, device=self.device)
        else:
            self.frozen = FrozenStack(self.model, [glob, *states], self.device)

    def filled(self) -> int:
        """How many local iterates the buffer holds (a host sync with a device ring)."""
        return len(self.frozen) - 1 if self.ring is None else int(self.ring[0])

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        ce = F.cross_entropy(out.logits, y)
        if self.hp.lam == 0:
            return ce
        z_all = self.frozen.z(x)
        present = None if self.ring is None else self.slots <= self.ring[0]
        mu = 1.0 if self.hp.threshold == "literal" else None  # a constant: graph-safe
        con = pmfl_loss(out.z, z_all[0], z_all[1:], self.hp.tau, present, mu)
        return ce + self.hp.lam * con

    def before_update(self) -> None:
        """Push the iterate this step started from into the buffer (overwrite the oldest
        slot once full); the next step contrasts with it."""
        if self.hp.lam == 0:
            return
        n = self.hp.buffer_size
        if self.ring is not None:  # the same rule, decided on the device
            filled, oldest = self.ring
            full = filled >= n
            self.frozen.write(torch.where(full, oldest, filled + 1), self.model)
            oldest.copy_(torch.where(full, oldest % n + 1, oldest))
            filled.copy_((filled + 1).clamp(max=n))
        elif len(self.frozen) - 1 < n:
            self.frozen.append(self.model)
        else:
            self.frozen.write(self.oldest, self.model)
            self.oldest = self.oldest % n + 1

    def buffer_order(self) -> list[int]:
        """Buffer slots from oldest to newest."""
        n = self.filled()
        oldest = self.oldest if self.ring is None else int(self.ring[1])
        if n < self.hp.buffer_size:
            return list(range(1, n + 1))
        return [(oldest - 1 + i) % n + 1 for i in range(n)]

    def finish_round(self) -> dict[str, Any]:
        if self.store is not None and self.hp.lam > 0:
            self.store.save(self.pid, STATE_KEY, self.frozen.states(self.buffer_order()))
        return {"pmfl_buffer": float(self.filled())}
