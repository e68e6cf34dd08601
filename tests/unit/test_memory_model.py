"""The memory model (pipetrain.plan.memory): closed forms, the simulator's accounting, the profile's
stage bytes, the runtime's measurement of parameters, gradients and optimizer state, the memory
table and `pipetrain simulate --optimizer`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pipetrain.cli import main
from pipetrain.cluster import Cluster
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.plan.memory import OPTIMIZER_STATE_COPIES, OptimizerName
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.stats import layer_stats
from pipetrain.profile.table import LayerProfile, Profile
from pipetrain.runtime.interp.memory import ActivationMeter, measured_memory
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.memory import activation_peaks, memory_need, stage_memory
from pipetrain.viz.tables import byte_text, memory_table
from tests.conftest import flat_profile

BATCH = 12
SAVED, INPUT, PARAMS = 10, 3, 100  # bytes: saved and input per sample, parameters per layer
OPTIMIZERS: tuple[OptimizerName, ...] = ("sgd", "sgd-momentum", "adam")


def chain(method: Method, n_stages: int, n_micro: int, recompute: bool = False) -> Plan:
    sizes = equal_sizes(BATCH, n_micro)
    stages = tuple(StagePlan((f"l{k}",), (k,), sizes, sizes, recompute) for k in range(n_stages))
    return Plan("synthetic", "", BATCH, method, stages)


def cost_of(n_ranks: int) -> CostModel:
    profile = flat_profile(n_ranks, saved_bytes=SAVED, output_bytes=INPUT, parameter_bytes=PARAMS)
    return CostModel(profile, Cluster.local(n_ranks))


# ---- replay == closed forms (module docstring of pipetrain.plan.memory) ------------------------


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("n_micro", [1, 2, 3, 4, 6, 12])
@pytest.mark.parametrize("n_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("method", [Method.GPIPE, Method.ONE_F_ONE_B])
def test_replay_equals_closed_form(method: Method, n_stages: int, n_micro: int, recompute: bool) -> None:
    plan, cost = chain(method, n_stages, n_micro, recompute), cost_of(n_stages)
    b = BATCH // n_micro
    for k in range(n_stages):
        in_flight = n_micro if method is Method.GPIPE else min(n_micro, n_stages - k)
        expected = in_flight * INPUT * b + SAVED * b if recompute else in_flight * SAVED * b
        for optimizer in OPTIMIZERS:
            memory = stage_memory(plan, cost, optimizer=optimizer)[k]
            assert memory.activation_bytes == expected, (k, optimizer)
            assert memory.total_bytes == (2 + OPTIMIZER_STATE_COPIES[optimizer]) * PARAMS + expected


@pytest.mark.parametrize("n_stages", [2, 3, 4])
def test_bapipe_forms(n_stages: int) -> None:
    """PAPERS.md §4.2, stages k = 1..S: Mem_k(GPipe) = W c_opt + m A(b), Mem_k(1F1B) = W c_opt +
    (S - k + 1) A(b) (m >= S), with c_opt = 4 for Adam."""
    m, b, c_opt = 6, BATCH // 6, 4
    cost = cost_of(n_stages)
    gpipe = stage_memory(chain(Method.GPIPE, n_stages, m), cost, optimizer="adam")
    one_f_one_b = stage_memory(chain(Method.ONE_F_ONE_B, n_stages, m), cost, optimizer="adam")
    for k in range(1, n_stages + 1):
        assert gpipe[k - 1].total_bytes == PARAMS * c_opt + m * SAVED * b
        assert one_f_one_b[k - 1].total_bytes == PARAMS * c_opt + (n_stages - k + 1) * SAVED * b


def random_uedp_plan(rng: np.random.Generator, n_stages: int) -> Plan:
    """Random forward and backward partitions per stage; stages whose two differ recompute."""

    def sizes() -> tuple[int, ...]:
        cuts = np.flatnonzero(rng.random(BATCH - 1) < 0.4) + 1
        return tuple(int(x) for x in np.diff([0, *cuts, BATCH]))

    stages = []
    for k in range(n_stages):
        forward = sizes()
        stages.append(StagePlan((f"l{k}",), (k,), forward, sizes() if rng.random() < 0.5 else forward))
    return Plan("synthetic", "", BATCH, Method.UEDP, tuple(stages))


@pytest.mark.parametrize("seed", range(6))
def test_replay_equals_simulator(seed: int) -> None:
    """The simulator's peaks come from the same ledger, whatever the order and the partitions."""
    rng = np.random.default_rng(seed)
    n_stages = int(rng.integers(2, 5))
    cost = CostModel(flat_profile(n_stages, saved_bytes=SAVED, output_bytes=INPUT), Cluster.local(n_stages))
    uedp = random_uedp_plan(rng, n_stages)
    one_f_one_b = replace(uedp, method=Method.ONE_F_ONE_B,
                          stages=tuple(replace(s, backward_sizes=s.forward_sizes) for s in uedp.stages))
    for plan in (uedp, one_f_one_b, one_f_one_b.with_recompute()):
        schedule = build_schedule(plan)
        assert activation_peaks(plan, cost) == simulate(schedule, plan, cost).peak_activation_bytes


