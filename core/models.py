"""Models with the shared interface of METHODS.md: every forward returns ``ModelOutput``.

- ``levels``: per-stage features, each stage's pre-ReLU output global-average-pooled
  (FedRCL's multi-level loss); for the CNN the last level is the pre-ReLU fc feature.
- ``h``: backbone feature (penultimate, before any projection head).
- ``z``: projection-head output (``h → h → ReLU → projection_dim``) when
  ``projection_dim > 0``, else ``z = h``.
- ``logits``: classifier output, on ``z`` when a head exists (as MOON's code does).

No BatchNorm anywhere: running statistics do not average well in FL.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class ModelOutput(NamedTuple):
    levels: list[torch.Tensor]
    h: torch.Tensor
    z: torch.Tensor
    logits: torch.Tensor


class Head(nn.Module):
    """Optional projection head and the classifier; shared by every backbone."""

    def __init__(self, feature_dim: int, projection_dim: int, num_classes: int) -> None:
        super().__init__()
        self.projection: nn.Module | None = None
        out_dim = feature_dim
        if projection_dim > 0:
            self.projection = nn.Sequential(
                nn.Linear(feature_dim, feature_dim),
                nn.ReLU(inplace=True),
                nn.Linear(feature_dim, projection_dim),
            )
            out_dim = projection_dim
        self.classifier: nn.Module = nn.Linear(out_dim, num_classes)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.projection(h) if self.projection is not None else h
        return z, self.classifier(z)


def orthogonal_rows(rows: int, dim: int, seed: int) -> torch.Tensor:
    """The first ``rows`` rows of the orthogonal factor ``Q`` of the QR decomposition of a
    (dim, dim) standard-normal matrix drawn from ``torch.Generator().manual_seed(seed)``:
    orthonormal rows, float32, on the CPU. The fixed classifier of SphereFed and of FedRANE's
    code (serverFedRANE.py:25-27 of XeniaLLL/HyperFed_and_FedRANE-master:
    ``Q, _ = qr(randn(d, d)); weight = Q[:num_classes]``). Computed in float64 and rounded, so
    every node that derives it from the same seed gets the same float32 values (a CPU's QR
    differs from another's by float64 rounding at most)."""
    if not 1 <= rows <= dim:
        raise ValueError(
            f"a fixed orthogonal classifier needs at most as many classes ({rows}) as feature"
            f" dimensions ({dim}): raise model.feature_dim to at least {rows}"
        )
    gen = torch.Generator(device="cpu").manual_seed(seed)
    normal = torch.randn(dim, dim, generator=gen, dtype=torch.float64, device="cpu")
    q, _ = torch.linalg.qr(normal)
    return q[:rows].to(torch.float32)


class FixedClassifier(nn.Module):
    """``logits = z Wᵀ`` with a fixed ``W`` and no bias (SphereFed / FedRANE's code: the
    predictor's bias is removed, serverFedRANE.py:30, and its weight never trained,
    clientFedRANE.py:40-42). ``W`` is a non-persistent buffer: it is not in the state dict,
    so it never travels and no aggregation (Flower's float32 weighted mean moves identical
    arrays by rounding) or optimiser can change it; every node builds it from the run seed
    (:func:`orthogonal_rows`)."""

    weight: torch.Tensor

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(z, self.weight)


def max_pool2x2(x: torch.Tensor) -> torch.Tensor:
    """2×2 max pooling with stride 2 (floor mode), equal to ``F.max_pool2d(x, 2)``.

    Without autograd (frozen models, evaluation) it is two strided element-wise maxima,
    ≈20× faster on CPU than ``max_pool2d``'s kernel for the CNN's shapes; with autograd it is
    ``F.max_pool2d``, whose backward is the fast one (README, "Benchmarks", S2)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return F.max_pool2d(x, 2)
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    x = torch.maximum(x[..., 0:h:2, :w], x[..., 1:h:2, :w])
    return torch.maximum(x[..., 0::2], x[..., 1::2])


class Backbone(nn.Module):
    """What every model has besides ``forward(x) -> ModelOutput``: the size of ``h``
    (``feature_dim``), the :class:`Head` (projection and classifier) on top of it, and the
    name of each entry of ``ModelOutput.levels`` (``level_names``, in order: FedRCL's
    ``client.levels`` indexes them)."""

    feature_dim: int
    head: Head
    level_names: list[str]


class CNN(Backbone):
    """Small CNN for 28×28 images: [conv k×k → (GroupNorm) → ReLU → maxpool 2] per stage →
    [fc → ReLU] per ``hidden`` width → fc → h.

    With channels (6, 16), kernel 5 and feature_dim 128 this is FedCCL's "4-layer CNN with a
    128-d decision layer": conv5×5(1→6)-pool-conv5×5(6→16)-pool-fc(256→128)=h-fc(128→10).
    With hidden (120,) and feature_dim 84 it is MOON's ``simple-cnn-mnist``
    (``SimpleCNNMNIST_header`` in QinbinLi/MOON model.py): conv6-conv16-fc120-fc84=h.
    Each hidden fc's pre-ReLU output is a level too, like the last fc's.

    ``padding`` pads every conv (3×3 with padding 1 keeps the map size, so four stages fit a
    28×28 image: 28-14-7-3-1). ``norm="group"`` puts GroupNorm(2 groups) after each conv, as
    FedRCL's ResNet-18 has after each of its convs (``norm_groups`` groups; the convs then have
    no bias, which the norm's shift replaces); the stage's level is then the normalised
    pre-ReLU map, pooled, like the ResNet's. The defaults (padding 0, no norm) build the
    same modules and state_dict as before these options existed.
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int = 28,
        num_classes: int = 10,
        channels: tuple[int, ...] = (6, 16),
        kernel_size: int = 5,
        feature_dim: int = 128,
        projection_dim: int = 0,
        hidden: tuple[int, ...] = (),
        padding: int = 0,
        norm: str = "none",
        norm_groups: int = 2,
    ) -> None:
        super().__init__()
        if norm not in ("none", "group"):
            raise ValueError(f"unknown norm {norm!r}; choose none or group")
        grouped = norm == "group"
        convs, norms, size, c_in = [], [], image_size, in_channels
        for stage, c_out in enumerate(channels, 1):
            if grouped and c_out % norm_groups:
                raise ValueError(
                    f"stage {stage} has {c_out} channels, which GroupNorm cannot split into"
                    f" {norm_groups} groups: give model.channels multiples of {norm_groups}"
                )
            convs.append(nn.Conv2d(c_in, c_out, kernel_size, padding=padding, bias=not grouped))
            if grouped:
                norms.append(nn.GroupNorm(norm_groups, c_out))
            size = (size + 2 * padding - kernel_size + 1) // 2
            c_in = c_out
            if size < 1:
                raise ValueError(
                    f"{image_size}×{image_size} images leave no feature map after stage"
                    f" {stage} of model.channels {list(channels)} with model.kernel_size"
                    f" {kernel_size} and model.padding {padding} (each stage: conv k×k, then"
                    " pool 2): use fewer stages, a smaller kernel or more padding"
                )
        self.convs = nn.ModuleList(convs)
        # None without norm: no module, so the state_dict of a CNN without norm is unchanged
        self.norms = nn.ModuleList(norms) if grouped else None
        widths = [c_in * size * size, *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.fc = nn.Linear(widths[-1], feature_dim)
        self.head = Head(feature_dim, projection_dim, num_classes)
        self.feature_dim = feature_dim
        self.level_names = [
            *(f"conv{i}" for i in range(1, len(channels) + 1)),
            *(f"fc{i}" for i in range(1, len(hidden) + 1)),
            "fc",
        ]

    def forward(self, x: torch.Tensor) -> ModelOutput:
        levels = []
        norms = self.norms if self.norms is not None else [None] * len(self.convs)
        for conv, norm in zip(self.convs, norms, strict=True):
            x = conv(x)
            if norm is not None:
                x = norm(x)
            levels.append(x.mean(dim=(2, 3)))
            x = max_pool2x2(F.relu(x))
        x = x.flatten(1)
        for fc in self.hidden:
            x = fc(x)
            levels.append(x)
            x = F.relu(x)
        pre = self.fc(x)
        levels.append(pre)
        h = F.relu(pre)
        z, logits = self.head(h)
        return ModelOutput(levels, h, z, logits)


class BasicBlock(nn.Module):
    """ResNet basic block with GroupNorm(2, C); returns the pre-ReLU sum."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(2, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(2, c_out)
        self.short: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.short = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.GroupNorm(2, c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.n1(self.conv1(x)))
        return self.n2(self.conv2(out)) + self.short(x)


class ResNet18GN(Backbone):
    """ResNet-18 with GroupNorm(2 groups) and a CIFAR stem (3×3 conv, no max-pool), as FedRCL.

    Levels: the stem and the four stages, each pre-ReLU and average-pooled (64/64/128/256/512).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, projection_dim: int = 0):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.stem_norm = nn.GroupNorm(2, 64)
        stages, c_in = [], 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.ModuleList([BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)])
            )
            c_in = c_out
        self.stages = nn.ModuleList(stages)
        self.head = Head(512, projection_dim, num_classes)
        self.feature_dim = 512
        self.level_names = ["stem", "layer1", "layer2", "layer3", "layer4"]

    def forward(self, x: torch.Tensor) -> ModelOutput:
        x = self.stem_norm(self.stem(x))
        levels = [x.mean(dim=(2, 3))]
        for stage in self.stages:
            for block in stage.children():
                x = block(F.relu(x))
            levels.append(x.mean(dim=(2, 3)))
        h = F.relu(x).mean(dim=(2, 3))
        z, logits = self.head(h)
        return ModelOutput(levels, h, z, logits)


