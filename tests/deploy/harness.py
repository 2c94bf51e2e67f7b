"""Run the services of docker/docker-compose.yml as real processes on "hosts" made of Linux
network namespaces, without a container engine.

What a container would give a service, and how it is reproduced here:

- its own network stack and address: every service that is not ``network_mode: service:X``
  gets a network namespace with one veth interface on a bridge (the bridge lives in a
  namespace of its own, so the machine's network is never touched); ``service:X`` shares
  X's namespace, ``none`` gets a namespace with loopback only;
- name resolution of the other services: ``/etc/netns/<ns>/hosts`` (``ip netns exec``
  bind-mounts it over ``/etc/hosts``), so ``superlink:9092`` resolves as in Docker and TLS
  checks the name ``superlink`` against the certificate;
- its volumes: every named volume is a folder under the work folder; container paths in
  commands and environment values are rewritten to those folders (``/app`` is the
  repository, other ``/srv/fl`` paths a private folder of the service; ``:ro`` is not
  enforced, everything runs as root);
- its image: the environment of the Dockerfile's ``ENV`` lines, the project's virtualenv
  on ``PATH``.

Commands, entrypoints, environment, volumes, healthchecks and ``depends_on`` conditions come
from the compose file itself, so the test exercises the very commands of the demo.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

#: Container paths that are rewritten (``/app`` is the image's copy of the repository).
CONTAINER_ROOTS = ("/srv/fl", "/app")
_PATH_RE = re.compile(
    r"""(^|[\s'"=])((?:"""
    + "|".join(map(re.escape, CONTAINER_ROOTS))
    + r""")(?:/[^\s'",]*)?)(?=[\s'",]|$)"""
)
_VAR_RE = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    """Compose-style ``${VAR}``, ``${VAR:-default}`` and ``$$`` substitution."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(3)
        default = m.group(2) if m.group(2) is not None else ""
        return variables.get(name) or default

    return _VAR_RE.sub(sub, value)


def dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The ``ENV key=value`` settings of a Dockerfile (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().startswith("ENV "):
            for token in shlex.split(line.strip()[4:]):
                key, sep, val = token.partition("=")
                if sep:
                    env[key] = val
    return env


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch; None if it has exited.

    ``/proc/<pid>/stat`` gives the start in clock ticks on the boot clock; it is moved to
    the wall clock through the current offset between the two (``/proc/stat``'s ``btime``
    is whole seconds only, too coarse to order a process against a file write)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
    since_boot = ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + since_boot


def run_checked(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout)


def wait_for(
    what: str, cond: Callable[[], bool], timeout: float, logs: Callable[[], str], every: float = 0.5
) -> None:
    """Poll ``cond`` every ``every`` seconds; after ``timeout``, fail with ``logs()``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs()}")
        time.sleep(every)


@dataclass
class Proc:
    """A started service process (its own process group) and its log file."""

    service: str
    popen: subprocess.Popen[bytes]
    log: Path
    handle: IO[bytes]
    started: float = field(default_factory=time.time)

    def alive(self) -> bool:
        return self.popen.poll() is None


