"""One local training step replayed from a CUDA graph (``client.cuda_graph``).

A small model's step on a GPU is bound by the host launching kernels one by one, not by the
GPU's arithmetic: the P1 CNN's FedAvg step is ≈ 2.6 ms for 94 MFLOP on an H100, and every
extra loss term costs by its number of kernels (docs/results.md, "S2 on CUDA"). A CUDA graph records
the whole step once (forward, loss, backward, gradient clipping, optimiser update, running
metrics) and replays it with one launch.

Contract of the step that is captured (``BaseClient.graph_safe()``): it reads its batch only
through the index tensor it is given, synchronises nothing with the host (no ``.item()``,
no Python branch on a tensor's value, no boolean-mask indexing), allocates its persistent
state (e.g. the optimiser's momentum buffers) in the eager steps before the capture, and
keeps all else fixed for the round (learning rate, frozen models, the server's payload).
A replay then does exactly what the eager step would do with the same kernels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

#: Eager steps before the capture (PyTorch's recipe: lazy initialisation, the optimiser's
#: buffers and cuBLAS/cuDNN workspaces are created outside the graph).
WARMUP_STEPS = 3


#: Set by the first failed capture: a capture that fails can leave PyTorch's CUDA allocator
#: in states it does not clean up ("all kinds of weird states", its CUDAGraph::reset), so
#: this process captures no more graphs (the RNG it leaves in capture mode is mended:
#: :func:`end_rng_capture`).
PROCESS = {"capture_failed": False}

#: One side stream per device for every warm-up and capture of the process. PyTorch keeps a
#: cuBLAS workspace per (handle, stream) for the process's life: a new stream per capture
#: would allocate a fresh one inside each capture, in that graph's private pool, which
#: ``StepGraph.close`` could then never free (up to the 32 pooled streams a device has).
_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The process's warm-up and capture stream on ``device`` (made at first use)."""
    device = torch.device(
        "cuda", torch.cuda.current_device() if device.index is None else device.index
    )
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


def end_rng_capture(device: torch.device) -> None:
    """Takes ``device``'s default CUDA generator out of capture mode after a failed capture,
    at the seed and offset it had. Every capture puts the generator in capture mode and only
    a capture that ends cleanly takes it out (PyTorch's ``CUDAGraph::capture_end``), so after
    a failed one every random draw on the device raised "Offset increment outside graph
    capture encountered unexpectedly" (H200, 2026-11-27): a later client's dropout or
    initialisation on the GPU would fail. The generator gets a fresh state holding the old
    seed and offset, so its sequence goes on where it was."""
    index = torch.cuda.current_device() if device.index is None else device.index
    generator = torch.cuda.default_generators[index]
    fresh = torch.Generator(device=torch.device("cuda", index))
    fresh.set_state(generator.get_state())
    generator.graphsafe_set_state(fresh.graphsafe_get_state())


def graph_applies(
    cuda_graph: bool, graph_safe: bool, adversarial: bool, device: torch.device
) -> bool:
    """Whether a client replays its full-size steps from a CUDA graph: asked for
    (``client.cuda_graph``), on a CUDA device, for a method whose step allows it, without
    adversarial training (PGD draws its random start on the host), and no capture has
    failed in this process."""
    return (
        cuda_graph
        and graph_safe
        and not adversarial
        and device.type == "cuda"
        and not PROCESS["capture_failed"]
    )


class StepGraph:
    """Runs ``step(idx)`` for index tensors of one size: the first ``WARMUP_STEPS`` calls
    eagerly on a side stream, the next one captures the step on its own static index tensor
    and replays it (a capture records without running), every later one copies its indices
    into that tensor and replays; all with ``device`` as the current CUDA device (a client
    on ``cuda:1`` in a process whose current device is 0). A capture that fails is logged,
    the round goes on eagerly (the capture ran nothing, so no step is lost or done twice)
    and the process captures no more graphs (``PROCESS``)."""

    def __init__(self, step: Callable[[torch.Tensor], None], size: int, device: torch.device):
        self._step: Callable[[torch.Tensor], None] | None = step
        self.size, self.device = size, device
        self.static_idx = torch.zeros(size, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.eager_steps = 0
        self.replays = 0

    def step(self, idx: torch.Tensor) -> None:
        """The step itself, eagerly."""
        assert self._step is not None  # only reached through __call__
        self._step(idx)

    def __call__(self, idx: torch.Tensor) -> None:
        if self._step is None:  # before anything runs or is captured
            raise RuntimeError("this StepGraph is closed: its round is over")
        if len(idx) != self.size:
            raise ValueError(f"StepGraph holds batches of {self.size}, got {len(idx)}")
        with torch.cuda.device(self.device):
            self._run(idx)

    def _run(self, idx: torch.Tensor) -> None:
        if self.failed:
            self.step(idx)
            return
        if self.graph is None and self.eager_steps < WARMUP_STEPS:
            self._warmup(idx)
            return
        self.static_idx.copy_(idx)
        if self.graph is None and not self._capture():
            self.step(idx)
            return
        assert self.graph is not None
        self.graph.replay()
        self.replays += 1

    def close(self) -> None:
        """Free the graph and its memory pool now (the counters stay). ``step`` usually
        refers back to the client that holds this object, a cycle that only Python's cyclic
        collector would break; meanwhile each round's graph would keep a step's worth of
        activations on the GPU."""
        self.graph = None
        self._step = None

    def _warmup(self, idx: torch.Tensor) -> None:
        current = torch.cuda.current_stream(self.device)
        side = side_stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self.step(idx)
        current.wait_stream(side)
        self.eager_steps += 1

    def _capture(self) -> bool:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        try:
            # on the warm-up's stream, this device's own (torch's default capture stream is
            # made once, on the device current at its first use), where the warm-up already
            # made cuBLAS's workspace outside the graph
            with torch.cuda.graph(graph, stream=side_stream(self.device)):
                self.step(self.static_idx)
        except Exception as exc:  # any failure: the round goes on with eager steps
            # a failed capture_end skips torch.cuda.graph's stream restore and leaves the
            # RNG in capture mode
            self.failed = PROCESS["capture_failed"] = True
            torch.cuda.set_stream(current)
            try:
                end_rng_capture(self.device)
            except Exception as rng_exc:  # the eager fallback goes on regardless
                log.warning("could not take the CUDA generator out of capture mode (%s)", rng_exc)
            log.warning(
                "CUDA graph capture of the training step failed (%s); training goes on "
                "without CUDA graphs in this process. Set client.cuda_graph=false to skip "
                "the attempt.",
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            return False
        self.graph = graph
        return True
