//! The fuzz targets' bodies: each feeds arbitrary bytes to one parser of
//! untrusted input and must return (an error is fine) without panicking,
//! aborting, hanging or allocating without bound. The libFuzzer entry points
//! (`fuzz_targets/`) and the corpus replay (`tests/replay.rs`) both call
//! these, so every corpus file is a regression test.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};

use brand_format::chunk;
use brand_format::index::Index;
use brand_format::manifest::Manifest;

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory.
pub const TARGETS: [(&str, Target); 13] = [
    ("index", index),
    ("chunk_header", chunk_header),
    ("manifest", manifest),
    ("state", state),
    ("loader_toml", loader_toml),
    ("tfrecord", tfrecord),
    ("lmdb", lmdb),
    ("lmdb_page", lmdb_page),
    ("tar", tar),
    ("arrow", arrow),
    ("flatbuffers", flatbuffers),
    ("nodes", nodes),
    ("cache_wire", cache_wire),
];

/// A thread's scratch directory, removed when the thread ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const SCRATCH_PREFIX: &str = "brand-fuzz-";

/// Removes the scratch directories of processes that have ended: the main
/// thread's is never dropped (thread-locals of the main thread are not
/// destroyed at exit, and libFuzzer ends the process from it).
fn remove_stale_scratch(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A scratch directory for targets that parse files, one per thread.
fn scratch() -> PathBuf {
    thread_local! {
        static DIR: RefCell<Option<Scratch>> = const { RefCell::new(None) };
    }
    static SWEEP: std::sync::Once = std::sync::Once::new();
    DIR.with(|d| {
        d.borrow_mut()
            .get_or_insert_with(|| {
                let base = if Path::new("/dev/shm").is_dir() {
                    PathBuf::from("/dev/shm")
                } else {
                    std::env::temp_dir()
                };
                SWEEP.call_once(|| remove_stale_scratch(&base));
                let dir = base.join(format!(
                    "{SCRATCH_PREFIX}{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&dir).expect("scratch directory for the fuzz target");
                Scratch(dir)
            })
            .0
            .clone()
    })
}

/// `index.bin`: as given, and with its trailer (crc32c and end marker)
/// made valid, so mutations reach the checks behind the checksum.
pub fn index(data: &[u8]) {
    index_bytes(data);
    if data.len() >= 12 {
        // Version 1: one crc32c over everything before the trailer.
        let mut fixed = data.to_vec();
        let body = fixed.len() - 12;
        let crc = crc32c::crc32c(&fixed[..body]);
        fixed[body..body + 4].copy_from_slice(&crc.to_le_bytes());
        fixed[body + 4..].copy_from_slice(&brand_format::index::INDEX_END);
        index_bytes(&fixed);
    }
    if let Some(fixed) = with_valid_v2_crcs(data) {
        index_bytes(&fixed);
    }
}

/// `data` with a version-2 trailer made valid: the crc32c of the header,
/// chunks and columns, and the crc32c of the keys, where the header places
/// them inside the input.
fn with_valid_v2_crcs(data: &[u8]) -> Option<Vec<u8>> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?));
    let (n, chunks) = (u64_at(16)?, u64_at(24)?);
    let widths = data.get(36..40)?;
    let per_sample = 12 + 4 * u64::from(widths[1] == 1) + u64::from(widths[0]);
    let key_end = 64u64
        .checked_add(chunks.checked_mul(16)?)?
        .checked_add(n.checked_mul(per_sample)?)?;
    let body = data.len().checked_sub(16)?;
    let key_end = usize::try_from(key_end).ok().filter(|&k| k <= body)?;
    let mut fixed = data.to_vec();
    let meta = crc32c::crc32c(&fixed[..key_end]);
    let keys = crc32c::crc32c(&fixed[key_end..body]);
    fixed[body..body + 4].copy_from_slice(&meta.to_le_bytes());
    fixed[body + 4..body + 8].copy_from_slice(&keys.to_le_bytes());
    fixed[body + 8..].copy_from_slice(&brand_format::index::INDEX_END);
    Some(fixed)
}

