# The two entry points a fresh machine needs (README): `make demo` and `make test`.
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -euo pipefail -c

# Cargo's output directory: an inherited CARGO_TARGET_DIR, else target/ here.
CARGO_TARGET_DIR ?= $(CURDIR)/target
export CARGO_TARGET_DIR
TARGET := $(abspath $(CARGO_TARGET_DIR))

DEMO_DIR ?= target/demo
DEMO_SAMPLES ?= 2000
BRAND := $(TARGET)/release/brand

.PHONY: demo test rust-test python-test py-test lint build capi-build capi-test cpp-test tools bench bench-test fuzz fuzz-replay \
	install uninstall install-test

# What `make test` calls besides cargo, gcc and Python: installed here when
# missing, so a fresh machine needs nothing else (root and Debian's apt).
TOOLS := cmake valgrind pkg-config
tools:
	missing=()
	for tool in $(TOOLS); do command -v "$$tool" >/dev/null || missing+=("$$tool"); done
	if (( $${#missing[@]} )); then
		echo "installing $${missing[*]} (apt-get)"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$${missing[@]}" >/dev/null
	fi

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
	cargo fmt --manifest-path fuzz/Cargo.toml --check
	cargo clippy --locked --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings

rust-test:
	cargo test --workspace --locked

# Tests against real TensorFlow, all in tf-op/tests (the venv lives outside the repo, see
# scripts/tf-venv.sh): TFRecords written by TF pack and round-trip; the BrandDataset op (built
# against the installed TF). One pytest process: each imports TensorFlow.
python-test: build
	venv=$$(scripts/tf-venv.sh)
	BRAND_BIN=$(BRAND) tf-op/test.sh "$$venv/bin/python"

# brand's Python package (python/, its own cargo workspace): fmt and clippy of its extension
# crate, its abi3 wheel built by maturin and installed into the test venv (scripts/py-venv.sh:
# numpy, torch, torchdata, grain, pytest, maturin; outside the repo), then python/tests
# against those real libraries, including the wheel in a fresh venv without cargo.
PY_WHEELS := $(TARGET)/wheels
py-test:
	venv=$$(scripts/py-venv.sh)
	cargo build --release --locked -p brand-cli
	cargo fmt --manifest-path python/Cargo.toml --check
	cargo clippy --locked --manifest-path python/Cargo.toml --all-targets -- -D warnings
	rm -f $(PY_WHEELS)/brand-*.whl
	"$$venv/bin/maturin" build --release --locked --manifest-path python/Cargo.toml -o $(PY_WHEELS)
	"$$venv/bin/python" -m uv pip install --quiet --python "$$venv/bin/python" --no-deps --reinstall $(PY_WHEELS)/brand-*.whl
	BRAND_BIN=$(BRAND) "$$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests

# The C ABI (capi/): libbrand.a and libbrand.so, and the brand CLI that makes test data.
capi-build:
	cargo build --release --locked -p brand-cli -p brand-capi

# capi/tests/c/abi_test.c as C11 and as C++17, linked statically and
# dynamically, under valgrind, and with ASan+UBSan, on a small dataset made
# by the CLI. The native libraries are what
# `cargo rustc --release -p brand-capi --crate-type staticlib -- --print native-static-libs` prints.
CAPI_OUT := $(TARGET)/capi-test
CAPI_LIBDIR := $(TARGET)/release
CAPI_NATIVE_LIBS := -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
CAPI_WARN := -Wall -Wextra -Wpedantic -Werror -g -O1 -Icapi/include
CAPI_SAMPLES := 150
VALGRIND := valgrind -q --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect \
	--errors-for-leak-kinds=definite,indirect

capi-test: capi-build tools
	rm -rf $(CAPI_OUT) && mkdir -p $(CAPI_OUT)
	$(BRAND) gen $(CAPI_OUT)/files --samples $(CAPI_SAMPLES) --mean-kib 4 --min-kib 1 --max-kib 16 --classes 5 --seed 2
	$(BRAND) pack $(CAPI_OUT)/files -o $(CAPI_OUT)/ds --chunk-size 16 --seed 2
	src=capi/tests/c/abi_test.c
	static="$(CAPI_LIBDIR)/libbrand.a $(CAPI_NATIVE_LIBS)"
	shared="-L$(CAPI_LIBDIR) -lbrand -Wl,-rpath,$(CAPI_LIBDIR)"
	gcc -std=c11 $(CAPI_WARN) $$src $$static -o $(CAPI_OUT)/abi_c_static
	gcc -std=c11 $(CAPI_WARN) $$src $$shared -o $(CAPI_OUT)/abi_c_shared
	g++ -x c++ -std=c++17 $(CAPI_WARN) $$src -x none $$static -o $(CAPI_OUT)/abi_cxx_static
	g++ -x c++ -std=c++17 $(CAPI_WARN) $$src -x none $$shared -o $(CAPI_OUT)/abi_cxx_shared
	gcc -std=c11 $(CAPI_WARN) -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
		$$src $$static -o $(CAPI_OUT)/abi_c_asan
	nm $(CAPI_OUT)/abi_c_asan | grep __asan_init >/dev/null || { echo "abi_c_asan is not instrumented"; exit 1; }
	ldd $(CAPI_OUT)/abi_c_shared | grep "libbrand.so => $(CAPI_LIBDIR)" >/dev/null || { echo "abi_c_shared: no libbrand.so"; exit 1; }
	args="$(CAPI_OUT)/ds $(CAPI_OUT)/files $(CAPI_SAMPLES)"
	for t in abi_c_static abi_c_shared abi_cxx_static abi_cxx_shared abi_c_asan; do
		echo "== $$t"; $(CAPI_OUT)/$$t $$args
	done
	for t in abi_c_static abi_cxx_shared; do
		echo "== valgrind $$t"; $(VALGRIND) $(CAPI_OUT)/$$t $$args
	done

# cpp-examples/ (CMake): the RAII wrapper, train_loop and brand_throughput, tested with ctest.
CPP_BUILD := $(TARGET)/cpp-examples
cpp-test: capi-build tools
	cmake -S cpp-examples -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DBRAND_CARGO_TARGET_DIR=$(TARGET)
	cmake --build $(CPP_BUILD) -j 2
	ctest --test-dir $(CPP_BUILD) --output-on-failure

test: tools lint rust-test fuzz-replay capi-test cpp-test install-test python-test py-test bench-test

# The benchmark harness (bench/, see bench/README.md): brand against fio, PyTorch's DataLoader,
# SPDL, tf.data and a per-file loader, larger than memory (a memory cgroup per run) on the raw disk
# and on blkio-throttled "network" storage. The small preset end to end takes about 20 minutes on
# this 2-core machine, as root. Its venv (torch with its CUDA wheels, spdl, TensorFlow: ~7 GB) lives
# outside the repo (scripts/bench-venv.sh); data and results go to /var/tmp/brand-bench.
# BENCH_ARGS= runs the full preset (9 GB, hours).
BENCH_OUT ?= /var/tmp/brand-bench/out-small
BENCH_ARGS ?= --small
bench: capi-build tools
	venv=$$(scripts/bench-venv.sh)
	cmake -S cpp-examples -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DBRAND_CARGO_TARGET_DIR=$(TARGET)
	cmake --build $(CPP_BUILD) --target brand_throughput -j 2
	"$$venv/bin/python" tf-op/build.py --lib $(TARGET)/release/libbrand.a
	BRAND_BIN=$(BRAND) BRAND_THROUGHPUT_BIN=$(CPP_BUILD)/brand_throughput \
		"$$venv/bin/python" bench/run.py $(BENCH_ARGS) --out $(BENCH_OUT)

# The harness's own logic (parsers, ratios, report, plots from a fake run): matplotlib and
# pytest only, no torch or TensorFlow.
bench-test:
	venv=$$(scripts/bench-venv.sh test)
	"$$venv/bin/python" -m pytest -q -p no:cacheprovider bench/tests

# Coverage-guided fuzzing (libFuzzer on stable Rust, fuzz/README.md): each
# target for FUZZ_SECONDS; FUZZ_TARGETS="index manifest" picks some.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh $(FUZZ_TARGETS)

# Every fuzz corpus file through its target, uninstrumented (part of make test).
fuzz-replay:
	cargo test --locked --manifest-path fuzz/Cargo.toml
