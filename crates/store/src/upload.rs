//! A packed dataset written to object storage (`brand pack … -o s3://…`):
//! segments first (multipart, `PART_BYTES` parts, several at once), then
//! `index.bin`, then `manifest.toml` last: the manifest is the commit point,
//! so a prefix without it is no dataset (`open` says so), and an upload
//! cut short leaves none. `--force` takes the old manifest away first (the
//! old dataset stops being one before any of its objects is replaced: a
//! reader still reading it gets its objects' changed entity tags as an
//! error, never a mix), and removes old segments the new dataset does not
//! have once the new manifest is in place.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use brand_format::error::{Error, Result};
use brand_format::manifest::Manifest;
use brand_format::{INDEX_FILE, MANIFEST_FILE};
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};

use crate::connect::Connection;
use crate::get::{GetPolicy, describe};
use crate::location::ObjectUrl;
use crate::runtime::IoRuntime;

/// Multipart part size: AWS's 8–16 MiB guidance (and above S3's 5 MiB minimum).
pub const PART_BYTES: usize = 8 << 20;
/// Parts of one object in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// A dataset uploaded while it is packed (`brand pack -o URL`): each
/// segment as soon as it is complete, on a thread of its own, then
/// `index.bin` and `manifest.toml` last ([`SegmentUpload::finish`]). With
/// `remove_sent`, each segment's local file is removed once uploaded, so
/// the local disk holds the segment being written and at most two waiting
/// (the packer waits when the upload falls behind), not the dataset.
/// Dropped without `finish` (the pack failed), it stops and deletes the
/// segment objects it uploaded: no manifest was written, so no dataset was
/// either way, and none of its bytes stay billed.
pub struct SegmentUpload {
    url: ObjectUrl,
    remove_sent: bool,
    jobs: Option<mpsc::SyncSender<Job>>,
    worker: Option<std::thread::JoinHandle<()>>,
    state: Arc<Shared>,
}

enum Job {
    /// An open segment file (its path for messages; with `remove_sent` it
    /// is unlinked already, so the packer's later rename of its directory
    /// does not matter), and its object name.
    Segment(std::fs::File, PathBuf, String),
    Finish(PathBuf),
}

#[derive(Default)]
struct Shared {
    /// The worker's first error, kept for the packer's next call.
    failed: Mutex<Option<Error>>,
    finished: AtomicBool,
}

impl SegmentUpload {
    /// Connects, and checks `url` holds no dataset (or, with `force`, takes
    /// the old dataset's manifest away first: it stops being a dataset
    /// before any of its objects is replaced). Requests retry as `policy` says.
    pub fn begin(url: &ObjectUrl, force: bool, remove_sent: bool, policy: &GetPolicy) -> Result<SegmentUpload> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        // Room for two finished segments: the packer writes the third
        // while one uploads and waits only if the upload falls behind.
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(2);
        let state = Arc::new(Shared::default());
        let (u, st, policy) = (url.clone(), Arc::clone(&state), policy.clone());
        let worker = std::thread::Builder::new()
            .name("brand-upload".into())
            .spawn(move || run(&u, force, &policy, &st, &ready_tx, &jobs_rx))
            .map_err(|e| Error::io("<brand-upload thread>", e))?;
        let upload = SegmentUpload {
            url: url.clone(),
            remove_sent,
            jobs: Some(jobs_tx),
            worker: Some(worker),
            state,
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(upload),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(upload.stopped()),
        }
    }

    /// Uploads the finished segment at `path` as object `name` (returns once
    /// it is queued: an error of an earlier upload is returned here).
    pub fn segment(&self, path: &Path, name: &str) -> Result<()> {
        self.check()?;
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        if self.remove_sent {
            // The open file keeps its bytes until the upload closes it.
            std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
        }
        let job = Job::Segment(file, path.to_path_buf(), name.to_string());
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        if !sent {
            self.check()?;
            return Err(self.stopped());
        }
        Ok(())
    }

    /// Waits for the segments, then uploads `dir`'s `index.bin` and its
    /// `manifest.toml` last (the commit point), then removes the segments
    /// of a dataset it replaced that the new one does not have.
    pub fn finish(mut self, dir: &Path) -> Result<()> {
        if let Some(jobs) = self.jobs.take()
            && jobs.send(Job::Finish(dir.to_path_buf())).is_err()
        {
            self.check()?;
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        self.check()?;
        if self.state.finished.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(self.stopped())
        }
    }

    fn check(&self) -> Result<()> {
        match self.state.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn stopped(&self) -> Error {
        Error::io(
            self.url.to_string(),
            std::io::Error::other("the upload stopped before the dataset was complete"),
        )
    }
}

