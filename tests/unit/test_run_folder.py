"""``train``'s output folder holds one run (issue 32): another model's run is refused unless
``--overwrite``, the same model's is replaced without leaving its files mixed in, ``--resume`` keeps it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipetrain.cli import main
from pipetrain.cli.run_folder import RUN_RECORD, claim_folder
from pipetrain.errors import UserError


def _old_run(folder: Path, model: str = "gpt-tiny", fingerprint: str = "f" * 64) -> None:
    claim_folder(folder, model, fingerprint, overwrite=False, resume=False)
    for name in ("metrics.csv", "plan.json", "loss.png"):
        (folder / name).write_text("old")
    (folder / "notes.txt").write_text("mine")


def test_another_models_run_is_refused_and_overwrite_replaces_it(tmp_path: Path) -> None:
    _old_run(tmp_path)
    refusal = r"holds a run of gpt-tiny \(ffffffffffff\), not of mlp-digits \(aaaaaaaaaaaa\): pass another --out-dir"
    with pytest.raises(UserError, match=refusal + ", or --overwrite"):
        claim_folder(tmp_path, "mlp-digits", "a" * 64, overwrite=False, resume=False)
    assert (tmp_path / "metrics.csv").read_text() == "old"  # a refusal touches nothing
    claim_folder(tmp_path, "mlp-digits", "a" * 64, overwrite=True, resume=False)
    assert not (tmp_path / "metrics.csv").exists() and not (tmp_path / "plan.json").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only the run's own files go
    assert json.loads((tmp_path / RUN_RECORD).read_text())["model"] == "mlp-digits"


def test_the_same_model_is_replaced_and_resume_keeps_the_run(tmp_path: Path) -> None:
    _old_run(tmp_path)
    claim_folder(tmp_path, "gpt-tiny", "f" * 64, overwrite=False, resume=True)
    assert (tmp_path / "metrics.csv").read_text() == "old"  # its rows continue
    claim_folder(tmp_path, "gpt-tiny", "f" * 64, overwrite=False, resume=False)
    assert not (tmp_path / "metrics.csv").exists()


def test_a_run_of_an_earlier_pipetrain_counts_as_another(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_text("step,loss\n")
    with pytest.raises(UserError, match=r"holds a run of an earlier pipetrain \(no run.json\)"):
        claim_folder(tmp_path, "gpt-tiny", "f" * 64, overwrite=False, resume=False)
    claim_folder(tmp_path / "fresh", "gpt-tiny", "f" * 64, overwrite=False, resume=False)  # a new folder is fine


def test_train_refuses_before_profiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _old_run(tmp_path / "run", "mlp-digits", "a" * 64)
    code = main(["train", "--model", "gpt-tiny", "--steps", "2", "--out-dir", str(tmp_path / "run")])
    assert code == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "holds a run of mlp-digits" in said and "--overwrite" in said
