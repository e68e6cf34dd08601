"""The benchmarks' harness: one experiment shape, one ``main``, one record format, one results page.

A benchmark script defines an :class:`Experiment` and ends with ``raise SystemExit(main(EXPERIMENT))``;
see ``benchmarks/README.md``.
"""

from .cli import RESULTS, main
from .experiment import AREAS, Chart, Context, Experiment, Headline, Report, Row, RunInfo, Target
from .limits import bounded
from .timing import Stats, kendall_tau_b, paired, pct, ratio, stats

__all__ = ["AREAS", "RESULTS", "Chart", "Context", "Experiment", "Headline", "Report", "Row", "RunInfo", "Stats",
           "Target", "bounded", "kendall_tau_b", "main", "paired", "pct", "ratio", "stats"]
