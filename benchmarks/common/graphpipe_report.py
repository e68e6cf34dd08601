"""The report of the graphpipe experiment: GPP against SPP per model and GPU count (simulated), every
plan, the planners' search times, and the measured runs; the issue 29 targets as headlines."""

from __future__ import annotations

import statistics
from typing import Any

from harness import Chart, Headline, Report, Row, RunInfo, Target

from common.graphpipe_sim import RESTRICTED, RESTRICTED_IS

__all__ = ["graphpipe_report"]

PAPER_GAIN = "up to 1.61× over PipeDream and Piper"
PAPER_SIM = "GPP up to 1.61× over PipeDream/Piper, the gap growing with GPU count"
PAPER_SWEEP = "CANDLE-Uno: the gain grows with branches, up to 2× at 16"
PAPER_SEARCH = "GraphPipe's search 9–21× faster than the baselines', under a minute in all cases"
SIM_CONFIG = "simulated, estimated V100 profiles, Summit-like (4 V100 a node, EDR between), {n} GPUs, batch {batch}"


def _by_setting(rows: list[Row]) -> list[tuple[tuple[Any, ...], dict[str, Row]]]:
    """((sweep, model, branches, GPUs), rows by planner), sorted."""
    keys = sorted({(r["sweep"], r["model"], r["branches"], r["n_devices"]) for r in rows})
    return [(k, {r["planner"]: r for r in rows if (r["sweep"], r["model"], r["branches"], r["n_devices"]) == k})
            for k in keys]


def _best_spp(by: dict[str, Row]) -> Row:
    return max((r for p, r in by.items() if p not in ("graphpipe", RESTRICTED)), key=lambda r: r["samples_per_s"])


