//! brand-import: the importers that read what users hold into a
//! [`Source`] for the packer (DESIGN.md §2, §7), one module per format —
//! `files` (dir, list), `tfrecord`, `lmdb`, `tar`, `mds`, `parquet`, `arrow` —
//! the readers they need (`protobuf`, `lmdb::btree`, `arrow::flatbuffers`),
//! the inputs they take from a path or a store (`input`, `listing`,
//! `listed`), and `brand gen`'s `synthetic` datasets.
//!
//! Which importer reads a pack's inputs: `brand pack --from FORMAT` and
//! Python's `brand.pack(source=…)` name one of [`Format::ALL`], with the same
//! options, so the command line and the package cannot disagree on what an
//! input means.

pub mod arrow;
pub mod files;
pub mod input;
pub mod listed;
pub mod listing;
pub mod lmdb;
pub mod mds;
pub mod parquet;
mod protobuf;
pub mod synthetic;
pub mod tar;
pub mod tfrecord;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use brand_format::error::{Error, Result};

use crate::files::FileSource;
use crate::listing::ListingOptions;
use brand_pack::source::Source;

/// An input format: what each reads is [`Format::help`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Dir,
    List,
    Tfrecord,
    Lmdb,
    Tar,
    Mds,
    Parquet,
    Arrow,
}

impl Format {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [Format; 8] = [
        Format::Dir,
        Format::List,
        Format::Tfrecord,
        Format::Lmdb,
        Format::Tar,
        Format::Mds,
        Format::Parquet,
        Format::Arrow,
    ];

    /// The name `--from` and `source=` take.
    pub fn name(self) -> &'static str {
        match self {
            Format::Dir => "dir",
            Format::List => "list",
            Format::Tfrecord => "tfrecord",
            Format::Lmdb => "lmdb",
            Format::Tar => "tar",
            Format::Mds => "mds",
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
        }
    }

    /// What the format reads, in one line: `brand pack --help` lists it
    /// beside the name.
    pub fn help(self) -> &'static str {
        match self {
            Format::Dir => "ImageFolder directory: INPUT/<class>/<file>, label = class index",
            Format::List => "Text file of `path<TAB>label` lines",
            Format::Tfrecord => "One or more TFRecord files",
            Format::Lmdb => "An LMDB environment (e.g. a Caffe datum database)",
            Format::Tar => "Tar files (WebDataset shards, tars of tars, .tar.gz), or directories of them",
            Format::Mds => "A MosaicML Streaming MDS dataset (its directory or index.json; plain or zstd shards)",
            Format::Parquet => "Parquet files (Hugging Face Hub data/*.parquet), or directories of them",
            Format::Arrow => {
                "Arrow IPC files (a Hugging Face save_to_disk directory: one split's), or directories of them"
            }
        }
    }

    /// Whether the format reads several inputs (the others take exactly one).
    fn takes_several(self) -> bool {
        matches!(self, Format::Tfrecord | Format::Tar | Format::Parquet | Format::Arrow)
    }

    /// Whether inputs may be objects in a store (`s3://…`; `crate::input`).
    fn reads_objects(self) -> bool {
        matches!(self, Format::Tar | Format::Mds | Format::Parquet | Format::Arrow)
    }

    /// Whether `--field` and `--label` mean something for the format.
    fn takes_field_and_label(self) -> bool {
        matches!(self, Format::Tar | Format::Mds | Format::Parquet | Format::Arrow)
    }
}

impl FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Format::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<_> = Format::ALL.iter().map(|f| f.name()).collect();
            Error::config(format!("unknown input format {s:?}: one of {}", names.join(", ")))
        })
    }
}

/// The options an importer takes, as `brand pack` spells them.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// TFRecord: the int64 feature of each tf.train.Example that holds its label.
    pub label_feature: String,
    /// The payload member's or column's name(s), in order of preference ("png;jpg").
    pub field: Option<String>,
    /// How the label is found (tar: cls, json:FIELD, dir, none; mds,
    /// parquet and arrow: a column's name, or none).
    pub label: Option<String>,
    /// Where inputs that can only be read in order are spooled while packing.
    pub spool_dir: PathBuf,
    /// How the requests for inputs in object storage are bounded and
    /// retried (the user's `stall_timeout` and `retries`).
    pub store: brand_store::GetPolicy,
    /// Where tar, MDS and Parquet keep their listing and spool for a later
    /// run of the same import to reuse (`crate::listing`; the CLI's
    /// `.OUT.listing`; default: nowhere, an anonymous spool in
    /// `spool_dir`), and who hears of each input listed.
    pub listing: ListingOptions,
}

