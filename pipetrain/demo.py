"""``pipetrain demo``: the whole loop on a built-in model and real data, on this machine.

    profile here → probe the link and calibrate on short runs (once) → plan (method, micro-batches,
    stages) → simulate → train on local ranks on real data, evaluating as it goes → predicted beside
    measured → speed against single-process training

By default ``gpt-tiny`` learns character-level language modelling on the ``text`` corpus that ships
with Python (:mod:`pipetrain.data.text`) with AdamW and a warm-up + cosine schedule, so the loss
visibly falls in about 300 steps. Every artefact lands in the output folder (profile, cluster, plan,
schedule, timelines, ``metrics.csv``, ``loss.png``, a checkpoint), so each step can be re-run with
the CLI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rich.console import Console

from pipetrain import api
from pipetrain.cluster import Cluster
from pipetrain.data import default_source
from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.memory import OptimizerName
from pipetrain.plan.plan import Plan, PlanSources
from pipetrain.profile.table import Profile
from pipetrain.runtime.job.config import TrainConfig, TrainResult
from pipetrain.simulate.timeline import Timeline

__all__ = ["DemoSettings", "run_demo"]

_OPTIMIZER: Final[OptimizerName] = "adamw"
"""What the demo trains with, and so what its plan prices (with clipping at :data:`_CLIP_NORM`)."""

_CLIP_NORM: Final = 1.0


@dataclass(frozen=True)
class DemoSettings:
    """What the demo trains.

    Attributes:
        model: a zoo model; its data is the built-in set it fits (``digits``, ``text``) or synthetic.
        batch: samples per mini-batch.
        ranks: local ranks (pipeline stages).
        steps: optimizer steps of the training run.
        folder: where the artefacts go.
    """

    model: str = "gpt-tiny"
    batch: int = 32
    ranks: int = 2
    steps: int = 300
    folder: Path = Path("out/demo")


def _probe(graph: LayerGraph, settings: DemoSettings, console: Console, profile: Profile) -> Cluster:
    """This machine as ``pipetrain plan`` sees it: probed on the model's work and calibrated on short
    runs of it against ``profile`` (unless ``PIPETRAIN_CALIBRATE=0``), or that probe cached."""
    from pipetrain.calibrate.machine import (
        calibrate_machine,
        calibration_profile_path,
        calibration_wanted,
        probed_cluster,
    )

    def announce() -> None:
        console.print(f"[bold]2/7[/bold] probing the link, the contention between {settings.ranks} local ranks on "
                      f"{graph.name}'s work, and the runtime's cost per action")

    found = probed_cluster(graph, settings.batch, settings.ranks, on_probe=announce)
    if found.probed_s is None:
        console.print(f"[bold]2/7[/bold] this machine as probed before on {graph.name}'s work: {found.path} "
                      "(`pipetrain plan --reprobe` probes it again)")
    if calibration_profile_path(found.path).exists() or not calibration_wanted():
        return found.cluster
    console.print(f"[bold]2/7[/bold] calibrating the probe on three short runs of {graph.name} (once, as `pipetrain "
                  "plan` does)")
    try:
        found, calibration = calibrate_machine(graph, settings.batch, found, profile, _OPTIMIZER)
    except UserError as e:
        console.print(f"[bold]2/7[/bold] not calibrated: {e}")
        return found.cluster
    console.print(f"[bold]2/7[/bold] calibrated in {found.probed_s:.0f} s ({calibration.describe()}), kept in "
                  f"{found.path}")
    return found.cluster


def _profile(graph: LayerGraph, settings: DemoSettings, console: Console) -> Profile:
    """The model profiled here; or, where this machine was calibrated on it (``pipetrain probe --model
    --calibrate``, which :func:`_probe` then reads), the profile that calibration holds for."""
    from pipetrain.calibrate.machine import cached_calibration_profile

    calibrated_on = cached_calibration_profile(graph, settings.batch, settings.ranks)
    if calibrated_on is not None:
        console.print(f"[bold]1/7[/bold] the profile of {graph.name} this machine was calibrated against "
                      f"(`pipetrain probe --calibrate`): {calibrated_on}")
        return Profile.load(calibrated_on)
    console.print(f"[bold]1/7[/bold] profiling {graph.name} ({len(graph)} layers) for micro-batches up to "
                  f"{settings.batch}")
    return api.profile_model(graph, settings.batch, progress=True)


def run_demo(settings: DemoSettings, out: Console, console: Console) -> None:
    """Run the demo and print its story; artefacts go to ``settings.folder``."""
    graph = api.resolve_model(settings.model)
    plan, predicted = _plan(graph, settings, out, console)
    data = default_source(graph)
    console.print(f"[bold]5/7[/bold] training {graph.name} on {data} on {plan.n_ranks} local ranks for "
                  f"{settings.steps} steps, evaluating every {max(1, settings.steps // 4)}")
    result = _train(graph, plan, settings, data)
    _report_learning(result, settings, out)
    _compare(graph, plan, predicted, result, settings, data, out, console)


def _plan(graph: LayerGraph, settings: DemoSettings, out: Console, console: Console) -> tuple[Plan, Timeline]:
    from pipetrain.viz.files import save_timeline
    from pipetrain.viz.plan_tables import candidates_table, plan_table
    from pipetrain.viz.tables import timeline_table

    folder, batch = settings.folder, settings.batch
    profile = _profile(graph, settings, console)
    write_atomic(folder / "profile.json", profile.to_json())
    cluster = _probe(graph, settings, console, profile)
    write_atomic(folder / "cluster.json", cluster.to_json())
    console.print("[bold]3/7[/bold] planning: every method × micro-batch count, simulated")
    result = api.plan(graph, profile, cluster, batch_size=batch, optimizer=_OPTIMIZER, clip_grad_norm=True,
                      constraints=api.Constraints(n_stages=cluster.n_devices))  # one stage per rank
    plan = dataclasses.replace(result.plan, measurements=PlanSources("profile.json", "cluster.json"))
    write_atomic(folder / "plan.json", plan.to_json())
    out.print(plan_table(plan))
    out.print(candidates_table(list(result.candidates), top=6, kept=result.plan))
    console.print("[bold]4/7[/bold] predicted timeline")
    schedule, predicted = api.predict(plan, profile, cluster)
    write_atomic(folder / "schedule.csv", schedule.to_csv())
    save_timeline(folder, "predicted", predicted, plan.rank_stages)
    out.print(schedule.grid(max_steps=12))
    out.print(timeline_table(predicted, plan.rank_stages))
    return plan, predicted


def _config(settings: DemoSettings, data: str, steps: int, *, evaluate: bool) -> TrainConfig:
    """AdamW with a warm-up and cosine decay: what makes gpt-tiny learn in a few hundred steps."""
    return TrainConfig(steps=steps, warmup_steps=2, data=data, optimizer=_OPTIMIZER, lr=3e-3,
                       lr_schedule="warmup-cosine", lr_warmup_steps=max(1, steps // 20), clip_grad_norm=_CLIP_NORM,
                       eval_every=max(1, steps // 4) if evaluate else 0, out=settings.folder if evaluate else None,
                       checkpoint_dir=settings.folder / "checkpoints" if evaluate else None, keep=1)


def _train(graph: LayerGraph, plan: Plan, settings: DemoSettings, data: str) -> TrainResult:
    from pipetrain.runtime import train
    from pipetrain.viz.curves import save_loss_plot

    result = train(graph, plan, _config(settings, data, settings.steps, evaluate=True))
    save_loss_plot(result.metrics, settings.folder / "loss.png", title=f"{graph.name} on {data}")
    return result


def _report_learning(result: TrainResult, settings: DemoSettings, out: Console) -> None:
    """One line: the train loss from first to last step, and the last held-out evaluation."""
    learned = f"train loss {result.losses[0]:.3f} → {result.losses[-1]:.3f}"
    final = result.final_eval
    if final is not None and final.eval_loss is not None:
        accuracy = f", accuracy {final.eval_accuracy:.1%}" if final.eval_accuracy is not None else ""
        learned += f"; held-out loss {final.eval_loss:.3f}{accuracy} after {final.samples_seen:,} samples"
    folder = settings.folder
    out.print(f"learned: {learned} (curves in {folder / 'loss.png'}, rows in {folder / 'metrics.csv'})")
    out.print(f"weights: a checkpoint in {folder / 'checkpoints'} (as one state_dict: `pipetrain export "
              f"--checkpoint {folder / 'checkpoints'} --out {folder / 'model.pt'}`)")


def _compare(graph: LayerGraph, plan: Plan, predicted: Timeline, result: TrainResult, settings: DemoSettings,
             data: str, out: Console, console: Console) -> None:
    from pipetrain.runtime import reference_train
    from pipetrain.viz.files import save_comparison, save_timeline
    from pipetrain.viz.tables import compare_table

    folder = settings.folder
    save_timeline(folder, "measured", result.timeline, plan.rank_stages)
    console.print("[bold]6/7[/bold] predicted beside measured")
    out.print(compare_table(predicted, result.timeline, plan.rank_stages))
    picture = folder / "predicted_vs_measured.png"
    save_comparison(picture, predicted, result.timeline, plan.rank_stages)
    console.print("[bold]7/7[/bold] single-process training, for speed (same model, batch and threads per rank)")
    config = _config(settings, data, min(settings.steps, 20), evaluate=False)
    reference = reference_train(graph, plan.batch_size, config, return_state_dict=False)
    ratio = result.samples_per_s / reference.samples_per_s
    out.print(f"pipelined: {result.samples_per_s:.1f} samples/s on {plan.n_ranks} ranks; single process: "
              f"{reference.samples_per_s:.1f} samples/s → {ratio:.2f}×")
    if ratio < 1.2:
        out.print("[dim]why not more: each rank runs one thread; two ranks on one machine share its memory bandwidth "
                  "and caches, and small micro-batches run below a core's peak. On separate devices the stages "
                  "run side by side (see BENCHMARKS.md).[/dim]")
    out.print(f"artefacts in {folder}/ (open {picture} and loss.png, *_trace.json in https://ui.perfetto.dev)")
