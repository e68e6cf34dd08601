"""Run every benchmark (or the ones named), then regenerate BENCHMARKS.md.

    .venv/bin/python benchmarks/run_all.py --quick            # `make benchmarks-quick`
    .venv/bin/python benchmarks/run_all.py core umpipe-sim    # full runs of two experiments

Each experiment runs as its own command (``python benchmarks/<script>.py [--quick]``), so what its
record says ran is what ran. One that fails or passes ``--timeout`` is reported and the others go on;
the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_page
from harness.discover import entries
from harness.machine import REPO


def main(argv: list[str] | None = None) -> int:
    known = {e.name: e for e in entries()}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("names", nargs="*", metavar="NAME", help=f"experiments to run (default all: {', '.join(known)})")
    p.add_argument("--quick", action="store_true", help="each experiment's quick run")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per experiment (default 900)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        p.error(f"no experiment named {', '.join(unknown)}; known: {', '.join(known)}")
    failed, t0 = [], time.perf_counter()
    for name in args.names or list(known):
        command = [sys.executable, str(known[name].script), *(["--quick"] if args.quick else [])]
        start = time.perf_counter()
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        try:
            code = subprocess.run(command, cwd=REPO, timeout=args.timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            code = -1
        took = time.perf_counter() - start
        print(f"== {name}: {'ok' if code == 0 else 'FAILED' if code > 0 else 'timed out'} in {took:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    make_page.main([])
    print(f"{len(args.names or known) - len(failed)} ran, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else "") + f", {time.perf_counter() - t0:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
