"""The device kit: what a lent GPU machine lacks to run this project, built here, carried
there as an ignored folder (``.devkit``), installed there without a network.

    .venv/bin/python bench/device_kit.py build [--python-version 3.12] [--dest .devkit]
    .venv/bin/python bench/device_kit.py plan [--python-version 3.12]   # the list alone
    python3 bench/device_kit.py install [--kit .devkit] [--target /tmp/site]   # there

(``bench/device_kit.sh`` runs ``build``; ``bench/gpu_checks.sh`` runs ``install`` first.)

**What goes in.** The project's runtime requirements (``pyproject.toml``'s dependencies, and
the test tools ``pytest`` and ``hypothesis``) with their requirements, walked through each
package's ``Requires-Dist`` (markers read for the target Python on x86-64 Linux, extras
followed), stopping at the packages the machine already has (the package list of
``KINDS.md``, ``--kinds``): each missing package at the version installed in this
interpreter (``make install``'s pins), as a wheel for ``--python-version`` (``pip download
--no-deps --only-binary=:all:``, manylinux x86-64). Left out: ``uv``, which flwr only uses to
install an app's dependencies at run time, which the launcher turns off
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, :mod:`fl_app.launch`). Ray's wheel
(74 MB, 32 of them Java) is repacked as a ``.tar.xz`` of its files without Java and the
libraries Flower's simulation does not use (RLlib, Tune, Train, Serve, Data, LLM; ~25 MB).

**Versions of what the machine has.** Where a carried package asks for a version of a
package the machine already has (flwr: ``typer<0.21``, ``packaging<26``, ``protobuf<7``...),
the machine's own version is used when it fits; a small wheel of the version installed here
rides along in ``fallback/`` and ``install`` puts it in the target only when the machine's
version does not fit (or the package is missing). Wheels over 1 MiB are not carried (numpy,
torch, uvloop...; grpcio is, since grpcio-health-checking's generated code refuses an older
grpcio, unless ``--no-fallback grpcio``): a version outside a requirement is reported, and
the machine's is used.

``build`` writes ``manifest.json`` beside the wheels (what is in the kit and why), prints
the kit's size and the size of the working tree that travels with it, and fails when the
kit is over ``--limit-mib`` (60 MiB: a device call carries at most 64 MiB, the working tree
included). ``install`` checks the Python version, installs the wheels with ``pip install
--no-index --no-deps --target``, unpacks the repacked packages there, checks that every
console script of the carried wheels is in ``<target>/bin`` (flwr starts
``flower-superlink``, ``flower-superexec`` and ``flwr-simulation`` by name, from ``PATH``),
and records the kit in ``<target>/.devkit.json`` (a second ``install`` of the same kit does
nothing). It needs only the standard library and ``packaging``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
KINDS = Path("/work/.library/device/KINDS.md")  # this workplace's list of the machine's packages
KIND = "nvidia-h200"
MIB = 1 << 20
LIMIT_MIB = 60.0  # the kit; a device call carries 64 MiB, the working tree included
CALL_LIMIT_MIB = 64.0
TEST_TOOLS = ("pytest", "hypothesis")  # the GPU checks run the CUDA tests
EXCLUDE = {
    "uv": "flwr runs it only to install an app's dependencies at run time, which the "
    "launcher turns off (FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1); a 20 MB wheel",
}
# carried as a .tar.xz of the wheel's files without these (paths in the wheel)
REPACK = {
    "ray": (
        "ray/jars/",  # Java workers: 32 of the wheel's 74 MB
        "ray/rllib/",
        "ray/tune/",
        "ray/train/",
        "ray/serve/",
        "ray/data/",
        "ray/llm/",
    ),
}
DROP_SUFFIXES = (".js.map",)  # the dashboard's source maps
XZ_PRESET: Final = 6
# packages of the machine too big to carry as a fallback: the machine's own are used
NOT_CARRIED = frozenset(
    {"torch", "torchvision", "numpy", "scipy", "scikit-learn", "pandas", "pyarrow"}
    | {"matplotlib", "triton"}
)
FALLBACK_MAX = 1 * MIB  # a bigger fallback wheel is left out (the machine's version is used)
# carried whatever their size: a version outside the requirement breaks an import
ALWAYS_CARRY = {
    "grpcio": "grpcio-health-checking's generated code refuses an older grpcio at import "
    "(GRPC_GENERATED_VERSION); 6.6 MB",
}
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
MANIFEST = "manifest.json"
STAMP = ".devkit.json"

Dists = Callable[[str], tuple[str, list[str]]]  # name -> (version, Requires-Dist)


class KitError(Exception):
    """Why the kit cannot be built or installed."""


def norm(name: str) -> str:
    """A distribution's canonical name (PEP 503, packaging's ``canonicalize_name``):
    `` Typing_Extensions`` → ``typing-extensions``."""
    return canonicalize_name(name.strip())


def preinstalled(kinds_text: str, kind: str = KIND) -> set[str]:
    """The canonical names of the Python packages that KINDS.md says machines of ``kind``
    already hold (its "Python packages already there" section: ``<kind>: ... Packages: a, b,
    c.``). KitError when the text has no such list."""
    section = kinds_text.partition("## Python packages already there")[2]
    for line in section.splitlines():
        if line.startswith(f"{kind}:") and "Packages:" in line:
            names = line.split("Packages:", 1)[1].strip().rstrip(".")
            return {norm(n) for n in names.split(",") if n.strip()}
    raise KitError(f"no package list for {kind} under 'Python packages already there'")


def roots(pyproject: Path) -> list[str]:
    """The requirements the machine must meet: the project's dependencies and, from its
    ``dev`` extra, the test tools (:data:`TEST_TOOLS`)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    dev = project.get("optional-dependencies", {}).get("dev", [])
    tools = [r for r in dev if norm(Requirement(r).name) in TEST_TOOLS]
    return [*project["dependencies"], *tools]


