"""Regenerate BENCHMARKS.md (and its paper-against-pipetrain picture) from benchmarks/results/.

    .venv/bin/python benchmarks/make_page.py            # write the page
    .venv/bin/python benchmarks/make_page.py --check    # exit 1 if the page is not in sync
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.discover import entries
from harness.page import PAGE, build_page, draw_page_charts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--check", action="store_true", help="compare with the page instead of writing it")
    args = p.parse_args(argv)
    text = build_page([(e.name, e.title, e.script) for e in entries()])
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE} is not in sync with benchmarks/results/: run python benchmarks/make_page.py")
            return 1
        return 0
    draw_page_charts()
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
