"""Client state that must survive rounds: a store keyed by partition id.

Simulation rebuilds client objects every round and deployment starts a fresh process per
message, so nothing may live on the client object. Model-sized state (MOON's previous models,
PMFL's buffer of local iterates) is written to files under a state directory, one folder per
(partition id, key); a small in-memory LRU cache per process avoids re-reading what an actor
just wrote, and bounds memory so that hundreds of simulated clients fit in RAM. A cached
value is used only while its file is the one it was read from or written to (same inode,
modification time and size): several Ray actors share the directory, and a client trained by
another actor since must be read again, never served from this actor's older copy. Files are
written atomically (temp file + rename) and read with ``torch.load(weights_only=True)``,
which never unpickles arbitrary objects.

Each value is saved as a version tagged with the round that wrote it and the run's session
(0 for the first start, +1 for each ``--resume``), so that a resumed run sees the client state
its checkpoint saw. The server checkpoints every ``checkpoint_every`` rounds; when a run stops
between two checkpoints, the clients have already saved state for rounds the resumed run will
redo. :class:`Lineage` (sent by the server in every train config) says which versions belong
to the run's history: those of the current session, and those of session ``i`` up to the
round ``resumed[i]`` that session ``i + 1`` resumed from. A client reads the newest such
version older than the current round. A save keeps, besides the new version, the newest one
at or before the last checkpoint (a resume from it needs it) and deletes the rest, so a
client has at most two versions on disk.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("fl_app").getChild(__name__)  # the project's logger (ServerApp handlers)

_VERSION = re.compile(r"r(\d+)s(\d+)\.pt")
#: What ``torch.load`` raises for a truncated, corrupt or foreign file.
_UNREADABLE = (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError)
#: A temp file this old is a save that a killed process left behind (a save takes seconds).
STALE_TMP_S = 600.0


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Which saved versions belong to this run's history.

    ``resumed[i]`` is the checkpoint round that session ``i + 1`` resumed from (so session
    ``i``'s versions after it were discarded); the current session is ``len(resumed)``.
    ``checkpoint`` is the newest round the server has checkpointed."""

    resumed: tuple[int, ...] = ()
    checkpoint: int = 0

    @property
    def session(self) -> int:
        return len(self.resumed)

    def valid(self, rnd: int, session: int) -> bool:
        """Whether the version saved in round ``rnd`` by ``session`` is part of the history."""
        return session == self.session or (session < self.session and rnd <= self.resumed[session])

    def to_config(self) -> dict[str, Any]:
        """The train-config entries the clients read back with :meth:`from_config`."""
        return {
            "state-resumed": ",".join(map(str, self.resumed)),
            "state-checkpoint": self.checkpoint,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Lineage:
        raw = str(config.get("state-resumed", "")).strip()
        try:
            resumed = tuple(int(x) for x in raw.split(",")) if raw else ()
        except ValueError:
            raise ValueError(
                f"state-resumed={raw!r}: expected comma-separated round numbers"
            ) from None
        return cls(resumed, int(config.get("state-checkpoint", 0)))


class StateStore:
    """Disk-backed key-value store of tensors (or lists/dicts of tensors) per client.

    ``load`` and ``save`` take the current round and the run's :class:`Lineage`; without
    them (unit tests, tools) every value is round 0 of session 0 and a save replaces it."""

    def __init__(self, root: str | Path, cache_items: int = 8) -> None:
        self.root = Path(root)
        self.cache_items = cache_items
        # file path -> (file stamp, value)
        self._cache: OrderedDict[Path, tuple[tuple[int, int, int], Any]] = OrderedDict()
        # versions load skipped (unreadable or refused), with the stamp they had then
        self._refused: dict[Path, tuple[int, int, int]] = {}

    def _dir(self, pid: int, key: str) -> Path:
        return self.root / f"client_{pid}" / key

    def versions(self, pid: int, key: str) -> list[tuple[int, int, Path]]:
        """(round, session, file) of every saved version of ``(pid, key)``, oldest first."""
        d = self._dir(pid, key)
        if not d.is_dir():
            return []
        found = []
        for f in d.iterdir():
            m = _VERSION.fullmatch(f.name)
            if m:
                found.append((int(m[1]), int(m[2]), f))
        return sorted(found)

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int, int] | None:
        """Identity of the file's current version (a save replaces the file: new inode)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(
        self,
        pid: int,
        key: str,
        server_round: int | None = None,
        lineage: Lineage = Lineage(),
        check: Callable[[Any], str | None] | None = None,
    ) -> Any | None:
        """The newest value saved for ``(pid, key)`` in the run's history before
        ``server_round`` (any round when None), by any process; None if there is none.
        Served from the cache only while the file is unchanged since it was cached.

        A version that cannot be read (e.g. truncated by a crash), or that ``check`` refuses
        (it returns why, or None), is skipped with a warning naming the file and the reason,
        and the next older one is tried: a node then trains with older state, or none,
        instead of failing every later round on the same file."""
        history = [
            path
            for rnd, session, path in self.versions(pid, key)
            if lineage.valid(rnd, session) and (server_round is None or rnd < server_round)
        ]
        for path in reversed(history):
            stamp = self._stamp(path)
            if stamp is None:  # deleted since it was listed
                self._cache.pop(path, None)
                continue
            cached = self._cache.get(path)
            if cached is not None and cached[0] == stamp:
                value, problem = cached[1], None
            else:
                value, problem = _read(path)
            if problem is None and check is not None:
                problem = check(value)
            if problem:
                self._refused[path] = stamp
                log.warning(
                    "client %d: skipping saved state %s: %s; using an older version, if any",
                    pid,
                    path,
                    problem.splitlines()[0][:300],
                )
                continue
            self._remember(path, stamp, value)
            return value
        return None

    def save(
        self, pid: int, key: str, value: Any, server_round: int = 0, lineage: Lineage = Lineage()
    ) -> None:
        """Persist ``value`` for ``(pid, key)`` as round ``server_round``'s version
        atomically and durably (written to a temp file, flushed to disk, renamed), keep it
        in the cache, and delete the versions no resume can need and the temp files of
        saves that a killed process left (older than :data:`STALE_TMP_S`). The version kept
        for a resume is the newest at or before the checkpoint that :meth:`load` did not
        skip in this process (a skipped one is deleted, the readable one before it kept)."""
        d = self._dir(pid, key)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"r{server_round}s{lineage.session}.pt"
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(value, fh)
                fh.flush()
                os.fsync(fh.fileno())  # the old version goes next: the new one must be whole
            os.replace(tmp, path)
            _fsync_dir(d)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        stamp = self._stamp(path)
        if stamp is not None:
            self._remember(path, stamp, value)
        saved = self.versions(pid, key)  # one listing, the new version included
        committed = [  # the one a resume from the checkpoint reads: not one load skipped
            p
            for rnd, session, p in saved
            if lineage.valid(rnd, session)
            and rnd <= lineage.checkpoint
            and p != path
            and self._refused.get(p, (-1, -1, -1)) != self._stamp(p)
        ]
        keep = {path, *committed[-1:]}
        for _, _, p in saved:
            if p not in keep:
                p.unlink(missing_ok=True)
                self._cache.pop(p, None)
                self._refused.pop(p, None)
        for left in d.glob("*.tmp"):
            stamp = self._stamp(left)
            if stamp is not None and time.time() - stamp[1] / 1e9 > STALE_TMP_S:
                left.unlink(missing_ok=True)

    def _remember(self, path: Path, stamp: tuple[int, int, int], value: Any) -> None:
        self._cache[path] = (stamp, value)
        self._cache.move_to_end(path)
        while len(self._cache) > self.cache_items:
            self._cache.popitem(last=False)


def _read(path: Path) -> tuple[Any, str | None]:
    """(value, None) of a saved version, or (None, why it cannot be read)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True), None
    except _UNREADABLE as err:
        return None, f"unreadable ({type(err).__name__}: {err})"


