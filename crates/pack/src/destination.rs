//! Where a pack goes: a local directory, or a URL (`brand pack -o s3://…`,
//! `brand.pack(out="s3://…")`; DESIGN.md §2). The one way the command line
//! and the Python package pack, so they cannot differ in how a dataset
//! reaches object storage: the URL checked before any input is read
//! ([`Destination::prepare`]), then [`pack_to`] packs in a staging
//! directory, uploads each segment as soon as it is written (removing it
//! there), and the manifest last.

use std::path::{Path, PathBuf};

use brand_format::error::{Error, Result};
use brand_format::manifest::Manifest;
use brand_store::upload::SegmentUpload;
use brand_store::{GetPolicy, Location, ObjectUrl};

use crate::source::Source;
use crate::{Hooks, PackOptions};

/// A pack's output, checked and ready to be written.
pub struct Destination {
    out: PathBuf,
    upload: Option<Upload>,
}

/// A pack to a URL: the upload under way and where its staging directory
/// goes.
struct Upload {
    url: ObjectUrl,
    segments: SegmentUpload,
    staging_parent: PathBuf,
}

impl Destination {
    /// Checks that a pack may write `out`, before any input is read: a URL
    /// must hold no dataset unless `force` (the upload begins: connected,
    /// and with `force` the old dataset's manifest taken away; its requests
    /// retry as `policy` says); a directory as [`crate::check_output`].
    /// `staging`: where a pack to a URL writes its segments until they are
    /// sent (default: the system's temporary directory).
    pub fn prepare(out: &Path, force: bool, staging: Option<&Path>, policy: &GetPolicy) -> Result<Destination> {
        let upload = match Location::of_path(out)? {
            Location::Url(url) => Some(Upload {
                segments: SegmentUpload::begin(&url, force, true, policy)?,
                url,
                staging_parent: staging.map_or_else(std::env::temp_dir, Path::to_path_buf),
            }),
            Location::Dir(_) => {
                crate::check_output(out, force)?;
                None
            }
        };
        Ok(Destination {
            out: out.to_path_buf(),
            upload,
        })
    }
}

/// Where a pack into `out` keeps its scratch files (a gzipped tar's
/// payloads, `brand.Writer`'s samples): beside `out`, or for a URL in
/// `staging` (default: the system's temporary directory).
pub fn scratch_dir(out: &Path, staging: Option<&Path>) -> Result<PathBuf> {
    Ok(match Location::of_path(out)? {
        Location::Url(_) => staging.map_or_else(std::env::temp_dir, Path::to_path_buf),
        Location::Dir(_) => match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
    })
}

/// Packs `source` into `dest`: a directory as [`crate::pack`] does, or a
/// URL through a staging directory (removed however the pack ends), each
/// segment uploaded once complete, the index and manifest last. A pack to
/// a URL that fails leaves no dataset there (its segments are deleted).
pub fn pack_to(source: &dyn Source, dest: Destination, opts: &PackOptions, hooks: &Hooks<'_>) -> Result<Manifest> {
    let Some(upload) = dest.upload else {
        return crate::pack_with(source, &dest.out, opts, hooks, &|_, _| Ok(()));
    };
    if opts.partitions.is_some() {
        return Err(Error::config(format!(
            "{}: partitions are written to nodes' local disks, not to object storage",
            upload.url
        )));
    }
    let staging = tempfile::Builder::new()
        .prefix("brand-pack-")
        .tempdir_in(&upload.staging_parent)
        .map_err(|e| Error::io(&upload.staging_parent, e))?;
    let local = staging.path().join("ds");
    let segment_done = |path: &Path, name: &str| upload.segments.segment(path, name);
    let manifest = crate::pack_with(source, &local, opts, hooks, &segment_done)?;
    upload.segments.finish(&local)?;
    Ok(manifest)
}
