//! Shared by the integration tests: a small packed dataset of generated
//! samples, and an epoch's ids read through a loader.

use std::path::Path;

use brand_format::Dataset;
use brand_loader::Loader;

/// `samples` samples of brand_pack's small test dataset, in `root/ds`.
pub fn small_dataset(root: &Path, samples: u64) -> Dataset {
    let ds = brand_import::synthetic::small_dataset(root, samples).expect("gen and pack");
    Dataset::open(ds).expect("open")
}

/// The rest of the epoch's ids, each sample checked against a buffered read
/// and 64-byte aligned.
#[allow(dead_code)] // loader.rs checks labels and keys with its own
pub fn epoch(l: &mut Loader, ds: &Dataset) -> Vec<u64> {
    let mut ids = Vec::new();
    while let Some(b) = l.next_batch().expect("batch") {
        for s in b.iter() {
            assert_eq!(s.data, &ds.read_sample(s.id).expect("buffered")[..], "sample {}", s.id);
            assert_eq!(s.data.as_ptr() as usize % 64, 0, "sample {} 64-byte aligned", s.id);
            ids.push(s.id);
        }
    }
    ids
}