def _sim_lines(rows: list[Row]) -> list[str]:
    lines = [f"{RESTRICTED}: {RESTRICTED_IS}. Paper: {PAPER_SIM}; {PAPER_SWEEP}.", "",
             "| model | branches | GPUs | batch | GPP samples/s | pipedream samples/s | pipedream-1f1b samples/s | "
             "balanced samples/s | GPP / best SPP | GPP / pipedream | GPP / pipedream-1f1b | GPP depth | SPP depth |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (_, model, branches, n), by in _by_setting(rows):
        gpp, spp = by["graphpipe"], _best_spp(by)
        bal = f"{by['balanced']['samples_per_s']:,.0f}" if "balanced" in by else "—"
        lines.append(f"| {model} | {branches} | {n} | {gpp['batch']} | {gpp['samples_per_s']:,.0f} | "
                     f"{by['pipedream']['samples_per_s']:,.0f} | {by[RESTRICTED]['samples_per_s']:,.0f} | {bal} | "
                     f"{gpp['samples_per_s'] / spp['samples_per_s']:.2f}× | "
                     f"{gpp['samples_per_s'] / by['pipedream']['samples_per_s']:.2f}× | "
                     f"{gpp['samples_per_s'] / by[RESTRICTED]['samples_per_s']:.2f}× | "
                     f"{gpp['depth']} | {spp['depth']} |")
    lines += ["", "## Plans (stages as layers[×replicas]; b = micro-batch size, m = micro-batches)", "",
              "Search: the planner call's wall seconds, its CPU seconds, and the CPU seconds of those in the "
              "simulator (schedule, events, memory check); planner = CPU − simulator.", "",
              "| model | branches | GPUs | planner | method | b | m | devices used | depth | stages | search s | "
              "cpu s | simulator cpu s | planner cpu s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['branches']} | {r['n_devices']} | {r['planner']} | {r['method']} | "
              f"{r['micro_batch']} | {r['n_micro']} | {r['devices_used']} | {r['depth']} | {' '.join(r['stages'])} | "
              f"{r['search_s']:.2f} | {r['cpu_s']:.2f} | {r['simulate_cpu_s']:.2f} | "
              f"{r['cpu_s'] - r['simulate_cpu_s']:.2f} |" for r in rows]
    return lines


def _median(row: Row, key: str) -> float:
    return float(statistics.median(row[key]))


def _search_lines(rows: list[Row]) -> list[str]:
    lines = ["CPU seconds of the planner call (`time.process_time`), median of the runs, the planners alternating, "
             "each call on a fresh cost model; *simulator*: the CPU inside schedule building, event simulation "
             "and memory checks of the candidates; *own*: the rest (graphpipe: SP tree, stage tables, DP and "
             "target search per micro-batch size, plan building; PipeDream: its DP per micro-batch count, plan "
             f"building). Paper: {PAPER_SEARCH}.", "",
             "| model | GPUs | batch | runs | graphpipe s (own + simulator) | pipedream s (own + simulator) | "
             "**pipedream / graphpipe** | own work: pipedream / graphpipe | simulator: pipedream / graphpipe |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gp, pd = _median(r, "graphpipe_s"), _median(r, "pipedream_s")
        gp_sim, pd_sim = _median(r, "graphpipe_sim_s"), _median(r, "pipedream_sim_s")
        lines.append(f"| {r['model']} | {r['n_devices']} | {r['batch']} | {len(r['graphpipe_s'])} | "
                     f"{gp:.2f} ({gp - gp_sim:.2f} + {gp_sim:.2f}) | {pd:.2f} ({pd - pd_sim:.2f} + {pd_sim:.2f}) | "
                     f"**{pd / gp:.2f}×** | {(pd - pd_sim) / (gp - gp_sim):.2f}× | {pd_sim / gp_sim:.2f}× |")
    return lines


def _measured_lines(rows: list[Row]) -> list[str]:
    lines = ["gloo, one thread a rank. Samples/s: median over the alternating rounds of each run's median timed step.",
             "", "| model | ranks | plan | method | stages | m | predicted samples/s | measured samples/s | "
             "measured / predicted | vs best chain (paired) |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['n_ranks']} | {r['label']} | {r['method']} | {' '.join(r['stages'])} | "
              f"{r['n_micro']} | {r['predicted_sps']:,.0f} | {r['median_sps']:,.0f} | "
              f"{r['median_sps'] / r['predicted_sps']:.2f} | {r['vs_best_chain']:.2f}× |" for r in rows]
    return lines


def _headlines(sim: list[Row], search: list[Row]) -> list[Headline]:
    """Issue 29's targets: MMT ≥ 1.10× over PipeDream at 8 and 16 GPUs, DLRM and CANDLE-Uno ≥ 1.5× (their
    lowest over the GPU counts run), the search at 16 and 32 GPUs at least 5× faster than PipeDream's
    (part 2's medians where it ran at 16 or 32 GPUs, else part 1's single runs), with the planners' own
    work beside it; the branch sweep's 16 branches beside the paper's 2×."""
    gains: dict[str, list[tuple[float, int, int]]] = {}
    out = []
    for (sweep, model, branches, n), by in _by_setting(sim):
        gain = by["graphpipe"]["samples_per_s"] / by["pipedream"]["samples_per_s"]
        config = SIM_CONFIG.format(n=n, batch=by["graphpipe"]["batch"])
        if sweep and branches == 16:
            out.append(Headline("papers", f"GraphPipe over PipeDream, CANDLE-Uno with 16 branches, {n} GPUs", gain,
                                paper=PAPER_SWEEP, paper_value=2.0, config=config))
        elif model == "mmt" and n in (8, 16):
            out.append(Headline("papers", f"GraphPipe over PipeDream, mmt, {n} GPUs", gain, target=Target(">=", 1.10),
                                paper=PAPER_GAIN, paper_value=1.61, config=config))
        elif not sweep and model != "mmt":
            gains.setdefault(model, []).append((gain, n, by["graphpipe"]["batch"]))
    for model, found in gains.items():
        gain, n, batch = min(found)
        counts = "/".join(str(c) for _, c, _ in sorted(found, key=lambda f: f[1]))
        out.append(Headline("papers", f"GraphPipe over PipeDream, {model}, lowest over {counts} GPUs (at {n})", gain,
                            target=Target(">=", 1.5), paper=PAPER_GAIN, paper_value=1.61,
                            config=SIM_CONFIG.format(n=n, batch=batch)))
    if not any(r["n_devices"] in (16, 32) for r in search):  # one run each from part 1
        search = [{"model": model, "n_devices": n, **{f"{p}_{k}": [by[p][v]] for p in ("graphpipe", "pipedream")
                                                      for k, v in (("s", "cpu_s"), ("sim_s", "simulate_cpu_s"))}}
                  for (sweep, model, _, n), by in _by_setting(sim) if not sweep]
    timed = [r for r in search if r["n_devices"] in (16, 32)]
    if timed:
        runs = max(len(r["graphpipe_s"]) for r in timed)
        config = ((f"CPU s, median of {runs} alternating runs" if runs > 1 else "CPU s, one run each")
                  + ", each from a fresh cost model, estimated V100 profiles")
        worst, model, n = min((_median(r, "pipedream_s") / _median(r, "graphpipe_s"), r["model"], r["n_devices"])
                              for r in timed)
        out.append(Headline("search", f"GraphPipe's search over PipeDream's DP (CPU s), lowest at 16–32 GPUs: {model}, "
                                      f"{n} GPUs", worst, target=Target(">=", 5.0), paper=PAPER_SEARCH,
                            config=f"whole planner calls, simulation included; {config}"))
        own, model, n = min(((_median(r, "pipedream_s") - _median(r, "pipedream_sim_s"))
                             / (_median(r, "graphpipe_s") - _median(r, "graphpipe_sim_s")), r["model"], r["n_devices"])
                            for r in timed)
        out.append(Headline("search", f"GraphPipe's own work over PipeDream's (CPU s less the simulator's), lowest at "
                                      f"16–32 GPUs: {model}, {n} GPUs", own, paper=PAPER_SEARCH,
                            config=f"planner CPU less the simulator's (DP, tables, plan building); {config}"))
    return out


def graphpipe_report(rows: list[Row], info: RunInfo) -> Report:
    parts = {p: [r for r in rows if r["part"] == p] for p in ("sim", "search", "measured")}
    lines: list[str] = []
    charts = []
    if parts["sim"]:
        lines += ["## (1) GPP vs SPP, simulated on Summit-like V100 clusters (estimated profiles)", "",
                  *_sim_lines(parts["sim"]), ""]
        settings = _by_setting(parts["sim"])
        gains = {p: tuple(by["graphpipe"]["samples_per_s"] / by[p]["samples_per_s"] for _, by in settings)
                 for p in ("pipedream", RESTRICTED)}
        charts.append(Chart("papers", "sim", "GraphPipe (GPP) over sequential pipelines, simulated", "bars",
                            "GPP samples/s over SPP's (×)",
                            categories=tuple(f"{m} b={b} {n} GPUs" for (_, m, b, n), _ in settings),
                            series=tuple((f"over {p}", v) for p, v in gains.items())))
    if parts["search"]:
        lines += ["## (2) Search time, graphpipe planner vs PipeDream's DP planner", "",
                  *_search_lines(parts["search"]), ""]
    if parts["measured"]:
        lines += ["## (3) Method graph vs chain plans, measured here", "", *_measured_lines(parts["measured"]), ""]
        charts.append(Chart("fidelity", "measured", "GraphPipe's measured part: predicted against measured samples/s",
                            "scatter", "predicted samples/s", x_label="measured samples/s",
                            points=tuple((r["median_sps"], r["predicted_sps"], f"{r['model']} {r['n_ranks']}r")
                                         for r in parts["measured"])))
    return Report("\n".join(lines), tuple(_headlines(parts["sim"], parts["search"])), tuple(charts))
