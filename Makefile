# The two entry points a fresh machine needs (README): `make demo` and `make test`.
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -euo pipefail -c

DEMO_DIR ?= target/demo
DEMO_SAMPLES ?= 2000
BRAND := target/release/brand

.PHONY: demo test rust-test python-test lint build

build:
	cargo build --release --locked

# Generate an ImageNet-like set (110 KiB mean, 10-300 KiB), pack it, inspect and verify it,
# plan it at a 10 % memory budget, then read two epochs through the io engine.
demo: build
	rm -rf $(DEMO_DIR)
	$(BRAND) gen $(DEMO_DIR)/files --samples $(DEMO_SAMPLES) --classes 100 --seed 1
	$(BRAND) pack $(DEMO_DIR)/files -o $(DEMO_DIR)/dataset --seed 1
	$(BRAND) inspect $(DEMO_DIR)/dataset
	$(BRAND) verify $(DEMO_DIR)/dataset
	$(BRAND) simulate $(DEMO_DIR)/dataset --memory 10% --epochs 2
	$(BRAND) read $(DEMO_DIR)/dataset --memory 10% --epochs 2 --read-gap auto

lint:
	cargo fmt --all --check
	cargo clippy --locked --all-targets -- -D warnings

rust-test:
	cargo test --workspace --locked

# Tests against real TensorFlow (the venv lives outside the repo, see scripts/tf-venv.sh).
python-test: build
	venv=$$(scripts/tf-venv.sh)
	BRAND_BIN=$(CURDIR)/$(BRAND) "$$venv/bin/python" -m pytest -q tests/python

test: lint rust-test python-test
