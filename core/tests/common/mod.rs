//! Shared by the integration tests: a small packed dataset of generated samples.

use std::path::Path;

use brand::Dataset;
use brand::pack::files::FileSource;
use brand::pack::{PackOptions, pack};

/// `samples` generated samples (mean 8 KB, 10 B to 40 KB, 4 classes), packed
/// with chunk size 16 into `root/ds`.
pub fn small_dataset(root: &Path, samples: u64) -> Dataset {
    let src = root.join("src");
    let opts = brand::synthetic::GenOptions {
        samples,
        mean_bytes: 8000,
        min_bytes: 10,
        max_bytes: 40_000,
        classes: 4,
        ..Default::default()
    };
    brand::synthetic::generate(&src, &opts, &|_, _| {}).expect("gen");
    let source = FileSource::image_folder(&src).expect("source");
    let out = root.join("ds");
    pack(
        &source,
        &out,
        &PackOptions {
            chunk_size: 16,
            ..Default::default()
        },
        &|_, _, _| {},
    )
    .expect("pack");
    Dataset::open(&out).expect("open")
}
