//! A dataset's index from a store, kept in a local file and mapped: every
//! process on the machine that opens the dataset shares one copy in the
//! page cache (as it does a local dataset's `index.bin`), and a later open
//! of the same version fetches nothing but a HEAD.
//!
//! The file is named by the URL and the index object's entity tag and size,
//! so a replaced index is a new file, never a stale one. It goes to
//! `$BRAND_INDEX_CACHE`, else `$XDG_CACHE_HOME/brand/index`, else
//! `~/.cache/brand/index`; written to a temporary name and renamed, so a
//! reader never maps half a file. Where none can be written, the index is
//! held on the heap (and `index_heap_bytes` says so). A lock file beside it
//! makes one process of the machine fetch a version while the others wait.
//! A fetch removes the dataset's other versions that nobody is fetching (a
//! process that mapped one keeps its mapping), so a dataset packed again
//! does not leave its old index behind on every machine that read it.

use std::path::{Path, PathBuf};

use brand_format::INDEX_FILE;
use brand_format::error::Result;
use brand_format::index::Index;
use brand_format::mapped::MappedMut;

use crate::connect::Connection;
use crate::get::{self, GetCounters, GetPolicy};
use crate::limiter::Limiter;

/// Where fetched indexes are kept (None: nowhere writable is known).
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("BRAND_INDEX_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("brand/index")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/brand/index")))
}

/// The file name of one version of one dataset's index: the dataset's
/// part (8 hex digits) then the version's.
fn file_name(url: &str, e_tag: Option<&str>, size: u64) -> String {
    let a = crc32c::crc32c(url.as_bytes());
    let b = crc32c::crc32c_append(a ^ 0x5bd1_e995, e_tag.unwrap_or("").as_bytes());
    format!("{a:08x}{b:08x}-{size}.index")
}

/// Removes the files of the dataset's versions other than the one to be
/// kept at `path` that nobody is fetching (their lock is free: a process
/// that mapped one keeps its mapping), with their lock and temporary files,
/// and `path`'s temporary files (their writers died: the caller holds
/// `path`'s lock). Best effort: a file that cannot be removed stays.
fn remove_others(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let Some(dataset) = name.get(..8) else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    // Every file of a version: `V`, `.V.lock`, `.V.PID.tmp`.
    let mut versions: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(file) = file.to_str() else { continue };
        let bare = file.strip_prefix('.').unwrap_or(file);
        let Some(end) = bare.find(".index").map(|i| i + ".index".len()) else {
            continue;
        };
        if bare.starts_with(dataset) {
            versions.entry(bare[..end].to_string()).or_default().push(e.path());
        }
    }
    // The version's lock, held while its files go (None: being fetched).
    let free = |version: &str| lock_file(dir, version).ok().filter(|f| f.try_lock().is_ok());
    for (version, files) in versions {
        let own = version == name;
        let held = if own { None } else { free(&version) };
        if !own && held.is_none() {
            continue;
        }
        for f in files {
            if !own || f.to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_file(f);
            }
        }
    }
}

/// The index of the dataset `conn` points at: mapped from the cache when
/// this version is there, else fetched (pinned to the version the HEAD
/// saw), stored and mapped.
pub async fn index(
    conn: &Connection,
    p: &GetPolicy,
    counters: &GetCounters,
    limiter: &std::sync::Arc<Limiter>,
) -> Result<Index> {
    let index_url = PathBuf::from(conn.url.object_url(INDEX_FILE));
    let meta = get::head(conn, INDEX_FILE, p, counters).await?;
    let cached = cache_dir().map(|d| d.join(file_name(&conn.url.url(), meta.e_tag.as_deref(), meta.size)));
    let kept = |path: &Path| Index::load(path).ok().filter(|idx| idx.file_bytes() == meta.size);
    if let Some(idx) = cached.as_deref().and_then(kept) {
        return Ok(idx);
    }
    // One process of the machine fetches a version, the others wait for it
    // and map its file: every rank and DataLoader worker opening a dataset
    // at once would each fetch (and hold) an index of hundreds of MB.
    let _fetching = match &cached {
        Some(path) => lock(path).await,
        None => None,
    };
    if let Some(idx) = cached.as_deref().and_then(kept) {
        return Ok(idx);
    }
    // (An empty object is no index: the parse names it.)
    let Some(path) = cached.filter(|_| meta.size > 0) else {
        return on_heap(conn, &meta, p, counters, limiter).await;
    };
    // Fetched into the file itself (page cache, not heap: an index of
    // hundreds of MB would otherwise be held twice over while it is written).
    let tmp = temporary(&path);
    remove_others(&path);
    let fetched = match allocate(&tmp, meta.size) {
        Ok(mut mapped) => get::get_version(conn, INDEX_FILE, &meta, mapped.bytes_mut(), p, counters, limiter).await,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(
                "{}: cannot keep the index in {} ({e}); holding it in memory",
                index_url.display(),
                path.display()
            );
            return on_heap(conn, &meta, p, counters, limiter).await;
        }
    };
    // Checked before it is kept: a damaged fetch is an error naming the URL.
    let checked = fetched.and_then(|()| Index::load_named(&tmp, &index_url));
    let kept = checked.and_then(|idx| {
        std::fs::rename(&tmp, &path).map_err(|e| brand_format::error::Error::io(&path, e))?;
        Ok(idx)
    });
    if kept.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    kept
}

