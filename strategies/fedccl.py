"""FedCCL's signals (Qiao et al., 2024): their math on both sides, and the server's exchange.

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

The signal math of both sides lives here, with the exchange that carries it; the client
(``clients.fedccl``) computes its local signals and checks the round's payload with it.

Client (paper Eqs. 8–10): the L2-normalised features of one class are clustered with FINCH
(cosine distance); each cluster's mean, re-normalised, is a *local signal*.
Server (paper Eqs. 13–15): per class, all clients' local signals are pooled and clustered with
FINCH again; the re-normalised mean of the cluster centres is the *global signal* ``U_j``
(Eq. 15 writes a sum; the text calls it an average, and after normalisation both agree).
The ``mean`` method replaces clustering by one plain mean (the "averaged signals" ablation,
paper Table 7).

FINCH (Sarfraz et al., CVPR 2019) comes from the pinned PyPI ``finch-clust`` 0.2.3 and is
called with keyword arguments only (its positional order differs from the original
repository). It is always run on its exact path: the first level builds the full n×n cosine
distance matrix, so time and memory are O(n²·d) and O(n²) in the number of rows clustered (a
class's features on one client, e.g. 5,000 rows → ~100 MB float32; one class's pooled signals
on the server, at most a few thousand rows). Later levels work on cluster means and are much
smaller. The exact path is deterministic (argmin ties go to the lowest index).

Behaviour of finch-clust 0.2.3 (with scipy 1.17) worth knowing, observed and pinned by tests:
* the coarsest partition returned is the last level with ≥ 2 clusters, unless the first level
  already has one cluster; a level that merges everything into one cluster, or merges only one
  pair (0.2.3's ``exit_clust <= 1``), is dropped. Each level merges every cluster with its
  first neighbour, so well-separated groups can still be merged (3 orthogonal blobs of 20
  points give 2–5 clusters depending on the seed);
* ``ensure_early_exit`` has no effect: the pruned edges are set to explicit zeros in a CSR
  matrix, which scipy's ``connected_components`` still counts as edges;
* 1–3 points always form one cluster (their 1-NN graph is connected), so this module skips
  FINCH there; 4 points give 1 or 2 clusters, 5 points 1 or 2, 6 points up to 3;
* the number of clusters depends strongly on the data: 1,000 Gaussian points in 128-d give 4,
  but non-negative (ReLU-like) unimodal points collapse to one cluster at level 1, which is
  dropped, so the fine first level is returned (about n/7 clusters: 714 for n = 5,000).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, get_args

import numpy as np
from flwr.app import Array

from core.models import build_model
from core.params import Config, one_of
from strategies.exchange import PayloadExchange
from strategies.nodes import NodeRegistry
from strategies.replies import ClientResult, RejectedResult, decode_payload

SignalMethod = Literal["finch", "mean"]
_METHODS: tuple[str, ...] = get_args(SignalMethod)
_EPS = 1e-12


class PayloadError(ValueError):
    """A client's signals payload is malformed; the message names the problem."""


def _normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation (float64); zero rows stay zero."""
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, _EPS)


def _check_method(method: str) -> None:
    if method not in _METHODS:
        raise ValueError(f"signals method {method!r}; allowed: {', '.join(_METHODS)}")


def _run_finch(x: np.ndarray) -> np.ndarray:
    """FINCH's label matrix (n, P) on the exact path, warnings and prints silenced."""
    from scipy.sparse import SparseEfficiencyWarning

    with warnings.catch_warnings():
        # import-time notice about the optional pynndescent (only used above ann_threshold)
        warnings.filterwarnings("ignore", message="pynndescent is not installed")
        # FINCH edits CSR matrices in place when ensure_early_exit prunes edges
        warnings.filterwarnings("ignore", category=SparseEfficiencyWarning)
        from finch import FINCH

        c, _, _ = FINCH(
            data=np.ascontiguousarray(x, dtype=np.float32),
            distance="cosine",
            ensure_early_exit=True,
            ann_threshold=max(len(x), 1),  # never the approximate path: exact, deterministic
            verbose=False,
        )
    return np.asarray(c)


def finch_partition(features: np.ndarray) -> np.ndarray:
    """Cluster labels (n,) int64, values 0..m-1, of the coarsest partition FINCH returns.

    Cosine distance, exact path (paper Eq. 8: first-neighbour adjacency, merged recursively).
    ``features`` is (n, d), finite; scale does not matter. n ≤ 3 gives all zeros without
    calling FINCH (FINCH always returns one cluster there).
    """
    x = np.asarray(features)
    if x.ndim != 2:
        raise ValueError(f"features has shape {x.shape}, expected (n, d)")
    n = len(x)
    if n <= 3:
        return np.zeros(n, dtype=np.int64)
    coarsest = _run_finch(x)[:, -1]
    return np.unique(coarsest, return_inverse=True)[1].astype(np.int64).reshape(n)


