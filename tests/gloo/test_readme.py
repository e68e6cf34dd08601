"""Every code block of README.md, and every script in examples/, runs as written.

Each block runs in a fresh temporary folder that links ``examples/`` and ``README.md`` (the text that
``--data text:README.md`` trains on) from the repository, with the
repository on ``PYTHONPATH`` and this interpreter's ``bin/`` first on ``PATH`` (so ``python`` and
``pipetrain`` are this checkout's). It may write only under ``out/`` there: run from the
repository's root, as a reader would, it leaves nothing git does not ignore. The kinds of block:

- ``python``: saved as a script and run with ``python``; it must exit 0.
- ``bash``: each command in turn (one folder for the block, as a reader would type them), except
  those in :data:`SKIPPED`, each with its reason; every command must exit 0.
- ``yaml``: a cluster spec; it parses, and it is the file ``examples/clusters/<name>.yaml`` it quotes.
- no language, first line ``$ command``: a transcript; the command prints the lines shown.
- no language otherwise: a diagram, not run.

Blocks and scripts that train spawn ranks and are marked slow. A training run keeps about one core
busy (its ranks mostly wait for each other), so the runs of the selected tests start together,
:data:`AT_ONCE` at a time, and each test waits for its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipetrain.cluster_spec import parse_cluster_spec

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240  # one command
AT_ONCE = 2

SKIPPED: dict[str, str] = {
    "make demo": "several minutes: creates .venv, installs, then profiles, plans and trains gpt-tiny for 300 steps",
    "make test": "runs lint, type checks and the whole test suite, this test included",
    "python examples/custom_model.py": "test_example runs every script of examples/",
    "pipetrain train --model examples.hf_gpt2:build": "the README's next block trains the same model the same "
    "way in Python; tests/unit/test_hf_capture.py parses --data text:PATH with --context and --tokenizer",
}
"""Commands of ``bash`` blocks that are not run, each with the reason."""


@dataclass(frozen=True)
class Block:
    """A fenced code block of README.md: its language (``""`` if none), text and first line."""

    language: str
    text: str
    line: int

    @property
    def id(self) -> str:
        return f"{self.language or 'plain'}-line{self.line}"

    @property
    def trains(self) -> bool:
        """Whether it spawns ranks (slow)."""
        return re.search(r"\btrain\(|pipetrain train\b", self.text) is not None


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    language: str | None = None
    start, body = 0, list[str]()
    for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), start=1):
        if line.startswith("```"):
            if language is None:
                language, start, body = line[3:].strip(), number, []
            else:
                blocks.append(Block(language, "\n".join(body) + "\n", start))
                language = None
        elif language is not None:
            body.append(line)
    assert language is None, f"README.md: the block opened on line {start} is never closed"
    return blocks


def of_kind(*languages: str) -> list[Any]:
    """The blocks in ``languages`` as test parameters; those that train are marked slow."""
    return [pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.trains else [])
            for b in readme_blocks() if b.language in languages]


def commands(block: Block) -> list[str]:
    """The block's commands: one a line (``\\`` continues a line), comments and blank lines dropped."""
    joined = block.text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def skip_reason(command: str) -> str | None:
    return next((reason for prefix, reason in SKIPPED.items() if command.startswith(prefix)), None)


