"""The one client training loop every method shares (FedAvg when used as is).

A method subclasses :class:`BaseClient` and overrides small hooks:

- ``Params``: a frozen dataclass of the method's hyperparameters (read from ``client.*``);
- ``build_model(cfg)``: the model (e.g. with a projection head or an LRA module);
- ``setup_round(config)``: before local training (load state, read server payloads);
- ``loss(x, y, out)``: the local objective of one batch (default: cross-entropy);
- ``before_update()``: after a step's gradients, before the optimiser changes the weights
  (PMFL pushes the iterate the step started from);
- ``finish_round()``: after local training; returns extra metrics (numbers, or numpy arrays
  that travel to the server as named arrays, e.g. FedCCL's local signals).

Client objects are rebuilt for every message, so state across rounds goes through
``self.store`` (disk-backed, keyed by partition id; in a run, the round's view of it, which
reads the newest state of the run's history before this round).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from flwr.client import NumPyClient
from torch import nn
from torch.func import functional_call, vmap

from clients.adversarial import pgd_attack
from clients.step_graph import StepGraph, graph_applies
from core.data import ClientData, TensorSplit
from core.models import ModelOutput, build_model, get_weights, set_weights
from core.params import Config, params_from
from core.state import RoundState, StateStore
from core.training import batch_indices, evaluate_model

# Frozen forwards are vmapped (one batched call) on CUDA from 3 models, to save kernel
# launches; on CPU a plain loop is faster. bench/frozen_stack.py, batch 64: on an H100 vmap is
# 1.4-3.5x faster from 3 models (P1 CNN and ResNet-18), at 2 models 0.94x or 1.35x (two runs);
# on one CPU thread the loop wins at every size (P1 CNN, 6 models: 8.7 vs 9.6 ms).
VMAP_MIN_MODELS = 3
#: The state-store key of a node's optimizer state (``client.keep_optimizer_state``).
OPTIMIZER_STATE_KEY = "optimizer_state"


class FrozenStack:
    """Several frozen models of one architecture (e.g. MOON's global and previous models,
    PMFL's buffer of iterates), stacked and evaluated in one vmapped forward pass instead of
    one Python-level forward per model. Slots can be overwritten in place (a ring buffer)."""

    def __init__(
        self, module: nn.Module, states: list[dict[str, torch.Tensor]], device: torch.device
    ) -> None:
        self.module = module  # architecture only: its own weights are never used here
        names = list(module.state_dict())
        self.params = (
            {n: torch.stack([st[n].detach().to(device) for st in states]) for n in names}
            if states
            else {}
        )

    def __len__(self) -> int:
        return next(iter(self.params.values())).shape[0] if self.params else 0

    @torch.no_grad()
    def z(self, x: torch.Tensor, vmapped: bool | None = None) -> torch.Tensor:
        """Projections ``z`` of every stacked model on ``x``: shape (M, B, d). ``vmapped``
        evaluates all models in one vmapped call instead of a loop (same result); default:
        on CUDA from ``VMAP_MIN_MODELS`` models."""

        def one(params: dict[str, torch.Tensor], inp: torch.Tensor) -> torch.Tensor:
            return functional_call(self.module, params, (inp,)).z

        if vmapped is None:
            vmapped = x.device.type == "cuda" and len(self) >= VMAP_MIN_MODELS
        if vmapped:
            return vmap(one, in_dims=(0, None))(self.params, x)
        return torch.stack(
            [one({n: v[i] for n, v in self.params.items()}, x) for i in range(len(self))]
        )

    @torch.no_grad()
    def write(self, slot: int | torch.Tensor, module: nn.Module) -> None:
        """Copy ``module``'s current weights into ``slot``: an ``int``, or a one-element
        long tensor on the stack's device (chosen on the device, e.g. in a CUDA graph)."""
        if isinstance(slot, torch.Tensor):
            for name, value in module.state_dict().items():
                self.params[name].index_copy_(0, slot.view(1), value.detach()[None])
            return
        for name, value in module.state_dict().items():
            self.params[name][slot].copy_(value)

    @torch.no_grad()
    def append(self, module: nn.Module) -> None:
        """Add a slot holding ``module``'s current weights."""
        state = module.state_dict()
        if not self.params:
            self.params = {n: v.detach().clone()[None] for n, v in state.items()}
        else:
            self.params = {
                n: torch.cat([self.params[n], state[n].detach()[None]]) for n in self.params
            }

    def states(self, slots: list[int] | None = None) -> list[dict[str, torch.Tensor]]:
        """CPU state dicts of the given slots (default: all), for the state store."""
        order = range(len(self)) if slots is None else slots
        return [
            {n: v[i].detach().to("cpu", copy=True) for n, v in self.params.items()} for i in order
        ]


def tensor_problem(t: Any, ref: torch.Tensor, where: str) -> str | None:
    """Why ``t`` (read from the state store) cannot stand in for ``ref`` (not a tensor of its
    shape and dtype, or a floating tensor holding NaN or Inf), naming it ``where``; or None."""
    if not isinstance(t, torch.Tensor) or t.shape != ref.shape or t.dtype != ref.dtype:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t)
        return f"{where} is {got}, expected {tuple(ref.shape)} {ref.dtype}"
    if t.is_floating_point() and not torch.isfinite(t).all():
        return f"{where} holds NaN or Inf"
    return None


