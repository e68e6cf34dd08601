# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test benchmarks-quick lint typecheck check clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pipetrain demo

test: $(STAMP)
	$(VENV)/bin/ruff check pipetrain tests benchmarks
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 2 --dist loadfile

benchmarks-quick: $(STAMP)
	$(PY) benchmarks/run_all.py --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check pipetrain tests benchmarks
	$(VENV)/bin/lint-imports --no-logo

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) out build *.egg-info
