"""UMPIPE benchmark 7(a): simulated iteration time of unequal micro-batches on V100 and H100 clusters.

    .venv/bin/python benchmarks/bench_umpipe_sim.py --out benchmarks/results/umpipe-sim
    .venv/bin/python benchmarks/bench_umpipe_sim.py --quick --out /tmp/umpipe-sim     # smoke run
    .venv/bin/python benchmarks/bench_umpipe_sim.py --render                          # md + plot from the json

For each cluster (4 and 8 V100s, 4 and 8 H100s) and network (gpt1-14, vgg16 and 10 synthetic
networks), with profiles *estimated* from the device models (:mod:`pipetrain.profile.estimate`) and
one stage per device, it plans:

* ``gpipe`` and ``1f1b``: the best equal plan of each (balanced layers, every micro-batch count up
  to 64 and the powers of two simulated);
* on the faster one's stages, the micro-batch planners of PAPERS.md §1.11: ``greedy`` (local
  greedy), ``dp`` (global greedy DP), ``tidgap`` (dual chromosome, recompute costed wherever a
  stage's backward partition differs from its forward one), ``single`` (the ablation: backward =
  forward, so no recompute), ``tidgap-free`` (dual chromosome under the paper's model, where
  recompute costs nothing; reported both as planned and as it would really run, recompute costed);
* ``1f1b-ga``: unequal micro-batches under the 1F1B order (pipetrain's extension);
* ``tidgap-cuts``: tidgap with the stage cuts searched too (:mod:`pipetrain.planners.cut_search`:
  the best equal plans' cuts at other counts and one-boundary moves, screened by runs of a tenth of
  the generations), never slower than tidgap on the base's cuts;
* the **paper-style baselines** ``gpipe@4K`` and ``1f1b@4K``: balanced GPipe and 1F1B (PipeDream's
  order) plans at a fixed ``4K`` micro-batches for ``K`` stages. UMPIPE does not publish its
  baselines' count (PAPERS.md §1.1); ``4K`` is GPipe's own rule, "we found the bubble overhead to be
  negligible when M ≥ 4 × K" (Huang et al., NeurIPS 2019). The best equal plan searches every count.

The synthetic networks have 8 layers (1 or 2 per stage, so stages keep their layers' different
cost curves; with 16 layers over 4 stages every stage mixes all three kinds and the curves look
alike) at width 8: at the default width every stage is launch-bound at batch 64 on these devices,
the best plan of every method is a single micro-batch, and there is nothing to plan.

Every reported time is the **event simulator's** iteration time of the final plan (the planners'
own evaluators agree with it to 1e-9). Speed-ups are ``T_baseline / T - 1``. Links are assumptions
(documented in BENCHMARKS.md): NVLink inside a 4-device node, InfiniBand between nodes.

Output under ``--out``: ``umpipe_sim.json`` (every result), ``umpipe_sim.md`` (tables),
``speedups.png`` (tidgap over the best equal plan, per network and cluster) and
``gantt_<network>_<cluster>.png`` (best equal plan beside tidgap's) for gpt1-14 and one synthetic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from pipetrain.cluster import Cluster, Link
from pipetrain.cost import CostModel
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan
from pipetrain.planners.balanced import plan_balanced
from pipetrain.planners.contract import Constraints, ModelRef, PlanningProblem
from pipetrain.planners.cut_search import equal_cuts, layer_counts, search_cuts
from pipetrain.planners.microbatch.dp import global_dp
from pipetrain.planners.microbatch.ga import GAConfig, one_f_one_b_ga, single_chromosome, tidgap
from pipetrain.planners.microbatch.greedy import local_greedy
from pipetrain.planners.microbatch.result import MicrobatchPlan
from pipetrain.planners.microbatch.uedp import plan_uedp, with_sizes
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile
from pipetrain.schedule.generators import build_schedule
from pipetrain.simulate.events import simulate
from pipetrain.simulate.timeline import Timeline
from pipetrain.simulate.vectorised import StageTables
from pipetrain.viz.gantt import save_gantt

# (device model, nodes, devices per node, link inside a node, link between nodes): assumptions.
CLUSTERS: dict[str, tuple[str, int, int, Link, Link]] = {
    "4xV100": ("v100", 1, 4, Link(1e-5, 4.5e10), Link(5e-6, 1.25e10)),  # NVLink 2; IB EDR 100 Gb/s
    "8xV100": ("v100", 2, 4, Link(1e-5, 4.5e10), Link(5e-6, 1.25e10)),
    "4xH100": ("h100", 1, 4, Link(8e-6, 3.0e11), Link(5e-6, 5.0e10)),  # NVLink 4; IB NDR 400 Gb/s
    "8xH100": ("h100", 2, 4, Link(8e-6, 3.0e11), Link(5e-6, 5.0e10)),
}
N_SYNTHETIC = 10
BATCH = 64
PAPER_COUNT = 4  # the paper-style baselines run PAPER_COUNT × K micro-batches (module docstring)
CUT_ROUNDS = 3  # hill-climbing rounds of the cut search

# The paper's headline speed-ups of UMPIPE (TiDGAP) over GPipe / PipeDream (abstract).
PAPER = {"gpt1-14": ("+13.89%", "+11.09%"), "vgg16": ("+17.11%", "+7.96%"), "synthetic": ("≥ +170%", "≥ +100%")}


@dataclass(frozen=True)
class Result:
    """One network on one cluster: event-simulated seconds per planner, and search seconds."""

    network: str
    cluster: str
    n_stages: int
    batch: int
    times_s: dict[str, float]
    search_s: dict[str, float]
    # planner -> [forward sizes per stage, backward sizes per stage]; for the equal plans and
    # tidgap-cuts, per stage [forward sizes, backward sizes]
    sizes: dict[str, list[list[list[int]]]]
    cuts: dict[str, list[int]]  # layers per stage: "base" (the best equal plan's), "tidgap-cuts"


def paper_label(method: str) -> str:
    """The paper-style baseline's key: ``"gpipe@4K"``."""
    return f"{method}@{PAPER_COUNT}K"


