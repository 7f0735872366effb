# Set-up is part of both commands: the first run creates .venv (a few minutes), later
# runs reuse it. pip (not uv/poetry) so the CPU torch wheel on the machine is used.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -e '.[cpu,dev]'
	# PyPI's torchvision next to the CPU torch breaks transformers' model imports
	$(VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/onthejob demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(VENV)/bin/python -m bench.proxy_overhead
