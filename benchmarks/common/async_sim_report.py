"""async-sim's report: the PipeDream and 2BW tables beside the papers' figures, headlines and charts."""

from __future__ import annotations

from harness import Chart, Headline, Report, Row, RunInfo

from .async_papers import GPT_BATCH, PAPER_2BW

__all__ = ["report"]

# The PipeDream paper's speed-ups over data parallelism (SOSP'19, Table 1): its text, and the number
PAPER = {("vgg16", "A 4x4"): ("5.28×", 5.28), ("vgg16", "B 2x8"): ("up to 5.3× (B's figure not in PAPERS.md)", 5.3),
         ("gnmt", "A 4x4"): ("2.34×", 2.34), ("gnmt", "B 2x8"): ("3.14×", 3.14)}


def _pipedream(rows: list[Row]) -> list[str]:
    lines = ["## PipeDream vs data parallelism (seconds per batch of 64 samples per device)", "",
             "| model | cluster | batch | data parallel (s) | pipedream (s) | pipedream config | micro-batches "
             "| ours: speed-up | paper | planner (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['cluster']} | {r['batch']} | {r['dp_batch_s']:.3f} (m={r['dp_micro']}) | "
              f"{r['pipedream_batch_s']:.3f} | {r['pipedream_config']} | {r['pipedream_micro']} | "
              f"{r['speedup']:.2f}× | {PAPER[(r['model'], r['cluster'])][0]} | {r['search_s']:.1f} |" for r in rows]
    return lines


def _twobw(rows: list[Row]) -> list[str]:
    lines = [f"## 2BW vs GPipe and PipeDream-Flush (seconds per batch of {GPT_BATCH}, Adam)", "",
             "| model | devices | gpipe (s) | gpipe plan | 1f1b (s) | 1f1b plan | 2bw (s) | 2bw plan "
             "| ours: vs gpipe | ours: vs 1f1b | paper | planner (s) |", "|---" * 12 + "|"]
    lines += [f"| {t['model']} | {t['devices']} | {t['gpipe_s']:.3f} | {t['gpipe_plan']} | {t['flush_s']:.3f} | "
              f"{t['flush_plan']} | {t['twobw_s']:.3f} | {t['twobw_plan']} | {t['speedup_gpipe']:.2f}× | "
              f"{t['speedup_flush']:.2f}× | up to {PAPER_2BW}× (vs GPipe) | {t['search_s']:.1f} |" for t in rows]
    return lines


def report(rows: list[Row], info: RunInfo) -> Report:
    pd = [r for r in rows if r["kind"] == "pipedream" and r["round"] == 0]
    tb = [r for r in rows if r["kind"] == "2bw" and r["round"] == 0]
    text = ["Profiles estimated for a V100; devices V100-16GB; times from the event simulator.", "",
            *_pipedream(pd), "", *_twobw(tb)]
    headlines = [Headline("papers", f"PipeDream over data parallelism, {r['model']} on cluster {r['cluster']}",
                          r["speedup"], paper=PAPER[(r["model"], r["cluster"])][0],
                          paper_value=PAPER[(r["model"], r["cluster"])][1],
                          config=f"simulated, {r['batch'] // 64} V100, batch {r['batch']}") for r in pd]
    if tb:
        best = max(tb, key=lambda t: t["speedup_gpipe"])
        headlines.append(Headline("papers", "2BW over GPipe, best of the GPT sizes", best["speedup_gpipe"],
                                  paper="up to 3.2× over GPipe (64 V100s)", paper_value=PAPER_2BW,
                                  config=f"simulated, {best['model']} on {best['devices']} V100, batch {GPT_BATCH}"))
    charts = []
    if pd:
        charts.append(Chart("papers", "pipedream-vs-dp", "PipeDream over data parallelism: paper and pipetrain",
                            "bars", "speed-up (×)", categories=tuple(f"{r['model']} {r['cluster']}" for r in pd),
                            series=(("paper", tuple(PAPER[(r["model"], r["cluster"])][1] for r in pd)),
                                    ("pipetrain (simulated)", tuple(r["speedup"] for r in pd)))))
    if tb:
        charts.append(Chart("papers", "2bw-vs-flush", "2BW over GPipe and PipeDream-Flush (paper: up to 3.2× "
                            "over GPipe)", "bars", "speed-up (×)",
                            categories=tuple(f"{t['model']} on {t['devices']}" for t in tb),
                            series=(("vs gpipe", tuple(t["speedup_gpipe"] for t in tb)),
                                    ("vs 1f1b (Flush)", tuple(t["speedup_flush"] for t in tb)))))
    return Report("\n".join(text), tuple(headlines), tuple(charts))
