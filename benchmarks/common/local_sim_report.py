"""local-sim's report: PPLL's simulated speed-ups per model, head kind and cost setting, beside the paper's."""

from __future__ import annotations

from harness import Chart, Headline, Report, Row, RunInfo

__all__ = ["PAPER", "report"]

PAPER = {"resnet": (33.0, 0.85), "vit": (162.0, 1.25)}  # +% over sequential local learning, × backprop pipeline
HEADLINE = ("dgl", "host queues")  # the paper group's heads, messages staged through host memory as the runtime's


def _ms(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _described(rows: list[Row]) -> str:
    seen = {r["setting"]: r for r in rows}
    return "; ".join(f"{name}: heads {r['width']} wide, per message send {r['host']['send_s'] * 1e6:.1f} µs + "
                     f"{r['host']['send_per_byte_s'] * 1e9:.3f} ns/B, receive {r['host']['recv_s'] * 1e6:.1f} µs + "
                     f"{r['host']['recv_per_byte_s'] * 1e9:.3f} ns/B" for name, r in seen.items())


def report(rows: list[Row], info: RunInfo) -> Report:
    batch, micro = info.options.get("batch", 256), info.options.get("micro", 8)
    lines = [
        f"Batch {batch} in {micro} micro-batches of {batch // micro}; estimated profiles (roofline, V100 model); "
        "NVLink 2 between the 4 devices. Paper: ResNet +33 % over sequential local learning and 0.85× the backprop "
        "pipeline; ViT +162 % and 1.25×.", "", f"Settings: {_described(rows)}", "",
        "| model | aux | setting | stages (layers) | local stream samples/s | local one batch | local, equal layer "
        "counts | sequential local | 1f1b same stages | 1f1b own stages | local vs sequential | local vs 1f1b (same) "
        "| peak activations MiB: local, 1f1b | paper |", "|---" * 14 + "|"]
    for r in rows:
        pct, times = PAPER[r["model"]]
        lines.append(f"| {r['model']} ({r['zoo']}) | {r['aux']} | {r['setting']} | {'/'.join(map(str, r['stages']))} | "
                     f"{r['local_stream']:,.0f} | {r['local_batch']:,.0f} | {r['local_equal_split']:,.0f} | "
                     f"{r['sequential']:,.0f} | {r['backprop_same']:,.0f} | {r['backprop_balanced']:,.0f} "
                     f"({'/'.join(map(str, r['backprop_stages']))}) | {r['vs_sequential_pct']:+.0f} % | "
                     f"{r['vs_backprop']:.2f}× | {r['local_peak_mib']:.1f}, {r['backprop_peak_mib']:.1f} | "
                     f"{pct:+.0f} %, {times:.2f}× |")
    lines += ["", "Per stage, ms per micro-batch: stage F + B | head F + B | steps (stage and head) | messages' host "
              "seconds", "", "| model | aux | setting | stage F+B | head F+B | steps | messages |", "|---" * 7 + "|"]
    lines += [f"| {r['model']} | {r['aux']} | {r['setting']} | {_ms(r['stage_ms'])} | {_ms(r['head_ms'])} | "
              f"{_ms(r['step_ms'])} | {_ms(r['message_ms'])} |" for r in rows]
    picked = [r for r in rows if (r["aux"], r["setting"]) == HEADLINE]
    config = f"simulated, 4 V100, batch {batch} in {micro}, dgl heads 128 wide, host-staged messages"
    headlines = []
    for r in picked:
        pct, times = PAPER[r["model"]]
        headlines += [Headline("papers", f"PPLL {r['model']}: local learning's gain over sequential local learning",
                               r["vs_sequential_pct"], unit="%", paper=f"+{pct:.0f} %", config=config),
                      Headline("papers", f"PPLL {r['model']}: local learning over the backprop pipeline (1F1B)",
                               r["vs_backprop"], paper=f"{times:.2f}×", paper_value=times, config=config)]
    settings = list(dict.fromkeys(r["setting"] for r in rows if r["aux"] == HEADLINE[0]))
    models = list(PAPER)

    def series(key: str, paper: int) -> tuple[tuple[str, tuple[float | None, ...]], ...]:
        ours = tuple((s, tuple(next((r[key] for r in rows if (r["model"], r["aux"], r["setting"]) == (m, "dgl", s)),
                                    None) for m in models)) for s in settings)
        return (("paper", tuple(PAPER[m][paper] for m in models)), *ours)

    charts = (Chart("papers", "vs-backprop", "PPLL over the backprop pipeline (dgl heads), paper and pipetrain",
                    "bars", "× 1f1b", categories=tuple(models), series=series("vs_backprop", 1)),
              Chart("papers", "vs-sequential", "PPLL over sequential local learning (dgl heads), paper and pipetrain",
                    "bars", "% faster", categories=tuple(models), series=series("vs_sequential_pct", 0)))
    return Report("\n".join(lines), tuple(headlines), charts)
