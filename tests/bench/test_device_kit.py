"""bench/device_kit.py (the wheels a lent GPU machine lacks, built here and installed there)
and the two shell scripts around it (device_kit.sh, gpu_checks.sh), without a network: the
dependency walk on hand-made metadata, Ray's repacking, the choice of fallback wheels, a
build with a stand-in for pip download, and an install of a hand-made kit with the real pip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import device_kit as dk
import pytest

REPO = Path(__file__).resolve().parents[2]
PY = ".".join(map(str, sys.version_info[:2]))

KINDS_TEXT = """# The kinds
## `nvidia-h200`
| pip list | torch 2.11.0 |

## Python packages already there

nvidia-h200: their image holds these. Packages: numpy, Pillow, typing_extensions, torch.
other-kind: Packages: jax.
"""


def dists_of(table: dict[str, tuple[str, list[str]]]) -> dk.Dists:
    """A stand-in for the installed metadata: {name: (version, Requires-Dist)}."""

    def dists(name: str) -> tuple[str, list[str]]:
        if dk.norm(name) not in table:
            raise dk.KitError(f"{name} is not installed")
        return table[dk.norm(name)]

    return dists


def make_wheel(path: Path, files: dict[str, tuple[str, int]], name: str, version: str) -> Path:
    """A wheel at ``path`` holding ``files`` {path: (text, mode)} and a minimal dist-info."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for rel, (text, mode) in {**files, **{k: (v, 0o644) for k, v in meta.items()}}.items():
            entry = zipfile.ZipInfo(rel)
            entry.external_attr = (0o100000 | mode) << 16
            zf.writestr(entry, text)
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_preinstalled_reads_the_kinds_package_list() -> None:
    assert dk.preinstalled(KINDS_TEXT) == {"numpy", "pillow", "typing-extensions", "torch"}
    assert dk.preinstalled(KINDS_TEXT, "other-kind") == {"jax"}
    with pytest.raises(dk.KitError, match="no package list for nvidia-h200"):
        dk.preinstalled("## Python packages already there\n\nnothing here\n")


def test_roots_are_the_dependencies_and_the_test_tools() -> None:
    reqs = dk.roots(REPO / "pyproject.toml")
    names = {dk.norm(r.split("[")[0].split("=")[0].split(">")[0]) for r in reqs}
    assert {"flwr", "flwr-datasets", "finch-clust", "torch", "pytest", "hypothesis"} <= names
    assert not names & {"ruff", "mypy"}


def test_plan_walks_requirements_with_markers_and_extras_to_the_machines_packages() -> None:
    table = {
        "a": ("1.0", ["b>=1", "c; extra == 'x'", "d; python_version < '3.11'", "uv>=0.1"]),
        "b": ("1.5", ["numpy<3", "torch", "e[y]"]),
        "c": ("2.0", []),
        "e": ("0.1", ["f; extra == 'y'", "g; sys_platform == 'win32'"]),
        "f": ("3.0", ["numpy<3"]),
    }
    present = {"numpy", "torch"}
    roots = ["a[x]", "torch==2.14.1", "d; python_version < '3.11'"]
    p = dk.plan(roots, present, dists_of(table), "3.12")
    assert p.kit == {"a": "1.0", "b": "1.5", "c": "2.0", "e": "0.1", "f": "3.0"}
    # what carried packages ask of the machine's packages; not the project's own torch pin
    assert p.needs == {"numpy": [("<3", "b"), ("<3", "f")]}
    assert set(p.excluded) == {"uv"}
    # d's marker holds on 3.10
    assert "d" not in p.kit
    with pytest.raises(dk.KitError, match="d is not installed"):
        dk.plan(["a[x]"], present, dists_of(table), "3.10")


def test_plan_refuses_an_installed_version_outside_a_requirement() -> None:
    table = {"a": ("1.0", ["b>=2"]), "b": ("1.5", [])}
    with pytest.raises(dk.KitError, match="a needs b>=2, but b 1.5 is installed here"):
        dk.plan(["a"], set(), dists_of(table), "3.12")


def test_the_projects_plan_carries_flwr_ray_and_datasets_but_not_uv_or_torch() -> None:
    present = dk.preinstalled(KINDS_TEXT) | {"pytest", "hypothesis", "pyyaml", "scipy"}
    p = dk.plan(dk.roots(REPO / "pyproject.toml"), present, dk.installed, "3.12")
    assert {"flwr", "ray", "flwr-datasets", "datasets", "finch-clust", "cryptography"} <= set(p.kit)
    assert p.kit["flwr"] == "1.41.0"
    assert "uv" in p.excluded and "uv" not in p.kit
    assert not {"torch", "numpy"} & set(p.kit)


