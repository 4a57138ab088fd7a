//! Tar archives as a pack source: WebDataset shards, plain tars, tars of
//! tars (ImageNet's `ILSVRC2012_img_train.tar`) and gzipped tars
//! (DESIGN.md §2).
//!
//! `open` walks each archive's headers once and lists its samples; `read`
//! fetches one sample's payload member with a positioned read at its offset.
//! Members are grouped into samples as WebDataset groups them: the key is the
//! member's path up to the first dot of its file name, the extension the rest
//! (lower-cased); adjacent members with the same key form one sample. A
//! member whose name ends in `.tar` is an archive of its own, walked in place
//! (never extracted); its samples' keys are `inner.tar/key`.
//!
//! A gzipped tar can only be read from its start, so it is decompressed once,
//! during `open`, and the members that may be payloads are copied to a spool
//! file (anonymous, in the directory the caller names) that `read` reads.
//! An archive in object storage (`s3://…`, [`crate::input`]) is the same:
//! read once, in order, by large ranged GETs, its payloads spooled.
//!
//! Header layout (512-byte blocks, numbers octal ASCII or GNU base-256):
//!
//! ```text
//! name[100]@0 mode[8]@100 uid[8]@108 gid[8]@116 size[12]@124 mtime[12]@136
//! chksum[8]@148 typeflag[1]@156 linkname[100]@157 magic[6]@257 version[2]@263
//! uname[32]@265 gname[32]@297 devmajor[8]@329 devminor[8]@337 prefix[155]@345
//! ```
//!
//! The checksum is the byte sum of the header with `chksum` read as spaces.
//! A PAX `x` member's records (`"<len> key=value\n"`) and a GNU `L` member's
//! data (the name) apply to the next header. Data is padded to 512 bytes;
//! two zero blocks end the archive. An archive that simply ends after a
//! member's padding, without them, is accepted with a warning, as GNU tar
//! accepts it. Nothing read from an archive is trusted: every size and
//! offset is checked arithmetic, checked against the file before use.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use super::input::Input;
use super::listing::{Listing, ListingOptions};
use crate::listed::{Listed, ListedFormat};
use brand_format::error::{Error, IoContext, Result};

pub const BLOCK: u64 = 512;

/// Largest PAX header, GNU long name, `.cls` or `.json` member read into
/// memory: a damaged size field must not allocate the file's size.
const MAX_METADATA_BYTES: u64 = 1 << 20;

/// Deepest nesting of tars in tars walked (ImageNet needs one level).
const MAX_DEPTH: usize = 4;

/// What labels the samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TarLabel {
    /// No label: -1.
    None,
    /// The `.cls` member's text, an integer.
    Cls,
    /// The integer field FIELD of the `.json` member.
    Json(String),
    /// The inner tar's name without `.tar`, or the member's parent directory,
    /// numbered in sorted order of the distinct names (as `--from dir`
    /// numbers class directories).
    Dir,
}

impl TarLabel {
    /// `cls`, `json:FIELD`, `dir` or `none`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "none" => Ok(TarLabel::None),
            "cls" => Ok(TarLabel::Cls),
            "dir" => Ok(TarLabel::Dir),
            _ => match text.strip_prefix("json:") {
                Some(field) if !field.is_empty() => Ok(TarLabel::Json(field.to_string())),
                _ => Err(Error::config(format!(
                    "--label {text:?}: expected cls, json:FIELD, dir or none"
                ))),
            },
        }
    }

    /// The extension of the member the label is read from.
    fn extension(&self) -> Option<&'static [u8]> {
        match self {
            TarLabel::Cls => Some(b"cls"),
            TarLabel::Json(_) => Some(b"json"),
            TarLabel::None | TarLabel::Dir => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TarOptions {
    /// Payload extensions in order of preference (lower case, no dot); the
    /// first one a sample has is its payload. Empty: each sample must have
    /// exactly one member, which is the payload.
    pub fields: Vec<String>,
    pub label: TarLabel,
    /// Where a gzipped tar's payloads are spooled (an anonymous file, gone
    /// when the source is dropped or the process ends).
    pub spool_dir: PathBuf,
    /// How the requests for inputs in object storage are bounded and
    /// retried (the user's `stall_timeout` and `retries`).
    pub store: brand_store::GetPolicy,
    /// Where the listing is kept for a later run to reuse, and who hears
    /// of each input listed (`crate::listing`).
    pub listing: ListingOptions,
}

impl TarOptions {
    /// `png;jpg;webp` (also `,`-separated; case and leading dots ignored).
    pub fn parse_fields(text: &str) -> Result<Vec<String>> {
        let fields: Vec<String> = text
            .split([';', ','])
            .map(|f| f.trim().trim_start_matches('.').to_ascii_lowercase())
            .filter(|f| !f.is_empty())
            .collect();
        if fields.is_empty() {
            return Err(Error::config(format!("--field {text:?}: no extension given")));
        }
        Ok(fields)
    }
}

// ---- headers ----

/// What one 512-byte header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `prefix/name` (ustar) or `name`, up to its NUL.
    pub name: Vec<u8>,
    pub size: u64,
    pub typeflag: u8,
}

