"""The report of UMPIPE's simulated benchmark (bench_umpipe_sim): tables, headlines, charts.

Rows are :func:`common.umpipe_plans.plan_all`'s. Gains are ``T_baseline / T``, against both
baselines, labelled: the best equal plan (every count searched) and the paper-style ``gpipe@4K``.
Ceilings are ``T_baseline / floor`` (:mod:`common.umpipe_floor`): no plan gains more; rows stored
before the floor was kept (no ``floor_s``) have none.
The paper's figures are UMPIPE's abstract (Zhou et al., TPDS 2025; PAPERS.md §1.1); the targets
are issue 29's (item 2).
"""

from __future__ import annotations

import statistics

from harness import Chart, Headline, Report, Row, Target, pct

from common.umpipe_networks import CLUSTERS, family
from common.umpipe_plans import PAPER_COUNT, PLANNERS, best_equal, paper_label

__all__ = ["PAPER", "umpipe_report"]

# UMPIPE's headline gains over GPipe / PipeDream (abstract), and over GPipe as a speed-up.
PAPER: dict[str, tuple[str, str, float]] = {"gpt1-14": ("+13.89%", "+11.09%", 1.1389),
                                            "vgg16": ("+17.11%", "+7.96%", 1.1711),
                                            "synthetic": ("≥ +170%", "≥ +100%", 2.70)}


def _gain(row: Row, baseline: str, planner: str = "tidgap-cuts") -> float:
    t = row["times_s"]
    return (best_equal(t) if baseline == "best equal" else t[baseline]) / t[planner]


def _ceiling(row: Row, baseline: str) -> float | None:
    """``T_baseline / floor``: the most any plan could gain over ``baseline``; None without a floor."""
    floor = row.get("floor_s")
    if not floor:
        return None
    t = row["times_s"]
    return float((best_equal(t) if baseline == "best equal" else t[baseline]) / floor)


def _ceiling_table(rows: list[Row], clusters: list[str], nets: list[str], gp: str) -> list[str]:
    lines = ["| network | " + " | ".join(clusters) + " |", "|---|" + "---|" * len(clusters)]
    for network in nets:
        at = {r["cluster"]: r for r in rows if r["network"] == network}
        cells = []
        for c in clusters:
            ceilings = [_ceiling(at[c], b) for b in (gp, "best equal")] if c in at else [None]
            cells.append(" / ".join(f"{x:.3f}×" for x in ceilings if x is not None) or "—")
        lines.append(f"| {network} | " + " | ".join(cells) + " |")
    return lines


def _table(rows: list[Row], clusters: list[str], nets: list[str], baselines: tuple[str, str]) -> list[str]:
    lines = ["| network | " + " | ".join(clusters) + " | paper (vs GPipe / PipeDream) |",
             "|---|" + "---|" * len(clusters) + "---|"]
    for network in nets:
        at = {r["cluster"]: r for r in rows if r["network"] == network}
        cells = [" / ".join(pct(_gain(at[c], b) - 1) for b in baselines) if c in at else "—" for c in clusters]
        paper = PAPER.get(family(network))
        lines.append(f"| {network} | " + " | ".join(cells) + f" | {' / '.join(paper[:2]) if paper else ''} |")
    return lines


def _headlines(rows: list[Row], gp: str, config: str) -> tuple[Headline, ...]:
    def of(name: str) -> list[Row]:
        return [r for r in rows if family(r["network"]) == name]

    out = []
    gpt, vgg, synthetic = of("gpt1-14"), of("vgg16"), of("synthetic")
    if gpt:
        out.append(Headline("papers", f"UMPIPE on gpt1-14: tidgap-cuts over paper-style {gp}, median over clusters",
                            statistics.median(_gain(r, gp) for r in gpt), target=Target(">=", 1.10),
                            paper=f"{PAPER['gpt1-14'][0]} over GPipe", paper_value=PAPER["gpt1-14"][2], config=config))
        ceilings = [c for c in (_ceiling(r, gp) for r in gpt) if c is not None]
        if ceilings:
            out.append(Headline("papers", f"UMPIPE on gpt1-14: ceiling over paper-style {gp} ({gp} over the floor no "
                                          "plan beats), median over clusters", statistics.median(ceilings),
                                config=config))
        out.append(Headline("methods", "UMPIPE on gpt1-14: clusters where tidgap-cuts beats the best equal plan",
                            sum(_gain(r, "best equal") > 1 for r in gpt), unit="", target=Target(">=", 2),
                            config=f"{config}, of {len(gpt)} clusters"))
    if vgg:
        out.append(Headline("papers", f"UMPIPE on vgg16: tidgap-cuts over paper-style {gp}, median over clusters",
                            statistics.median(_gain(r, gp) for r in vgg),
                            paper=f"{PAPER['vgg16'][0]} over GPipe", paper_value=PAPER["vgg16"][2], config=config))
    if synthetic:
        out.append(Headline("papers", f"UMPIPE on synthetic networks: tidgap-cuts over paper-style {gp}, the least",
                            min(_gain(r, gp) for r in synthetic), target=Target(">=", 2.0),
                            paper=f"{PAPER['synthetic'][0]} over GPipe", paper_value=PAPER["synthetic"][2],
                            config=f"{config}, {len(synthetic)} cases"))
        out.append(Headline("methods", "UMPIPE on synthetic networks: tidgap-cuts over the best equal plan, median",
                            statistics.median(_gain(r, "best equal") for r in synthetic),
                            config=f"{config}, {len(synthetic)} cases"))
    return tuple(out)


