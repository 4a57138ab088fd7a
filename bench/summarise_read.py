"""One line from `brand read --json` on stdin: policy, gap, useful MB/s, reads, amplification."""
import json
import sys

r = json.load(sys.stdin)[0]
m = r["metrics"]
policy, gap = sys.argv[1], sys.argv[2]
chosen = "whole" if m["read_gap"] is None else f"{m['read_gap'] // 1024} KiB"
print(
    f"{policy:8s} read_gap {gap:6s} ({chosen:>9s}): {r['useful_mb_per_sec']:7.1f} MB/s useful, "
    f"{m['reads_issued']:6d} reads, amplification {r['read_amplification']:.2f}, exactly once {r['exactly_once']}"
)
