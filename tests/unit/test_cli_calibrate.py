"""``pipetrain probe --model M --calibrate``: the written cluster carries the terms fitted on M's runs."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

from pipetrain.calibrate.fit import Calibration
from pipetrain.cli import main
from pipetrain.cluster import Cluster

FITTED = Calibration(0.9, 2.5e-4, ("1f1b m=1", "zbv m=8"), (0.04, 0.03), (0.04, 0.03))


def test_calibrate_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--calibrate", "--out", "/nonexistent-dir/cluster.json"]) != 0
    assert "add --model" in capsys.readouterr().err


def test_calibrated_terms_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cluster.json"
    probed = Cluster.local(2, action_overhead_s=1e-4, shared_speed=(1.0, 0.95))
    with (mock.patch("pipetrain.calibrate.overhead.probe_local_cluster", return_value=probed),
          mock.patch("pipetrain.calibrate.fit.calibrate_cluster", return_value=FITTED) as calibrate):
        assert main(["probe", "--model", "mlp-digits", "--batch", "32", "--calibrate", "--out", str(out)]) == 0
    assert calibrate.call_args.args[3] == 32
    written = Cluster.from_json(out.read_text())
    assert [d.speed for d in written.devices] == [pytest.approx(0.9)] * 2 and written.action_overhead_s == 2.5e-4
    assert written.shared_speed == (1.0, 0.95)
    assert "250 µs per action (calibrated)" in capsys.readouterr().out
