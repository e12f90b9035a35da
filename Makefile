# Dressage developer entry points. Every target bootstraps .venv first (seconds when ready).
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export RAY_AUTH_MODE := disabled

.PHONY: venv test test-ui lint typecheck pytest assets demo airflow clean

venv:
	@bash scripts/bootstrap.sh

## make test: lint (ruff), type-check (mypy on dressage/), the layer rules (lint-imports), then
## the whole pytest suite
test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

pytest: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## make test-ui: the browser test of `make airflow` (tests/ui/; about 8 minutes, so not in
## make test): Debian's chromium (apt, as root) and playwright-core (npm ci) when missing;
## screenshots in tests/ui/artifacts/
test-ui: venv
	@[ -x /usr/bin/chromium ] || { apt-get update && apt-get install -y chromium; }
	cd tests/ui && npm ci --no-audit --no-fund
	cd tests/ui && node --test --test-concurrency=1 airflow_ui.test.mjs

## make demo: dressage_mopd end to end on the embedded default, through Airflow (<= 10 min)
demo: venv
	bash scripts/demo.sh $(DEMO_ARGS)

## make airflow: Airflow standalone on http://127.0.0.1:8080 with the dressage DAGs
airflow: venv
	bash scripts/airflow.sh

## make assets: build the offline Qwen tokenizers and the tiny model into the cache
assets: venv
	$(BIN)/python -m dressage.tiny

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