impl ImportOptions {
    /// Defaults, spooling into `spool_dir`.
    pub fn new(spool_dir: &Path) -> Self {
        ImportOptions {
            label_feature: "label".to_string(),
            field: None,
            label: None,
            spool_dir: spool_dir.to_path_buf(),
            store: brand_store::GetPolicy::default(),
            listing: ListingOptions::default(),
        }
    }
}

/// The samples of `inputs` read as `format`. An input is a path, or for
/// tar, mds, parquet and arrow a URL of an object or a prefix (`crate::input`).
pub fn open(format: Format, inputs: &[PathBuf], opts: &ImportOptions) -> Result<Box<dyn Source>> {
    if !format.takes_field_and_label() && (opts.field.is_some() || opts.label.is_some()) {
        let takes: Vec<_> = Format::ALL
            .iter()
            .filter(|f| f.takes_field_and_label())
            .map(|f| format!("--from {}", f.name()))
            .collect();
        return Err(Error::config(format!(
            "--field and --label apply to {} (TFRecord labels: --label-feature)",
            takes.join(", ")
        )));
    }
    let single = || -> Result<&PathBuf> {
        match inputs {
            [one] => Ok(one),
            [] => Err(Error::config(format!("--from {}: no input given", format.name()))),
            _ => Err(Error::config(format!(
                "--from {} takes exactly one input",
                format.name()
            ))),
        }
    };
    let is_url = |p: &&PathBuf| matches!(brand_store::Location::of_path(p), Ok(brand_store::Location::Url(_)));
    if let Some(url) = inputs.iter().find(is_url).filter(|_| !format.reads_objects()) {
        return Err(Error::config(format!(
            "--from {} reads local files, and {} is a URL (--from tar, mds, parquet and arrow read object storage)",
            format.name(),
            url.display()
        )));
    }
    if format.takes_several() && inputs.is_empty() {
        return Err(Error::config(format!("--from {}: no input given", format.name())));
    }
    Ok(match format {
        Format::Dir => Box::new(FileSource::image_folder(single()?)?),
        Format::List => Box::new(FileSource::list(single()?)?),
        Format::Tfrecord => Box::new(crate::tfrecord::TfRecordSource::open(
            inputs,
            Some(&opts.label_feature),
        )?),
        Format::Lmdb => Box::new(crate::lmdb::LmdbSource::open(single()?)?),
        Format::Tar => {
            let tar = crate::tar::TarOptions {
                fields: match &opts.field {
                    Some(f) => crate::tar::TarOptions::parse_fields(f)?,
                    None => Vec::new(),
                },
                label: crate::tar::TarLabel::parse(opts.label.as_deref().unwrap_or("none"))?,
                spool_dir: opts.spool_dir.clone(),
                store: opts.store.clone(),
                listing: opts.listing.clone(),
            };
            Box::new(crate::tar::TarSource::open(inputs, &tar)?)
        }
        Format::Mds => {
            let mds = crate::mds::MdsOptions {
                field: opts.field.clone(),
                label: opts.label.clone(),
                spool_dir: opts.spool_dir.clone(),
                store: opts.store.clone(),
                listing: opts.listing.clone(),
            };
            Box::new(crate::mds::MdsSource::open(single()?, &mds)?)
        }
        Format::Parquet => {
            let parquet = crate::parquet::ParquetOptions {
                field: opts.field.clone(),
                label: opts.label.clone(),
                spool_dir: opts.spool_dir.clone(),
                store: opts.store.clone(),
                listing: opts.listing.clone(),
            };
            Box::new(crate::parquet::ParquetSource::open(inputs, &parquet)?)
        }
        Format::Arrow => {
            let arrow = crate::arrow::ArrowOptions {
                field: opts.field.clone(),
                label: opts.label.clone(),
                spool_dir: opts.spool_dir.clone(),
                store: opts.store.clone(),
            };
            Box::new(crate::arrow::ArrowSource::open(inputs, &arrow)?)
        }
    })
}
