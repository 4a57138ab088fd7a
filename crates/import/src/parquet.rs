//! Parquet files as a pack source (DESIGN.md §2), as the Hugging Face Hub
//! holds datasets: `data/train-NNNNN-of-NNNNN.parquet`, an `Image` column
//! as `struct<bytes: binary, path: string>`, a `ClassLabel` column as int64
//! with the class names in the footer's `huggingface` key-value metadata
//! (JSON, `info.features.<label>.names`).
//!
//! Parquet compresses and encodes a column by pages, so one row cannot be
//! read without decoding its page: `open` reads each file once, row group
//! by row group in order, only the payload and label columns (and an
//! `Image`'s `path` only to name a row whose bytes are missing), and copies
//! the payloads to a spool file (anonymous, in the directory the caller
//! names); `read` is one positioned read of the spool. Keys are
//! `file name:row`. Pages are decoded by the `parquet` crate (apache
//! arrow-rs) without its Arrow layer; its errors (a missing footer, a
//! corrupt page) are reported with the file, row group, column and the
//! column chunk's byte range.
//!
//! A file in object storage (`s3://…`, [`crate::input`]) is fetched first,
//! whole and in order (large ranged GETs), into an anonymous file in the
//! spool directory, and read from there: the footer comes first in a
//! Parquet reader's order, last in the file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use ::parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use ::parquet::column::reader::ColumnReader;
use ::parquet::data_type::ByteArray;
use ::parquet::file::reader::{FileReader, RowGroupReader};
use ::parquet::file::serialized_reader::SerializedFileReader;
use ::parquet::schema::types::SchemaDescriptor;

use super::input::Input;
use super::listing::{Listing, ListingOptions};
use crate::listed::{Listed, ListedFormat};
use brand_format::error::{Error, IoContext, Result};

/// Rows decoded at a time: bounds the memory of one batch of payloads.
const BATCH_ROWS: usize = 64;

/// What `--field` and `--label` name.
#[derive(Debug, Clone)]
pub struct ParquetOptions {
    /// The payload column: binary, or an `Image` struct (its `bytes`);
    /// None: the only such column.
    pub field: Option<String>,
    /// The label column (int32 or int64); None: no label (-1).
    pub label: Option<String>,
    /// Where the payloads are spooled (an anonymous file, gone when the
    /// source is dropped or the process ends).
    pub spool_dir: PathBuf,
    /// How the requests for inputs in object storage are bounded and
    /// retried (the user's `stall_timeout` and `retries`).
    pub store: brand_store::GetPolicy,
    /// Where the listing is kept for a later run to reuse, and who hears
    /// of each input listed (`crate::listing`).
    pub listing: ListingOptions,
}

/// `--from parquet`'s samples ([`Listed`]).
#[derive(Debug)]
pub struct Parquet;

impl ListedFormat for Parquet {
    const KIND: &'static str = "parquet";
    const NAME: &'static str = "Parquet";
    const NOUN: &'static str = "row";
}

/// The rows of one or more Parquet files, in file order and then row order.
pub type ParquetSource = Listed<Parquet>;

impl ParquetSource {
    /// Lists (and spools) the rows of `paths`: Parquet files, or
    /// directories whose `.parquet` files are taken in name order; URLs of
    /// such objects, or of prefixes listed the same way.
    pub fn open(paths: &[PathBuf], options: &ParquetOptions) -> Result<Self> {
        let inputs = super::input::expand(
            paths,
            &options.store,
            |name| name.ends_with(b".parquet"),
            ".parquet",
            " (a Hub dataset keeps them in data/)",
        )?;
        let Some(first_input) = paths.first() else {
            return Err(Error::config("no Parquet input given"));
        };
        let what = format!("parquet field {:?} label {:?}", options.field, options.label);
        let mut scan = Scan {
            options,
            listing: Listing::new(&options.spool_dir, &options.listing, inputs.len(), &what)?,
            label_names: None,
        };
        let count = inputs.len();
        for input in inputs {
            if let Some(state) = scan.listing.reuse(&input)? {
                // The first file's class names, kept with it.
                let names: Option<Vec<String>> = serde_json::from_value(state).map_err(|e| {
                    Error::input(input.path(), "its kept listing", format!("class names unreadable: {e}"))
                })?;
                if let Some(names) = names {
                    scan.label_names.get_or_insert(names);
                }
                continue;
            }
            let path = input.path().to_path_buf();
            let first_file = scan.label_names.is_none();
            // The decoder is another crate's: should damaged input make it
            // panic, that is this file's error, not a crash.
            let scanned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scan.file(&input)));
            match scanned {
                Ok(result) => result?,
                Err(_) => {
                    return Err(Error::input(
                        &path,
                        "decoding",
                        "the Parquet decoder failed on damaged data (it panicked)",
                    ));
                }
            }
            let names = match (&scan.label_names, first_file) {
                (Some(names), true) => serde_json::Value::from(names.clone()),
                _ => serde_json::Value::Null,
            };
            scan.listing.input_done(&input, true, names)?;
        }
        if scan.listing.len() == 0 {
            return Err(Error::input(
                first_input,
                format!("{count} input file(s)"),
                "no rows in the Parquet input",
            ));
        }
        scan.listing.finish(scan.label_names.unwrap_or_default())
    }
}

