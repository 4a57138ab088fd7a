"""A tiny fake benchmark run: two rounds, two profiles, a few loaders."""

GB = 10**9


def run(profile, rnd, loader, variant, name, mb, budget=None, amp=1.0, rss=100 << 20, status="ok", **kw):
    secs = 2.0
    b = int(mb * 1e6 * secs)
    r = {
        "profile": profile, "round": rnd, "loader": loader, "variant": variant, "name": name, "budget": budget,
        "status": status, "memory_limit_bytes": (640 << 20) + int((budget or 0.1) * 2 * GB),
    }
    if status == "ok":
        r.update({
            "samples": 1000, "bytes": b, "seconds": secs, "useful_mb_per_s": mb, "samples_per_s": 500.0,
            "device_read_bytes": int(b * amp), "read_amplification": amp, "peak_rss_bytes": rss,
            "cpu_seconds": 1.0, "cpu_s_per_gb": 1.0 / (b / GB), "stall_p50_s": 0.001, "stall_p99_s": 0.01,
            "exactly_once": True,
        })
    r.update(kw)
    return r


def fio(profile, rnd, variant, mb, rw="randread", bs=131072, qd=32):
    return {"profile": profile, "round": rnd, "loader": "fio", "variant": variant, "name": "fio " + variant,
            "budget": 0.1, "status": "ok", "useful_mb_per_s": mb, "iops": mb * 1e6 / bs, "bytes": int(mb * 1e6),
            "seconds": 1.0, "rw": rw, "bs": bs, "qd": qd, "cpu_s_per_gb": 0.3}


def results():
    runs = []
    for rnd, drift in ((0, 1.0), (1, 0.5)):  # round 2: the whole device is half as fast
        for p, s in (("disk", 1.0), ("net", 0.2)):
            f = drift * s
            runs += [
                fio(p, rnd, "rand 128K QD32", 2000 * f),
                fio(p, rnd, "seq chunk QD32", 2500 * f, rw="read", bs=7 << 20),
                fio(p, rnd, "rand 4K QD1", 20 * f, bs=4096, qd=1),
                run(p, rnd, "torch", "w8", "PyTorch DataLoader (8 workers)", 200 * f, budget=0.1, rss=600 << 20),
                run(p, rnd, "torch", "w4", "PyTorch DataLoader (4 workers)", 150 * f, budget=0.1),
                run(p, rnd, "brand", "brand/whole", "brand read brand/whole (10%)", 300 * f, budget=0.1, amp=8.0,
                    policy="brand", read_gap="whole", read_gap_used="whole"),
                run(p, rnd, "brand", "brand/auto", "brand read brand/auto (10%)", 1500 * f, budget=0.1, amp=1.03,
                    policy="brand", read_gap="auto", read_gap_used=8192),
                run(p, rnd, "brand", "chunk-shuffle/auto", "brand read chunk-shuffle/auto (10%)", 1800 * f,
                    budget=0.1, policy="chunk-shuffle", read_gap="auto", read_gap_used=8192),
                run(p, rnd, "brand", "brand/auto", "brand read brand/auto (100%)", 1700 * f, budget=1.0,
                    policy="brand", read_gap="auto", read_gap_used=8192),
                run(p, rnd, "capi", "brand/auto", "C ABI brand/auto (10%)", 1400 * f, budget=0.1,
                    status="ok" if rnd == 0 else "failed: exit 1"),
            ]
    # On net, whole chunks win (requests are expensive there).
    for r in runs:
        if r["profile"] == "net" and r["variant"] == "brand/whole":
            r["useful_mb_per_s"] *= 10
    return {
        "meta": {"preset": "fake", "started": "2026-11-23T10:00:00", "rounds": 2},
        "dataset": {"samples": 1000, "stored_bytes": 2 * GB, "mean_sample_bytes": 112640, "chunk_size": 64,
                    "mean_chunk_bytes": 7 << 20},
        "profiles": {"disk": {"available": True, "description": "raw"},
                     "net": {"available": True, "description": "throttled"}},
        "unavailable": {"spdl": "spdl is not installed"},
        "runs": runs,
        "simulate": {
            "brand": {"10%": {"chunk_mate_dispersion": 0.87}, "100%": {"chunk_mate_dispersion": 1.0}},
            "chunk-shuffle": {"10%": {"chunk_mate_dispersion": 0.06}},
        },
        "order_quality": {
            "status": "ok", "dataset": "scikit-learn digits", "train": 1257, "test": 540, "classes": 10,
            "budget": 0.1, "shuffle_buffer": 126, "epochs": 6, "batch_size": 32, "seeds": [1, 2, 3],
            "methods": {"full-shuffle": {"accuracy": [0.95, 0.96, 0.94], "labels_per_batch": 9.6},
                        "tf-shuffle": {"accuracy": [0.4, 0.5, 0.45], "labels_per_batch": 1.3},
                        "brand": {"accuracy": [0.95, 0.94, 0.95], "labels_per_batch": 9.5}},
        },
    }
