"""Every sub-command's options: the shared groups (model and data, costs) and one function per command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipetrain.cli.common import DEFAULT_MODEL
from pipetrain.cli.rerun import rerun_methods
from pipetrain.cli.routing import how_planned, listed, unequal
from pipetrain.cluster import CPU_ACTION_OVERHEAD_S, MAX_DEVICES
from pipetrain.data import LOSS_NAMES, SOURCE_NAMES
from pipetrain.device_select import BACKENDS, DEVICE_CHOICES
from pipetrain.graph.aux_heads import AUX_KINDS
from pipetrain.graph.zoo import MODEL_NAMES
from pipetrain.plan.memory import OPTIMIZER_NAMES
from pipetrain.plan.methods import DEFAULT_QUEUE_DEPTH, METHODS, method_names
from pipetrain.plan.plan import MAX_BATCH_SIZE
from pipetrain.planners import BASE_PLANNER, DEFAULT_PLANNER, DEFAULT_TIME_BUDGET_S, PLANNERS, default_planner
from pipetrain.planners.auto import INTERLEAVED_GA_MAX_BATCH
from pipetrain.planners.contract import RECOMPUTE_CHOICES
from pipetrain.planners.microbatch import GAConfig
from pipetrain.profile.precision import PRECISIONS
from pipetrain.runtime.job.lr_rule import LR_RULES
from pipetrain.runtime.job.optim import LR_SCHEDULES

__all__ = [
    "compare_args",
    "demo_args",
    "export_args",
    "plan_args",
    "probe_args",
    "profile_args",
    "simulate_args",
    "train_args",
]


def _count(text: str) -> int:
    """An argparse type: an integer >= 1 (a count of ranks, samples, steps...)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count; give an integer of at least 1")
    return value


def _batch_size(text: str) -> int:
    """An argparse type: samples per mini-batch, 1 to MAX_BATCH_SIZE."""
    value = _count(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"{value} samples is more than a mini-batch may have; give at most "
                                         f"{MAX_BATCH_SIZE}")
    return value


def _ranks(text: str) -> int:
    """An argparse type: a number of ranks, 1 to MAX_DEVICES."""
    value = _count(text)
    if value > MAX_DEVICES:
        raise argparse.ArgumentTypeError(f"{value} ranks is more than pipetrain plans for; give at most {MAX_DEVICES}")
    return value


def _non_negative(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a duration; give a number of seconds > 0")
    return value


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"zoo model ({', '.join(MODEL_NAMES)}), or module.path:callable returning "
                   f"your nn.Module (default: {DEFAULT_MODEL})")
    p.add_argument("--batch", type=_batch_size, default=32, help="samples per mini-batch (default: 32)")
    _data_args(p)


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaf", action="append", metavar="module.path:Class",
                   help="keep this module class whole inside one layer when tracing your model (repeatable; "
                        "default: none)")
    p.add_argument("--data", help=f"{', '.join(SOURCE_NAMES)}, text:PATH (a local text file) or module.path:callable "
                   "returning (train, eval) datasets of (input, target) pairs or dicts with 'labels' (default: the "
                   "model's own: digits for mlp-digits, text for gpt-tiny, else synthetic)")
    p.add_argument("--tokenizer", metavar="module.path:callable",
                   help="with --data text:PATH: a factory of the model's tokenizer (default: bytes as tokens)")
    p.add_argument("--context", type=int, metavar="T",
                   help="with --data text:PATH: tokens per sample (default: 128)")
    p.add_argument("--loss", help=f"{', '.join(LOSS_NAMES)} or module.path:callable (default: cross-entropy for "
                   "integer targets, mse for float ones)")


