"""Run the authors' code on our data: the "theirs" side of ``bench/parity.py``.

Started by ``parity.py`` as its own process, one run (one method, one seed) each::

    .venv/bin/python bench/parity_theirs.py --family moon --theirs /path/to/QinbinLi/MOON \\
        --experiment regime_moon --method moon --seed 0 --set "num_rounds=30 ..." \\
        --workdir DIR --out-json DIR/accuracy.json -- <their command-line arguments>

Their files are not edited: their modules are imported from ``--theirs`` and a few of their
functions are replaced in memory before their ``main.py`` runs (``runpy``, as
``__main__``), with exactly what running it on our data needs. docs/parity.md lists every
replacement; in short:

- MOON (QinbinLi/MOON): ``utils.partition_data`` returns the partition of our partition file
  (the config's ``data.partition_file``) and ``utils.get_dataloader`` builds their loaders
  (their flags: train ``shuffle=True, drop_last=True``, test ``shuffle=False``) over our
  standardised Fashion-MNIST tensors (their code has no Fashion-MNIST branch);
  ``torch.Tensor.cuda`` and ``torch.nn.Module.cuda`` return the object unchanged and
  ``utils.compute_accuracy`` is called with ``device="cpu"`` (their CPU branch), so that
  their CUDA-only code runs on the CPU.
- FedAU (IBM/fedau): ``dataset.dataset.load_data`` returns our standardised tensors,
  ``util.util.data_participation_each_node`` our partition and our participation
  probabilities (``core.participation``, the ones our server draws from: same seed, same
  label counts), and ``model.cnn_mnist.ModelCNNMnist`` is our model of the experiment
  (their Fashion-MNIST CNN is another network). Their ``-gpu 0`` option runs it on the CPU.
- FedRCL (skynbe/FedRCL): ``datasets.build.build_datasets`` returns our standardised
  Fashion-MNIST (no augmentation, as our clients), ``get_dataset`` (as bound in
  ``trainers.base_trainer``) our partition, ``models.build.build_encoder`` our model of the
  experiment behind their output contract (``layer0..`` = our levels, pre-ReLU and pooled
  as their ``no_relu`` features, and ``logit``), and ``Trainer.evaluate`` is wrapped to
  record each round's accuracy. ``wandb``, ``netcal`` and ``umap`` are stubbed (imported,
  unused with ``wandb=False``); ``torch.multiprocessing.set_start_method`` is a no-op (their
  queue manager process forks instead of re-running their main without the replacements).
  It needs hydra-core, omegaconf 2.3, hydra-colorlog, coloredlogs, torchmetrics, tabulate,
  torchinfo and imageio (``--their-deps DIR``: a ``pip install --target DIR`` of them).
  CPU: ``use_amp=False multiprocessing=False``.
- FedRANE (XeniaLLL/HyperFed_and_FedRANE-master, ``system/main.py -algo FedRANE``): their
  code does not run as released, so the modules it imports but does not have are put in
  ``sys.modules``: ``flcore.clients.clientSphereG`` exposing their ``ClientFedRANE`` under
  the name their FedRANE server imports, and empty stand-ins for ``clientSphereGAug`` and
  ``clientavg`` (other algorithms' clients) and for packages imported but unused on the
  FedRANE path (``wandb``, ``h5py``, ``ujson``, ``geoopt``, ``openTSNE``, ``umap``,
  ``torch_scatter``, ``calmsize``, ``opacus``). ``torch.cuda.set_device`` (called when their
  main.py is imported) does nothing; their argument parser gains ``multi_task_method=Nash``
  (GNE), which their server reads but only a wandb sweep ever sets. Data: our partition
  and our clients' local train/test splits are written in the layout their loader reads
  (``<workdir>/dataset/fmnist/{train,test}/<k>.npz``, ``global_test``); none of their data
  functions is replaced. It needs ``cvxpy`` and ``ecos`` (``--their-deps``).
  Diagnostic, not a parity run (our config's ``client.mixup_on=classifier``, which
  ``parity.py --mixup-on-logits`` sets): their client's cross-entropy puts the mixed
  features through the client's classifier first (:class:`MixupOnLogits`), as their own
  ``train_mixup`` does; everything else as above.

The test accuracy of the global model after every round goes to ``--out-json`` as
``{"accuracy": [round 1, round 2, ...]}`` (fractions), read from their own output (MOON's
log lines ``>> Global Model Test accuracy``, FedAU's results CSV, FedRCL's ``Trainer.evaluate``,
FedRANE's printed ``Global test2 acc``: their whole global test set, evaluated before each
round's training, so round r's value is printed at the start of round r + 1; the run stops
once round R's is printed, instead of training a round nobody reads).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.abc
import importlib.util
import io
import json
import os
import re
import resource
import runpy
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from core.data import label_counts, load_dataset, local_split, partitions_of, to_tensors
from core.models import build_model
from core.params import Config
from core.participation import participation_of
from core.training import limit_threads
from fl_app.config import load_config
from strategies.gne import gram_weights

FAMILIES = ("moon", "fedau", "fedrcl", "fedrane")
MOON_ACCURACY = re.compile(r">> Global Model Test accuracy: ([0-9.]+)")


class OurData:
    """The run's data as our clients see it: the training set (``data.train_subset``
    applied), its partition read from ``data.partition_file`` (checked against the
    config), and the global test set, standardised as our clients standardise them."""

    def __init__(self, cfg: Config) -> None:
        d = cfg["data"]
        if d["domain"] != "none":
            raise SystemExit("parity runs use data.domain=none (their code has no domains)")
        if not d.get("partition_file") or not Path(d["partition_file"]).is_file():
            raise SystemExit(f"no partition file {d.get('partition_file')!r}: parity.py writes it")
        train, test = load_dataset(d, cfg["seed"])
        self.train_raw, self.test_raw = train, test
        self.train, self.test = to_tensors(train, d["dataset"]), to_tensors(test, d["dataset"])
        self.parts = partitions_of(d, cfg["num_clients"], cfg["seed"], save=False)
        # what each client trains on: its partition less its local test split (none at
        # data.test_fraction = 0, the parity settings), as core.data.load_client_data
        splits = [
            local_split(p, d["test_fraction"], cfg["seed"] + pid)
            for pid, p in enumerate(self.parts)
        ]
        self.local = [train for train, _ in splits]
        self.local_test = [test for _, test in splits]


# ----------------------------------------------------------------------------- MOON
def patch_moon(data: OurData, init: dict[str, torch.Tensor] | None = None) -> None:
    """Replace what QinbinLi/MOON needs to run on our data and on the CPU (docs/parity.md);
    with ``init`` (the diagnostic ``--same-init``, not a parity run) also their model class,
    whose every instance then loads these weights (ours, in state-dict order) after its own
    initialisation."""
    utils: Any = importlib.import_module("utils")  # theirs: --theirs is first on sys.path
    original_accuracy = utils.compute_accuracy

    def partition_data(
        dataset: str, datadir: str, logdir: str, partition: str, n_parties: int, beta: float = 0.4
    ) -> tuple[Any, ...]:
        if n_parties != len(data.local):
            raise SystemExit(f"--n_parties {n_parties}, the partition file has {len(data.local)}")
        y_train, y_test = data.train_raw.y, data.test_raw.y
        net_dataidx_map = {i: data.local[i] for i in range(n_parties)}
        counts = utils.record_net_data_stats(y_train, net_dataidx_map, logdir)
        return data.train_raw.x, y_train, data.test_raw.x, y_test, net_dataidx_map, counts

    def get_dataloader(
        dataset: str,
        datadir: str,
        train_bs: int,
        test_bs: int,
        dataidxs: Any = None,
        noise_level: float = 0,
    ) -> tuple[DataLoader, DataLoader, TensorDataset, TensorDataset]:
        x, y = data.train.x, data.train.y
        if dataidxs is not None:
            idx = torch.as_tensor(np.asarray(dataidxs), dtype=torch.long)
            x, y = x[idx], y[idx]
        train_ds, test_ds = TensorDataset(x, y), TensorDataset(data.test.x, data.test.y)
        train_dl = DataLoader(dataset=train_ds, batch_size=train_bs, drop_last=True, shuffle=True)
        test_dl = DataLoader(dataset=test_ds, batch_size=test_bs, shuffle=False)
        return train_dl, test_dl, train_ds, test_ds

    def compute_accuracy(
        model: nn.Module,
        dataloader: Any,
        get_confusion_matrix: bool = False,
        device: Any = "cpu",
        multiloader: bool = False,
    ) -> Any:
        return original_accuracy(model, dataloader, get_confusion_matrix, "cpu", multiloader)

    utils.partition_data = partition_data
    utils.get_dataloader = get_dataloader
    utils.compute_accuracy = compute_accuracy
    if init is not None:  # --same-init: every ModelFedCon starts from our initial weights
        model_class = importlib.import_module("model").ModelFedCon
        their_init, ours = model_class.__init__, list(init.values())

        def from_our_init(self: nn.Module, *args: Any, **kwargs: Any) -> None:
            their_init(self, *args, **kwargs)  # draws its own weights, as theirs does
            state = self.state_dict()
            if [v.shape for v in ours] != [v.shape for v in state.values()]:
                raise SystemExit("--same-init: our model's layers are not theirs")
            self.load_state_dict(dict(zip(state, ours, strict=True)))

        model_class.__init__ = from_our_init
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    nn.Module.cuda = lambda self, device=None: self  # type: ignore[method-assign]


def moon_accuracy(workdir: Path) -> list[float]:
    """The global model's test accuracy per round, from MOON's log (``--logdir``)."""
    logs = sorted(workdir.glob("logs/*.log"))
    if not logs:
        raise SystemExit(f"MOON wrote no log under {workdir / 'logs'}")
    return [float(m.group(1)) for m in MOON_ACCURACY.finditer(logs[-1].read_text())]


# ---------------------------------------------------------------------------- FedAU
def patch_fedau(data: OurData, cfg: Config) -> None:
    """Replace what IBM/fedau needs to run on our data and our model (docs/parity.md)."""
    dataset: Any = importlib.import_module("dataset.dataset")
    util: Any = importlib.import_module("util.util")
    cnn_mnist: Any = importlib.import_module("model.cnn_mnist")

    def load_data(name: str, data_path: str, device: Any) -> tuple[TensorDataset, TensorDataset]:
        return TensorDataset(data.train.x, data.train.y), TensorDataset(data.test.x, data.test.y)

    def data_participation_each_node(data_train: Any, n_nodes: int) -> tuple[Any, np.ndarray]:
        if n_nodes != len(data.local):
            raise SystemExit(f"-total-workers {n_nodes}, the partition file has {len(data.local)}")
        p = our_probabilities(data, cfg)
        print("participation_prob_each_node:", p, flush=True)
        return {n: data.local[n] for n in range(n_nodes)}, p

    class OurModel(nn.Module):
        """Our model of the experiment in place of their ModelCNNMnist: logits only."""

        def __init__(self) -> None:
            super().__init__()
            self.net = build_model(cfg)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).logits

    dataset.load_data = load_data
    util.data_participation_each_node = data_participation_each_node
    cnn_mnist.ModelCNNMnist = OurModel


def our_probabilities(data: OurData, cfg: Config) -> np.ndarray:
    """The per-node participation probabilities our server uses for this config
    (:func:`core.participation.participation_of`, as the ServerApp builds it, with the
    clients' label counts)."""
    k = cfg["data"]["num_classes"]
    counts = np.stack([label_counts(data.train_raw.y[idx], k) for idx in data.local])
    model = participation_of(cfg, counts)
    return np.asarray(model.description()["p"])


def fedau_accuracy(workdir: Path, iters_per_round: int) -> list[float]:
    """The global model's test accuracy per round, from FedAU's results CSV (``-out``)."""
    files = sorted(workdir.glob("results*.csv"))
    if not files:
        raise SystemExit(f"FedAU wrote no results CSV in {workdir}")
    with files[-1].open() as fh:
        rows = list(csv.DictReader(fh))
    by_round = {int(r["num_iter"]) // iters_per_round: float(r["test_accuracy"]) for r in rows}
    return [by_round[r] for r in sorted(by_round)]


# ---------------------------------------------------------------------------- FedRCL
class TheirDataset(Dataset):
    """Our standardised tensors as their torchvision-style dataset: ``(image, label)`` items,
    ``.targets`` and ``.classes`` (their client reads ``len(dataset.classes)``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> None:
        self.x, self.targets = x, y
        self.classes = [str(c) for c in range(num_classes)]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.targets[i])


class TheirContract(nn.Module):
    """Our model of the experiment with FedRCL's output contract: ``forward(x, no_relu)`` →
    ``{"layer0": …, "layer<L-1>": …, "logit": …}`` with our ``ModelOutput.levels`` (each
    stage's pre-ReLU output, globally average-pooled: their ``no_relu=True`` features, which
    their client pools the same way) and ``num_layers`` = L, so that their
    ``client.rcl_loss.branch_level`` indexes the levels our ``client.levels`` does."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.net = build_model(cfg)
        self.num_layers = len(self.net.level_names)

    def forward(self, x: torch.Tensor, no_relu: bool = True) -> dict[str, torch.Tensor]:
        if not no_relu:
            raise SystemExit("their client asked for post-ReLU features: feature_relu=False")
        out = self.net(x)
        results = {f"layer{i}": level for i, level in enumerate(out.levels)}
        results["logit"] = out.logits
        return results


class _UnusedMeta(type):
    """The type of a stand-in: any attribute is another stand-in, a call fails naming it."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return unused(f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"their code used {cls.__qualname__}, a stand-in (parity_theirs.py)")


def unused(name: str) -> type:
    """A stand-in for ``name``: a class (their code may subclass it) that fails, naming
    itself, only if their code ever calls or instantiates it."""
    return _UnusedMeta(name.rsplit(".", 1)[-1], (), {"__qualname__": name})


def stub_modules(names: dict[str, dict[str, Any]]) -> None:
    """Put empty modules (with the given attributes) in ``sys.modules`` for packages their
    code imports but does not use on the path we run."""
    for name, attrs in names.items():
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        sys.modules[name] = module


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook for modules their code imports but does not use on the path we run:
    each of ``names`` and any submodule of one (``geoopt.optim``) imports as a stand-in
    whose every public name is an :func:`unused` (``from geoopt import PoincareBall``)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__

        def stand_in(attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return unused(f"{name}.{attr}")

        module.__getattr__ = stand_in  # type: ignore[method-assign]


#: their top-level packages whose names our code or our dependencies use too (our
#: ``clients``; Hugging Face's ``datasets`` under flwr-datasets): forgotten before theirs load
FEDRCL_PACKAGES = ("clients", "datasets", "models", "servers", "trainers", "evalers", "utils")


def forget_modules(packages: tuple[str, ...]) -> None:
    """Drop ``packages`` and their submodules from ``sys.modules``, so that the next import
    of those names finds their checkout (first on ``sys.path``). Our objects already built
    keep the modules they were made from."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            del sys.modules[name]


def patch_fedrcl(data: OurData, cfg: Config) -> list[float]:
    """Replace what skynbe/FedRCL needs to run on our data and our model (docs/parity.md);
    returns the list that their ``Trainer.evaluate`` fills with each round's accuracy
    (a fraction)."""
    forget_modules(FEDRCL_PACKAGES)
    stub_modules(
        {
            "wandb": {"require": lambda *a, **k: None, "init": None, "log": None},
            "netcal": {},
            "netcal.metrics": {"ECE": None},  # imported by their trainer, unused
            "umap": {},
            "umap.umap_": {},  # imported by their evaler, unused
        }
    )
    build: Any = importlib.import_module("datasets.build")
    models_build: Any = importlib.import_module("models.build")
    trainer: Any = importlib.import_module("trainers.base_trainer")
    k = cfg["data"]["num_classes"]

    def build_datasets(args: Any) -> dict[str, Dataset]:
        return {
            "train": TheirDataset(data.train.x, data.train.y, k),
            "test": TheirDataset(data.test.x, data.test.y, k),
        }

    def get_dataset(args: Any, trainset: Any, mode: str = "iid") -> dict[int, list[int]]:
        n = int(args.trainer.num_clients)
        if n != len(data.local):
            raise SystemExit(f"trainer.num_clients {n}, the partition file has {len(data.local)}")
        return {c: [int(i) for i in data.local[c]] for c in range(n)}

    def build_encoder(args: Any) -> nn.Module:
        return TheirContract(cfg)

    accuracy: list[float] = []
    their_evaluate = trainer.Trainer.evaluate

    def evaluate(self: Any, epoch: int, local_datasets: Any = None) -> dict[str, Any]:
        result = their_evaluate(self, epoch=epoch, local_datasets=local_datasets)
        accuracy.append(float(result["acc"]) / 100.0)
        return result

    # their main sets the start method to spawn, and their trainer's result queue lives in a
    # multiprocessing.Manager process, which spawn would start by re-running
    # federated_train.py without the replacements above; with multiprocessing=False no
    # client runs in another process, so Linux's default (fork) changes nothing else
    torch.multiprocessing.set_start_method = lambda *a, **k: None
    build.build_datasets = build_datasets
    models_build.build_encoder = build_encoder
    trainer.get_dataset = get_dataset
    trainer.Trainer.evaluate = evaluate
    return accuracy


# --------------------------------------------------------------------------- FedRANE
#: their ``-data``: "mnist" in the name makes ``-m cnn`` their FedAvgCNN(1 channel, dim 1024)
FEDRANE_DATASET = "fmnist"
FEDRANE_ACCURACY = re.compile(r"Global test2 acc: ([0-9.]+)")
#: imported by main.py or their other servers/clients, unused on the FedRANE path
FEDRANE_UNUSED = (
    "wandb", "h5py", "ujson", "geoopt", "openTSNE", "umap", "torch_scatter", "calmsize", "opacus",
    "flcore.clients.clientSphereGAug", "flcore.clients.clientavg",
)  # fmt: skip


def write_pfllib_data(data: OurData, root: Path) -> None:
    """Our clients' data in the layout their loader reads (``utils/data_utils.py``:
    ``read_data``, ``read_global_test_data``): ``root/train/<k>.npz`` and
    ``root/test/<k>.npz``, each ``{"data": {"x", "y"}}``, client k's local train and local
    test split (``core.data.local_split``, as our client k splits its partition), and
    ``root/global_test``, the global test set; standardised as our clients read them."""

    def save(path: Path, x: np.ndarray, y: np.ndarray) -> None:
        with path.open("wb") as fh:
            np.savez(fh, data=np.array({"x": x, "y": y}, dtype=object))

    x, y = data.train.x.numpy(), data.train.y.numpy()  # views of the tensors, no copy
    for split, parts in (("train", data.local), ("test", data.local_test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for k, idx in enumerate(parts):
            save(root / split / f"{k}.npz", x[idx], y[idx])
    save(root / "global_test", data.test.x.numpy(), data.test.y.numpy())


class EnoughRounds(Exception):
    """Their run has printed the accuracy of every round asked for."""


class AccuracyWatch(io.TextIOBase):
    """Their stdout, passed on unchanged, with every ``Global test2 acc`` value kept in
    ``values`` (fractions, in the order printed)."""

    def __init__(self, out: Any) -> None:
        self.out, self._line = out, ""
        self.values: list[float] = []

    def write(self, text: str) -> int:
        self.out.write(text)
        *lines, self._line = (self._line + text).split("\n")
        for line in lines:
            if m := FEDRANE_ACCURACY.search(line):
                self.values.append(float(m.group(1)))
        return len(text)

    def flush(self) -> None:
        self.out.flush()


class MixupOnLogits(nn.Module):
    """Their client's cross-entropy with the mixup term scored on the logits (the
    diagnostic ``--mixup-on-logits``; not a parity run). ``train_raw`` passes the mixed
    features ``z_mix`` (as wide as the classifier's input) to the cross-entropy meant for
    logits (clientFedRANE.py:154: ``self.L_ce(z_mix, y_a)``); here such an input goes
    through the client's classifier (``model.predictor``) first, as their ``train_mixup``
    does (lines 112-115). Every other call is scored unchanged: the class logits (as wide
    as the number of classes) and InfoNCE's (2B - 1 wide, odd, lines 106-110)."""

    reported = False

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client  # not a module: their client holds the model it trains
        width = client.model.predictor.in_features
        if width == client.num_classes or width % 2 == 1:  # then the widths are ambiguous
            raise SystemExit(f"--mixup-on-logits: a feature width of {width} is ambiguous")

    def forward(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        predictor = self.client.model.predictor
        if scores.shape[-1] == predictor.in_features:
            if not MixupOnLogits.reported:  # their log shows that the change is in effect
                print(f"--mixup-on-logits: {tuple(scores.shape)} features scored as logits")
                MixupOnLogits.reported = True
            scores = predictor(scores)
        return nn.functional.cross_entropy(scores, target)


def fresh_optimizer_each_round(cls: Any) -> None:
    """Make ``cls.train`` (a PFLlib client's round of local training) clear the client's
    optimizer state first (SGD's momentum buffers, built afresh by the first step), as each
    of our clients starts a round; the learning rate and its schedule are kept."""
    their_train = cls.train

    def train(self: Any, *a: Any, **k: Any) -> Any:
        self.optimizer.state.clear()
        return their_train(self, *a, **k)

    cls.train = train


#: Where a run with ``--our-gne`` records each round's two GNE weight vectors (in --workdir)
GNE_LOG = "gne_weights.jsonl"


def our_gne_in_their_server(cls: Any, log_path: Path) -> None:
    """Make ``cls.nash`` (their GNE step, ``serverFedRANE.py:363-410``: the update
    ``grads @ w`` from the live clients' updates, ``grads`` dim × K) apply our weights
    (:func:`strategies.gne.gram_weights` on the same updates' Gram matrix, in float64, and
    the same clients' sample counts) in place of theirs. Their own solver still runs first,
    so its state (the warm start ``prvs_alpha``) evolves as released, and each round appends
    one JSON line to ``log_path``: their normalised weights, ours, the Gram matrix and our
    solver's status."""
    their_nash = cls.nash

    def nash(self: Any, grads: torch.Tensor, no_grad_id_list: list[int]) -> torch.Tensor:
        their_nash(self, grads, no_grad_id_list)
        alpha = np.asarray(self.prvs_alpha, dtype=np.float64)  # what their step used
        live = [c for c in self.selected_clients if c.id not in no_grad_id_list]
        samples = np.array([c.train_samples for c in live], dtype=np.float64)
        g = grads.detach().double()
        gram = (g.t() @ g).cpu().numpy()
        ours, status = gram_weights(gram, samples)
        record = {
            "theirs": (alpha / alpha.sum()).tolist(),
            "ours": ours.tolist(),
            "gram": gram.tolist(),  # to check either side's weights against Gp = 1/p
            "status": status,
        }
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return grads @ torch.as_tensor(ours, dtype=grads.dtype, device=grads.device)

    cls.nash = nash


def patch_fedrane(
    data: OurData,
    workdir: Path,
    rounds: int,
    mixup_on: str = "features",
    fresh_optimizer: bool = False,
    our_gne: bool = False,
) -> AccuracyWatch:
    """Make XeniaLLL/HyperFed_and_FedRANE-master's ``system/main.py -algo FedRANE`` run on
    our data on the CPU (docs/parity.md; their files untouched) and stop after ``rounds``
    rounds. Writes their data under ``workdir/dataset`` and returns the watch on stdout
    whose ``values`` are the global accuracies printed (round 0, the initial model, first).
    ``mixup_on="classifier"`` (a diagnostic) gives every client :class:`MixupOnLogits`.
    ``fresh_optimizer`` (a diagnostic) clears each client's optimizer state (SGD's momentum
    buffers) before each round's training, as our clients start every round: their client
    builds its optimizer once (clientFedRANE.py:21-22) and keeps it across rounds.
    ``our_gne`` (a diagnostic) makes their server step with our GNE weights
    (:func:`our_gne_in_their_server`, both recorded in ``workdir/gne_weights.jsonl``)."""
    # their packages, and the real ones of the unused names if loaded: stand-ins instead
    forget_modules(("flcore", "utils", *FEDRANE_UNUSED))
    sys.meta_path.insert(0, StandIns(FEDRANE_UNUSED))
    write_pfllib_data(data, workdir / "dataset" / FEDRANE_DATASET)
    torch.cuda.set_device = lambda *a, **k: None  # main.py: torch.cuda.set_device('cuda:1')
    parse_args = argparse.ArgumentParser.parse_args

    def with_their_method(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        ns = parse_args(self, *a, **k)
        if not hasattr(ns, "multi_task_method"):  # read by serverFedRANE.py:41, never defined
            ns.multi_task_method = "Nash"  # GNE (serverFedRANE.py:363-410)
        return ns

    argparse.ArgumentParser.parse_args = with_their_method  # type: ignore[method-assign]
    client: Any = importlib.import_module("flcore.clients.clientFedRANE")
    stub_modules({"flcore.clients.clientSphereG": {"ClientSphereG": client.ClientFedRANE}})
    if mixup_on == "classifier":
        their_init = client.ClientFedRANE.__init__

        def init(self: Any, *a: Any, **k: Any) -> None:
            their_init(self, *a, **k)
            self.L_ce = MixupOnLogits(self)

        client.ClientFedRANE.__init__ = init
    if fresh_optimizer:
        fresh_optimizer_each_round(client.ClientFedRANE)
    server: Any = importlib.import_module("flcore.servers.serverFedRANE")
    watch = AccuracyWatch(sys.stdout)
    their_evaluate = server.FedRANE.evaluate

    def evaluate(self: Any, acc: Any = None, loss: Any = None, global_test: bool = False) -> None:
        their_evaluate(self, acc=acc, loss=loss, global_test=global_test)
        if global_test and len(watch.values) > rounds:  # rounds 0..R printed
            raise EnoughRounds

    server.FedRANE.evaluate = evaluate
    if our_gne:
        our_gne_in_their_server(server.FedRANE, workdir / GNE_LOG)
    return watch


# ----------------------------------------------------------------------------- main
def their_option(argv: list[str], name: str, default: str) -> str:
    """The value of option ``name`` in their command line (``default`` without it)."""
    return argv[argv.index(name) + 1] if name in argv else default


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", choices=FAMILIES, required=True)
    p.add_argument("--theirs", type=Path, required=True, help="their checkout")
    p.add_argument("--experiment", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--set", default="", help="our config overrides (the partition file too)")
    p.add_argument("--workdir", type=Path, required=True, help="their working directory")
    p.add_argument("--out-json", type=Path, required=True)
    p.add_argument(
        "--same-init",
        action="store_true",
        help="diagnostic: MOON's nets start from our initial weights (not a parity run)",
    )
    p.add_argument(
        "--their-deps",
        type=Path,
        default=None,
        help="a folder of the packages their code needs beyond ours (pip install --target)",
    )
    p.add_argument(
        "--fresh-optimizer",
        action="store_true",
        help="diagnostic (FedRANE's code): each client's optimizer state cleared every round",
    )
    p.add_argument(
        "--our-gne",
        action="store_true",
        help="diagnostic (FedRANE's code): their server steps with our GNE weights on the same "
        "updates; both weight vectors recorded per round in --workdir/gne_weights.jsonl",
    )
    p.add_argument("their_args", nargs=argparse.REMAINDER, help="-- then their arguments")
    args = p.parse_args()
    their_args = [a for a in args.their_args if a != "--"] if args.their_args else []

    cfg = load_config(args.experiment, args.method, f"{args.set} seed={args.seed}")
    # as many threads as each of our clients (client.num_threads): on a busy machine more
    # threads than free cores spin against each other (bench/parity.py's docstring)
    limit_threads(cfg["client"]["num_threads"])
    data = OurData(cfg)  # our code first: their `datasets`/`model` shadow installed packages
    theirs = args.theirs.resolve()
    if args.family == "fedrane":  # a PFLlib tree: main.py and its packages under system/
        theirs = theirs / "system"
    sys.path.insert(0, str(theirs))
    if args.their_deps is not None:
        sys.path.insert(1, str(args.their_deps.resolve()))
    args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir.resolve()
    entry = theirs / ("federated_train.py" if args.family == "fedrcl" else "main.py")
    sys.argv = [str(entry), *their_args]
    out_json = args.out_json.resolve()
    start = time.time()
    os.chdir(workdir)
    if args.family == "moon":
        init = None
        if args.same_init:  # the weights our server starts from (fl_app/server_app.py)
            torch.manual_seed(cfg["seed"])
            init = build_model(cfg).state_dict()
        patch_moon(data, init)
        runpy.run_path(str(theirs / "main.py"), run_name="__main__")
        acc = moon_accuracy(workdir)
    elif args.family == "fedrcl":
        recorded = patch_fedrcl(data, cfg)
        runpy.run_path(str(entry), run_name="__main__")
        acc = list(recorded)
    elif args.family == "fedrane":
        # their data path is '../dataset' (utils/data_utils.py): run from workdir/run
        (workdir / "run").mkdir(exist_ok=True)
        os.chdir(workdir / "run")
        np.random.seed(cfg["seed"])  # their code draws from numpy's global RNG unseeded
        watch = patch_fedrane(
            data,
            workdir,
            cfg["num_rounds"],
            cfg["client"]["mixup_on"],
            args.fresh_optimizer,
            args.our_gne,
        )
        sys.stdout = watch
        try:
            runpy.run_path(str(entry), run_name="__main__")
        except EnoughRounds:
            pass
        finally:
            sys.stdout = watch.out
        acc = watch.values[1 : cfg["num_rounds"] + 1]  # round 0 is the initial model
    else:
        importlib.import_module("config")  # theirs: parses sys.argv
        patch_fedau(data, cfg)
        runpy.run_path(str(theirs / "main.py"), run_name="__main__")
        acc = fedau_accuracy(workdir, int(their_option(their_args, "-iters-per-round", "5")))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {
        "accuracy": acc,
        "wall_seconds": time.time() - start,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,  # the whole process, data loading too
    }
    out_json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
