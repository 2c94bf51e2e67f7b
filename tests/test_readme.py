"""The run commands the README and docs/deployment.md show are valid as written: each
``make run``, ``fl_app.launch``, ``flwr run``, ``deploy/run.sh`` and ``deploy/local_demo.sh``
names an existing experiment and method, its ``SET`` / ``--set`` / ``--run-config`` passes the
config validation that a run starts with, its make variables are the Makefile's, and a
``--federation-config`` or ``--nodes`` has as many SuperNodes as the experiment has clients.
Shell ``for`` loops are expanded; a command with a placeholder (``METHOD=<m>``) is checked
for what it spells out.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fl_app.config import available, config_from_run_config, load_config

ROOT = Path(__file__).resolve().parent.parent
# docs/gpu.md shows only tests and bench scripts
DOCS = ("README.md", "docs/results.md", "docs/deployment.md", "docs/p3-earlier-streams.md")
MAKE_VARS = set(re.findall(r"^(\w+)\s*\?=", (ROOT / "Makefile").read_text(), re.M))
LOOP = re.compile(r"\bfor (\w+) in ([^;]+); do")
LAUNCHERS = ("fl_app.launch",)
DEPLOY_SCRIPTS = ("deploy/run.sh", "deploy/local_demo.sh")  # --experiment --method --set


@dataclass
class Command:
    where: str  # file:line
    text: str
    loops: dict[str, list[str]] = field(default_factory=dict)

    def expansions(self) -> list[str]:
        """The command once per value of the loop variables it uses."""
        used = [v for v in self.loops if f"${v}" in self.text or f"${{{v}}}" in self.text]
        out = []
        for values in itertools.product(*(self.loops[v] for v in used)):
            text = self.text
            for var, value in zip(used, values, strict=True):
                text = text.replace(f"${{{var}}}", value).replace(f"${var}", value)
            out.append(text)
        return out


def commands(doc: str, root: Path = ROOT) -> list[Command]:
    """The shell commands of the doc's ```bash blocks (continuation lines joined, with the
    ``for`` loops enclosing them) and of its inline code spans that start with a command."""
    lines = (root / doc).read_text().splitlines()
    found: list[Command] = []
    loops: dict[str, list[str]] = {}
    in_block, pending, start = False, "", 0
    for no, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_block, loops, pending = line.strip() == "```bash", {}, ""
            continue
        if not in_block:
            for span in re.findall(
                r"`((?:make run|flwr run|\S*python -m fl_app\.launch|\S*deploy/\w+\.sh)[^`]*)`",
                line,
            ):
                found.append(Command(f"{doc}:{no}", span))
            continue
        if not pending:
            start = no
        if line.rstrip().endswith("\\"):  # a continuation: join it with the next line
            pending += line.rstrip()[:-1] + " "
            continue
        pending += line
        logical, pending = pending, ""
        for var, values in LOOP.findall(logical):
            loops[var] = values.split()
        found.append(Command(f"{doc}:{start}", logical, dict(loops)))
    return found


def _words(text: str) -> list[str]:
    """The command's words, the loop syntax and comments taken off."""
    text = re.sub(r";?\s*\bdone\b", "", LOOP.sub("", text))
    return shlex.split(text, comments=True)


def _placeholder(value: str) -> bool:
    return "<" in value or "…" in value or "$" in value


def check(text: str) -> list[str]:
    """The problems of one expanded command (empty when it is valid, or not a run command)."""
    words = _words(text)
    if "make" in words and words[words.index("make") + 1 : words.index("make") + 2] == ["run"]:
        args = words[words.index("make") + 2 :]
        assigned = dict(a.split("=", 1) for a in args if "=" in a)
        problems = [f"make has no variable {k}" for k in assigned if k not in MAKE_VARS]
        return problems + _check_run(
            assigned.get("EXPERIMENT"), assigned.get("METHOD"), assigned.get("SET", "")
        )
    launcher = next((w for w in words if w in LAUNCHERS or w.endswith(DEPLOY_SCRIPTS)), None)
    if launcher is not None:
        args = words[words.index(launcher) + 1 :]
        opt = {a: b for a, b in itertools.pairwise(args) if a.startswith("--")}
        if launcher.endswith(DEPLOY_SCRIPTS):  # the scripts' defaults: smoke, fedavg
            opt.setdefault("--experiment", "smoke")
            opt.setdefault("--method", "fedavg")
        nodes = int(opt["--nodes"]) if "--nodes" in opt else None
        return _check_run(opt.get("--experiment"), opt.get("--method"), opt.get("--set", ""), nodes)
    if "flwr" in words and words[words.index("flwr") + 1 : words.index("flwr") + 2] == ["run"]:
        args = words[words.index("flwr") + 2 :]
        pairs = list(itertools.pairwise(args))
        run_config = [b for a, b in pairs if a == "--run-config"]
        federation = [b for a, b in pairs if a == "--federation-config"]
        if any(_placeholder(v) for v in run_config):
            return []
        try:
            cfg = config_from_run_config(parse_config_args(run_config))
        except ValueError as err:
            return [f"--run-config: {err}"]
        fed = parse_config_args(federation)
        nodes = fed.get("num-supernodes")
        if nodes is not None and nodes != cfg["num_clients"]:
            return [f"num-supernodes={nodes} but the experiment has {cfg['num_clients']} clients"]
    return []