def _cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", type=Path, help="profile JSON (default: a --plan's own, else measure the model now)")
    p.add_argument("--estimate", metavar="DEVICE",
                   help="estimate the profile for a device model (cpu, v100, a100, h100, fpga) instead of "
                        "measuring it (default: measure, or read --profile)")
    p.add_argument("--cluster", type=Path, help="cluster spec YAML (see examples/clusters/) or JSON from `pipetrain "
                   "probe` (default: a --plan's own, else this machine: plan probes it once per model and ranks)")
    p.add_argument("--ranks", type=_ranks, help="number of ranks (default: the plan's, a spec's devices, or 2)")


def _device_args(p: argparse.ArgumentParser, *, backend: bool) -> None:
    """``--device`` (and ``--backend``): where the ranks compute and what they talk over (docs/gpus.md)."""
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                   help="cuda, cpu, or auto: cuda when torch sees a GPU" + (" (cpu with --backend gloo)" if backend
                                                                             else "") + " (default: auto)")
    if backend:
        p.add_argument("--backend", choices=BACKENDS,
                       help="nccl (GPUs only, one GPU per rank) or gloo (CPU, or GPUs shared round-robin with "
                            "messages through host memory) (default: nccl on cuda, gloo on cpu)")


def _out_file(p: argparse.ArgumentParser, default: str, what: str) -> None:
    """``--out FILE``: the one file a command writes (profile, probe, plan, export, compare)."""
    p.add_argument("--out", type=Path, default=Path(default), metavar="FILE", help=f"{what} (default: {default})")


