//! Arrow IPC framing and column extraction: the messages of a stream or
//! file (`ARROW1`) format file, the schema's fields, and each record
//! batch's payload offsets and labels (module doc of [`super`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::flatbuffers::{self as fb, Table};
use super::{ArrowInput, ArrowOptions, dataset_info_class_names};
use brand_format::error::{Error, IoContext, Result};
use brand_pack::source::{Entries, Ints};

/// Deepest nesting of schema fields followed (a damaged schema cannot
/// recurse without end).
const MAX_FIELD_DEPTH: usize = 64;

/// Most schema fields parsed: flatbuffer tables can be shared, so a small
/// damaged schema could otherwise name exponentially many fields.
const MAX_FIELDS: usize = 100_000;

// Arrow's `Type` union (Schema.fbs), the types named or laid out here.
const TYPE_NULL: u8 = 1;
const TYPE_INT: u8 = 2;
const TYPE_BINARY: u8 = 4;
const TYPE_UTF8: u8 = 5;
const TYPE_STRUCT: u8 = 13;
const TYPE_UNION: u8 = 14;
const TYPE_LARGE_BINARY: u8 = 19;
const TYPE_LARGE_UTF8: u8 = 20;

fn type_name(id: u8) -> &'static str {
    [
        "NONE",
        "null",
        "int",
        "float",
        "binary",
        "string",
        "bool",
        "decimal",
        "date",
        "time",
        "timestamp",
        "interval",
        "list",
        "struct",
        "union",
        "fixed_size_binary",
        "fixed_size_list",
        "map",
        "duration",
        "large_binary",
        "large_string",
        "large_list",
        "run_end_encoded",
        "binary_view",
        "string_view",
        "list_view",
        "large_list_view",
    ]
    .get(id as usize)
    .copied()
    .unwrap_or("unknown")
}

/// A schema field, as much as locating its buffers needs.
struct FieldDesc {
    name: String,
    type_id: u8,
    /// Int: bit width and signedness.
    int: (i32, bool),
    /// Union: dense (two buffers) or sparse (one).
    dense_union: bool,
    dictionary: bool,
    children: Vec<FieldDesc>,
}

impl FieldDesc {
    /// `budget`: fields that may still be parsed.
    fn parse(t: Table<'_>, depth: usize, budget: &mut usize) -> fb::Res<Self> {
        if depth > MAX_FIELD_DEPTH {
            return Err(format!("schema fields nested deeper than {MAX_FIELD_DEPTH}"));
        }
        *budget = budget
            .checked_sub(1)
            .ok_or_else(|| format!("more than {MAX_FIELDS} schema fields"))?;
        let type_id = t.u8(2, 0)?;
        let type_table = t.table(3)?;
        let int = match (type_id, type_table) {
            (TYPE_INT, Some(int)) => (int.i32(0, 0)?, int.u8(1, 0)? != 0),
            _ => (0, false),
        };
        let dense_union = match (type_id, type_table) {
            (TYPE_UNION, Some(u)) => u.i16(0, 0)? == 1,
            _ => false,
        };
        Ok(FieldDesc {
            name: t.string(0)?,
            type_id,
            int,
            dense_union,
            dictionary: t.table(4)?.is_some(),
            children: t
                .tables(5)?
                .into_iter()
                .map(|c| FieldDesc::parse(c, depth + 1, budget))
                .collect::<fb::Res<_>>()?,
        })
    }

    /// How many buffers the field itself has in a record batch (IPC
    /// layout); None for types brand cannot lay out.
    fn own_buffers(&self) -> Option<usize> {
        if self.dictionary {
            return Some(2);
        }
        Some(match self.type_id {
            TYPE_NULL | 22 => 0,
            TYPE_STRUCT | 16 => 1,
            TYPE_UNION => 1 + usize::from(self.dense_union),
            TYPE_INT | 3 | 6..=11 | 15 | 18 | 12 | 17 | 21 => 2,
            TYPE_BINARY | TYPE_UTF8 | TYPE_LARGE_BINARY | TYPE_LARGE_UTF8 | 25 | 26 => 3,
            _ => return None,
        })
    }

