# noetl-stream — the two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PLAYBOOK ?= playbooks/hello.yaml

.DEFAULT_GOAL := help
.PHONY: help install run test stress lint bench ci clean

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the package with test extras

run: $(STAMP) ## Run the demo playbook on an embedded NATS server
	$(BIN)/noetl-stream run $(PLAYBOOK)

test: $(STAMP) ## Run the whole test suite
	$(BIN)/pytest -q

stress: $(STAMP) ## Randomized fault runs (500+ executions, kills): tests marked stress
	$(BIN)/pytest -q -m stress

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