def marker_env(python_version: str) -> dict[str, str]:
    """The environment markers of CPython ``python_version`` (``3.12``) on x86-64 Linux."""
    full = python_version if python_version.count(".") >= 2 else f"{python_version}.0"
    return {
        "python_version": ".".join(python_version.split(".")[:2]),
        "python_full_version": full,
        "implementation_name": "cpython",
        "implementation_version": full,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "sys_platform": "linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
    }


def applies(req: Requirement, env: Mapping[str, str], extras: Iterable[str]) -> bool:
    """Whether ``req`` (a Requires-Dist line of a package installed with ``extras``) is
    needed in ``env``."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras))


@dataclasses.dataclass
class Plan:
    """What the kit holds: ``kit`` {name: version} to carry; ``needs`` {name of a package
    the machine has: [(specifier, required by)]}, the versions carried packages ask of it;
    ``excluded`` {name: why it is left out}."""

    kit: dict[str, str] = dataclasses.field(default_factory=dict)
    needs: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    excluded: dict[str, str] = dataclasses.field(default_factory=dict)


def plan(
    requirements: Sequence[str],
    present: set[str],
    dists: Dists,
    python_version: str,
    exclude: Mapping[str, str] = EXCLUDE,
) -> Plan:
    """Walk ``requirements`` and their Requires-Dist (``dists``: name → installed version
    and Requires-Dist) for ``python_version``; a package in ``present`` (canonical names)
    ends the walk there. KitError when an installed version misses what asks for it."""
    env = marker_env(python_version)
    out = Plan()
    expanded: dict[str, set[str]] = {}
    roots_ = [Requirement(r) for r in requirements]
    todo = [(r, "pyproject.toml") for r in roots_ if applies(r, env, ())]
    while todo:
        req, by = todo.pop(0)
        name = norm(req.name)
        if name in exclude:
            out.excluded[name] = exclude[name]
            continue
        if name in present:
            if by != "pyproject.toml" and str(req.specifier):
                entry = (str(req.specifier), by)
                if entry not in out.needs.setdefault(name, []):
                    out.needs[name].append(entry)
            continue
        version, requires = dists(name)
        if not req.specifier.contains(version, prereleases=True):
            raise KitError(f"{by} needs {req}, but {name} {version} is installed here")
        extras = set(req.extras)
        if name in expanded and extras <= expanded[name]:
            continue
        expanded[name] = expanded.get(name, set()) | extras
        out.kit[name] = version
        for line in requires:
            sub = Requirement(line)
            if applies(sub, env, expanded[name]):
                todo.append((sub, name))
    return out


def installed(name: str) -> tuple[str, list[str]]:
    """This interpreter's version and Requires-Dist of ``name``."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise KitError(
            f"{name} is not installed in {sys.prefix}: build the kit with the project's "
            "interpreter (.venv/bin/python, after `make install`)"
        ) from None
    return dist.version, list(dist.requires or [])