/// Parses a header block; `Ok(None)` for a zero block (end of archive).
/// Errors say what is wrong with the block.
pub fn parse_header(block: &[u8; BLOCK as usize]) -> std::result::Result<Option<Header>, String> {
    if block.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let recorded = octal(&block[148..156]).map_err(|e| format!("checksum field: {e} (not a tar header)"))?;
    // Unsigned sum as POSIX says; some old writers summed signed bytes.
    let spaces = 8 * u64::from(b' ');
    let unsigned: u64 = block.iter().map(|&b| u64::from(b)).sum::<u64>()
        - block[148..156].iter().map(|&b| u64::from(b)).sum::<u64>()
        + spaces;
    let signed: i64 = block.iter().map(|&b| i64::from(b as i8)).sum::<i64>()
        - block[148..156].iter().map(|&b| i64::from(b as i8)).sum::<i64>()
        + spaces as i64;
    if recorded != unsigned && i64::try_from(recorded).ok() != Some(signed) {
        return Err(format!(
            "bad header checksum: recorded {recorded}, computed {unsigned} (corrupt, or not a tar file)"
        ));
    }
    let size = number(&block[124..136]).map_err(|e| format!("size field: {e}"))?;
    let mut name = until_nul(&block[0..100]).to_vec();
    // POSIX ustar only: GNU's magic (`ustar  \0`) keeps other fields there.
    if &block[257..263] == b"ustar\0" {
        let prefix = until_nul(&block[345..500]);
        if !prefix.is_empty() {
            let mut full = prefix.to_vec();
            full.push(b'/');
            full.extend_from_slice(&name);
            name = full;
        }
    }
    Ok(Some(Header {
        name,
        size,
        typeflag: block[156],
    }))
}

fn until_nul(field: &[u8]) -> &[u8] {
    field.iter().position(|&b| b == 0).map_or(field, |end| &field[..end])
}

/// A numeric field: octal ASCII (leading spaces, ended by NUL or space), or
/// GNU base-256 when the high bit of its first byte is set.
fn number(field: &[u8]) -> std::result::Result<u64, String> {
    match field.first() {
        Some(&first) if first & 0x80 != 0 => {
            if first & 0x40 != 0 {
                return Err("negative base-256 number".into());
            }
            let mut value = u64::from(first & 0x3f);
            for &b in &field[1..] {
                value = value
                    .checked_mul(256)
                    .and_then(|v| v.checked_add(u64::from(b)))
                    .ok_or("base-256 number above 2^64")?;
            }
            Ok(value)
        }
        _ => octal(field),
    }
}

fn octal(field: &[u8]) -> std::result::Result<u64, String> {
    let digits = field.iter().skip_while(|&&b| b == b' ');
    let mut value: u64 = 0;
    let mut ended = false;
    for &b in digits {
        match b {
            b'0'..=b'7' if !ended => {
                value = value
                    .checked_mul(8)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or("octal number above 2^64")?;
            }
            0 | b' ' => ended = true,
            _ if ended => {}
            _ => return Err(format!("{:?} is not an octal number", String::from_utf8_lossy(field))),
        }
    }
    Ok(value)
}

/// What a PAX extended header overrides in the next header.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pax {
    pub path: Option<Vec<u8>>,
    pub size: Option<u64>,
}

/// Parses PAX records `"<len> key=value\n"`, `len` counting the whole
/// record; keys other than `path` and `size` are ignored.
pub fn parse_pax(mut data: &[u8]) -> std::result::Result<Pax, String> {
    let mut pax = Pax::default();
    // Writers may pad the data with NULs.
    while !data.is_empty() && data[0] != 0 {
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or("PAX record without a length")?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|l| l.parse().ok())
            .ok_or("PAX record length is not a number")?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(format!("PAX record of {len} bytes does not fit its data"));
        }
        let record = &data[space + 1..len - 1];
        let eq = record.iter().position(|&b| b == b'=').ok_or("PAX record without '='")?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pax.path = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("PAX size {:?} is not a number", String::from_utf8_lossy(value)))?;
                pax.size = Some(size);
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok(pax)
}

