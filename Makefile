# Set-up is part of both commands: the first run creates .venv (a few minutes), later
# runs reuse it. pip (not uv/poetry) so the CPU torch wheel on the machine is used.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup browser demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -e '.[cpu,dev]'
	# PyPI's torchvision next to the CPU torch breaks transformers' model imports
	$(VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP) browser

# Debian's chromium for the dashboard test (tests/test_dashboard.py drives it through
# Playwright; no browser is ever downloaded). Installed with apt-get when running as root;
# otherwise a note, and that one test skips.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	  else \
	    echo "note: chromium is missing (apt-get install chromium as root);" \
	      "tests/test_dashboard.py will be skipped"; \
	  fi; }

demo: $(STAMP)
	$(VENV)/bin/onthejob demo

test: $(STAMP) browser
	$(VENV)/bin/python -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(VENV)/bin/python -m bench.proxy_overhead