def test_repack_drops_the_pruned_paths_and_keeps_file_modes(tmp_path: Path) -> None:
    files = {
        "ray/__init__.py": ("x = 1\n", 0o644),
        "ray/core/raylet": ("#!/bin/sh\n", 0o755),
        "ray/jars/ray_dist.jar": ("java" * 100, 0o644),
        "ray/dashboard/main.js.map": ("{}", 0o644),
    }
    whl = make_wheel(tmp_path / "ray-1.0-py3-none-any.whl", files, "ray", "1.0")
    out = tmp_path / "ray.tar.xz"
    info = dk.repack(whl, out, ("ray/jars/",))
    assert info["dropped_bytes"] == 402
    with tarfile.open(out, "r:xz") as tar:
        members = {m.name: m.mode for m in tar.getmembers()}
    assert members["ray/core/raylet"] == 0o755 and members["ray/__init__.py"] == 0o644
    assert "ray/jars/ray_dist.jar" not in members and "ray/dashboard/main.js.map" not in members
    assert "ray-1.0.dist-info/METADATA" in members
    data = make_wheel(
        tmp_path / "x-1.0-py3-none-any.whl", {"x-1.0.data/scripts/x": ("", 0o755)}, "x", "1.0"
    )
    with pytest.raises(dk.KitError, match="outside site-packages"):
        dk.repack(data, tmp_path / "x.tar.xz", ())


def test_choose_fallbacks_installs_a_wheel_only_where_the_machines_version_misses() -> None:
    needs: list[dict[str, Any]] = [
        {"name": "typer", "specifier": "<0.21,>=0.13", "required_by": ["flwr"],
         "file": "fallback/typer.whl", "version": "0.20.1"},
        {"name": "packaging", "specifier": "<26", "required_by": ["flwr"],
         "file": "fallback/packaging.whl", "version": "25.0"},
        {"name": "attrs", "specifier": ">=22", "required_by": ["jsonschema"],
         "file": "fallback/attrs.whl", "version": "26.1.0"},
        {"name": "numpy", "specifier": "<3", "required_by": ["flwr"], "file": None,
         "not_carried": "big"},
    ]  # fmt: skip
    here = {"typer": "0.24.0", "packaging": "25.0", "numpy": "3.1"}
    files, lines = dk.choose_fallbacks(needs, here.get)
    assert files == ["fallback/typer.whl", "fallback/attrs.whl"]  # attrs: missing here
    assert lines[0].startswith("fallback typer") and lines[1].startswith("ok       packaging")
    assert lines[3].startswith("WARNING  numpy <3 (flwr): here 3.1")


def test_console_scripts_are_read_from_entry_points(tmp_path: Path) -> None:
    info = tmp_path / "flwr-1.41.0.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text(
        "[console_scripts]\nflwr = flwr.cli.app:main\nflower-superlink = x:y\n\n[other]\nz = q\n"
    )
    assert dk.console_scripts(tmp_path, ["flwr"]) == ["flower-superlink", "flwr"]
    assert dk.console_scripts(tmp_path, ["ray"]) == []