/// A member's key and extension (lower-cased), WebDataset's way: the key is
/// the path up to the first dot of the file name; no dot, no extension.
pub fn split_name(name: &[u8]) -> (&[u8], Vec<u8>) {
    let file_start = name.iter().rposition(|&b| b == b'/').map_or(0, |slash| slash + 1);
    match name[file_start..].iter().position(|&b| b == b'.') {
        Some(dot) => (
            &name[..file_start + dot],
            name[file_start + dot + 1..].to_ascii_lowercase(),
        ),
        None => (name, Vec::new()),
    }
}

/// WebDataset's metadata members (`__[^/]*__($|/)` in the path) are not
/// sample members.
fn is_metadata(name: &[u8]) -> bool {
    name.split(|&b| b == b'/')
        .any(|part| part.len() >= 4 && part.starts_with(b"__") && part.ends_with(b"__"))
}

fn ends_with_tar(name: &[u8]) -> bool {
    name.len() > 4 && name[name.len() - 4..].eq_ignore_ascii_case(b".tar")
}

// ---- the source ----

/// `--from tar`'s samples ([`Listed`]).
#[derive(Debug)]
pub struct Tar;

impl ListedFormat for Tar {
    const KIND: &'static str = "tar";
    const NAME: &'static str = "tar";
    const NOUN: &'static str = "sample";
}

/// Samples of one or more tar archives, in file order and then archive
/// order. Per sample: its key in an arena with its label, its payload's
/// offset (8 bytes; in the archive, or in the spool for one read in order) and
/// length (as narrow as the lengths allow).
pub type TarSource = Listed<Tar>;

impl TarSource {
    /// Lists the samples of `paths`: tar or gzipped tar files, or
    /// directories whose `.tar`, `.tar.gz` and `.tgz` files are taken in
    /// name order; URLs of such objects, or of prefixes listed the same way.
    pub fn open(paths: &[PathBuf], options: &TarOptions) -> Result<Self> {
        let is_archive = |name: &[u8]| {
            [&b".tar"[..], b".tar.gz", b".tgz"]
                .iter()
                .any(|ext| name.ends_with(ext))
        };
        let inputs = super::input::expand(paths, &options.store, is_archive, ".tar, .tar.gz or .tgz", "")?;
        let Some(first_input) = paths.first() else {
            return Err(Error::config("no tar input given"));
        };
        let what = format!("tar fields {:?} label {:?}", options.fields, options.label);
        let mut scan = Scan {
            options,
            listing: Listing::new(&options.spool_dir, &options.listing, inputs.len(), &what)?,
            dir_names: HashMap::new(),
        };
        let count = inputs.len();
        for input in inputs {
            if let Some(state) = scan.listing.reuse(&input)? {
                scan.restore_dir_names(&input, state)?;
                continue;
            }
            let names_before = scan.dir_names.len();
            let spooled = scan.file(&input)?;
            let state = scan.dir_names_since(names_before);
            scan.listing.input_done(&input, spooled, state)?;
        }
        if scan.listing.len() == 0 {
            return Err(Error::input(
                first_input,
                format!("{count} input file(s)"),
                "no samples in the tar input",
            ));
        }
        let label_names = scan.number_dir_labels();
        scan.listing.finish(label_names)
    }
}

/// An archive's bytes in order: a file (skips seek), or a stream that can
/// only be read on (a gzip stream, an object in a store: skips read).
enum Stream {
    Plain(BufReader<File>),
    InOrder(Box<dyn Read + Send>),
}