impl Drop for SegmentUpload {
    fn drop(&mut self) {
        // Closing the queue ends the worker; unfinished, it deletes what it
        // uploaded before it returns.
        self.jobs.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The upload thread: connects, checks the URL, then takes segments until
/// told to finish (or until the packer goes away: then it cleans up).
fn run(
    url: &ObjectUrl,
    force: bool,
    policy: &GetPolicy,
    state: &Shared,
    ready: &mpsc::Sender<Result<()>>,
    jobs: &mpsc::Receiver<Job>,
) {
    let started = (|| {
        let rt = IoRuntime::new(2)?;
        let conn = Connection::for_upload(url, policy)?;
        let old = rt.block_on(take_old_manifest(&conn, url, force))?;
        Ok((rt, conn, old))
    })();
    let (rt, conn, old_segments) = match started {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut sent: Vec<String> = Vec::new();
    let outcome: Result<()> = rt.block_on(async {
        while let Ok(job) = jobs.recv() {
            match job {
                Job::Segment(file, path, name) => {
                    upload_file(&conn, file, &path, url, &name).await?;
                    sent.push(name);
                }
                Job::Finish(dir) => {
                    commit(&conn, url, &dir, &old_segments).await?;
                    state.finished.store(true, Ordering::Relaxed);
                    return Ok(());
                }
            }
        }
        Ok(())
    });
    if !state.finished.load(Ordering::Relaxed) {
        // Failed, or the pack stopped: no manifest, so no dataset; remove
        // the segments this upload put there (best effort).
        rt.block_on(async {
            for name in &sent {
                if let Err(e) = conn.store.delete(&url.object(name)).await {
                    tracing::warn!("{}: not removed: {}", url.object_url(name), describe(&e));
                }
            }
        });
    }
    if let Err(e) = outcome {
        *state.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
}

/// Refuses a URL that holds a dataset unless `force`; with `force`, deletes
/// its manifest and returns the segment names it listed.
async fn take_old_manifest(conn: &Connection, url: &ObjectUrl, force: bool) -> Result<Vec<String>> {
    let fail = |name: &str, what: String| Error::io(url.object_url(name), std::io::Error::other(what));
    let manifest_path = url.object(MANIFEST_FILE);
    let old = match conn.store.head(&manifest_path).await {
        Ok(_) => true,
        Err(object_store::Error::NotFound { .. }) => false,
        Err(e) => return Err(fail(MANIFEST_FILE, describe(&e))),
    };
    if old && !force {
        return Err(Error::config(format!(
            "{url} already holds a dataset (use --force to replace it)"
        )));
    }
    if !old {
        return Ok(Vec::new());
    }
    let names = old_segment_names(conn).await;
    conn.store
        .delete(&manifest_path)
        .await
        .map_err(|e| fail(MANIFEST_FILE, describe(&e)))?;
    Ok(names)
}

/// `index.bin`, then `manifest.toml` (the commit point), then the old
/// dataset's segments the new one does not have are removed.
async fn commit(conn: &Connection, url: &ObjectUrl, dir: &Path, old_segments: &[String]) -> Result<()> {
    let fail = |name: &str, what: String| Error::io(url.object_url(name), std::io::Error::other(what));
    let manifest = Manifest::load(&dir.join(MANIFEST_FILE))?;
    let index = dir.join(INDEX_FILE);
    let file = std::fs::File::open(&index).map_err(|e| Error::io(&index, e))?;
    upload_file(conn, file, &index, url, INDEX_FILE).await?;
    conn.store
        .put(
            &url.object(MANIFEST_FILE),
            PutPayload::from(manifest.to_toml().into_bytes()),
        )
        .await
        .map_err(|e| fail(MANIFEST_FILE, describe(&e)))?;
    let kept: Vec<&str> = manifest.segments.iter().map(|s| s.name.as_str()).collect();
    for stale in old_segments.iter().filter(|n| !kept.contains(&n.as_str())) {
        if let Err(e) = conn.store.delete(&url.object(stale)).await {
            tracing::warn!("{}: not removed: {}", url.object_url(stale), describe(&e));
        }
    }
    Ok(())
}

/// The segment names the dataset at the URL's manifest lists (none if it
/// cannot be read: then nothing old is removed).
async fn old_segment_names(conn: &Connection) -> Vec<String> {
    let Ok(r) = conn.store.get(&conn.url.object(MANIFEST_FILE)).await else {
        return Vec::new();
    };
    let Ok(bytes) = r.bytes().await else {
        return Vec::new();
    };
    Manifest::from_bytes(bytes.to_vec(), Path::new(MANIFEST_FILE))
        .map(|m| m.segments.into_iter().map(|s| s.name).collect())
        .unwrap_or_default()
}

/// One local file (opened from `path`) to object `name`: one PUT when it fits a part, else a
/// multipart upload (aborted on an error, so no parts are left billed).
async fn upload_file(
    conn: &Connection,
    mut file: std::fs::File,
    path: &Path,
    url: &ObjectUrl,
    name: &str,
) -> Result<u64> {
    use std::io::Read;
    let fail = |what: String| Error::io(url.object_url(name), std::io::Error::other(what));
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let object = url.object(name);
    if len as usize <= PART_BYTES {
        let mut bytes = Vec::with_capacity(len as usize);
        file.read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
        conn.store
            .put(&object, PutPayload::from(bytes))
            .await
            .map_err(|e| fail(describe(&e)))?;
        return Ok(len);
    }
    let upload = conn
        .store
        .put_multipart(&object)
        .await
        .map_err(|e| fail(describe(&e)))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
    let mut buf = vec![0u8; PART_BYTES];
    let mut sent = 0u64;
    loop {
        let n = match read_full(&mut file, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(Error::io(path, e));
            }
        };
        if n == 0 {
            break;
        }
        if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
            // The writer is spent; its upload is aborted when dropped.
            return Err(fail(describe(&e)));
        }
        writer.write(&buf[..n]);
        sent += n as u64;
    }
    writer.finish().await.map_err(|e| fail(describe(&e)))?;
    if sent != len {
        return Err(Error::io(
            path,
            std::io::Error::other(format!("read {sent} bytes of {len}: the file changed while uploading")),
        ));
    }
    Ok(len)
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut done = 0;
    while done < buf.len() {
        match f.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
