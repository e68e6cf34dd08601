"""Shared fixtures: every test is seeded (STYLE.md L12)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from pipetrain.profile.table import LayerProfile, Profile


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/golden/ from the current code instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether ``--update-golden`` was given: golden-file tests then write instead of compare."""
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_retiming(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profiler times an unstable median again (up to two more rounds); the suite's two workers
    share the cores, so most medians here would be, for a third more profiling time and nothing
    tested: the retiming's own tests give their rounds explicitly."""
    monkeypatch.setattr("pipetrain.profile.noise.EXTRA_ROUNDS", 0)


@pytest.fixture(autouse=True)
def _unprobed_machine(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``pipetrain plan`` for this machine probes it (~15 s), calibrates the probe on short runs of the
    model (~20-60 s) and caches the result under the user's home: here it gets the unprobed defaults
    at once, uncalibrated (``PIPETRAIN_CALIBRATE=0``, which subprocesses inherit too), cached in a folder
    of the test's own. Tests of the calibration turn it back on."""
    from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, Cluster

    def unprobed(n_ranks: int, **_: object) -> Cluster:
        return Cluster.local(n_ranks, action_overhead_s=CPU_ACTION_OVERHEAD_S)

    monkeypatch.setenv("PIPETRAIN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("PIPETRAIN_CALIBRATE", "0")
    monkeypatch.setattr("pipetrain.calibrate.machine.probe_local_cluster", unprobed)


def flat_profile(
    n_layers: int,
    forward_s: float | Sequence[float] = 1.0,
    backward_s: float | Sequence[float] = 2.0,
    *,
    per_sample: bool = False,
    output_bytes: int = 0,
    saved_bytes: int = 0,
    step_s: float = 0.0,
    parameter_bytes: int = 0,
) -> Profile:
    """A synthetic profile: each layer costs a constant (or, with per_sample, constant × b)."""
    fw = [forward_s] * n_layers if isinstance(forward_s, (int, float)) else list(forward_s)
    bw = [backward_s] * n_layers if isinstance(backward_s, (int, float)) else list(backward_s)
    sizes = (1, 2)
    scale: Callable[[float], tuple[float, float]] = (
        (lambda t: (t, 2 * t)) if per_sample else (lambda t: (t, t))
    )
    layers = tuple(
        LayerProfile(f"l{i}", sizes, scale(fw[i]), scale(bw[i]), output_bytes, saved_bytes, parameter_bytes, 0.0,
                     step_s)
        for i in range(n_layers)
    )
    return Profile("synthetic", "", "cpu", "synthetic", output_bytes, layers)
