#!/usr/bin/env bash
# Brand on emulated slow storage: the same disk behind a cgroup (v1 blkio)
# that allows few requests per second, as network storage does. Reads the
# same dataset with read_gap 0 (only the filled records), whole (the paper)
# and auto (probed inside the cgroup), side by side in one run.
#
# Usage: sudo bench/throttled.sh [IOPS] [SAMPLES]   (defaults: 300 IOPS, 3000 samples)
# Needs root and cgroup v1 blkio at /sys/fs/cgroup/blkio.
set -euo pipefail
iops=${1:-300}
samples=${2:-3000}
here=$(cd "$(dirname "$0")/.." && pwd)
brand=${BRAND_BIN:-$here/target/release/brand}
dir=/var/tmp/brand-slow-$samples
cg=/sys/fs/cgroup/blkio/brand-slow
[ -d /sys/fs/cgroup/blkio ] || { echo "no cgroup v1 blkio here" >&2; exit 1; }

if [ ! -f "$dir/.done" ]; then
  rm -rf "$dir"
  "$brand" gen "$dir/files" --samples "$samples" --classes 100 --seed 3
  "$brand" pack "$dir/files" -o "$dir/dataset" --seed 3
  touch "$dir/.done"
fi
dev=$(stat -c '%d' "$dir/dataset/data-00000.brd")
majmin="$((dev >> 8)):$((dev & 255))"
# A partition's requests are throttled at its disk: use the whole disk's numbers.
disk=$(lsblk -no PKNAME "$(findmnt -no SOURCE -T "$dir")" 2>/dev/null || true)
[ -n "$disk" ] && majmin=$(lsblk -dno MAJ:MIN "/dev/$disk" | tr -d ' ')

mkdir -p "$cg"
trap 'echo "$majmin 0" > $cg/blkio.throttle.read_iops_device 2>/dev/null || true; rmdir $cg 2>/dev/null || true' EXIT
echo "$majmin $iops" > "$cg/blkio.throttle.read_iops_device"
echo "throttled to $iops read requests/s on $majmin; $samples samples, memory 10 %"

run() {  # policy gap
  sh -c 'echo $$ > '"$cg"'/cgroup.procs; exec "$@"' sh \
    "$brand" read "$dir/dataset" --memory 10% --policy "$1" --read-gap "$2" --json |
    python3 "$here/bench/summarise_read.py" "$1" "$2"
}
run brand 0
run brand whole
run brand auto
run direct 0
