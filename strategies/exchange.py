"""Payload exchanges: what a client sends besides its model, and what the server sends back.

A server strategy is two independent parts (composition, not inheritance):

- an **aggregator** (``server.name``: fedavg, fedavgm, fedadam, gne, fedau, pmfl), the
  :class:`strategies.base.StrategyBase` subclass that turns the clients' models into the next
  global model;
- an optional **payload exchange** (:class:`PayloadExchange`), which the *client* brings
  (its class attribute ``exchange`` names one in ``fl_app.registry.EXCHANGES``; FedCCL's
  ``signals``, :class:`strategies.fedccl.SignalExchange`). The strategy holds it and
  delegates its payload hooks to it; with none, the strategy expects and sends no payload.

An exchange does no aggregation: it validates each client's payload arrays, keeps what the
server needs of them across rounds, sends each participant its payload, and checkpoints its
state. Its hyperparameters (``Params``) are keys of the config's ``server`` section, valid
only with a client that brings it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array

from core.params import Config, params_from
from strategies.nodes import NodeRegistry
from strategies.replies import ClientResult, RejectedResult


@dataclasses.dataclass(frozen=True)
class NoExchangeParams:
    """An exchange without server-side hyperparameters."""


class PayloadExchange:
    """Base of every payload exchange: the hooks a strategy delegates to it.

    Subclasses set ``name`` (the key the clients' ``exchange`` attribute and
    ``fl_app.registry.EXCHANGES`` use), ``Params`` (a frozen dataclass of ``server.*``
    hyperparameters, each with a default) and override the hooks they need. Every hook's
    default is the behaviour of a strategy without an exchange, except :meth:`check_payload`,
    which subclasses must override (the default rejects any payload)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoExchangeParams

    def __init__(self, cfg: Config, nodes: NodeRegistry) -> None:
        """``cfg``: the run's validated config (``cfg["server"]`` holds this exchange's
        ``Params`` keys); ``nodes``: the strategy's node registry (partition ids, the label
        counts each node reported)."""
        self.cfg, self.nodes = cfg, nodes
        self.hp = params_from(self.Params, cfg["server"])

    def round_config(self, server_round: int) -> dict[str, Any]:
        """Extra scalar config values sent to every participant of ``server_round``."""
        return {}

    def payload_for(self, server_round: int, pid: int) -> dict[str, np.ndarray]:
        """Named arrays sent to partition ``pid`` in ``server_round`` ({}: none)."""
        return {}

    def check_payload(self, pid: int, payload: dict[str, Array]) -> dict[str, np.ndarray]:
        """Validate partition ``pid``'s payload, still undecoded (Flower ``Array``s), and
        return it decoded (``strategies.replies.decode_payload``, never unpickling); raise
        ``strategies.replies.RejectedResult`` naming the problem to drop the result."""
        raise RejectedResult(f"the {self.name or 'base'} exchange takes no payload")

    def after_aggregate(self, server_round: int, results: list[ClientResult]) -> dict[str, Any]:
        """Update the exchange's state from ``server_round``'s accepted ``results`` (each
        with its checked ``payload``), after the aggregator computed the new global model;
        returns entries for the round's record ({}: none)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The exchange's state for a checkpoint (JSON-friendly values or numpy arrays)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
