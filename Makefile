# Set-up and checks. `make serve` and `make test` build .venv first when it is missing or stale.
VENV := .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.acs-ready
HOME_DIR ?= $(HOME)/.local/share/vllm-acs
TINY_MODEL ?= $(HOME_DIR)/models/tiny-llama
PORT ?= 8000

.PHONY: venv serve test lint unit e2e bench clean services

venv: $(READY)

$(READY): setup.py scripts/bootstrap-venv.sh
	bash scripts/bootstrap-venv.sh

lint: $(READY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The storage tests need the machine's PostgreSQL and Redis: started here when they are down.
# The request-window tests run a node behind nginx, the browser tests Chromium: installed here when
# the machine has none.
services:
	bash scripts/ensure-services.sh
	bash scripts/ensure-nginx.sh
	bash scripts/ensure-chromium.sh

test: $(READY) lint services
	$(PY) -m pytest

unit: $(READY)
	$(PY) -m pytest tests/unit

e2e: $(READY)
	$(PY) -m pytest tests/e2e

# The embedded default: the tiny model, SQLite under HOME_DIR, and a local key made on the first run
# and printed on every run (`vllm-acs local-key`; a node with a configured database makes none).
# The KV cache is sized for the model, not for the machine (vllm-acs serve on a CPU node).
serve: $(READY)
	$(VENV)/bin/vllm-acs tiny-model $(TINY_MODEL)
	@echo
	-@$(VENV)/bin/vllm-acs local-key --port $(PORT)
	@echo
	@echo "Starting a vllm_acs node on http://127.0.0.1:$(PORT) (tiny model, embedded SQLite)."
	VLLM_ACS_MODEL_ID=$${VLLM_ACS_MODEL_ID:-tiny-llama} $(VENV)/bin/vllm-acs serve $(TINY_MODEL) \
		--served-model-name vllm-acs/tiny-llama --host 127.0.0.1 --port $(PORT) \
		--max-model-len 2048

bench: $(READY)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
