# Everyday commands. The virtual environment lives in .venv (`make install` makes it).
# Pass overrides to train with ARGS, e.g. `make train ARGS="model=lstm trainer=gpu"`.

VENV ?= .venv
PYTHON := $(VENV)/bin/python
ARGS ?=

.PHONY: install hooks train test test-fast lint format clean

install:  ## the package and its dev tools (pytest, ruff, trackers) into .venv
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -e ".[dev]"

hooks:  ## lint and format on every git commit (.pre-commit-config.yaml)
	$(VENV)/bin/pre-commit install

train:  ## python train.py $(ARGS)
	$(PYTHON) train.py $(ARGS)

test:  ## every test, as CI runs them
	$(PYTHON) -m pytest --slow

test-fast:  ## without real training runs and subprocesses, while editing
	$(PYTHON) -m pytest

lint:  ## what CI checks: no lint errors, formatted
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:  ## fix what can be fixed, then format
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:  ## caches and build files; runs (logs/) and data (data/) stay
	rm -rf .pytest_cache .ruff_cache build dist src/*.egg-info
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
