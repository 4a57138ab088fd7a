//! `run_length = "auto"` through the one configuration path: a `Reader`
//! alone (what the C ABI, the TF op and Python open) plans the run length
//! the device's read gap gives, decided once (`brand_reader::decide`), as
//! `brand read` (a `Loader` given the decided settings) does; a `Loader`
//! refuses `auto` it was not given decided.

use std::sync::Arc;

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::{Loader, LoaderState, Resume};
use brand_reader::{Config, Reader};

#[test]
fn a_reader_alone_plans_the_run_length_auto_resolves_to() {
    let t = tempfile::tempdir().expect("tmp");
    let path = small_dataset(t.path(), 300).expect("pack");
    // A fixed read gap far above a sample's size: auto gives long runs
    // without probing the device.
    let text = "run_length = \"auto\"\nread_gap = \"1MiB\"\nbatch_size = 16\nseed = 5";
    let cfg = Config::resolve(text, toml::Table::new(), &|_| None).expect("config");
    let reader = Reader::open(&path, &cfg, Resume::At(LoaderState::default())).expect("reader");
    let ds = Arc::new(Dataset::open(&path).expect("open"));
    // A loader takes decided settings only.
    match Loader::open(ds.clone(), &cfg.loader, LoaderState::default()) {
        Err(e) => assert!(e.to_string().contains("brand_reader::decide"), "{e}"),
        Ok(_) => panic!("a loader decided run_length auto itself"),
    }
    let decided = brand_reader::decide(&ds, &cfg.loader, brand_reader::Opening::Reads).expect("decide");
    let loader = Loader::open(ds, &decided, LoaderState::default()).expect("loader");
    let want = loader.checkpoint().expect("loader state").fingerprint.run_length;
    assert!(want > 1, "the read gap asks for runs here (got {want})");
    let got = reader.checkpoint().expect("reader state").fingerprint.run_length;
    assert_eq!(got, want, "the reader plans what auto resolves to, as a loader does");
}
