"""A script that trains at its top level, without ``if __name__ == "__main__":``: every spawned rank
imports it and reaches training again. The user gets one line saying what to add, not a dead rank
and pages of tracebacks from every process."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipetrain.errors import UserError
from pipetrain.runtime.process import spawn

ROOT = Path(__file__).resolve().parents[2]

UNGUARDED = textwrap.dedent("""\
    import pipetrain

    result = pipetrain.train("mlp-digits", ranks=2, batch_size=32, steps=2)
    print(result.losses)
""")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_unguarded_script_gets_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train_now.py"
    script.write_text(UNGUARDED)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=170,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    output = run.stdout + run.stderr
    assert run.returncode != 0
    advice = [line for line in output.splitlines() if 'if __name__ == "__main__":' in line]
    assert len(advice) == 1 and advice[0].startswith("pipetrain.errors.UserError: "), output
    assert "died" not in output and "bootstrapping" not in output, output
    assert output.count("Traceback") == 1 and len(output.splitlines()) < 40, output


def test_other_bootstrapping_process_gets_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that is not one of our ranks, importing a script that trains: the error itself."""
    process = multiprocessing.current_process()
    monkeypatch.setattr(process, "_inheriting", True, raising=False)
    with pytest.raises(UserError, match='under \'if __name__ == "__main__":\''):
        spawn.launch_local([])
