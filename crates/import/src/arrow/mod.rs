//! Arrow IPC files as a pack source (DESIGN.md §2), as Hugging Face
//! `datasets` writes them with `save_to_disk`: `DIR/data-NNNNN-of-NNNNN.arrow`
//! in the order `DIR/state.json` lists (`_data_files`), class names in the
//! schema's `huggingface` metadata or `DIR/dataset_info.json`, an `Image`
//! or `Audio` column as `struct<bytes: binary, path: string>`, a
//! `ClassLabel` column as int64.
//!
//! A file is the IPC stream format (what `datasets` writes) or the IPC file
//! format (`ARROW1` magic, the stream, a footer): messages, each a
//! flatbuffer `Message` (Schema, then RecordBatches) and its body. `open`
//! walks every message once, reading only the metadata, the payload
//! column's validity and value-offset buffers and the label column's
//! values; each sample's bytes stay where they are, and `read` is one
//! positioned read at (file, offset, length) — no spool, no copy.
//! Compressed bodies (LZ4_FRAME or ZSTD `BodyCompression`) are refused with
//! a named error: `datasets` never writes them, and a spool would be a copy
//! of the dataset.
//!
//! An input may be an object in a store, or a prefix of them
//! ([`crate::input`]): `.arrow` objects, or a `save_to_disk` layout.
//! Reading in place needs random access, so each object is fetched first,
//! whole and in order, into the spool (an anonymous file in the directory
//! the caller names, gone when the source is dropped), and read there.
//!
//! The flatbuffer metadata is parsed here ([`flatbuffers`]; the messages,
//! schema and columns in `ipc`), every offset bounds-checked
//! (the `arrow-ipc` crate would bring arrow-array/-buffer/-data/-schema and
//! their build time for the few tables read here). Nothing read from a file
//! is trusted: buffer offsets are checked against the body, bodies against
//! the file, node lengths against the batch, value offsets for order.

use std::path::PathBuf;
use std::rc::Rc;

use serde::Deserialize;

pub mod flatbuffers;
mod ipc;

use ipc::Scan;

use crate::input::{self, Given, InputDir};
use crate::listed::{Listed, ListedFormat, PayloadFile, Payloads};
use brand_format::error::{Error, Result};

/// What `--field` and `--label` name.
#[derive(Debug, Clone, Default)]
pub struct ArrowOptions {
    /// The payload column: binary, string, or an `Image`/`Audio` struct
    /// (its `bytes`); None: the only binary or struct{bytes} column.
    pub field: Option<String>,
    /// The label column (an integer column); None: no label (-1).
    pub label: Option<String>,
    /// Where objects are fetched to (an anonymous file, gone when the
    /// source is dropped); unused for local files.
    pub spool_dir: PathBuf,
    /// How the requests for inputs in object storage are bounded and
    /// retried (the user's `stall_timeout` and `retries`).
    pub store: brand_store::GetPolicy,
}

/// `--from arrow`'s samples ([`Listed`]).
#[derive(Debug)]
pub struct Arrow;

impl ListedFormat for Arrow {
    const KIND: &'static str = "arrow";
    const NAME: &'static str = "Arrow";
    const NOUN: &'static str = "row";
}

/// The rows of one or more Arrow IPC files, in file order and then row
/// order. Per row: its key (`file:row`) and label in an arena, its payload's
/// offset in its file (or in the spool, for an object) and its length.
pub type ArrowSource = Listed<Arrow>;

/// One file to read and the name its keys carry.
struct ArrowInput {
    input: input::Input,
    name: String,
    /// The `dataset_info.json` beside it, if any: its bytes.
    info: Option<Rc<Vec<u8>>>,
}

impl ArrowSource {
    /// Lists the rows of `paths`: `.arrow` files, `save_to_disk`
    /// directories (files in `state.json` order), or directories whose
    /// `.arrow` files are taken in name order; URLs of such objects or
    /// prefixes (fetched to the spool first).
    pub fn open(paths: &[PathBuf], options: &ArrowOptions) -> Result<Self> {
        let Some(first_input) = paths.first() else {
            return Err(Error::config("no Arrow input given"));
        };
        let inputs = expand_inputs(paths, &options.store)?;
        let mut scan = Scan::new(options);
        let mut files = Vec::with_capacity(inputs.len());
        let mut inputs_identity = String::new();
        for input in &inputs {
            let first = scan.offsets.len();
            scan.file(input)?;
            inputs_identity.push_str(&format!(
                "{}\t{}\n",
                input.input.path().display(),
                input.input.identity()?
            ));
            files.push(PayloadFile {
                path: input.input.path().to_path_buf(),
                first,
                spooled: input.input.object().is_some(),
            });
        }
        if scan.offsets.is_empty() {
            return Err(Error::input(
                first_input,
                format!("{} input file(s)", files.len()),
                "no rows in the Arrow input",
            ));
        }
        let mut payloads = Payloads {
            files,
            entries: scan.entries,
            offsets: scan.offsets,
            lens: scan.lens,
            spool: scan.spool,
            noun: Arrow::NOUN,
            format: Arrow::NAME,
        };
        payloads.shrink_to_fit();
        Ok(Listed {
            payloads,
            label_names: scan.label_names.unwrap_or_default(),
            inputs_identity,
            format: std::marker::PhantomData,
        })
    }
}

