"""``train``'s output folder holds one run, and says which: ``run.json`` names its model.

    claim_folder(Path("out/run"), "gpt-tiny", fingerprint, overwrite=False, resume=False)

Training into a folder that holds a run of *another* model is refused unless ``--overwrite`` (or
``--resume``, which continues the run there), so a new ``metrics.csv`` never sits beside another
model's ``plan.json``. A folder holding a run of the same model is taken over: the previous run's
files (:data:`RUN_FILES`) are removed first, and nothing else in the folder is touched. A folder
with a ``metrics.csv`` but no ``run.json`` was written before runs named their model; it counts as
another run.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic

__all__ = ["PLAN_FILE", "RUN_FILES", "RUN_RECORD", "claim_folder"]

RUN_RECORD = "run.json"
PLAN_FILE = "plan.json"
"""The plan ``train`` without ``--plan`` makes, as ``pipetrain plan --out`` writes it: the profile and
cluster it was made with beside it (``plan.profile.json``, ``plan.cluster.json``)."""
RUN_FILES = (RUN_RECORD, "metrics.csv", "loss.png", "measured.json", "measured_trace.json", "measured.png",
             PLAN_FILE, "plan.profile.json", "plan.cluster.json")
"""What ``pipetrain train`` writes into its folder: the record, metrics, curves, measured timeline
(JSON, Chrome trace, Gantt), and the plan, profile and cluster it planned with when it was given no plan."""


def _previous_model(folder: Path) -> str | None:
    """The model of the run ``folder`` holds, as the refusal names it, or None when it holds none."""
    record = folder / RUN_RECORD
    if record.exists():
        try:
            data = json.loads(record.read_text())
            return f"{data['model']} ({str(data['fingerprint'])[:12]})"
        except (ValueError, KeyError, TypeError):
            return f"a model its {RUN_RECORD} does not name (unreadable)"
    return "an earlier pipetrain (no run.json)" if (folder / "metrics.csv").exists() else None


def claim_folder(folder: Path, model: str, fingerprint: str, *, overwrite: bool, resume: bool) -> None:
    """Make ``folder`` this run's: refuse another model's run (unless ``overwrite`` or ``resume``), clear
    the previous run's files (not under ``resume``: its metrics continue), and write the record.

    Raises:
        UserError: ``folder`` holds a run of another model; the message names the flags that fix it.
    """
    previous = _previous_model(folder)
    this = f"{model} ({fingerprint[:12]})"
    if previous is not None and previous != this and not (overwrite or resume):
        raise UserError(f"--out-dir {folder} holds a run of {previous}, not of {this}: pass another --out-dir, "
                        "or --overwrite to replace that run's files")
    if not resume:
        for name in RUN_FILES:
            (folder / name).unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / RUN_RECORD, json.dumps({"model": model, "fingerprint": fingerprint}, indent=2))
