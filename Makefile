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
# COMMAND or COMMAND:PACKAGE. `ip` (and util-linux's `unshare`) put the tests
# that start servers listening on every address (Ray, tf.data service, torchrun)
# in network namespaces of their own.
TOOLS := cmake valgrind pkg-config ip:iproute2 unshare:util-linux
tools:
	missing=()
	for spec in $(TOOLS); do command -v "$${spec%%:*}" >/dev/null || missing+=("$${spec#*:}"); done
	if (( $${#missing[@]} )); then
		echo "installing $${missing[*]} (apt-get)"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$${missing[@]}" >/dev/null
	fi

build:
	cargo build --release --locked -p brand-cli -p brand-capi

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

# The gs:// tests (crates/cli/tests/objects_gcs.rs) run a GCS emulator with the python of
# scripts/gcs-emulator.sh (gcp-storage-emulator from PyPI in a venv outside the repo).
rust-test:
	gcs_python=$$(scripts/gcs-emulator.sh)
	BRAND_GCS_PYTHON=$$gcs_python cargo test --workspace --locked

# Tests against real TensorFlow, all in tf-op/tests (the venv lives outside the repo, see
# scripts/tf-venv.sh; tf-op/test.sh): the brand wheel built and installed there, brand.tf's op
# compiled against the installed TF on first use (cached in $(TARGET)/brand-cache), and once
# more from the wheel in a fresh venv without cargo; TFRecords written by TF pack and round-trip.
# One pytest process: each imports TensorFlow.
python-test: build tools
	venv=$$(scripts/tf-venv.sh)
	cargo build --locked -p brand-s3-server
	BRAND_BIN=$(BRAND) BRAND_S3_SERVER=$(TARGET)/debug/brand-s3-server tf-op/test.sh "$$venv/bin/python"

# brand's Python package (python/, its own cargo workspace): fmt and clippy of its extension
# crate, its abi3 wheel built by maturin and installed into the test venv (scripts/py-venv.sh:
# numpy, torch, torchdata, grain, pytest, maturin, the formats' writers, ray, jax, moto; outside the
# repo), then python/tests against those real libraries, including the wheel in a fresh venv
# without cargo; Azure against Azurite (scripts/azurite.sh: node and npm from apt when missing).
PY_WHEELS := $(TARGET)/wheels
py-test: tools
	venv=$$(scripts/py-venv.sh)
	azurite=$$(scripts/azurite.sh)
	cargo build --release --locked -p brand-cli
	cargo build --locked -p brand-s3-server
	cargo fmt --manifest-path python/Cargo.toml --check
	cargo clippy --locked --manifest-path python/Cargo.toml --all-targets -- -D warnings
	rm -f $(PY_WHEELS)/brand-*.whl
	"$$venv/bin/maturin" build --release --locked --manifest-path python/Cargo.toml -o $(PY_WHEELS)
	"$$venv/bin/python" -m uv pip install --quiet --python "$$venv/bin/python" --no-deps --reinstall $(PY_WHEELS)/brand-*.whl
	BRAND_BIN=$(BRAND) BRAND_S3_SERVER=$(TARGET)/debug/brand-s3-server BRAND_AZURITE=$$azurite \
		"$$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests

# The C ABI (capi/): libbrand.a and libbrand.so, and the brand CLI that makes test data.
capi-build:
	cargo build --release --locked -p brand-cli -p brand-capi
	cargo build --locked -p brand-s3-server

# capi/tests/c/abi_test.c as C11 and as C++17, linked statically and
# dynamically, under valgrind, and with ASan+UBSan, on a small dataset made
# by the CLI. The native libraries are what
# `cargo rustc --release -p brand-capi --crate-type staticlib -- --print native-static-libs` prints.
CAPI_OUT := $(TARGET)/capi-test
CAPI_LIBDIR := $(TARGET)/release
CAPI_NATIVE_LIBS := -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
CAPI_WARN := -Wall -Wextra -Wpedantic -Werror -g -O1 -Icapi/include
CAPI_SAMPLES := 150
# A hang under valgrind (its lock held across a blocking syscall) fails
# here, named, rather than running into CI's limit.
VALGRIND := timeout 300 valgrind -q --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect \
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
		echo "== valgrind $$t"; $(VALGRIND) $(CAPI_OUT)/$$t $$args || { rc=$$?; echo "valgrind $$t failed (rc $$rc; 124: hung 300 s)"; exit 1; }
	done
	# The same test over a dataset in object storage: packed to a real S3 server on 127.0.0.1
	# (tools/s3-server via scripts/s3server.py, which gives the command its AWS_* environment).
	echo "== abi_c_shared over s3://"
	python3 scripts/s3server.py $(TARGET)/debug/brand-s3-server -- bash -c \
		'$(BRAND) pack $(CAPI_OUT)/files -o s3://bkt/ds --chunk-size 16 --seed 2 --staging $(CAPI_OUT) && \
		$(CAPI_OUT)/abi_c_shared s3://bkt/ds $(CAPI_OUT)/files $(CAPI_SAMPLES)'

# cpp-examples/ (CMake): the RAII wrapper, train_loop and brand_throughput, tested with ctest.
CPP_BUILD := $(TARGET)/cpp-examples
cpp-test: capi-build tools
	cmake -S cpp-examples -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DBRAND_CARGO_TARGET_DIR=$(TARGET)
	cmake --build $(CPP_BUILD) -j 2
	ctest --test-dir $(CPP_BUILD) --output-on-failure

# `make install [PREFIX=/usr/local] [DESTDIR=]`: brand for C and C++ as a package, built in
# release: include/brand.h and include/brand.hpp (cpp-examples' RAII wrapper, the one copy),
# lib/libbrand.so.MAJOR.MINOR.PATCH with its SONAME and the symlinks libbrand.so.MAJOR and
# libbrand.so, lib/libbrand.a, lib/pkgconfig/brand.pc and lib/cmake/brand/brandConfig.cmake
# (+ brandConfigVersion.cmake: the targets brand::brand and brand::brand_static). The templates
# are in capi/pkg/. DESTDIR stages the files (the .pc names PREFIX; the CMake files find their
# prefix from where they are). Without DESTDIR, as root, it runs $(LDCONFIG) (LDCONFIG=: skips it).
#
# The soname follows the ABI, not the package version: BRAND_ABI_VERSION (brand.h) changes exactly
# when a program built against the previous header would break (a signature, a struct layout or a
# status value changes incompatibly), which is when the soname must change. ABI 1 is
# libbrand.so.0 and ABI N is libbrand.so.(N-1): the soname major is BRAND_ABI_VERSION - 1, and
# an additive release (same ABI) keeps the soname and changes only MINOR.PATCH of the file name.
# capi/build.rs passes the soname to the linker (cdylib only) when BRAND_SONAME is set, so a
# plain `cargo build` (make capi-build) still makes target/release/libbrand.so without one.
PREFIX ?= /usr/local
LDCONFIG ?= ldconfig
BRAND_PKG_FILES = include/brand.h include/brand.hpp lib/libbrand.a lib/libbrand.so lib/libbrand.so.$$somajor \
	lib/$$realname lib/pkgconfig/brand.pc lib/cmake/brand/brandConfig.cmake lib/cmake/brand/brandConfigVersion.cmake

# The names, from Cargo.toml's [workspace.package] version and brand.h's BRAND_ABI_VERSION.
define brand_pkg_names
	version=$$(sed -n 's/^version = "\([0-9]*\.[0-9]*\.[0-9]*\)"$$/\1/p' Cargo.toml)
	abi=$$(sed -n 's/^#define BRAND_ABI_VERSION \([0-9]*\)$$/\1/p' capi/include/brand.h)
	[[ $$version =~ ^[0-9]+\.[0-9]+\.[0-9]+$$ ]] || { echo "no x.y.z version in Cargo.toml: '$$version'" >&2; exit 1; }
	[[ $$abi =~ ^[1-9][0-9]*$$ ]] || { echo "no BRAND_ABI_VERSION in capi/include/brand.h: '$$abi'" >&2; exit 1; }
	IFS=. read -r major minor patch <<<"$$version"
	somajor=$$((abi - 1))
	soname=libbrand.so.$$somajor
	realname=$$soname.$$minor.$$patch
	[[ "$(PREFIX)" == /* && "$(PREFIX)" != *[[:space:]\|\']* ]] \
		|| { echo "PREFIX must be an absolute path without spaces, | or ': $(PREFIX)" >&2; exit 1; }
	dest='$(DESTDIR)$(PREFIX)'
endef

install:
	@$(brand_pkg_names)
	# The same packages as `make build`: one feature resolution, so the dependencies built there
	# are reused and only libbrand is linked again, with its soname.
	BRAND_SONAME=$$soname cargo build --release --locked -p brand-cli -p brand-capi
	so=$(TARGET)/release/libbrand.so
	readelf -d "$$so" | grep "(SONAME) .*\[$$soname\]" >/dev/null \
		|| { echo "$$so has no SONAME $$soname (capi/build.rs, BRAND_SONAME)" >&2; exit 1; }
	install -d "$$dest/include" "$$dest/lib/pkgconfig" "$$dest/lib/cmake/brand"
	install -m 644 capi/include/brand.h cpp-examples/include/brand.hpp "$$dest/include/"
	install -m 755 "$$so" "$$dest/lib/$$realname"
	ln -sfn "$$realname" "$$dest/lib/$$soname"
	ln -sfn "$$soname" "$$dest/lib/libbrand.so"
	install -m 644 $(TARGET)/release/libbrand.a "$$dest/lib/libbrand.a"
	native='$(CAPI_NATIVE_LIBS)'
	subst="s|@PREFIX@|$(PREFIX)|g; s|@VERSION@|$$version|g; s|@VERSION_MAJOR@|$$major|g; s|@VERSION_MINOR@|$$minor|g"
	subst+="; s|@ABI_VERSION@|$$abi|g; s|@SONAME@|$$soname|g; s|@REALNAME@|$$realname|g"
	subst+="; s|@NATIVE_LIBS@|$$native|g; s|@NATIVE_LIBS_CMAKE@|$${native// /;}|g; s|@SIZEOF_VOID_P@|$$(( $$(getconf LONG_BIT) / 8 ))|g"
	sed "$$subst" capi/pkg/brand.pc.in > "$$dest/lib/pkgconfig/brand.pc"
	sed "$$subst" capi/pkg/brandConfig.cmake.in > "$$dest/lib/cmake/brand/brandConfig.cmake"
	sed "$$subst" capi/pkg/brandConfigVersion.cmake.in > "$$dest/lib/cmake/brand/brandConfigVersion.cmake"
	if grep -n '@[A-Z_]*@' "$$dest/lib/pkgconfig/brand.pc" "$$dest"/lib/cmake/brand/*.cmake; then
		echo "capi/pkg: a placeholder above has no value in the Makefile's install target" >&2; exit 1
	fi
	if [[ -z "$(DESTDIR)" && $$(id -u) == 0 ]]; then $(LDCONFIG); fi
	echo "installed brand $$version (ABI $$abi, $$soname) in $$dest:"
	printf '  %s\n' $(BRAND_PKG_FILES)

# Removes what `make install` (same PREFIX and DESTDIR) wrote, and the directories it left empty.
uninstall:
	@$(brand_pkg_names)
	for f in $(BRAND_PKG_FILES); do rm -f "$$dest/$$f"; done
	rmdir --ignore-fail-on-non-empty "$$dest/lib/cmake/brand" "$$dest/lib/cmake" "$$dest/lib/pkgconfig" 2>/dev/null || true
	if [[ -z "$(DESTDIR)" && $$(id -u) == 0 ]]; then $(LDCONFIG); fi
	echo "removed brand $$version from $$dest"

# The installed package as its users use it (capi/tests/install/run.sh): into a temporary PREFIX
# (and once staged through DESTDIR), then a C program through pkg-config (shared, and static with
# --static), the C++ examples and their ctest suite through find_package(brand) (their data made
# by the brand CLI), brand::brand_static, the version file, and uninstall.
INSTALL_TEST := $(TARGET)/install-test
install-test: tools
	rm -rf $(INSTALL_TEST)
	cargo build --release --locked -p brand-cli
	$(MAKE) --no-print-directory install PREFIX=$(INSTALL_TEST)/prefix LDCONFIG=:
	$(MAKE) --no-print-directory install PREFIX=/opt/brand DESTDIR=$(INSTALL_TEST)/stage LDCONFIG=:
	BRAND_BIN=$(BRAND) BRAND_NATIVE_LIBS='$(CAPI_NATIVE_LIBS)' capi/tests/install/run.sh $(INSTALL_TEST)
	$(MAKE) --no-print-directory uninstall PREFIX=$(INSTALL_TEST)/prefix LDCONFIG=:
	left=$$(find $(INSTALL_TEST)/prefix -mindepth 1 -not -type d)
	[[ -z "$$left" ]] || { echo "uninstall left: $$left" >&2; exit 1; }
	echo "install-test: passed"

# make test's phases in order, each timed: a phase's time is printed as it ends, all of them
# at the end (what a fresh machine took: docs/bench/build-results.md).
TEST_PHASES := tools lint rust-test fuzz-replay capi-test cpp-test install-test python-test py-test bench-test
test:
	times=()
	for phase in $(TEST_PHASES); do
		start=$$(date +%s)
		$(MAKE) --no-print-directory $$phase
		took=$$(( $$(date +%s) - start ))
		times+=("$$phase $$took s")
		echo "== make $$phase: $$took s"
	done
	echo "== make test phases:"
	printf '   %s\n' "$${times[@]}"

# The benchmark harness (bench/, see bench/README.md): brand (CLI, C ABI, Python package, tf.data
# op) against fio, PyTorch's DataLoader, SPDL, tf.data and a per-file loader, larger than memory
# (a memory cgroup per run) on the raw disk and on blkio-throttled "network" storage. The small preset end to end takes about 20 minutes on
# this 2-core machine, as root. Its venv (torch with its CUDA wheels, spdl, TensorFlow: ~7 GB) lives
# outside the repo (scripts/bench-venv.sh); data and results go to /var/tmp/brand-bench.
# BENCH_ARGS= runs the full preset (9 GB, hours).
BENCH_OUT ?= /var/tmp/brand-bench/out-small
BENCH_ARGS ?= --small
bench: capi-build tools
	venv=$$(scripts/bench-venv.sh)
	cmake -S cpp-examples -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DBRAND_CARGO_TARGET_DIR=$(TARGET)
	cmake --build $(CPP_BUILD) --target brand_throughput -j 2
	# brand's Python package as its users install it (pip install ./python): brand.Loader,
	# brand.torch and brand.tf in the runs; the harness compiles brand.tf's op before them.
	"$$venv/bin/python" -m uv pip install --quiet --python "$$venv/bin/python" --reinstall-package brand ./python
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
