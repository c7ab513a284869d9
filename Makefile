# noetl-stream — the two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PLAYBOOK ?= playbooks/hello.yaml
# The suite runs its test files on this many pytest-xdist workers (each with its own nats-server and
# PostgreSQL): most tests wait on processes and the network, so 2 halve the wall time on 2 cores.
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install run test stress cluster-test lint bench ci clean chromium

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-13s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the package with test extras

# The viewer tests drive Debian's headless Chromium (tests/test_viewer.py); installed once, as root or with sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

chromium: ## Install Debian's chromium + chromium-driver if missing (for the viewer tests)
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; \
	fi

run: $(STAMP) ## Run the demo playbook on an embedded NATS server
	$(BIN)/noetl-stream run $(PLAYBOOK)

test: $(STAMP) chromium ## Run the whole test suite (TEST_WORKERS=0 runs it in one process)
	$(BIN)/pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

stress: $(STAMP) ## Randomized fault runs (500+ executions, kills): tests marked stress
	$(BIN)/pytest -q -m stress

cluster-test: $(STAMP) ## 3-node nats-server cluster, R3, a node killed mid-run: tests marked cluster
	$(BIN)/pytest -q -m cluster

lint: $(STAMP) ## ruff + mypy --strict + import boundaries
	$(BIN)/ruff check noetl_stream tests bench deploy
	$(BIN)/ruff format --check noetl_stream tests bench deploy
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP) ## Benchmarks (writes bench-results.json)
	$(BIN)/python -m bench

ci: lint test ## What CI runs, and lint

clean: ## Remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
