//! `brand bench device`: the sweep covers every asked point, reads real
//! bytes, and writes a JSON report and an SVG plot; bad sweeps are named.

use std::process::Command;

fn brand() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brand"))
}

#[test]
fn sweeps_every_point_and_writes_json_and_svg() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("out");
    let o = brand()
        .args(["bench", "device"])
        .arg(t.path())
        .args([
            "--size",
            "16MiB",
            "--seconds",
            "0.05",
            "--qd",
            "1,4",
            "--bs",
            "4KiB,64KiB",
            "--json",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("run brand");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json on stdout");
    let points = report["points"].as_array().expect("points");
    let mut seen: Vec<(u64, u64)> = points
        .iter()
        .map(|p| {
            (
                p["queue_depth"].as_u64().expect("qd"),
                p["block_bytes"].as_u64().expect("bs"),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen, vec![(1, 4096), (1, 65536), (4, 4096), (4, 65536)]);
    for p in points {
        let (reads, bytes, bs) = (p["reads"].as_u64(), p["bytes"].as_u64(), p["block_bytes"].as_u64());
        assert!(reads.is_some_and(|r| r > 0), "{p}");
        assert_eq!(bytes, reads.zip(bs).map(|(r, b)| r * b), "{p}");
    }
    let svg = std::fs::read_to_string(out.join("brand-device.svg")).expect("svg written");
    assert!(svg.starts_with("<svg") && svg.contains("QD 4") && svg.trim_end().ends_with("</svg>"));
    assert!(out.join("brand-device.json").exists());
}

#[test]
fn bad_sweeps_are_named() {
    let t = tempfile::tempdir().expect("tempdir");
    for (flag, value, word) in [
        ("--bs", "1000", "--bs"),
        ("--qd", "0", "--qd"),
        ("--seconds", "-1", "--seconds"),
        ("--size", "1KiB", "--size"),
        ("--io-backend", "carrier-pigeon", "io_backend"),
        ("--rings", "0", "--rings"),
        ("--sqpoll", "sometimes", "--sqpoll"),
    ] {
        let o = brand()
            .args(["bench", "device"])
            .arg(t.path())
            .arg(format!("{flag}={value}"))
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{flag} {value}: {err}");
        assert!(err.contains(word), "{flag} {value}: {err}");
    }
}

/// The io_uring knobs: every (rings, SQPOLL) setting is a point of its own,
/// reads real bytes, and the table shows each setting with IOPS and CPU per
/// read.
#[test]
fn sweeps_rings_and_sqpoll() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("out");
    let run = |json: bool| {
        let mut c = brand();
        c.args(["bench", "device"]).arg(t.path()).args([
            "--size",
            "16MiB",
            "--seconds",
            "0.05",
            "--qd",
            "4",
            "--bs",
            "4KiB",
            "--io-backend",
            "uring",
            "--rings",
            "1,2",
            "--sqpoll",
            "off,on",
            "--out",
        ]);
        c.arg(&out);
        if json {
            c.arg("--json");
        }
        let o = c.output().expect("run brand");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let report: serde_json::Value = serde_json::from_str(&run(true)).expect("json on stdout");
    let points = report["points"].as_array().expect("points");
    let mut seen: Vec<(u64, bool)> = points
        .iter()
        .map(|p| {
            (
                p["rings"].as_u64().expect("rings"),
                p["sqpoll"].as_bool().expect("sqpoll"),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen, vec![(1, false), (1, true), (2, false), (2, true)]);
    for p in points {
        assert!(p["reads"].as_u64().is_some_and(|r| r > 0), "{p}");
        assert!(p["cpu_micros_per_read"].as_f64().is_some_and(|c| c > 0.0), "{p}");
    }
    let table = run(false);
    for setting in ["1 ring(s), SQPOLL off", "1 ring(s), SQPOLL on", "2 ring(s), SQPOLL on"] {
        assert!(table.contains(setting), "{setting}: {table}");
    }
    assert!(table.contains("k IOPS") && table.contains("CPU µs/read"), "{table}");
}