def _charts(rows: list[Row], clusters: list[str], nets: list[str], gp: str) -> tuple[Chart, ...]:
    families = [f for f in PAPER if any(family(r["network"]) == f for r in rows)]

    def median(name: str, baseline: str) -> float:
        return statistics.median(_gain(r, baseline) for r in rows if family(r["network"]) == name)

    paper = Chart("papers", "paper", "UMPIPE over GPipe: paper and pipetrain (simulated, medians)", "bars",
                  "speed-up (×)", categories=tuple(families),
                  series=(("paper", tuple(PAPER[f][2] for f in families)),
                          (f"over {gp}", tuple(median(f, gp) for f in families)),
                          ("over best equal", tuple(median(f, "best equal") for f in families))))
    speedups = Chart("methods", "speedups", "tidgap-cuts over the best equal plan, per network and cluster", "bars",
                     "speed-up (×)", categories=tuple(nets),
                     series=tuple((c, tuple(next((_gain(r, "best equal") for r in rows
                                                  if r["network"] == n and r["cluster"] == c), None) for n in nets))
                                  for c in clusters))
    return paper, speedups


def umpipe_report(rows: list[Row], setting: str) -> Report:
    """Tables (1)–(4), the headlines beside the paper's figures, and the charts; ``setting`` says what ran."""
    clusters = [c for c in CLUSTERS if any(r["cluster"] == c for r in rows)]
    nets = list(dict.fromkeys(r["network"] for r in rows))
    gp, pd = paper_label("gpipe"), paper_label("1f1b")
    lines = [f"Setting: {setting}. Speed-ups `T_baseline / T − 1`.", "",
             "## (1) tidgap-cuts over the best equal plans (every micro-batch count searched)", "",
             "Cells: over the best gpipe plan / over the best equal plan (the faster of gpipe and 1f1b).", "",
             *_table(rows, clusters, nets, ("gpipe", "best equal")), "",
             f"## (2) Over the paper-style baselines {gp} / {pd} (balanced, {PAPER_COUNT}K equal micro-batches)", "",
             f"Cells: tidgap-cuts over {gp} / over {pd}.", "", *_table(rows, clusters, nets, (gp, pd)), "",
             "## (3) Every planner, median speed-up over the best equal plan", "",
             "| planner | " + " | ".join(clusters) + " | all |", "|---|" + "---|" * (len(clusters) + 1)]
    for p in PLANNERS:
        cells = [pct(statistics.median(_gain(r, "best equal", p) - 1 for r in rows if group in (None, r["cluster"])))
                 for group in [*clusters, None]]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    columns = ["gpipe", "1f1b", gp, pd, *PLANNERS]
    lines += ["", "## (4) Per network and cluster: event-simulated iteration time (ms), cuts and search time (s)", "",
              "| network | cluster | " + " | ".join(columns) + " | cuts: base → searched | tidgap s | tidgap-cuts s |",
              "|---|---|" + "---|" * (len(columns) + 3)]
    for r in rows:
        cells = [f"{1e3 * r['times_s'][p]:.2f}" for p in columns]
        lines.append(f"| {r['network']} | {r['cluster']} | " + " | ".join(cells)
                     + f" | {r['cuts']['base']} → {r['cuts']['tidgap-cuts']} | {r['search_s']['tidgap']:.1f} | "
                       f"{r['search_s']['tidgap-cuts']:.1f} |")
    if any(r.get("floor_s") for r in rows):
        lines += ["", "## (5) Ceilings: the most any plan could gain", "",
                  f"Cells: {gp} / the best equal plan over the floor (`common/umpipe_floor.py`: every layer's "
                  "cheapest partition of its own work, after the first sample's forward through the layers above "
                  "it and before the last gradient's backward through them, on the best cuts into K stages), "
                  "seconds that no plan of any cuts and partitions beats in the event simulator.", "",
                  *_ceiling_table(rows, clusters, nets, gp)]
    config = f"simulated, estimated profiles, {', '.join(clusters)}, batch {rows[0]['batch'] if rows else '?'}"
    return Report("\n".join(lines), _headlines(rows, gp, config), _charts(rows, clusters, nets, gp))
