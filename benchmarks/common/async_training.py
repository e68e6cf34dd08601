"""What the measured convergence benchmarks of the asynchronous methods share (async, async-convergence).

Two local ranks (gloo, one thread each), two stages (the model's layers cut in half), four equal
micro-batches; every run sees the same batches, for the same number of batches, with AdamW at
``LR``, warm-up + cosine, no clipping (the asynchronous methods do not support it), evaluated
every 10 % of the run. A run's row keeps its eval curve (``curve``), which the reports draw.
"""

from __future__ import annotations

from harness import Chart

from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.plan.methods import Method
from pipetrain.plan.plan import Plan, StagePlan, equal_sizes
from pipetrain.runtime import TrainConfig, TrainResult

__all__ = ["LR", "MICRO", "MODELS", "QUICK_STEPS", "base_config", "curve", "loss_charts", "two_stage_plan"]

MODELS = {"mlp-digits": ("digits", 64, 200), "gpt-tiny": ("text", 32, 300)}  # data, batch, batches
MICRO = 4
LR = 3e-3
QUICK_STEPS = 6  # --quick: batches per run, mlp-digits only


def two_stage_plan(graph: LayerGraph, batch: int, method: Method, vertical_sync: bool = False) -> Plan:
    """The layers cut in half, ranks 0 and 1, :data:`MICRO` equal micro-batches, run by ``method``."""
    half, sizes = len(graph.names) // 2, equal_sizes(batch, MICRO)
    stages = (StagePlan(graph.names[:half], (0,), sizes, sizes), StagePlan(graph.names[half:], (1,), sizes, sizes))
    plan = Plan(graph.name, graph.fingerprint(), batch, Method.ONE_F_ONE_B, stages)
    return plan if method is Method.ONE_F_ONE_B else plan.run_by(method, vertical_sync)


def base_config(data: str, steps: int) -> TrainConfig:
    """AdamW at :data:`LR`, warm-up over 5 % of the run then cosine, evaluated every 10 % of it."""
    return TrainConfig(steps=steps, data=data, optimizer="adamw", lr=LR, lr_schedule="warmup-cosine",
                       lr_warmup_steps=max(1, steps // 20), eval_every=max(1, steps // 10), progress=False,
                       timeout_s=120, warmup_steps=2)


def curve(result: TrainResult) -> list[dict[str, float | None]]:
    """The run's evaluations: step, samples seen, wall seconds, train loss, eval loss and accuracy."""
    return [{"step": m.step, "samples": m.samples_seen, "wall_s": m.wall_s, "loss": m.loss,
             "eval_loss": m.eval_loss, "eval_accuracy": m.eval_accuracy}
            for m in result.metrics if m.eval_loss is not None]


def loss_charts(rows: list[dict[str, object]], key: str) -> tuple[Chart, ...]:
    """Per model, eval loss against samples seen, one line per run (named by ``row[key]``)."""
    charts = []
    for model, (data, _, _) in MODELS.items():
        runs = [r for r in rows if r["model"] == model]
        points = tuple((float(p["samples"]), float(p["eval_loss"]), str(r[key]))
                       for r in runs for p in r["curve"])  # type: ignore[attr-defined]
        if points:
            charts.append(Chart("methods", f"loss-{model}", f"{model} on {data}: eval loss (AdamW, lr {LR:g}, "
                                f"{MICRO} micro-batches)", "lines", "eval loss", "samples seen", points=points))
    return tuple(charts)