def cluster_means(features: np.ndarray, method: SignalMethod = "finch") -> np.ndarray:
    """Unit-norm cluster means (m, d) float64 of ``features`` (n ≥ 1, d).

    Rows are L2-normalised first; ``finch`` takes the mean of each cluster of
    :func:`finch_partition` (paper Eqs. 9–10), in cluster-label order; ``mean`` returns one
    plain mean (m = 1). Means of (near-)zero norm have no direction and are dropped, so
    m can be 0 only in that degenerate case.
    """
    _check_method(method)
    x = np.asarray(features)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"features has shape {x.shape}, expected (n, d) with n ≥ 1")
    f = _normalize(x)
    if method == "mean":
        means = f.mean(axis=0, keepdims=True)
    else:
        labels = finch_partition(f)
        counts = np.bincount(labels).astype(np.float64)
        sums = np.zeros((len(counts), f.shape[1]))
        np.add.at(sums, labels, f)
        means = sums / counts[:, None]
    keep = np.linalg.norm(means, axis=1) > 1e-8
    return _normalize(means[keep])


def _usable_rows(x: np.ndarray) -> np.ndarray:
    """Mask of rows with a direction: finite and non-zero."""
    return np.isfinite(x).all(axis=1) & (np.abs(x).max(axis=1, initial=0.0) > 0)


def local_signals(
    features: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    method: SignalMethod = "finch",
) -> tuple[np.ndarray, np.ndarray]:
    """FedCCL local signals of one client (paper Eqs. 8–10).

    For each class c in 0..num_classes-1 present in ``labels``, the unit-norm cluster means
    of that class's features (:func:`cluster_means`). Rows without a direction (zero or
    non-finite features) are skipped; a class left without rows produces nothing.
    Returns (signals float32 (M, d), signal_labels int64 (M,)), classes in ascending order;
    every row has unit norm, so the payload passes :func:`validate_signals`.
    """
    _check_method(method)
    x = np.asarray(features)
    y = np.asarray(labels)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"features {x.shape} and labels {y.shape} must be (n, d) and (n,)")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}")
    ok = _usable_rows(x)
    sig = [np.zeros((0, x.shape[1]))]
    lab = [np.zeros(0, np.int64)]
    for c in range(num_classes):
        sel = ok & (y == c)
        if sel.any():
            means = cluster_means(x[sel], method)
            sig.append(means)
            lab.append(np.full(len(means), c, dtype=np.int64))
    return np.concatenate(sig).astype(np.float32), np.concatenate(lab)


def global_signals(
    signals: np.ndarray,
    signal_labels: np.ndarray,
    num_classes: int,
    method: SignalMethod = "finch",
) -> tuple[np.ndarray, np.ndarray]:
    """FedCCL global signals on the server (paper Eqs. 13–15).

    Per class j, pool every client's local signals of class j; cluster them with FINCH
    (``finch``; one or up to three signals form one cluster) and take the unit-norm centres
    G_j^k; U_j is the re-normalised mean of the centres, so every cluster counts equally
    whatever its size. ``mean`` uses one plain mean of the pooled signals instead.
    Returns (U float32 (C, d), zero rows for classes without a signal; mask bool (C,)).
    """
    _check_method(method)
    s = np.asarray(signals)
    y = np.asarray(signal_labels)
    if s.ndim != 2 or y.shape != (len(s),):
        raise ValueError(f"signals {s.shape} and labels {y.shape} must be (M, d) and (M,)")
    U = np.zeros((num_classes, s.shape[1]), np.float32)
    mask = np.zeros(num_classes, dtype=bool)
    ok = _usable_rows(s)
    for c in range(num_classes):
        sel = ok & (y == c)
        if not sel.any():
            continue
        centres = cluster_means(s[sel], method)
        u = _normalize(centres.mean(axis=0, keepdims=True))
        if len(centres) and np.linalg.norm(u) > 0:
            U[c] = u[0]
            mask[c] = True
    return U, mask


def round_payload(
    signals: np.ndarray, labels: np.ndarray, num_classes: int, method: SignalMethod = "mean"
) -> dict[str, np.ndarray]:
    """A FedCCL client's next-round config from local signals, as the server sends it: all
    local signals with their labels and the global signals (:func:`global_signals`) with
    their mask. For benchmarks and tests that play the server for one client."""
    U, mask = global_signals(signals, labels, num_classes, method)
    return {
        "local_signals": signals,
        "local_labels": labels,
        "global_signals": U,
        "global_mask": mask,
    }


