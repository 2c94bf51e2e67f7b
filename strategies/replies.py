"""Reply validation: what a client's reply must hold before the server aggregates it.

Pure functions over Flower messages and records, used by :class:`strategies.base.StrategyBase`
for training and federated-evaluation replies (and by the payload exchanges for their
payloads). A reply that must not be aggregated raises :class:`RejectedResult` naming the
problem; :func:`collect_replies` turns a round's replies into the results and one failure
record for each error or rejected reply, and :func:`missing` adds one for each partition that
did not answer. Nothing here knows a method.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

log = logging.getLogger("fl_app")

_T = TypeVar("_T")
NodeOf = Callable[[int], "int | None"]  # partition id -> the node that serves it


class RejectedResult(ValueError):
    """A client result that must not be aggregated; the message says why."""


@dataclass
class ClientResult:
    """One validated training result."""

    pid: int
    node_id: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, float]
    payload: dict[str, np.ndarray]
    message: Message
    #: Where the client ran, as its reply says (:func:`reply_place`), for the round log.
    place: dict[str, str] = field(default_factory=dict)


# collect_replies: log lines for an error reply and for a rejected reply
_REPLY_LOGS = {
    "training": ("client error (node %s): %s", "dropped result from node %s (partition %s): %s"),
    "evaluation": (
        "evaluation error (node %s): %s",
        "dropped evaluation from node %s (partition %s): %s",
    ),
}

_FLOWER_REASON = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>", re.DOTALL)
_REASON_LIMIT = 500


def error_message(reason: str | None) -> str:
    """The client's own error in the ``reason`` of a Flower error reply, on one line.

    A deployed SuperNode reports ``<class 'ValueError'>:<'bad data'>`` (→ ``ValueError: bad
    data``); in simulation the reason is Ray's whole traceback, whose client error follows its
    last ``Message: `` (→ the message alone). Anything else: its last non-empty line. White
    space collapsed to single spaces; at most 500 characters; ``None`` gives ``""``."""
    text = (reason or "").strip()
    if "Message: " in text:
        text = text.rsplit("Message: ", 1)[1].removesuffix("'>")
    elif m := _FLOWER_REASON.fullmatch(text):
        text = f"{m.group(1)}: {m.group(2)}"
    else:
        text = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    text = " ".join(text.split())
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


def decode_array(name: str, arr: Array) -> np.ndarray:
    """One array of a client's reply, decoded. Only Flower's ``numpy.ndarray`` serialisation
    is read, by ``np.load(allow_pickle=False)``: an object (pickled) array, another ``stype``
    or truncated bytes raise RejectedResult naming the array (``name``); nothing is ever
    unpickled."""
    try:
        return arr.numpy()
    except Exception as err:  # ValueError (pickled or truncated data), TypeError (stype)
        raise RejectedResult(f"{name} cannot be decoded: {err}") from err


def decode_payload(payload: dict[str, Array]) -> dict[str, np.ndarray]:
    """A client's payload arrays, decoded by :func:`decode_array`."""
    return {key: decode_array(f"payload array {key!r}", arr) for key, arr in payload.items()}


def as_float(v: Any) -> float:
    """``float(v)``, NaN for what has no float value (an int beyond float range)."""
    try:
        return float(v)
    except (OverflowError, TypeError, ValueError):
        return math.nan


def cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` (e.g. a float64 aggregate) in ``like``'s dtype, without a copy when it
    already has it; integer arrays are rounded, not truncated. The arrays a server sends and
    checkpoints are in the model's dtype."""
    if np.issubdtype(like.dtype, np.integer):
        value = np.rint(value)
    return np.asarray(value).astype(like.dtype, copy=False)


def reply_pids(
    replies: Sequence[Message], sent: Iterable[tuple[Message, int]], node_of: NodeOf
) -> list[int | None]:
    """The partition each reply answers (None: no message of the exchange): by the id of the
    message it replies to (error replies for dead nodes come from the SuperLink, not the
    node), else by sender. ``sent``: the exchange's (message, partition) pairs, whose message
    ids the Grid stamped in place when it sent them."""
    sent = list(sent)
    by_id = {m.metadata.message_id: p for m, p in sent if m.metadata.message_id}
    by_node = {node_of(p): p for _, p in sent}
    return [
        by_id.get(r.metadata.reply_to_message_id, by_node.get(r.metadata.src_node_id))
        for r in replies
    ]


def collect_replies(
    replies: Sequence[Message],
    expected_pids: Sequence[int | None],
    validate: Callable[[Message, int | None], _T | None],
    pid_of: Callable[[_T], int],
    phase: str,
) -> tuple[list[_T], list[dict[str, Any]]]:
    """The per-reply loop shared by training and federated evaluation.

    ``validate(reply, expected)`` (``expected``: the partition the answered message was sent
    to, the reply's entry of ``expected_pids`` from :func:`reply_pids`) returns the validated
    result, ``None`` for a reply to leave out without a failure (an empty local test split),
    or raises RejectedResult. Returns the results in arrival order and a failure record for
    each error reply (``kind`` "error", with Flower's ``code``) and each rejected one
    (``kind`` "rejected"), a second result for a partition included; each failure is
    logged. ``phase`` ("training" or "evaluation") picks the log wording."""
    error_log, dropped_log = _REPLY_LOGS[phase]
    good: list[_T] = []
    failures: list[dict[str, Any]] = []
    seen: set[int] = set()
    for reply, expected in zip(replies, expected_pids, strict=True):
        node = reply.metadata.src_node_id
        if reply.has_error():
            err = reply.error
            failures.append(
                {
                    "kind": "error",
                    "node_id": node,
                    "pid": expected,
                    "code": err.code,
                    "reason": f"code {err.code}: {error_message(err.reason)}",
                }
            )
            log.warning(error_log, node, err.reason)
            continue
        try:
            got = validate(reply, expected)
            if got is None:
                continue
            pid = pid_of(got)
            if pid in seen:
                raise RejectedResult(f"duplicate result for partition {pid}")
            seen.add(pid)
            good.append(got)
        except RejectedResult as err:
            failures.append(
                {"kind": "rejected", "node_id": node, "pid": expected, "reason": str(err)}
            )
            log.warning(dropped_log, node, expected, err)
    return good, failures


#: Ray's errors for a simulated client whose actor is gone (its node lost, its process
#: killed): the ``reason`` of an error failure record begins with one of them.
_RAY_ACTOR_LOST = re.compile(
    r"^code \d+: (ActorDiedError|ActorUnavailableError|RayActorError|NodeDiedError)\b"
)


def ray_actor_lost(failures: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The first error failure record (:func:`collect_replies`) that says a client's Ray
    actor is gone, or None. Flower's Ray backend puts such an actor back into its pool, so
    from then on it fails a share of the clients in every round."""
    return next(
        (
            f
            for f in failures
            if f.get("kind") == "error" and _RAY_ACTOR_LOST.match(str(f.get("reason", "")))
        ),
        None,
    )


def missing(
    pids: Iterable[int], answered: set[int | None], reason: str, node_of: NodeOf
) -> list[dict[str, Any]]:
    """A ``kind`` "missing" failure record for each of ``pids`` not in ``answered`` (the
    :func:`reply_pids` of the replies; an error reply counts as an answer: it is recorded as
    the error)."""
    return [
        {"kind": "missing", "node_id": node_of(pid), "pid": pid, "reason": reason}
        for pid in pids
        if pid not in answered
    ]


#: The reply's ``info`` entries that say where a client ran, and their round-log keys
#: (``numerics``: ``core.training.numerics`` of the device it trained on).
PLACE_KEYS = {
    "host": "host",
    "ray-node": "ray_node",
    "ray-node-ip": "ray_node_ip",
    "numerics": "numerics",
}


def reply_place(content: RecordDict) -> dict[str, str]:
    """Where a training reply says its client ran (``fl_app.client_app.where``) and on what
    arithmetic (``numerics``): the :data:`PLACE_KEYS` found in its ``info`` record as strings
    of at most 200 characters, under their round-log names; anything else there is ignored."""
    try:
        info = content["info"]
    except (KeyError, TypeError):
        return {}
    return {
        ours: value
        for theirs, ours in PLACE_KEYS.items()
        if isinstance(value := info.get(theirs), str) and len(value) <= 200
    }


def check_identity(content: RecordDict, expected: int | None, num_clients: int) -> int:
    """The reply's partition id: an integer (not 1.9, ``True`` or ``"1"``: int() would
    truncate or coerce them into another partition), in 0..num_clients−1, and the partition
    the message it answers was sent to (``expected``, from :func:`reply_pids`): a node
    answering as another partition would take that partition's place and report its own as
    missing."""
    try:
        pid = content["info"]["partition-id"]
    except (KeyError, TypeError) as err:
        raise RejectedResult(f"reply lacks info/partition-id ({err})") from err
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise RejectedResult(f"partition id must be an integer, got {pid!r}")
    if not 0 <= pid < num_clients:
        raise RejectedResult(f"partition id {pid} outside 0..{num_clients - 1}")
    if expected is None:
        raise RejectedResult(f"reply from partition {pid} answers no message of this round")
    if pid != expected:
        raise RejectedResult(
            f"partition id {pid} in a reply to the message sent to partition {expected}"
        )
    return pid


def check_count(n: Any, pid: int, limit: int | None, split: str) -> int:
    """num-examples: a positive integer, at most ``limit`` (the size of the ``split`` the
    node reported at its query; ``None``: not reported, no upper bound)."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise RejectedResult(f"num-examples must be a positive integer, got {n!r}")
    if limit is not None and n > limit:
        raise RejectedResult(
            f"num-examples {n} exceeds the {limit} {split} samples partition {pid} reported"
        )
    return n


def check_arrays(
    record: ArrayRecord, keys: Sequence[str], template: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """The reply's model arrays, decoded (:func:`decode_array`), in ``keys`` order: the
    model's names, each with the ``template`` array's shape and dtype, floats all finite."""
    if list(record.keys()) != list(keys):
        raise RejectedResult(
            f"array names differ from the model's ({len(record)} arrays, expected {len(keys)})"
        )
    arrays = []
    for key, ref in zip(keys, template, strict=True):
        arr = decode_array(f"array {key!r}", record[key])
        if arr.shape != ref.shape or arr.dtype != ref.dtype:
            raise RejectedResult(
                f"array {key!r} has shape {arr.shape} dtype {arr.dtype}, "
                f"expected {ref.shape} {ref.dtype}"
            )
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            raise RejectedResult(f"array {key!r} holds NaN or Inf")
        arrays.append(arr)
    return arrays


def check_metrics(record: MetricRecord) -> dict[str, float]:
    """The reply's metrics other than num-examples, each a finite scalar: an honest client
    never sends a non-finite one nor a list (arrays travel as the payload)."""
    metrics: dict[str, float] = {}
    for k, v in record.items():
        if k == "num-examples":
            continue
        if isinstance(v, list):
            raise RejectedResult(
                f"metric {k!r} is a list; metrics must be scalars (arrays go in the payload)"
            )
        value = as_float(v)
        if not math.isfinite(value):
            raise RejectedResult(f"metric {k!r} = {v!r} is not a finite number")
        metrics[k] = value
    return metrics


def check_update_norm(
    arrays: Sequence[np.ndarray], current: Sequence[np.ndarray], limit: float
) -> None:
    """``‖w_k − W‖`` over the float arrays (in float64) at most ``limit``
    (``server.max_update_norm``)."""
    deltas = (
        a.astype(np.float64) - g
        for a, g in zip(arrays, current, strict=True)
        if np.issubdtype(a.dtype, np.floating)
    )
    norm = math.sqrt(sum(float(np.vdot(d, d).real) for d in deltas))
    if norm > limit:
        raise RejectedResult(f"update norm {norm:.3g} exceeds server.max_update_norm {limit:.3g}")


def check_evaluation(record: MetricRecord) -> tuple[float, float]:
    """(accuracy, loss) of an evaluation reply: numbers, accuracy in [0, 1], loss finite and
    >= 0."""
    values = {}
    for key in ("accuracy", "loss"):
        v = record.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise RejectedResult(f"{key} must be a number, got {v!r}")
        values[key] = as_float(v)
    acc, loss = values["accuracy"], values["loss"]
    if not 0.0 <= acc <= 1.0:
        raise RejectedResult(f"accuracy {record.get('accuracy')!r} outside [0, 1]")
    if not (np.isfinite(loss) and loss >= 0):
        raise RejectedResult(f"loss {record.get('loss')!r} must be finite and >= 0")
    return acc, loss
