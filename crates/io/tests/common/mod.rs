//! Shared by the integration tests: a small packed dataset of generated samples.

use std::path::Path;

use brand_format::Dataset;

/// `samples` samples of brand_pack's small test dataset, in `root/ds`.
pub fn small_dataset(root: &Path, samples: u64) -> Dataset {
    let ds = brand_import::synthetic::small_dataset(root, samples).expect("gen and pack");
    Dataset::open(ds).expect("open")
}
