"""FedAvg and its server optimisers, FedAvgM and FedAdam.

Each optimiser is a pure step over the round's weighted mean of the client models
(:func:`server_momentum_step`, :func:`adam_step`) that computes what Flower 1.41's
``FedAvgM``/``FedAdam`` compute, in the same order and dtypes
(tests/strategies/test_fedavg.py runs Flower's own classes beside them); the strategies hold
their optimiser state themselves instead of reading and writing Flower's
(``current_arrays``, ``momentum_vector``, ``m_t``, ``v_t``). The checkpoint keeps the names
Flower gave that state, so checkpoints written before stay readable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.serverapp.strategy import FedAvg

from core.params import below_one, positive
from strategies.base import StrategyBase
from strategies.replies import ClientResult

Arrays = list[np.ndarray]


class FedAvgStrategy(StrategyBase, FedAvg):
    """FedAvg (McMahan et al., 2017): ``W ← Σ n_k w_k / Σ n_k`` over returned results
    (``server.weighting: uniform``: ``W ← Σ w_k / K``, FedRCL's server)."""


def server_momentum_step(
    current: Sequence[np.ndarray],
    mean: Sequence[np.ndarray],
    momentum: Arrays | None,
    lr: float,
    beta: float,
) -> tuple[Arrays, Arrays | None]:
    """FedAvgM (Hsu et al., 2019), as Flower's ``FedAvgM`` steps: with the pseudo-gradient
    ``g = W − mean``, ``v ← g`` in the first round and ``v ← β·v + g`` after, and
    ``W ← W − η·v`` (SGD with momentum on the server, PyTorch's convention; no momentum
    buffer when ``β = 0``; ``η = 1, β = 0`` is plain FedAvg and returns ``mean`` itself).
    Returns the new global arrays and the momentum buffer."""
    if beta == 0.0 and lr == 1.0:
        return list(mean), momentum
    step = [old - new for new, old in zip(mean, current, strict=True)]
    if beta > 0.0:
        momentum = (
            step
            if momentum is None
            else [beta * v + g for v, g in zip(momentum, step, strict=True)]
        )
        step = momentum
    return [np.asarray(old - lr * g) for old, g in zip(current, step, strict=True)], momentum


Moments = dict[str, np.ndarray]


def adam_step(
    current: dict[str, np.ndarray],
    mean: dict[str, np.ndarray],
    moments: tuple[Moments | None, Moments | None],
    server_round: int,
    eta: float,
    beta_1: float,
    beta_2: float,
    tau: float,
) -> tuple[dict[str, np.ndarray], tuple[Moments, Moments]]:
    """FedAdam as Flower's ``FedAdam`` steps (after Reddi et al., 2021, Alg. 2): with the
    pseudo-gradient ``Δ_t = mean − x_t``, ``m_t = β1·m_{t−1} + (1−β1)·Δ_t``,
    ``v_t = β2·v_{t−1} + (1−β2)·Δ_t²`` (both from 0) and
    ``x_{t+1} = x_t + η_t·m_t / (√v_t + τ)``, where Flower's
    ``η_t = η·√(1−β2^(t+1)) / (1−β1^(t+1))`` (t the server round) is an Adam-style bias
    correction that the paper's Algorithm 2 lacks (it steps with η itself). Arrays are keyed
    by name. Returns the new global arrays and ``(m_t, v_t)``."""
    m_prev, v_prev = moments
    delta = {k: x - current[k] for k, x in mean.items()}
    m = m_prev or {k: np.zeros_like(v) for k, v in mean.items()}
    m = {k: beta_1 * v + (1 - beta_1) * delta[k] for k, v in m.items()}
    v = v_prev or {k: np.zeros_like(x) for k, x in mean.items()}
    v = {k: beta_2 * s + (1 - beta_2) * (delta[k] ** 2) for k, s in v.items()}
    eta_t = (
        eta
        * np.sqrt(1 - np.power(beta_2, server_round + 1.0))
        / (1 - np.power(beta_1, server_round + 1.0))
    )
    new = {k: x + eta_t * m[k] / (np.sqrt(v[k]) + tau) for k, x in current.items()}
    return new, (m, v)


@dataclasses.dataclass(frozen=True)
class FedAvgMParams:
    server_lr: float = positive(1.0)
    server_momentum: float = below_one(0.9)


class FedAvgMStrategy(FedAvgStrategy):
    """FedAvgM (Hsu et al., 2019): server momentum on the averaged update
    (:func:`server_momentum_step`)."""

    Params = FedAvgMParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.momentum: Arrays | None = None

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        new, self.momentum = server_momentum_step(
            self.current,
            super().aggregate(server_round, results),
            self.momentum,
            self.hp.server_lr,
            self.hp.server_momentum,
        )
        return new

    def state_dict(self) -> dict[str, Any]:
        """The server momentum buffer (``None`` before the first aggregation)."""
        return {**super().state_dict(), "momentum_vector": self.momentum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        mv = state.get("momentum_vector")
        self.momentum = None if mv is None else [np.asarray(v) for v in mv]


@dataclasses.dataclass(frozen=True)
class FedAdamParams:
    server_lr: float = positive(0.01)
    beta_1: float = below_one(0.9)
    beta_2: float = below_one(0.99)
    tau: float = positive(1e-3)  # τ of Reddi et al.: adaptivity (denominator offset)


class FedAdamStrategy(FedAvgStrategy):
    """FedAdam as Flower implements it (:func:`adam_step`). The new global arrays are
    computed in float64 and sent and saved in the model's dtype
    (:meth:`StrategyBase.to_record`), so ``x_t`` is what the clients receive."""

    Params = FedAdamParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.moments: tuple[Moments | None, Moments | None] = (None, None)

    def aggregate(self, server_round: int, results: list[ClientResult]) -> list[np.ndarray]:
        hp = self.hp
        new, self.moments = adam_step(
            dict(zip(self.keys, self.current, strict=True)),
            dict(zip(self.keys, super().aggregate(server_round, results), strict=True)),
            self.moments,
            server_round,
            hp.server_lr,
            hp.beta_1,
            hp.beta_2,
            hp.tau,
        )
        return [new[k] for k in self.keys]

    def state_dict(self) -> dict[str, Any]:
        """Adam's first and second moments (``None`` before the first aggregation)."""
        m_t, v_t = self.moments
        return {**super().state_dict(), "m_t": m_t, "v_t": v_t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.moments = tuple(  # type: ignore[assignment]
            None if state.get(name) is None else {k: np.asarray(v) for k, v in state[name].items()}
            for name in ("m_t", "v_t")
        )
