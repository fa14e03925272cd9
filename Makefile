# The two quick-start commands: `make demo` and `make test`. Both set up what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench up down status

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/agentledger demo

bench: $(STAMP)
	$(BIN)/agentledger bench

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# tests/run lints (ruff, mypy) beside the tests, as a fifth process
test: $(STAMP)
	tests/ensure-chromium
	tests/run

up: $(STAMP)
	$(BIN)/agentledger infra up

down: $(STAMP)
	$(BIN)/agentledger infra down

status: $(STAMP)
	$(BIN)/agentledger infra status
