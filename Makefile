# noetl-stream — the two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PLAYBOOK ?= playbooks/hello.yaml
# The suite runs its test files on this many pytest-xdist workers (each with its own nats-server and
# PostgreSQL): most tests wait on processes and the network, so 2 halve the wall time on 2 cores.
TEST_WORKERS ?= 2

# Every dependency, direct and transitive, test and dev extras included, is pinned in uv.lock. uv itself
# is the one thing installed from a version written here, into a venv of its own: nothing but Python is
# needed to start.
UV_VERSION := 0.13.10
TOOLS      := .venv-tools
UV         := $(TOOLS)/bin/uv
export UV_PYTHON_DOWNLOADS := never
# The newest releases the pyproject ranges allow, in a venv of their own (make test-latest).
LATEST     := .venv-latest

.DEFAULT_GOAL := help
.PHONY: help install lock test-latest run test stress cluster-test lint bench ci clean chromium

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-13s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# --locked: the lock must match pyproject.toml (else: make lock); exactly its versions are installed.
$(STAMP): pyproject.toml uv.lock | $(UV)
	$(UV) sync --locked --all-extras --python $(PYTHON)
	@touch $(STAMP)

install: $(STAMP) ## Create .venv with exactly the versions in uv.lock (the package, test and dev extras)

lock: | $(UV) ## Re-resolve uv.lock after editing pyproject.toml (UPGRADE=1: newest allowed versions)
	$(UV) lock --python $(PYTHON) $(if $(UPGRADE),--upgrade,)

test-latest: | $(UV) chromium ## The suite on the newest versions pyproject.toml allows (a venv of its own)
	rm -rf $(LATEST)
	$(UV) venv --quiet --python $(PYTHON) $(LATEST)
	VIRTUAL_ENV=$(LATEST) $(UV) pip install --quiet --upgrade -e '.[test,dev,otel]'
	VIRTUAL_ENV=$(LATEST) $(UV) pip list --format freeze > $(LATEST)/versions.txt
	@echo "versions: $(LATEST)/versions.txt"
	$(LATEST)/bin/pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The viewer tests drive Debian's headless Chromium (tests/api/test_viewer.py); installed once, as root or with sudo.
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
	rm -rf $(VENV) $(TOOLS) $(LATEST) .pytest_cache .mypy_cache .ruff_cache