def states_problem(value: Any, reference: dict[str, torch.Tensor]) -> str | None:
    """Why ``value`` (read from the state store) is not a list of model states like
    ``reference`` (the same names, shapes and dtypes, finite values), or None."""
    if not isinstance(value, list):
        return f"expected a list of model states, found {type(value).__name__}"
    for i, state in enumerate(value):
        if not isinstance(state, dict) or set(state) != set(reference):
            return f"entry {i} is not a state dict of this model (another model or version?)"
        for name, ref in reference.items():
            if problem := tensor_problem(state[name], ref, f"entry {i}: {name}"):
                return problem
    return None


def optimizer_state_problem(value: Any, params: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``value`` (read from the state store) is not an optimizer state of a model with
    the parameters ``params`` (per parameter name, a dict of tensors of that parameter's
    shape and dtype, finite), or None. Parameters that took no step have no entry."""
    if not isinstance(value, dict):
        return f"expected a dict of per-parameter states, found {type(value).__name__}"
    for name, state in value.items():
        if name not in params:
            return f"{name!r} is not a parameter of this model (another model or version?)"
        if not isinstance(state, dict):
            return f"{name}: expected a dict of tensors, found {type(state).__name__}"
        for key, t in state.items():
            if problem := tensor_problem(t, params[name], f"{name}.{key}"):
                return problem
    return None


@dataclasses.dataclass(frozen=True)
class NoParams:
    """FedAvg has no method hyperparameters."""


class BaseClient(NumPyClient):
    """FedAvg client: local SGD on cross-entropy; hooks for every other method."""

    Params: ClassVar[type] = NoParams
    #: The payload exchange this client brings (a key of ``fl_app.registry.EXCHANGES``, e.g.
    #: FedCCL's "signals"; ``None``: it sends and receives the model only). The ServerApp
    #: gives it to whichever aggregator ``server.name`` names (``strategies/exchange.py``).
    exchange: ClassVar[str | None] = None
    #: Whether the client keeps state in files between rounds (``self.store``): on a Ray
    #: cluster the run directory must then be shared by every node (``fl_app.cluster``).
    KEEPS_STATE: ClassVar[bool] = False

    @classmethod
    def keeps_state(cls, cfg: Config) -> bool:
        """Whether this client, run with ``cfg``, keeps state in files between rounds: its
        method's own (``KEEPS_STATE``) or its optimizer's (``client.keep_optimizer_state``)."""
        return cls.KEEPS_STATE or bool(cfg["client"]["keep_optimizer_state"])

    def __init__(
        self,
        cfg: Config,
        data: ClientData,
        pid: int,
        device: torch.device,
        store: StateStore | RoundState | None = None,
    ) -> None:
        self.cfg, self.data, self.pid, self.device, self.store = cfg, data, pid, device, store
        self.hp = params_from(self.Params, cfg["client"])
        self.model = self.build_model(cfg).to(device)
        if cfg["client"]["channels_last"]:  # 4-D weights (convolutions) in NHWC order
            self.model = self.model.to(memory_format=torch.channels_last)
        self.round = 0
        self.step_graph: StepGraph | None = None  # this round's, when graphed()

    # ------------------------------------------------------------------ hooks
    @classmethod
    def build_model(cls, cfg: Config) -> nn.Module:
        """The model this method trains (the server builds the same one)."""
        return build_model(cfg)

    @classmethod
    def model_problem(cls, cfg: Config, model: nn.Module) -> str | None:
        """Why this method's hyperparameters in ``cfg`` cannot work with ``model`` (built by
        :meth:`build_model`, possibly on the meta device: shapes only), or None. Checked
        when the config is loaded (``fl_app.config.validate``)."""
        return None

    def setup_round(self, config: dict[str, Any]) -> None:
        """Called after the global weights are loaded, before local training."""

    def loss(self, x: torch.Tensor, y: torch.Tensor, out: ModelOutput) -> torch.Tensor:
        """The local objective of one batch; FedAvg: cross-entropy."""
        return F.cross_entropy(out.logits, y)

    def before_update(self) -> None:
        """Called once per step after ``loss.backward()`` (and gradient clipping), before
        ``opt.step()``: ``self.model`` still holds the weights the step's loss was computed
        with."""

    def finish_round(self) -> dict[str, Any]:
        """Called after local training; returns extra metrics or payload arrays."""
        return {}

    def graph_safe(self) -> bool:
        """Whether this client's step (``loss`` and ``before_update`` included) synchronises
        nothing with the host and keeps its Python state fixed within a round, so that on
        CUDA its full-size steps can replay one CUDA graph (``client.cuda_graph``; contract
        in ``clients/step_graph.py``). A method whose step branches on a tensor's value or
        changes state per step returns False."""
        return True

    def graphed(self) -> bool:
        """Whether this round's full-size steps replay a CUDA graph (``graph_applies`` to
        this client's config, method and device)."""
        c = self.cfg["client"]
        return graph_applies(c["cuda_graph"], self.graph_safe(), c["adversarial"], self.device)

    # ----------------------------------------------------------- NumPyClient API
    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        return get_weights(self.model)

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """Train locally from the global weights; return new weights, #examples, metrics."""
        set_weights(self.model, parameters)
        self.round = int(config.get("server-round", 1))
        self.setup_round(config)
        t0 = time.perf_counter()
        metrics = self.train_local()
        metrics["fit_seconds"] = time.perf_counter() - t0
        if self.cfg["client"]["personalized_eval"] and len(self.data.test):
            loss, acc = self.test(self.data.test)
            metrics["personal_loss"], metrics["personal_accuracy"] = loss, acc
        metrics.update(self.finish_round())
        return get_weights(self.model), len(self.data.train), metrics

    def evaluate(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        """Evaluate the given (global) weights on the local test split."""
        set_weights(self.model, parameters)
        loss, acc = self.test(self.data.test)
        return loss, len(self.data.test), {"accuracy": acc, "loss": loss}

    # ------------------------------------------------------------- the loop
    def lr(self) -> float:
        c = self.cfg["client"]
        return c["lr"] * c["lr_decay"] ** (self.round - 1)

    def make_optimizer(self) -> torch.optim.Optimizer:
        c = self.cfg["client"]
        return torch.optim.SGD(
            self.model.parameters(),
            lr=self.lr(),
            momentum=c["momentum"],
            weight_decay=c["weight_decay"],
        )

    def generator(self) -> torch.Generator:
        """Seeded by (run seed, round, partition id): the same run gives the same batches."""
        seed = (self.cfg["seed"] * 1_000_003 + self.round * 10_007 + self.pid) % (2**63)
        torch.manual_seed(seed)
        return torch.Generator().manual_seed(seed)

    def train_local(self) -> dict[str, Any]:
        """Run the local optimisation; returns train loss/accuracy and the step count.

        With ``client.adversarial`` each batch is replaced by its PGD examples before the
        forward pass (so ``loss`` and the reported train accuracy see them).

        The split and the round's batch indices move to the device once per round and the
        running loss/accuracy stay there, so a GPU step never waits for the host; a
        non-finite loss is detected once, at the end (any NaN/Inf makes the sum non-finite),
        and fails the round before anything is saved or sent, as do non-finite weights after
        the last step (whose update no loss has seen). On CUDA, full-size steps replay
        one CUDA graph when :meth:`graphed` (``clients/step_graph.py``); other steps (the
        warm-up, an epoch's last, smaller batch) run eagerly on the same model and optimiser."""
        c = self.cfg["client"]
        train = self.data.train
        batches = batch_indices(
            len(train), c["batch_size"], self.generator(), c["epochs"], c["steps"], c["drop_last"]
        )
        opt = self.make_optimizer()
        self.load_optimizer_state(opt)
        self.model.train()
        total_loss = torch.zeros((), device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        x_all = train.x.to(self.device, non_blocking=True)
        if c["channels_last"] and x_all.dim() == 4:  # images in NHWC order, as the weights
            x_all = x_all.contiguous(memory_format=torch.channels_last)
        y_all = train.y.to(self.device, non_blocking=True)

        def step(idx: torch.Tensor) -> None:
            self.train_step(x_all[idx], y_all[idx], opt, total_loss, correct)

        graph = StepGraph(step, c["batch_size"], self.device) if self.graphed() else None
        self.step_graph = graph
        sizes = [len(b) for b in batches]
        try:
            if batches:
                for idx in torch.cat(batches).to(self.device, non_blocking=True).split(sizes):
                    (graph if graph is not None and len(idx) == graph.size else step)(idx)
        finally:
            if graph is not None:
                opt.zero_grad(set_to_none=True)  # the graph's gradient tensors go with it
                graph.close()
        seen = sum(sizes)
        if not torch.isfinite(total_loss):
            raise FloatingPointError(
                f"client {self.pid}: non-finite loss in round {self.round}; lower client.lr"
            )
        if not torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all():
            raise FloatingPointError(  # each loss precedes its step: the last step's is unseen
                f"client {self.pid}: non-finite weights after the last step of round "
                f"{self.round} (its loss was finite); lower client.lr or set client.grad_clip"
            )
        self.save_optimizer_state(opt)
        return {
            "train_loss": total_loss.item() / max(seen, 1),
            "train_accuracy": correct.item() / max(seen, 1),
            "steps": len(batches),
        }

    def train_step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        opt: torch.optim.Optimizer,
        total_loss: torch.Tensor,
        correct: torch.Tensor,
    ) -> None:
        """One local step on the batch ``(x, y)``; adds the batch's summed loss and its
        number of correct predictions to ``total_loss`` and ``correct`` in place (on the
        device: no host sync, so the step can be captured in a CUDA graph)."""
        c = self.cfg["client"]
        if c["adversarial"]:  # FedAvg+ / FedCCL+: every term of the loss sees PGD inputs
            x = pgd_attack(self.model, x, y, c["adv_eps"], c["adv_alpha"], c["adv_steps"])
        with self.autocast():
            out = self.model(x)
            loss = self.loss(x, y, out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if c["grad_clip"]:
            nn.utils.clip_grad_norm_(self.model.parameters(), c["grad_clip"])
        self.before_update()
        opt.step()
        total_loss += loss.detach() * len(y)
        correct += (out.logits.detach().argmax(1) == y).sum()

    def autocast(self) -> torch.autocast:
        """The context of a step's forward pass and loss: with ``client.precision=bf16``,
        autocast to bfloat16 on this client's device (matmuls and convolutions in bf16;
        weights, gradients and the optimiser stay fp32, and the losses of clients/losses.py
        and LRA switch autocast off and compute in fp32); with ``fp32`` (the default) it does
        nothing. Its weight cache is off, as a CUDA graph's capture requires."""
        bf16 = self.cfg["client"]["precision"] == "bf16"
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False
        )

    def test(self, split: TensorSplit) -> tuple[float, float]:
        return evaluate_model(self.model, split, self.cfg["evaluation"]["batch_size"], self.device)

    # ----------------------------------------------------------- helpers
    def load_states(self, key: str) -> list[dict[str, torch.Tensor]]:
        """The model states this node saved under ``key`` (the newest version of the run's
        history before this round that :func:`states_problem` accepts; a version it refuses,
        or cannot read, is skipped with a warning), or [] without a store or a version."""
        if self.store is None:
            return []
        reference = self.model.state_dict()
        found = self.store.load(self.pid, key, check=lambda v: states_problem(v, reference))
        return found or []

    def load_optimizer_state(self, opt: torch.optim.Optimizer) -> None:
        """With ``client.keep_optimizer_state``: give ``opt`` back the per-parameter state
        this node's optimizer ended its last round with (SGD's momentum buffers), as a
        client object kept for the whole run does (PFLlib's, e.g. FedRANE's released code);
        the learning rate stays this round's. Nothing in a node's first round, without a
        store, or from a saved state :func:`optimizer_state_problem` refuses (skipped with a
        warning, as every stored state)."""
        if not self.cfg["client"]["keep_optimizer_state"] or self.store is None:
            return
        params = dict(self.model.named_parameters())
        found = self.store.load(
            self.pid, OPTIMIZER_STATE_KEY, check=lambda v: optimizer_state_problem(v, params)
        )
        for name, state in (found or {}).items():
            opt.state[params[name]] = {k: t.to(self.device).clone() for k, t in state.items()}

    def save_optimizer_state(self, opt: torch.optim.Optimizer) -> None:
        """With ``client.keep_optimizer_state``: save ``opt``'s per-parameter state (its
        tensors, on the CPU) for this node's next round; nothing if no step made any (a
        node without a full batch under ``client.drop_last`` keeps its older state)."""
        if not self.cfg["client"]["keep_optimizer_state"] or self.store is None:
            return
        names: dict[torch.Tensor, str] = {p: n for n, p in self.model.named_parameters()}
        state = {
            names[p]: {
                k: v.detach().to("cpu", copy=True)
                for k, v in st.items()
                if isinstance(v, torch.Tensor)
            }
            for p, st in opt.state.items()
            if st
        }
        if state:
            self.store.save(self.pid, OPTIMIZER_STATE_KEY, state)

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        """A detached CPU copy of the current weights (for the state store)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