def check_round_payload(config: dict[str, Any], *, dim: int, num_classes: int) -> None:
    """Check the signals a FedCCL client receives in its train config (what
    :func:`round_payload` and the server's ``payload_for`` send): ``local_signals`` float
    (M, dim) with ``local_labels`` integers (M,) in 0..num_classes-1, both or neither;
    ``global_signals`` float (num_classes, dim) with ``global_mask`` (num_classes,), both or
    neither; every value finite. Raises :class:`PayloadError` naming the config key, so a
    server of another version or model fails the round clearly instead of a shape error
    deep in the loss (or, for an extra class, training silently on it)."""
    pairs = (("local_signals", "local_labels"), ("global_signals", "global_mask"))
    try:
        for a, b in pairs:
            if (a in config) != (b in config):
                sent, missing = (a, b) if a in config else (b, a)
                raise PayloadError(f"{sent} came without {missing}")
        if "local_signals" in config:
            s, lab = np.asarray(config["local_signals"]), np.asarray(config["local_labels"])
            _check_signals_array(s, dim)
            _check_labels_array(lab, len(s), num_classes)
            if not np.isfinite(s).all():
                raise PayloadError("signals hold NaN or Inf")
        if "global_signals" in config:
            u, mask = np.asarray(config["global_signals"]), np.asarray(config["global_mask"])
            _check_signals_array(u, dim)
            if len(u) != num_classes or mask.shape != (num_classes,):
                raise PayloadError(
                    f"global signals {u.shape} and mask {mask.shape} are not one per class "
                    f"({num_classes}, {dim}) and ({num_classes},)"
                )
            if not np.isfinite(u).all():
                raise PayloadError("global signals hold NaN or Inf")
    except PayloadError as err:
        raise PayloadError(
            f"FedCCL signals from the server: {err}; are the server and this client the same "
            "version, with the same model and data.num_classes?"
        ) from None


def validate_signals(
    signals: np.ndarray,
    labels: np.ndarray,
    *,
    dim: int,
    num_classes: int,
    max_rows: int,
    class_counts: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Check one untrusted client's signals payload (the output of :func:`local_signals`).

    Requires: ``signals`` a real floating 2-D array (M, dim) of finite values with no all-zero
    row; ``labels`` an integer 1-D array (M,) with 0 ≤ label < num_classes; M ≤ max_rows;
    with ``class_counts`` (the client's training samples per class, as its node reported
    them), at most :func:`max_signals` of them per class, which keeps the server's FINCH
    over the pooled signals (memory quadratic in their number) within half the federation's
    samples of each class. M = 0 is accepted (a client may have nothing to send). Returns
    copies: signals float32,
    each row re-normalised to unit L2 norm (computed in float64, overflow-safe), labels int64.
    Raises :class:`PayloadError` whose message names the first problem found.
    """
    s, lab = np.asarray(signals), np.asarray(labels)
    _check_signals_array(s, dim)
    _check_labels_array(lab, len(s), num_classes)
    if len(s) > max_rows:
        raise PayloadError(f"{len(s)} signals exceed the limit of {max_rows} rows")
    if class_counts is not None:
        sent = np.bincount(lab.astype(np.int64), minlength=num_classes)
        for c, (k, n) in enumerate(zip(sent.tolist(), class_counts, strict=False)):
            if k > max_signals(n):
                raise PayloadError(
                    f"{k} signals of class {c} from a client with {n} training samples of it "
                    f"(FINCH's coarsest partition of n points has at most max(1, n // 2) "
                    "clusters)"
                )
    finite = np.isfinite(s).all(axis=1)
    if not finite.all():
        raise PayloadError(f"signals row {int(np.argmin(finite))} holds NaN or Inf")
    x = s.astype(np.float64)
    scale = np.abs(x).max(axis=1, initial=0.0)
    if (scale == 0).any():
        raise PayloadError(f"signals row {int(np.argmin(scale))} is a zero row")
    x /= scale[:, None]  # max |entry| becomes 1: the norm cannot overflow or underflow
    return _normalize(x).astype(np.float32), lab.astype(np.int64)


def max_signals(n: int) -> int:
    """The most local signals a client with ``n`` samples of a class sends for it: FINCH's
    first partition joins every point to its nearest neighbour, so each cluster holds ≥ 2
    points and there are at most ``n // 2`` (1 for a single point; 0 for none); coarser
    partitions have fewer, and ``mean`` sends 1."""
    return max(1, n // 2) if n > 0 else 0


def _check_signals_array(s: np.ndarray, dim: int) -> None:
    if s.dtype.kind != "f":
        raise PayloadError(f"signals must be a float array, got dtype {s.dtype}")
    if s.ndim != 2 or s.shape[1] != dim:
        raise PayloadError(f"signals has shape {s.shape}, expected (M, {dim})")


def _check_labels_array(lab: np.ndarray, rows: int, num_classes: int) -> None:
    if lab.dtype.kind not in "iu":
        raise PayloadError(f"signal_labels must be integers, got dtype {lab.dtype}")
    if lab.shape != (rows,):
        raise PayloadError(f"signal_labels has shape {lab.shape}, expected ({rows},)")
    if rows and (lab.min() < 0 or lab.max() >= num_classes):
        bad = lab[(lab < 0) | (lab >= num_classes)][0]
        raise PayloadError(f"signal label {int(bad)} outside 0..{num_classes - 1}")


# ------------------------------------------------------------------ the exchange
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