class _OutIsAFile(argparse.Action):
    """``--out`` given to a command that writes a folder: one line naming ``--out-dir``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error(f"--out names the one file of profile, probe, plan, export and compare; this command "
                     f"writes several files into a folder: use --out-dir {values}")


def _out_dir(p: argparse.ArgumentParser, default: str, what: str) -> None:
    """``--out-dir DIR``: the folder of a command that writes several files (simulate, train, demo)."""
    p.add_argument("--out-dir", type=Path, default=Path(default), metavar="DIR",
                   help=f"folder for {what} (default: {default})")
    p.add_argument("--out", action=_OutIsAFile, help=argparse.SUPPRESS)


_PRECISION_USES: dict[str, tuple[str, str | None]] = {
    "profile": ("fp32, or mixed precision bf16/fp16: layers measured under torch.autocast, or estimated at the "
                "device's tensor-core peak; activations and messages in the compute dtype, weights and optimizer "
                "state float32", "fp32"),
    "plan": ("precision the plan trains at, written to the plan: bf16 and fp16 run each stage under autocast with "
             "float32 master weights and send activations and gradients in 16 bits; fp16 scales the loss", "fp32"),
    "train": ("train at this precision instead of the plan's: bf16 and fp16 autocast each stage's forward (float32 "
              "master weights and optimizer state) and send activations and gradients in 16 bits; fp16 scales the "
              "loss and skips the steps whose gradients overflow, on every stage", None),
}
"""``--precision``'s help and default per command (None: the plan's; fp32 with --model)."""


def _precision_arg(p: argparse.ArgumentParser, command: str) -> None:
    """``--precision`` of ``command`` (profile, plan or train; :mod:`pipetrain.profile.precision`)."""
    what, default = _PRECISION_USES[command]
    shown = default or "the plan's; fp32 with --model"
    p.add_argument("--precision", choices=PRECISIONS, default=default, help=f"{what} (default: {shown})")


def profile_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    p.add_argument("--estimate", metavar="DEVICE", help="estimate for a device model (cpu, v100, a100, h100, "
                   "fpga) instead of measuring (default: measure here)")
    _precision_arg(p, "profile")
    p.add_argument("--repeats", type=_count, default=5, help="timed repeats per point, the median kept (default: "
                   "5); a point whose repeats spread by more than ±10%% is timed up to twice more")
    _device_args(p, backend=False)
    _out_file(p, "out/profile.json", "profile JSON to write")


def probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=_ranks, default=2, help="ranks of the local cluster (default: 2)")
    p.add_argument("--probes", type=_count, default=3, help="probes to take the median of (default: 3)")
    p.add_argument("--overhead", type=_seconds, default=None,
                   help="the runtime's seconds per compute action: F, B, W, STEP (default: measured by three short "
                        f"2-rank runs of a tiny model, ~15 s; {CPU_ACTION_OVERHEAD_S} was typical on a 2-core CPU)")
    p.add_argument("--model", help="measure the contention on this model's own work (zoo name or "
                   "module.path:callable; its two halves of layers, one per rank, on a quarter of --batch) instead "
                   "of a generic block: models that stream their weights slow each other more; the result is also "
                   "kept for `pipetrain plan` of this model, batch and ranks to reuse (default: the block)")
    p.add_argument("--batch", type=_batch_size, default=32, help="with --model: samples per mini-batch (default: 32)")
    p.add_argument("--calibrate", action="store_true",
                   help="with --model: also profile it and fit its compute speed in a pipeline and the runtime's "
                        "seconds per action to two short runs of it (1f1b m=1, zbv m=8), and its gradient "
                        "all-reduce to a data-parallel one (~20-60 s): predictions then match this model's runs "
                        "(pipetrain.calibrate.fit)")
    p.add_argument("--optimizer", choices=OPTIMIZER_NAMES,
                   help="with --calibrate: the optimizer its runs train with, as `plan|train --optimizer` will, so "
                        "the fit holds for its steps; recorded beside the cluster (default: sgd)")
    _data_args(p)
    _out_file(p, "out/cluster.json", "cluster JSON to write")


def plan_args(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    _cost_args(p)
    names = method_names()
    p.add_argument("--method", choices=[*names, _OLD_ANY_METHOD], metavar=f"{{{','.join(names)}}}",
                   action=_MethodOrOldAuto, help=_plan_method_help())
    _local_args(p)
    _vertical_sync_arg(p)
    p.add_argument("--planner", choices=list(PLANNERS), help=_planner_help())
    _time_budget_arg(p, "--planner and --method")
    p.add_argument("--allow-async", action="store_true",
                   help="--planner auto: also consider the asynchronous methods pipedream and 2bw, which "
                        "change the optimizer's semantics (stale weights)")
    p.add_argument("--seed", type=_non_negative, help="GA seed for --method uedp, bapipe and auto (default: 0)")
    defaults = GAConfig()
    p.add_argument("--population", type=_count, help=f"GA population (default: {defaults.population}; "
                   f"--planner auto: 48, and a given budget also runs interleaved-ga on batches over "
                   f"{INTERLEAVED_GA_MAX_BATCH})")
    p.add_argument("--generations", type=_count, help=f"GA generations (default: {defaults.generations}; "
                   "--planner auto: 60)")
    p.add_argument("--memory-cap", action=argparse.BooleanOptionalAction, default=True,
                   help="keep each stage within its device's memory: --method uedp caps its micro-batches, the "
                        "balanced and interleaved planners keep only plans that fit (default: on)")
    p.add_argument("--recompute", choices=RECOMPUTE_CHOICES, default="auto",
                   help="activation checkpointing: which stages re-run their forward in backward instead of "
                        "keeping activations: auto, those a plan over memory needs (the planner tries them, "
                        "cheapest first, and keeps the fastest plan that fits); none; all (default: auto)")
    p.add_argument("--stages", type=_count, help="pipeline stages (default: one per rank)")
    p.add_argument("--virtual-stages", type=_count, metavar="V",
                   help="--method interleaved or interleaved-zb: model chunks per rank (default: search 2 to 4; "
                        "zbv: 2); --method uedp --virtual-stages V (V >= 2): unequal micro-batches per virtual "
                        "stage of an interleaved plan with V chunks per rank (the interleaved-ga planner)")
    p.add_argument("--micro", type=_count, help="fix the number of micro-batches (default: search)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZER_NAMES,
                   help="optimizer training will run, written to the plan: its state counts against device "
                        "memory and its step is priced (default: sgd)")
    p.add_argument("--clip-grad-norm", type=float, metavar="X",
                   help="training will clip the gradient norm (train --clip-grad-norm X): written to the plan, "
                        "each step priced with the norm and its all-reduce over the ranks (default: no clipping)")
    _precision_arg(p, "plan")
    p.add_argument("--top", type=_count, default=8, help="candidates to list (default: 8)")
    _probe_args(p)
    _out_file(p, "out/plan.json", "plan JSON to write, with the profile and cluster it was made with beside it "
              "(PLAN.profile.json, PLAN.cluster.json), which simulate and train --plan reuse")


def _time_budget_arg(p: argparse.ArgumentParser, without: str) -> None:
    p.add_argument("--time-budget", type=_seconds, metavar="SECONDS",
                   help=f"planning-time budget of the auto planner: once spent (and a plan fits), the runs not yet "
                        f"made are skipped and named; a run is never cut short, so planning may overrun it by "
                        f"one run (default: {DEFAULT_TIME_BUDGET_S:g} s without {without}, where the "
                        f"8×(1024-4096-1024) MLP at batch 128 on 2 ranks plans in ~15 s on a loaded 2-core CPU; "
                        "none with --planner auto)")


def _train_planner_args(p: argparse.ArgumentParser) -> None:
    """``train``'s planner without ``--plan``: as ``plan``'s without ``--method`` (the planners that choose
    stages; ``plan --method uedp`` is the way to a micro-batch planner)."""
    choices = [name for name, spec in PLANNERS.items() if spec.kind != "microbatch"]
    p.add_argument("--planner", choices=choices,
                   help=f"without --plan: the planner that plans the run (default: {_DEFAULT_CHOICE.split(';')[0]}, "
                        "as `pipetrain plan` without --planner and --method)")
    _time_budget_arg(p, "--planner")


def _probe_args(p: argparse.ArgumentParser) -> None:
    """``plan``'s probe of this machine (local CPU ranks, no --cluster or --estimate): cached, refreshed, skipped."""
    probe = p.add_mutually_exclusive_group()
    probe.add_argument("--reprobe", action="store_true",
                       help="probe this machine again (link, contention on the model's work, cost per action; "
                            "~15 s) instead of reusing the probe cached for this machine, model and ranks "
                            "(in $PIPETRAIN_CACHE_DIR, default ~/.cache/pipetrain) (default: reuse)")
    probe.add_argument("--no-probe", action="store_true",
                       help="plan for this machine's unprobed defaults (loopback link, no contention) instead of "
                            "probing it or reusing a cached probe (default: probe once, then reuse)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="plan on this machine's probe alone instead of calibrating it once on short runs of the "
                        "model (its compute speed in a pipeline, cost per action and all-reduce: ~20-60 s, kept with "
                        "the probe; as `pipetrain probe --calibrate`); PIPETRAIN_CALIBRATE=0 does the same "
                        "(default: calibrate when the model can run on the ranks, at fp32)")