    /// Adds the field's nodes and buffers (children too) to the counts;
    /// Err: the type that cannot be laid out.
    fn count(&self, nodes: &mut usize, buffers: &mut usize) -> std::result::Result<(), &FieldDesc> {
        *nodes += 1;
        *buffers += self.own_buffers().ok_or(self)?;
        if !self.dictionary {
            for c in &self.children {
                c.count(nodes, buffers)?;
            }
        }
        Ok(())
    }

    fn is_binary(&self, strings_too: bool) -> bool {
        !self.dictionary
            && (matches!(self.type_id, TYPE_BINARY | TYPE_LARGE_BINARY)
                || (strings_too && matches!(self.type_id, TYPE_UTF8 | TYPE_LARGE_UTF8)))
    }

    /// An `Image`/`Audio` struct's `bytes` child (index).
    fn struct_bytes(&self, strings_too: bool) -> Option<usize> {
        if self.type_id != TYPE_STRUCT || self.dictionary {
            return None;
        }
        self.children
            .iter()
            .position(|c| c.name == "bytes" && c.is_binary(strings_too))
    }

    fn describe(&self) -> String {
        if self.dictionary {
            format!("dictionary-encoded {}", type_name(self.type_id))
        } else if self.type_id == TYPE_INT {
            format!("{}int{}", if self.int.1 { "" } else { "u" }, self.int.0)
        } else {
            type_name(self.type_id).to_string()
        }
    }
}

/// A binary or string column's node and first buffer (validity; then
/// offsets and data).
#[derive(Clone, Copy)]
struct BinaryColumn {
    node: usize,
    buffer: usize,
    large: bool,
}

/// Where a file's payload and label are among a record batch's nodes and
/// buffers.
struct Columns {
    /// An Image struct's own node and validity buffer.
    outer: Option<(usize, usize)>,
    payload: BinaryColumn,
    /// An Image's `path`, to name a row whose bytes are missing.
    image_path: Option<BinaryColumn>,
    /// Node, first buffer (validity; then values), bytes per value, signed.
    label: Option<(usize, usize, usize, bool)>,
    field: String,
}

/// Finds the payload and label columns of a schema's fields.
fn columns(fields: &[FieldDesc], options: &ArrowOptions) -> fb::Res<Columns> {
    let describe = || fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ");
    let is_payload =
        |f: &FieldDesc, strings_too: bool| f.is_binary(strings_too) || f.struct_bytes(strings_too).is_some();
    let field = match &options.field {
        Some(f) => f.clone(),
        None => {
            let candidates: Vec<&str> = fields
                .iter()
                .filter(|f| is_payload(f, false))
                .map(|f| f.name.as_str())
                .collect();
            match candidates[..] {
                [one] => one.to_string(),
                [] => return Err(format!("no binary or Image column to pack (columns: {})", describe())),
                _ => {
                    return Err(format!(
                        "several columns could be the payload: choose one with --field (columns: {})",
                        describe()
                    ));
                }
            }
        }
    };
    // Each top-level field's first node and buffer, as far as they can be
    // laid out.
    let mut starts: Vec<std::result::Result<(usize, usize), String>> = Vec::with_capacity(fields.len());
    let (mut nodes, mut buffers) = (0, 0);
    let mut blocked: Option<String> = None;
    for f in fields {
        match &blocked {
            Some(why) => starts.push(Err(why.clone())),
            None => {
                starts.push(Ok((nodes, buffers)));
                if let Err(bad) = f.count(&mut nodes, &mut buffers) {
                    blocked = Some(format!(
                        "it comes after column {:?}, whose {} type brand cannot lay out",
                        f.name,
                        bad.describe()
                    ));
                }
            }
        }
    }
    let find = |name: &str, what: &str| -> fb::Res<(&FieldDesc, usize, usize)> {
        let k = fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| format!("missing {what} column {name:?} (columns: {})", describe()))?;
        let (node, buffer) = starts[k]
            .clone()
            .map_err(|why| format!("cannot read column {name:?}: {why}"))?;
        Ok((&fields[k], node, buffer))
    };
    let (f, node, buffer) = find(&field, "payload")?;
    let binary = |f: &FieldDesc, node, buffer| BinaryColumn {
        node,
        buffer,
        large: matches!(f.type_id, TYPE_LARGE_BINARY | TYPE_LARGE_UTF8),
    };
    let (outer, payload, image_path) = if f.is_binary(true) {
        (None, binary(f, node, buffer), None)
    } else if let Some(bytes) = f.struct_bytes(true) {
        // Children follow the struct's own node and validity buffer.
        let (mut n, mut b) = (node + 1, buffer + 1);
        let mut payload = None;
        let mut image_path = None;
        for (k, c) in f.children.iter().enumerate() {
            if k == bytes {
                payload = Some(binary(c, n, b));
            } else if c.name == "path" && c.is_binary(true) {
                image_path = Some(binary(c, n, b));
            }
            if c.count(&mut n, &mut b).is_err() {
                break;
            }
        }
        let payload = payload.ok_or_else(|| format!("column {field:?}: its bytes cannot be laid out"))?;
        (Some((node, buffer)), payload, image_path)
    } else {
        return Err(format!(
            "column {field:?} is {}, neither binary, string nor an Image struct{{bytes, path}}: brand packs stored bytes",
            f.describe()
        ));
    };
    let label = match options.label.as_deref() {
        None | Some("none") => None,
        Some(name) => {
            let (f, node, buffer) = find(name, "label")?;
            let width = match f.int.0 {
                8 | 16 | 32 | 64 if f.type_id == TYPE_INT && !f.dictionary => f.int.0 as usize / 8,
                _ => return Err(format!("label column {name:?} is {}, not an integer", f.describe())),
            };
            Some((node, buffer, width, f.int.1))
        }
    };
    Ok(Columns {
        outer,
        payload,
        image_path,
        label,
        field,
    })
}