/// The index fetched onto the heap (where no file can hold it).
async fn on_heap(
    conn: &Connection,
    meta: &object_store::ObjectMeta,
    p: &GetPolicy,
    counters: &GetCounters,
    limiter: &std::sync::Arc<Limiter>,
) -> Result<Index> {
    let index_url = PathBuf::from(conn.url.object_url(INDEX_FILE));
    let bytes = get::get_version_held(conn, INDEX_FILE, meta, p, counters, limiter).await?;
    Index::from_vec(bytes, &index_url)
}

/// A new file at `path` of `len` bytes, allocated and mapped writable.
fn allocate(path: &Path, len: u64) -> std::io::Result<MappedMut> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    MappedMut::allocate(&file, len)
}

/// The temporary name the version kept at `path` is written under (this
/// process's: a dead writer's is removed by the next one).
fn temporary(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    dir.join(format!(".{name}.{}.tmp", std::process::id()))
}

/// The lock of the version kept at `path` (a lock file beside it, locked
/// with `flock`, which a process that dies releases), once this process
/// holds it; `None` where no lock file can be made (then it fetches alone).
async fn lock(path: &Path) -> Option<std::fs::File> {
    let dir = path.parent()?;
    std::fs::create_dir_all(dir).ok()?;
    let file = lock_file(dir, &path.file_name()?.to_string_lossy()).ok()?;
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .ok()?
        .ok()
}

/// The lock file of the version named `version` in `dir`, opened (made if
/// missing, never truncated) but not locked.
fn lock_file(dir: &Path, version: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!(".{version}.lock")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_and_datasets_get_their_own_files() {
        let a = super::file_name("s3://b/ds", Some("\"e1\""), 100);
        assert_ne!(a, super::file_name("s3://b/ds", Some("\"e2\""), 100));
        assert_ne!(a, super::file_name("s3://b/ds2", Some("\"e1\""), 100));
        assert_ne!(a, super::file_name("s3://b/ds", Some("\"e1\""), 101));
        assert_eq!(a, super::file_name("s3://b/ds", Some("\"e1\""), 100));
    }

    #[test]
    fn a_version_kept_removes_the_datasets_others_nobody_fetches_and_dead_writes() {
        let t = tempfile::tempdir().expect("tempdir");
        let kept = super::file_name("s3://b/ds", Some("e2"), 100);
        let old = super::file_name("s3://b/ds", Some("e1"), 90);
        let another = super::file_name("s3://b/other", Some("e1"), 90);
        // A version another process is fetching: its lock held.
        let fetching = super::file_name("s3://b/ds", Some("e3"), 80);
        let lock = std::fs::File::create(t.path().join(format!(".{fetching}.lock"))).expect("lock");
        lock.lock().expect("locked");
        let names = [
            kept.clone(),
            format!(".{kept}.lock"),
            format!(".{kept}.4242.tmp"),
            old.clone(),
            format!(".{old}.lock"),
            format!(".{old}.4243.tmp"),
            fetching.clone(),
            format!(".{fetching}.4244.tmp"),
            another.clone(),
            format!(".{another}.lock"),
            "read-gap.toml".to_string(),
        ];
        for n in &names {
            std::fs::write(t.path().join(n), b"x").expect("write");
        }
        super::remove_others(&t.path().join(&kept));
        let mut left: Vec<String> = std::fs::read_dir(t.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec![
            kept.clone(),
            format!(".{kept}.lock"),
            fetching.clone(),
            format!(".{fetching}.lock"),
            format!(".{fetching}.4244.tmp"),
            another.clone(),
            format!(".{another}.lock"),
            "read-gap.toml".to_string(),
        ];
        want.sort();
        assert_eq!(left, want);
    }
}