def _plan_and_schedule_args(p: argparse.ArgumentParser, *, plan_required: bool) -> None:
    p.add_argument("--plan", type=Path, required=plan_required,
                   help="plan JSON from `pipetrain plan`, priced on the profile and cluster it records (saved "
                        "beside it) unless --profile, --cluster or --estimate is given" +
                        ("" if plan_required else " (default: plan here for --model and --ranks)"))
    p.add_argument("--schedule", type=Path, help="schedule CSV to run instead of the plan's own (one row per rank, "
                   "e.g. simulate's schedule.csv, edited); validated against the plan (default: the plan's own)")


_OLD_ANY_METHOD = "auto"
"""`plan --method auto`, the old spelling of leaving ``--method`` out; ``auto`` is ``--planner``'s (every planner)."""


class _MethodOrOldAuto(argparse.Action):
    """`plan --method M`; the old ``--method auto`` is taken as no ``--method``, with a one-line note."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if values == _OLD_ANY_METHOD:
            from pipetrain.cli.consoles import console

            console.print("[dim]note: --method auto is deprecated: leave --method out to let the planner choose "
                          "(--planner auto tries every planner)[/dim]")
            values = None
        setattr(namespace, self.dest, values)


def _plan_method_help() -> str:
    """`plan --method`'s help: every method's record (:data:`~pipetrain.plan.methods.METHODS`) and how it
    is planned (:func:`~pipetrain.cli.routing.how_planned`)."""
    methods = [f"{m.value}: {spec.summary} ({spec.paper}; {how_planned(m)})" for m, spec in METHODS.items()]
    return f"{'; '.join(methods)} (default: the --planner's choice; without --planner, {_DEFAULT_CHOICE})"


def _planner_help() -> str:
    """`plan --planner`'s help: the stage planners' summaries, then the micro-batch planners."""
    stages = [f"{name}: {spec.summary}" for name, spec in PLANNERS.items() if spec.kind == "stages"]
    microbatch = [name for name, spec in PLANNERS.items() if spec.kind == "microbatch"]
    default = default_planner("microbatch").name
    uedp = listed([m for m in METHODS if unequal(m)])
    return f"{'; '.join(stages)}; with --method {uedp}, a micro-batch planner ({', '.join(microbatch)}; default " \
        f"{default}) (default: the --method's planner, else {_DEFAULT_CHOICE})"


_DEFAULT_CHOICE = (f"{DEFAULT_PLANNER} within --time-budget ({DEFAULT_TIME_BUDGET_S:g} s): its synchronous planners, "
                   f"the fastest plan that fits; {BASE_PLANNER} with --stages, --micro or --no-memory-cap")
"""What `plan` runs without --planner and --method (:func:`~pipetrain.cli.planning.plan_request`)."""


def _vertical_sync_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vertical-sync", action="store_true",
                   help="--method pipedream: every stage runs a micro-batch on the weight version stage 0 "
                        "chose for it (default: off, each stage its newest)")


def _local_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--aux", choices=AUX_KINDS,
                   help="--method local: auxiliary heads, which predict the model's output from each stage's "
                        "(classes, regression values, next tokens) and score it with the task's loss (--loss) "
                        "(default: linear for MLPs, dgl for conv nets and transformers)")
    p.add_argument("--queue-depth", type=_count,
                   help=f"--method local: messages between two stages before the sender waits "
                        f"(default: {DEFAULT_QUEUE_DEPTH})")


def _rechunk_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--virtual-stages", type=_count, metavar="V",
                   help="--method interleaved or interleaved-zb: re-cut the plan's layers into V model chunks per "
                        "rank (V·R stages balanced on the profile, looping placement, the plan's micro-batch "
                        "count; default: the plan's own stages; zbv: 2, in a V)")


def _rerun_args(p: argparse.ArgumentParser) -> None:
    reruns = "; ".join(f"{m.value}: {METHODS[m].summary}" for m in rerun_methods())
    p.add_argument("--method", choices=method_names(rerun_methods()),
                   help=f"run the plan's stages and micro-batches by another method: {reruns} (a plan with other "
                        "stages is re-cut for a method that places several per rank) (default: the plan's own "
                        "method)")
    _local_args(p)
    _vertical_sync_arg(p)


def simulate_args(p: argparse.ArgumentParser) -> None:
    _plan_and_schedule_args(p, plan_required=True)
    _rerun_args(p)
    _rechunk_arg(p)
    _cost_args(p)
    _data_args(p)
    _out_dir(p, "out/sim", "predicted.json, the Chrome trace, the Gantt PNG and schedule.csv")
    p.add_argument("--optimizer", choices=OPTIMIZER_NAMES,
                   help="optimizer whose step the prediction prices and whose state the memory table counts "
                        "(default: the plan's)")
    p.add_argument("--checkpoint-every", type=_non_negative, default=0, metavar="K",
                   help="pipedream and 2bw: price a checkpoint every K steps, each draining the pipeline (the "
                        "samples/s line and the predicted timeline show the drains) (default: none)")


def train_args(p: argparse.ArgumentParser) -> None:
    _plan_and_schedule_args(p, plan_required=False)
    _rerun_args(p)
    _rechunk_arg(p)
    _model_args(p)
    _cost_args(p)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_count, help="optimizer steps in total (default: 20)")
    length.add_argument("--epochs", type=_count, help="passes over the train set, instead of --steps (default: "
                        "use --steps)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZER_NAMES,
                   help="optimizer of every stage's parameters (default: sgd)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate, the peak of a schedule (default: 0.01)")
    p.add_argument("--momentum", type=float, help="SGD momentum (default: 0.9 for sgd-momentum, else 0)")
    p.add_argument("--weight-decay", type=float, help="weight decay (default: 0.01 for adamw, else 0)")
    p.add_argument("--lr-schedule", default="constant", choices=LR_SCHEDULES,
                   help="learning rate over the steps, --lr its peak (default: constant)")
    p.add_argument("--warmup-steps", type=_non_negative, default=0,
                   help="linear warm-up steps of warmup-cosine (default: 0)")
    p.add_argument("--lr-rule", default="auto", choices=LR_RULES,
                   help="auto: scale each stage's rate for a method that steps more than once per batch (pipedream: "
                        "--lr / m, m micro-batches, whatever the stage's replicas; printed at the start, the rate in "
                        "metrics.csv); none: every stage at --lr (default: auto)")
    p.add_argument("--clip-grad-norm", type=float, metavar="X",
                   help="clip the gradient's global norm over all stages to X; under pipedream, each update's "
                        "own norm over its stage (default: no clipping)")
    _precision_arg(p, "train")
    p.add_argument("--eval-every", type=_non_negative, default=0, metavar="K",
                   help="evaluate on the eval set every K steps (default: only after the last step)")
    p.add_argument("--seed", type=_non_negative, default=0, help="data and weight-initialisation seed (default: 0)")
    p.add_argument("--threads", type=_count, default=1, help="torch threads per rank (default: 1)")
    p.add_argument("--timeout", type=_seconds, default=60.0,
                   help="seconds before a silent rank is failed (default: 60)")
    _device_args(p, backend=True)
    _train_planner_args(p)
    _probe_args(p)
    _out_dir(p, "out/run", "metrics.csv, loss.png, the measured timeline, and when no --plan is given the plan "
                           "(planned as `pipetrain plan` does) with its profile and cluster; a folder holding a "
                           "run of another model is refused")
    p.add_argument("--overwrite", action="store_true",
                   help="train into an --out-dir that holds a run of another model, replacing that run's files "
                        "(default: refuse)")
    p.add_argument("--checkpoint-dir", type=Path, metavar="D",
                   help="write checkpoints to D: after the last step, every --checkpoint-every steps, and on Ctrl-C "
                        "(default: no checkpoints)")
    p.add_argument("--checkpoint-every", type=_non_negative, default=0, metavar="K",
                   help="steps between checkpoints; under pipedream and 2bw each one drains the pipeline "
                        "(a fill and drain every K steps: `pipetrain simulate --checkpoint-every K` prices it) "
                        "(default: only after the last step)")
    p.add_argument("--keep", type=_count, metavar="N", help="keep the newest N checkpoints (default: all)")
    p.add_argument("--resume", type=Path, metavar="D",
                   help="continue from the newest whole checkpoint in D up to --steps/--epochs (any plan) "
                        "(default: start afresh)")


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, required=True, metavar="D",
                   help="a train --checkpoint-dir: its newest whole checkpoint is exported")
    _out_file(p, "out/model.pt", "torch.save'd state_dict under the model's own names")
    p.add_argument("--with-heads", action="store_true",
                   help="method local: keep the auxiliary heads (aux<k>.*) too (default: the main network only)")


def compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", type=Path, required=True, help="plan JSON the timelines are of (required)")
    p.add_argument("--predicted", type=Path, required=True,
                   help="predicted timeline: `pipetrain simulate --out-dir`'s predicted.json (required)")
    p.add_argument("--measured", type=Path, required=True,
                   help="measured timeline: `pipetrain train --out-dir`'s measured.json (required)")
    _out_file(p, "out/compare.png", "PNG of both Gantt charts; .png is added to a name without a suffix")


def demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="gpt-tiny",
                   help="zoo model; trains on the built-in data it fits (default: gpt-tiny on text)")
    p.add_argument("--batch", type=_batch_size, default=32, help="samples per mini-batch (default: 32)")
    p.add_argument("--ranks", type=_ranks, default=2, help="local ranks to train on (default: 2)")
    p.add_argument("--steps", type=_count, default=300, help="optimizer steps to train (default: 300)")
    _out_dir(p, "out/demo", "every file the demo writes")