def _check_run(
    experiment: str | None, method: str | None, overrides: str, nodes: int | None = None
) -> list[str]:
    """The problems of one run's experiment, method and overrides, and of its number of
    SuperNodes when the command gives one."""
    problems = []
    for kind, name in (("experiments", experiment), ("methods", method)):
        if name is not None and not _placeholder(name) and name not in available(kind):
            problems.append(f"no {kind[:-1]} {name!r} (conf/{kind}/)")
    if problems or any(_placeholder(v or "") for v in (experiment, method, overrides)):
        return problems
    try:
        cfg = load_config(experiment, method, overrides)
    except ValueError as err:
        return [str(err)]
    if nodes is not None and nodes != cfg["num_clients"]:
        return [f"--nodes {nodes} but {cfg['num_clients']} clients"]
    return []


# a command's name alone in the prose (`make run`) has nothing to check
ALL = [c for doc in DOCS for c in commands(doc) if "=" in c.text or "--" in c.text]


def test_the_docs_show_run_commands_of_every_kind():
    texts = " ".join(c.text for c in ALL)
    assert all(k in texts for k in ("make run", "fl_app.launch", "flwr run", "SET="))
    assert sum("make run" in c.text for c in ALL) >= 20


@pytest.mark.parametrize("command", ALL, ids=[c.where for c in ALL])
def test_documented_command_is_valid(command: Command):
    problems = [p for text in command.expansions() for p in check(text)]
    assert not problems, f"{command.where}: {command.text.strip()}\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("make run METHOD=fedrcl SET='client.lr=-1'", "client.lr"),
        ("make run METHODS=moon", "make has no variable METHODS"),
        ("make run EXPERIMENT=p9", "no experiment 'p9'"),
        ("python -m fl_app.launch --method mooon", "no method 'mooon'"),
        ("deploy/run.sh --connection fl --experiment smok", "no experiment 'smok'"),
        ("deploy/local_demo.sh --nodes 4 --method moon", "--nodes 4 but 3 clients"),
        ("docker compose run --rm cli /app/deploy/run.sh --set 'x.y=1'", "unknown key 'x'"),
        (
            "flwr run . --run-config \"experiment='smoke'\""
            " --federation-config 'num-supernodes=10'",
            "num-supernodes=10 but the experiment has 3 clients",
        ),
        ("flwr run . --run-config \"set='client.nope=1'\"", "client.nope"),
    ],
)
def test_the_check_finds_a_broken_command(text: str, problem: str):
    assert any(problem in p for p in check(text)), check(text)


def test_loops_are_expanded_and_placeholders_left_alone():
    cmd = Command("x", "make run EXPERIMENT=p1 METHOD=$m SEED=$k", {"m": ["a", "b"], "k": ["0"]})
    assert cmd.expansions() == [
        "make run EXPERIMENT=p1 METHOD=a SEED=0",
        "make run EXPERIMENT=p1 METHOD=b SEED=0",
    ]
    assert check("make run EXPERIMENT=p1 METHOD=<method> SEED=<k>") == []


def test_commands_are_read_from_bash_blocks_and_inline_spans(tmp_path):
    (tmp_path / "doc.md").write_text(
        "Run `make run METHOD=moon` first.\n"
        "```bash\n"
        "for m in a b; do for k in 0 1; do\n"
        "  make run METHOD=$m SEED=$k \\\n"
        '    SET="x=1"; done; done   # a comment\n'
        "```\n"
        "```\n"
        "make run METHOD=not_bash_so_not_read\n"
        "```\n"
    )
    found = commands("doc.md", tmp_path)
    assert (found[0].where, found[0].text) == ("doc.md:1", "make run METHOD=moon")
    assert len(found) == 3 and found[1].text.startswith("for m")  # checked, not a run
    loop = found[2]
    assert loop.where == "doc.md:4" and loop.loops == {"m": ["a", "b"], "k": ["0", "1"]}
    assert len(loop.expansions()) == 4
    assert _words(loop.expansions()[3])[-4:] == ["run", "METHOD=b", "SEED=1", "SET=x=1"]
