//! LMDB import: keys in LMDB order, labels from Caffe `Datum` values, values
//! read back byte for byte, and one-line errors for environments that cannot
//! be opened. Environments are written here with heed.

#![cfg(feature = "lmdb")]

use std::fs;
use std::path::Path;

use brand_pack::lmdb::LmdbSource;
use brand_pack::source::Source;
use heed::types::Bytes;
use heed::{CommitOrAbort, Database, DatabaseFlags, EnvFlags, EnvOpenOptions};

/// Write `pairs` into the main database of a new environment at `path`: a
/// directory, or with `single_file` the data file itself (NO_SUB_DIR).
fn create_env(path: &Path, pairs: &[(&[u8], &[u8])], single_file: bool) {
    create_env_with(path, pairs, single_file, DatabaseFlags::empty());
}

fn create_env_with(path: &Path, pairs: &[(&[u8], &[u8])], single_file: bool, db_flags: DatabaseFlags) {
    let mut options = EnvOpenOptions::new();
    options.map_size(16 << 20);
    if single_file {
        // SAFETY: NO_SUB_DIR only changes where the files live.
        unsafe { options.flags(EnvFlags::NO_SUB_DIR) };
    }
    // SAFETY: a fresh path nothing else has open; the env is dropped (and
    // closed) before the test opens it again.
    let env = unsafe { options.open(path) }.unwrap();
    let wtxn = env.write_txn().unwrap();
    let db: Database<Bytes, Bytes> = env
        .create_databases_and_commit(wtxn, |opener, wtxn| {
            opener
                .database_options()
                .types::<Bytes, Bytes>()
                .flags(db_flags)
                .create(wtxn)
                .map(CommitOrAbort::<_, ()>::Commit)
        })
        .unwrap()
        .unwrap_commit();
    let mut wtxn = env.write_txn().unwrap();
    for (key, value) in pairs {
        db.put(&mut wtxn, key, value).unwrap();
    }
    wtxn.commit().unwrap();
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

/// A Caffe `Datum` as convert_imageset writes it: an encoded image with its
/// shape left at zero, or raw pixels with their shape.
fn datum(label: Option<i32>, pixels: &[u8], encoded: bool) -> Vec<u8> {
    let (channels, height, width) = if encoded { (0, 0, 0) } else { (3, 1, pixels.len() / 3) };
    let mut out = Vec::new();
    for (number, value) in [(1, channels), (2, height), (3, width)] {
        out.push(number << 3);
        out.extend(varint(value as u64));
    }
    out.push((4 << 3) | 2);
    out.extend(varint(pixels.len() as u64));
    out.extend_from_slice(pixels);
    if let Some(label) = label {
        out.push(5 << 3);
        // int32 sign-extends to 64 bits on the wire.
        out.extend(varint(i64::from(label) as u64));
    }
    if encoded {
        out.extend([7 << 3, 1]);
    }
    out
}

fn keys(source: &LmdbSource) -> Vec<Vec<u8>> {
    source.entries().iter().map(|e| e.key.clone()).collect()
}

fn labels(source: &LmdbSource) -> Vec<i64> {
    source.entries().iter().map(|e| e.label).collect()
}

fn open_err(path: &Path) -> String {
    match LmdbSource::open(path) {
        Ok(s) => panic!("expected an error, got {} keys", s.entries().len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn lists_keys_in_lmdb_order_with_datum_labels() {
    let dir = tempfile::tempdir().unwrap();
    let jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF not really";
    let cat = datum(Some(2), jpeg, true);
    let dog = datum(Some(0), &[1, 2, 3, 4, 5, 6], false);
    let negative = datum(Some(-3), &[9, 9, 9], false);
    let unlabelled = datum(None, &[7, 7, 7], false);
    let big = datum(Some(11), &vec![0x5a; 200_000], true); // LMDB overflow pages
    let pairs: &[(&[u8], &[u8])] = &[
        (b"00000002_cat.jpg", &cat),
        (b"00000000_dog.jpg", &dog),
        (b"zz", b"plain bytes, not a datum"),
        (b"00000001_raw", jpeg),
        (b"\x00binary key", &negative),
        (b"00000003", &unlabelled),
        (b"00000010_big", &big),
        (b"empty", b""),
    ];
    create_env(dir.path(), pairs, false);

    let source = LmdbSource::open(dir.path()).unwrap();
    assert_eq!(source.kind(), "lmdb");
    let mut sorted: Vec<&[u8]> = pairs.iter().map(|(k, _)| *k).collect();
    sorted.sort();
    assert_eq!(keys(&source), sorted);
    assert_eq!(labels(&source), [-3, 0, -1, 2, -1, 11, -1, -1]);
    for (i, key) in sorted.iter().enumerate() {
        let value = pairs.iter().find(|(k, _)| k == key).unwrap().1;
        assert_eq!(source.read(i).unwrap(), value, "key {}", key.escape_ascii());
    }
    assert!(source.read(sorted.len()).is_err());
}

#[test]
fn same_database_lists_the_same_entries() {
    let dir = tempfile::tempdir().unwrap();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..300u32)
        .map(|i| {
            (
                format!("{:08}", i * 7919 % 300).into_bytes(),
                datum(Some(i as i32 % 10), &[1], true),
            )
        })
        .collect();
    let borrowed: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    create_env(dir.path(), &borrowed, false);
    let first = LmdbSource::open(dir.path()).unwrap().entries().to_vec();
    let second = LmdbSource::open(dir.path()).unwrap().entries().to_vec();
    assert_eq!(first.len(), 300);
    assert_eq!(first, second);
    assert!(first.windows(2).all(|w| w[0].key < w[1].key));
}

#[test]
fn reads_in_parallel_from_many_threads() {
    let dir = tempfile::tempdir().unwrap();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..100u32)
        .map(|i| {
            (
                format!("{i:04}").into_bytes(),
                datum(Some(i as i32), &i.to_le_bytes(), true),
            )
        })
        .collect();
    let borrowed: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    create_env(dir.path(), &borrowed, false);
    let source = LmdbSource::open(dir.path()).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (source, pairs) = (&source, &pairs);
            scope.spawn(move || {
                for i in (t..pairs.len()).step_by(4) {
                    assert_eq!(source.read(i).unwrap(), pairs[i].1);
                }
            });
        }
    });
    assert_eq!(labels(&source), (0..100).collect::<Vec<i64>>());
}

