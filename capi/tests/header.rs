//! include/brand.h must be exactly what cbindgen generates from src/ with
//! cbindgen.toml, and src/metrics/c_struct.rs (`brand_metrics`) exactly what
//! brand-loader's metrics table gives. `BRAND_BLESS=1 cargo test -p
//! brand-capi --test header` rewrites both after an intended change (the
//! struct first: the header is generated from it). Nothing here names a
//! field, so that a field new in the table compiles here and can be blessed
//! (the struct's own tests are in abi.rs).

use std::fmt::Write as _;
use std::path::Path;

use brand_loader::Metrics;

#[test]
fn the_checked_in_header_is_the_generated_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // One test, in this order: a blessed table change reaches the header
    // in one run.
    check_or_bless(&dir.join("src/metrics/c_struct.rs"), metrics_source().as_bytes());
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    check_or_bless(&dir.join("include/brand.h"), &generated);
}

/// Fails naming the first line where `path` differs from `generated`, or
/// writes it with `BRAND_BLESS=1`.
fn check_or_bless(path: &Path, generated: &[u8]) {
    if std::env::var_os("BRAND_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(path, generated).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        return;
    }
    let checked_in = std::fs::read(path).unwrap_or_default();
    if checked_in != generated {
        let (a, b) = (String::from_utf8_lossy(&checked_in), String::from_utf8_lossy(generated));
        let first = a
            .lines()
            .zip(b.lines())
            .position(|(x, y)| x != y)
            .unwrap_or_else(|| a.lines().count().min(b.lines().count()));
        panic!(
            "{} differs from the generated one (first at line {}):\n  checked in: {:?}\n  generated:  {:?}\n\
             Rerun with BRAND_BLESS=1 if the change is intended.",
            path.display(),
            first + 1,
            a.lines().nth(first).unwrap_or("<end of file>"),
            b.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

/// The struct's own docs and its first field, the caller's size: the C
/// ABI's protocol, not a metric.
const STRUCT_DOCS: &str = "\
/// Loader counters (`brand_get_metrics`), cumulative since the loader was opened. Set
/// `struct_size = sizeof(brand_metrics)` before the call: the library fills
/// at most that many bytes and sets `struct_size` to the bytes it filled,
/// so fields appended later never overrun an older caller's struct, and a
/// newer caller can tell which fields an older library filled.
";
const STRUCT_SIZE_DOCS: &str = "    /// In: the caller's `sizeof(brand_metrics)`. Out: the bytes filled.\n";

/// src/metrics/c_struct.rs from `Metrics::c_fields()`, in C order. Panics
/// where the table cannot make a C struct: places not 1, 2, 3, ..., a type
/// C has no field for here, or a field that would leave padding
/// (`brand_get_metrics` copies the struct out as bytes).
fn metrics_source() -> String {
    let mut fields = Metrics::c_fields();
    fields.sort_by_key(|f| f.position);
    let mut offset = 4; // after struct_size
    for (i, f) in fields.iter().enumerate() {
        assert_eq!(
            f.position,
            i + 1,
            "metrics table: C[{}] ({}) out of sequence",
            f.position,
            f.name
        );
        let size = match f.ty {
            "u32" => 4,
            "u64" | "f64" => 8,
            other => panic!("metrics table: {} is {other} in C: u32, u64 or f64", f.name),
        };
        assert_eq!(offset % size, 0, "metrics table: {} at {offset} leaves padding", f.name);
        offset += size;
    }
    assert_eq!(offset % 8, 0, "metrics table: the struct ends with padding");

    let mut s = String::new();
    s.push_str(
        "//! Generated from brand-loader's metrics table (crates/loader/src/stats.rs)\n\
         //! by capi/tests/header.rs: edit the table, then run\n\
         //! `BRAND_BLESS=1 cargo test -p brand-capi --test header`. Do not edit.\n\n\
         use super::*;\n\n",
    );
    s.push_str(STRUCT_DOCS);
    s.push_str(
        "#[allow(non_camel_case_types)]\n#[repr(C)]\n#[derive(Debug, Clone, Copy, Default)]\n\
         pub struct brand_metrics {\n",
    );
    s.push_str(STRUCT_SIZE_DOCS);
    s.push_str("    pub struct_size: u32,\n");
    for f in &fields {
        for line in f.docs {
            writeln!(s, "    ///{line}").unwrap();
        }
        writeln!(s, "    pub {}: {},", f.name, f.ty).unwrap();
    }
    s.push_str("}\n\n");
    writeln!(
        s,
        "// No padding: brand_get_metrics copies the struct out as bytes.\n\
         const _: () = assert!(size_of::<brand_metrics>() == {offset});\n"
    )
    .unwrap();
    s.push_str(
        "impl From<&Metrics> for brand_metrics {\n    fn from(m: &Metrics) -> Self {\n        brand_metrics {\n            \
         struct_size: size_of::<brand_metrics>() as u32,\n",
    );
    for f in &fields {
        writeln!(s, "            {}: {},", f.name, f.value).unwrap();
    }
    s.push_str("        }\n    }\n}\n");
    s
}
