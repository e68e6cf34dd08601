"""Write ``core.md`` again from a core benchmark's ``core.json``, e.g. of a run stopped early.

:mod:`bench_core` rewrites ``core.json`` after every run but writes its tables only when every
round is done. This rebuilds the tables from the saved runs (whatever rounds finished: each
configuration's median is over the runs it has), with the same report code; the Gantt pictures
need the measured timelines, which ``core.json`` does not keep, so they are not redrawn.

    .venv/bin/python benchmarks/core_rerender.py benchmarks/results/core
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import Bench, Run, configs
from core_report import write_report

from pipetrain.plan.plan import Plan

__all__ = ["rerender"]


def _setup(model: dict[str, Any]) -> Any:
    """The parts of ``bench_core.ModelSetup`` the report reads, from one ``models`` entry."""
    plan = Plan.from_json(json.dumps(model["planned_plan"]))
    return SimpleNamespace(name=model["model"], batch=model["batch"], plans={"planned": plan},
                           partition_note=model["partition"], predicted_alone_s=model["predicted_speed1_s"],
                           calibration=model.get("calibration", ""))


def rerender(out: Path, note: str = "") -> str:
    """Rewrite ``out/core.md`` from ``out/core.json``; returns its text.

    Args:
        out: the benchmark's output folder.
        note: appended to the header's machine line (e.g. which rounds finished).
    """
    data = json.loads((out / "core.json").read_text())
    meta = dict(data["meta"])
    runs = [Run(**r) for r in data["runs"]]
    rounds = sorted({r.round for r in runs})
    meta["repeats"] = f"{len(rounds)} (of {meta.get('repeats')} asked){note}"
    bench = Bench([_setup(m) for m in data["models"]], configs(meta["micro"]), len(rounds), 0.0, out, meta, runs)
    return write_report(bench)


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("out", type=Path)
    p.add_argument("--note", default="", help="text added after the number of rounds in the header")
    args = p.parse_args()
    print(rerender(args.out, args.note))


if __name__ == "__main__":
    _main()
