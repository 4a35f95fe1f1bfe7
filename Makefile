# vagent — everything a newcomer needs is `make run` and `make test`.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help venv run chat test soak soak-schedules unit lint typecheck pytest redis bench-graph bench-bot bench-rag bench-capacity bench-langgraph-venv bench-attachments bench-memory lock clean

help:  ## this list
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv:  ## create .venv from the hash-pinned requirements (safe to repeat)
	@scripts/bootstrap.sh

run: venv  ## run the product locally: Redis, Synapse, access control, graph (offline model unless an LLM is configured), bot
	@$(BIN)/python scripts/run_local.py

chat: venv  ## talk to the bot from this terminal as @alice:localhost (with `make run` running)
	@$(BIN)/vagent-chat

test: venv lint typecheck pytest  ## set up everything and run the whole suite

lint: venv  ## ruff, the import contracts (pyproject.toml [tool.importlinter]) and declared dependencies (deptry)
	$(BIN)/ruff check shared graph bot gateway dev tests scripts $(wildcard bench)
	$(BIN)/lint-imports
	@for p in shared graph bot gateway dev; do (cd $$p && ../$(BIN)/deptry . --no-ansi) || exit 1; done

typecheck: venv  ## mypy (strict) on the four packages, the tests, scripts and benchmarks
	$(BIN)/mypy

pytest: venv  ## the test suite (unit, integration, end-to-end)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

soak: venv  ## fault soak: the bot SIGKILLed at random over SOAK_MESSAGES (500) messages; each answered once
	$(BIN)/python -m pytest -m soak tests/e2e/test_faults_e2e.py -s $(PYTEST_ARGS)

soak-schedules: venv  ## schedule soak: recurring jobs and one-offs over SOAK_SCHEDULE_RUNS (200) due runs, the bot SIGKILLed at random; each run once, none after its job was deleted
	$(BIN)/python -m pytest -m soak tests/e2e/test_schedules_soak_e2e.py -s $(PYTEST_ARGS)

unit: venv  ## only the fast tests that need no server
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

redis: venv  ## local Redis 8 + search + JSON on 127.0.0.1:$${REDIS_PORT:-6390}, data in .data/redis (make run's main one; no entity graphs)
	$(BIN)/python scripts/redis_local.py --port $${REDIS_PORT:-6390} --dir .data/redis --modules main

bench-graph: venv  ## benchmark: bare graph.astream vs the HTTP/SSE service
	$(BIN)/python bench/bench_graph.py $(BENCH_ARGS)

bench-rag: venv  ## benchmark: ingestion chunks/s, filtered vs unfiltered search p50/p99, recall@10 vs brute force
	$(BIN)/python bench/bench_rag.py $(BENCH_ARGS)

bench-bot: venv  ## benchmark: send -> first visible reply / final edit, vagent vs a minimal echo bot
	$(BIN)/python bench/bench_bot.py $(BENCH_ARGS)

bench-capacity: venv  ## benchmark: concurrent conversations one graph process carries behind a paced model; parked-question cost
	$(BIN)/python bench/bench_capacity.py $(BENCH_ARGS)

bench-langgraph-venv: venv  ## the venv of LangGraph's own server for `bench-capacity --peer langgraph` (.data/bench-langgraph-venv)
	@test -x .data/bench-langgraph-venv/bin/python || $(BIN)/python -m venv .data/bench-langgraph-venv
	@$(BIN)/uv pip install --quiet --python .data/bench-langgraph-venv/bin/python --require-hashes -r requirements/bench-langgraph.txt

bench-attachments: venv  ## benchmark: first-token p99 of 20 conversations while a 20 MB PDF and a 10 MB image are read; reading time, peak RSS
	$(BIN)/python bench/bench_attachments.py $(BENCH_ARGS)

bench-memory: venv  ## benchmark: what recall adds to a turn (1,000 users x 200 memories, 20 conversations); Redis bytes per memory
	$(BIN)/python bench/bench_memory.py $(BENCH_ARGS)

lock: venv  ## re-resolve requirements/*.txt (hash-pinned, no URLs) after changing dependencies
	@for f in dev graph bot gateway standins bench-langgraph; do \
	  $(BIN)/uv pip compile --quiet --python-version 3.11 --generate-hashes --no-header \
	    --no-emit-package vagent-shared --no-emit-package vagent-graph --no-emit-package vagent-bot --no-emit-package vagent-gateway --no-emit-package vagent-dev \
	    requirements/$$f.in -o requirements/$$f.txt || exit 1; \
	done; ! grep -n '://' requirements/*.txt

clean:  ## remove .venv and local data
	rm -rf $(VENV) .data .mypy_cache .ruff_cache
