//! LMDB import: keys in LMDB order, labels from Caffe `Datum` values, values
//! read back byte for byte, and one-line errors for environments that cannot
//! be opened. Environments are written here with heed.

use std::fs;
use std::path::Path;

use brand_import::lmdb::LmdbSource;
use brand_pack::source::Source;
use heed::types::Bytes;
use heed::{CommitOrAbort, Database, DatabaseFlags, Env, EnvFlags, EnvOpenOptions};
use proptest::strategy::Strategy;

mod common;
use common::varint;

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
    let db = create_db(&env, None, db_flags);
    let mut wtxn = env.write_txn().unwrap();
    for (key, value) in pairs {
        db.put(&mut wtxn, key, value).unwrap();
    }
    wtxn.commit().unwrap();
}

/// Create (committed) the main database of `env`, or with `name` that named
/// sub-database, with `flags`.
fn create_db<'e>(env: &'e Env, name: Option<&str>, flags: DatabaseFlags) -> Database<'e, Bytes, Bytes> {
    let wtxn = env.write_txn().unwrap();
    env.create_databases_and_commit(wtxn, |opener, wtxn| {
        let mut options = opener.database_options().types::<Bytes, Bytes>();
        options.flags(flags);
        if let Some(name) = name {
            options.name(name);
        }
        options.create(wtxn).map(CommitOrAbort::<_, ()>::Commit)
    })
    .unwrap()
    .unwrap_commit()
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
    (0..source.len()).map(|i| source.key(i).into_owned()).collect()
}

fn labels(source: &LmdbSource) -> Vec<i64> {
    (0..source.len()).map(|i| source.label(i)).collect()
}

/// Every `(key, label)` as the source lists them.
fn listing(source: &LmdbSource) -> Vec<(Vec<u8>, i64)> {
    (0..source.len())
        .map(|i| (source.key(i).into_owned(), source.label(i)))
        .collect()
}