def installed_version(name: str) -> str | None:
    """This interpreter's version of ``name``, or None when it lacks it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_name(path: Path) -> str:
    """The canonical distribution name of a wheel file (``tomli_w-1.2.0-py3-none-any.whl``)."""
    return norm(path.name.split("-", 1)[0])


def download(pins: Sequence[str], dest: Path, python_version: str) -> dict[str, Path]:
    """``pip download`` the wheels of ``pins`` (``name==version``) for CPython
    ``python_version`` on manylinux x86-64 into ``dest``; {canonical name: wheel}."""
    if not pins:
        return {}
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", *platforms]
    done = subprocess.run([*cmd, "-d", str(dest), *pins], capture_output=True, text=True)
    if done.returncode != 0:
        raise KitError(f"pip download failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    wheels: dict[str, Path] = {}
    for path in sorted(dest.glob("*.whl")):
        if wheel_name(path) in wheels:
            raise KitError(f"two wheels of {wheel_name(path)} in {dest}: keep one")
        wheels[wheel_name(path)] = path
    missing = [p for p in pins if norm(p.split("==")[0]) not in wheels]
    if missing:
        raise KitError(f"pip download left out {', '.join(missing)}")
    return wheels


def repack(wheel: Path, out: Path, prune: Sequence[str]) -> dict[str, Any]:
    """Write the files of ``wheel`` as ``out`` (a ``.tar.xz``, file modes kept), without
    the paths starting with ``prune`` or ending with :data:`DROP_SUFFIXES`, for unpacking
    into a ``--target`` folder as ``pip`` would install it (a wheel with a ``.data`` folder
    cannot be: KitError). Returns what was dropped, and the bytes dropped and kept."""
    kept = dropped = 0
    with zipfile.ZipFile(wheel) as zf, tarfile.open(out, "w:xz", preset=XZ_PRESET) as tar:
        for info in zf.infolist():
            if info.is_dir():
                continue
            if info.filename.split("/", 1)[0].endswith(".data"):
                raise KitError(f"{wheel.name} installs files outside site-packages: not repacked")
            if info.filename.startswith(tuple(prune)) or info.filename.endswith(DROP_SUFFIXES):
                dropped += info.file_size
                continue
            entry = tarfile.TarInfo(info.filename)
            entry.size = info.file_size
            entry.mode = (info.external_attr >> 16) & 0o777 or 0o644
            entry.mtime = 0
            with zf.open(info) as f:
                tar.addfile(entry, f)
            kept += info.file_size
    dropped_paths = [*prune, *(f"*{s}" for s in DROP_SUFFIXES)]
    return {"dropped": dropped_paths, "dropped_bytes": dropped, "kept_bytes": kept}


def fallback_candidates(p: Plan) -> dict[str, str]:
    """{name: specifier} of the machine's packages that carried packages ask a version of,
    small enough to carry a fallback wheel of (not :data:`NOT_CARRIED`)."""
    return {
        name: ",".join(spec for spec, _ in specs)
        for name, specs in sorted(p.needs.items())
        if name not in NOT_CARRIED
    }


def size_of(paths: Iterable[Path]) -> int:
    """The bytes of the files among ``paths``."""
    return sum(p.stat().st_size for p in paths if p.is_file())


def travelling_tree(root: Path, skip: Path | None = None) -> tuple[int, list[tuple[int, str]]]:
    """Bytes of the working tree that a device call sends (tracked files and untracked ones
    git does not ignore, as they are on disk; none under ``skip``) and its three biggest
    folders (two levels down)."""
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
    )
    if done.returncode != 0:
        return 0, []
    folders: dict[str, int] = {}
    total = 0
    for rel in {r for r in done.stdout.decode().split("\0") if r}:
        path = root / rel
        if skip is not None and path.is_relative_to(skip):
            continue
        if path.is_file() and not path.is_symlink():
            size = path.stat().st_size
            total += size
            key = "/".join(rel.split("/")[:3][:-1]) or rel
            folders[key] = folders.get(key, 0) + size
    return total, sorted(((s, k) for k, s in folders.items()), reverse=True)[:3]


def tracked_but_ignored(root: Path) -> int:
    """Bytes of the tracked files that ``.gitignore`` matches (committed before the rule, as
    the old round logs under ``bench/results``): a call sends them while they are tracked."""
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--ignored", "--exclude-standard"],
        cwd=root,
        capture_output=True,
    )
    paths = [root / r for r in done.stdout.decode().split("\0") if r]
    return size_of(p for p in paths if not p.is_symlink()) if done.returncode == 0 else 0


def prepare_dest(dest: Path) -> None:
    """Empty ``dest`` for a new kit: an earlier kit (a folder with a manifest) or an empty
    folder is removed; anything else is refused (KitError)."""
    if dest.exists():
        if any(dest.iterdir()) and not (dest / MANIFEST).is_file():
            raise KitError(f"{dest} exists and is not a kit (no {MANIFEST}): not replaced")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)


def build(
    dest: Path,
    python_version: str,
    kinds: Path,
    limit_mib: float = LIMIT_MIB,
    dists: Dists = installed,
    fetch: Callable[[Sequence[str], Path, str], dict[str, Path]] = download,
    requirements: Sequence[str] | None = None,
    no_fallback: Iterable[str] = (),
) -> dict[str, Any]:
    """Build the kit in ``dest`` (see the module's docstring) for ``requirements`` (default:
    :func:`roots` of the project) with the versions of ``dists``, the wheels from ``fetch``
    (:func:`download`), without fallback wheels of ``no_fallback``; its manifest. KitError
    when it cannot be built or is over ``limit_mib``."""
    if not kinds.is_file():
        raise KitError(f"{kinds} not found: give the machine's package list with --kinds")
    reqs = roots(ROOT / "pyproject.toml") if requirements is None else requirements
    p = plan(reqs, preinstalled(kinds.read_text()), dists, python_version)
    prepare_dest(dest)
    plain = {n: v for n, v in p.kit.items() if n not in REPACK}
    wheels = fetch([f"{n}=={v}" for n, v in sorted(plain.items())], dest, python_version)
    kit: dict[str, dict[str, Any]] = {
        n: {"version": v, "file": wheels[n].name} for n, v in sorted(plain.items())
    }
    with tempfile.TemporaryDirectory(prefix="devkit-") as tmp:
        for name in sorted(set(REPACK) & set(p.kit)):
            whl = fetch([f"{name}=={p.kit[name]}"], Path(tmp), python_version)[name]
            tag = whl.name.split("-")[2]  # the Python tag: cp312
            out = dest / f"{name}-{p.kit[name]}-{tag}-pruned.tar.xz"
            print(f"repacking {whl.name} ({whl.stat().st_size / MIB:.1f} MiB) as {out.name}")
            kit[name] = {"version": p.kit[name], "file": out.name, "repacked_from": whl.name}
            kit[name] |= repack(whl, out, REPACK[name])
    needs = []
    refused = {norm(n) for n in no_fallback}
    candidates = {n: s for n, s in fallback_candidates(p).items() if n not in refused}
    pins = [f"{n}=={v}" for n in candidates if (v := _version_or_none(dists, n))]
    got = fetch(pins, dest / "fallback", python_version) if pins else {}
    for name, specs in sorted(p.needs.items()):
        entry: dict[str, Any] = {
            "name": name,
            "specifier": ",".join(s for s, _ in specs),
            "required_by": sorted({b for _, b in specs}),
            "file": None,
        }
        carried = got.get(name)
        if name in refused:
            entry["not_carried"] = "--no-fallback"
        elif name not in candidates:
            entry["not_carried"] = "big: the machine's own is used"
        elif carried is None:
            entry["not_carried"] = "not installed here"
        elif carried.stat().st_size > FALLBACK_MAX and name not in ALWAYS_CARRY:
            entry["not_carried"] = f"big ({carried.stat().st_size / MIB:.1f} MiB)"
            carried.unlink()
        else:
            entry["version"] = _version_or_none(dists, name)
            entry["file"] = f"fallback/{carried.name}"
        needs.append(entry)
    size = size_of(dest.rglob("*"))
    manifest = {
        "python": python_version,
        "kind": KIND,
        "built_with": f"{sys.executable} ({'.'.join(map(str, sys.version_info[:3]))})",
        "kinds_file": str(kinds),
        "kit": kit,
        "excluded": p.excluded,
        "needs": needs,
        "size_bytes": size,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if size > limit_mib * MIB:
        raise KitError(
            f"the kit in {dest} is {size / MIB:.1f} MiB, over the {limit_mib:g} MiB a device "
            "call can carry beside the working tree (64 MiB in all): prune more (REPACK)"
        )
    return manifest


def _version_or_none(dists: Dists, name: str) -> str | None:
    try:
        return dists(name)[0]
    except KitError:
        return None


def report(manifest: dict[str, Any], dest: Path) -> str:
    """What ``build`` prints: the kit's contents and size, the fallbacks, and the working
    tree that travels with it against a device call's 64 MiB."""
    size = manifest["size_bytes"]
    lines = [f"kit for Python {manifest['python']} in {dest}: {len(manifest['kit'])} packages"]
    for name, k in manifest["kit"].items():
        f = dest / k["file"]
        lines.append(f"  {name} {k['version']}: {k['file']} ({f.stat().st_size / MIB:.2f} MiB)")
    for name, why in manifest["excluded"].items():
        lines.append(f"  left out: {name} ({why})")
    for n in manifest["needs"]:
        where = n["file"] or f"not carried: {n['not_carried']}"
        by = ", ".join(n["required_by"])
        lines.append(f"  the machine's {n['name']} {n['specifier']} ({by}): {where}")
    tree, biggest = travelling_tree(ROOT, skip=dest)
    lines.append(f"kit size: {size / MIB:.1f} MiB ({size} bytes)")
    total = tree + size
    lines.append(
        f"working tree that travels: {tree / MIB:.1f} MiB; with the kit {total / MIB:.1f} MiB "
        f"of a device call's {CALL_LIMIT_MIB:g} MiB"
    )
    if total > CALL_LIMIT_MIB * MIB:
        lines.append(
            "WARNING: over the limit: a device call would be refused. Biggest folders: "
            + ", ".join(f"{k} ({s / MIB:.1f} MiB)" for s, k in biggest)
        )
        if ignored := tracked_but_ignored(ROOT):
            lines.append(
                f"  {ignored / MIB:.1f} MiB of it are tracked files that .gitignore matches; "
                f"untracked for the call (docs/gpu.md) {(total - ignored) / MIB:.1f} MiB travel"
            )
    return "\n".join(lines)


