#!/usr/bin/env bash
# The installed brand package as its users use it; `make install-test` installs it, then runs
#
#   BRAND_BIN=<brand CLI> BRAND_NATIVE_LIBS='-lgcc_s ...' capi/tests/install/run.sh DIR
#
# DIR/prefix: `make install PREFIX=DIR/prefix`; DIR/stage: `make install PREFIX=/opt/brand
# DESTDIR=DIR/stage`. BRAND_NATIVE_LIBS is the Makefile's list, expected as brand.pc's
# Libs.private. Checks, each of which fails the run:
#   - the files, symlinks and SONAME the package has, and nothing else;
#   - pkg-config: a C program built with `pkg-config --cflags --libs brand` (NEEDED the soname,
#     loaded from DIR/prefix), and one linked statically with `pkg-config --static --libs brand`;
#     both print the version and ABI and read an epoch of a small dataset made by the CLI;
#   - CMake: the C++ examples (cpp-examples, -DBRAND_USE_INSTALLED=ON) through find_package(brand)
#     and brand::brand, with their ctest suite; the same C program through brand::brand and
#     brand::brand_static from the DESTDIR-staged copy (the CMake files are relocatable);
#     brandConfigVersion.cmake's answers.
set -euo pipefail

[[ $# == 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
: "${BRAND_BIN:?BRAND_BIN: the brand CLI, which makes the test data}"
: "${BRAND_NATIVE_LIBS:?BRAND_NATIVE_LIBS: the libraries brand.pc should list in Libs.private}"
dir=$(realpath "$1")
prefix=$dir/prefix
stage=$dir/stage/opt/brand
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
fail() { echo "install-test: FAILED: $*" >&2; exit 1; }
step() { echo "== $*"; }
# CMake's builds run on their own, not as part of the make that runs this.
unset MAKEFLAGS MFLAGS MAKELEVEL

version=$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' "$repo/Cargo.toml")
abi=$(sed -n 's/^#define BRAND_ABI_VERSION \([0-9]*\)$/\1/p' "$repo/capi/include/brand.h")
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ && $abi =~ ^[1-9][0-9]*$ ]] || fail "version '$version', ABI '$abi'"
IFS=. read -r _ minor patch <<<"$version"
soname=libbrand.so.$((abi - 1)) # the policy written at the Makefile's install target
realname=$soname.$minor.$patch
banner="brand $version abi $abi"

# The NEEDED entries of an ELF file that name libbrand, one per line.
needed_brand() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(libbrand[^]]*\)\]$/\1/p'; }
# A program linked against libbrand.so: it needs the soname, which resolves into $2/lib.
check_shared_exe() {
  local exe=$1 root=$2 needed deps
  needed=$(needed_brand "$exe")
  [[ $needed == "$soname" ]] || fail "$exe: NEEDED '$needed', not $soname"
  deps=$(LD_LIBRARY_PATH=$root/lib ldd "$exe")
  grep -q "^[[:space:]]*$soname => $root/lib/$soname " <<<"$deps" \
    || fail "$exe: $soname does not resolve into $root/lib:"$'\n'"$deps"
}
# A program run on the test dataset: its first line is the banner, and it read the whole epoch.
run_check() {
  local out
  out=$("$@" "$dir/data/ds" "$samples") || fail "$*: exit $?"
  printf '%s\n' "$out" | sed 's/^/   /'
  [[ $(head -n1 <<<"$out") == "$banner" ]] || fail "$*: printed '$(head -n1 <<<"$out")', not '$banner'"
}

step "layout of $prefix and of the staged $stage"
want=$(printf '%s\n' include/brand.h include/brand.hpp lib/libbrand.a lib/libbrand.so "lib/$soname" "lib/$realname" \
  lib/pkgconfig/brand.pc lib/cmake/brand/brandConfig.cmake lib/cmake/brand/brandConfigVersion.cmake | sort)
