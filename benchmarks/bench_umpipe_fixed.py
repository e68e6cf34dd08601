"""UMPIPE's gain on gpt1-14 against a fixed cost per micro-batch on its head (a sensitivity check).

    .venv/bin/python benchmarks/bench_umpipe_fixed.py --out benchmarks/results/umpipe-fixed

The estimated gpt1-14 profile (:mod:`pipetrain.profile.estimate`, loss and host dispatch included)
gets ``x`` more seconds on its last layer's forward and ``2x`` on its backward at every micro-batch
size, for ``x`` in :data:`EXTRA_MS`: a stand-in for per-micro-batch costs the estimate does not
hold (a host sync on the loss's value, a runtime's bookkeeping on the stage that runs the loss, a
slower logits kernel). Each profile is planned as in ``bench_umpipe_sim.py`` (:func:`run_one`: the
best equal gpipe and 1f1b plans, the paper-style ``gpipe@4K`` and ``1f1b@4K``, tidgap, tidgap with
the cuts searched) on 4 and 8 V100s. It says how large such a cost must be before unequal
micro-batches pay on this model; ``x = 0`` is the estimate itself.

Output under ``--out``: ``umpipe_fixed.json`` and ``umpipe_fixed.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_umpipe_sim import BATCH, build, paper_label, pct, run_one

from pipetrain.fileio import write_atomic
from pipetrain.planners.microbatch.ga import GAConfig
from pipetrain.profile.estimate import estimate_profile
from pipetrain.profile.table import Profile

EXTRA_MS = (0.0, 0.25, 0.5, 1.0, 2.0)
CLUSTERS = ("4xV100", "8xV100")


def with_head_cost(profile: Profile, extra_s: float) -> Profile:
    """``profile`` with ``extra_s`` more per micro-batch on the last layer's forward, twice it on its backward."""
    head = profile.layers[-1]
    head = replace(head, forward_s=tuple(t + extra_s for t in head.forward_s),
                   backward_s=tuple(t + 2 * extra_s for t in head.backward_s))
    return replace(profile, layers=(*profile.layers[:-1], head))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/umpipe-fixed"))
    parser.add_argument("--population", type=int, default=128)
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = GAConfig(population=args.population, generations=args.generations)
    ga_1f1b = GAConfig(population=min(64, args.population), generations=max(1, args.generations // 4))
    args.out.mkdir(parents=True, exist_ok=True)
    profile = estimate_profile(build("gpt1-14"), "v100", BATCH)
    rows, start = [], time.perf_counter()
    lines = ["# UMPIPE on gpt1-14 with a fixed cost per micro-batch on the head", "",
             f"Command: `.venv/bin/python benchmarks/bench_umpipe_fixed.py --out {args.out}`; batch {BATCH}, "
             f"GA population {args.population}, {args.generations} generations, seed {args.seed}.", "",
             "| cluster | head + x ms (fwd), 2x (bwd) | best equal ms | tidgap vs best gpipe | tidgap-cuts vs best "
             "gpipe / vs best equal | vs gpipe@4K / 1f1b@4K | cuts: base → searched |",
             "|---|---|---|---|---|---|---|"]
    for cluster in CLUSTERS:
        for extra_ms in EXTRA_MS:
            result, _ = run_one("gpt1-14", cluster, with_head_cost(profile, extra_ms / 1e3), config, ga_1f1b, args.seed)
            rows.append({"extra_ms": extra_ms, **asdict(result)})
            t = result.times_s
            best = min(t["gpipe"], t["1f1b"])
            line = (f"| {cluster} | {extra_ms:g} | {1e3 * best:.1f} | {pct(t['gpipe'] / t['tidgap'] - 1)} | "
                    f"{pct(t['gpipe'] / t['tidgap-cuts'] - 1)} / {pct(best / t['tidgap-cuts'] - 1)} | "
                    f"{pct(t[paper_label('gpipe')] / t['tidgap-cuts'] - 1)} / "
                    f"{pct(t[paper_label('1f1b')] / t['tidgap-cuts'] - 1)} | "
                    f"{result.cuts['base']} → {result.cuts['tidgap-cuts']} |")
            lines.append(line)
            print(line, flush=True)
            write_atomic(args.out / "umpipe_fixed.json", json.dumps(rows, indent=1))
    lines += ["", f"Took {time.perf_counter() - start:.0f} s."]
    write_atomic(args.out / "umpipe_fixed.md", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
