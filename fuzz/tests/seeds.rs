//! Writes the seed corpus (`fuzz/corpus/<target>/seed-*`) from real files:
//! a packed dataset's index, chunk and manifest (uncompressed and zstd), a
//! saved loader state, loader configs, a TFRecord file, an LMDB
//! environment, the multi-node messages and the cache's frames, encoded by
//! brand's own encoders. Run by hand when the formats change:
//! `cargo test --manifest-path fuzz/Cargo.toml --test seeds -- --ignored`.

use std::ffi::CString;
use std::path::Path;

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus dir");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
}

fn masked_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = len.to_vec();
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand"]
fn write_seed_corpus() {
    let t = std::env::temp_dir().join(format!("brand-fuzz-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&t);
    // "blocks": samples around 4 KiB, so that the blocks layout moves some.
    for (name, zstd, mean_bytes) in [("plain", None, 300), ("zstd", Some(3), 300), ("blocks", None, 4000)] {
        let options = brand_import::synthetic::GenOptions {
            samples: 20,
            mean_bytes,
            min_bytes: 10,
            max_bytes: 3 * mean_bytes,
            classes: 3,
            seed: 1,
            ..Default::default()
        };
        let pack = brand_pack::PackOptions {
            chunk_size: 8,
            zstd,
            ..Default::default()
        };
        let ds = brand_import::synthetic::generate_and_pack(&t.join(name), &options, &pack).expect("dataset");
        put("index", name, &std::fs::read(ds.join("index.bin")).expect("index"));
        put(
            "manifest",
            name,
            &std::fs::read(ds.join("manifest.toml")).expect("manifest"),
        );
        let seg = std::fs::read(ds.join("data-00000.brd")).expect("segment");
        let opened = brand_format::Dataset::open(&ds).expect("open");
        let end = opened.index.chunk(0).offset + opened.index.chunk_padded_len(0);
        put("chunk_header", name, &seg[..end as usize]);
        if name == "plain" {
            let path = CString::new(ds.to_str().expect("utf-8")).expect("no NUL");
            let cfg = c"batch_size = 4\nmemory = \"8 slots\"\nread_gap = \"0\"";
            let mut l = std::ptr::null_mut();
            assert_eq!(
                brand::brand_open(path.as_ptr(), cfg.as_ptr(), &mut l),
                brand::brand_status::BRAND_OK
            );
            let mut b = std::ptr::null_mut();
            assert_eq!(brand::brand_next(l, &mut b), brand::brand_status::BRAND_OK);
            brand::brand_batch_free(&mut b);
            let mut blob = vec![0u8; 256];
            let mut written = 0;
            assert_eq!(
                brand::brand_state_save(l, blob.as_mut_ptr(), blob.len(), &mut written),
                brand::brand_status::BRAND_OK
            );
            put("state", "mid-epoch", &blob[..written]);
            assert_eq!(brand::brand_close(&mut l), brand::brand_status::BRAND_OK);
        }
    }
    for (name, text) in [
        ("defaults", ""),
        (
            "all-keys",
            "batch_size = 256\nmemory = \"10%\"\npolicy = \"brand\"\nseed = 1\nrank = 0\nworld = 2\ndrop_last = true\nreadahead = 4\nqueue_depth = 32\nread_gap = \"auto\"\nverify = true\n",
        ),
        ("bytes", "memory = \"512MiB\"\nread_gap = \"whole\"\n"),
        ("slots", "memory = \"64 slots\"\nread_gap = \"65536\"\n"),
    ] {
        put("loader_toml", name, text.as_bytes());
    }
    // A tf.train.Example with a bytes feature "image" and an int64 "label".
    let example: &[u8] = b"\x0a\x29\x0a\x0e\x0a\x05label\x12\x05\x1a\x03\x0a\x01\x07\x0a\x17\x0a\x05image\x12\x0e\x0a\x0c\x0a\x0apixels1234";
    let mut tf = frame(example);
    tf.extend(frame(b"raw bytes, not an Example"));
    put("tfrecord", "two-records", &tf);
    let env_dir = t.join("lmdb");
    std::fs::create_dir_all(&env_dir).expect("mkdir");
    {
        let mut options = heed::EnvOpenOptions::new();
        options.map_size(1 << 20);
        // SAFETY: a fresh directory nothing else has open.
        let env = unsafe { options.open(&env_dir) }.expect("env");
        let wtxn = env.write_txn().expect("txn");
        let db: heed::Database<heed::types::Bytes, heed::types::Bytes> = env
            .create_databases_and_commit(wtxn, |opener, wtxn| {
                opener
                    .database_options()
                    .types::<heed::types::Bytes, heed::types::Bytes>()
                    .create(wtxn)
                    .map(heed::CommitOrAbort::<_, ()>::Commit)
            })
            .expect("db")
            .unwrap_commit();
        let mut wtxn = env.write_txn().expect("txn");
        for i in 0..5u8 {
            db.put(&mut wtxn, &[b'k', i], &vec![i; 100 * i as usize + 1])
                .expect("put");
        }
        wtxn.commit().expect("commit");
    }
    put(
        "lmdb",
        "five-keys",
        &std::fs::read(env_dir.join("data.mdb")).expect("data.mdb"),
    );
    let _ = std::fs::remove_dir_all(&t);
    write_nodes_seeds();
    write_cache_wire_seeds();
}

/// Push streams to node 0 and 1 of the `nodes` target's job as its owners
/// send them (hello, the plan's samples in order, a failure, a goodbye, a
/// second hello) with credits between, encoded by prost.
fn write_nodes_seeds() {
    use brand_fuzz::{nodes_digest, nodes_record};
    use brand_nodes::wire::{Credit, Failure, Goodbye, Hello, Push, Sample, push};
    use prost::Message;

    let hello = |from, to| Push {
        body: Some(push::Body::Hello(Hello {
            from,
            to,
            job: Some(nodes_digest()),
            attempt: 1,
        })),
    };
    let push = |body| nodes_record(0, &Push { body: Some(body) }.encode_to_vec());
    let credit = |epoch, window| nodes_record(1, &Credit { epoch, window }.encode_to_vec());
    // Node 0 serves sample 7i mod 97 at step i, sent by node i mod 3.
    let mut session = vec![0u8];
    session.extend(credit(0, 16));
    session.extend(nodes_record(0, &hello(1, 0).encode_to_vec()));
    for step in (1..brand_fuzz::NODES_STEPS).step_by(3).take(8) {
        let sample = (7 * step) % 97;
        session.extend(push(push::Body::Sample(Sample {
            epoch: 0,
            step,
            sample,
            data: vec![b'x'; (sample % 50) as usize],
        })));
        if step == 10 {
            session.extend(credit(0, 32));
            session.extend(credit(1, 4));
        }
    }
    session.extend(push(push::Body::Goodbye(Goodbye {})));
    put("nodes", "session", &session);
    let mut failure = vec![1u8];
    failure.extend(nodes_record(0, &hello(2, 1).encode_to_vec()));
    failure.extend(push(push::Body::Failed(Failure {
        node: 0,
        why: "could not read: disk".into(),
    })));
    put("nodes", "failure", &failure);
    let mut twice = vec![2u8];
    twice.extend(nodes_record(0, &hello(0, 2).encode_to_vec()));
    twice.extend(nodes_record(0, &hello(0, 2).encode_to_vec()));
    put("nodes", "second-hello", &twice);
}

/// A job's side of the cache's socket (hello, requests, releases; a
/// resume's hello with a bitmap) and the cache's (welcome, a batch, a
/// failure), encoded by `brand_cache::wire`.
fn write_cache_wire_seeds() {
    use brand_cache::wire::{Hello, Placed, ToCache, ToJob};

    let hello = |served: Vec<u64>| {
        ToCache::Hello(Hello {
            digest: brand_fuzz::cache_digest(),
            seed: 5,
            batch_size: 10,
            epoch: 2,
            served,
        })
        .encode()
    };
    let mut job = hello(Vec::new());
    job.extend(ToCache::Next.encode());
    job.extend(ToCache::Release(vec![3, 1, 599]).encode());
    job.extend(ToCache::Next.encode());
    put("cache_wire", "job", &job);
    let mut words = vec![0u64; 10];
    words[0] = 0b1011;
    words[9] = 1 << 23;
    put("cache_wire", "job-resume", &hello(words));
    let mut cache = ToJob::Welcome { memory_len: 1 << 20 }.encode();
    cache.extend(
        ToJob::Batch {
            epoch: 2,
            samples: vec![
                Placed {
                    id: 3,
                    offset: 64,
                    len: 100,
                },
                Placed {
                    id: 599,
                    offset: 4096,
                    len: 7,
                },
            ],
            skipped: vec![8],
        }
        .encode(),
    );
    cache.extend(ToJob::Refused("the cache at c.sock serves another dataset".into()).encode());
    cache.extend(ToJob::Failed("the cache at c.sock stopped".into()).encode());
    put("cache_wire", "cache", &cache);
}