fn index_bytes(data: &[u8]) {
    if let Ok(idx) = Index::from_bytes(data, Path::new("index.bin")) {
        // What readers do with a parsed index must not panic either.
        for c in 0..idx.chunk_count() {
            let _ = idx.chunk_padded_len(c);
            let _ = brand_format::extents::extents(&idx, c, u64::MAX, brand_format::extents::ReadGap::Bytes(u64::MAX));
            let _ = brand_format::extents::extents(&idx, c, u64::MAX, brand_format::extents::ReadGap::Whole);
        }
        for id in 0..idx.samples().min(1000) {
            let _ = idx.record_location(id);
            let _ = (idx.key(id), idx.label(id), idx.raw_len(id), idx.crc(id));
        }
        let _ = idx.check_keys();
        let _ = idx.content_digest();
        assert_eq!(
            Index::from_bytes(idx.as_bytes(), Path::new("index.bin")).ok(),
            Some(idx)
        );
    }
}

/// A chunk's header and record table: as given, and with its header crc32c
/// made valid.
pub fn chunk_header(data: &[u8]) {
    chunk_bytes(data);
    if data.len() >= chunk::FIXED_HEADER {
        let hlen = u32::from_le_bytes([data[24], data[25], data[26], data[27]]) as usize;
        if (32..=data.len()).contains(&hlen) {
            let mut fixed = data.to_vec();
            fixed[28..32].fill(0);
            let crc = crc32c::crc32c(&fixed[..hlen]);
            fixed[28..32].copy_from_slice(&crc.to_le_bytes());
            chunk_bytes(&fixed);
        }
    }
}

fn chunk_bytes(data: &[u8]) {
    let _ = chunk::peek_lengths(data);
    let _ = chunk::compression_flag(data);
    if let Ok(h) = chunk::parse_header(data) {
        assert!(h.header_len as u64 <= h.chunk_len);
        for r in &h.records {
            assert!(r.offset as u64 + r.stored_len as u64 <= h.chunk_len);
            // What the blocks flag promises, whatever bytes carried it.
            assert!(!h.blocks() || !chunk::extra_block(r.offset as u64, r.stored_len as u64));
        }
    }
}

/// `manifest.toml`.
pub fn manifest(data: &[u8]) {
    let path = scratch().join("manifest.toml");
    if std::fs::write(&path, data).is_ok()
        && let Ok(m) = Manifest::load(&path)
    {
        for s in &m.segments {
            assert!(
                !s.name.contains('/') && s.name != ".." && !s.name.is_empty(),
                "{:?}",
                s.name
            );
        }
        let _ = m.to_toml();
    }
}

/// A loader state blob (`brand_state_save`), through `brand_open_at`: the
/// blob is decoded before the (missing) dataset is looked at.
pub fn state(data: &[u8]) {
    state_bytes(data);
    if data.len() >= 88 {
        let mut fixed = data.to_vec();
        let crc = crc32c::crc32c(&fixed[..84]);
        fixed[84..88].copy_from_slice(&crc.to_le_bytes());
        state_bytes(&fixed);
    }
}

fn state_bytes(data: &[u8]) {
    let path = CString::new("/nonexistent/brand-fuzz-dataset").expect("no NUL");
    let mut loader = std::ptr::null_mut();
    let status = brand::brand_open_at(path.as_ptr(), std::ptr::null(), data.as_ptr(), data.len(), &mut loader);
    assert_ne!(
        status,
        brand::brand_status::BRAND_ERR_PANIC,
        "a panic was caught at the boundary"
    );
    assert!(loader.is_null());
}

/// The loader's TOML config, through `LoaderConfig::from_toml` and the C ABI.
pub fn loader_toml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = brand_loader::LoaderConfig::from_toml(text);
    }
    if let Ok(c) = CString::new(data) {
        let mut len = 0u64;
        let path = CString::new("/nonexistent/brand-fuzz-dataset").expect("no NUL");
        let status = brand::brand_epoch_len_for(path.as_ptr(), c.as_ptr() as *const c_char, &mut len);
        assert_ne!(status, brand::brand_status::BRAND_ERR_PANIC);
    }
}

/// A TFRecord file: framing, then each record's tf.train.Example.
pub fn tfrecord(data: &[u8]) {
    use brand_pack::source::Source;
    let path = scratch().join("input.tfrecord");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(src) = brand_import::tfrecord::TfRecordSource::open(std::slice::from_ref(&path), Some("label")) {
        for i in 0..src.len().min(1000) {
            let _ = src.read(i);
        }
    }
}

