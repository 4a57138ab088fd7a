//! `brand.Writer`'s spilled samples (brand-pack's `SpillWriter`) pack as the
//! same files through `--from list` do.

use brand_import::files::FileSource;
use brand_pack::spill::SpillWriter;

fn sample(i: usize) -> Vec<u8> {
    (0..(i * 37) % 300).map(|b| (b ^ i) as u8).collect()
}

/// The writer's samples pack exactly as the same files, keys and labels
/// through `--from list` do: segments and index byte for byte.
#[test]
fn packs_as_a_list_of_the_same_files_does() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let mut list = String::new();
    let mut w = SpillWriter::new(dir.path()).unwrap();
    for i in 0..300 {
        let name = format!("s{i:03}.bin");
        std::fs::write(files.join(&name), sample(i)).unwrap();
        let label = i as i64 % 5;
        list.push_str(&format!("files/{name}\t{label}\n"));
        w.push(&sample(i), label, Some(format!("files/{name}").as_bytes()))
            .unwrap();
    }
    let list_path = dir.path().join("list.txt");
    std::fs::write(&list_path, list).unwrap();
    let opts = brand_pack::PackOptions {
        chunk_size: 16,
        seed: 9,
        ..Default::default()
    };
    let from_list = dir.path().join("from-list");
    let from_writer = dir.path().join("from-writer");
    let listed = FileSource::list(&list_path).unwrap();
    brand_pack::pack(&listed, &from_list, &opts, &|_, _, _| {}).unwrap();
    brand_pack::pack(&w.finish().unwrap(), &from_writer, &opts, &|_, _, _| {}).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&from_list)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert!(names.len() >= 3, "{names:?}");
    for name in names {
        let (a, b) = (
            std::fs::read(from_list.join(&name)).unwrap(),
            std::fs::read(from_writer.join(&name)).unwrap(),
        );
        if name == brand_format::MANIFEST_FILE {
            // Equal but for where the samples came from.
            let strip = |t: &[u8]| {
                String::from_utf8_lossy(t)
                    .lines()
                    .filter(|l| !l.starts_with("source") && !l.starts_with("inputs"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            assert_eq!(strip(&a), strip(&b));
        } else {
            assert!(a == b, "{name:?} differs");
        }
    }
}