#[test]
fn single_file_environment_opens_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.lmdb");
    let value = datum(Some(5), &[1, 2, 3], false);
    create_env(&path, &[(b"a", &value), (b"b", b"xyz")], true);
    assert!(path.is_file());

    let source = LmdbSource::open(&path).unwrap();
    assert_eq!(keys(&source), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(labels(&source), [5, -1]);
    assert_eq!(source.read(0).unwrap(), value);
    assert_eq!(source.read(1).unwrap(), b"xyz");
}

#[test]
fn garbage_data_mdb_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for garbage in [vec![0xab; 64 << 10], b"hello".to_vec()] {
        fs::write(dir.path().join("data.mdb"), &garbage).unwrap();
        let err = open_err(dir.path());
        assert!(err.starts_with(&format!("{}: open: ", dir.path().display())), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

#[test]
fn garbage_single_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not.lmdb");
    fs::write(&path, vec![0x11; 32 << 10]).unwrap();
    let err = open_err(&path);
    assert!(err.starts_with(&format!("{}: open: ", path.display())), "{err}");
    fs::write(&path, b"").unwrap();
    assert!(open_err(&path).contains("the data file is empty"));
}

#[test]
fn empty_data_mdb_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("data.mdb"), b"").unwrap();
    let err = open_err(dir.path());
    assert!(
        err.contains(": open: not an LMDB environment: the data file is empty"),
        "{err}"
    );
}

#[test]
fn missing_path_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-db");
    let err = open_err(&path);
    assert!(err.starts_with(&format!("{}: open: ", path.display())), "{err}");
}

#[test]
fn directory_without_data_mdb_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("readme"), b"hi").unwrap();
    let err = open_err(dir.path());
    assert!(err.contains("no data.mdb"), "{err}");
}

#[test]
fn empty_database_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    create_env(dir.path(), &[], false);
    let err = open_err(dir.path());
    assert!(err.contains("empty"), "{err}");
}

#[test]
fn opening_twice_at_once_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    create_env(dir.path(), &[(b"k", b"v")], false);
    let first = LmdbSource::open(dir.path()).unwrap();
    let err = open_err(dir.path());
    assert!(err.contains("already open"), "{err}");
    drop(first);
    assert!(LmdbSource::open(dir.path()).is_ok());
}

#[test]
fn a_key_with_several_values_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let pairs: &[(&[u8], &[u8])] = &[(b"a", b"1"), (b"b", b"2"), (b"b", b"3")];
    create_env_with(dir.path(), pairs, false, DatabaseFlags::DUP_SORT);
    let err = open_err(dir.path());
    assert!(err.contains("key b holds several values"), "{err}");
}
