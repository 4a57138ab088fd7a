//! Files that survive a crash once written: what the packer, an import's
//! listing and `brand verify --rebuild-index` write before they rename.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Writes a whole file and makes it durable.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).at(path)?;
    f.write_all(bytes).at(path)?;
    f.sync_all().at(path)
}

/// Makes a directory's entries (a rename, a new file) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).at(dir)?.sync_all().at(dir)
}