fn open_err(path: &Path) -> String {
    match LmdbSource::open(path) {
        Ok(s) => panic!("expected an error, got {} keys", s.len()),
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
    create_env_owned(dir.path(), &pairs, false);
    let first = listing(&LmdbSource::open(dir.path()).unwrap());
    let second = listing(&LmdbSource::open(dir.path()).unwrap());
    assert_eq!(first.len(), 300);
    assert_eq!(first, second);
    assert!(first.windows(2).all(|w| w[0].0 < w[1].0));
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
    create_env_owned(dir.path(), &pairs, false);
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
fn opening_twice_at_once_works() {
    // heed allowed one open per environment and process; plain file reads
    // have no such limit.
    let dir = tempfile::tempdir().unwrap();
    create_env(dir.path(), &[(b"k", b"v")], false);
    let first = LmdbSource::open(dir.path()).unwrap();
    let second = LmdbSource::open(dir.path()).unwrap();
    assert_eq!(listing(&first), listing(&second));
    assert_eq!(first.read(0).unwrap(), b"v");
    assert_eq!(second.read(0).unwrap(), b"v");
}

#[test]
fn a_key_with_several_values_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let pairs: &[(&[u8], &[u8])] = &[(b"a", b"1"), (b"b", b"2"), (b"b", b"3")];
    create_env_with(dir.path(), pairs, false, DatabaseFlags::DUP_SORT);
    let err = open_err(dir.path());
    assert!(err.contains("key b holds several values"), "{err}");
}

// Damaged and crafted environments. The reader must never panic or crash on
// them: each either lists the same samples or fails with a one-line error
// naming the file.

/// Byte offsets in an LMDB 0.9 data file (64-bit little-endian), for
/// crafting damaged files: a meta page is a 16-byte page header followed by
/// MDB_meta; a B+tree page is that header followed by u16 node offsets.
mod layout {
    pub const PAGE_FLAGS: usize = 10;
    pub const PAGE_LOWER: usize = 12;
    pub const META_MAGIC: usize = 16;
    pub const META_VERSION: usize = 20;
    pub const META_PAGE_SIZE: usize = 40;
    pub const META_MAIN_DEPTH: usize = 88 + 6;
    pub const META_MAIN_ROOT: usize = 88 + 40;
    pub const META_LAST_PAGE: usize = 136;
    pub const META_TXNID: usize = 144;
    pub const P_BRANCH: u16 = 0x01;
    pub const P_LEAF: u16 = 0x02;
    pub const P_OVERFLOW: u16 = 0x04;
}

/// Key/value pairs, in the order written or listed.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn get_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap())
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The page size, the byte offset of the current (higher txnid) meta page,
/// and that meta page's main-database root and depth.
struct Meta {
    page_size: usize,
    at: usize,
    root: u64,
    depth: u16,
}

fn current_meta(bytes: &[u8]) -> Meta {
    let page_size = u32::from_le_bytes(bytes[layout::META_PAGE_SIZE..][..4].try_into().unwrap()) as usize;
    let txnid = |at: usize| get_u64(bytes, at + layout::META_TXNID);
    let at = if txnid(page_size) > txnid(0) { page_size } else { 0 };
    Meta {
        page_size,
        at,
        root: get_u64(bytes, at + layout::META_MAIN_ROOT),
        depth: get_u16(bytes, at + layout::META_MAIN_DEPTH),
    }
}

/// The byte offset of node `i` of page `pgno`.
fn node_at(bytes: &[u8], page_size: usize, pgno: u64, i: usize) -> usize {
    let page = pgno as usize * page_size;
    page + get_u16(bytes, page + 16 + 2 * i) as usize
}

fn node_count(bytes: &[u8], page_size: usize, pgno: u64) -> usize {
    (get_u16(bytes, pgno as usize * page_size + layout::PAGE_LOWER) as usize - 16) / 2
}

fn page_flags(bytes: &[u8], page_size: usize, pgno: u64) -> u16 {
    get_u16(bytes, pgno as usize * page_size + layout::PAGE_FLAGS)
}

/// Child `i` of branch page `pgno`: lo u16 | hi u16 | top u16 in the node's
/// first six bytes.
fn child(bytes: &[u8], page_size: usize, pgno: u64, i: usize) -> u64 {
    let node = node_at(bytes, page_size, pgno, i);
    u64::from(get_u16(bytes, node))
        | u64::from(get_u16(bytes, node + 2)) << 16
        | u64::from(get_u16(bytes, node + 4)) << 32
}

fn set_child(bytes: &mut [u8], page_size: usize, pgno: u64, i: usize, to: u64) {
    let node = node_at(bytes, page_size, pgno, i);
    for (k, part) in [to as u16, (to >> 16) as u16, (to >> 32) as u16]
        .into_iter()
        .enumerate()
    {
        bytes[node + 2 * k..node + 2 * k + 2].copy_from_slice(&part.to_le_bytes());
    }
}

/// Every key/value pair of the main database as heed iterates it, and the
/// tree's depth.
fn heed_pairs(path: &Path) -> (Pairs, u32) {
    // SAFETY: the environment is closed by the writer and nothing changes it
    // while it is open here.
    let env = unsafe { EnvOpenOptions::new().open(path) }.unwrap();
    let rtxn = env.read_txn().unwrap();
    let db: Database<Bytes, Bytes> = env
        .open_databases_and_commit(rtxn, |opener, rtxn| {
            opener
                .open_database::<Bytes, Bytes>(rtxn, None)
                .map(CommitOrAbort::<_, ()>::Commit)
        })
        .unwrap()
        .unwrap_commit()
        .unwrap();
    let rtxn = env.read_txn().unwrap();
    let pairs = db
        .iter(&rtxn)
        .unwrap()
        .map(|item| {
            let (k, v) = item.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    let depth = db.stat(&rtxn).unwrap().depth;
    (pairs, depth)
}

/// Every key and value as the source lists and reads them.
fn source_pairs(source: &LmdbSource) -> Pairs {
    (0..source.len())
        .map(|i| (source.key(i).into_owned(), source.read(i).unwrap()))
        .collect()
}

/// `count` keys "key00000".. with Datum values labelled i % 10; every 40th
/// value is large enough for overflow pages.
fn numbered_pairs(count: u32) -> Pairs {
    (0..count)
        .map(|i| {
            let pixels = if i % 40 == 7 {
                vec![i as u8; 9000]
            } else {
                vec![i as u8; 30]
            };
            (
                format!("key{i:05}").into_bytes(),
                datum(Some(i as i32 % 10), &pixels, false),
            )
        })
        .collect()
}

fn create_env_owned(path: &Path, pairs: &[(Vec<u8>, Vec<u8>)], single_file: bool) {
    let borrowed: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    create_env(path, &borrowed, single_file);
}

/// The data file of an environment of `pairs` written in the directory
/// `dir/env`.
fn data_mdb_of(dir: &Path, pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let env = dir.join("env");
    fs::create_dir(&env).unwrap();
    create_env_owned(&env, pairs, false);
    fs::read(env.join("data.mdb")).unwrap()
}

/// The error for opening `bytes` written as a single-file environment,
/// checked to be one line naming the file.
fn open_bytes_err(dir: &Path, bytes: &[u8]) -> String {
    let path = dir.join("crafted.mdb");
    fs::write(&path, bytes).unwrap();
    let err = open_err(&path);
    assert!(err.starts_with(&format!("{}", path.display())), "{err}");
    assert!(!err.contains('\n'), "{err}");
    err
}

#[test]
fn truncated_data_mdb_is_refused_wherever_it_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data_mdb_of(dir.path(), &numbered_pairs(300));
    let page = current_meta(&bytes).page_size;
    // Freshly written: every page up to mm_last_pg is in the file and in use.
    let last_page = get_u64(&bytes, current_meta(&bytes).at + layout::META_LAST_PAGE) as usize;
    assert_eq!(bytes.len(), (last_page + 1) * page);
    assert!(last_page > 10, "{last_page}");

    let cuts = [
        ("mid meta page 0", 100),
        ("mid meta page 1", page + 100),
        ("after the meta pages", 2 * page),
        ("mid first data page", 2 * page + page / 2),
        ("mid a middle page", (last_page / 2) * page + 1000),
        ("mid last page", bytes.len() - page / 2),
        ("last byte", bytes.len() - 1),
        ("whole last page", bytes.len() - page),
    ];
    for (what, len) in cuts {
        let err = open_bytes_err(dir.path(), &bytes[..len]);
        assert!(err.contains(": open: truncated: "), "{what}: {err}");
    }
    let err = open_bytes_err(dir.path(), &bytes[..bytes.len() - page]);
    assert!(
        err.contains(&format!("runs through page {last_page}")) && err.contains("1 page(s) are missing"),
        "{err}"
    );
}

#[test]
fn last_page_beyond_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data_mdb_of(dir.path(), &numbered_pairs(100));
    let meta = current_meta(&bytes);
    let pages = (bytes.len() / meta.page_size) as u64;
    for claimed in [pages, pages + 5, 1 << 40, u64::MAX - 1, u64::MAX] {
        let mut crafted = bytes.clone();
        put_u64(&mut crafted, meta.at + layout::META_LAST_PAGE, claimed);
        let err = open_bytes_err(dir.path(), &crafted);
        assert!(err.contains(": open: truncated: "), "{claimed}: {err}");
        assert!(err.contains(&format!("runs through page {claimed}")), "{err}");
    }
}

#[test]
fn missing_free_pages_at_the_end_are_not_truncation() {
    // LMDB's meta page may count pages past the file's end when they are
    // free. Deleting most keys and then committing small transactions leaves
    // free pages at the end of the file; cutting them off keeps a valid
    // environment, cutting one more page does not.
    let dir = tempfile::tempdir().unwrap();
    let env_dir = dir.path().join("env");
    fs::create_dir(&env_dir).unwrap();
    let mut options = EnvOpenOptions::new();
    options.map_size(64 << 20);
    // SAFETY: a fresh directory nothing else has open.
    let env = unsafe { options.open(&env_dir) }.unwrap();
    let db = create_db(&env, None, DatabaseFlags::empty());
    let mut wtxn = env.write_txn().unwrap();
    for i in 0..3000 {
        db.put(&mut wtxn, format!("a{i:06}").as_bytes(), &[7; 100]).unwrap();
    }
    wtxn.commit().unwrap();
    let mut wtxn = env.write_txn().unwrap();
    for i in 100..3000 {
        db.delete(&mut wtxn, format!("a{i:06}").as_bytes()).unwrap();
    }
    wtxn.commit().unwrap();
    for t in 0..5 {
        let mut wtxn = env.write_txn().unwrap();
        db.put(&mut wtxn, format!("z{t}").as_bytes(), b"z").unwrap();
        wtxn.commit().unwrap();
    }
    drop(env);

    let bytes = fs::read(env_dir.join("data.mdb")).unwrap();
    let expected = heed_pairs(&env_dir).0;
    assert_eq!(expected.len(), 105);
    let page = current_meta(&bytes).page_size;
    let mut opened = 0;
    for cut in 1..bytes.len() / page {
        let path = dir.path().join("cut.mdb");
        fs::write(&path, &bytes[..bytes.len() - cut * page]).unwrap();
        match LmdbSource::open(&path) {
            Ok(source) => {
                assert_eq!(source_pairs(&source), expected, "cut {cut}");
                opened += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("page(s) are in use"), "cut {cut}: {e}");
                break;
            }
        }
    }
    assert!(opened >= 1, "no free pages at the end of the file");
}

