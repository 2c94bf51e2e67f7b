"""A CPU stand-in for :class:`clients.step_graph.StepGraph` that checks a step's CUDA-graph
contract without a GPU (CI has none).

A CUDA graph records the kernels of one step, with the tensors they read and write and their
non-tensor arguments, and replays exactly those. A step is graph-safe if, called again on the
same static index tensor, it issues the same operators on the same persistent tensors with the
same arguments, and never asks the host for a tensor's value. :class:`TracedStepGraph`
dispatches like ``StepGraph`` (eager warm-up, then "capture" and "replays" on one static
index tensor) but runs every call eagerly under :class:`StepTrace`, which records each
operator (``TorchDispatchMode``):

- a host synchronisation (``.item()``, ``bool(t)``, boolean-mask indexing, ``nonzero``, a
  linalg call that checks its result on the host, ...) is a violation;
- a tensor argument the step did not create is *external* (the model's weights, optimiser
  buffers, frozen models, the server's payload, the index tensor): it enters the trace with
  its storage address, shape and strides; a tensor the step created enters with its shape and
  dtype only (a graph allocates those from its own pool);
- any other argument (a Python number, a shape, a dtype) enters with its value;
- the step runs with ``meta`` as the default device, so a tensor it makes without a device
  or from Python data (on a GPU: made on the host and copied over) fails it.

Every replay's trace must equal the capture's: a Python-side value that changes per step (a
ring-buffer slot as an ``int``, a decaying learning rate) or a fresh host tensor changes the
trace, and would be replayed stale by a real graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from clients.step_graph import WARMUP_STEPS

aten = torch.ops.aten

#: Operators that make the host wait for the device on CUDA (or, for the linalg checks and
#: data-dependent shapes, need a value on the host); none may run inside a CUDA graph.
SYNC_OPS = {
    aten._local_scalar_dense.default,  # .item(), float(t), bool(t), int(t)
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
    aten._linalg_check_errors.default,  # torch.linalg.cholesky / inv's info check
    aten._linalg_eigh.default,  # eigh and svd check their result inside the kernel
    aten._linalg_svd.default,
}

#: Tensor methods that hand a tensor's values to Python without an aten operator (so the
#: dispatch mode cannot see them); patched while a step is traced.
_HOST_METHODS = ("tolist", "numpy", "__array__")


def _is_bool_index(func: Any, args: tuple) -> bool:
    """``t[mask]`` / ``t[mask] = v`` with a boolean mask: the result's shape needs the mask's
    count on the host."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class StepTrace(TorchDispatchMode):
    """Records the operators of one step (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[tuple] = []
        self.syncs: list[str] = []
        self._created: set[int] = set()
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> StepTrace:
        for name in _HOST_METHODS:
            original = self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._recording(name, original))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)

    def _recording(self, name: str, original: Any) -> Any:
        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.syncs.append(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)

        return method

    def _signature(self, arg: Any) -> Any:
        if isinstance(arg, torch.Tensor):
            if _ptr(arg) in self._created:
                return ("new", tuple(arg.shape), arg.dtype)
            return ("ext", _ptr(arg), tuple(arg.shape), arg.stride(), arg.storage_offset())
        if isinstance(arg, float):
            return repr(arg)  # NaN equals itself
        if isinstance(arg, int | bool | str | None | torch.dtype | torch.device):
            return arg
        if isinstance(arg, torch.layout | torch.memory_format):
            return str(arg)
        return type(arg).__name__

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNC_OPS or _is_bool_index(func, args):
            self.syncs.append(str(func))
        flat, _ = tree_flatten((args, kwargs))
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default) or any(
            isinstance(a, torch.Tensor) and a.is_meta for a in flat
        ):  # made in the step from Python data, or without a device: see TracedStepGraph
            self.syncs.append(f"{func}: a tensor made on the host")
        inputs = {_ptr(a) for a in flat if isinstance(a, torch.Tensor)}
        self.trace.append((str(func), tuple(self._signature(a) for a in flat)))
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _ptr(t) not in inputs:
                self._created.add(_ptr(t))
        return out


def first_difference(a: list[tuple], b: list[tuple]) -> str:
    """Where two traces part (for the assertion message)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"operator {i}: {x[0]} {x[1]} vs {y[0]} {y[1]}"
    return f"lengths {len(a)} vs {len(b)}"


class TracedStepGraph:
    """Drop-in for ``StepGraph`` in ``clients.base`` (monkeypatched) that runs on the CPU and
    checks the contract: no host sync in any full-size step, and every "replay" (a call after
    the capture) issues the capture's trace. Violations are collected in ``errors`` (the
    round runs to its end)."""

    instances: ClassVar[list[TracedStepGraph]] = []  # every one built, for the test to read

    def __init__(self, step: Callable[[torch.Tensor], None], size: int, device: torch.device):
        self.step, self.size = step, size
        self.static_idx = torch.zeros(size, dtype=torch.long, device=device)
        self.calls = 0
        self.captured: list[tuple] | None = None
        self.replays = 0
        self.errors: list[str] = []
        TracedStepGraph.instances.append(self)

    def __call__(self, idx: torch.Tensor) -> None:
        self.calls += 1
        if self.calls <= WARMUP_STEPS:
            self.step(idx)
            return
        self.static_idx.copy_(idx)
        # a tensor the step makes without a device (the host's, on a GPU too: e.g. PGD's
        # random start) or from Python data becomes a meta tensor here, and fails the step
        try:
            with torch.device("meta"), StepTrace() as tracer:
                self.step(self.static_idx)
        except (NotImplementedError, RuntimeError) as err:
            if "meta" not in str(err):
                raise
            self.errors.append(f"call {self.calls}: a tensor made on the host ({err})")
            self.step(self.static_idx)  # the round goes on (its result no longer matters)
            return
        if tracer.syncs:
            self.errors.append(f"call {self.calls}: host syncs {sorted(set(tracer.syncs))}")
        if self.captured is None:
            self.captured = tracer.trace
        elif tracer.trace != self.captured:
            self.errors.append(
                f"call {self.calls} differs from the capture: "
                + first_difference(self.captured, tracer.trace)
            )
        else:
            self.replays += 1

    def close(self) -> None:
        pass