def _fsync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename) to disk, where the OS allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory
    finally:
        os.close(fd)


class RoundState:
    """A client's view of the store in one round: ``load(pid, key)`` and
    ``save(pid, key, value)`` with the round and the lineage filled in."""

    def __init__(self, store: StateStore, server_round: int, lineage: Lineage) -> None:
        self.store, self.server_round, self.lineage = store, server_round, lineage

    def load(
        self, pid: int, key: str, check: Callable[[Any], str | None] | None = None
    ) -> Any | None:
        return self.store.load(pid, key, self.server_round, self.lineage, check)

    def save(self, pid: int, key: str, value: Any) -> None:
        self.store.save(pid, key, value, self.server_round, self.lineage)


_STORES: dict[str, StateStore] = {}


def get_store(root: str | Path, cache_items: int = 8) -> StateStore:
    """One store per state directory per process (Ray actors serve many clients)."""
    key = str(Path(root).resolve())
    if key not in _STORES:
        _STORES[key] = StateStore(key, cache_items)
    return _STORES[key]


def client_state_dir(run_dir: Path) -> Path:
    """Where a run's client state goes by default: ``<run dir>/client_state/<state token>/``.
    Each start that is not a resume gets a new token; the folders of the runs it replaced
    are removed (:func:`remove_replaced_client_state`)."""
    return run_dir / "client_state"


def remove_replaced_client_state(run_dir: Path, keep: str) -> list[str]:
    """Delete the token folders under ``run_dir/client_state`` other than ``keep`` (the
    running run's): the client state of runs this run directory held before, which no
    checkpoint refers to any more (a fresh start removes the checkpoint). Returns the names
    removed. Only the default location is cleaned; a ``state-dir`` a SuperNode was started
    with may be shared by several runs and is left alone."""
    root = client_state_dir(run_dir)
    if not root.is_dir():
        return []
    stale = sorted(p for p in root.iterdir() if p.is_dir() and p.name != keep)
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return [p.name for p in stale]


def start_session(token_dir: Path, lineage: Lineage) -> Lineage:
    """Count the session a start begins in ``token_dir/sessions.json`` and return its
    lineage: ``lineage`` (the checkpoint's, for a resume) extended by the sessions that
    resumed from the same checkpoint before and stopped before writing another. Without
    them, this session would reuse the number of the first of them and could read client
    state it saved for the rounds this one redoes (a client that trained there but fails
    here). Each gets the checkpoint round as its resume point: it saved only later rounds,
    none of which belongs to the history."""
    path = token_dir / "sessions.json"
    try:
        started = int(json.loads(path.read_text())["started"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        started = 0
    resumed = lineage.resumed
    if resumed:
        resumed += (resumed[-1],) * max(0, started - len(resumed))
    new = Lineage(resumed, lineage.checkpoint)
    token_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"started": new.session + 1}))
    tmp.replace(path)
    return new