def test_replicated_stage_reports_its_largest_rank() -> None:
    """Stage 0 on ranks 0 and 1 takes micro-batches (3, 3, 2) round-robin: rank 0 the first and
    the last (5 samples), rank 1 the second (3 samples)."""
    sizes = equal_sizes(8, 3)
    plan = Plan("synthetic", "", 8, Method.GPIPE,
                (StagePlan(("l0",), (0, 1), sizes, sizes), StagePlan(("l1",), (2,), sizes, sizes)))
    cost = cost_of(3)
    assert activation_peaks(plan, cost) == (5 * SAVED, 3 * SAVED, 8 * SAVED)
    assert [m.activation_bytes for m in stage_memory(plan, cost)] == [5 * SAVED, 8 * SAVED]


def test_unknown_optimizer_names_the_choices() -> None:
    with pytest.raises(UserError, match="optimizer 'rmsprop' is unknown; use one of sgd, sgd-momentum, adam"):
        stage_memory(chain(Method.GPIPE, 2, 2), cost_of(2), optimizer="rmsprop")  # type: ignore[arg-type]


def test_memory_need_is_the_model_with_sgd() -> None:
    plan, cost = chain(Method.ONE_F_ONE_B, 3, 4), cost_of(3)
    sgd = stage_memory(plan, cost)
    assert memory_need(plan, cost) == tuple(m.total_bytes for m in sgd)
    adam = stage_memory(plan, cost, optimizer="adam")
    assert memory_need(plan, cost, optimizer="adam") == tuple(m.total_bytes for m in adam)


# ---- the profile's stage bytes --------------------------------------------------------------


def test_stage_saved_bytes_count_a_shared_boundary_once_and_add_the_loss() -> None:
    layer = LayerProfile("a", (1,), (1.0,), (1.0,), 8, 20, 0, 0.0, saved_input_bytes_per_sample=4,
                         saved_output_bytes_per_sample=8)
    layers = (layer, replace(layer, name="b"), replace(layer, name="c", saved_output_bytes_per_sample=0))
    profile = Profile("m", "", "cpu", "test", 4, layers, loss_saved_bytes_per_sample=5)
    assert profile.saved_bytes_per_sample(["a"]) == 20
    assert profile.saved_bytes_per_sample(["a", "b"]) == 20 + 20 - 4  # b's input is a's saved output
    assert profile.saved_bytes_per_sample(["b", "c"]) == 20 + 20 - 4 + 5  # c is the last layer: + loss
    assert Profile.from_json(profile.to_json()) == profile


@pytest.mark.parametrize("model", ["mlp", "gpt-tiny"])
def test_stage_saved_bytes_equal_the_stage_measured_whole(model: str) -> None:
    """Every stage of consecutive layers (but the last layer): the profile's per-layer bytes give
    what one forward of the whole stage saves."""
    graph = (build_model("mlp", n_layers=4, inputs=16, width=32, hidden=64, classes=8) if model == "mlp"
             else build_model("gpt-tiny", blocks=2))
    profile = measure_profile(graph, 4, sizes=(4,), warmup=0, repeats=1)
    inputs = [torch.randint(0, 256, (4, 32)) if model == "gpt-tiny" else torch.randn(4, 16)]
    with torch.no_grad():
        for i in range(len(graph) - 1):
            inputs.append(graph.build_layer(i)(inputs[-1]))
    for first in range(len(graph) - 1):
        for last in range(first, len(graph) - 1):
            stage = graph.build_sequential(range(first, last + 1))
            whole, _ = layer_stats(stage, inputs[first])
            names = graph.names[first:last + 1]
            assert profile.saved_bytes_per_sample(names) == pytest.approx(whole.saved_bytes_per_sample, abs=2), names


def test_loss_saved_bytes_are_log_probabilities_and_targets() -> None:
    """Cross-entropy keeps its log-softmax output (float32 per class), the int64 targets and a
    float32 scalar (nll_loss's total weight: 4 B over the 4 samples)."""
    mlp = measure_profile(build_model("mlp", n_layers=2, inputs=8, width=8, hidden=8, classes=10), 4, sizes=(4,),
                          warmup=0, repeats=1)
    gpt = measure_profile(build_model("gpt-tiny", blocks=1), 4, sizes=(4,), warmup=0, repeats=1)
    assert mlp.loss_saved_bytes_per_sample == 10 * 4 + 8 + 1
    assert gpt.loss_saved_bytes_per_sample == 32 * (256 * 4 + 8) + 1  # T = 32 tokens, V = 256