def choose_fallbacks(
    needs: Sequence[Mapping[str, Any]], version_of: Callable[[str], str | None]
) -> tuple[list[str], list[str]]:
    """The fallback wheels to install (files relative to the kit) and one line per need
    (``ok``, ``fallback`` or ``WARNING``): a fallback when the machine's version
    (``version_of``: None when it lacks the package) does not fit the specifier."""
    files, lines = [], []
    for n in needs:
        have = version_of(n["name"])
        spec = SpecifierSet(n["specifier"])
        fits = have is not None and _fits(spec, have)
        what = f"{n['name']} {n['specifier']} ({', '.join(n['required_by'])}): here {have}"
        if fits:
            lines.append(f"ok       {what}")
        elif n.get("file"):
            files.append(n["file"])
            lines.append(f"fallback {what}: installing {n['version']}")
        else:
            lines.append(f"WARNING  {what}: outside it, and not carried ({n['not_carried']})")
    return files, lines


def _fits(spec: SpecifierSet, version: str) -> bool:
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def console_scripts(site: Path, names: Iterable[str]) -> list[str]:
    """The console scripts of the distributions ``names`` installed in ``site`` (their
    ``entry_points.txt``)."""
    wanted, scripts = {norm(n) for n in names}, []
    for info in site.glob("*.dist-info"):
        if norm(info.name.removesuffix(".dist-info").rsplit("-", 1)[0]) not in wanted:
            continue
        eps = info / "entry_points.txt"
        section = ""
        for line in eps.read_text().splitlines() if eps.is_file() else []:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[console_scripts]" and "=" in line:
                scripts.append(line.split("=", 1)[0].strip())
    return sorted(scripts)


