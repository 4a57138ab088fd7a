"""bench/placement.py: the pair's total per configuration, its ratio to the even split, the report."""

import placement


def run(config, rnd, job, rate, benefit=0.5, owed=100, evicted=0, error=None):
    r = {"config": config, "round": rnd, "job": job, "server_get_bytes": 4e9}
    if error:
        r["error"] = error
        return r
    epochs = [{"samples_per_sec": rate, "tier_benefit": benefit, "tier_owed_bytes": owed,
               "tier_evicted_bytes": evicted, "exactly_once": True} for _ in range(3)]
    r.update(samples_per_sec=rate, epochs=epochs, exactly_once=True)
    return r


def test_pair_is_the_sum_of_both_jobs_and_the_ratio_is_per_round(tmp_path):
    runs = []
    for rnd, (p_io, e_io) in enumerate([(1500, 1000), (1200, 1000), (1600, 1100)]):
        runs += [run("placement", rnd, "io", p_io), run("placement", rnd, "compute", 300),
                 run("even", rnd, "io", e_io), run("even", rnd, "compute", 300)]
    res = {"runs": runs, "epochs": 3, "command": "x", "build": "b", "date": "d", "dataset_bytes": 9e8,
           "samples": 8000, "rate": "1gbit", "delay_ms": 10, "limit": 9.5e8, "compute_ms": 800, "rounds": 3}
    s = placement.summarise(res)
    assert s["placement"]["pair"]["median"] == 1800
    assert s["even"]["pair"]["median"] == 1300
    ratios = sorted([1800 / 1300, 1500 / 1300, 1900 / 1400])
    assert abs(s["placement_over_even"]["median"] - ratios[1]) < 1e-12
    assert abs(s["placement_over_even"]["min"] - ratios[0]) < 1e-12
    res["summary"] = s
    placement.report(res, tmp_path)
    text = (tmp_path / "placement-results.md").read_text()
    assert "(goal > 1: met)" in text and "| placement |" in text


def test_a_round_with_a_failed_job_has_no_pair():
    runs = [run("placement", 0, "io", 1500), run("placement", 0, "compute", 0, error="exit 1"),
            run("even", 0, "io", 1000), run("even", 0, "compute", 300)]
    s = placement.summarise({"runs": runs, "epochs": 3})
    assert s["placement"]["failed"] == 1
    assert s["placement"]["pair"] is None and s["placement_over_even"] is None
    assert s["even"]["pair"]["median"] == 1300