/// One record batch's label column, as read.
struct LabelValues {
    values: Vec<u8>,
    /// Bytes per value.
    width: usize,
    signed: bool,
    /// Validity bits (None: no nulls).
    valid: Option<Vec<u8>>,
}

/// One IPC message: its metadata and where its body is.
struct Message {
    start: u64,
    meta: Vec<u8>,
    body_start: u64,
    body_len: u64,
}

// MessageHeader union values.
const HEADER_SCHEMA: u8 = 1;
const HEADER_DICTIONARY_BATCH: u8 = 2;
const HEADER_RECORD_BATCH: u8 = 3;

/// State of the scan in `open`: the listing so far.
pub(super) struct Scan<'a> {
    options: &'a ArrowOptions,
    pub(super) entries: Entries,
    pub(super) offsets: Vec<u64>,
    pub(super) lens: Ints,
    /// Class names from the first file (None: not seen yet).
    pub(super) label_names: Option<Vec<String>>,
    /// The objects fetched so far, one after another (None: none yet).
    pub(super) spool: Option<File>,
    spool_len: u64,
}

impl<'a> Scan<'a> {
    pub(super) fn new(options: &'a ArrowOptions) -> Self {
        Scan {
            options,
            entries: Entries::new(),
            offsets: Vec::new(),
            lens: Ints::default(),
            label_names: None,
            spool: None,
            spool_len: 0,
        }
    }
}

/// Reads one file's messages: a local file, or an object's bytes in the
/// spool from `base` on. Offsets are the file's own (errors name them).
struct FileReader<'a> {
    file: &'a File,
    base: u64,
    path: &'a std::path::Path,
    pos: u64,
    /// Where the messages end (the file's end, or a file format's footer).
    end: u64,
}

