"""GraphPipe (GPP, method ``graph``) against sequential pipelines (SPP): simulated at paper scale,
search time, and measured here on tiny branchy models.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py                  # all three parts (hours)
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --parts sim --models mmt --gpus 4 8 16 32 --sweep-gpus 0
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --parts sim --models dlrm candle-uno --gpus 8 16 \\
        --sweep-gpus 0 --balanced-max 0
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --parts sim search --models mmt dlrm candle-uno \\
        --gpus 8 16 --sweep-gpus 0 --balanced-max 0 --search-models mmt --search-gpus 16 32   # the issue 29 record
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --parts measured --steps 30 --rounds 6
    PYTHONPATH=. .venv/bin/python benchmarks/bench_graphpipe.py --quick          # CANDLE-Uno on 4 GPUs, 2 ranks

Results go to ``benchmarks/results/graphpipe/``; ``--parts`` picks the parts (default all).

1. ``sim`` (simulated, paper scale): Summit-like clusters of 4, 8, 16, 32 V100s, 4 per node on
   NVLink (150 GB/s, 5 µs), nodes on EDR InfiniBand (100 Gbit/s = 12.5 GB/s, 5 µs); profiles
   *estimated* (:func:`~pipetrain.profile.estimate.estimate_profile`, the V100 roofline on the meta
   device). For ``mmt``, ``dlrm`` and ``candle-uno`` (zoo, GraphPipe App. A.2 sizes) at a mini-batch
   of ``--per-gpu`` samples per GPU (default 32: 128 on 4 GPUs ... 1024 on 32; the paper's sizes are
   not in our notes), it plans GPP (the ``graphpipe`` planner) and SPP (``pipedream``: PipeDream's
   DP with replication on the linearised model, gpipe or 1f1b, synchronous), ``pipedream-1f1b`` (the
   paper's baseline as we model it: PipeDream, 1F1B only), and the ``balanced`` chain planner up to
   ``--balanced-max`` GPUs (it gets slow and poor beyond). Throughput = batch / the event
   simulator's iteration time. Then the CANDLE-Uno branch sweep: 2, 4, 8, 16 branches on
   ``--sweep-gpus`` GPUs (default 16; 0: none). ``--precision``: the estimated profiles' (default
   fp16, the V100's tensor cores). Every planner call records its wall and CPU seconds and the CPU
   seconds inside the simulator (:mod:`common.graphpipe_sim`).
2. ``search``: CPU time of the graphpipe planner and the PipeDream planner on the same problems,
   ``--search-repeats`` runs each, alternating, the median, on ``--search-gpus`` (default 8) for
   ``--search-models`` (default: ``--models``); each run's CPU split into the simulator's and the
   planner's own work (:mod:`common.graphpipe_sim` says what each includes; every call starts from a
   fresh cost model). The search headline is taken from this part at 16 and 32 GPUs when it ran
   there, else from part 1's single runs.
3. ``measured``: ``branchy-digits`` and ``mmt-tiny`` on 2 and 3 local ranks (gloo, one thread a
   rank): graphpipe's plan, a hand-made graph plan with the branches on their own stages, and the
   chain plans of the pipedream and balanced planners, all from one measured profile, trained
   ``--steps`` steps each in one launch, alternating for ``--rounds`` rounds
   (:mod:`common.graphpipe_measured`); the median samples/s beside the prediction.

Targets (issue 29): MMT ≥ 1.10× over the PipeDream plan at 8 and 16 GPUs, DLRM and CANDLE-Uno ≥ 1.5×;
the graphpipe planner's search at 16 and 32 GPUs ≤ 1/5 of the PipeDream planner's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.graphpipe_measured import BATCH, RANKS, measured_rows
from common.graphpipe_report import graphpipe_report
from common.graphpipe_sim import BRANCH_COUNT, RESTRICTED, problem_of, profile_of, sim_row, timed
from harness import Context, Experiment, Row, main

MODELS = ("mmt", "dlrm", "candle-uno")
BRANCHES = (2, 4, 8, 16)
PARTS = ("sim", "search", "measured")

Setting = tuple[str, str, int, int, int]  # part, model, branches (0: the zoo's), GPUs or ranks, profile batch


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run (default all)")
    p.add_argument("--per-gpu", type=int, default=32, help="mini-batch samples per GPU (default 32)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="sim, search: the models")
    p.add_argument("--gpus", type=int, nargs="+", default=[4, 8, 16, 32], help="sim: GPU counts")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp16",
                   help="estimated profiles' precision (default fp16: the V100's 80 TFLOP/s tensor cores)")
    p.add_argument("--sweep-gpus", type=int, default=16, help="GPUs of the branch sweep (default 16; 0: none)")
    p.add_argument("--balanced-max", type=int, default=8, help="plan with balanced up to this many GPUs")
    p.add_argument("--search-gpus", type=int, nargs="+", default=[8], help="search: GPU counts (default 8)")
    p.add_argument("--search-repeats", type=int, default=3, help="search: runs per planner (default 3)")
    p.add_argument("--search-models", nargs="+", choices=MODELS, default=None,
                   help="search: the models (default: --models)")
    p.add_argument("--steps", type=int, default=30, help="measured: steps per run, 2 of them warm-up")
    p.add_argument("--rounds", type=int, default=6, help="measured: rounds of alternating runs (default 6)")


def settings(ctx: Context) -> list[Setting]:
    a = ctx.args
    quick = ctx.quick
    models, gpus = (("candle-uno",), (4,)) if quick else (tuple(a.models), tuple(a.gpus))
    sim = [(m, 0, n) for m in models for n in gpus]
    if a.sweep_gpus and "candle-uno" in models and not quick:
        sim += [("candle-uno", b, a.sweep_gpus) for b in BRANCHES]
    out: list[Setting] = []
    if "sim" in a.parts:  # one profile per model and branch count, its grid up to the largest batch
        out += [("sim", m, b, n, a.per_gpu * max(c for mm, bb, c in sim if (mm, bb) == (m, b))) for m, b, n in sim]
    if "search" in a.parts:
        counts = (4,) if quick else tuple(a.search_gpus)
        searched = models if quick or a.search_models is None else tuple(a.search_models)
        out += [("search", m, 0, n, a.per_gpu * max(counts)) for m in searched for n in counts]
    if "measured" in a.parts:
        out += [("measured", m, 0, n, BATCH[m]) for m in (list(BATCH)[:1] if quick else BATCH)
                for n in (RANKS[:1] if quick else RANKS)]
    return out


def run(setting: Setting, ctx: Context) -> list[Row]:
    part, model, branches, n, profile_batch = setting
    a = ctx.args
    if part == "measured":
        rows = measured_rows(model, n, 6 if ctx.quick else a.steps, 2 if ctx.quick else a.rounds)
        for r in rows:
            ctx.log(f"{model} ranks={n} {r['label']}: {r['median_sps']:.0f} samples/s, {r['vs_best_chain']:.2f}×")
        return rows
    problem = problem_of(model, branches, profile_of(model, branches, profile_batch, a.precision), n, a.per_gpu * n)
    if part == "search":
        times: dict[str, list[float]] = {f"{p}_{k}": [] for p in ("graphpipe", "pipedream") for k in ("s", "sim_s")}
        for k in range(1 if ctx.quick else a.search_repeats):
            for planner in ("graphpipe", "pipedream") if k % 2 == 0 else ("pipedream", "graphpipe"):
                _, _, cpu, simulating = timed(planner, problem)
                times[f"{planner}_s"].append(cpu)
                times[f"{planner}_sim_s"].append(simulating)
        ratio = statistics.median(times["pipedream_s"]) / statistics.median(times["graphpipe_s"])
        ctx.log(f"{model} {n} GPUs: pipedream / graphpipe search {ratio:.2f}× "
                f"(graphpipe {statistics.median(times['graphpipe_s']):.2f} CPU s, "
                f"pipedream {statistics.median(times['pipedream_s']):.2f})")
        return [{"part": "search", "model": model, "n_devices": n, "batch": problem.batch_size, **times,
                 "ratio": ratio}]
    planners = ["graphpipe", "pipedream", RESTRICTED] + (["balanced"] if n <= a.balanced_max and not branches else [])
    rows = [sim_row(model, branches or BRANCH_COUNT[model], bool(branches), problem, p) for p in planners]
    ctx.log(f"{model} branches={branches or BRANCH_COUNT[model]} {n} GPUs: "
            + ", ".join(f"{r['planner']} {r['samples_per_s']:,.0f} samples/s ({r['cpu_s']:.1f} s cpu)" for r in rows))
    return rows


EXPERIMENT = Experiment(name="graphpipe", title="GraphPipe: graph pipelines against sequential ones",
                        settings=settings, run=run, report=graphpipe_report, arguments=arguments)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
