from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from core.data import load_client_data
from core.models import get_weights
from core.state import StateStore
from fl_app import registry
from fl_app.config import load_config


@pytest.fixture
def make_client(tmp_path) -> Callable[..., Any]:
    """Build a method's client on the tiny digits experiment with a store in tmp_path."""

    def _make(method: str = "fedavg", pid: int = 0, overrides: str = "", store: Any = None):
        cfg = load_config("tiny", method, overrides)
        cls = registry.resolve("client", cfg["client"]["name"])
        store = store or StateStore(tmp_path / "state")
        return cls(cfg, load_client_data(cfg, pid), pid, torch.device("cpu"), store)

    return _make


@pytest.fixture
def global_weights() -> Callable[[Any], list]:
    def _w(client: Any) -> list:
        torch.manual_seed(0)
        return get_weights(client.build_model(client.cfg))

    return _w
