//! MosaicML Streaming MDS datasets as a pack source (DESIGN.md §2): an
//! `index.json` and the shards it lists, plain or zstd-compressed.
//!
//! `index.json` is `{"version": 2, "shards": [shard…]}`; each shard entry
//! names its columns (sorted by name), their encodings and fixed sizes
//! (`null` for variable), its compression (`null` or `"zstd:LEVEL"`), its
//! sample count and its files (`raw_data`, `zip_data`). A shard's bytes:
//!
//! ```text
//! u32 n | u32 offsets[n + 1] (absolute) | config JSON | samples
//! sample = u32 size per variable-size column (column order) | columns' bytes
//! ```
//!
//! all little-endian. `open` walks each shard once, in order, keeping per
//! sample the payload column's offset and length and reading the label
//! column; `read` is one positioned read. A zstd shard can only be read from
//! its start, so it is decompressed once, during `open`, and its payloads
//! are copied to a spool file (anonymous, in the directory the caller names)
//! that `read` reads — never one decompression per sample. Where the
//! uncompressed shard is present too (Streaming leaves it beside the zstd
//! one after a download), it is read in place. A dataset in object storage
//! (`s3://bucket/prefix`, [`crate::input`]: the prefix is listed once) is
//! read the same way, each shard once and in order by large ranged GETs,
//! its payloads spooled. Nothing read from the index
//! or a shard is trusted: counts, offsets and sizes are checked against each
//! other and the file before use.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::input::{Input, InputDir};
use super::listing::{Listing, ListingOptions};
use crate::listed::{Listed, ListedFormat};
use brand_format::error::{Error, IoContext, Result};

/// Largest label value read into memory (`str_int` is decimal text).
const MAX_LABEL_BYTES: u64 = 64;

/// Largest config block skipped by reading (a zstd shard): far above what
/// Streaming writes, small enough that a damaged offset cannot make the scan
/// read a whole shard as "config".
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Payload columns: stored bytes a sample can be as they are.
const PAYLOAD_ENCODINGS: [&str; 4] = ["bytes", "str", "jpeg", "png"];

/// What `--field` and `--label` name.
#[derive(Debug, Clone)]
pub struct MdsOptions {
    /// The payload column; None: the only bytes/str/jpeg/png column.
    pub field: Option<String>,
    /// The label column (int, int8…uint64, str_int); None: no label (-1).
    pub label: Option<String>,
    /// Where a zstd shard's payloads are spooled (an anonymous file, gone
    /// when the source is dropped or the process ends).
    pub spool_dir: PathBuf,
    /// How the requests for inputs in object storage are bounded and
    /// retried (the user's `stall_timeout` and `retries`).
    pub store: brand_store::GetPolicy,
    /// Where the listing is kept for a later run to reuse, and who hears
    /// of each input listed (`crate::listing`).
    pub listing: ListingOptions,
}

