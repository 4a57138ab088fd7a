//! A packed dataset written to object storage (`brand pack … -o s3://…`):
//! segments first (multipart, `PART_BYTES` parts, several at once), then
//! `index.bin`, then `manifest.toml` last: the manifest is the commit point,
//! so a prefix without it is no dataset (`open` says so), and an upload
//! cut short leaves none. `--force` takes the old manifest away first (the
//! old dataset stops being one before any of its objects is replaced: a
//! reader still reading it gets its objects' changed entity tags as an
//! error, never a mix), and removes old segments the new dataset does not
//! have once the new manifest is in place.

use std::path::Path;
use std::time::Duration;

use brand_format::error::{Error, Result};
use brand_format::manifest::Manifest;
use brand_format::{INDEX_FILE, MANIFEST_FILE};
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};

use crate::connect::{Connection, redact};
use crate::location::ObjectUrl;
use crate::runtime::IoRuntime;

/// Multipart part size: AWS's 8–16 MiB guidance (and above S3's 5 MiB minimum).
pub const PART_BYTES: usize = 8 << 20;
/// Parts of one object in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// Uploads the dataset in the local directory `dir` to `url`; `progress`
/// gets (bytes uploaded, bytes in all). A dataset already at `url` is an
/// error unless `force`.
pub fn upload_dataset(dir: &Path, url: &ObjectUrl, force: bool, progress: &dyn Fn(u64, u64)) -> Result<()> {
    let manifest = Manifest::load(&dir.join(MANIFEST_FILE))?;
    let rt = IoRuntime::new(2)?;
    let conn = Connection::for_upload(url, Duration::from_secs(30))?;
    let fail = |name: &str, what: String| Error::io(url.object_url(name), std::io::Error::other(what));
    rt.block_on(async {
        let manifest_path = url.object(MANIFEST_FILE);
        let old = match conn.store.head(&manifest_path).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => return Err(fail(MANIFEST_FILE, redact(&e.to_string()))),
        };
        if old && !force {
            return Err(Error::config(format!(
                "{url} already holds a dataset (use --force to replace it)"
            )));
        }
        let old_segments = if old {
            let names = old_segment_names(&conn).await;
            conn.store
                .delete(&manifest_path)
                .await
                .map_err(|e| fail(MANIFEST_FILE, redact(&e.to_string())))?;
            names
        } else {
            Vec::new()
        };
        let mut files: Vec<String> = manifest.segments.iter().map(|s| s.name.clone()).collect();
        files.push(INDEX_FILE.to_string());
        let total: u64 = files
            .iter()
            .map(|f| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len()))
            .sum();
        let mut sent = 0u64;
        for name in &files {
            sent += upload_file(&conn, &dir.join(name), url, name).await?;
            progress(sent, total);
        }
        let text = manifest.to_toml();
        conn.store
            .put(&manifest_path, PutPayload::from(text.into_bytes()))
            .await
            .map_err(|e| fail(MANIFEST_FILE, redact(&e.to_string())))?;
        for stale in old_segments.iter().filter(|n| !files.contains(n)) {
            if let Err(e) = conn.store.delete(&url.object(stale)).await {
                tracing::warn!("{}: not removed: {}", url.object_url(stale), redact(&e.to_string()));
            }
        }
        Ok(())
    })
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

/// One local file to object `name`: one PUT when it fits a part, else a
/// multipart upload (aborted on an error, so no parts are left billed).
async fn upload_file(conn: &Connection, path: &Path, url: &ObjectUrl, name: &str) -> Result<u64> {
    use std::io::Read;
    let fail = |what: String| Error::io(url.object_url(name), std::io::Error::other(what));
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let object = url.object(name);
    if len as usize <= PART_BYTES {
        let mut bytes = Vec::with_capacity(len as usize);
        file.read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
        conn.store
            .put(&object, PutPayload::from(bytes))
            .await
            .map_err(|e| fail(redact(&e.to_string())))?;
        return Ok(len);
    }
    let upload = conn
        .store
        .put_multipart(&object)
        .await
        .map_err(|e| fail(redact(&e.to_string())))?;
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
            return Err(fail(redact(&e.to_string())));
        }
        writer.write(&buf[..n]);
        sent += n as u64;
    }
    writer.finish().await.map_err(|e| fail(redact(&e.to_string())))?;
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
