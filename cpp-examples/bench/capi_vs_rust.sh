#!/usr/bin/env bash
# C ABI throughput against the Rust API, side by side in one run, on a dataset
# that is served from memory so that the interface's cost shows: the loader's
# budget holds the whole dataset (resident mode), epoch 0 reads it once, and
# every later epoch is pure serving (no I/O). Rust: `brand read` (the loader
# API; per sample it takes the data reference without reading the bytes).
# C: cpp-examples' brand_throughput --touch none through libbrand.a
# (brand_next per batch, brand_batch_sample per sample, pointer and length
# taken, bytes not read). Rounds alternate Rust and C so background load hits both.
#
#   cpp-examples/bench/capi_vs_rust.sh [SAMPLES=30000] [MEAN_KIB=8] [EPOCHS=41] [ROUNDS=5]
#
# Prints each round's samples/s over epochs 1.. (total samples / total
# seconds) and the ratio C / Rust of the medians over rounds (the target is
# >= 95 %). This is a benchmark, not a test.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
target=$(realpath -m "$CARGO_TARGET_DIR")
samples=${1:-30000} kib=${2:-8} epochs=${3:-41} rounds=${4:-5}

cargo build --release --locked -q -p brand-core -p brand-capi
cmake -S cpp-examples -B "$target/cpp-examples" -DCMAKE_BUILD_TYPE=Release -DBRAND_CARGO_TARGET_DIR="$target" >/dev/null
cmake --build "$target/cpp-examples" --target brand_throughput >/dev/null
brand=$target/release/brand
throughput=$target/cpp-examples/brand_throughput

data=$target/bench-capi/n$samples-kib$kib
if [ ! -f "$data/ds/manifest.toml" ]; then
  rm -rf "$data"
  "$brand" gen "$data/files" --samples "$samples" --mean-kib "$kib" --min-kib 1 --max-kib $((kib * 4)) --classes 10 --seed 1
  "$brand" pack "$data/files" -o "$data/ds" --chunk-size 64 --seed 1
  rm -rf "$data/files"
fi
config=$data/config.toml
printf 'memory = "200%%"\nbatch_size = 256\nread_gap = "whole"\n' > "$config"

out=$data/results
rm -rf "$out" && mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  "$brand" read "$data/ds" --config "$config" --epochs "$epochs" --json > "$out/rust-$r.json"
  "$throughput" "$data/ds" --config "$(cat "$config")" --epochs "$epochs" --touch none --json > "$out/c-$r.json"
done

python3 - "$out" "$rounds" "$samples" "$kib" <<'PY'
import json, statistics, sys
out, rounds, samples, kib = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def rate(path):
    with open(path) as f:
        doc = json.load(f)
    epochs = (doc if isinstance(doc, list) else doc["epochs"])[1:]  # epoch 0 reads the dataset
    return sum(e["samples"] for e in epochs) / sum(e["seconds"] for e in epochs)
rust, c = [], []
print(f"{samples} samples, mean {kib} KiB, served from memory (resident mode), samples/s over epochs 1..")
for r in range(1, rounds + 1):
    a = rate(f"{out}/rust-{r}.json")
    b = rate(f"{out}/c-{r}.json")
    rust.append(a)
    c.append(b)
    print(f"round {r}: Rust API {a:12.0f}   C ABI {b:12.0f}   C/Rust {b / a:6.1%}")
ra, ca = statistics.median(rust), statistics.median(c)
print(f"median:  Rust API {ra:12.0f}   C ABI {ca:12.0f}   C/Rust {ca / ra:6.1%}")
PY
