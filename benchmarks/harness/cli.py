"""One ``main`` for every benchmark: arguments, rounds, the record, the report.

    python benchmarks/<script>.py [--out DIR] [--quick] [--repeats N] [--seed S] [its own options]
    python benchmarks/<script>.py --rereport benchmarks/results/<name>/<stem>.json

A run lists its settings, then makes ``repeats`` rounds over them, each round starting one setting
later than the last (so that when A and B are compared, A runs first in half the rounds). The
record is rewritten after every setting; at the end the experiment's report renders the markdown,
headlines and charts (:mod:`harness.record`). ``--rereport`` renders a stored run again with the
current report code, without running anything.
"""

from __future__ import annotations

import argparse
import inspect
import random
import signal
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from .charts import draw
from .experiment import Context, Experiment, RunInfo
from .machine import REPO, command_line, commit, load_average, machine
from .record import Record, load_record, record_stem, render_markdown

__all__ = ["RESULTS", "main", "parser_for"]

RESULTS = REPO / "benchmarks" / "results"
_HARNESS_OPTIONS = ("out", "quick", "repeats", "seed", "rereport")


def parser_for(experiment: Experiment[Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=experiment.title)
    p.add_argument("--out", type=Path, default=RESULTS / experiment.name,
                   help=f"results folder (default benchmarks/results/{experiment.name})")
    p.add_argument("--quick", action="store_true", help="a small run that checks the benchmark end to end")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"rounds over every setting (default {experiment.repeats}; "
                        f"{experiment.quick_repeats} with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of python, numpy and torch (default 0)")
    p.add_argument("--rereport", type=Path, metavar="RECORD.json",
                   help="render a stored run's report again from its rows; runs nothing")
    if experiment.arguments is not None:
        experiment.arguments(p)
    return p


def _seed(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _write(record: Record, folder: Path, stem: str) -> Path:
    from pipetrain.fileio import write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.json"
    write_atomic(path, record.to_json())
    return path


def _finish(experiment: Experiment[Any], record: Record, folder: Path, stem: str) -> Path:
    """Report ``record``'s rows, draw its charts beside it, and write its JSON and markdown."""
    from pipetrain.fileio import write_atomic

    report = experiment.report(record.rows, record.run)
    files = []
    for chart in report.charts:
        name = f"{stem}-{chart.slug}.png"
        draw(chart, folder / name)
        files.append(name)
    record.apply(report, files)
    record.complete = True
    _write(record, folder, stem)
    path = folder / f"{stem}.md"
    write_atomic(path, render_markdown(record))
    return path


def _rereport(experiment: Experiment[Any], path: Path) -> int:
    record = load_record(path)
    if record.experiment != experiment.name:
        raise SystemExit(f"{path} is a record of {record.experiment!r}, not {experiment.name!r}: "
                         f"rereport it with that experiment's script")
    if not record.complete:
        record.note = (record.note + " " if record.note else "") + (
            f"The run stopped early; this reports the {len(record.rows)} rows it kept.")
    print(_finish(experiment, record, path.parent, path.stem).read_text())
    return 0


def main(experiment: Experiment[Any], argv: list[str] | None = None) -> int:
    """Run ``experiment`` from the command line (``argv``: default ``sys.argv[1:]``); returns 0."""
    script = Path(sys.argv[0]) if argv is None else Path(inspect.getfile(experiment.settings))
    argv = sys.argv[1:] if argv is None else argv
    args = parser_for(experiment).parse_args(argv)
    if args.rereport is not None:
        return _rereport(experiment, args.rereport)
    repeats = args.repeats or (experiment.quick_repeats if args.quick else experiment.repeats)
    options = {k: _jsonable(v) for k, v in vars(args).items() if k not in _HARNESS_OPTIONS}
    info = RunInfo(quick=args.quick, repeats=repeats, seed=args.seed, options=options)
    sha, dirty = commit()
    started = datetime.now(timezone.utc)
    stem = record_stem(started.strftime("%Y-%m-%d"), sha + ("-dirty" if dirty else ""), args.quick)
    record = Record(experiment.name, experiment.title, started.strftime("%Y-%m-%d %H:%M"),
                    sha + ("+dirty" if dirty else ""), command_line(script, argv),
                    {**machine(), "load_before": load_average()}, info)
    # a backgrounded run ignores SIGINT and dies on SIGTERM without cleanup: make both unwind
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    _seed(args.seed)
    ctx = Context(args, info, artifacts=args.out / stem)
    t0 = time.perf_counter()
    settings = list(experiment.settings(ctx))
    total, done = repeats * len(settings), 0
    for r in range(repeats):
        start = r % max(1, len(settings))
        for setting in settings[start:] + settings[:start]:
            rows = experiment.run(setting, replace(ctx, round=r))
            record.rows += [{**row, "round": row.get("round", r)} for row in rows]
            done += 1
            _write(record, args.out, stem)
            print(f"[{experiment.name}] {done}/{total} settings, {time.perf_counter() - t0:.0f} s", flush=True)
    record.machine["load_after"] = load_average()
    record.wall_s = round(time.perf_counter() - t0, 1)
    print(_finish(experiment, record, args.out, stem).read_text())
    return 0
