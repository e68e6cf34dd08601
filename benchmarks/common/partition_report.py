"""The report of partition-sim: times, speed-ups, memory and plans per model and device count, the
papers' headline figures beside ours, and the planners that get slower with more devices."""

from __future__ import annotations

from itertools import pairwise

from harness import Chart, Headline, Report, Row, RunInfo

from common.partition_plans import GIB

__all__ = ["partition_report"]

PLANNERS = ("data parallel", "equal split", "pipedream", "pipedream straight", "bapipe")
CONFIG = "simulated, estimated V100 profiles, {devices} V100 in servers of 4 (25 Gbit/s between), batch {batch}"


def _settings(rows: list[Row]) -> list[tuple[str, int, dict[str, Row]]]:
    """(model, devices, rows by planner), in the order they ran."""
    keys = list(dict.fromkeys((r["model"], r["n_devices"]) for r in rows))
    return [(m, d, {r["planner"]: r for r in rows if (r["model"], r["n_devices"]) == (m, d)}) for m, d in keys]


def _gib(x: Row) -> str:
    return f"{x['peak_memory_bytes'] / GIB:.2f}{'' if x['fits'] else ' (over)'}"


def _times_table(settings: list[tuple[str, int, dict[str, Row]]]) -> list[str]:
    lines = ["## Iteration time (ms), speed-ups and peak per-device memory", "",
             "Speed-up = T(baseline) / T(planner); memory ratio = peak bytes of data parallel / peak bytes of the "
             "planner (> 1: the planner needs less).", "",
             "| model | D | " + " | ".join(f"{p} ms" for p in PLANNERS)
             + " | pipedream vs DP | bapipe vs DP | pipedream vs equal | bapipe vs equal "
               "| bapipe vs pipedream straight | DP GiB | pipedream GiB (ratio) | bapipe GiB (ratio) |",
             "|---|---|" + "---|" * (len(PLANNERS) + 8)]
    for model, d, by in settings:
        t = {p: by[p]["iteration_s"] for p in PLANNERS}
        dp = by["data parallel"]
        cells = [f"{1e3 * t[p]:.1f}" for p in PLANNERS]
        cells += [f"{t['data parallel'] / t[p]:.2f}×" for p in ("pipedream", "bapipe")]
        cells += [f"{t['equal split'] / t[p]:.2f}×" for p in ("pipedream", "bapipe")]
        cells += [f"{t['pipedream straight'] / t['bapipe']:.2f}×", _gib(dp)]
        cells += [f"{_gib(by[p])} ({dp['peak_memory_bytes'] / by[p]['peak_memory_bytes']:.2f}×)"
                  for p in ("pipedream", "bapipe")]
        lines.append(f"| {model} | {d} | " + " | ".join(cells) + " |")
    return lines


def _plans_table(settings: list[tuple[str, int, dict[str, Row]]]) -> list[str]:
    lines = ["## Plans (stages in pipeline order as layers x replicas), bubble and planner wall time", "",
             "| model | D | planner | method | m | stages | devices used | bubble | peak GiB | fits 32 GiB | "
             "planner s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, d, by in settings:
        for x in by.values():
            stages = " ".join(x["stages"]) + (f" ({x['config']})" if x["config"] else "")
            lines.append(f"| {model} | {d} | {x['planner']} | {x['method']} | {x['n_micro']} | {stages} | "
                         f"{x['devices_used']} | {100 * x['bubble_fraction']:.0f}% | "
                         f"{x['peak_memory_bytes'] / GIB:.2f} | {'yes' if x['fits'] else 'no'} | {x['search_s']:.2f} |")
    return lines


def _slower(settings: list[tuple[str, int, dict[str, Row]]]) -> list[str]:
    """One bullet per (model, planner) whose time grows from one device count to the next."""
    bullets = []
    for (ma, da, a), (mb, db, b) in pairwise(settings):
        if ma != mb:
            continue
        for p in PLANNERS:
            ra, rb = a[p], b[p]
            if rb["iteration_s"] > ra["iteration_s"]:
                config = f" ({rb['config']})" if rb["config"] else ""
                bullets.append(f"* {ma}, {p}: {1e3 * ra['iteration_s']:.1f} ms on {da} → {1e3 * rb['iteration_s']:.1f} "
                               f"ms on {db} devices (bubble {100 * ra['bubble_fraction']:.0f}% → "
                               f"{100 * rb['bubble_fraction']:.0f}%, stages {' '.join(rb['stages'])}{config})")
    return bullets


def _best(settings: list[tuple[str, int, dict[str, Row]]], planner: str, over: str,
          key: str = "iteration_s") -> tuple[float, str, int]:
    """The largest ``over``/``planner`` ratio of ``key`` over every setting, with its model and devices."""
    return max((by[over][key] / by[planner][key], model, d) for model, d, by in settings)


def _headlines(settings: list[tuple[str, int, dict[str, Row]]], batch: int) -> tuple[Headline, ...]:
    devices = "/".join(str(d) for d in sorted({d for _, d, _ in settings}))
    config = CONFIG.format(devices=devices, batch=batch)
    pd, pd_model, pd_d = _best(settings, "pipedream", "data parallel")
    ba, ba_model, ba_d = _best(settings, "bapipe", "data parallel")
    mem, mem_model, mem_d = _best(settings, "bapipe", "data parallel", "peak_memory_bytes")
    return (
        Headline("papers", f"PipeDream's plan over data parallelism, best case ({pd_model}, {pd_d} V100)", pd,
                 paper="up to 5.3× over data parallelism (VGG-16, time to accuracy, real clusters)", paper_value=5.3,
                 config=config),
        Headline("papers", f"BaPipe's plan over data parallelism, best case ({ba_model}, {ba_d} V100)", ba,
                 paper="up to 3.2× faster than data- and pipeline-parallel frameworks", paper_value=3.2, config=config),
        Headline("papers", f"BaPipe's memory reduction over data parallelism, best case ({mem_model}, {mem_d} V100)",
                 mem, paper="up to 4× less memory", config=config),
    )


def partition_report(rows: list[Row], info: RunInfo) -> Report:
    """The tables, the papers' figures beside ours, and a chart of the speed-ups over data parallelism."""
    settings = _settings(rows)
    if not settings:
        return Report("No rows.")
    lines = ["Papers (not comparable: see the script's docstring): PipeDream up to 5.3× over DP (VGG-16, "
             "time-to-accuracy, real clusters); BaPipe up to 3.2× faster, 4× less memory.", "",
             *_times_table(settings), "", *_plans_table(settings), "",
             "## Planners that get slower with more devices", "", *(_slower(settings) or ["none"])]
    speedup = {p: tuple(by["data parallel"]["iteration_s"] / by[p]["iteration_s"] for _, _, by in settings)
               for p in ("pipedream", "bapipe", "equal split")}
    chart = Chart("papers", "speedup", "Speed-up over data parallelism (simulated, V100 servers of 4)", "bars",
                  "speed-up over data parallelism (×)", categories=tuple(f"{m} D={d}" for m, d, _ in settings),
                  series=tuple((p, v) for p, v in speedup.items()))
    return Report("\n".join(lines), _headlines(settings, int(rows[0]["batch"])), (chart,))