# ---- running ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """Commands to run in order in one fresh folder, after writing ``script`` (if any) there."""

    commands: tuple[str, ...]
    script: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The command that failed (or the last one) and its result; ``ran`` commands in all; ``left``
    what the job wrote in its folder outside ``out/`` (a reader's tree would keep it)."""

    command: str
    result: subprocess.CompletedProcess[str] | None
    ran: int
    left: tuple[str, ...] = ()


SCRIPT = "readme_block.py"


def job_of(params: dict[str, Any]) -> Job | None:
    """The job of a test's parameters, or None for a test that runs nothing in the background."""
    if "script" in params:
        return Job((f"python examples/{params['script'].name}",))
    block: Block = params["block"]
    if block.language == "python":
        return Job((f"python {SCRIPT}",), block.text)
    if block.language == "bash":
        return Job(tuple(c for c in commands(block) if skip_reason(c) is None))
    return None


def run(command: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """``command`` in ``cwd``; `plan`'s probes of this machine are kept in ``cache``, one folder for every
    block, so blocks that plan the same model probe it once (as a reader's commands would)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PIPETRAIN_CACHE_DIR": str(cache)}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          shell=True, executable="/bin/bash")


def prepare(folder: Path) -> Path:
    """``folder`` made to see the repository's examples/ as a reader at the root does."""
    (folder / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    (folder / "README.md").symlink_to(ROOT / "README.md")
    return folder


def perform(job: Job, folder: Path, cache: Path) -> Outcome:
    if job.script is not None:
        (folder / SCRIPT).write_text(job.script)
    outcome = Outcome("", None, 0)
    for command in job.commands:
        outcome = Outcome(command, run(command, folder, cache), outcome.ran + 1)
        if outcome.result is not None and outcome.result.returncode != 0:
            break
    left = tuple(sorted(p.name for p in folder.iterdir() if p.name not in ("examples", "README.md", "out", SCRIPT)))
    return Outcome(outcome.command, outcome.result, outcome.ran, left)


@pytest.fixture(scope="module")
def started(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Outcome]]]:
    """The jobs of every selected test of this module, started :data:`AT_ONCE` at a time, by node id."""
    pool = ThreadPoolExecutor(max_workers=AT_ONCE)
    cache = tmp_path_factory.mktemp("probe-cache")
    futures: dict[str, Future[Outcome]] = {}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        job = job_of(params) if getattr(item, "module", None) is sys.modules[__name__] and params else None
        if job is not None:
            futures[item.nodeid] = pool.submit(perform, job, prepare(tmp_path_factory.mktemp("block")), cache)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def outcome_of(request: pytest.FixtureRequest, started: dict[str, Future[Outcome]]) -> Outcome:
    return started[request.node.nodeid].result(timeout=4 * TIMEOUT_S)


def assert_ran(outcome: Outcome, what: str) -> None:
    assert outcome.result is not None
    code, output = outcome.result.returncode, (outcome.result.stdout + outcome.result.stderr)[-4000:]
    assert code == 0, f"{what}: {outcome.command!r} exited with {code}:\n{output}"
    assert not outcome.left, f"{what} left {list(outcome.left)} in the tree: write under out/ (git ignores it)"


# ---- tests ------------------------------------------------------------------------------------


def test_every_block_is_of_a_known_kind() -> None:
    blocks = readme_blocks()
    assert blocks, "README.md has no code blocks"
    unknown = [b.id for b in blocks if b.language not in ("python", "bash", "yaml", "")]
    assert not unknown, f"README blocks {unknown}: teach tests/gloo/test_readme.py how to run them"
    bash = [c for b in blocks if b.language == "bash" for c in commands(b)]
    unused = [prefix for prefix in SKIPPED if not any(c.startswith(prefix) for c in bash)]
    assert not unused, f"SKIPPED names commands that README.md no longer has: {unused}"


@pytest.mark.timeout(5 * TIMEOUT_S)
@pytest.mark.parametrize("block", of_kind("python"))
def test_python_block(block: Block, request: pytest.FixtureRequest, started: dict[str, Future[Outcome]]) -> None:
    assert_ran(outcome_of(request, started), f"README.md's python block on line {block.line}")


@pytest.mark.timeout(5 * TIMEOUT_S)
@pytest.mark.parametrize("block", of_kind("bash"))
def test_bash_block(block: Block, request: pytest.FixtureRequest, started: dict[str, Future[Outcome]]) -> None:
    outcome = outcome_of(request, started)
    if not outcome.ran:
        pytest.skip("; ".join(f"{c.split('#')[0].strip()}: {skip_reason(c)}" for c in commands(block)))
    assert_ran(outcome, f"README.md's bash block on line {block.line}")


@pytest.mark.slow
@pytest.mark.timeout(5 * TIMEOUT_S)
@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example(script: Path, request: pytest.FixtureRequest, started: dict[str, Future[Outcome]]) -> None:
    assert_ran(outcome_of(request, started), f"examples/{script.name}")


@pytest.mark.parametrize("block", of_kind("yaml"))
def test_yaml_block_is_the_cluster_file_it_quotes(block: Block) -> None:
    name = parse_cluster_spec(block.text).cluster.name
    quoted = ROOT / "examples" / "clusters" / f"{name}.yaml"
    assert quoted.is_file(), f"README.md line {block.line}: cluster {name!r} has no file {quoted}"
    assert yaml.safe_load(block.text) == yaml.safe_load(quoted.read_text())


@pytest.mark.parametrize("block", [p for p in of_kind("") if p.values[0].text.startswith("$ ")])
def test_transcript_block(block: Block, tmp_path: Path) -> None:
    first, *shown = block.text.rstrip("\n").splitlines()
    result = run(first.removeprefix("$ "), prepare(tmp_path), tmp_path / "out" / "cache")
    assert (result.stdout + result.stderr).rstrip("\n").splitlines() == shown
