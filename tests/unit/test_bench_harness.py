"""The benchmarks' harness (benchmarks/harness): records, rounds, reports, charts and the page."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from harness import Chart, Context, Experiment, Headline, Report, Row, RunInfo, Target, main, paired, ratio, stats
from harness.page import build_page, latest_records
from harness.record import load_record, render_markdown


def test_targets_compare_and_bound() -> None:
    assert Target(">=", 1.25).met(1.3) and not Target(">=", 1.25).met(1.2)
    assert Target("<=", 60).met(59) and not Target("<=", 60).met(61)
    assert Target("abs<=", 15).met(-14.9) and not Target("abs<=", 15).met(-15.1)
    assert Target(">=", 1.25).text("×") == "≥ 1.25×" and Target("abs<=", 15).text("%") == "|x| ≤ 15.0%"


def test_a_headline_without_a_value_or_target_is_neither_met_nor_missed() -> None:
    assert Headline("torch", "a", None, target=Target(">=", 1)).met is None
    assert Headline("torch", "a", float("nan"), target=Target(">=", 1)).met is None
    assert Headline("torch", "a", 2.0).met is None
    assert Headline("torch", "a", 2.0, target=Target(">=", 1)).met is True
    assert Headline("torch", "a", None).value_text() == "—"


def test_paired_alternates_the_order_of_its_candidates() -> None:
    order: list[str] = []
    result = paired({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert result["a"].n == 4 and result["a"].low <= result["a"].median <= result["a"].high


def test_stats_skip_missing_samples_and_ratio_needs_two_positive_numbers() -> None:
    s = stats([3.0, float("nan"), 1.0, 2.0])
    assert s is not None and (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert stats([]) is None
    assert ratio(3.0, 2.0) == "1.50×" and ratio(None, 2.0) == "—" and ratio(2.0, 0.0) == "—"


def _settings(ctx: Context) -> list[str]:
    return ["a", "b", "c"]


def _run(setting: str, ctx: Context) -> list[Row]:
    return [{"setting": setting, "value": {"a": 1.0, "b": 2.0, "c": 4.0}[setting] * ctx.args.scale}]


def _report(rows: list[Row], info: RunInfo) -> Report:
    best = max(r["value"] for r in rows)
    return Report(f"{len(rows)} rows, scale {info.options['scale']}",
                  (Headline("torch", "best value", best, unit="", target=Target(">=", 3.0), config="toy"),
                   Headline("papers", "paper figure", 2.0, paper="2.5×", paper_value=2.5)),
                  (Chart("torch", "bars", "toy bars", "bars", "value", categories=("a", "b"),
                         series=(("x", (1.0, None)), ("y", (2.0, 3.0)))),
                   Chart("fidelity", "scatter", "toy scatter", "scatter", "measured", "predicted",
                         points=((1.0, 1.1, "a"), (2.0, 1.8, ""))),
                   Chart("methods", "lines", "toy lines", "lines", "loss", "samples",
                         points=((0.0, 2.0, "a"), (1.0, 1.5, "a"), (0.0, 2.2, "b"), (1.0, 1.9, "b")))))


def _arguments(p: object) -> None:
    p.add_argument("--scale", type=float, default=1.0)  # type: ignore[attr-defined]


TOY = Experiment(name="toy", title="A toy experiment", settings=_settings, run=_run, report=_report,
                 arguments=_arguments, repeats=2)


def _only_record(folder: Path) -> Path:
    (path,) = folder.glob("*.json")
    return path


def test_main_runs_rotated_rounds_and_writes_a_complete_record(tmp_path: Path) -> None:
    assert main(TOY, ["--out", str(tmp_path), "--scale", "2"]) == 0
    record = load_record(_only_record(tmp_path))
    assert record.complete and record.experiment == "toy" and record.run.repeats == 2
    assert [(r["setting"], r["round"]) for r in record.rows] == [("a", 0), ("b", 0), ("c", 0),
                                                                 ("b", 1), ("c", 1), ("a", 1)]
    assert record.run.options == {"scale": 2.0} and record.headlines[0].value == 8.0
    assert record.command.endswith("--out " + str(tmp_path) + " --scale 2")
    assert {"cores", "torch", "device", "load_before", "load_after"} <= set(record.machine)
    assert [c["area"] for c in record.charts] == ["torch", "fidelity", "methods"]
    assert all((tmp_path / c["file"]).stat().st_size > 0 for c in record.charts)
    md = _only_record(tmp_path).with_suffix(".md").read_text()
    assert "| best value | 8 |" in md and "6 rows, scale 2.0" in md and md == render_markdown(record)


def test_quick_runs_are_named_apart_and_rereport_renders_stored_rows(tmp_path: Path) -> None:
    main(TOY, ["--out", str(tmp_path), "--quick"])
    path = _only_record(tmp_path)
    assert path.stem.endswith("-quick") and load_record(path).run.repeats == 1
    data = json.loads(path.read_text())
    data["rows"] = data["rows"][:1]
    data["complete"] = False
    path.write_text(json.dumps(data))
    assert main(TOY, ["--rereport", str(path)]) == 0
    record = load_record(path)
    assert record.complete and "1 rows" in record.markdown and "stopped early" in record.note


def test_the_page_shows_the_newest_full_run_with_its_targets(tmp_path: Path) -> None:
    results = tmp_path / "results"
    main(TOY, ["--out", str(results / "toy"), "--quick"])
    quick_page = build_page([("toy", TOY.title, Path(__file__)), ("other", "Another", Path(__file__))], results)
    assert "quick" in quick_page and "No complete run with the harness yet" in quick_page
    main(TOY, ["--out", str(results / "toy"), "--scale", "0.5"])
    (results / "toy" / "results.json").write_text("[{}]")  # a legacy run's rows beside the records: skipped
    latest = latest_records(results)["toy"]
    assert not latest.record.run.quick and len(latest.older) == 1
    page = build_page([("toy", TOY.title, Path(__file__))], results)
    assert "| best value | 2 | — | ≥ 3 | ❌ not met | toy |" in page
    assert "| paper figure | 2.00× | 2.5× | — | — |" in page
    assert "**0 targets met, 1 not met.**" in page and "Earlier runs:" in page


def test_a_record_of_another_experiment_is_not_rereported(tmp_path: Path) -> None:
    main(TOY, ["--out", str(tmp_path), "--quick"])
    other = Experiment(name="other", title="x", settings=_settings, run=_run, report=_report, arguments=_arguments)
    with pytest.raises(SystemExit, match="record of 'toy'"):
        main(other, ["--rereport", str(_only_record(tmp_path))])


def test_many_or_long_categories_draw_as_horizontal_bars(tmp_path: Path) -> None:
    from harness.charts import draw

    names = tuple(f"a figure with a long name, number {i}" for i in range(12))
    chart = Chart("papers", "many", "many bars", "bars", "speed-up (×)", categories=names,
                  series=(("paper", tuple(1.0 + i for i in range(12))), ("pipetrain", (None, *range(11)))))
    draw(chart, tmp_path / "many.png")
    assert (tmp_path / "many.png").stat().st_size > 0
