//! Replays every file of `fuzz/corpus/<target>/` through its target: what
//! the fuzzer found once stays fixed. Run by `make test`
//! (`cargo test --manifest-path fuzz/Cargo.toml`).

use std::path::Path;

#[test]
fn every_corpus_file_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut total = 0;
    for (name, target) in brand_fuzz::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("corpus entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: no corpus files", dir.display());
        for f in files {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            eprintln!("{}", f.display());
            target(&data);
            total += 1;
        }
    }
    eprintln!("replayed {total} corpus files");
}
