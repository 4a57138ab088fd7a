//! include/brand.h must be exactly what cbindgen generates from src/ with
//! cbindgen.toml. `BRAND_BLESS=1 cargo test -p brand-capi --test header`
//! rewrites it after an intended change.

use std::path::Path;

#[test]
fn the_checked_in_header_is_the_generated_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = dir.join("include/brand.h");
    if std::env::var_os("BRAND_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write include/brand.h");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    if checked_in != generated {
        let (a, b) = (
            String::from_utf8_lossy(&checked_in),
            String::from_utf8_lossy(&generated),
        );
        let first = a
            .lines()
            .zip(b.lines())
            .position(|(x, y)| x != y)
            .unwrap_or_else(|| a.lines().count().min(b.lines().count()));
        panic!(
            "include/brand.h differs from the generated header (first at line {}):\n  checked in: {:?}\n  generated:  {:?}\n\
             Rerun with BRAND_BLESS=1 if the change is intended.",
            first + 1,
            a.lines().nth(first).unwrap_or("<end of file>"),
            b.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}