/// An LMDB environment (`data.mdb`), through the importer's public API.
pub fn lmdb(data: &[u8]) {
    use brand_pack::source::Source;
    let dir = scratch().join("lmdb");
    if std::fs::create_dir_all(&dir).is_err() || std::fs::write(dir.join("data.mdb"), data).is_err() {
        return;
    }
    let _ = std::fs::remove_file(dir.join("lock.mdb"));
    if let Ok(src) = brand_import::lmdb::LmdbSource::open(&dir) {
        for i in 0..src.len().min(1000) {
            let _ = src.read(i);
        }
    }
}

/// One page of an LMDB data file, without a file: checked as a meta page
/// and as a branch or leaf page and every node on it (the B+tree reader,
/// `brand_import::lmdb::btree`, below what `lmdb` reaches through a file).
pub fn lmdb_page(data: &[u8]) {
    let _ = brand_import::lmdb::btree::parse_page(data);
}

/// A tar archive (plain or gzipped; ustar, PAX, GNU long names, tars in
/// tars) through `TarSource::open` and `read`; the first byte picks the
/// payload fields and the label. Then every 512-byte block through the
/// header parser and the whole input through the PAX parser.
pub fn tar(data: &[u8]) {
    use brand_import::tar::{TarLabel, TarOptions, TarSource};
    use brand_pack::source::Source;
    let Some((&choice, archive)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    let path = dir.join("input.tar");
    if std::fs::write(&path, archive).is_err() {
        return;
    }
    let label = match choice % 4 {
        0 => TarLabel::None,
        1 => TarLabel::Cls,
        2 => TarLabel::Json("label".into()),
        _ => TarLabel::Dir,
    };
    let fields = match choice & 4 {
        0 => Vec::new(),
        _ => vec!["jpg".into(), "png".into()],
    };
    let options = TarOptions {
        fields,
        label,
        spool_dir: dir,
        store: Default::default(),
        listing: Default::default(),
    };
    if let Ok(src) = TarSource::open(std::slice::from_ref(&path), &options) {
        for i in 0..src.len().min(1000) {
            let _ = src.key(i);
            let _ = src.read(i);
        }
    }
    for block in archive.chunks_exact(brand_import::tar::BLOCK as usize) {
        if let Ok(block) = block.try_into() {
            let _ = brand_import::tar::parse_header(block);
        }
    }
    let _ = brand_import::tar::parse_pax(archive);
}

/// The job every `nodes` input is a node of: what a hello must carry to be
/// accepted (the seeds say it; `tests/seeds.rs`).
pub fn nodes_digest() -> brand_nodes::wire::JobDigest {
    brand_nodes::wire::JobDigest {
        protocol: brand_nodes::wire::PROTOCOL,
        job: "fuzz".into(),
        dataset: 0x0123_4567_89ab_cdef,
        samples: 97,
        policy: "brand".into(),
        memory: "8 slots".into(),
        seed: 7,
        world: 3,
        drop_last: false,
        nodes: NODES.join(","),
        start_epoch: 0,
        start_position: 0,
    }
}

/// An Arrow IPC file (stream or file format, as `datasets`' save_to_disk
/// writes it) through `ArrowSource::open` and `read`; the first byte picks
/// the payload field and the label.
pub fn arrow(data: &[u8]) {
    use brand_import::arrow::{ArrowOptions, ArrowSource};
    use brand_pack::source::Source;
    let Some((&choice, file)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    let path = dir.join("data-00000-of-00001.arrow");
    if std::fs::write(&path, file).is_err() {
        return;
    }
    let options = ArrowOptions {
        field: (choice & 1 == 1).then(|| "image".to_string()),
        label: (choice & 2 == 2).then(|| "label".to_string()),
        ..ArrowOptions::default()
    };
    if let Ok(src) = ArrowSource::open(std::slice::from_ref(&path), &options) {
        for i in 0..src.len().min(1000) {
            let _ = src.key(i);
            let _ = src.read(i);
        }
    }
}

/// Arbitrary bytes as a flatbuffer through the Arrow importer's reader
/// (`brand_import::arrow::flatbuffers`): from the root table, each of the
/// first field ids read as every kind (scalars, strings, vectors of 1-, 8-
/// and 16-byte structs, a table, a vector of tables), nested tables
/// followed four deep, in any combination a damaged schema could ask for.
pub fn flatbuffers(data: &[u8]) {
    use brand_import::arrow::flatbuffers::Table;
    fn walk(t: Table<'_>, depth: usize, budget: &mut usize) {
        for id in 0..8 {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            let _ = (t.i64(id, 0), t.i32(id, 0), t.i16(id, 0), t.u8(id, 0), t.string(id));
            for size in [1, 8, 16] {
                let _ = t.bytes(id, size);
            }
            if depth < 4 {
                if let Ok(Some(child)) = t.table(id) {
                    walk(child, depth + 1, budget);
                }
                if let Ok(children) = t.tables(id) {
                    for child in children.into_iter().take(8) {
                        walk(child, depth + 1, budget);
                    }
                }
            }
        }
    }
    if let Ok(root) = Table::root(data) {
        walk(root, 0, &mut 10_000);
    }
}

/// The `nodes` target's world.
pub const NODES: [&str; 3] = ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"];
/// Steps of the `nodes` target's consumer plan per epoch.
pub const NODES_STEPS: u64 = 40;

/// A `nodes` input: one byte, this node's rank (mod 3); then records of a
/// tag byte (even: a message on an owner's push stream to this node; odd: a
/// credit on this node's push stream to a consumer), a `u16` length (LE)
/// and that many bytes of protobuf.
pub fn nodes_record(tag: u8, message: &[u8]) -> Vec<u8> {
    let len = u16::try_from(message.len()).unwrap_or(u16::MAX);
    let mut out = vec![tag];
    out.extend(len.to_le_bytes());
    out.extend(&message[..len as usize]);
    out
}

/// The multi-node messages (`brand_nodes::wire`), as a node takes them:
/// every message type decoded alone (what decodes re-encodes to the same
/// message); then a push stream through `check::hello`, `check::next` and,
/// for samples, `check::sample` against a consumer plan (in order, within
/// the credit, the index's lengths, as the inbox applies it), and credits
/// through `check::CreditCheck`, asserting what an accepted message
/// promises.
pub fn nodes(data: &[u8]) {
    use brand_nodes::check::{self, CreditCheck, Next};
    use brand_nodes::routes::ConsumerPlan;
    use brand_nodes::wire::{Credit, Failure, Goodbye, Hello, JobDigest, Push, Sample};
    use prost::Message;

    fn again<M: Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) {
        if let Ok(m) = M::decode(data) {
            assert_eq!(M::decode(m.encode_to_vec().as_slice()).as_ref(), Ok(&m));
        }
    }
    again::<Push>(data);
    again::<Hello>(data);
    again::<JobDigest>(data);
    again::<Sample>(data);
    again::<Credit>(data);
    again::<Failure>(data);
    again::<Goodbye>(data);

    let Some((&rank, mut rest)) = data.split_first() else {
        return;
    };
    let world = NODES.len() as u32;
    let me = rank as u32 % world;
    let cfg = brand_nodes::NodeConfig {
        nodes: NODES.iter().map(|s| s.to_string()).collect(),
        rank: me,
        remote_memory: 1 << 20,
        peer_timeout: std::time::Duration::from_secs(1),
        job: "fuzz".into(),
        last_epoch: None,
    };
    let ours = nodes_digest();
    // Step i serves sample (7i + me) mod 97, sent by node i mod 3; a
    // sample's bytes measure its id mod 50.
    let plan = ConsumerPlan {
        epoch: 0,
        samples: (0..NODES_STEPS).map(|i| ((7 * i + me as u64) % 97) as u32).collect(),
        owners: (0..NODES_STEPS).map(|i| (i % 3) as u32).collect(),
    };
    let window = 32;
    let mut next_from = [0u64; 3];
    let mut from: Option<u32> = None;
    let mut ended = false;
    let mut credits = CreditCheck::new(0, NODES_STEPS);
    while rest.len() >= 3 {
        let (tag, len) = (rest[0], u16::from_le_bytes([rest[1], rest[2]]) as usize);
        let body = &rest[3..(3 + len).min(rest.len())];
        rest = &rest[3 + body.len()..];
        if tag & 1 == 1 {
            if let Ok(c) = Credit::decode(body)
                && credits.take(c).is_ok()
            {
                assert!(c.window <= NODES_STEPS, "{c:?}");
            }
            continue;
        }
        if ended {
            continue;
        }
        let Ok(m) = Push::decode(body) else {
            // The stream breaks (tonic's Internal status): it ends.
            ended = true;
            continue;
        };
        let Some(owner) = from else {
            match check::hello(Some(m), &cfg, &ours) {
                Ok(h) => {
                    assert!(h.from < world && h.from != me && h.to == me, "{h:?}");
                    assert_eq!(h.job.as_ref(), Some(&ours));
                    from = Some(h.from);
                }
                Err(_) => ended = true,
            }
            continue;
        };
        match check::next(m, owner, &cfg) {
            Next::Sample(s) => {
                let i = owner as usize;
                match check::sample(&s, owner, &plan, next_from[i], window, |y| y % 50) {
                    Ok(()) => {
                        let step = s.step as usize;
                        assert_eq!(plan.samples[step] as u64, s.sample);
                        assert_eq!(plan.owners[step], owner);
                        assert!(s.step >= next_from[i] && s.step < window);
                        assert_eq!(s.data.len() as u64, s.sample % 50);
                        next_from[i] = s.step + 1;
                    }
                    Err(why) => {
                        assert!(why.starts_with("sent a bad push"), "{why}");
                        ended = true;
                    }
                }
            }
            Next::Failed { node, why } => {
                assert!(node < world);
                assert!(why.len() <= check::MAX_WHY + 200, "{} bytes", why.len());
                ended = true;
            }
            Next::Goodbye => ended = true,
            Next::Wrong(why) => {
                assert!(why.starts_with("sent "), "{why}");
                ended = true;
            }
        }
    }
}

/// The `cache_wire` target's dataset, as a job's hello must name it.
pub fn cache_digest() -> brand_cache::wire::Digest {
    brand_cache::wire::Digest {
        samples: 600,
        chunk_size: 16,
        content: 0x89ab_cdef,
        pack_seed: 1,
    }
}

/// The cache's socket protocol (`brand_cache::wire`), both ways: the bytes
/// as frames a cache reads from a job (its first within the hello's bound,
/// the rest within an attached job's) and decodes as `ToCache`, the hello
/// through `Hello::check`; and as frames a job reads from the cache,
/// decoded as `ToJob`. What decodes re-encodes to the same message.
pub fn cache_wire(data: &[u8]) {
    use brand_cache::wire::{
        Hello, ToCache, ToJob, attached_frame_max, hello_frame_max, read_frame, read_frame_within,
    };

    let digest = cache_digest();
    let n = digest.samples;
    // The batch size of the hello taken, once one is.
    let mut attached: Option<u32> = None;
    let mut r = data;
    loop {
        let max = move |kind| match attached {
            None => Ok(hello_frame_max(n)),
            Some(batch) => attached_frame_max(n, batch, kind),
        };
        let Ok(Some((kind, body))) = read_frame_within(&mut r, max) else {
            break;
        };
        assert!(max(kind).is_ok_and(|m| body.len() < m));
        let Ok(m) = ToCache::decode(kind, &body) else {
            break;
        };
        let frame = m.encode();
        let (k, b) = match read_frame(&mut frame.as_slice()) {
            Ok(Some(f)) => f,
            other => panic!("{m:?} encodes to no frame: {other:?}"),
        };
        assert_eq!(ToCache::decode(k, &b).as_ref(), Ok(&m));
        if let ToCache::Hello(h) = &m {
            let checked: Result<_, String> = Hello::check(h, &digest, "the cache", 1 << 20, |size| size * 1000);
            if let Ok(served) = checked {
                assert_eq!(served.samples(), digest.samples);
                assert!(h.epoch < u64::MAX);
            }
            attached = Some(h.batch_size);
        }
    }
    let mut r = data;
    while let Ok(Some((kind, body))) = read_frame(&mut r) {
        let Ok(m) = ToJob::decode(kind, &body) else {
            break;
        };
        let frame = m.encode();
        let (k, b) = match read_frame(&mut frame.as_slice()) {
            Ok(Some(f)) => f,
            other => panic!("{m:?} encodes to no frame: {other:?}"),
        };
        assert_eq!(ToJob::decode(k, &b).as_ref(), Ok(&m));
    }
}
