"""``pipetrain demo``: the whole loop on a built-in model, on this machine.

    profile here → probe the link → plan (method, micro-batches, stages) → simulate → train on
    local ranks → predicted beside measured (table and picture) → speed vs single-process training

Every artefact lands in the output folder, so each step can be re-run on its own with the CLI.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.fileio import write_atomic

__all__ = ["run_demo"]


def _probe(n_ranks: int, console: Console) -> Cluster:
    from pipetrain.profile.link import probe_cluster

    console.print("[bold]2/6[/bold] probing the link and the contention between two local ranks")
    return probe_cluster(n_ranks)


def run_demo(model: str, batch: int, ranks: int, steps: int, folder: Path, out: Console, console: Console) -> None:
    """Run the demo and print its story; artefacts go to ``folder``."""
    from pipetrain.runtime.train import TrainConfig, reference_train, train
    from pipetrain.viz.files import save_comparison, save_timeline
    from pipetrain.viz.plan_tables import candidates_table, plan_table
    from pipetrain.viz.tables import compare_table, timeline_table

    graph = api.resolve_model(model)
    console.print(f"[bold]1/6[/bold] profiling {graph.name} ({len(graph)} layers) for micro-batches up to {batch}")
    profile = api.profile_model(graph, batch, progress=True)
    write_atomic(folder / "profile.json", profile.to_json())
    cluster = _probe(ranks, console)
    write_atomic(folder / "cluster.json", cluster.to_json())

    console.print("[bold]3/6[/bold] planning: every method × micro-batch count, simulated")
    plan, candidates = api.plan_pipeline(graph, profile, cluster, batch_size=batch)
    write_atomic(folder / "plan.json", plan.to_json())
    out.print(plan_table(plan))
    out.print(candidates_table(candidates, top=6))

    console.print("[bold]4/6[/bold] predicted timeline")
    schedule, predicted = api.predict(plan, profile, cluster)
    write_atomic(folder / "schedule.csv", schedule.to_csv())
    save_timeline(folder, "predicted", predicted, plan.rank_stages)
    out.print(schedule.grid(max_steps=12))
    out.print(timeline_table(predicted, plan.rank_stages))

    console.print(f"[bold]5/6[/bold] training on {plan.n_ranks} local ranks for {steps} steps")
    config = TrainConfig(steps=steps, warmup_steps=2)
    result = train(graph, plan, config)
    save_timeline(folder, "measured", result.timeline, plan.rank_stages)

    console.print("[bold]6/6[/bold] predicted beside measured, and single-process training for reference")
    out.print(compare_table(predicted, result.timeline, plan.rank_stages))
    picture = folder / "predicted_vs_measured.png"
    save_comparison(picture, predicted, result.timeline, plan.rank_stages)
    reference = reference_train(graph, batch, TrainConfig(steps=max(4, steps // 2), warmup_steps=1))
    out.print(
        f"pipelined: {result.samples_per_s:.1f} samples/s on {plan.n_ranks} ranks; single process: "
        f"{reference.samples_per_s:.1f} samples/s → {result.samples_per_s / reference.samples_per_s:.2f}×. "
        f"Loss {result.losses[0]:.3f} → {result.losses[-1]:.3f}."
    )
    out.print(f"artefacts in {folder}/ (open {picture} for the picture, *_trace.json in https://ui.perfetto.dev)")