impl Stream {
    /// Fills `buf` unless the stream ends first; returns the bytes read.
    fn read_full(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let n = match self {
                Stream::Plain(r) => r.read(&mut buf[filled..]),
                Stream::InOrder(r) => r.read(&mut buf[filled..]),
            };
            match n {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }

    /// Skips `n` bytes; false if the stream ended first.
    fn skip(&mut self, n: u64) -> io::Result<bool> {
        match self {
            Stream::Plain(r) => {
                // The scan checked the skip stays inside the file.
                let n = i64::try_from(n).map_err(|_| io::Error::other("skip beyond 2^63 bytes"))?;
                r.seek_relative(n)?;
                Ok(true)
            }
            Stream::InOrder(r) => Ok(io::copy(&mut r.take(n), &mut io::sink())? == n),
        }
    }

    /// Copies `n` bytes to `to`; false if the stream ended first.
    fn copy_to(&mut self, n: u64, to: &mut impl Write) -> io::Result<bool> {
        let copied = match self {
            Stream::Plain(r) => io::copy(&mut r.take(n), to)?,
            Stream::InOrder(r) => io::copy(&mut r.take(n), to)?,
        };
        Ok(copied == n)
    }
}

/// One archive being walked: the outer file or a tar inside it.
struct Archive<'a> {
    path: &'a Path,
    gzip: bool,
    /// Read in order (gzipped, or an object): payloads go to the spool.
    spool: bool,
    /// Key prefix of its members: `` or `inner.tar/`.
    prefix: Vec<u8>,
    /// The inner tar's name without `.tar`, for `--label dir`.
    tar_name: Option<Vec<u8>>,
    /// Where it ends in the stream, when known (not for a gzip stream).
    end: Option<u64>,
    depth: usize,
}

impl Archive<'_> {
    fn error(&self, position: String, what: impl Into<String>) -> Error {
        let position = if self.gzip {
            format!("{position} of the decompressed tar")
        } else {
            position
        };
        Error::input(self.path, position, what)
    }
}

/// One member of the sample being grouped.
struct Member {
    extension: Vec<u8>,
    /// Where its data is: in the archive, or in the spool for one read in order.
    offset: u64,
    size: u64,
    /// Where its header is in the archive, for errors.
    header: u64,
}

/// The sample being grouped: adjacent members with one key.
#[derive(Default)]
struct Group {
    key: Vec<u8>,
    members: Vec<Member>,
    /// The label member's text, when the label is read from one.
    label_text: Option<Vec<u8>>,
    /// The `--label dir` name.
    dir_name: Option<Vec<u8>>,
}

/// State of the scan in `open`: the listing so far.
struct Scan<'a> {
    options: &'a TarOptions,
    listing: Listing,
    /// `--label dir`: provisional label (order of first appearance) by name.
    dir_names: HashMap<Vec<u8>, i64>,
}

