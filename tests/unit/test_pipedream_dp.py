"""PipeDream's hierarchical partitioner against exhaustive search, the classic shapes, and its errors."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from pipetrain.errors import UserError
from pipetrain.planners.partition.pipedream import DeviceMemoryLimit, DPResult, DPStage, Level, pipedream_partition

MB = 1e6


@dataclass(frozen=True)
class Instance:
    compute_s: list[float]
    output_bytes: list[float]
    parameter_bytes: list[float]
    link: Level
    sync_scale: float
    memory: DeviceMemoryLimit | None = None


Span = Callable[[int, int, Fraction], float]  # (first, end, devices after per replica) -> seconds per item


def stage_s(inst: Instance, first: int, end: int, replicas: int, after: Fraction, compute_s: float | None = None,
            inner_devices: int = 1) -> float:
    """Seconds per item of one stage, written out from the formulas (not the module's code)."""
    compute_s = sum(inst.compute_s[first:end]) if compute_s is None else compute_s
    params = sum(inst.parameter_bytes[first:end])
    ring_s = 2 * (replicas - 1) / replicas * params / (inst.link.bandwidth_bytes_per_s * inner_devices)
    sync_s = inst.sync_scale * (ring_s + 2 * (replicas - 1) * inst.link.latency_s)
    if inst.memory is not None:
        in_flight = math.ceil(after / replicas) + 1
        saved = sum(inst.memory.activation_bytes[first:end])
        if inst.memory.state_copies * params + in_flight * saved > inst.memory.device_bytes:
            return math.inf
    return (compute_s + sync_s) / replicas


def pipeline_s(inst: Instance, bounds: Sequence[int], replicas: Sequence[int], span: Span | None = None,
               inner_devices: int = 1, extra: Fraction = Fraction(0)) -> float:
    """The objective of one configuration: the slowest stage or cut, per item. ``extra``: devices
    after the whole pipeline, per replica of it; ``span``: a stage's compute on one component."""
    worst = 0.0
    for k, r in enumerate(replicas):
        first, end = bounds[k], bounds[k + 1]
        after = sum(replicas[k + 1 :])
        inner = None if span is None else span(first, end, Fraction(inner_devices * after, r))
        worst = max(worst, stage_s(inst, first, end, r, after + extra, inner, inner_devices))
        if k > 0:
            link = inst.link
            worst = max(worst, 2 * (link.latency_s + inst.output_bytes[first - 1] / link.bandwidth_bytes_per_s) / r)
    return worst


def configurations(n_layers: int, devices: int, straight: bool) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every contiguous partition with every replica assignment using at most ``devices`` devices."""
    found = []
    for n_cuts in range(min(n_layers, devices)):
        for cuts in itertools.combinations(range(1, n_layers), n_cuts):
            bounds = (0, *cuts, n_layers)
            choices = [1] if straight else range(1, devices + 1)
            for replicas in itertools.product(choices, repeat=n_cuts + 1):
                if sum(replicas) <= devices:
                    found.append((bounds, replicas))
    return found


def brute_force_s(inst: Instance, straight: bool = False, span: Span | None = None, inner_devices: int = 1,
                  first: int = 0, end: int | None = None, extra: Fraction = Fraction(0)) -> float:
    """The best configuration of layers ``[first, end)``, by enumeration."""
    end = len(inst.compute_s) if end is None else end
    memory = inst.memory and DeviceMemoryLimit(inst.memory.device_bytes, inst.memory.activation_bytes[first:end],
                                         inst.memory.state_copies)
    sub = Instance(inst.compute_s[first:end], inst.output_bytes[first:end], inst.parameter_bytes[first:end],
                   inst.link, inst.sync_scale, memory)
    shifted = None if span is None else (lambda i, j, x: span(i + first, j + first, x))
    return min(pipeline_s(sub, bounds, replicas, shifted, inner_devices, extra)
               for bounds, replicas in configurations(end - first, inst.link.machines, straight))


def random_instance(rng: np.random.Generator, *, with_memory: bool,
                    room: tuple[float, float] = (0.95, 6.0)) -> Instance:
    """Up to 8 layers on up to 4 devices; ``room``: the memory limit over the largest layer's need."""
    n = int(rng.integers(1, 9))
    link = Level(int(rng.integers(1, 5)), float(rng.uniform(0.5e9, 5e9)), float(rng.choice([0.0, 1e-3])))
    compute_s = rng.uniform(0.01, 1.0, n).tolist()
    output_bytes = rng.uniform(0, 400 * MB, n).tolist()
    parameter_bytes = (rng.uniform(0, 1000 * MB, n) * (rng.uniform(size=n) < 0.7)).tolist()
    memory = None
    if with_memory:
        saved = rng.uniform(0, 500 * MB, n).tolist()
        copies = float(rng.choice([1.0, 4.0]))
        smallest = max(copies * p + a for p, a in zip(parameter_bytes, saved, strict=True))
        memory = DeviceMemoryLimit(smallest * float(rng.uniform(*room)), saved, copies)
    return Instance(compute_s, output_bytes, parameter_bytes, link, float(rng.choice([1.0, 0.25])), memory)


def solve(inst: Instance, levels: Sequence[Level] | None = None, straight: bool = False) -> DPResult:
    return pipedream_partition(inst.compute_s, inst.output_bytes, inst.parameter_bytes,
                               [inst.link] if levels is None else levels, sync_scale=inst.sync_scale,
                               straight=straight, memory=inst.memory)


def assert_well_formed(result: DPResult, n_layers: int, devices: int, straight: bool) -> None:
    bounds = [result.stages[0].first, *(stage.end for stage in result.stages)]
    assert bounds == sorted(set(bounds)) and bounds[0] == 0 and bounds[-1] == n_layers
    assert all(a.end == b.first for a, b in itertools.pairwise(result.stages))
    assert 1 <= result.devices <= devices
    assert result.config == "-".join(str(stage.replicas) for stage in result.stages)
    if straight:
        assert {stage.replicas for stage in result.stages} == {1}


@pytest.mark.parametrize(("straight", "with_memory"), [(False, False), (True, False), (False, True)])
def test_matches_brute_force_on_one_level(straight: bool, with_memory: bool) -> None:
    rng = np.random.default_rng(7 + 3 * straight + 5 * with_memory)
    infeasible = binding = 0
    for _ in range(200):
        inst = random_instance(rng, with_memory=with_memory)
        optimum_s = brute_force_s(inst, straight)
        if inst.memory is not None:
            unlimited = Instance(inst.compute_s, inst.output_bytes, inst.parameter_bytes, inst.link, inst.sync_scale)
            binding += optimum_s > brute_force_s(unlimited, straight)
        if math.isinf(optimum_s):
            infeasible += 1
            with pytest.raises(UserError, match="fits memory"):
                solve(inst, straight=straight)
            continue
        result = solve(inst, straight=straight)
        assert result.bottleneck_s == pytest.approx(optimum_s, rel=1e-9)
        bounds = [0, *(stage.end for stage in result.stages)]
        achieved_s = pipeline_s(inst, bounds, [stage.replicas for stage in result.stages])
        assert achieved_s == pytest.approx(optimum_s, rel=1e-9)
        assert_well_formed(result, len(inst.compute_s), inst.link.machines, straight)
    if with_memory:  # the limit bites in many instances, and a few fit nowhere
        assert 0 < infeasible < 50 and binding > 40


def reference_dp_s(inst: Instance, straight: bool) -> float:
    """The recurrence evaluated directly, every (first stage, replicas, devices after it): O(L^2 M^2)."""
    n, m_max, link = len(inst.compute_s), inst.link.machines, inst.link
    into = [[math.inf] * (m_max + 1) for _ in range(n + 1)]  # [s][d]: [s, n) on d devices, cut at s included
    best = math.inf
    for i in range(n - 1, -1, -1):
        for r in [1] if straight else range(1, m_max + 1):
            cut_s = 2 * (link.latency_s + inst.output_bytes[i - 1] / link.bandwidth_bytes_per_s) / r if i else 0.0
            for s in range(i + 1, n + 1):
                for d in [0] if s == n else range(1, m_max - r + 1):
                    value = max(stage_s(inst, i, s, r, d), into[s][d] if s < n else 0.0)
                    into[i][r + d] = min(into[i][r + d], max(value, cut_s))
                    best = min(best, value) if i == 0 else best
    return best


def test_matches_direct_recurrence_on_medium_instances() -> None:
    """Deep binary searches (up to 24 layers, 6 devices) against the recurrence without them."""
    rng = np.random.default_rng(5)
    for k in range(30):
        inst = random_instance(rng, with_memory=k % 2 == 1)
        n = int(rng.integers(12, 25))
        compute_s = rng.uniform(0.01, 1.0, n).tolist()
        memory = inst.memory and DeviceMemoryLimit(inst.memory.device_bytes * 2, rng.uniform(0, 100 * MB, n).tolist(),
                                             inst.memory.state_copies)
        inst = Instance(compute_s, rng.uniform(0, 400 * MB, n).tolist(), rng.uniform(0, 300 * MB, n).tolist(),
                        Level(int(rng.integers(2, 7)), inst.link.bandwidth_bytes_per_s, inst.link.latency_s),
                        inst.sync_scale, memory)
        straight = k % 5 == 0
        expected_s = reference_dp_s(inst, straight)
        if math.isinf(expected_s):
            with pytest.raises(UserError):
                solve(inst, straight=straight)
            continue
        assert solve(inst, straight=straight).bottleneck_s == pytest.approx(expected_s, rel=1e-9)


def fits_memory(result: DPResult, inst: Instance) -> bool:
    """Every flat stage holds its weights and ``ceil(devices after / replicas) + 1`` stashed items."""
    assert inst.memory is not None
    return all(
        stage_s(inst, stage.first, stage.end, stage.replicas, Fraction(sum(s.replicas for s in result.stages[k + 1 :])))
        < math.inf for k, stage in enumerate(result.stages))


def best_in_server(inner: Instance) -> Span:
    """A span's best single-server time by enumeration, given the devices after it per replica."""

    @functools.cache
    def span_s(first: int, end: int, extra: Fraction) -> float:
        return brute_force_s(inner, first=first, end=end, extra=extra)

    return span_s


@pytest.mark.parametrize("with_memory", [False, True])
def test_two_levels_match_brute_force_over_servers(with_memory: bool) -> None:
    """Top stages on whole servers, each running the best single-server pipeline of its span; the
    stash counts every device after a stage, later servers included (as whole servers)."""
    rng = np.random.default_rng(11 + with_memory)
    binding = 0
    for _ in range(40):
        inst = random_instance(rng, with_memory=with_memory, room=(1.0, 2.5))
        n = len(inst.compute_s)
        server = Level(int(rng.integers(1, 4)), 20e9, 1e-5)
        top = Level(int(rng.integers(1, 4)), float(rng.uniform(0.5e9, 2e9)), 1e-4)
        inner = Instance(inst.compute_s, inst.output_bytes, inst.parameter_bytes, server, inst.sync_scale, inst.memory)
        outer = Instance(inst.compute_s, inst.output_bytes, inst.parameter_bytes, top, inst.sync_scale)
        optimum_s = brute_force_s(outer, span=best_in_server(inner), inner_devices=server.machines)
        if with_memory:
            unlimited = Instance(inst.compute_s, inst.output_bytes, inst.parameter_bytes, server, inst.sync_scale)
            binding += optimum_s > brute_force_s(outer, span=best_in_server(unlimited), inner_devices=server.machines)
        if math.isinf(optimum_s):
            with pytest.raises(UserError, match="fits memory"):
                solve(inst, levels=[server, top])
            continue
        result = solve(inst, levels=[server, top])
        assert result.bottleneck_s == pytest.approx(optimum_s, rel=1e-9)
        assert_well_formed(result, n, server.machines * top.machines, straight=False)
        if with_memory:
            assert fits_memory(result, inner)
    assert binding >= 10 or not with_memory


@pytest.mark.parametrize("levels", [[Level(4, 1e11), Level(4, 1e10)], [Level(8, 1e11), Level(16, 1e10)]])
def test_hierarchical_plans_fit_memory_with_every_stash_counted(levels: list[Level]) -> None:
    """Beyond 8 devices after a span the stash grid rounds up: plans stay feasible, never optimistic."""
    rng = np.random.default_rng(2)
    compute_s, output_bytes = rng.uniform(0.1, 1, 32).tolist(), rng.uniform(1e6, 1e7, 32).tolist()
    parameter_bytes, saved = rng.uniform(1e6, 1e8, 32).tolist(), rng.uniform(1e7, 1e8, 32).tolist()
    feasible = 0
    for limit in (1.2e9, 2.5e9, 4e9, 1e10):
        inst = Instance(compute_s, output_bytes, parameter_bytes, levels[0], 1.0, DeviceMemoryLimit(limit, saved, 4.0))
        try:
            result = solve(inst, levels=levels)
        except UserError:
            continue
        feasible += 1
        assert fits_memory(result, inst)
        assert result.bottleneck_s >= pipedream_partition(compute_s, output_bytes, parameter_bytes, levels).bottleneck_s
    assert feasible >= 3


def test_flattening_multiplies_replicas_by_servers() -> None:
    """Two heavy-weight layers, slow links inside a server, fast between servers: each server runs
    the straight pipeline 1-1 (no sync on its slow link), and one top stage replicates it over
    every server, so each flat stage has as many replicas as there are servers."""
    for servers in (2, 3):
        result = pipedream_partition([1.0, 1.0], [1.0, 1.0], [1e9, 1e9], [Level(2, 1e9), Level(servers, 1e12)])
        assert result.stages == (DPStage(0, 1, servers), DPStage(1, 2, servers))
        sync_s = 2 * (servers - 1) / servers * 2e9 / (1e12 * 2)  # the top stage's weights, half per device
        assert result.bottleneck_s == pytest.approx((1.0 + sync_s) / servers)
    weightless = pipedream_partition([1.0] * 8, [1.0] * 8, [0.0] * 8, [Level(2, 1e12), Level(2, 1e12)])
    assert weightless.stages == (DPStage(0, 8, 4),)  # 2 replicas in a server x 2 servers
    straight = pipedream_partition([1.0] * 8, [1.0] * 8, [0.0] * 8, [Level(2, 1e12), Level(2, 1e12)], straight=True)
    assert straight.config == "1-1-1-1"
    assert [s.end - s.first for s in straight.stages] == [2, 2, 2, 2]


def test_servers_of_one_device_equal_one_level() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        inst = random_instance(rng, with_memory=bool(rng.integers(0, 2)))
        link = inst.link
        try:
            flat = solve(inst)
        except UserError:
            with pytest.raises(UserError):
                solve(inst, levels=[Level(1, link.bandwidth_bytes_per_s, link.latency_s), link])
            continue
        nested = solve(inst, levels=[Level(1, link.bandwidth_bytes_per_s, link.latency_s), link])
        assert nested == flat


def vgg_like() -> tuple[list[float], list[float], list[float]]:
    """Eight conv layers (heavy compute and activations, light weights), then two FC layers (huge weights)."""
    compute_s = [1.0] * 8 + [0.2] * 2
    output_bytes = [1 * MB] * 8 + [0.01 * MB] * 2
    parameter_bytes = [1 * MB] * 8 + [400 * MB] * 2
    return compute_s, output_bytes, parameter_bytes


@pytest.mark.parametrize(
    ("levels", "config"),
    [
        ([Level(4, 0.1e9)], "3-1"),  # PipeDream's VGG-16 shapes on 4 and 16 GPUs (PAPERS.md §2.4)
        ([Level(16, 1e9)], "15-1"),
        ([Level(4, 10e9), Level(4, 1e9)], "12-4"),  # 3 servers, then 1 server data parallel on fast links
    ],
)
def test_vgg_like_replicates_the_front_not_the_back(levels: list[Level], config: str) -> None:
    result = pipedream_partition(*vgg_like(), levels)
    assert result.config == config
    assert result.stages[-1].first <= 8  # the FC layers share the last stage
    assert result.bottleneck_s < pipedream_partition(*vgg_like(), levels, straight=True).bottleneck_s
    assert result.noam == math.ceil(result.devices / result.stages[0].replicas)


def test_weight_light_uniform_model_on_fast_links_is_data_parallel() -> None:
    # 9 equal layers cannot be balanced over replicated stages of 8 devices; weights are tiny.
    result = pipedream_partition([1.0] * 9, [1 * MB] * 9, [1e3] * 9, [Level(4, 50e9), Level(2, 10e9)])
    assert result.stages == (DPStage(0, 9, 8),)
    assert result.config == "8"
    assert result.noam == 1


def test_exact_ties_prefer_fewer_stages_then_earlier_cuts() -> None:
    # weightless: one stage on 4 devices and 2+2 or 1+3 splits all give 1.0 per item
    assert pipedream_partition([1.0] * 4, [1.0] * 4, [0.0] * 4, [Level(4, 1e12)]).config == "4"
    # a free model: one stage on one device (fewest stages, then fewest replicas)
    assert pipedream_partition([0.0] * 4, [0.0] * 4, [0.0] * 4, [Level(4, 1e12), Level(2, 1e9)]).config == "1"
    # straight, 3 equal layers on 2 devices: 1|2 and 2|1 both give 2.0; the earlier cut wins
    result = pipedream_partition([1.0] * 3, [1.0] * 3, [0.0] * 3, [Level(2, 1e12)], straight=True)
    assert [(s.first, s.end) for s in result.stages] == [(0, 1), (1, 3)]


def test_memory_limit_changes_the_answer() -> None:
    compute_s, output_bytes, parameter_bytes = vgg_like()
    free = pipedream_partition(compute_s, output_bytes, parameter_bytes, [Level(4, 0.1e9)])
    # 880 MB: the two FC layers no longer fit together, and stashing 4 items bounds the front stage
    tight = DeviceMemoryLimit(880 * MB, [50 * MB] * 10, 1.0)
    limited = pipedream_partition(compute_s, output_bytes, parameter_bytes, [Level(4, 0.1e9)], memory=tight)
    assert (free.config, limited.config) == ("3-1", "1-1-1-1")
    assert limited.bottleneck_s > free.bottleneck_s
    for stage in limited.stages:
        downstream = sum(s.replicas for s in limited.stages if s.first >= stage.end)
        params = sum(parameter_bytes[stage.first : stage.end])
        in_flight = math.ceil(downstream / stage.replicas) + 1
        assert params + in_flight * 50 * MB * (stage.end - stage.first) <= tight.device_bytes


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pipedream_partition([], [], [], [Level(2, 1e9)]), "compute_s is empty"),
        (lambda: pipedream_partition([1.0, 2.0], [1.0], [1.0, 1.0], [Level(2, 1e9)]),
         "output_bytes has 1 entries but compute_s has 2"),
        (lambda: pipedream_partition([1.0], [1.0], [-1.0], [Level(2, 1e9)]), r"parameter_bytes\[0\]=-1.0"),
        (lambda: pipedream_partition([1.0], [1.0], [1.0], [Level(0, 1e9)]), "Level.machines=0"),
        (lambda: pipedream_partition([1.0], [1.0], [1.0], []), "levels is empty"),
        (lambda: pipedream_partition([1.0], [1.0], [1.0], [Level(2, 0.0)]), "bandwidth_bytes_per_s=0.0"),
        (lambda: pipedream_partition([1.0], [1.0], [1.0], [Level(2, 1e9)], sync_scale=-1.0), "sync_scale=-1.0"),
        (lambda: pipedream_partition([1.0], [1.0], [1.0], [Level(2, 1e9)], memory=DeviceMemoryLimit(10.0, [1.0, 2.0])),
         "memory.activation_bytes has 2 entries"),
        (lambda: pipedream_partition([1.0, 1.0], [1.0, 1.0], [8.0, 8.0], [Level(2, 1e9)],
                                     memory=DeviceMemoryLimit(10.0, [3.0, 3.0])),
         "fits memory.device_bytes=10 .*more devices.*smaller micro-batches"),
    ],
)
def test_user_errors_name_the_fix(call: Callable[[], object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        call()


def test_flat_stages_name_their_devices_server_by_server() -> None:
    """A hierarchical answer places each flat stage on devices of the servers its top stage spans:
    every device at most once, each stage's devices in as many servers as its top stage has."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        levels = [Level(4, 1e11, 1e-6), Level(3, 1e9, 1e-5)]
        n = int(rng.integers(4, 12))
        result = pipedream_partition(rng.uniform(0.1, 1.0, n), rng.uniform(1e5, 1e7, n), rng.uniform(1e5, 1e8, n),
                                     levels)
        devices = [d for stage in result.stages for d in stage.devices]
        assert len(devices) == len(set(devices)) == result.devices
        assert all(0 <= d < 12 for d in devices)
        for stage in result.stages:
            assert len(stage.devices) == stage.replicas
            servers = {d // 4 for d in stage.devices}
            assert stage.replicas % len(servers) == 0  # the same share in each of its servers