# ---- measured in the runtime ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "optimizer", "state_copies"), [
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1), 0),
    ("sgd-momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 1),
    ("adam", lambda ps: torch.optim.Adam(ps, lr=0.1), 2),
])
def test_measured_memory_counts_parameters_gradients_and_state(name: str, optimizer: object,
                                                               state_copies: int) -> None:
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    params = list(module.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    meter = ActivationMeter(params)
    opt = optimizer(params)  # type: ignore[operator]
    for lo in (0, 3):  # two micro-batches of 3 samples, one step
        with meter.track((lo, lo + 3)):
            loss = module(torch.randn(3, 8)).sum()
        loss.backward()
        meter.release((lo, lo + 3))
    opt.step()
    opt.zero_grad(set_to_none=True)
    memory = measured_memory(0, meter, module, opt)
    assert memory.weight_bytes == memory.gradient_bytes == param_bytes
    adam_steps = 4 * len(params) if name == "adam" else 0  # one float32 step counter per parameter
    assert memory.optimizer_state_bytes == state_copies * param_bytes + adam_steps
    assert memory.activation_bytes == meter.peak_bytes > 0
    assert memory.total_bytes == 2 * param_bytes + memory.optimizer_state_bytes + memory.activation_bytes


def test_gradients_are_not_noted_while_the_meter_is_off() -> None:
    module = nn.Linear(4, 4)
    meter = ActivationMeter(module.parameters())
    meter.enabled = False
    module(torch.randn(2, 4)).sum().backward()
    assert meter.gradient_bytes == 0
    meter.enabled = True
    module(torch.randn(2, 4)).sum().backward()
    assert meter.gradient_bytes == (16 + 4) * 4


# ---- the table and the CLI ------------------------------------------------------------------


def test_memory_table_lists_parts_total_device_and_fit() -> None:
    memories = stage_memory(chain(Method.ONE_F_ONE_B, 2, 4), cost_of(2), optimizer="adam")
    text = memory_table(memories, [10**6, 400], optimizer="adam")
    assert "predicted memory per stage (adam)" in text
    rows = [line for line in text.splitlines() if line.startswith("│")][1:]
    assert [row.split("│")[1].strip() for row in rows] == ["0", "1"]
    # stage 0: 2 in flight × 3 samples × 10 B = 60 B; 100 B weights, gradients, 200 B Adam state
    assert [c.strip() for c in rows[0].split("│")[2:-1]] == ["100 B", "100 B", "200 B", "60 B", "460 B",
                                                             "976.6 KiB", "yes"]
    assert rows[1].split("│")[-2].strip() == "no"  # 430 B on a 400 B device
    with pytest.raises(ValueError, match="2 stage memories but 1 device sizes"):
        memory_table(memories, [10**6])


def test_byte_text_picks_the_unit() -> None:
    assert [byte_text(n) for n in (0, 1023, 1536, 3 * 2**20, 16 * 2**30)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 MiB", "16.0 GiB"]


def test_simulate_prints_the_memory_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-tiny's 6 layers in 2 stages, 1F1B, 4 micro-batches of 2: per stage 12 KiB of weights;
    stage 0 holds 2 micro-batches (192 KiB), stage 1 one (96 KiB); the device has 200 KiB."""
    graph = build_model("gpt-tiny")
    layers = tuple(LayerProfile(n, (1, 8), (1e-3, 8e-3), (2e-3, 16e-3), 8192, 16384, 4096, 1e6) for n in graph.names)
    Profile(graph.name, graph.fingerprint(), "cpu", "synthetic", 128, layers).save(tmp_path / "profile.json")
    sizes = equal_sizes(8, 4)
    stages = tuple(StagePlan(graph.names[3 * k:3 * k + 3], (k,), sizes, sizes) for k in range(2))
    (tmp_path / "plan.json").write_text(Plan(graph.name, graph.fingerprint(), 8, Method.ONE_F_ONE_B, stages).to_json())
    (tmp_path / "cluster.json").write_text(Cluster.local(2, memory_bytes=200 * 1024).to_json())
    args = ["simulate", "--plan", str(tmp_path / "plan.json"), "--profile", str(tmp_path / "profile.json"),
            "--cluster", str(tmp_path / "cluster.json"), "--out-dir", str(tmp_path / "sim"), "--optimizer", "adam"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "predicted memory per stage (adam)" in text
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()
            if line.startswith("│") and "KiB" in line and "busy" not in line]
    assert rows[-2:] == [["0", "12.0 KiB", "12.0 KiB", "24.0 KiB", "192.0 KiB", "240.0 KiB", "200.0 KiB", "no"],
                         ["1", "12.0 KiB", "12.0 KiB", "24.0 KiB", "96.0 KiB", "144.0 KiB", "200.0 KiB", "yes"]]


def test_simulate_rejects_an_unknown_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--plan", "plan.json", "--optimizer", "rmsprop"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'rmsprop'" in capsys.readouterr().err