/// The leaf columns a file's rows are read from.
struct Columns {
    /// The payload: a binary column or an Image's `bytes`.
    payload: usize,
    /// An Image's `path`, to name a row whose bytes are missing.
    image_path: Option<usize>,
    label: Option<usize>,
    /// The payload column's name, for messages.
    field: String,
}

fn is_string(schema: &SchemaDescriptor, i: usize) -> bool {
    let c = schema.column(i);
    c.converted_type() == ConvertedType::UTF8 || matches!(c.logical_type_ref(), Some(LogicalType::String))
}

/// Finds the payload and label columns of `schema`.
fn columns(schema: &SchemaDescriptor, options: &ParquetOptions) -> std::result::Result<Columns, String> {
    let leaf = |parts: &[&str]| {
        schema
            .columns()
            .iter()
            .position(|c| c.path().parts().iter().map(String::as_str).eq(parts.iter().copied()))
    };
    let binary = |i: usize| {
        let c = schema.column(i);
        c.physical_type() == PhysicalType::BYTE_ARRAY && c.max_rep_level() == 0
    };
    let mut tops: Vec<&str> = Vec::new();
    for c in schema.columns() {
        if let Some(top) = c.path().parts().first()
            && !tops.contains(&top.as_str())
        {
            tops.push(top);
        }
    }
    let describe = || tops.join(", ");
    // A column's payload leaf and, for an Image struct, its path leaf.
    let payload_of = |name: &str, strings_too: bool| -> Option<(usize, Option<usize>)> {
        if let Some(i) = leaf(&[name]) {
            return (binary(i) && (strings_too || !is_string(schema, i))).then_some((i, None));
        }
        let bytes = leaf(&[name, "bytes"]).filter(|&i| binary(i))?;
        Some((bytes, leaf(&[name, "path"])))
    };
    let field = match &options.field {
        Some(f) => f.clone(),
        None => {
            let candidates: Vec<&str> = tops
                .iter()
                .copied()
                .filter(|t| payload_of(t, false).is_some())
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
    if !tops.contains(&field.as_str()) {
        return Err(format!("missing column {field:?} (columns: {})", describe()));
    }
    let (payload, image_path) = payload_of(&field, true).ok_or_else(|| {
        format!("column {field:?} is neither binary nor an Image struct{{bytes, path}}: brand packs stored bytes")
    })?;
    let label = match options.label.as_deref() {
        None | Some("none") => None,
        Some(name) => {
            let i = leaf(&[name]).ok_or_else(|| format!("missing label column {name:?} (columns: {})", describe()))?;
            let c = schema.column(i);
            if !matches!(c.physical_type(), PhysicalType::INT32 | PhysicalType::INT64) || c.max_rep_level() != 0 {
                return Err(format!(
                    "label column {name:?} is {} ({}), not an integer",
                    c.physical_type(),
                    if c.max_rep_level() > 0 {
                        "repeated"
                    } else {
                        "one per row"
                    }
                ));
            }
            Some(i)
        }
    };
    Ok(Columns {
        payload,
        image_path,
        label,
        field,
    })
}

/// The class names of `label` in a file's `huggingface` metadata, if any.
fn class_names(reader: &SerializedFileReader<File>, label: &str, path: &Path) -> Option<Vec<String>> {
    let kv = reader.metadata().file_metadata().key_value_metadata()?;
    let text = kv.iter().find(|kv| kv.key == "huggingface")?.value.as_ref()?;
    huggingface_class_names(text, label, path)
}

/// The class names of `label` in the JSON that `datasets` keeps under the
/// `huggingface` metadata key (Parquet footers, Arrow schemas):
/// `info.features.<label>.names`.
pub(crate) fn huggingface_class_names(text: &str, label: &str, path: &Path) -> Option<Vec<String>> {
    let json: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(
                "{}: the huggingface metadata is not JSON ({e}); class names not kept",
                path.display()
            );
            return None;
        }
    };
    let names = json
        .get("info")?
        .get("features")?
        .get(label)?
        .get("names")?
        .as_array()?;
    names.iter().map(|n| n.as_str().map(str::to_string)).collect()
}

