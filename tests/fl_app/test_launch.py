import subprocess
import sys

import pytest

from fl_app.config import ConfigError, config_from_run_config, load_config
from fl_app.launch import check_resources
from fl_app.results import RunRecorder


@pytest.mark.parametrize(
    ("device", "gpus", "cuda", "problem"),
    [
        ("auto", 0, False, None),
        ("auto", 0.25, True, None),
        ("cuda:0", 0.5, True, None),
        ("auto", 2, True, None),
        ("cpu", 0, True, None),
        ("auto", 0.25, False, "no CUDA GPU is visible"),
        ("cuda", 0, False, "no CUDA GPU is visible"),
        ("cuda", 0, True, "needs a GPU share per simulated client"),
        ("auto", -1, True, "use 0 (CPU), a fraction"),
        ("auto", 1.5, True, "use 0 (CPU), a fraction"),
    ],
)
def test_check_resources(device, gpus, cuda, problem):
    cfg = load_config("tiny", "fedavg", f"client.device={device}")
    found = check_resources(cfg, gpus, cuda)
    assert found is None if problem is None else problem in found


def _launch(tmp_path, *extra):
    cmd = [sys.executable, "-m", "fl_app.launch", "--experiment", "tiny"]
    cmd += ["--output-dir", str(tmp_path), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_launch_refuses_a_gpu_share_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = _launch(tmp_path, "--gpus-per-client", "0.5")
    assert res.returncode == 2 and "no CUDA GPU is visible" in res.stderr


def test_launch_refuses_a_results_directory_in_use(tmp_path):
    """Before Flower starts (no SuperLink is needed to see this error)."""
    busy = RunRecorder(load_config("tiny", "fedavg", f"output_dir={tmp_path}"))
    res = _launch(tmp_path)
    busy.finish()
    assert res.returncode == 2 and "is being written by another run" in res.stderr


@pytest.mark.parametrize("key", ["seed=3", "output_dir=elsewhere", "method=moon"])
def test_keys_with_their_own_option_are_refused_in_set(tmp_path, key):
    """``SET="seed=3"`` made the launcher watch seed0 while the ServerApp wrote seed3."""
    res = _launch(tmp_path, "--set", key)
    name = key.split("=")[0]
    assert res.returncode == 2 and f"'{name}' cannot be given in SET" in res.stderr
    assert f"{name.upper()}=... with make" in res.stderr
    with pytest.raises(ConfigError, match=f"'{name}' cannot be given in SET"):
        config_from_run_config({"experiment": "tiny", "method": "fedavg", "set": key})