#[derive(Deserialize)]
struct StateJson {
    #[serde(rename = "_data_files")]
    data_files: Vec<DataFile>,
}

#[derive(Deserialize)]
struct DataFile {
    filename: String,
}

#[derive(Deserialize)]
struct DatasetDictJson {
    splits: Vec<String>,
}

/// Files to read: each file as given; a `save_to_disk` directory's files in
/// `state.json` order; another directory's `.arrow` files (not hidden) by
/// name. A `DatasetDict` directory is refused, naming its splits. Prefixes
/// are directories here ([`input::given`]).
fn expand_inputs(paths: &[PathBuf], policy: &brand_store::GetPolicy) -> Result<Vec<ArrowInput>> {
    let mut files = Vec::new();
    for given in input::given(paths, policy)? {
        let dir = match given {
            Given::File(file) => {
                let name = String::from_utf8_lossy(&file.file_name()).into_owned();
                files.push(ArrowInput {
                    input: file,
                    name,
                    info: None,
                });
                continue;
            }
            Given::Dir(dir) => dir,
        };
        if let Some(dict) = small_file(&dir, "dataset_dict.json")? {
            let splits = serde_json::from_slice::<DatasetDictJson>(&dict.1)
                .map(|d| d.splits)
                .unwrap_or_default();
            let example = splits.first().map_or("train", String::as_str);
            return Err(Error::input(
                dict.0.path(),
                "dataset_dict.json",
                format!(
                    "a DatasetDict of splits [{}]: pack one split, naming its directory (e.g. {})",
                    splits.join(", "),
                    dir.path().join(example).display()
                ),
            ));
        }
        let info = small_file(&dir, "dataset_info.json")?.map(|(_, bytes)| Rc::new(bytes));
        if let Some((state, text)) = small_file(&dir, "state.json")? {
            let state = state.path();
            let parsed: StateJson = serde_json::from_slice(&text).map_err(|e| {
                Error::input(
                    state,
                    "state.json",
                    format!("not a datasets state.json (malformed JSON or no _data_files): {e}"),
                )
            })?;
            if parsed.data_files.is_empty() {
                return Err(Error::input(state, "state.json", "_data_files lists no file"));
            }
            for (k, data_file) in parsed.data_files.into_iter().enumerate() {
                let at = format!("_data_files[{k}]");
                let listed = dir
                    .file(&data_file.filename)
                    .map_err(|what| Error::input(state, at.as_str(), what))?;
                let Some(file) = listed else {
                    let missing = dir.show(&data_file.filename).unwrap_or_default();
                    return Err(Error::input(
                        state,
                        at,
                        format!("lists {}, which does not exist", missing.display()),
                    ));
                };
                files.push(ArrowInput {
                    input: file,
                    name: data_file.filename,
                    info: info.clone(),
                });
            }
            continue;
        }
        let in_dir = dir.files(|name| name.ends_with(b".arrow"))?;
        if in_dir.is_empty() {
            return Err(dir.none_of(".arrow", " (and no state.json)"));
        }
        files.extend(in_dir.into_iter().map(|file| ArrowInput {
            name: String::from_utf8_lossy(&file.file_name()).into_owned(),
            input: file,
            info: info.clone(),
        }));
    }
    Ok(files)
}

/// The file `name` of `dir`, if there is one, and its bytes (a small JSON
/// file: `state.json`, `dataset_info.json`).
fn small_file(dir: &InputDir, name: &str) -> Result<Option<(input::Input, Vec<u8>)>> {
    let Some(file) = dir.file(name).map_err(|what| Error::input(dir.path(), name, what))? else {
        return Ok(None);
    };
    let bytes = file.read_all()?;
    Ok(Some((file, bytes)))
}

/// Class names of `label` in a `dataset_info.json` (`features.<label>.names`).
pub(super) fn dataset_info_class_names(info: &[u8], label: &str) -> Option<Vec<String>> {
    let json: serde_json::Value = serde_json::from_slice(info).ok()?;
    let names = json.get("features")?.get(label)?.get("names")?.as_array()?;
    names.iter().map(|n| n.as_str().map(str::to_string)).collect()
}