#[derive(Deserialize)]
struct IndexFile {
    version: u64,
    shards: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct ShardInfo {
    version: u64,
    column_names: Vec<String>,
    column_encodings: Vec<String>,
    column_sizes: Vec<Option<u64>>,
    compression: Option<String>,
    samples: u64,
    raw_data: FileInfo,
    zip_data: Option<FileInfo>,
}

#[derive(Deserialize)]
struct FileInfo {
    basename: String,
}

/// Bytes of a fixed-size integer encoding; None for the others.
fn int_width(encoding: &str) -> Option<u64> {
    Some(match encoding {
        "int8" | "uint8" => 1,
        "int16" | "uint16" => 2,
        "int32" | "uint32" => 4,
        "int" | "int64" | "uint64" => 8,
        _ => return None,
    })
}

/// A label column's value as brand's label.
fn decode_label(encoding: &str, bytes: &[u8]) -> std::result::Result<i64, String> {
    let fixed = |n: usize| -> std::result::Result<[u8; 8], String> {
        let mut out = [0u8; 8];
        match bytes.get(..n) {
            Some(b) if bytes.len() == n => {
                out[..n].copy_from_slice(b);
                Ok(out)
            }
            _ => Err(format!("{} bytes for a {encoding} label", bytes.len())),
        }
    };
    let sign_extend = |raw: [u8; 8], n: usize| -> i64 {
        let shift = 64 - 8 * n as u32;
        (i64::from_le_bytes(raw) << shift) >> shift
    };
    Ok(match encoding {
        "int8" => sign_extend(fixed(1)?, 1),
        "int16" => sign_extend(fixed(2)?, 2),
        "int32" => sign_extend(fixed(4)?, 4),
        "int" | "int64" => i64::from_le_bytes(fixed(8)?),
        "uint8" | "uint16" | "uint32" => {
            let n = int_width(encoding).unwrap_or(8) as usize;
            i64::from_le_bytes(fixed(n)?)
        }
        "uint64" => {
            let v = u64::from_le_bytes(fixed(8)?);
            i64::try_from(v).map_err(|_| format!("label {v} is above brand's largest label ({})", i64::MAX))?
        }
        "str_int" => {
            let text = std::str::from_utf8(bytes).map_err(|_| "a str_int label that is not UTF-8".to_string())?;
            text.trim()
                .parse::<i64>()
                .map_err(|_| format!("str_int label {text:?} is not an integer brand can hold (i64)"))?
        }
        other => return Err(format!("a label column of encoding {other}")),
    })
}

/// `--from mds`'s samples ([`Listed`]).
#[derive(Debug)]
pub struct Mds;

impl ListedFormat for Mds {
    const KIND: &'static str = "mds";
    const NAME: &'static str = "MDS";
    const NOUN: &'static str = "sample";
}

/// The samples of an MDS dataset, in shard order. Per sample: its key
/// (`shard basename:index`) in an arena with its label, its payload's offset
/// (in the shard, or in the spool for a compressed one) and length.
pub type MdsSource = Listed<Mds>;

impl MdsSource {
    /// Lists the samples of the MDS dataset at `input`: a directory holding
    /// `index.json`, or the `index.json` itself; or their URLs.
    pub fn open(input: &Path, options: &MdsOptions) -> Result<Self> {
        let (index_file, root) = super::input::file_in_dir(input, "index.json", &options.store)?;
        let index_path = index_file.path().to_path_buf();
        let text = index_file.read_all()?;
        let malformed = |what: String| Error::input(&index_path, "index.json", what);
        let index: IndexFile = serde_json::from_slice(&text)
            .map_err(|e| malformed(format!("not an MDS index (malformed JSON or missing fields): {e}")))?;
        if index.version != 2 {
            return Err(malformed(format!(
                "index version {} (brand reads version 2)",
                index.version
            )));
        }
        let what = format!(
            "mds field {:?} label {:?} index {}",
            options.field,
            options.label,
            index_file.identity()?
        );
        let mut scan = Scan {
            listing: Listing::new(&options.spool_dir, &options.listing, index.shards.len(), &what)?,
        };
        let mut field: Option<String> = options.field.clone();
        for (k, value) in index.shards.iter().enumerate() {
            let at = || format!("index.json shard {k}");
            let format = value.get("format").and_then(serde_json::Value::as_str).unwrap_or("");
            if format != "mds" {
                return Err(Error::input(
                    &index_path,
                    at(),
                    format!("a shard of format {format:?}: brand reads MDS shards (format \"mds\") only"),
                ));
            }
            let info = ShardInfo::deserialize(value)
                .map_err(|e| Error::input(&index_path, at(), format!("malformed shard entry: {e}")))?;
            let layout =
                Layout::of(&info, &mut field, options).map_err(|what| Error::input(&index_path, at(), what))?;
            let (file, compressed) = shard_file(&root, &info).map_err(|what| Error::input(&index_path, at(), what))?;
            if scan.listing.reuse(&file)?.is_some() {
                continue;
            }
            scan.shard(&file, compressed, &info, &layout)?;
            let spooled = compressed || file.object().is_some();
            scan.listing.input_done(&file, spooled, serde_json::Value::Null)?;
        }
        if scan.listing.len() == 0 {
            return Err(Error::input(
                &index_path,
                format!("{} shard(s)", index.shards.len()),
                "no samples in the MDS dataset",
            ));
        }
        scan.listing.finish(Vec::new())
    }
}

/// The file to read for a shard, and whether it is zstd-compressed: the
/// raw shard if present, else the compressed one.
fn shard_file(root: &InputDir, info: &ShardInfo) -> std::result::Result<(Input, bool), String> {
    let compressed = match info.compression.as_deref() {
        None => false,
        Some(c) if c == "zstd" || c.starts_with("zstd:") => true,
        Some(c) => {
            return Err(format!(
                "compression {c:?}: brand reads plain and zstd MDS shards (recompress with zstd, or decompress)"
            ));
        }
    };
    let raw_name = &info.raw_data.basename;
    if let Some(raw) = root.file(raw_name)? {
        return Ok((raw, false));
    }
    let raw = root.show(raw_name)?;
    match (&info.zip_data, compressed) {
        (Some(zip), true) => match root.file(&zip.basename)? {
            Some(file) => Ok((file, true)),
            None => Err(format!(
                "missing shard file: neither {} nor {} exists",
                raw.display(),
                root.show(&zip.basename)?.display()
            )),
        },
        (None, true) => Err(format!(
            "missing shard file {} (and the compressed shard has no zip_data entry)",
            raw.display()
        )),
        (_, false) => Err(format!("missing shard file {}", raw.display())),
    }
}

/// Where the payload and label are in a shard's samples.
struct Layout {
    /// Fixed size per column; None for variable (a u32 size in the sample).
    sizes: Vec<Option<u64>>,
    variable: usize,
    payload: usize,
    label: Option<(usize, String)>,
    /// The key prefix: the raw shard's basename.
    basename: String,
}

impl Layout {
    /// Checks the shard's columns and finds the payload (`field`, settled on
    /// the first shard when not given) and label columns.
    fn of(info: &ShardInfo, field: &mut Option<String>, options: &MdsOptions) -> std::result::Result<Self, String> {
        if info.version != 2 {
            return Err(format!("shard version {} (brand reads version 2)", info.version));
        }
        let n = info.column_names.len();
        if n == 0 || info.column_encodings.len() != n || info.column_sizes.len() != n {
            return Err(format!(
                "{} column names, {} encodings and {} sizes (one each per column needed)",
                n,
                info.column_encodings.len(),
                info.column_sizes.len()
            ));
        }
        let columns = || {
            info.column_names
                .iter()
                .zip(&info.column_encodings)
                .map(|(n, e)| format!("{n} ({e})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let name = match field {
            Some(f) => f.clone(),
            None => {
                let candidates: Vec<&String> = info
                    .column_names
                    .iter()
                    .zip(&info.column_encodings)
                    .filter(|(_, e)| PAYLOAD_ENCODINGS.contains(&e.as_str()))
                    .map(|(n, _)| n)
                    .collect();
                match candidates[..] {
                    [one] => one.clone(),
                    [] => {
                        return Err(format!(
                            "no bytes, str, jpeg or png column to pack (columns: {})",
                            columns()
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "several columns could be the payload: choose one with --field (columns: {})",
                            columns()
                        ));
                    }
                }
            }
        };
        let find = |name: &str| info.column_names.iter().position(|c| c == name);
        let payload = find(&name).ok_or_else(|| format!("no column {name:?} (columns: {})", columns()))?;
        let encoding = &info.column_encodings[payload];
        if !PAYLOAD_ENCODINGS.contains(&encoding.as_str()) || info.column_sizes[payload].is_some() {
            return Err(format!(
                "column {name:?} has encoding {encoding}: brand packs a column's stored bytes as they are, \
                 so the payload must be a bytes, str, jpeg or png column (columns: {})",
                columns()
            ));
        }
        *field = Some(name);
        let label = match options.label.as_deref() {
            None | Some("none") => None,
            Some(label) => {
                let column =
                    find(label).ok_or_else(|| format!("no label column {label:?} (columns: {})", columns()))?;
                let encoding = &info.column_encodings[column];
                let size = info.column_sizes[column];
                let fits = match (int_width(encoding), encoding.as_str()) {
                    (Some(width), _) => size == Some(width),
                    (None, "str_int") => size.is_none(),
                    _ => {
                        return Err(format!(
                            "label column {label:?} has encoding {encoding}: labels are int, int8…uint64 or str_int"
                        ));
                    }
                };
                if !fits {
                    return Err(format!(
                        "label column {label:?} of encoding {encoding} has size {size:?}, which that encoding does not have"
                    ));
                }
                Some((column, encoding.clone()))
            }
        };
        let variable = info.column_sizes.iter().filter(|s| s.is_none()).count();
        Ok(Layout {
            sizes: info.column_sizes.clone(),
            variable,
            payload,
            label,
            basename: info.raw_data.basename.clone(),
        })
    }
}

/// A shard's bytes in order: a file (skips seek), or a stream that can only
/// be read on (zstd, an object in a store: skips read). Tracks the position
/// in the (decompressed) shard.
struct Stream {
    reader: Reader,
    pos: u64,
}

enum Reader {
    Plain(BufReader<File>),
    InOrder(Box<dyn Read + Send>),
}

impl Stream {
    /// Fills `buf`; false if the stream ended first.
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let result = match &mut self.reader {
            Reader::Plain(r) => r.read_exact(buf),
            Reader::InOrder(r) => r.read_exact(buf),
        };
        match result {
            Ok(()) => {
                self.pos += buf.len() as u64;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Skips `n` bytes; false if the stream ended first (a plain file's end
    /// is found by the next read).
    fn skip(&mut self, n: u64) -> io::Result<bool> {
        let complete = match &mut self.reader {
            Reader::Plain(r) => {
                let n = i64::try_from(n).map_err(|_| io::Error::other("skip beyond 2^63 bytes"))?;
                r.seek_relative(n)?;
                true
            }
            Reader::InOrder(r) => io::copy(&mut r.take(n), &mut io::sink())? == n,
        };
        self.pos += n;
        Ok(complete)
    }

    /// Copies `n` bytes to `to`; false if the stream ended first.
    fn copy_to(&mut self, n: u64, to: &mut impl Write) -> io::Result<bool> {
        let copied = match &mut self.reader {
            Reader::Plain(r) => io::copy(&mut r.take(n), to)?,
            Reader::InOrder(r) => io::copy(&mut r.take(n), to)?,
        };
        self.pos += copied;
        Ok(copied == n)
    }
}

/// State of the scan in `open`: the listing so far.
struct Scan {
    listing: Listing,
}

impl Scan {
    /// Lists one shard's samples.
    fn shard(&mut self, input: &Input, compressed: bool, info: &ShardInfo, layout: &Layout) -> Result<()> {
        let path = input.path();
        // Read in order (compressed, or an object): payloads are spooled.
        let (reader, file_len, spool) = match input.object() {
            Some(object) => {
                let bytes: Box<dyn Read + Send> = Box::new(BufReader::with_capacity(1 << 16, object.reader()));
                let reader = if compressed {
                    Reader::InOrder(Box::new(zstd::stream::read::Decoder::new(bytes).at(path)?))
                } else {
                    Reader::InOrder(bytes)
                };
                (reader, object.size(), true)
            }
            None => {
                let file = File::open(path).at(path)?;
                let file_len = file.metadata().at(path)?.len();
                let reader = if compressed {
                    Reader::InOrder(Box::new(zstd::stream::read::Decoder::new(file).at(path)?))
                } else {
                    Reader::Plain(BufReader::with_capacity(1 << 16, file))
                };
                (reader, file_len, compressed)
            }
        };
        let mut stream = Stream { reader, pos: 0 };
        // Known up front for a plain shard only.
        let shard_len = (!compressed).then_some(file_len);
        let of_shard = if compressed { " of the decompressed shard" } else { "" };
        let error = |position: String, what: String| Error::input(path, format!("{position}{of_shard}"), what);
        let io_error = |pos: u64, e: io::Error| error(format!("byte {pos}"), format!("reading: {e}"));
        let ended = |pos: u64, what: &str| {
            error(
                format!("byte {pos}"),
                format!("truncated: the shard ends inside {what}"),
            )
        };

        let mut word = [0u8; 4];
        if !stream.read_exact(&mut word).map_err(|e| io_error(0, e))? {
            return Err(ended(0, "its sample count"));
        }
        let n = u64::from(u32::from_le_bytes(word));
        if n != info.samples {
            return Err(error(
                "byte 0".into(),
                format!("the shard holds {n} samples, index.json says {}", info.samples),
            ));
        }
        let table_end = 4 + 4 * (n + 1);
        if let Some(len) = shard_len
            && table_end > len
        {
            return Err(error(
                "byte 4".into(),
                format!(
                    "the offset table of {} entries ends at byte {table_end}, past the end of the shard ({len} bytes)",
                    n + 1
                ),
            ));
        }
        // Read in pieces so a damaged count in a compressed shard cannot
        // allocate more than the stream really holds.
        let mut offsets: Vec<u64> = Vec::new();
        let mut piece = vec![0u8; 4 * 16384];
        let mut left = n + 1;
        while left > 0 {
            let take = left.min(16384) as usize;
            let buf = &mut piece[..4 * take];
            let at = stream.pos;
            if !stream.read_exact(buf).map_err(|e| io_error(at, e))? {
                return Err(ended(at, "its offset table"));
            }
            offsets.extend(
                buf.chunks_exact(4)
                    .map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))),
            );
            left -= take as u64;
        }
        let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
            return Err(error("byte 4".into(), "an empty offset table".into()));
        };
        if first < table_end {
            return Err(error(
                "byte 4".into(),
                format!(
                    "sample 0 starts at byte {first}, inside the shard's offset table (which ends at byte {table_end})"
                ),
            ));
        }
        for (i, pair) in offsets.windows(2).enumerate() {
            if pair[1] <= pair[0] {
                return Err(error(
                    format!("offset table entry {}", i + 1),
                    format!(
                        "offsets not increasing: sample {i} starts at byte {}, the next at byte {}",
                        pair[0], pair[1]
                    ),
                ));
            }
        }
        if let Some(len) = shard_len
            && last > len
        {
            return Err(error(
                format!("offset table entry {n}"),
                format!("the last sample ends at byte {last}, past the end of the shard ({len} bytes)"),
            ));
        }
        // The config block (JSON) between the table and the first sample.
        let config = first - table_end;
        if compressed && config > MAX_CONFIG_BYTES {
            return Err(error(
                format!("byte {table_end}"),
                format!("{config} bytes of config before the first sample (more than the {MAX_CONFIG_BYTES} expected)"),
            ));
        }
        if !stream.skip(config).map_err(|e| io_error(table_end, e))? {
            return Err(ended(table_end, "its config"));
        }

        let mut sizes_buf = vec![0u8; 4 * layout.variable];
        let mut column_sizes = vec![0u64; layout.sizes.len()];
        for (i, pair) in offsets.windows(2).enumerate() {
            let (start, end) = (pair[0], pair[1]);
            let sample_at = || format!("sample {i} at byte {start}");
            if !stream.read_exact(&mut sizes_buf).map_err(|e| io_error(start, e))? {
                return Err(ended(start, &format!("sample {i}")));
            }
            let mut var = sizes_buf
                .chunks_exact(4)
                .map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
            let mut total = 4 * layout.variable as u64;
            for (c, fixed) in layout.sizes.iter().enumerate() {
                let size = match fixed {
                    Some(s) => *s,
                    None => var.next().unwrap_or(0),
                };
                column_sizes[c] = size;
                total = total.saturating_add(size);
            }
            if total != end - start {
                return Err(error(
                    sample_at(),
                    format!(
                        "sample sizes do not match: its columns hold {total} bytes, the offset table gives it {}",
                        end - start
                    ),
                ));
            }
            let mut label = -1;
            let mut payload_at = (0, 0);
            for (c, &size) in column_sizes.iter().enumerate() {
                let at = stream.pos;
                if c == layout.payload {
                    let offset = if spool {
                        self.spool_payload(&mut stream, size, path, of_shard, &sample_at)?
                    } else {
                        if !stream.skip(size).map_err(|e| io_error(at, e))? {
                            return Err(ended(at, &sample_at()));
                        }
                        at
                    };
                    payload_at = (offset, size);
                } else if let Some((_, encoding)) = layout.label.as_ref().filter(|(l, _)| *l == c) {
                    if size > MAX_LABEL_BYTES {
                        return Err(error(sample_at(), format!("a {size}-byte {encoding} label")));
                    }
                    let mut bytes = vec![0u8; size as usize];
                    if !stream.read_exact(&mut bytes).map_err(|e| io_error(at, e))? {
                        return Err(ended(at, &sample_at()));
                    }
                    label = decode_label(encoding, &bytes).map_err(|what| error(sample_at(), what))?;
                } else if !stream.skip(size).map_err(|e| io_error(at, e))? {
                    return Err(ended(at, &sample_at()));
                }
            }
            let key = format!("{}:{i}", layout.basename);
            self.listing.push(key.as_bytes(), label, payload_at.0, payload_at.1);
        }
        if compressed {
            // The zstd frame must hold the whole shard: a shard cut after
            // its last sample's bytes is still damaged.
            let mut probe = [0u8; 1];
            let at = stream.pos;
            if let Err(e) = stream.read_exact(&mut probe) {
                return Err(io_error(at, e));
            }
        } else if !spool {
            // Samples read by seeking: a file shorter than `last` shows up
            // only on a read, so check it is there.
            let mut probe = [0u8; 1];
            if last > 0 {
                let file = File::open(path).at(path)?;
                file.read_exact_at(&mut probe, last - 1)
                    .map_err(|_| ended(last, "its last sample (the file changed while it was read)"))?;
            }
        }
        Ok(())
    }

    /// Copies a payload of a compressed shard to the spool; returns its
    /// offset there.
    fn spool_payload(
        &mut self,
        stream: &mut Stream,
        size: u64,
        path: &Path,
        of_shard: &str,
        sample_at: &dyn Fn() -> String,
    ) -> Result<u64> {
        let (spool, offset) = self.listing.spool()?;
        let at = stream.pos;
        match stream.copy_to(size, spool) {
            Ok(true) => {
                self.listing.spooled(size);
                Ok(offset)
            }
            Ok(false) => Err(Error::input(
                path,
                format!("byte {at}{of_shard}"),
                format!("truncated: the shard ends inside {}", sample_at()),
            )),
            Err(e) => Err(Error::input(
                path,
                format!("{} (byte {at}{of_shard})", sample_at()),
                format!("copying to the spool in {}: {e}", self.listing.spool_place().display()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_decode_every_int_encoding_and_refuse_what_i64_cannot_hold() {
        assert_eq!(decode_label("int8", &[0xff]), Ok(-1));
        assert_eq!(decode_label("uint8", &[0xff]), Ok(255));
        assert_eq!(decode_label("int16", &(-300i16).to_le_bytes()), Ok(-300));
        assert_eq!(decode_label("uint32", &u32::MAX.to_le_bytes()), Ok(i64::from(u32::MAX)));
        assert_eq!(decode_label("int32", &(-5i32).to_le_bytes()), Ok(-5));
        assert_eq!(decode_label("int", &i64::MIN.to_le_bytes()), Ok(i64::MIN));
        assert_eq!(decode_label("uint64", &(1u64 << 62).to_le_bytes()), Ok(1 << 62));
        assert!(
            decode_label("uint64", &u64::MAX.to_le_bytes())
                .unwrap_err()
                .contains("above")
        );
        assert_eq!(decode_label("str_int", b" 42"), Ok(42));
        assert!(decode_label("str_int", b"99999999999999999999").is_err());
        assert!(decode_label("int32", &[1, 2]).is_err());
    }

    #[test]
    fn shard_names_stay_inside_the_dataset() {
        let root = InputDir::Local(PathBuf::from("/data/ds"));
        assert_eq!(
            root.show("a/shard.00000.mds").unwrap(),
            Path::new("/data/ds/a/shard.00000.mds")
        );
        assert!(root.show("../x.mds").is_err());
        assert!(root.show("/etc/passwd").is_err());
        assert!(root.show("").is_err());
    }
}
