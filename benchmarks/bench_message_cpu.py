"""What a gloo message costs the two ranks' CPUs, and what that cost is worth to the mlp's ranking.

    .venv/bin/python benchmarks/bench_message_cpu.py             # results in benchmarks/results/message-cpu
    .venv/bin/python benchmarks/bench_message_cpu.py --quick     # three sizes, a few messages, one round

The simulator runs a message on its link, overlapped with compute (:mod:`pipetrain.simulate.events`):
a SEND costs its rank nothing. On a machine whose ranks share the cores, gloo's I/O threads copy every
byte of a message through the loopback socket on the same cores the ranks compute on. Issue 17's Core
run named that as the suspected reason ``auto`` ranked the mlp's interleaved-zb plan (4 chunks per
rank, 28 messages per iteration) 4 % ahead of zbv m=2 (8 messages) where it measured 2.7 % behind.

1. **Cost per message.** Per round, two spawned ranks (gloo, one torch thread each) pass ``--messages``
   messages of each size, one at a time (``isend``/``irecv`` and wait); each rank records its wall
   time and its *process* CPU time (``time.process_time``: all threads, gloo's included) per message.
   Per size the median over ``--repeats`` rounds; a least-squares line ``a + b · bytes`` is fitted to
   each side's CPU seconds (:mod:`common.local_messages`; local-sim prices PPLL's messages with it).
2. **What it is worth.** For the mlp's two best settings of the Core run (profile and cluster of
   ``--core``), the messages of one iteration from their schedules and the CPU seconds the fitted
   lines give them, against the predicted iteration: an upper bound on what charging the CPU cost
   to the ranks could move (every message's cost on the critical path of its rank).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.local_gloo import measure, mlp_messages
from common.local_messages import fit, per_size
from harness import RESULTS, Context, Experiment, Headline, Report, Row, RunInfo, main

SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
QUICK_SIZES = (4 << 10, 256 << 10, 1 << 20)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--core", type=Path, default=RESULTS / "core-issue17-final",
                   help="a Core run's directory: its profile_mlp.json and cluster_mlp.json")
    p.add_argument("--messages", type=int, default=100, help="messages per size and round (default 100)")


def settings(ctx: Context) -> list[str]:
    return ["messages", "worth"]


def run(setting: str, ctx: Context) -> list[Row]:
    if setting == "worth":
        return [{"kind": "setting", **s} for s in mlp_messages(ctx.args.core)] if ctx.round == 0 else []
    sizes, messages = (QUICK_SIZES, 10) if ctx.quick else (SIZES, ctx.args.messages)
    return [{"kind": "message", "messages": messages, **r} for r in measure(sizes, messages)]


def report(rows: list[Row], info: RunInfo) -> Report:
    sizes = per_size(rows)
    lines = {"sender": fit(sizes, "send_cpu_s"), "receiver": fit(sizes, "recv_cpu_s")}
    text = ["| bytes | wall µs | sender CPU µs | receiver CPU µs |", "|---:|---:|---:|---:|"]
    text += [f"| {r['bytes']} | {r['wall_s'] * 1e6:.1f} | {r['send_cpu_s'] * 1e6:.1f} | {r['recv_cpu_s'] * 1e6:.1f} |"
             for r in sizes]
    text += ["", "Fitted CPU seconds per message: " + "; ".join(
        f"{side} {a * 1e6:.1f} µs + {b * 1e9:.3f} ns/byte" for side, (a, b) in lines.items()), ""]
    text += ["| mlp setting | messages | MiB | CPU ms (both sides) | predicted ms | share |",
             "|---|---:|---:|---:|---:|---:|"]
    (a_s, b_s), (a_r, b_r) = lines["sender"], lines["receiver"]
    headlines = [Headline("methods", f"gloo: the sender's CPU per {sizes[0]['bytes'] // 1024} KiB message (µs)",
                          round(sizes[0]["send_cpu_s"] * 1e6, 1), unit="", config="measured, 2 CPU ranks, loopback"),
                 Headline("methods", f"gloo: the receiver's CPU per {sizes[0]['bytes'] // 1024} KiB message (µs)",
                          round(sizes[0]["recv_cpu_s"] * 1e6, 1), unit="", config="measured, 2 CPU ranks, loopback")]
    for s in (r for r in rows if r["kind"] == "setting"):
        cpu = s["messages"] * (a_s + a_r) + (b_s + b_r) * s["bytes"]
        text.append(f"| {s['setting']} | {s['messages']} | {s['bytes'] / 2**20:.1f} | {cpu * 1e3:.2f} | "
                    f"{s['predicted_s'] * 1e3:.1f} | {cpu / s['predicted_s']:.2%} |")
        headlines.append(Headline("methods", f"messages' CPU against the mlp's predicted iteration, {s['setting']}",
                                  100 * cpu / s["predicted_s"], unit="%",
                                  config=f"{s['messages']} messages, Core's mlp, batch 128"))
    return Report("\n".join(text), tuple(headlines))


EXPERIMENT = Experiment(name="message-cpu", title="What a gloo message costs the ranks' CPUs", settings=settings,
                        run=run, report=report, arguments=arguments, repeats=5)

if __name__ == "__main__":
    raise SystemExit(main(EXPERIMENT))