#[test]
fn cyclic_or_shared_branch_pages_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Long keys make a tree of three or more levels.
    let pairs: Pairs = (0..3000u32)
        .map(|i| (format!("{i:06}-{}", "k".repeat(200)).into_bytes(), vec![1; 10]))
        .collect();
    let bytes = data_mdb_of(dir.path(), &pairs);
    let Meta {
        page_size, root, depth, ..
    } = current_meta(&bytes);
    assert!(depth >= 3, "depth {depth}");
    // The leftmost path: root, a second-level branch, ..., a leaf.
    let mut path = vec![root];
    while page_flags(&bytes, page_size, *path.last().unwrap()) & layout::P_BRANCH != 0 {
        path.push(child(&bytes, page_size, *path.last().unwrap(), 0));
    }
    assert_eq!(path.len(), usize::from(depth));
    let middle = path[1];
    let last = node_count(&bytes, page_size, root) - 1;
    // The rightmost leaf, visited last.
    let mut leaf = root;
    while page_flags(&bytes, page_size, leaf) & layout::P_BRANCH != 0 {
        leaf = child(&bytes, page_size, leaf, node_count(&bytes, page_size, leaf) - 1);
    }
    assert_eq!(page_flags(&bytes, page_size, leaf) & layout::P_LEAF, layout::P_LEAF);

    let crafted = |page: u64, i: usize, to: u64| {
        let mut crafted = bytes.clone();
        set_child(&mut crafted, page_size, page, i, to);
        open_bytes_err(dir.path(), &crafted)
    };
    // The root's last child is the root.
    let err = crafted(root, last, root);
    assert!(
        err.contains(&format!("page {root} at byte ")) && err.contains("reached twice"),
        "{err}"
    );
    // A second-level branch points back up to the root.
    let err = crafted(middle, 1, root);
    assert!(err.contains("reached twice"), "{err}");
    // Two parents share a child.
    let err = crafted(root, 1, middle);
    assert!(err.contains("reached twice"), "{err}");
    // A child that is a meta page, or past the end.
    let err = crafted(root, 1, 1);
    assert!(err.contains("outside the data pages"), "{err}");
    let err = crafted(middle, 1, u64::from(u32::MAX) << 8);
    assert!(err.contains("outside the data pages"), "{err}");
    // A branch skipping a level reaches a leaf above the bottom.
    let err = crafted(root, 1, leaf);
    assert!(
        err.contains(&format!("a leaf page at level 2 of a tree of depth {depth}")),
        "{err}"
    );

    // A meta page claiming a deeper or impossible tree.
    for claimed in [depth - 1, depth + 1, 33, 0, u16::MAX] {
        let mut crafted = bytes.clone();
        let at = current_meta(&bytes).at + layout::META_MAIN_DEPTH;
        crafted[at..at + 2].copy_from_slice(&claimed.to_le_bytes());
        let err = open_bytes_err(dir.path(), &crafted);
        assert!(err.contains("level") || err.contains("depth"), "{claimed}: {err}");
    }
}

