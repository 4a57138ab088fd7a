//! `brand pack` in bounded memory (issue 34): the sources list their samples
//! in a few bytes each plus the key bytes, and packing adds a few bytes per
//! sample (the shuffle's permutation), not an allocation per sample. Memory
//! is counted by this test binary's own global allocator (live bytes and
//! their peak), so a per-sample `Vec` reintroduced anywhere in the listing or
//! the packer shows up as tens of bytes per sample and fails the bounds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use brand_import::files::FileSource;
use brand_import::tfrecord::TfRecordSource;
use brand_pack::source::{Entries, Source};
use brand_pack::{PackOptions, pack};
use brand_testkit::Generated;

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the
// counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The counters are process-wide: one measurement at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Live bytes now, and the peak restarted from here.
fn restart_peak() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// Tiny samples with ImageFolder-like keys, listed in an arena.
fn tiny(entries: Entries) -> impl Source {
    Generated::new(entries, |i| Ok((i as u64).to_le_bytes().repeat(2)))
}

#[test]
fn packing_adds_a_few_bytes_per_sample_not_an_allocation() {
    const N: usize = 250_000;
    let _one = serial();
    let t = tempfile::tempdir().expect("tempdir");
    let before_listing = restart_peak();
    let mut entries: Entries = (0..N)
        .map(|i| (format!("class-{:03}/sample-{i:08}.bin", i % 1000), (i % 1000) as i64))
        .collect();
    entries.shrink_to_fit();
    let source = tiny(entries);
    let listed = LIVE.load(Ordering::Relaxed) - before_listing;
    let key_bytes: usize = (0..N).map(|i| source.key(i).len()).sum();
    // Key bytes, a 4-byte end and a 2-byte label each.
    assert!(
        listed <= key_bytes + 6 * N + (64 << 10),
        "the listing holds {listed} bytes for {N} samples ({key_bytes} of them key bytes)"
    );
    assert!(source.listing_bytes() <= key_bytes + 6 * N);

    let start = restart_peak();
    let opts = PackOptions {
        seed: 7,
        ..Default::default()
    };
    let m = pack(&source, &t.path().join("ds"), &opts, &|_, _, _| {}).expect("pack");
    assert_eq!(m.samples, N as u64);
    let peak = PEAK.load(Ordering::Relaxed) - start;
    let per_sample = peak as f64 / N as f64;
    eprintln!("pack of {N} samples: peak {peak} bytes above the listing, {per_sample:.1} per sample");
    // The permutation is 4 bytes a sample; the rest is a few chunks of
    // samples and the index's write buffers. A key copied per sample (a
    // `Vec<u8>` of ~30 bytes plus its 24-byte header) would be ~50 more.
    assert!(
        peak <= 8 * N + (6 << 20),
        "pack of {N} samples peaked at {peak} bytes above the listing ({per_sample:.1} per sample)"
    );
}

/// One TFRecord record framing `data`.
fn frame(data: &[u8], out: &mut Vec<u8>) {
    let masked = |b: &[u8]| crc32c::crc32c(b).rotate_right(15).wrapping_add(0xa282_ead8);
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked(data).to_le_bytes());
}

#[test]
fn a_tfrecord_listing_is_an_offset_and_a_label_per_record() {
    const N: usize = 200_000;
    let _one = serial();
    let t = tempfile::tempdir().expect("tempdir");
    // Examples `{ "label": int64_list [i % 100] }` spread over two files.
    let mut files = Vec::new();
    for part in 0..2 {
        let mut bytes = Vec::new();
        for i in (part * N / 2)..((part + 1) * N / 2) {
            let label = (i % 100) as u8;
            let feature = [0x1a, 3, 0x0a, 1, label];
            let mut entry = vec![0x0a, 5];
            entry.extend_from_slice(b"label");
            entry.extend_from_slice(&[0x12, feature.len() as u8]);
            entry.extend_from_slice(&feature);
            let mut features = vec![0x0a, entry.len() as u8];
            features.extend_from_slice(&entry);
            let mut example = vec![0x0a, features.len() as u8];
            example.extend_from_slice(&features);
            frame(&example, &mut bytes);
        }
        let path = t.path().join(format!("part-{part}.tfrecord"));
        std::fs::write(&path, bytes).expect("write");
        files.push(path);
    }

    let before = restart_peak();
    let source = TfRecordSource::open(&files, Some("label")).expect("open");
    let held = LIVE.load(Ordering::Relaxed) - before;
    eprintln!(
        "TFRecord listing of {N} records: {held} bytes held, {} by its own count",
        source.listing_bytes()
    );
    assert_eq!(source.len(), N);
    assert_eq!((source.label(0), source.label(N - 1)), (0, ((N - 1) % 100) as i64));
    assert_eq!(&*source.key(N / 2 + 3), b"part-1.tfrecord:3");
    // An 8-byte offset and a 1-byte label each; no key is stored.
    assert!(held <= 9 * N + (64 << 10), "{held} bytes held for {N} records");
    assert!(source.listing_bytes() <= 9 * N + (4 << 10));
}

#[test]
fn a_list_source_holds_its_paths_in_one_arena() {
    const N: usize = 200_000;
    let _one = serial();
    let t = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(t.path().join("d")).expect("mkdir");
    let mut list = String::new();
    for i in 0..N {
        let name = format!("d/{:04}", i % 1000);
        if i < 1000 {
            std::fs::write(t.path().join(&name), [i as u8]).expect("write");
        }
        list.push_str(&format!("{name}\t{}\n", i % 7));
    }
    let list_path = t.path().join("list.txt");
    std::fs::write(&list_path, list).expect("write list");

    let before = restart_peak();
    let source = FileSource::list(&list_path).expect("list");
    let held = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(source.len(), N);
    assert_eq!((&*source.key(1234), source.label(1234)), (&b"d/0234"[..], 2));
    assert_eq!(source.read(1234).expect("read"), [234u8]);
    // 6 key bytes, a 4-byte end and a 1-byte label each.
    assert!(held <= 11 * N + (64 << 10), "{held} bytes held for {N} list entries");
}