/// State of the scan in `open`: the listing so far.
struct Scan<'a> {
    options: &'a ParquetOptions,
    listing: Listing,
    /// Class names from the first file (None: not seen yet).
    label_names: Option<Vec<String>>,
}

impl Scan<'_> {
    fn file(&mut self, input: &Input) -> Result<()> {
        let path = input.path();
        let file = match input.object() {
            Some(object) => {
                // Fetched in order into an anonymous file, read from there.
                let spool_dir = &self.options.spool_dir;
                let mut local = tempfile::tempfile_in(spool_dir).at(spool_dir)?;
                object.copy_to(&mut local, spool_dir)?;
                local
            }
            None => File::open(path).at(path)?,
        };
        let file_len = file.metadata().at(path)?.len();
        let reader = SerializedFileReader::new(file).map_err(|e| {
            Error::input(
                path,
                format!("footer (the file's last bytes; {file_len} bytes in all)"),
                format!("not a readable Parquet file: {e}"),
            )
        })?;
        let schema = reader.metadata().file_metadata().schema_descr();
        let columns = columns(schema, self.options).map_err(|what| Error::input(path, "schema", what))?;
        let names = match (&self.options.label, columns.label) {
            (Some(label), Some(_)) => class_names(&reader, label, path).unwrap_or_default(),
            _ => Vec::new(),
        };
        match &self.label_names {
            None => self.label_names = Some(names.clone()),
            Some(first) if *first != names => {
                return Err(Error::input(
                    path,
                    "huggingface metadata",
                    format!(
                        "its {} class names differ from the first file's {}",
                        names.len(),
                        first.len()
                    ),
                ));
            }
            Some(_) => {}
        }
        let file_name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut row: u64 = 0;
        for group in 0..reader.num_row_groups() {
            let group_reader = reader
                .get_row_group(group)
                .map_err(|e| Error::input(path, format!("row group {group}"), e.to_string()))?;
            let rows = u64::try_from(group_reader.metadata().num_rows()).unwrap_or(0);
            self.row_group(
                path,
                &file_name,
                group,
                group_reader.as_ref(),
                &columns,
                &names,
                row,
                rows,
            )?;
            row += rows;
        }
        Ok(())
    }

    /// Reads one row group's payloads and labels in batches; `first_row` is
    /// the group's first row in the file.
    #[allow(clippy::too_many_arguments)]
    fn row_group(
        &mut self,
        path: &Path,
        file_name: &str,
        group: usize,
        reader: &dyn RowGroupReader,
        columns: &Columns,
        names: &[String],
        first_row: u64,
        rows: u64,
    ) -> Result<()> {
        let chunk_at = |c: usize| {
            let (start, len) = reader.metadata().column(c).byte_range();
            format!(
                "row group {group}, column {} (bytes {start}..{})",
                reader.metadata().column(c).column_path(),
                start.saturating_add(len)
            )
        };
        let column_error =
            |c: usize, row: u64, what: String| Error::input(path, format!("row {row} ({})", chunk_at(c)), what);
        let open_column = |c: usize| {
            reader
                .get_column_reader(c)
                .map_err(|e| column_error(c, first_row, e.to_string()))
        };
        let ColumnReader::ByteArrayColumnReader(mut payload) = open_column(columns.payload)? else {
            return Err(column_error(columns.payload, first_row, "not a binary column".into()));
        };
        let mut label_reader = columns.label.map(open_column).transpose()?;
        let payload_max_def = reader.metadata().column(columns.payload).column_descr().max_def_level();
        let label_max_def = columns
            .label
            .map_or(0, |c| reader.metadata().column(c).column_descr().max_def_level());
        let (mut defs, mut values) = (Vec::<i16>::new(), Vec::<ByteArray>::new());
        let (mut label_defs, mut labels32, mut labels64) = (Vec::<i16>::new(), Vec::<i32>::new(), Vec::<i64>::new());
        let mut done = 0u64;
        while done < rows {
            let batch = (rows - done).min(BATCH_ROWS as u64) as usize;
            let row = first_row + done;
            defs.clear();
            values.clear();
            let (records, _, _) = payload
                .read_records(batch, Some(&mut defs), None, &mut values)
                .map_err(|e| column_error(columns.payload, row, format!("decoding: {e}")))?;
            if records != batch {
                return Err(column_error(
                    columns.payload,
                    row,
                    format!(
                        "the column chunk ends after {} of its {rows} rows",
                        done + records as u64
                    ),
                ));
            }
            let labels: Vec<i64> = match (&mut label_reader, columns.label) {
                (Some(reader), Some(c)) => {
                    label_defs.clear();
                    labels32.clear();
                    labels64.clear();
                    let decoded = match reader {
                        ColumnReader::Int32ColumnReader(r) => {
                            r.read_records(batch, Some(&mut label_defs), None, &mut labels32)
                        }
                        ColumnReader::Int64ColumnReader(r) => {
                            r.read_records(batch, Some(&mut label_defs), None, &mut labels64)
                        }
                        _ => return Err(column_error(c, row, "not an integer column".into())),
                    };
                    let (records, _, _) = decoded.map_err(|e| column_error(c, row, format!("decoding: {e}")))?;
                    if records != batch {
                        return Err(column_error(
                            c,
                            row,
                            format!(
                                "the column chunk ends after {} of its {rows} rows",
                                done + records as u64
                            ),
                        ));
                    }
                    let mut present = labels64.iter().copied().chain(labels32.iter().map(|&v| i64::from(v)));
                    let mut out = Vec::with_capacity(batch);
                    for r in 0..batch {
                        let is_set = label_max_def == 0 || label_defs.get(r) == Some(&label_max_def);
                        // A null label is no label.
                        out.push(if is_set { present.next().unwrap_or(-1) } else { -1 });
                    }
                    out
                }
                _ => vec![-1; batch],
            };
            let mut present = values.iter();
            for (r, &label) in labels.iter().enumerate() {
                let row = row + r as u64;
                let is_set = payload_max_def == 0 || defs.get(r) == Some(&payload_max_def);
                let Some(bytes) = present.next().filter(|_| is_set) else {
                    let image_path = columns
                        .image_path
                        .and_then(|c| image_path_of(reader, c, row - first_row));
                    return Err(column_error(
                        columns.payload,
                        row,
                        match image_path {
                            Some(p) => format!(
                                "{:?} has no bytes, only a path ({p:?}): embed the images (datasets' push_to_hub and to_parquet do) before packing",
                                columns.field
                            ),
                            None => format!("{:?} is null", columns.field),
                        },
                    ));
                };
                let named = label == -1 || (0..names.len() as i64).contains(&label);
                if !names.is_empty() && !named {
                    return Err(Error::input(
                        path,
                        format!("row {row} (row group {group})"),
                        format!(
                            "label {label} is out of range of the {} class names in the huggingface metadata",
                            names.len()
                        ),
                    ));
                }
                let data = bytes.data();
                let (spool, offset) = self.listing.spool()?;
                if let Err(e) = spool.write_all(data) {
                    return Err(Error::input(
                        path,
                        format!("row {row}"),
                        format!("copying to the spool in {}: {e}", self.listing.spool_place().display()),
                    ));
                }
                self.listing.spooled(data.len() as u64);
                self.listing.push(
                    format!("{file_name}:{row}").as_bytes(),
                    label,
                    offset,
                    data.len() as u64,
                );
            }
            done += batch as u64;
        }
        Ok(())
    }
}

/// The `path` of an Image whose bytes are null, at `row` of the row group.
fn image_path_of(reader: &dyn RowGroupReader, column: usize, row: u64) -> Option<String> {
    let ColumnReader::ByteArrayColumnReader(mut r) = reader.get_column_reader(column).ok()? else {
        return None;
    };
    let row = usize::try_from(row).ok()?;
    if r.skip_records(row).ok()? != row {
        return None;
    }
    let (mut defs, mut values) = (Vec::new(), Vec::<ByteArray>::new());
    r.read_records(1, Some(&mut defs), None, &mut values).ok()?;
    values.first().map(|v| String::from_utf8_lossy(v.data()).into_owned())
}