#[test]
fn overflow_values_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [
        0,
        1,
        1000,
        2000,
        2030,
        2040,
        2048,
        2060,
        4000,
        4080,
        4096,
        4097,
        8192,
        12289,
        65536,
        1 << 20,
    ];
    let pairs: Pairs = sizes
        .iter()
        .map(|&size| {
            let value = (0..size).map(|j| (j * 31 + size) as u8).collect();
            (format!("v{size:08}").into_bytes(), value)
        })
        .collect();
    create_env_owned(dir.path(), &pairs, false);
    let source = LmdbSource::open(dir.path()).unwrap();
    assert_eq!(source_pairs(&source), pairs);
    assert_eq!(heed_pairs(dir.path()).0, pairs);
}

#[test]
fn ten_thousand_entries_match_heeds_own_iteration() {
    let dir = tempfile::tempdir().unwrap();
    let pairs: Pairs = (0..10_000u32)
        .map(|i| {
            // Scattered insertion order, keys of 9 to 128 bytes, and some
            // values on overflow pages.
            let n = i * 7919 % 10_000;
            let key = format!("{n:08}/{}", "x".repeat((n % 120) as usize)).into_bytes();
            let pixels = vec![n as u8; if n % 97 == 0 { 6000 } else { (n % 300) as usize }];
            (key, datum(Some(n as i32 % 1000), &pixels, n % 2 == 0))
        })
        .collect();
    create_env_owned(dir.path(), &pairs, false);
    let (expected, depth) = heed_pairs(dir.path());
    assert_eq!(expected.len(), 10_000);
    assert!(depth >= 3, "depth {depth}");

    let source = LmdbSource::open(dir.path()).unwrap();
    assert_eq!(source_pairs(&source), expected);
    let expected_labels: Vec<i64> = expected
        .iter()
        .map(|(k, _)| std::str::from_utf8(&k[..8]).unwrap().parse::<i64>().unwrap() % 1000)
        .collect();
    assert_eq!(labels(&source), expected_labels);
}

