//! Shared by the integration tests: a small packed dataset of generated samples.

use std::path::Path;

use brand_format::Dataset;
use brand_pack::PackOptions;
use brand_pack::synthetic::{GenOptions, generate_and_pack};

/// `samples` generated samples (mean 8 KB, 10 B to 40 KB, 4 classes), packed
/// with chunk size 16 into `root/ds`.
pub fn small_dataset(root: &Path, samples: u64) -> Dataset {
    let gen_opts = GenOptions {
        samples,
        mean_bytes: 8000,
        min_bytes: 10,
        max_bytes: 40_000,
        classes: 4,
        ..Default::default()
    };
    let pack_opts = PackOptions {
        chunk_size: 16,
        ..Default::default()
    };
    let ds = generate_and_pack(root, &gen_opts, &pack_opts).expect("gen and pack");
    Dataset::open(ds).expect("open")
}