def install(kit: Path, target: Path, say: Callable[[str], None] = print) -> None:
    """Install the kit ``kit`` into ``target`` for this interpreter (see the module's
    docstring), reporting each decision through ``say``. KitError when it cannot."""
    manifest_text = (kit / MANIFEST).read_text() if (kit / MANIFEST).is_file() else None
    if manifest_text is None:
        raise KitError(f"no kit in {kit} (no {MANIFEST}): build it with bench/device_kit.sh")
    manifest = json.loads(manifest_text)
    here = ".".join(map(str, sys.version_info[:2]))
    if manifest["python"] != here:
        raise KitError(
            f"the kit in {kit} is for Python {manifest['python']}, this is {here} "
            f"({sys.executable}): build it with --python-version {here}"
        )
    digest = hashlib.sha256(manifest_text.encode()).hexdigest()
    stamp = target / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("sha256") == digest:
        say(f"the kit is already installed in {target}")
        return
    files, lines = choose_fallbacks(manifest["needs"], installed_version)
    for line in lines:
        say(line)
    wheels = {n: k["file"] for n, k in manifest["kit"].items() if k["file"].endswith(".whl")}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(target)]
    cmd += [str(kit / f) for f in [*wheels.values(), *files]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise KitError(f"pip install failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    say(f"installed {len(wheels) + len(files)} wheels in {target}")
    for k in manifest["kit"].values():
        if k["file"].endswith(".tar.xz"):
            with tarfile.open(kit / k["file"], "r:xz") as tar:
                if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                    tar.extractall(target, filter="data")
                else:
                    tar.extractall(target)
            say(f"unpacked {k['file']} in {target}")
    # the wheels' scripts (pip writes them); a repacked package's are not made (Ray's CLI)
    scripts = console_scripts(target, wheels)
    missing = [s for s in scripts if not (target / "bin" / s).is_file()]
    if missing:
        raise KitError(f"console scripts missing from {target / 'bin'}: {', '.join(missing)}")
    say(f"{len(scripts)} console scripts in {target / 'bin'}")
    stamp.write_text(json.dumps({"sha256": digest, "python": here}) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("build", "plan"):
        s = sub.add_parser(name)
        s.add_argument("--python-version", default="3.12", help="the machine's Python (3.12)")
        s.add_argument("--kinds", type=Path, default=KINDS, help="the machine's package list")
        if name == "build":
            s.add_argument("--dest", type=Path, default=ROOT / ".devkit")
            s.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
            s.add_argument(
                "--no-fallback",
                action="append",
                default=[],
                metavar="NAME",
                help="carry no fallback wheel of NAME (repeatable; grpcio saves 7 MiB)",
            )
    s = sub.add_parser("install")
    s.add_argument("--kit", type=Path, default=ROOT / ".devkit")
    s.add_argument("--target", type=Path, default=Path("/tmp/site"))
    return p


def main(argv: list[str] | None = None) -> str | None:
    """Run a command; None, or why it failed (``sys.exit`` prints it and exits 1)."""
    args = parser().parse_args(argv)
    try:
        if args.command == "plan":
            if not args.kinds.is_file():
                return f"{args.kinds} not found: give the machine's package list with --kinds"
            present = preinstalled(args.kinds.read_text())
            p = plan(roots(ROOT / "pyproject.toml"), present, installed, args.python_version)
            for name, version in sorted(p.kit.items()):
                print(f"{name}=={version}")
            for name, specs in sorted(p.needs.items()):
                print(f"# the machine's {name} {','.join(s for s, _ in specs)}")
            for name, why in p.excluded.items():
                print(f"# left out: {name} ({why})")
        elif args.command == "build":
            dest = args.dest.resolve()
            manifest = build(
                dest, args.python_version, args.kinds, args.limit_mib, no_fallback=args.no_fallback
            )
            print(report(manifest, dest))
        else:
            install(args.kit, args.target)
    except KitError as err:
        return str(err)
    return None


if __name__ == "__main__":
    sys.exit(main())
