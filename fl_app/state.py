"""Client state that must survive rounds: a store keyed by partition id.

Simulation rebuilds client objects every round and deployment starts a fresh process per
message, so nothing may live on the client object. Model-sized state (MOON's previous models,
PMFL's buffer of local iterates) is written to files under a state directory, one file per
(partition id, key); a small in-memory LRU cache per process avoids re-reading what an actor
just wrote, and bounds memory so that hundreds of simulated clients fit in RAM. A cached
value is used only while its file is the one it was read from or written to (same inode,
modification time and size): several Ray actors share the directory, and a client trained by
another actor since must be read again, never served from this actor's older copy. Files are
written atomically (temp file + rename) and read with ``torch.load(weights_only=True)``,
which never unpickles arbitrary objects.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch


class StateStore:
    """Disk-backed key-value store of tensors (or lists/dicts of tensors) per client."""

    def __init__(self, root: str | Path, cache_items: int = 8) -> None:
        self.root = Path(root)
        self.cache_items = cache_items
        # (pid, key) -> (file stamp, value)
        self._cache: OrderedDict[tuple[int, str], tuple[tuple[int, int, int], Any]] = OrderedDict()

    def _path(self, pid: int, key: str) -> Path:
        return self.root / f"client_{pid}" / f"{key}.pt"

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int, int] | None:
        """Identity of the file's current version (a save replaces the file: new inode)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self, pid: int, key: str) -> Any | None:
        """The value saved for ``(pid, key)`` by any process, or None if the client has none
        yet. Served from the cache only while the file is unchanged since it was cached."""
        ck, path = (pid, key), self._path(pid, key)
        stamp = self._stamp(path)
        if stamp is None:
            self._cache.pop(ck, None)
            return None
        cached = self._cache.get(ck)
        if cached is not None and cached[0] == stamp:
            self._cache.move_to_end(ck)
            return cached[1]
        value = torch.load(path, map_location="cpu", weights_only=True)
        self._remember(ck, stamp, value)
        return value

    def save(self, pid: int, key: str, value: Any) -> None:
        """Persist ``value`` for ``(pid, key)`` atomically and keep it in the cache."""
        path = self._path(pid, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        try:
            torch.save(value, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        stamp = self._stamp(path)
        if stamp is not None:
            self._remember((pid, key), stamp, value)

    def _remember(self, ck: tuple[int, str], stamp: tuple[int, int, int], value: Any) -> None:
        self._cache[ck] = (stamp, value)
        self._cache.move_to_end(ck)
        while len(self._cache) > self.cache_items:
            self._cache.popitem(last=False)


_STORES: dict[str, StateStore] = {}


def get_store(root: str | Path, cache_items: int = 8) -> StateStore:
    """One store per state directory per process (Ray actors serve many clients)."""
    key = str(Path(root).resolve())
    if key not in _STORES:
        _STORES[key] = StateStore(key, cache_items)
    return _STORES[key]