def build_model(cfg: dict[str, Any]) -> Backbone:
    """The model named by ``cfg['model']`` for the dataset in ``cfg['data']``."""
    m, d = cfg["model"], cfg["data"]
    if m["name"] == "cnn":
        return CNN(
            in_channels=d["channels"],
            image_size=d["image_size"],
            num_classes=d["num_classes"],
            channels=tuple(m["channels"]),
            kernel_size=m["kernel_size"],
            feature_dim=m["feature_dim"],
            projection_dim=m["projection_dim"],
            hidden=tuple(m.get("hidden", ())),
            padding=m.get("padding", 0),
            norm=m.get("norm", "none"),
        )
    if m["name"] == "resnet18_gn":
        return ResNet18GN(d["channels"], d["num_classes"], m["projection_dim"])
    raise ValueError(f"unknown model.name {m['name']!r}; choose cnn or resnet18_gn")


def get_weights(model: nn.Module) -> list:
    """The model's state as a list of C-contiguous numpy arrays (state_dict order; a
    channels-last weight is copied into the standard order, so what is sent and saved does not
    depend on the memory layout)."""
    return [np.ascontiguousarray(t.detach().cpu().numpy()) for t in model.state_dict().values()]


def set_weights(model: nn.Module, arrays: list) -> None:
    """Load a list of numpy arrays (state_dict order) into ``model``; shapes must match."""
    keys = list(model.state_dict().keys())
    if len(keys) != len(arrays):
        raise ValueError(f"expected {len(keys)} arrays, got {len(arrays)}")
    state = {k: torch.as_tensor(a) for k, a in zip(keys, arrays, strict=True)}
    model.load_state_dict(state, strict=True)