def fake_fetch(pins, dest: Path, python_version: str) -> dict[str, Path]:
    """A stand-in for ``pip download``: a small wheel per pin (Ray's with Java in it)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for pin in pins:
        name, version = pin.split("==")
        tag = f"cp{python_version.replace('.', '')}"
        files = {f"{name.replace('-', '_')}/__init__.py": ("", 0o644)}
        if name == "ray":
            files["ray/jars/big.jar"] = ("j" * 5000, 0o644)
            files["ray/core/raylet"] = ("#!/bin/sh\n", 0o755)
        whl = dest / f"{name.replace('-', '_')}-{version}-{tag}-{tag}-manylinux_2_17_x86_64.whl"
        out[dk.norm(name)] = make_wheel(whl, files, name, version)
    return out


def test_build_writes_the_wheels_ray_repacked_the_fallbacks_and_a_manifest(
    tmp_path: Path,
) -> None:
    kinds = tmp_path / "KINDS.md"
    kinds.write_text(KINDS_TEXT)
    table = {
        "app": ("1.0", ["ray==2.0", "numpy<3", "typing-extensions>=4.16", "uv"]),
        "ray": ("2.0", ["numpy"]),
        "numpy": ("2.4.6", []),
        "typing-extensions": ("4.16.0", []),
    }
    dest = tmp_path / "kit"
    m = dk.build(dest, "3.12", kinds, dists=dists_of(table), fetch=fake_fetch, requirements=["app"])
    assert m["python"] == "3.12" and set(m["kit"]) == {"app", "ray"}
    assert m["kit"]["ray"]["file"] == "ray-2.0-cp312-pruned.tar.xz"
    assert (dest / m["kit"]["app"]["file"]).is_file()
    needs = {n["name"]: n for n in m["needs"]}
    assert needs["numpy"]["file"] is None  # too big to carry: the machine's own
    assert needs["typing-extensions"]["file"].startswith("fallback/typing_extensions-4.16.0")
    assert json.loads((dest / "manifest.json").read_text()) == m
    assert m["size_bytes"] == dk.size_of(dest.rglob("*")) - (dest / "manifest.json").stat().st_size
    assert "kit size" in dk.report(m, dest)
    # a rebuild replaces a kit, but not a folder that is not one; --no-fallback
    m = dk.build(
        dest,
        "3.12",
        kinds,
        dists=dists_of(table),
        fetch=fake_fetch,
        requirements=["app"],
        no_fallback=["Typing_Extensions"],
    )
    assert [n["not_carried"] for n in m["needs"] if n["name"] == "typing-extensions"] == [
        "--no-fallback"
    ]
    assert not (dest / "fallback").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(dk.KitError, match="is not a kit"):
        dk.build(other, "3.12", kinds, dists=dists_of(table), fetch=fake_fetch, requirements=[])
    with pytest.raises(dk.KitError, match="over the 0.001 MiB"):
        dk.build(
            dest,
            "3.12",
            kinds,
            limit_mib=0.001,
            dists=dists_of(table),
            fetch=fake_fetch,
            requirements=["app"],
        )


def test_install_puts_wheels_scripts_and_unpacked_ray_in_the_target(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    (kit / "fallback").mkdir(parents=True)
    app = make_wheel(
        kit / "kitapp-1.0-py3-none-any.whl",
        {"kitapp/__init__.py": ("X = 1\n", 0o644)},
        "kitapp",
        "1.0",
    )
    with zipfile.ZipFile(app, "a") as zf:
        zf.writestr(
            "kitapp-1.0.dist-info/entry_points.txt", "[console_scripts]\nkitapp = kitapp:X\n"
        )
    make_wheel(
        kit / "fallback" / "kitdep-2.0-py3-none-any.whl",
        {"kitdep.py": ("", 0o644)},
        "kitdep",
        "2.0",
    )
    ray = make_wheel(
        tmp_path / "ray.whl", {"ray/core/raylet": ("#!/bin/sh\n", 0o755)}, "ray", "2.0"
    )
    dk.repack(ray, kit / "ray-2.0-pruned.tar.xz", ())
    manifest = {
        "python": PY,
        "kit": {
            "kitapp": {"version": "1.0", "file": app.name},
            "ray": {"version": "2.0", "file": "ray-2.0-pruned.tar.xz"},
        },
        "needs": [
            {"name": "kitdep", "specifier": ">=2", "required_by": ["kitapp"],
             "file": "fallback/kitdep-2.0-py3-none-any.whl", "version": "2.0"},
        ],
    }  # fmt: skip
    (kit / "manifest.json").write_text(json.dumps(manifest))
    target = tmp_path / "site"
    lines: list[str] = []
    dk.install(kit, target, lines.append)
    assert lines[0] == "fallback kitdep >=2 (kitapp): here None: installing 2.0"
    assert (target / "kitapp" / "__init__.py").is_file() and (target / "kitdep.py").is_file()
    assert (target / "bin" / "kitapp").is_file() and lines[-1].startswith("1 console scripts")
    assert os.access(target / "ray" / "core" / "raylet", os.X_OK)
    lines.clear()
    dk.install(kit, target, lines.append)
    assert lines == [f"the kit is already installed in {target}"]
    (kit / "manifest.json").write_text(json.dumps({**manifest, "python": "2.7"}))
    with pytest.raises(dk.KitError, match="is for Python 2.7"):
        dk.install(kit, tmp_path / "site2")
    assert "no kit in" in str(dk.main(["install", "--kit", str(tmp_path), "--target", str(target)]))


def test_travelling_tree_counts_tracked_and_unignored_files(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/big/\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("x" * 100)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "y.bin").write_text("y" * 1000)
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "z.whl").write_text("z" * 50)
    git("add", "a/x.txt")
    total, biggest = dk.travelling_tree(tmp_path, skip=tmp_path / "kit")
    assert total == 100 + len("/big/\n")
    assert biggest[0] == (100, "a")


def test_the_kit_folder_is_ignored_by_git() -> None:
    done = subprocess.run(["git", "check-ignore", "-q", ".devkit/x.whl"], cwd=REPO)
    assert done.returncode == 0


@pytest.mark.parametrize("script", ["bench/device_kit.sh", "bench/gpu_checks.sh"])
def test_the_shell_scripts_parse(script: str) -> None:
    done = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_gpu_checks_dry_run_lists_the_steps_in_order_of_value(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", "bench/gpu_checks.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    steps = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("== ")][1:]
    assert steps == ["install", "env", "tests", "s1", "s2bf16", "s2fp32", "s5"]
    assert "client.precision=bf16 client.channels_last=true data.root=" in done.stdout
    assert (tmp_path / "log.txt").read_text() == done.stdout
    done = subprocess.run(
        ["bash", "bench/gpu_checks.sh", "--dry-run", "nope"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "unknown step 'nope'" in done.stdout
