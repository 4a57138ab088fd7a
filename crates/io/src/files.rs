//! Segment files: opening one for reading (O_DIRECT, or buffered where the
//! filesystem refuses it) and the cache of open ones that each reader of a
//! backend keeps.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};

use crate::job::EngineStats;

/// The open segment files of one reader, by segment number, as handles of
/// type `H` (what the backend reads through: `Arc<std::fs::File>` for
/// threads, `Rc<std::fs::File>` for a ring). Not locked: the
/// backend puts it behind what its readers need (a mutex shared by reader
/// threads, a `RefCell` on a ring's own thread).
pub(crate) struct FileCache<H> {
    ds: Arc<Dataset>,
    stats: Arc<EngineStats>,
    /// Makes a handle of an opened file.
    wrap: fn(std::fs::File) -> H,
    open: HashMap<u32, H>,
}

impl<H: Clone> FileCache<H> {
    pub fn new(ds: Arc<Dataset>, stats: Arc<EngineStats>, wrap: fn(std::fs::File) -> H) -> Self {
        FileCache {
            ds,
            stats,
            wrap,
            open: HashMap::new(),
        }
    }

    /// Segment `segment`'s file, opened (with O_DIRECT if `direct`) the
    /// first time it is asked for.
    pub fn get(&mut self, segment: u32, direct: bool) -> Result<H> {
        if let Some(f) = self.open.get(&segment) {
            return Ok(f.clone());
        }
        let path = self.ds.segment_path(segment);
        let file = (self.wrap)(open_segment(&path, direct, &self.stats)?);
        self.open.insert(segment, file.clone());
        Ok(file)
    }

    /// Closes `segment`'s file (once reads in flight let go of it): the next
    /// [`get`](Self::get) opens it again, e.g. without O_DIRECT.
    pub fn forget(&mut self, segment: u32) {
        self.open.remove(&segment);
    }
}

/// Opens a segment for reading: refuses anything but a regular file (a FIFO
/// would block every read), tries O_DIRECT first when asked and falls back,
/// with one warning, where the filesystem refuses it. Never blocks on open
/// (O_NONBLOCK, which regular files ignore).
fn open_segment(path: &Path, direct: bool, stats: &EngineStats) -> Result<std::fs::File> {
    let open = |flags: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | flags)
            .open(path)
    };
    let direct = direct && !stats.buffered_fallback.load(Ordering::Relaxed);
    let (file, refused) = if direct {
        match open(libc::O_DIRECT) {
            Ok(f) => (f, false),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0).map_err(|e| Error::io(path, e))?, true),
            Err(e) => return Err(Error::io(path, e)),
        }
    } else {
        (open(0).map_err(|e| Error::io(path, e))?, false)
    };
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.file_type().is_file() {
        let kind = if meta.file_type().is_fifo() {
            "a FIFO"
        } else if meta.is_dir() {
            "a directory"
        } else if meta.file_type().is_socket() {
            "a socket"
        } else {
            "a device or special file"
        };
        return Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("segment is {kind}, not a regular file"),
            ),
        ));
    }
    if refused {
        fall_back(path, stats);
    }
    Ok(file)
}

/// Records (once, with a warning) that O_DIRECT was refused for `path`.
pub(crate) fn fall_back(path: &Path, stats: &EngineStats) {
    if !stats.buffered_fallback.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{}: O_DIRECT refused by the filesystem; using buffered reads",
            path.display()
        );
    }
}