def networks(quick: bool) -> list[str]:
    if quick:
        return ["gpt1-14", "synthetic-0"]
    return ["gpt1-14", "vgg16", *(f"synthetic-{k}" for k in range(N_SYNTHETIC))]


def build(network: str) -> LayerGraph:
    """A zoo model; ``synthetic-<k>`` is variant ``k`` with 8 layers at width 8 (see below)."""
    if network.startswith("synthetic-"):
        return build_model("synthetic", variant=int(network.rsplit("-", 1)[1]), n_layers=8, width=8.0)
    return build_model(network)


def cluster_of(name: str) -> Cluster:
    device, nodes, per_node, intra, inter = CLUSTERS[name]
    return replace(Cluster.homogeneous(device, nodes, per_node, intra, inter), name=name)


def event_time(plan: Plan, cost: CostModel) -> tuple[float, Timeline]:
    timeline = simulate(build_schedule(plan), plan, cost)
    return timeline.iteration_s, timeline


def run_one(network: str, cluster_name: str, profile: Profile, config: GAConfig, ga_1f1b: GAConfig,
            seed: int) -> tuple[Result, dict[str, Timeline]]:
    graph = build(network)
    cluster = cluster_of(cluster_name)
    cost = CostModel(profile, cluster)
    k = cluster.n_devices
    times, search, sizes, timelines = {}, {}, {}, {}
    equal, candidates = {}, {}
    for method in (Method.GPIPE, Method.ONE_F_ONE_B):
        t0 = time.perf_counter()
        problem = PlanningProblem(ModelRef.of(graph), cost, BATCH, constraints=Constraints(method=method, n_stages=k))
        found = plan_balanced(problem)
        plan = found.plan
        search[method.value] = time.perf_counter() - t0
        equal[method.value], candidates[method.value] = plan, [c.plan for c in found.candidates]
        times[method.value], timelines[method.value] = event_time(plan, cost)
        sizes[method.value] = [[list(s.forward_sizes), list(s.backward_sizes)] for s in plan.stages]
        fixed = PlanningProblem(ModelRef.of(graph), cost, BATCH,
                                constraints=Constraints(method=method, n_stages=k, n_micro=PAPER_COUNT * k))
        times[paper_label(method.value)] = event_time(plan_balanced(fixed).plan, cost)[0]
    base = equal[min(("gpipe", "1f1b"), key=lambda m: times[m])]
    cuts: dict[str, list[int]] = {}
    tables = StageTables.from_plan(base, cost)
    free = replace(tables, backward_recompute_s=tables.backward_s)  # the paper's model
    screen = replace(config, generations=max(1, config.generations // 10))

    def tidgap_on(stages: Plan, ga: GAConfig) -> Plan:
        return plan_uedp(stages, cost, planner="tidgap", seed=seed, config=ga)

    t0 = time.perf_counter()
    moved = search_cuts(base, lambda p: tidgap_on(p, config), lambda p: tidgap_on(p, screen), rounds=CUT_ROUNDS,
                        others=equal_cuts(base, candidates[base.method.value]))
    search["tidgap-cuts"] = time.perf_counter() - t0
    times["tidgap-cuts"], timelines["tidgap-cuts"] = event_time(moved, cost)
    sizes["tidgap-cuts"] = [[list(s.forward_sizes), list(s.backward_sizes)] for s in moved.stages]
    cuts["tidgap-cuts"] = list(layer_counts(moved))
    planners: dict[str, Callable[[], MicrobatchPlan]] = {
        "greedy": lambda: local_greedy(tables),
        "dp": lambda: global_dp(tables),
        "tidgap": lambda: tidgap(tables, seed=seed, config=config),
        "single": lambda: single_chromosome(tables, seed=seed, config=config),
        "tidgap-free": lambda: tidgap(free, seed=seed, config=config),
        "1f1b-ga": lambda: one_f_one_b_ga(tables, seed=seed, config=ga_1f1b),
    }
    for name, run in planners.items():
        t0 = time.perf_counter()
        result = run()
        search[name] = time.perf_counter() - t0
        plan = with_sizes(base, result)
        times[name], timelines[name] = event_time(plan, cost)
        sizes[name] = [list(map(list, result.forward_sizes)), list(map(list, result.backward_sizes))]
        if name == "tidgap-free":
            times["tidgap-free (planned)"] = result.iteration_s
    cuts["base"] = list(layer_counts(base))
    return Result(network, cluster_name, k, BATCH, times, search, sizes, cuts), timelines


# ---- report -----------------------------------------------------------------------------------


def gain(results: list[Result], planner: str, baseline: str) -> list[float]:
    return [r.times_s[baseline] / r.times_s[planner] - 1.0 for r in results]


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def best_equal(r: Result) -> float:
    return min(r.times_s["gpipe"], r.times_s["1f1b"])


def report(results: list[Result], seconds: float, args: argparse.Namespace) -> str:
    clusters = sorted({r.cluster for r in results}, key=list(CLUSTERS).index)
    nets = list(dict.fromkeys(r.network for r in results))
    gp, pd = paper_label("gpipe"), paper_label("1f1b")

    def at(network: str, cluster: str) -> Result:
        return next(x for x in results if x.network == network and x.cluster == cluster)

    lines = [
        "# UMPIPE 7(a): simulated speed-ups (estimated profiles)", "",
        f"Command: `.venv/bin/python benchmarks/bench_umpipe_sim.py{' --quick' if args.quick else ''} "
        f"--out {args.out}`; batch {BATCH}, one stage per device, GA population {args.population}, "
        f"{args.generations} generations, seed {args.seed}, cut search {CUT_ROUNDS} rounds; "
        + (f"took {seconds:.0f} s." if seconds else "rendered from umpipe_sim.json (`--render`)."), "",
        "## (1) tidgap-cuts over the best equal plans (every micro-batch count searched)", "",
        "Cells: over the best gpipe plan / over the best equal plan (the faster of gpipe and 1f1b).", "",
        "| network | " + " | ".join(clusters) + " | paper (vs GPipe / PipeDream) |",
        "|---|" + "---|" * len(clusters) + "---|",
    ]
    for network in nets:
        cells = [f"{pct(at(network, c).times_s['gpipe'] / at(network, c).times_s['tidgap-cuts'] - 1)} / "
                 f"{pct(best_equal(at(network, c)) / at(network, c).times_s['tidgap-cuts'] - 1)}" for c in clusters]
        family = "synthetic" if network.startswith("synthetic") else network
        lines.append(f"| {network} | " + " | ".join(cells) + f" | {' / '.join(PAPER.get(family, ('', '')))} |")
    lines += ["", f"## (2) Over the paper-style baselines {gp} / {pd} (balanced, {PAPER_COUNT}K equal micro-batches)",
              "", "Cells: tidgap-cuts over gpipe@4K / over 1f1b@4K.", "",
              "| network | " + " | ".join(clusters) + " | paper (vs GPipe / PipeDream) |",
              "|---|" + "---|" * len(clusters) + "---|"]
    for network in nets:
        cells = [f"{pct(at(network, c).times_s[gp] / at(network, c).times_s['tidgap-cuts'] - 1)} / "
                 f"{pct(at(network, c).times_s[pd] / at(network, c).times_s['tidgap-cuts'] - 1)}" for c in clusters]
        family = "synthetic" if network.startswith("synthetic") else network
        lines.append(f"| {network} | " + " | ".join(cells) + f" | {' / '.join(PAPER.get(family, ('', '')))} |")
    lines += ["", "## (3) Every planner, median speed-up over the best equal plan", "",
              "| planner | " + " | ".join(clusters) + " | all |", "|---|" + "---|" * (len(clusters) + 1)]
    planners = ["greedy", "dp", "tidgap", "tidgap-cuts", "single", "tidgap-free", "tidgap-free (planned)", "1f1b-ga"]
    for p in planners:
        row = []
        for group in [*clusters, None]:
            rs = [r for r in results if group is None or r.cluster == group]
            row.append(pct(statistics.median(best_equal(r) / r.times_s[p] - 1.0 for r in rs)))
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    columns = ["gpipe", "1f1b", gp, pd, *planners]
    lines += ["", "## (4) Per network and cluster: event-simulated iteration time (ms), cuts and search time (s)", "",
              "| network | cluster | " + " | ".join(columns) + " | cuts: base → searched | tidgap s | tidgap-cuts s |",
              "|---|---|" + "---|" * (len(columns) + 3)]
    for r in results:
        cells = [f"{1e3 * r.times_s[p]:.2f}" for p in columns]
        moved = f"{r.cuts['base']} → {r.cuts['tidgap-cuts']}"
        lines.append(f"| {r.network} | {r.cluster} | " + " | ".join(cells)
                     + f" | {moved} | {r.search_s['tidgap']:.1f} | {r.search_s['tidgap-cuts']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[Result], path: Path) -> None:
    clusters = sorted({r.cluster for r in results}, key=list(CLUSTERS).index)
    nets = list(dict.fromkeys(r.network for r in results))
    fig, ax = plt.subplots(figsize=(max(8, len(nets) * 0.9), 4.5))
    width = 0.8 / len(clusters)
    for i, c in enumerate(clusters):
        values = [100 * next(best_equal(r) / r.times_s["tidgap-cuts"] - 1.0
                             for r in results if r.network == n and r.cluster == c) for n in nets]
        ax.bar(np.arange(len(nets)) + i * width, values, width, label=c)
    ax.set_xticks(np.arange(len(nets)) + 0.4 - width / 2, nets, rotation=45, ha="right")
    ax.set_ylabel("tidgap-cuts speed-up over best equal plan (%)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.legend()
    ax.set_title("UMPIPE (tidgap, cuts searched) vs best equal GPipe/1F1B plan, event-simulated")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/umpipe-sim"))
    parser.add_argument("--quick", action="store_true", help="2 networks, 1 cluster, a tiny GA")
    parser.add_argument("--population", type=int, default=128)
    parser.add_argument("--generations", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--render", action="store_true", help="rewrite the md and plot from --out's json only")
    args = parser.parse_args(argv)
    if args.render:
        rows = json.loads((args.out / "umpipe_sim.json").read_text())
        rendered = [Result(**row) for row in rows]
        write_atomic(args.out / "umpipe_sim.md", report(rendered, 0.0, args))
        plot(rendered, args.out / "speedups.png")
        return 0
    if args.quick:
        args.population, args.generations = 16, 10
    config = GAConfig(population=args.population, generations=args.generations)
    ga_1f1b = GAConfig(population=min(64, args.population), generations=max(1, args.generations // 4))
    args.out.mkdir(parents=True, exist_ok=True)
    clusters = ["4xV100"] if args.quick else list(CLUSTERS)
    profiles: dict[tuple[str, str], Profile] = {}
    results: list[Result] = []
    start = time.perf_counter()
    for cluster_name in clusters:
        device = CLUSTERS[cluster_name][0]
        for network in networks(args.quick):
            key = (network, device)
            if key not in profiles:
                profiles[key] = estimate_profile(build(network), device, BATCH)
            result, timelines = run_one(network, cluster_name, profiles[key], config, ga_1f1b, args.seed)
            results.append(result)
            best = min(("gpipe", "1f1b"), key=lambda m: result.times_s[m])
            paper_gain = result.times_s[paper_label("gpipe")] / result.times_s["tidgap-cuts"] - 1
            print(f"{cluster_name:7s} {network:12s} best equal {1e3 * result.times_s[best]:8.2f} ms  "
                  f"tidgap {pct(result.times_s[best] / result.times_s['tidgap'] - 1):>7s}  "
                  f"cuts {pct(result.times_s[best] / result.times_s['tidgap-cuts'] - 1):>7s}  "
                  f"vs {paper_label('gpipe')} {pct(paper_gain):>7s}  "
                  f"single {pct(result.times_s[best] / result.times_s['single'] - 1):>7s}  "
                  f"1f1b-ga {pct(result.times_s[best] / result.times_s['1f1b-ga'] - 1):>7s}", flush=True)
            if network in ("gpt1-14", "synthetic-0") and cluster_name in ("4xV100", "8xH100"):
                save_gantt([timelines[best], timelines["tidgap-cuts"]],
                           args.out / f"gantt_{network}_{cluster_name}.png", [f"best equal ({best})", "tidgap-cuts"])
            write_atomic(args.out / "umpipe_sim.json", json.dumps([asdict(r) for r in results], indent=1))
    seconds = time.perf_counter() - start
    write_atomic(args.out / "umpipe_sim.md", report(results, seconds, args))
    plot(results, args.out / "speedups.png")
    print(f"wrote {args.out}/umpipe_sim.md ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
