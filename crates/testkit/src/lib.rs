//! brand-testkit: what brand's tests share, so each helper is written once:
//! loopback addresses for nodes ([`addresses`]), tar archives
//! ([`ustar`]), MDS datasets ([`write_mds`]), Arrow IPC files and
//! `save_to_disk` directories ([`arrow_ipc`]) and sources of samples made
//! in memory ([`Generated`]).
//! A dev-dependency only; nothing here is shipped.

pub mod arrow_ipc;

use std::borrow::Cow;

use brand_format::Result;
use brand_pack::source::{Entries, Source};

/// Loopback addresses free now and never handed out before in this
/// process: tests run in parallel, and a port one test was given and let go
/// can come back from the kernel to another test's bind, whose node would
/// then answer the first test's hellos.
pub fn addresses(n: usize) -> Vec<String> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = Vec::new(); // bound until all n are chosen: distinct within the call
    let mut out = Vec::new();
    while out.len() < n {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        if !handed_out.contains(&addr.port()) {
            handed_out.push(addr.port());
            out.push(addr.to_string());
        }
        held.push(l);
    }
    out
}

/// A ustar archive of `(name, bytes)` members, with its end blocks.
pub fn ustar<N: AsRef<str>, B: AsRef<[u8]>>(members: &[(N, B)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in members {
        let (name, bytes) = (name.as_ref(), bytes.as_ref());
        let mut block = [0u8; 512];
        block[..name.len()].copy_from_slice(name.as_bytes());
        block[124..136].copy_from_slice(format!("{:011o}\0", bytes.len()).as_bytes());
        block[156] = b'0';
        block[257..263].copy_from_slice(b"ustar\0");
        block[148..156].fill(b' ');
        let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
        block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend(block);
        out.extend_from_slice(bytes);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.extend([0; 1024]);
    out
}

/// A source whose samples are made as they are read: keys and labels
/// listed in an arena ([`Entries`], as an importer lists them), payload `i`
/// what `payload(i)` returns (an error too: a source that fails).
pub struct Generated<F> {
    entries: Entries,
    payload: F,
}

impl<F: Fn(usize) -> Result<Vec<u8>> + Sync> Generated<F> {
    pub fn new(entries: Entries, payload: F) -> Self {
        Generated { entries, payload }
    }

    /// `n` samples keyed `key(i)`, labelled `label(i)`.
    pub fn keyed(n: usize, key: impl Fn(usize) -> String, label: impl Fn(usize) -> i64, payload: F) -> Self {
        let entries = (0..n).map(|i| (key(i).into_bytes(), label(i))).collect();
        Self::new(entries, payload)
    }
}

impl<F: Fn(usize) -> Result<Vec<u8>> + Sync> Source for Generated<F> {
    fn kind(&self) -> &'static str {
        "test"
    }
    fn len(&self) -> usize {
        self.entries.len()
    }
    fn key(&self, i: usize) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.entries.key(i))
    }
    fn label(&self, i: usize) -> i64 {
        self.entries.label(i)
    }
    fn read(&self, i: usize) -> Result<Vec<u8>> {
        (self.payload)(i)
    }
    fn listing_bytes(&self) -> usize {
        self.entries.heap_bytes()
    }
}

/// An MDS shard's basename and its samples' labels and images.
pub type MdsShard = (String, Vec<(i64, Vec<u8>)>);

/// An MDS dataset as MosaicML Streaming writes one: `shards` (each a
/// basename, which may name a subdirectory, and its samples' labels and
/// images) of columns `image` (bytes), `label` (int) and `text` (str,
/// "caption of LABEL"), written plain or zstd-compressed at `zstd`'s level,
/// with their `index.json`, in `dir`.
pub fn write_mds(dir: &std::path::Path, shards: &[MdsShard], zstd: Option<i32>) {
    let mut entries = Vec::new();
    for (basename, samples) in shards {
        let raw = mds_shard(samples);
        let path = dir.join(basename);
        std::fs::create_dir_all(path.parent().expect("a shard's directory")).expect("mkdir");
        let zip = match zstd {
            Some(level) => {
                let z = zstd::encode_all(&raw[..], level).expect("zstd");
                std::fs::write(dir.join(format!("{basename}.zstd")), &z).expect("write");
                format!(
                    r#"{{"basename": "{basename}.zstd", "bytes": {}, "hashes": {{}}}}"#,
                    z.len()
                )
            }
            None => {
                std::fs::write(&path, &raw).expect("write");
                "null".to_string()
            }
        };
        entries.push(format!(
            r#"{{"column_encodings": ["bytes", "int", "str"], "column_names": ["image", "label", "text"],
                "column_sizes": [null, 8, null], "compression": {}, "format": "mds", "hashes": [],
                "raw_data": {{"basename": "{basename}", "bytes": {}, "hashes": {{}}}}, "samples": {},
                "size_limit": 67108864, "version": 2, "zip_data": {zip}}}"#,
            zstd.map_or("null".to_string(), |l| format!("\"zstd:{l}\"")),
            raw.len(),
            samples.len()
        ));
    }
    let index = format!(r#"{{"version": 2, "shards": [{}]}}"#, entries.join(","));
    std::fs::write(dir.join("index.json"), index).expect("write");
}

/// One MDS shard of columns `image`, `label` and `text` (see [`write_mds`]).
fn mds_shard(samples: &[(i64, Vec<u8>)]) -> Vec<u8> {
    let bodies: Vec<Vec<u8>> = samples
        .iter()
        .map(|(label, image)| {
            let text = format!("caption of {label}").into_bytes();
            let mut b = Vec::new();
            b.extend((image.len() as u32).to_le_bytes());
            b.extend((text.len() as u32).to_le_bytes());
            b.extend_from_slice(image);
            b.extend(label.to_le_bytes());
            b.extend(text);
            b
        })
        .collect();
    let config = br#"{"column_names": ["image", "label", "text"], "format": "mds"}"#;
    let n = samples.len() as u32;
    let mut offset = 4 + 4 * (n + 1) + config.len() as u32;
    let mut out = n.to_le_bytes().to_vec();
    out.extend(offset.to_le_bytes());
    for b in &bodies {
        offset += b.len() as u32;
        out.extend(offset.to_le_bytes());
    }
    out.extend_from_slice(config);
    bodies.iter().for_each(|b| out.extend_from_slice(b));
    out
}
