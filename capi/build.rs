//! Gives libbrand.so an ELF SONAME when `BRAND_SONAME` is set, as `make
//! install` does (`BRAND_SONAME=libbrand.so.0`; the Makefile derives the
//! major from `BRAND_ABI_VERSION`, see its `install` target). The link
//! argument reaches the cdylib only: libbrand.a and the rlib are unchanged.
//!
//! Unset (a plain `cargo build`), the library has no SONAME, as cargo makes
//! it: `target/release/libbrand.so` is then found as `libbrand.so` by what
//! links it in place (`make capi-test`), without the installed symlinks.
//! Changing the variable rebuilds this crate only.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=BRAND_SONAME");
    let soname = std::env::var("BRAND_SONAME").unwrap_or_default();
    if soname.is_empty() {
        return;
    }
    // A name such as libbrand.so.0: anything else in -soname is a mistake
    // that would only show when a program fails to load.
    let valid = soname
        .strip_prefix("libbrand.so.")
        .is_some_and(|major| !major.is_empty() && major.bytes().all(|b| b.is_ascii_digit()));
    if !valid {
        panic!("BRAND_SONAME={soname:?}: expected libbrand.so.N (N the soname major)");
    }
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        panic!("BRAND_SONAME is for ELF (GNU ld -soname) on Linux, not {target_os:?}");
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