#[test]
// heed prefers a Rust comparator to INTEGER_KEY; the point here is LMDB's own
// flag on disk.
#[allow(deprecated)]
fn integer_and_reverse_keys_list_in_lmdb_order() {
    for flags in [DatabaseFlags::INTEGER_KEY, DatabaseFlags::REVERSE_KEY] {
        let dir = tempfile::tempdir().unwrap();
        let pairs: Pairs = (0..2000u32)
            .map(|i| ((i * 7919 % 2000).to_ne_bytes().to_vec(), i.to_le_bytes().to_vec()))
            .collect();
        let borrowed: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        create_env_with(dir.path(), &borrowed, false, flags);
        let source = LmdbSource::open(dir.path()).unwrap();
        let listed = source_pairs(&source);
        let mut sorted = pairs.clone();
        // Both orders compare bytes from the end: numeric for
        // little-endian integers.
        sorted.sort_by(|a, b| a.0.iter().rev().cmp(b.0.iter().rev()));
        assert_eq!(listed, sorted, "{flags:?}");
    }
}

#[test]
fn named_sub_databases_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = EnvOpenOptions::new();
    options.map_size(16 << 20).max_dbs(4);
    // SAFETY: a fresh directory nothing else has open.
    let env = unsafe { options.open(dir.path()) }.unwrap();
    let db = create_db(&env, Some("train"), DatabaseFlags::empty());
    let mut wtxn = env.write_txn().unwrap();
    db.put(&mut wtxn, b"k", b"v").unwrap();
    wtxn.commit().unwrap();
    drop(env);
    let err = open_err(dir.path());
    assert!(err.contains("key train names a sub-database"), "{err}");
}