impl FileReader<'_> {
    fn fail(&self, at: String, what: impl Into<String>) -> Error {
        Error::input(self.path, at, what)
    }

    fn read_at(&self, offset: u64, len: u64, at: impl Fn() -> String) -> Result<Vec<u8>> {
        let n = usize::try_from(len).map_err(|_| self.fail(at(), format!("cannot hold {len} bytes")))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(n)
            .map_err(|_| self.fail(at(), format!("cannot allocate {len} bytes")))?;
        buf.resize(n, 0);
        self.read_exact_at(&mut buf, offset).map_err(|e| {
            self.fail(
                at(),
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    "the file ends early (truncated)".to_string()
                } else {
                    format!("reading: {e}")
                },
            )
        })?;
        Ok(buf)
    }

    /// `buf.len()` bytes at the file's byte `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let at = offset
            .checked_add(self.base)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "offset past the end"))?;
        self.file.read_exact_at(buf, at)
    }

    /// The next message, or None at the end-of-stream marker (or, `eos`
    /// false, at the end of the messages).
    fn next(&mut self, n: usize, eos: bool) -> Result<Option<Message>> {
        let start = self.pos;
        let at = || format!("message {n} at byte {start}");
        let left = self.end - start;
        if left == 0 {
            if eos {
                return Err(self.fail(
                    at(),
                    "the stream ends without its end-of-stream marker (truncated, or not finished by its writer)",
                ));
            }
            return Ok(None);
        }
        if left < 4 {
            return Err(self.fail(
                at(),
                format!("the stream ends {left} bytes into a message prefix (truncated)"),
            ));
        }
        let word = |b: Vec<u8>| <[u8; 4]>::try_from(b.as_slice()).map_or(0, i32::from_le_bytes);
        let mut len = word(self.read_at(start, 4, at)?);
        let mut prefix = 4;
        if len == -1 {
            // Continuation marker, then the length (the pre-1.0 format has
            // the length alone).
            if left < 8 {
                return Err(self.fail(at(), "the stream ends inside a message prefix (truncated)"));
            }
            len = word(self.read_at(start + 4, 4, at)?);
            prefix = 8;
        }
        if len == 0 {
            return Ok(None);
        }
        let meta_len = u64::try_from(len)
            .map_err(|_| self.fail(at(), format!("negative metadata length {len}: not an Arrow IPC stream")))?;
        let meta_start = start + prefix;
        if meta_len > self.end - meta_start {
            return Err(self.fail(
                at(),
                format!(
                    "metadata of {meta_len} bytes runs past the end of the stream at byte {} (truncated, or not an Arrow IPC file)",
                    self.end
                ),
            ));
        }
        let meta = self.read_at(meta_start, meta_len, at)?;
        let message = Table::root(&meta).map_err(|what| self.fail(at(), format!("malformed Message: {what}")))?;
        let body_len = message
            .i64(3, 0)
            .map_err(|what| self.fail(at(), format!("malformed Message: {what}")))?;
        let body_start = meta_start + meta_len;
        let body_len = u64::try_from(body_len)
            .ok()
            .filter(|&l| l <= self.end - body_start)
            .ok_or_else(|| {
                self.fail(
                    at(),
                    format!(
                        "a body of {body_len} bytes from byte {body_start} does not fit the stream's {} bytes (truncated?)",
                        self.end
                    ),
                )
            })?;
        self.pos = body_start + body_len;
        Ok(Some(Message {
            start,
            meta,
            body_start,
            body_len,
        }))
    }
}

