"""FedCCL's server side (Qiao et al., 2024): the signal exchange, global signals from local ones.

Each client returns its local signals (FINCH cluster means of its normalised features, per
class) with their labels. The server validates them (shape, dtype, finite, label range, size
limit; never unpickles), keeps the latest signals of every client, and per class clusters
all clients' signals with FINCH again: the normalised mean of the resulting cluster centres is
the global signal ``U_j`` (paper Eq. 15). The next round's config carries all local signals
with labels and the ``U`` matrix with a mask of the classes that have a signal.

This is a payload exchange (:mod:`strategies.exchange`), not a strategy: it does no model
aggregation. The FedCCL client brings it (``clients.fedccl.FedCCLClient.exchange``), and
whichever aggregator ``server.name`` names holds it: FedAvg's sample-weighted mean (the
paper), FedAvgM's momentum, FedAdam, GNE's Nash weights, FedAU's or PMFL's weights. The
server names of the former combination classes (``fedccl``, ``fedcclm``, ``fedccladam``,
``fedcclgne``, ``fedcclau``) are aliases of fedavg, fedavgm, fedadam, gne and fedau
(``fl_app.registry.SERVER_ALIASES``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array

from fl_app.config import Config, one_of
from fl_app.models import build_model
from fl_app.prototypes import PayloadError, global_signals, validate_signals
from strategies.exchange import PayloadExchange
from strategies.nodes import NodeRegistry
from strategies.replies import ClientResult, RejectedResult, decode_payload

_NPY_HEADER_BYTES = 4096  # generous bound on one .npy header (numpy pads them to 64-128 bytes)


@dataclasses.dataclass(frozen=True)
class FedCCLServerParams:
    server_signals: str = one_of("finch", "mean")  # how the server merges signals per class


class SignalExchange(PayloadExchange):
    """FedCCL's signals: every client's latest local signals and the global signals merged
    from them (``server.server_signals``: FINCH or the plain mean per class)."""

    name: ClassVar[str] = "signals"
    Params: ClassVar[type] = FedCCLServerParams

    def __init__(self, cfg: Config, nodes: NodeRegistry) -> None:
        """No signals yet; the model's feature dimension and the number of classes bound
        what a client may send."""
        super().__init__(cfg, nodes)
        self.feature_dim = int(build_model(self.cfg).feature_dim)
        self.num_classes = int(self.cfg["data"]["num_classes"])
        self.local: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.global_sig: np.ndarray | None = None
        self.global_mask: np.ndarray | None = None

    def check_payload(self, pid: int, payload: dict[str, Array]) -> dict[str, np.ndarray]:
        """Exactly ``signals`` and ``signal_labels``, at most the bytes that
        ``server.max_payload_rows`` signals take (float64 signals, int64 labels, .npy
        headers), both checked before anything is decoded; then decoded without unpickling
        (:func:`decode_payload`) and validated (:func:`validate_signals`)."""
        if set(payload) != {"signals", "signal_labels"}:
            raise RejectedResult(
                f"payload must hold exactly 'signals' and 'signal_labels', got {sorted(payload)}"
            )
        max_rows = int(self.cfg["server"]["max_payload_rows"])
        max_bytes = max_rows * (self.feature_dim + 1) * 8 + 2 * _NPY_HEADER_BYTES
        size = sum(len(a.data) for a in payload.values())
        if size > max_bytes:
            raise RejectedResult(
                f"payload of {size} bytes exceeds the {max_bytes} that server.max_payload_rows "
                f"= {max_rows} signals of dimension {self.feature_dim} can take (not decoded)"
            )
        arrays = decode_payload(payload)
        try:
            sig, lab = validate_signals(
                arrays["signals"],
                arrays["signal_labels"],
                dim=self.feature_dim,
                num_classes=self.num_classes,
                max_rows=max_rows,
                class_counts=self.nodes.by_pid[pid].label_counts or None,
            )
        except PayloadError as err:
            raise RejectedResult(f"bad signals payload: {err}") from err
        return {"signals": sig, "signal_labels": lab}

    def after_aggregate(self, server_round: int, results: list[ClientResult]) -> dict[str, Any]:
        """Keep each result's signals as its client's latest (a client that did not reply
        keeps its earlier ones), merge all of them into the global signals per class;
        records the number of local signals and of classes with a global signal."""
        for r in results:
            self.local[r.pid] = (r.payload["signals"], r.payload["signal_labels"])
        sig, lab = self._all_local()
        self.global_sig, self.global_mask = global_signals(
            sig, lab, self.num_classes, method=self.hp.server_signals
        )
        return {
            "num_local_signals": int(len(lab)),
            "classes_with_signal": int(self.global_mask.sum()),
        }

    def _all_local(self) -> tuple[np.ndarray, np.ndarray]:
        pids = sorted(self.local)
        sig = np.concatenate([self.local[p][0] for p in pids]).astype(np.float32)
        lab = np.concatenate([self.local[p][1] for p in pids]).astype(np.int64)
        return sig, lab

    def payload_for(self, server_round: int, pid: int) -> dict[str, np.ndarray]:
        """Every client's local signals with their labels and the global signals with their
        class mask, the same for every participant; nothing before the first aggregation
        (round 1 is cross-entropy only)."""
        if not self.local or self.global_sig is None or self.global_mask is None:
            return {}
        sig, lab = self._all_local()
        return {
            "local_signals": sig,
            "local_labels": lab,
            "global_signals": self.global_sig,
            "global_mask": self.global_mask,
        }

    def state_dict(self) -> dict[str, Any]:
        """The local signals by partition id, the global signals and mask (``None``
        before the first aggregation)."""
        return {
            "local": {str(p): [s, lab] for p, (s, lab) in self.local.items()},
            "global_sig": self.global_sig,
            "global_mask": self.global_mask,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (missing keys: the state before the
        first aggregation)."""
        self.local = {
            int(p): (np.asarray(s, np.float32), np.asarray(lab, np.int64))
            for p, (s, lab) in state.get("local", {}).items()
        }
        if state.get("global_sig") is not None:
            self.global_sig = np.asarray(state["global_sig"], np.float32)
            self.global_mask = np.asarray(state["global_mask"], bool)