impl Scan<'_> {
    /// Lists one archive's samples; returns whether its payloads were
    /// spooled (gzipped, or an object).
    fn file(&mut self, input: &Input) -> Result<bool> {
        let path = input.path();
        if let Some(object) = input.object() {
            let reader = object.reader();
            let mut buffered = BufReader::with_capacity(1 << 16, reader);
            let gzip = io::BufRead::fill_buf(&mut buffered)
                .map_err(|e| Error::input(path, "byte 0", format!("reading: {e}")))?
                .starts_with(&[0x1f, 0x8b]);
            let mut stream = if gzip {
                Stream::InOrder(Box::new(flate2::read::MultiGzDecoder::new(buffered)))
            } else {
                Stream::InOrder(Box::new(buffered))
            };
            let archive = Archive {
                path,
                gzip,
                spool: true,
                prefix: Vec::new(),
                tar_name: None,
                end: (!gzip).then_some(object.size()),
                depth: 0,
            };
            self.walk(&mut stream, &archive, 0)?;
            return Ok(true);
        }
        let mut file = File::open(path).at(path)?;
        let file_len = file.metadata().at(path)?.len();
        let mut magic = [0u8; 2];
        let gzip = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
        let file = File::open(path).at(path)?;
        let mut stream = if gzip {
            Stream::InOrder(Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file))))
        } else {
            // A page: enough to take several small members (`.cls`, `.json`)
            // in one read, small enough that the header of a large member
            // does not pull in much of its data, which the scan skips.
            Stream::Plain(BufReader::with_capacity(4096, file))
        };
        let archive = Archive {
            path,
            gzip,
            spool: gzip,
            prefix: Vec::new(),
            tar_name: None,
            end: (!gzip).then_some(file_len),
            depth: 0,
        };
        self.walk(&mut stream, &archive, 0)?;
        Ok(gzip)
    }

    /// Walks the archive starting at `start` in `stream` to its end of
    /// archive (or, for an inner tar, to its end); returns where it stopped.
    fn walk(&mut self, stream: &mut Stream, archive: &Archive<'_>, start: u64) -> Result<u64> {
        let mut pos = start;
        let mut group = Group::default();
        let mut long_name: Option<Vec<u8>> = None;
        let mut pax = Pax::default();
        let mut block = [0u8; BLOCK as usize];
        let at = |pos: u64| format!("byte {pos}");
        loop {
            if archive.end == Some(pos) {
                tracing::warn!(
                    "{}: {}: the archive{} ends without its end-of-archive blocks (accepted, as GNU tar does)",
                    archive.path.display(),
                    at(pos),
                    inner_name(archive)
                );
                break;
            }
            if archive.end.is_some_and(|end| end - pos < BLOCK) {
                return Err(archive.error(
                    at(pos),
                    format!(
                        "truncated: the archive ends inside a 512-byte header{}",
                        inner_name(archive)
                    ),
                ));
            }
            let read = stream
                .read_full(&mut block)
                .map_err(|e| archive.error(at(pos), format!("reading a header: {e}")))?;
            if read == 0 && archive.end.is_none() {
                tracing::warn!(
                    "{}: {}: the archive ends without its end-of-archive blocks (accepted, as GNU tar does)",
                    archive.path.display(),
                    at(pos)
                );
                break;
            }
            if read < block.len() {
                return Err(archive.error(
                    at(pos),
                    format!(
                        "truncated: the archive ends inside a 512-byte header{}",
                        inner_name(archive)
                    ),
                ));
            }
            let header_pos = pos;
            pos += BLOCK;
            let header = parse_header(&block).map_err(|what| archive.error(at(header_pos), what))?;
            let Some(header) = header else {
                pos = self.end_of_archive(stream, archive, pos)?;
                break;
            };
            let size = pax.size.take().unwrap_or(header.size);
            let name = pax.path.take().or(long_name.take()).unwrap_or(header.name);
            let shown = || String::from_utf8_lossy(&name).into_owned();
            let member_at = || format!("member {:?} at byte {header_pos}", shown());
            let padded = size
                .checked_next_multiple_of(BLOCK)
                .ok_or_else(|| archive.error(member_at(), format!("size {size} overflows")))?;
            let next = pos
                .checked_add(padded)
                .ok_or_else(|| archive.error(member_at(), format!("size {size} overflows")))?;
            // next >= pos + size, so this cannot overflow.
            let data_end = pos + size;
            if let Some(end) = archive.end
                && next > end
            {
                let whole = if archive.depth == 0 { "file" } else { "inner tar" };
                let what = if data_end > end {
                    format!(
                        "the member runs past the end of the {whole}: {size} bytes declared, {} left",
                        end - pos
                    )
                } else {
                    format!("truncated: the {whole} ends in the padding after the member's data")
                };
                return Err(archive.error(member_at(), what));
            }
            let truncated = || archive.error(member_at(), "truncated: the archive ends inside the member's data");
            let io_error = |e: io::Error| archive.error(member_at(), format!("reading: {e}"));
            match header.typeflag {
                b'x' | b'L' => {
                    let data = read_small(stream, size)
                        .map_err(|what| archive.error(member_at(), what))?
                        .ok_or_else(truncated)?;
                    if header.typeflag == b'x' {
                        pax = parse_pax(&data).map_err(|what| archive.error(member_at(), what))?;
                    } else {
                        long_name = Some(until_nul(&data).to_vec());
                    }
                }
                b'0' | b'\0' | b'7' if ends_with_tar(&name) && archive.depth < MAX_DEPTH => {
                    self.close(&mut group, archive)?;
                    let mut prefix = archive.prefix.clone();
                    prefix.extend_from_slice(&name);
                    prefix.push(b'/');
                    let file_start = name.iter().rposition(|&b| b == b'/').map_or(0, |s| s + 1);
                    let inner = Archive {
                        path: archive.path,
                        gzip: archive.gzip,
                        spool: archive.spool,
                        prefix,
                        tar_name: Some(name[file_start..name.len() - 4].to_vec()),
                        end: Some(data_end),
                        depth: archive.depth + 1,
                    };
                    let stopped = self.walk(stream, &inner, pos)?;
                    // After the inner end of archive: the rest of its record.
                    if !stream.skip(data_end - stopped).map_err(io_error)? {
                        return Err(truncated());
                    }
                }
                b'0' | b'\0' | b'7' if !is_metadata(&name) => {
                    let member = self.member(stream, archive, &mut group, &name, header_pos, pos, size)?;
                    if !member {
                        return Err(truncated());
                    }
                }
                _ => {
                    if !stream.skip(size).map_err(io_error)? {
                        return Err(truncated());
                    }
                }
            }
            if !stream.skip(padded - size).map_err(io_error)? {
                return Err(truncated());
            }
            pos = next;
        }
        self.close(&mut group, archive)?;
        Ok(pos)
    }

    /// After a zero block at `pos - BLOCK`: a second one ends the archive;
    /// the stream's end is accepted with a warning; anything else is an
    /// error. For an inner tar, its remaining bytes are skipped by the
    /// caller. Returns where the walk stopped.
    fn end_of_archive(&mut self, stream: &mut Stream, archive: &Archive<'_>, pos: u64) -> Result<u64> {
        let at_end = archive.end == Some(pos);
        if !at_end && archive.end.is_some_and(|end| end - pos < BLOCK) {
            return Err(archive.error(
                format!("byte {pos}"),
                "truncated: the archive ends inside its end-of-archive blocks",
            ));
        }
        let mut block = [0u8; BLOCK as usize];
        let read = if at_end {
            0
        } else {
            stream
                .read_full(&mut block)
                .map_err(|e| archive.error(format!("byte {pos}"), format!("reading: {e}")))?
        };
        if read == 0 {
            tracing::warn!(
                "{}: byte {pos}: a lone zero block ends the archive{} (accepted, as GNU tar does)",
                archive.path.display(),
                inner_name(archive)
            );
            return Ok(pos);
        }
        if read < block.len() {
            return Err(archive.error(
                format!("byte {pos}"),
                "truncated: the archive ends inside its end-of-archive blocks",
            ));
        }
        if block.iter().any(|&b| b != 0) {
            return Err(archive.error(
                format!("byte {}", pos - BLOCK),
                "a zero block followed by a header (a damaged archive: an end-of-archive marker needs two)",
            ));
        }
        Ok(pos + BLOCK)
    }

    /// Adds one regular member to the group (closing the group first if its
    /// key differs); reads it when it labels the sample and spools it when
    /// it may be a gzipped tar's payload. False if the stream ended early.
    #[allow(clippy::too_many_arguments)]
    fn member(
        &mut self,
        stream: &mut Stream,
        archive: &Archive<'_>,
        group: &mut Group,
        name: &[u8],
        header: u64,
        offset: u64,
        size: u64,
    ) -> Result<bool> {
        let member_at = || format!("member {:?} at byte {header}", String::from_utf8_lossy(name));
        let (key, extension) = split_name(name);
        let full_key_len = archive.prefix.len() + key.len();
        let same_key = group.key.len() == full_key_len
            && group.key.starts_with(&archive.prefix)
            && &group.key[archive.prefix.len()..] == key;
        if !same_key || group.members.is_empty() {
            self.close(group, archive)?;
            group.key.extend_from_slice(&archive.prefix);
            group.key.extend_from_slice(key);
            if self.options.label == TarLabel::Dir {
                group.dir_name = archive
                    .tar_name
                    .clone()
                    .or_else(|| parent_name(name).map(<[u8]>::to_vec));
            }
        }
        if group.members.iter().any(|m| m.extension == extension) {
            return Err(archive.error(
                member_at(),
                format!(
                    "duplicate extension {:?} in sample {:?}",
                    String::from_utf8_lossy(&extension),
                    String::from_utf8_lossy(&group.key)
                ),
            ));
        }
        let is_label = self.options.label.extension() == Some(&extension[..]);
        let is_candidate =
            self.options.fields.is_empty() || self.options.fields.iter().any(|f| f.as_bytes() == extension);
        let mut data_offset = offset;
        let io_error = |e: io::Error| archive.error(member_at(), format!("reading: {e}"));
        let label_text = if is_label {
            let Some(text) = read_small(stream, size).map_err(|what| archive.error(member_at(), what))? else {
                return Ok(false);
            };
            Some(text)
        } else {
            None
        };
        if archive.spool && is_candidate {
            let (spool, offset) = self.listing.spool()?;
            data_offset = offset;
            let complete = match &label_text {
                Some(text) => spool.write_all(text).map(|()| true),
                None => stream.copy_to(size, spool),
            };
            match complete {
                Ok(true) => self.listing.spooled(size),
                Ok(false) => return Ok(false),
                // The stream or the spool: say which.
                Err(e) => {
                    return Err(archive.error(
                        member_at(),
                        format!("copying to the spool in {}: {e}", self.listing.spool_place().display()),
                    ));
                }
            }
        } else if label_text.is_none() && !stream.skip(size).map_err(io_error)? {
            return Ok(false);
        }
        if let Some(text) = label_text {
            group.label_text = Some(text);
        }
        group.members.push(Member {
            extension,
            offset: data_offset,
            size,
            header,
        });
        Ok(true)
    }

    /// Lists the grouped sample, if any, and empties the group.
    fn close(&mut self, group: &mut Group, archive: &Archive<'_>) -> Result<()> {
        let Some(first) = group.members.first() else {
            return Ok(());
        };
        let sample_at = || {
            format!(
                "sample {:?} (member at byte {})",
                String::from_utf8_lossy(&group.key),
                first.header
            )
        };
        let extensions = || {
            group
                .members
                .iter()
                .map(|m| String::from_utf8_lossy(&m.extension).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let payload = if self.options.fields.is_empty() {
            if group.members.len() != 1 {
                return Err(archive.error(
                    sample_at(),
                    format!(
                        "the sample has {} members ({}): choose the payload with --field (e.g. --field {})",
                        group.members.len(),
                        extensions(),
                        String::from_utf8_lossy(&first.extension)
                    ),
                ));
            }
            first
        } else {
            let found = self
                .options
                .fields
                .iter()
                .find_map(|f| group.members.iter().find(|m| m.extension == f.as_bytes()));
            found.ok_or_else(|| {
                archive.error(
                    sample_at(),
                    format!(
                        "the sample has none of the fields {} (it has {})",
                        self.options.fields.join(", "),
                        extensions()
                    ),
                )
            })?
        };
        let label = match &self.options.label {
            TarLabel::None => -1,
            TarLabel::Cls | TarLabel::Json(_) => {
                let Some(text) = &group.label_text else {
                    return Err(archive.error(
                        sample_at(),
                        format!(
                            "no .{} member to label the sample",
                            String::from_utf8_lossy(self.options.label.extension().unwrap_or_default())
                        ),
                    ));
                };
                label_of(&self.options.label, text).map_err(|what| archive.error(sample_at(), what))?
            }
            TarLabel::Dir => {
                let Some(name) = group.dir_name.take() else {
                    return Err(archive.error(
                        sample_at(),
                        "--label dir: the sample is neither in an inner tar nor in a directory",
                    ));
                };
                let next = self.dir_names.len() as i64;
                *self.dir_names.entry(name).or_insert(next)
            }
        };
        i64::try_from(payload.size)
            .map_err(|_| archive.error(sample_at(), format!("payload of {} bytes", payload.size)))?;
        self.listing.push(&group.key, label, payload.offset, payload.size);
        group.key.clear();
        group.members.clear();
        group.label_text = None;
        group.dir_name = None;
        Ok(())
    }

    /// `--label dir`: the names first seen since there were `before`, in
    /// the order they were (what the listing journal keeps per input).
    fn dir_names_since(&self, before: usize) -> serde_json::Value {
        let mut new: Vec<(&Vec<u8>, i64)> = self
            .dir_names
            .iter()
            .filter(|&(_, &id)| id >= before as i64)
            .map(|(name, &id)| (name, id))
            .collect();
        new.sort_by_key(|&(_, id)| id);
        serde_json::Value::from(
            new.into_iter()
                .map(|(name, _)| serde_json::Value::from(name.clone()))
                .collect::<Vec<_>>(),
        )
    }

    /// Takes back the names a reused input saw first ([`Scan::dir_names_since`]).
    fn restore_dir_names(&mut self, input: &Input, state: serde_json::Value) -> Result<()> {
        let names: Vec<Vec<u8>> = serde_json::from_value(state)
            .map_err(|e| Error::input(input.path(), "its kept listing", format!("class names unreadable: {e}")))?;
        for name in names {
            let next = self.dir_names.len() as i64;
            self.dir_names.entry(name).or_insert(next);
        }
        Ok(())
    }

    /// `--label dir`: renumbers the provisional labels by the sorted order
    /// of the names; returns the names by label.
    fn number_dir_labels(&mut self) -> Vec<String> {
        if self.options.label != TarLabel::Dir {
            return Vec::new();
        }
        let mut sorted: Vec<(Vec<u8>, i64)> = self.dir_names.drain().collect();
        sorted.sort();
        let mut rank = vec![0i64; sorted.len()];
        for (new, (_, provisional)) in sorted.iter().enumerate() {
            rank[*provisional as usize] = new as i64;
        }
        self.listing.entries.relabel(|provisional| rank[provisional as usize]);
        sorted
            .into_iter()
            .map(|(name, _)| String::from_utf8_lossy(&name).into_owned())
            .collect()
    }
}

fn inner_name(archive: &Archive<'_>) -> String {
    match archive.depth {
        0 => String::new(),
        _ => format!(
            " (inner tar {:?})",
            String::from_utf8_lossy(archive.prefix.strip_suffix(b"/").unwrap_or(&archive.prefix))
        ),
    }
}

/// The name of the directory a member is in.
fn parent_name(name: &[u8]) -> Option<&[u8]> {
    let dir = &name[..name.iter().rposition(|&b| b == b'/')?];
    let start = dir.iter().rposition(|&b| b == b'/').map_or(0, |s| s + 1);
    Some(&dir[start..]).filter(|d| !d.is_empty())
}

/// Reads a member that must fit in memory (PAX data, long name, label);
/// None if the stream ended first.
fn read_small(stream: &mut Stream, size: u64) -> std::result::Result<Option<Vec<u8>>, String> {
    if size > MAX_METADATA_BYTES {
        return Err(format!(
            "{size} bytes: more than the {MAX_METADATA_BYTES} read for a header or label"
        ));
    }
    // At most MAX_METADATA_BYTES, so the cast holds.
    let mut data = vec![0; size as usize];
    let read = stream.read_full(&mut data).map_err(|e| format!("reading: {e}"))?;
    Ok((read == data.len()).then_some(data))
}

/// The label in a `.cls` or `.json` member.
fn label_of(label: &TarLabel, text: &[u8]) -> std::result::Result<i64, String> {
    match label {
        TarLabel::Json(field) => {
            let value: serde_json::Value =
                serde_json::from_slice(text).map_err(|e| format!("the .json member is not JSON: {e}"))?;
            value
                .get(field)
                .and_then(serde_json::Value::as_i64)
                .ok_or_else(|| format!("the .json member has no integer field {field:?}"))
        }
        _ => std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                format!(
                    "the .cls member {:?} is not an integer",
                    String::from_utf8_lossy(&text[..text.len().min(40)])
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &[u8], size_field: &[u8], typeflag: u8) -> [u8; 512] {
        let mut block = [0u8; 512];
        block[..name.len()].copy_from_slice(name);
        block[124..124 + size_field.len()].copy_from_slice(size_field);
        block[156] = typeflag;
        block[257..263].copy_from_slice(b"ustar\0");
        block[148..156].fill(b' ');
        let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
        block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        block
    }

    #[test]
    fn headers_parse_sizes_and_reject_bad_checksums() {
        let h = parse_header(&header(b"a/b.jpg", b"00000000017\0", b'0'))
            .unwrap()
            .unwrap();
        assert_eq!((h.name.as_slice(), h.size, h.typeflag), (&b"a/b.jpg"[..], 15, b'0'));
        // Base-256: 2^63.
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[4] = 0x80;
        assert_eq!(parse_header(&header(b"x", &big, b'0')).unwrap().unwrap().size, 1 << 63);
        let mut bad = header(b"x", b"1\0", b'0');
        bad[0] = b'y';
        assert!(parse_header(&bad).unwrap_err().contains("checksum"));
        assert_eq!(parse_header(&[0; 512]), Ok(None));
        assert!(parse_header(&header(b"x", b"9\0", b'0')).is_err());
    }

    #[test]
    fn names_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_name(b"a.b/c.seg.PNG"), (&b"a.b/c"[..], b"seg.png".to_vec()));
        assert_eq!(split_name(b"noext"), (&b"noext"[..], Vec::new()));
        assert_eq!(split_name(b"d/.hidden"), (&b"d/"[..], b"hidden".to_vec()));
        assert!(is_metadata(b"__index__") && is_metadata(b"a/__meta__/x") && !is_metadata(b"a__b"));
    }

    #[test]
    fn pax_records_override_path_and_size() {
        let pax = parse_pax(b"22 path=long/name.jpg\n11 size=42\n20 mtime=1.00000000\n").unwrap();
        assert_eq!(pax.path.as_deref(), Some(&b"long/name.jpg"[..]));
        assert_eq!(pax.size, Some(42));
        assert!(parse_pax(b"99 path=x\n").is_err());
        assert!(parse_pax(b"1 \n").is_err());
        assert!(parse_pax(b"x path=x\n").is_err());
    }
}