class ComposeHosts:
    """Services of a compose file on network namespaces (see the module docstring)."""

    def __init__(
        self,
        compose_file: Path,
        workdir: Path,
        repo: Path,
        venv_bin: Path,
        variables: Mapping[str, str] | None = None,
        subnet: str = "10.77.0",
    ) -> None:
        self.compose_file = compose_file
        self.compose = yaml.safe_load(compose_file.read_text())
        self.services: dict[str, dict[str, Any]] = self.compose["services"]
        self.workdir = workdir
        self.repo = repo
        self.venv_bin = venv_bin
        self.variables = dict(variables or {})
        self.image_env = dockerfile_env(repo / "docker" / "Dockerfile")
        self.subnet = subnet
        self.tag = f"flt{os.getpid() % 100000}"
        self.switch = f"{self.tag}-sw"
        self.namespaces: list[str] = []
        self.ns_of: dict[str, str] = {}
        self.ip_of: dict[str, str] = {}
        self.procs: dict[str, Proc] = {}
        self.finished: dict[str, subprocess.CompletedProcess[str]] = {}
        self._next_ip = 10
        self._runs = itertools.count()
        self._made_etc_netns = not Path("/etc/netns").exists()

    # ------------------------------------------------------------------ network
    def _ns_add(self, name: str) -> None:
        run_checked(["ip", "netns", "add", name])
        self.namespaces.append(name)
        run_checked(["ip", "-n", name, "link", "set", "lo", "up"])

    def create_network(self) -> None:
        """One namespace per networked service, all on one bridge; /etc/netns hosts files."""
        self._ns_add(self.switch)
        run_checked(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        run_checked(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for name, spec in self.services.items():
            mode = str(spec.get("network_mode", ""))
            if mode.startswith("service:"):
                continue
            self.add_host(name, networked=mode != "none")
        for name, spec in self.services.items():
            mode = str(spec.get("network_mode", ""))
            if mode.startswith("service:"):
                self.ns_of[name] = self.ns_of[mode.split(":", 1)[1]]
        self.write_hosts_files()

    def add_host(self, name: str, networked: bool = True) -> str:
        """A new namespace ("host") for ``name``, with an address on the bridge."""
        ns = f"{self.tag}-{len(self.namespaces)}"
        self._ns_add(ns)
        self.ns_of[name] = ns
        if networked:
            ip = f"{self.subnet}.{self._next_ip}"
            self._next_ip += 1
            port = f"p{len(self.namespaces)}"
            run_checked(
                ["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                 "netns", self.switch]
            )  # fmt: skip
            run_checked(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
            run_checked(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            run_checked(["ip", "-n", ns, "link", "set", "eth0", "up"])
            self.ip_of[name] = ip
        return ns

    def write_hosts_files(self) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{ip} {name}" for name, ip in self.ip_of.items()]
        for ns in set(self.ns_of.values()):
            d = Path("/etc/netns") / ns
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ paths and env
    def _mounts(self, service: str) -> list[tuple[str, Path]]:
        out = []
        for item in self.services[service].get("volumes", []):
            parts = interpolate(str(item), self.variables).split(":")
            src, dst = parts[0], parts[1]
            if src.startswith((".", "/", "~")):
                host = (self.compose_file.parent / Path(src).expanduser()).resolve()
            else:
                host = self.workdir / "volumes" / src
            host.mkdir(parents=True, exist_ok=True)
            out.append((dst.rstrip("/"), host))
        return sorted(out, key=lambda m: -len(m[0]))

    def rootfs(self, service: str) -> Path:
        path = self.workdir / "rootfs" / service
        path.mkdir(parents=True, exist_ok=True)
        return path

    def host_path(self, service: str, path: str) -> Path:
        """Where the container path ``path`` of ``service`` lives on this machine."""
        for dst, host in self._mounts(service):
            if path == dst or path.startswith(dst + "/"):
                return host / path[len(dst) :].lstrip("/")
        if path == "/app" or path.startswith("/app/"):
            return self.repo / path[len("/app") :].lstrip("/")
        return self.rootfs(service) / path.lstrip("/")

    def translate(self, service: str, text: str) -> str:
        text = interpolate(text, self.variables)
        return _PATH_RE.sub(lambda m: m.group(1) + str(self.host_path(service, m.group(2))), text)

    def environment(self, service: str) -> dict[str, str]:
        env = {
            "PATH": f"{self.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.rootfs(service) / "home" / "app"),
            "LANG": "C.UTF-8",
        }
        # the image's virtualenv (/opt/venv, first on its PATH) is the project's venv here
        env.update({k: v for k, v in self.image_env.items() if k not in ("PATH", "VIRTUAL_ENV")})
        raw = self.services[service].get("environment", {}) or {}
        if isinstance(raw, list):
            raw = dict(str(x).partition("=")[::2] for x in raw)
        env.update({k: str(v) for k, v in raw.items()})
        env = {k: self.translate(service, v) for k, v in env.items()}
        for key in ("HOME", "FLWR_HOME"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        return env

    def argv(self, service: str, command: Iterable[str] | None = None) -> list[str]:
        """Entrypoint + command of ``service`` (``command`` overrides the compose one)."""
        spec = self.services[service]

        def as_list(value: Any) -> list[str]:
            if value is None:
                return []
            return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]

        cmd = list(command) if command is not None else as_list(spec.get("command"))
        return [self.translate(service, a) for a in as_list(spec.get("entrypoint")) + cmd]

    # ------------------------------------------------------------------ processes
    def start(
        self, service: str, command: Iterable[str] | None = None, key: str | None = None
    ) -> Proc:
        """Start ``service`` (or ``command`` in its container) in the background; ``key``
        names the process when several run in one service (default: the service)."""
        key = key or service
        log = self.workdir / "logs" / f"{key}-{int(time.time() * 1000)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = log.open("wb")
        popen = subprocess.Popen(
            ["ip", "netns", "exec", self.ns_of[service], *self.argv(service, command)],
            env=self.environment(service),
            cwd=self.rootfs(service),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        proc = Proc(service, popen, log, handle)
        self.procs[key] = proc
        return proc

    def run(
        self, service: str, command: Iterable[str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``service`` (or ``command`` in it) to completion, like ``docker compose run``."""
        key = f"{service}-run{next(self._runs)}"
        proc = self.start(service, command, key=key)
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(key)
            raise
        finally:
            proc.handle.close()
        out = proc.log.read_text(errors="replace")
        result = subprocess.CompletedProcess(proc.popen.args, proc.popen.returncode, out, "")
        self.finished[service] = result
        self.procs.pop(key, None)
        return result

    def healthy(self, service: str) -> bool:
        test = self.services[service]["healthcheck"]["test"]
        argv = [self.translate(service, a) for a in test[1:]]
        if test[0] == "CMD-SHELL":
            argv = ["sh", "-c", " ".join(argv)]
        res = subprocess.run(
            ["ip", "netns", "exec", self.ns_of[service], *argv],
            env=self.environment(service),
            capture_output=True,
            timeout=30,
        )
        return res.returncode == 0

    def wait_healthy(self, service: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy(service):
            proc = self.procs.get(service)
            if proc is None or not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{service} did not become healthy; log:\n{self.tail(service)}")
            time.sleep(1)

    def _depends(self, service: str) -> list[tuple[str, str]]:
        deps = self.services[service].get("depends_on", {}) or {}
        if isinstance(deps, list):
            return [(d, "service_started") for d in deps]
        return [(d, (c or {}).get("condition", "service_started")) for d, c in deps.items()]

    def _satisfy(self, dep: str, condition: str, timeout: float) -> None:
        if condition == "service_completed_successfully":
            if dep not in self.finished:
                for d, c in self._depends(dep):
                    self._satisfy(d, c, timeout)
                res = self.run(dep, timeout=timeout)
                if res.returncode != 0:
                    raise RuntimeError(f"{dep} exited with {res.returncode}:\n{res.stdout}")
            return
        self.up(dep, timeout)
        if condition == "service_healthy":
            self.wait_healthy(dep, timeout)

    def up(self, service: str, timeout: float = 120) -> None:
        """Start ``service`` after its ``depends_on`` services, honouring their conditions
        (``service_completed_successfully``: run to completion first; ``service_healthy``:
        wait for the healthcheck). A running service is left alone."""
        if service in self.procs:
            return
        for dep, condition in self._depends(service):
            self._satisfy(dep, condition, timeout)
        self.start(service)

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        """Kill the process group of process ``key`` (a service name or a ``start`` key):
        the process and everything it started."""
        proc = self.procs.pop(key, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, sig)
        try:
            proc.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)
        proc.handle.close()

    def crash_host(self, service: str) -> None:
        """Power loss of ``service``'s host: SIGKILL every process in its namespace."""
        ns = self.ns_of[service]
        for key, proc in list(self.procs.items()):
            if self.ns_of[proc.service] == ns:
                self.kill(key)
        self._kill_namespace(ns)

    def take_down(self, service: str) -> None:
        """A container that crashed: its processes killed (:meth:`crash_host`), and its name
        no longer resolves for the others, as with Docker's DNS while it is down."""
        self.crash_host(service)
        self.ip_of.pop(service, None)
        self.write_hosts_files()

    def restart_container(self, service: str, timeout: float = 120) -> None:
        """Docker's restart of ``service`` after :meth:`take_down`: a new network namespace
        with a new address, which its name now resolves to everywhere (the hosts files are
        rewritten in place, so running processes see it), then its command again."""
        self.add_host(service)
        self.write_hosts_files()
        self.up(service, timeout)

    def _kill_namespace(self, ns: str) -> None:
        res = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10
        )
        for pid in res.stdout.split():  # every process in our namespaces is one of ours
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def ns_processes(self, service: str) -> dict[int, str]:
        """Command line of every process in ``service``'s namespace, by pid."""
        res = subprocess.run(
            ["ip", "netns", "pids", self.ns_of[service]], capture_output=True, text=True, timeout=10
        )
        out = {}
        for pid in res.stdout.split():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                out[int(pid)] = raw.replace(b"\0", b" ").decode(errors="replace")
        return out

    def ns_processes_started_after(self, service: str, wall_time: float) -> dict[int, str]:
        """The processes of ``ns_processes`` that started after ``wall_time`` (seconds since
        the epoch, e.g. a file's mtime), to the kernel's clock tick."""
        return {
            pid: cmd
            for pid, cmd in self.ns_processes(service).items()
            if (start := started_at(pid)) is not None and start > wall_time
        }

    def tails(self, n: int = 25) -> str:
        """The last ``n`` lines of every service's log, each under its name."""
        return "\n".join(f"--- {k}\n{self.tail(k, n)}" for k in self.procs)

    def tail(self, service: str, n: int = 60) -> str:
        logs = sorted((self.workdir / "logs").glob(f"{service}-*.log"))
        if not logs:
            return "(no log)"
        return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-n:])

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Kill every process started here, delete the namespaces and hosts files."""
        for service in list(self.procs):
            self.kill(service)
        for ns in self.namespaces:
            self._kill_namespace(ns)
        time.sleep(0.5)
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self.namespaces.clear()
        if self._made_etc_netns:
            with contextlib.suppress(OSError):
                Path("/etc/netns").rmdir()