#[test]
fn foreign_layouts_and_versions_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data_mdb_of(dir.path(), &[(b"a".to_vec(), b"1".to_vec())]);
    let page = current_meta(&bytes).page_size;

    let mut big_endian = bytes.clone();
    big_endian[layout::META_MAGIC..][..4].reverse();
    assert!(open_bytes_err(dir.path(), &big_endian).contains("a big-endian LMDB environment"));

    // A 32-bit build's page header is 12 bytes, so its magic comes earlier.
    let mut narrow = vec![0; 2 * page];
    narrow[12..16].copy_from_slice(&0xBEEF_C0DEu32.to_le_bytes());
    assert!(open_bytes_err(dir.path(), &narrow).contains("a 32-bit LMDB environment"));

    let mut devel = bytes.clone();
    devel[layout::META_VERSION..][..4].copy_from_slice(&999u32.to_le_bytes());
    assert!(open_bytes_err(dir.path(), &devel).contains("LMDB data format version 999 is not supported"));

    for size in [0u32, 1000, 256, 1 << 16, u32::MAX] {
        let mut odd = bytes.clone();
        odd[layout::META_PAGE_SIZE..][..4].copy_from_slice(&size.to_le_bytes());
        let err = open_bytes_err(dir.path(), &odd);
        assert!(
            err.contains(&format!("meta page 0 gives a page size of {size} bytes")),
            "{err}"
        );
    }

    let mut no_second_meta = bytes.clone();
    no_second_meta[page + layout::META_MAGIC] ^= 0xff;
    assert!(open_bytes_err(dir.path(), &no_second_meta).contains("meta page 1 is damaged"));
}

#[test]
fn damage_after_open_is_an_error_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("env.mdb");
    let pairs = numbered_pairs(200);
    create_env_owned(&path, &pairs, true);
    let bytes = fs::read(&path).unwrap();
    let source = LmdbSource::open(&path).unwrap();
    let page = current_meta(&bytes).page_size;

    // Cut to the meta pages: every read names its key and page.
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(2 * page as u64)
        .unwrap();
    for i in [0, 7, 199] {
        let err = source.read(i).unwrap_err().to_string();
        let key = String::from_utf8(pairs[i].0.clone()).unwrap();
        assert!(err.contains(&format!(": key {key} (page ")), "{err}");
        assert!(err.contains("truncated"), "{err}");
    }

    // Zeroed pages: no longer leaf pages.
    let mut zeroed = bytes.clone();
    zeroed[2 * page..].fill(0);
    fs::write(&path, &zeroed).unwrap();
    let err = source.read(3).unwrap_err().to_string();
    assert!(err.contains("the page header says it is page 0"), "{err}");

    // A different database in the same file: the keys are gone.
    create_env_owned(dir.path().join("other.mdb").as_path(), &numbered_pairs(150)[50..], true);
    fs::write(&path, fs::read(dir.path().join("other.mdb")).unwrap()).unwrap();
    let err = source.read(0).unwrap_err().to_string();
    assert!(err.contains("the key is gone") || err.contains("page"), "{err}");

    fs::write(&path, &bytes).unwrap();
    assert_eq!(source_pairs(&source), pairs);
}

/// A small two-level environment with overflow values, as file bytes, and
/// its pairs.
fn flip_target() -> &'static (Vec<u8>, Pairs) {
    static TARGET: std::sync::OnceLock<(Vec<u8>, Pairs)> = std::sync::OnceLock::new();
    TARGET.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env.mdb");
        let pairs = numbered_pairs(200);
        create_env_owned(&path, &pairs, true);
        (fs::read(&path).unwrap(), pairs)
    })
}

fn flip_page_size() -> usize {
    current_meta(&flip_target().0).page_size
}