impl Scan<'_> {
    pub(super) fn file(&mut self, input: &ArrowInput) -> Result<()> {
        let path = input.input.path();
        let (file, base, file_len) = match input.input.object() {
            Some(object) => {
                // Appended to the spool, whole and in order, and read there
                // (through a second handle: the scan below borrows `self`).
                let spool_dir = &self.options.spool_dir;
                let spool = match &mut self.spool {
                    Some(spool) => spool,
                    None => self.spool.insert(tempfile::tempfile_in(spool_dir).at(spool_dir)?),
                };
                let base = self.spool_len;
                let len = object.copy_to(spool, spool_dir)?;
                self.spool_len += len;
                (spool.try_clone().at(spool_dir)?, base, len)
            }
            None => {
                let file = File::open(path).at(path)?;
                let len = file.metadata().at(path)?.len();
                (file, 0, len)
            }
        };
        let mut reader = FileReader {
            file: &file,
            base,
            path,
            pos: 0,
            end: file_len,
        };
        let mut head = [0u8; 8];
        let is_file_format = file_len >= 8 && reader.read_exact_at(&mut head, 0).is_ok() && head.starts_with(b"ARROW1");
        if is_file_format {
            // Magic and padding, the stream, the footer, its length, magic.
            let tail = if file_len >= 18 {
                reader.read_at(file_len - 10, 10, || "footer".into())?
            } else {
                Vec::new()
            };
            let footer_len = tail
                .get(..4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(i32::from_le_bytes)
                .and_then(|n| u64::try_from(n).ok());
            let stream_end = footer_len
                .filter(|_| tail.get(4..) == Some(b"ARROW1"))
                .and_then(|n| (file_len - 10).checked_sub(n))
                .filter(|&e| e >= 8);
            reader.end = stream_end.ok_or_else(|| {
                Error::input(
                    path,
                    format!("footer (the last 10 of {file_len} bytes)"),
                    "an Arrow IPC file without its footer or closing ARROW1 magic (truncated?)",
                )
            })?;
            reader.pos = 8;
        }
        let mut columns: Option<Columns> = None;
        let mut names: Vec<String> = Vec::new();
        let mut row: u64 = 0;
        let mut batch = 0usize;
        for n in 0.. {
            let Some(message) = reader.next(n, !is_file_format)? else {
                break;
            };
            let at = |what: &str| format!("message {n}{what} at byte {}", message.start);
            let root = Table::root(&message.meta);
            let header = root.and_then(|m| Ok((m.u8(1, 0)?, m.table(2)?)));
            let (kind, header) =
                header.map_err(|what| Error::input(path, at(""), format!("malformed Message: {what}")))?;
            let Some(header) = header else {
                return Err(Error::input(path, at(""), "a Message without its header"));
            };
            match (kind, &columns) {
                (HEADER_SCHEMA, None) => {
                    let (cols, file_names) = self
                        .schema(header, input)
                        .map_err(|what| Error::input(path, at(" (schema)"), what))?;
                    columns = Some(cols);
                    names = file_names;
                }
                (HEADER_SCHEMA, Some(_)) => {
                    return Err(Error::input(path, at(""), "a second Schema message"));
                }
                (_, None) => {
                    return Err(Error::input(
                        path,
                        at(""),
                        format!("missing schema: the stream starts with a message of type {kind}, not a Schema"),
                    ));
                }
                (HEADER_DICTIONARY_BATCH, Some(_)) => {}
                (HEADER_RECORD_BATCH, Some(cols)) => {
                    let rows =
                        self.record_batch(&reader, &input.name, header, &message, cols, &names, n, batch, row)?;
                    row += rows;
                    batch += 1;
                }
                (other, Some(_)) => {
                    return Err(Error::input(
                        path,
                        at(""),
                        format!("a message of type {other} (brand reads Schema, DictionaryBatch and RecordBatch)"),
                    ));
                }
            }
        }
        if columns.is_none() {
            return Err(Error::input(
                path,
                format!("byte 0 of {file_len}"),
                "missing schema: no Schema message (an empty stream, or not an Arrow IPC file)",
            ));
        }
        Ok(())
    }

    /// The file's columns and class names.
    fn schema(&mut self, schema: Table<'_>, input: &ArrowInput) -> fb::Res<(Columns, Vec<String>)> {
        if schema.i16(0, 0)? == 1 {
            return Err("a big-endian schema: brand reads little-endian Arrow files".into());
        }
        let mut budget = MAX_FIELDS;
        let fields = schema
            .tables(1)?
            .into_iter()
            .map(|f| FieldDesc::parse(f, 0, &mut budget))
            .collect::<fb::Res<Vec<_>>>()?;
        let columns = columns(&fields, self.options)?;
        let mut names = Vec::new();
        if let (Some(label), Some(_)) = (&self.options.label, columns.label) {
            let mut metadata = None;
            for kv in schema.tables(2)? {
                if kv.string(0)? == "huggingface" {
                    metadata = Some(kv.string(1)?);
                }
            }
            names = metadata
                .and_then(|text| crate::parquet::huggingface_class_names(&text, label, input.input.path()))
                .or_else(|| {
                    input
                        .info
                        .as_deref()
                        .and_then(|info| dataset_info_class_names(info, label))
                })
                .unwrap_or_default();
        }
        match &self.label_names {
            None => self.label_names = Some(names.clone()),
            Some(first) if *first != names => {
                return Err(format!(
                    "its {} class names differ from the first file's {}",
                    names.len(),
                    first.len()
                ));
            }
            Some(_) => {}
        }
        Ok((columns, names))
    }

    /// Lists one record batch's rows; `first_row` is its first row in the
    /// file. Returns its row count.
    #[allow(clippy::too_many_arguments)]
    fn record_batch(
        &mut self,
        reader: &FileReader<'_>,
        file_name: &str,
        batch: Table<'_>,
        message: &Message,
        columns: &Columns,
        names: &[String],
        n: usize,
        batch_no: usize,
        first_row: u64,
    ) -> Result<u64> {
        let path = reader.path;
        let at = |row: Option<u64>, byte: u64| match row {
            Some(r) => format!("row {r} (message {n}, record batch {batch_no}) at byte {byte}"),
            None => format!("message {n} (record batch {batch_no}) at byte {byte}"),
        };
        let malformed =
            |what: String| Error::input(path, at(None, message.start), format!("malformed RecordBatch: {what}"));
        if batch.table(3).map_err(malformed)?.is_some() {
            let codec = match batch.table(3).ok().flatten().map(|c| c.u8(0, 0)) {
                Some(Ok(1)) => "ZSTD",
                _ => "LZ4_FRAME",
            };
            return Err(Error::input(
                path,
                at(None, message.start),
                format!(
                    "a {codec}-compressed body: brand reads uncompressed Arrow files in place (datasets' save_to_disk writes them; rewrite without compression)"
                ),
            ));
        }
        let length = batch.i64(0, 0).map_err(malformed)?;
        let rows = u64::try_from(length).map_err(|_| malformed(format!("negative length {length}")))?;
        let nodes = batch.bytes(1, 16).map_err(malformed)?;
        let buffers = batch.bytes(2, 16).map_err(malformed)?;
        let pair = |table: &[u8], i: usize| -> Option<(i64, i64)> {
            let b = table.get(i * 16..i * 16 + 16)?;
            let first = i64::from_le_bytes(b.get(..8)?.try_into().ok()?);
            let second = i64::from_le_bytes(b.get(8..)?.try_into().ok()?);
            Some((first, second))
        };
        // A node's length, checked against the batch's; its null count.
        let node = |i: usize| -> Result<u64> {
            let (len, nulls) = pair(nodes, i)
                .ok_or_else(|| malformed(format!("{} field nodes, the schema needs node {i}", nodes.len() / 16)))?;
            if len != length || nulls < 0 || nulls > len {
                return Err(malformed(format!(
                    "field node {i} has length {len} and {nulls} nulls, the batch has length {length}"
                )));
            }
            Ok(nulls as u64)
        };
        // A buffer's absolute offset and length, checked against the body.
        let buffer = |i: usize| -> Result<(u64, u64)> {
            let (offset, len) = pair(buffers, i)
                .ok_or_else(|| malformed(format!("{} buffers, the schema needs buffer {i}", buffers.len() / 16)))?;
            match (u64::try_from(offset), u64::try_from(len)) {
                (Ok(o), Ok(l)) if o.checked_add(l).is_some_and(|e| e <= message.body_len) => {
                    Ok((message.body_start + o, l))
                }
                _ => Err(malformed(format!(
                    "buffer {i} (offset {offset}, length {len}) is outside the body's {} bytes from byte {}",
                    message.body_len, message.body_start
                ))),
            }
        };
        let read = |offset: u64, len: u64| reader.read_at(offset, len, || at(None, offset));
        // Whether each row is set, per a node's validity buffer (None: all).
        let validity = |node_index: usize, buffer_index: usize| -> Result<Option<Vec<u8>>> {
            if node(node_index)? == 0 {
                return Ok(None);
            }
            let (offset, len) = buffer(buffer_index)?;
            let need = rows.div_ceil(8);
            if len < need {
                return Err(malformed(format!(
                    "validity buffer {buffer_index} has {len} bytes for {rows} rows"
                )));
            }
            Ok(Some(read(offset, need)?))
        };
        let is_set = |bits: &Option<Vec<u8>>, r: u64| {
            bits.as_ref()
                .is_none_or(|b| b.get((r / 8) as usize).is_some_and(|byte| byte & (1 << (r % 8)) != 0))
        };
        // A binary column's value offsets (absolute) and its data buffer.
        let value_offsets = |col: BinaryColumn| -> Result<(Vec<u64>, u64)> {
            let width = if col.large { 8 } else { 4 };
            let (offsets_at, offsets_len) = buffer(col.buffer + 1)?;
            let (data_at, data_len) = buffer(col.buffer + 2)?;
            // Saturating: a damaged length then fails the size check below.
            let need = if rows == 0 {
                0
            } else {
                rows.saturating_add(1).saturating_mul(width)
            };
            if offsets_len < need {
                return Err(malformed(format!(
                    "offsets buffer {} has {offsets_len} bytes for {rows} rows",
                    col.buffer + 1
                )));
            }
            let raw = read(offsets_at, need)?;
            let mut out = Vec::with_capacity(raw.len() / width as usize);
            for (k, chunk) in raw.chunks_exact(width as usize).enumerate() {
                let v = if col.large {
                    chunk.try_into().map_or(-1, i64::from_le_bytes)
                } else {
                    chunk.try_into().map_or(-1, |b| i64::from(i32::from_le_bytes(b)))
                };
                let entry_at = offsets_at + k as u64 * width;
                // Entry k ends row k - 1 (entry 0 starts row 0).
                let row_of_entry = first_row + (k as u64).saturating_sub(1);
                let v = u64::try_from(v).ok().filter(|&v| v <= data_len).ok_or_else(|| {
                    Error::input(
                        path,
                        at(Some(row_of_entry), entry_at),
                        format!("value offset {v} is outside the data buffer's {data_len} bytes"),
                    )
                })?;
                if let Some(&prev) = out.last()
                    && v < prev - data_at
                {
                    return Err(Error::input(
                        path,
                        at(Some(row_of_entry), entry_at),
                        format!("value offsets not monotonic: {} then {v}", prev - data_at),
                    ));
                }
                out.push(data_at + v);
            }
            Ok((out, data_at))
        };
        let outer_valid = match columns.outer {
            Some((node_index, buffer_index)) => validity(node_index, buffer_index)?,
            None => None,
        };
        let payload_valid = validity(columns.payload.node, columns.payload.buffer)?;
        let (offsets, _) = value_offsets(columns.payload)?;
        let labels: Option<LabelValues> = match columns.label {
            Some((node_index, buffer_index, width, signed)) => {
                let valid = validity(node_index, buffer_index)?;
                let (values_at, values_len) = buffer(buffer_index + 1)?;
                let need = rows.saturating_mul(width as u64);
                if values_len < need {
                    return Err(malformed(format!(
                        "label values buffer {} has {values_len} bytes for {rows} rows",
                        buffer_index + 1
                    )));
                }
                Some(LabelValues {
                    values: read(values_at, need)?,
                    width,
                    signed,
                    valid,
                })
            }
            None => None,
        };
        for r in 0..rows {
            let row = first_row + r;
            let i = r as usize;
            let (Some(&start), Some(&end)) = (offsets.get(i), offsets.get(i + 1)) else {
                return Err(malformed(format!("no value offsets for row {row}")));
            };
            if !(is_set(&outer_valid, r) && is_set(&payload_valid, r)) {
                let image_path = columns.image_path.and_then(|c| {
                    let (offsets, _) = value_offsets(c).ok()?;
                    let (&s, &e) = (offsets.get(i)?, offsets.get(i + 1)?);
                    let bytes = read(s, e.checked_sub(s)?).ok()?;
                    Some(String::from_utf8_lossy(&bytes).into_owned())
                });
                return Err(Error::input(
                    path,
                    at(Some(row), start),
                    match image_path {
                        Some(p) => format!(
                            "{:?} has no bytes, only a path ({p:?}): embed the files (datasets' embed_table_storage, or cast_column with decode) before packing",
                            columns.field
                        ),
                        None => format!("{:?} is null", columns.field),
                    },
                ));
            }
            let label = match &labels {
                None => -1,
                Some(LabelValues {
                    values,
                    width,
                    signed,
                    valid,
                }) => {
                    if !is_set(valid, r) {
                        -1
                    } else {
                        let b = values.get(i * width..(i + 1) * width).unwrap_or(&[]);
                        let mut raw = [0u8; 8];
                        if let Some(d) = raw.get_mut(..b.len()) {
                            d.copy_from_slice(b);
                        }
                        let shift = 64 - 8 * *width as u32;
                        if *signed {
                            (i64::from_le_bytes(raw) << shift) >> shift
                        } else {
                            let v = u64::from_le_bytes(raw);
                            i64::try_from(v).map_err(|_| {
                                Error::input(
                                    path,
                                    at(Some(row), start),
                                    format!("label {v} is above brand's largest label ({})", i64::MAX),
                                )
                            })?
                        }
                    }
                }
            };
            if !names.is_empty() && label != -1 && !(0..names.len() as i64).contains(&label) {
                return Err(Error::input(
                    path,
                    at(Some(row), start),
                    format!(
                        "label {label} is out of range of the {} class names (huggingface metadata or dataset_info.json)",
                        names.len()
                    ),
                ));
            }
            self.offsets.push(reader.base + start);
            self.lens.push((end - start) as i64);
            self.entries.push(format!("{file_name}:{row}").as_bytes(), label);
        }
        Ok(rows)
    }
}
