"""The reports of the zero-bubble benchmarks: ``bench_zb.py``'s (the simulated table beside the paper's
bubble model, the measured table, headlines and charts; rows of both parts, ``part`` telling which),
the measured table and prediction-error headline that ``bench_interleaved.py`` and
``bench_interleaved_zb.py`` share, and the latter's simulated table."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from harness import Chart, Headline, Report, Row

from common.zb_measured import median_rate, paired_ratio, prediction_error

__all__ = ["error_headline", "interleaved_zb_simulated", "measured_table", "paper_gain", "zb_report"]

PAPER = "up to +23% throughput over 1F1B (ZB-1p, Megatron-LM on A100s)"  # Qi et al. 2024, abstract


def paper_gain(p: int, m: int) -> float:
    """The paper's bubble model with ``T_F = T_B = T_W``: 1F1B takes ``m + p - 1`` micro-batch slots,
    ZB-H1 ``m + (p - 1) / 3`` (its bubble is a third of 1F1B's)."""
    return (m + p - 1) / (m + (p - 1) / 3)


def _sim(rows: list[Row]) -> tuple[list[str], list[tuple[int, int]], dict[tuple[int, int, str], Row]]:
    lines = ["| V100s | m | 1f1b ms | zb1 ms | zb1 speed-up | paper's model (T_F=T_B=T_W) | 1f1b bubble | zb1 bubble "
             "| peak act. GiB 1f1b / zb1 | zb1-strict speed-up, peak GiB | zb2 (ZB-H2) speed-up, peak GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["devices"], r["n_micro"], r["method"]): r for r in rows}
    grid = sorted({(r["devices"], r["n_micro"]) for r in rows})
    for d, m in grid:
        one, zb = by[(d, m, "1f1b")], by[(d, m, "zb1")]
        tail = " | ".join("–" if v is None else f"{one['iteration_s'] / v['iteration_s']:.3f}×, "
                          f"{v['peak_activation_bytes'] / 2**30:.2f}" for v in (by.get((d, m, "zb1-strict")),
                                                                              by.get((d, m, "zb2"))))
        lines.append(f"| {d} | {m} | {one['iteration_s'] * 1e3:.2f} | {zb['iteration_s'] * 1e3:.2f} | "
                     f"{one['iteration_s'] / zb['iteration_s']:.3f}× | {paper_gain(d, m):.3f}× | "
                     f"{one['bubble_fraction']:.1%} | {zb['bubble_fraction']:.1%} | "
                     f"{one['peak_activation_bytes'] / 2**30:.2f} / {zb['peak_activation_bytes'] / 2**30:.2f} | "
                     f"{tail} |")
    return lines, grid, by


Ratios = dict[tuple[str, str], float | None]


def measured_table(rows: list[Row], batches: dict[str, int],
                   baseline: Callable[[str, str], str]) -> tuple[list[str], Ratios, list[float]]:
    """The measured rows as a table: per model and label the median samples/s, the prediction and its
    error, the runs, and the paired ratio against ``baseline(model, label)`` in the same rounds. Also the
    paired ratios by (model, label) and every prediction error (%)."""
    lines = ["| model | configuration | median samples/s | runs | predicted samples/s | error | paired vs baseline |",
             "|---|---|---:|---|---:|---:|---:|"]
    ratios, errors = {}, []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine, batch = [r for r in rows if r["model"] == model], batches.get(model, 0)
        for label in dict.fromkeys(r["label"] for r in mine):
            rs = [r for r in mine if r["label"] == label]
            rate, error = median_rate(rs), prediction_error(rs, batch)
            ratios[(model, label)] = ratio = paired_ratio(mine, label, baseline(model, label))
            errors += [] if error is None else [error]
            runs = ", ".join(f"{r['samples_per_s']:.0f}" if r["samples_per_s"] else r["status"] for r in rs)
            lines.append(f"| {model} | {label} | {'–' if rate is None else f'{rate:.1f}'} | {runs} | "
                         f"{batch / rs[0]['predicted_s']:.1f} | {'–' if error is None else f'{error:+.0f}%'} | "
                         f"{'–' if ratio is None else f'{ratio:.2f}×'} ({baseline(model, label)}) |")
    return lines, ratios, errors


def error_headline(errors: list[float], what: str, config: str) -> tuple[Headline, ...]:
    """The median absolute prediction error of the measured configurations ``what`` names, a fidelity
    headline (none without runs)."""
    if not errors:
        return ()
    return (Headline("fidelity", f"{what} measured: prediction error of samples/s, median absolute",
                     statistics.median(abs(e) for e in errors), unit="%", config=config),)


def zb_report(rows: list[Row], batch: int, batches: dict[str, int]) -> Report:
    """Tables, headlines and charts; ``batch`` gpt1-14's in the simulated part, ``batches`` the measured models'."""
    sim = [r for r in rows if r["part"] == "simulated"]
    measured = [r for r in rows if r["part"] == "measured"]
    text, headlines, charts = [], [], []
    if sim:
        lines, grid, by = _sim(sim)
        text += [f"## Simulated: gpt1-14, estimated V100 profile, batch {batch}", "", *lines, ""]
        gains = {k: by[(*k, "1f1b")]["iteration_s"] / by[(*k, "zb1")]["iteration_s"] for k in grid}
        best = max(gains, key=lambda k: gains[k])
        headlines.append(Headline("papers", f"zb1 (ZB-H1) over 1f1b, simulated, the most ({best[0]} V100s, "
                                            f"m = {best[1]})",
                                  gains[best], paper=PAPER, paper_value=1.23,
                                  config=f"simulated, gpt1-14, estimated V100s, batch {batch}, m 8–32"))
        series = [("zb1", tuple(gains[k] for k in grid)),
                  ("paper's model, T_F = T_B = T_W", tuple(paper_gain(*k) for k in grid))]
        series += [(label, tuple(by[(*k, "1f1b")]["iteration_s"] / by[(*k, label)]["iteration_s"] for k in grid))
                   for label in ("zb2", "zb1-strict") if all((*k, label) in by for k in grid)]
        charts.append(Chart("papers", "simulated", "Zero bubble over 1f1b: simulated beside the paper's model", "bars",
                            "× 1f1b", categories=tuple(f"{d} V100s, m={m}" for d, m in grid), series=tuple(series)))
    if measured:
        lines, ratios, errors = measured_table(measured, batches, lambda model, label: "1f1b")
        text += ["## Measured: 2 local ranks (gloo, 1 thread each), alternating rounds", "", *lines]
        headlines += [Headline("methods", f"zb1 over 1f1b, measured, {model} (paired)", ratio,
                               config=f"2 local CPU ranks, batch {batches.get(model, '?')}, same stages")
                      for (model, label), ratio in ratios.items() if label == "zb1"]
        headlines += error_headline(errors, "zb1 and 1f1b", "2 local CPU ranks, measured profile, probed cluster")
    return Report("\n".join(text), tuple(headlines), tuple(charts))


def interleaved_zb_simulated(sim: list[Row], config: str) -> tuple[list[str], Headline, Chart]:
    """``bench_interleaved_zb.py``'s simulated rows: their table, how much interleaved-zb gains over the
    best of zb1 and interleaved (median over the grid), and every method's speed-up over 1f1b as bars."""
    lines = ["| ranks | m | method | v | iteration ms | bubble | peak act. MiB | vs 1f1b |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['ranks']} | {r['micro']} | {r['method']} | {r['chunks']} | {r['iteration_ms']:.2f} | "
              f"{r['bubble']:.1%} | {r['peak_activation_mib']:.0f} | {r['speedup']:.3f}× |" for r in sim]
    grid = sorted({(r["ranks"], r["micro"]) for r in sim})

    def best(key: tuple[int, int], methods: tuple[str, ...]) -> float:
        return max(r["speedup"] for r in sim if (r["ranks"], r["micro"]) == key and r["method"] in methods)

    headline = Headline("methods", "interleaved-zb (better v) over the best of zb1 and interleaved, simulated, median",
                        statistics.median(best(k, ("interleaved-zb",)) / best(k, ("zb1", "interleaved"))
                                          for k in grid), config=config)
    kinds = list(dict.fromkeys((r["method"], r["chunks"]) for r in sim  # the strict variant: in the table only
                               if r["method"] not in ("1f1b", "interleaved-zb-strict")))
    chart = Chart("methods", "simulated", "Speed-up over 1f1b, simulated (gpt1-14, V100s)", "bars", "× 1f1b",
                  categories=tuple(f"R={r} m={m}" for r, m in grid),
                  series=tuple((method + (f" v={v}" if v > 1 else ""), tuple(next(
                      x["speedup"] for x in sim if (x["ranks"], x["micro"], x["method"], x["chunks"]) == (r, m, method,
                                                                                                           v))
                      for r, m in grid)) for method, v in kinds))
    return lines, headline, chart