/// Open the damaged environment at `path` and check the outcome: a one-line
/// error naming the file, or the original pairs with at most one pair
/// changed (LMDB keeps no checksums, so a flipped byte inside a key or a
/// value cannot be seen).
fn check_damaged(path: &Path, original: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
    match LmdbSource::open(path) {
        Err(e) => {
            let e = e.to_string();
            if !e.starts_with(&path.display().to_string()) || e.contains('\n') {
                return Err(format!("bad error: {e}"));
            }
            Ok(())
        }
        Ok(source) => {
            let mut listed = Vec::new();
            for i in 0..source.len() {
                let value = source
                    .read(i)
                    .map_err(|e| format!("opened, then read {i} failed: {e}"))?;
                listed.push((source.key(i).into_owned(), value));
            }
            if listed.len() != original.len() {
                return Err(format!("{} pairs instead of {}", listed.len(), original.len()));
            }
            let changed = listed.iter().zip(original).filter(|(a, b)| a != b).count();
            if changed > 1 {
                return Err(format!("{changed} pairs changed"));
            }
            Ok(())
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    #[test]
    fn a_flipped_byte_is_the_same_samples_or_an_error(
        // Half the flips land in page headers and node offsets, where the
        // structure is; the rest anywhere.
        (at, mask) in proptest::prop_oneof![
            (0..flip_target().0.len(), 1..=255u8),
            (0..flip_target().0.len() / flip_page_size(), 0..96usize, 1..=255u8)
                .prop_map(|(page, offset, mask)| (page * flip_page_size() + offset, mask)),
        ]
    ) {
        let (bytes, pairs) = flip_target();
        let mut damaged = bytes.clone();
        damaged[at] ^= mask;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.mdb");
        fs::write(&path, &damaged).unwrap();
        let checked = check_damaged(&path, pairs);
        proptest::prop_assert!(checked.is_ok(), "byte {} ^ {:#04x}: {:?}", at, mask, checked);
    }
}

/// Every single-bit flip of every byte of the file's structure (meta fields,
/// page headers, node offsets, node headers, overflow page numbers) and of
/// every 61st byte elsewhere. Tens of thousands of opens, so run by hand:
/// `cargo test --test import_lmdb -- --ignored every_single_bit_flip`.
#[test]
#[ignore]
fn every_single_bit_flip_is_the_same_samples_or_an_error() {
    use std::os::unix::fs::FileExt;
    let (bytes, pairs) = flip_target();
    let page_size = flip_page_size();
    let mut targets: Vec<usize> = (0..bytes.len()).step_by(61).collect();
    for meta in [0, page_size] {
        targets.extend(meta..meta + 152);
    }
    let mut pgno = 2;
    while pgno < (bytes.len() / page_size) as u64 {
        let page = pgno as usize * page_size;
        targets.extend(page..page + 16);
        pgno += 1;
        if page_flags(bytes, page_size, pgno - 1) & layout::P_OVERFLOW != 0 {
            // Skip the value's further pages.
            pgno += u64::from(u32::from_le_bytes(bytes[page + 12..page + 16].try_into().unwrap())) - 1;
            continue;
        }
        let pgno = pgno - 1;
        let nodes = node_count(bytes, page_size, pgno);
        targets.extend(page + 16..page + 16 + 2 * nodes);
        for i in 0..nodes {
            let node = node_at(bytes, page_size, pgno, i);
            targets.extend(node..node + 8);
            let big = page_flags(bytes, page_size, pgno) & layout::P_LEAF != 0 && get_u16(bytes, node + 4) & 1 != 0;
            if big {
                let data = node + 8 + get_u16(bytes, node + 6) as usize;
                targets.extend(data..data + 8);
            }
        }
    }
    targets.sort_unstable();
    targets.dedup();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.mdb");
    fs::write(&path, bytes).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut failures = Vec::new();
    for &at in &targets {
        for bit in 0..8 {
            file.write_all_at(&[bytes[at] ^ (1 << bit)], at as u64).unwrap();
            if let Err(e) = check_damaged(&path, pairs) {
                failures.push(format!("byte {at} bit {bit}: {e}"));
            }
        }
        file.write_all_at(&bytes[at..at + 1], at as u64).unwrap();
    }
    eprintln!("{} flips checked", targets.len() * 8);
    assert!(
        failures.is_empty(),
        "{} of {} flips failed, first: {:?}",
        failures.len(),
        targets.len() * 8,
        &failures[..failures.len().min(20)]
    );
}