for root in "$prefix" "$stage"; do
  have=$(cd "$root" && find . -mindepth 1 -not -type d | sed 's|^\./||' | sort)
  [[ $have == "$want" ]] || fail "$root holds:"$'\n'"$have"$'\n'"expected:"$'\n'"$want"
  [[ -L $root/lib/libbrand.so && $(readlink "$root/lib/libbrand.so") == "$soname" ]] || fail "$root/lib/libbrand.so is not a symlink to $soname"
  [[ -L $root/lib/$soname && $(readlink "$root/lib/$soname") == "$realname" ]] || fail "$root/lib/$soname is not a symlink to $realname"
  [[ -f $root/lib/$realname && ! -L $root/lib/$realname ]] || fail "$root/lib/$realname is not a file"
  so_name=$(readelf -d "$root/lib/$realname" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
  [[ $so_name == "$soname" ]] || fail "$root/lib/$realname: SONAME '$so_name', not $soname"
  cmp -s "$root/include/brand.h" "$repo/capi/include/brand.h" || fail "$root/include/brand.h differs from capi/include/brand.h"
  cmp -s "$root/include/brand.hpp" "$repo/cpp-examples/include/brand.hpp" || fail "$root/include/brand.hpp differs from cpp-examples/include/brand.hpp"
done
echo "   $realname (SONAME $soname), symlinks libbrand.so -> $soname -> $realname"
grep -qx "prefix=/opt/brand" "$stage/lib/pkgconfig/brand.pc" || fail "the staged brand.pc does not name PREFIX=/opt/brand"

step "test data (brand gen, brand pack)"
samples=60
"$BRAND_BIN" gen "$dir/data/files" --samples $samples --mean-kib 4 --min-kib 1 --max-kib 16 --classes 3 --seed 4 >/dev/null
"$BRAND_BIN" pack "$dir/data/files" -o "$dir/data/ds" --chunk-size 16 --seed 4 >/dev/null

step "pkg-config"
# This package only: nothing from the system's pkg-config directories.
export PKG_CONFIG_LIBDIR=$prefix/lib/pkgconfig
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
pc() { echo $(pkg-config "$@" brand); } # one line, single spaces
expect_pc() {
  local got
  got=$(pc "${@:2}")
  [[ $got == "$1" ]] || fail "pkg-config ${*:2} brand: '$got', not '$1'"
  echo "   pkg-config ${*:2} brand: $got"
}
expect_pc "$version" --modversion
expect_pc "$abi" --variable=abi_version
expect_pc "-I$prefix/include" --cflags
expect_pc "-L$prefix/lib -lbrand" --libs
expect_pc "-L$prefix/lib -lbrand $BRAND_NATIVE_LIBS" --static --libs

step "C, shared: cc check.c \$(pkg-config --cflags --libs brand)"
warn=(-std=c11 -Wall -Wextra -Wpedantic -Werror)
# shellcheck disable=SC2046 # pkg-config's flags are words
gcc "${warn[@]}" "$here/check.c" $(pc --cflags --libs) -o "$dir/check_pc_shared"
check_shared_exe "$dir/check_pc_shared" "$prefix"
run_check env LD_LIBRARY_PATH="$prefix/lib" "$dir/check_pc_shared"

step "C, static: cc check.c \$(pkg-config --cflags --static --libs brand), -lbrand as -l:libbrand.a"
# -lbrand takes libbrand.so when both are there; -l:libbrand.a names the archive.
static_libs=$(pc --static --libs)
# shellcheck disable=SC2046
gcc "${warn[@]}" "$here/check.c" $(pc --cflags) ${static_libs/-lbrand /-l:libbrand.a } -o "$dir/check_pc_static"
[[ -z $(needed_brand "$dir/check_pc_static") ]] || fail "check_pc_static needs $(needed_brand "$dir/check_pc_static")"
run_check "$dir/check_pc_static"

step "C++17: brand.hpp from the prefix, through pkg-config"
# shellcheck disable=SC2046
echo '#include <brand.hpp>' | g++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c++ - $(pc --cflags)

step "CMake: cpp-examples with -DBRAND_USE_INSTALLED=ON (find_package(brand), brand::brand)"
build=$dir/cpp-examples
cmake -S "$repo/cpp-examples" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBRAND_USE_INSTALLED=ON \
  -DCMAKE_PREFIX_PATH="$prefix" -DBRAND_BIN="$BRAND_BIN" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$dir/cpp-examples.configure.log" \
  || { cat "$dir/cpp-examples.configure.log"; fail "cmake -S cpp-examples -DBRAND_USE_INSTALLED=ON"; }
brand_dir=$(sed -n 's/^brand_DIR:PATH=//p' "$build/CMakeCache.txt")
[[ $brand_dir == "$prefix/lib/cmake/brand" ]] || fail "find_package(brand) found '$brand_dir', not $prefix/lib/cmake/brand"
cmake --build "$build" -j 2
# The headers come from the prefix, not from the repository.
grep -qF -- "$prefix/include" "$build/compile_commands.json" || fail "the examples do not compile with $prefix/include"
if grep -F -e "$repo/capi/include" -e "$repo/cpp-examples/include" "$build/compile_commands.json"; then
  fail "the examples compile with the repository's headers"
fi
for exe in train_loop brand_throughput wrapper_test; do check_shared_exe "$build/$exe" "$prefix"; done
ctest --test-dir "$build" --output-on-failure

step "CMake: check.c with brand::brand and brand::brand_static, from the DESTDIR-staged copy"
cbuild=$dir/cmake-c
cmake -S "$here" -B "$cbuild" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$stage" \
  -DBRAND_EXPECT_VERSION="$version" >"$dir/cmake-c.configure.log" \
  || { cat "$dir/cmake-c.configure.log"; fail "cmake -S capi/tests/install"; }
grep "^-- brand " "$dir/cmake-c.configure.log" | sed 's/^/   /'
cmake --build "$cbuild" -j 2 >/dev/null
check_shared_exe "$cbuild/check_shared" "$stage"
run_check "$cbuild/check_shared" # CMake's build-tree RPATH names the staged lib/
[[ -z $(needed_brand "$cbuild/check_static") ]] || fail "check_static needs $(needed_brand "$cbuild/check_static")"
run_check "$cbuild/check_static"

step "brandConfigVersion.cmake"
cmake -DVERSION_FILE="$prefix/lib/cmake/brand/brandConfigVersion.cmake" -DVERSION="$version" -P "$here/version_check.cmake" \
  || fail "brandConfigVersion.cmake answers find_package wrongly"
echo "   compatible as ^$version"
