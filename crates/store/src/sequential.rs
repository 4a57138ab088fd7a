//! Objects read whole and in order: a pack's inputs in a store
//! (`brand pack --from tar s3://bucket/shards/`). [`Objects`] lists a
//! bucket and HEADs its objects; [`ObjectReader`] is `std::io::Read` over
//! one object, fed by large ranged GETs ([`ReadAhead`]: 8 MiB, 4 in flight
//! ahead of the reader, so the link stays busy while the caller parses)
//! through [`get::get_into`]: retries, stall timeout, resumed bodies, and
//! every GET pinned with `If-Match` to the entity tag the object was
//! listed (or HEADed) with, so an object replaced while it is read is an
//! error naming it, never a mix of two versions. A reader never goes back:
//! a caller that needs random access spools what it reads.

use std::io;
use std::sync::Arc;

use brand_format::error::{Error, Result};
use futures_util::StreamExt;

use crate::connect::Connection;
use crate::get::{self, GetCounters, GetPolicy, GetReport};
use crate::limiter::Limiter;
use crate::location::ObjectUrl;
use crate::runtime::IoRuntime;

/// How an [`ObjectReader`] reads ahead.
#[derive(Debug, Clone, Copy)]
pub struct ReadAhead {
    /// Bytes per ranged GET (AWS's guidance for large objects: 8–16 MiB).
    pub get_bytes: u64,
    /// GETs in flight ahead of the reader; at most this many pieces of
    /// `get_bytes`, plus one waiting and the one being read, are held in
    /// memory (48 MiB by default).
    pub gets_ahead: usize,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead {
            get_bytes: 8 << 20,
            gets_ahead: 4,
        }
    }
}

/// One object of a listing: its key in the bucket, size and entity tag
/// (None when the listing gave none: it is HEADed before it is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub e_tag: Option<String>,
}

impl ObjectInfo {
    /// The last part of the key (a file's name).
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }
}

/// A bucket (or host) to list and read objects of, with the runtime its
/// requests run on.
pub struct Objects {
    /// Its URL's prefix is empty: objects are named by their whole key.
    conn: Connection,
    rt: Arc<IoRuntime>,
    policy: GetPolicy,
    read_ahead: ReadAhead,
    counters: GetCounters,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Objects({})", self.conn.url.root)
    }
}

impl Objects {
    /// The store of `url` (its bucket), with credentials from the
    /// environment (see [`Connection`]), its requests under `policy`.
    /// Nothing is sent yet.
    pub fn connect(url: &ObjectUrl, policy: &GetPolicy) -> Result<Objects> {
        let conn = Connection::new(&root_of(url), policy.stall)?;
        Self::with_connection(conn, policy.clone(), ReadAhead::default())
    }

    /// Over a connection made by the caller (tests: the environment is
    /// shared by the threads of a test process).
    pub fn with_connection(mut conn: Connection, policy: GetPolicy, read_ahead: ReadAhead) -> Result<Objects> {
        conn.url = root_of(&conn.url);
        Ok(Objects {
            conn,
            rt: Arc::new(IoRuntime::new(2)?),
            policy,
            read_ahead: ReadAhead {
                get_bytes: read_ahead.get_bytes.max(1),
                gets_ahead: read_ahead.gets_ahead.max(1),
            },
            counters: GetCounters::default(),
        })
    }

    /// The URL of object `key` (for messages).
    pub fn url_of(&self, key: &str) -> String {
        self.conn.url.object_url(key)
    }

    /// The object at `key`, or None if there is none (a HEAD; a missing
    /// bucket is None too: the listing that follows names it).
    pub fn head(&self, key: &str) -> Result<Option<ObjectInfo>> {
        match self
            .rt
            .block_on(get::head(&self.conn, key, &self.policy, &self.counters))
        {
            Ok(meta) => Ok(Some(ObjectInfo {
                key: key.to_string(),
                size: meta.size,
                e_tag: meta.e_tag,
            })),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The objects under the prefix `prefix` (a key prefix without its
    /// trailing `/`; empty: the whole bucket) sorted by key, and the
    /// prefixes one level down: with `recursive`, every object below and
    /// no prefixes. A missing bucket is an error naming it.
    pub fn list(&self, prefix: &str, recursive: bool) -> Result<(Vec<ObjectInfo>, Vec<String>)> {
        let (metas, prefixes) =
            self.rt
                .block_on(get::list(&self.conn, prefix, recursive, &self.policy, &self.counters))?;
        let mut objects: Vec<ObjectInfo> = metas
            .into_iter()
            .map(|m| ObjectInfo {
                key: m.location.as_ref().to_string(),
                size: m.size,
                e_tag: m.e_tag,
            })
            .collect();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((objects, prefixes))
    }

    /// A reader of `object` from its first byte to its last; its GETs start
    /// at once.
    pub fn reader(&self, object: &ObjectInfo) -> ObjectReader {
        ObjectReader::start(self, object)
    }

    /// What the listings and HEADs of this store did (the readers count
    /// their own GETs: [`ObjectReader::report`]).
    pub fn report(&self) -> GetReport {
        self.counters.report(None)
    }
}

/// `url` without its prefix: the bucket's root.
fn root_of(url: &ObjectUrl) -> ObjectUrl {
    ObjectUrl {
        prefix: String::new(),
        ..url.clone()
    }
}

/// One piece of the object, or why it could not be read.
type Piece = std::result::Result<Vec<u8>, (io::ErrorKind, String)>;

/// `std::io::Read` over one object, in order, from large ranged GETs made
/// ahead of the reads on the store's runtime. An error (after the GET's
/// retries) names the byte range and the cause; the reader then returns it
/// on every read. Dropping the reader stops its GETs.
pub struct ObjectReader {
    url: String,
    size: u64,
    pieces: tokio::sync::mpsc::Receiver<Piece>,
    piece: Vec<u8>,
    at: usize,
    /// Bytes not yet handed to the caller.
    left: u64,
    failed: Option<(io::ErrorKind, String)>,
    task: tokio::task::JoinHandle<()>,
    counters: Arc<GetCounters>,
    /// Keeps the runtime the GETs run on.
    _rt: Arc<IoRuntime>,
}

impl ObjectReader {
    fn start(objects: &Objects, object: &ObjectInfo) -> ObjectReader {
        let ahead = objects.read_ahead.gets_ahead;
        // Pieces fetched and not yet read wait here; with the GETs in
        // flight, at most `ahead` pieces are held.
        let (tx, pieces) = tokio::sync::mpsc::channel::<Piece>(1);
        let counters = Arc::new(GetCounters::default());
        let task = {
            let conn = objects.conn.clone();
            let policy = objects.policy.clone();
            let counters = Arc::clone(&counters);
            let object = object.clone();
            let get_bytes = objects.read_ahead.get_bytes;
            objects.rt.handle().spawn(async move {
                let limiter = Arc::new(Limiter::new(ahead));
                let fetched = fetch(&conn, &object, &policy, &counters, &limiter, get_bytes, ahead, &tx).await;
                if let Err(e) = fetched {
                    let _ = tx.send(Err(e)).await;
                }
            })
        };
        ObjectReader {
            url: objects.url_of(&object.key),
            size: object.size,
            pieces,
            piece: Vec::new(),
            at: 0,
            left: object.size,
            failed: None,
            task,
            counters,
            _rt: Arc::clone(&objects.rt),
        }
    }

    /// The object's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its size as listed.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// What this reader's requests did so far (GETs, bytes, retries).
    pub fn report(&self) -> GetReport {
        self.counters.report(None)
    }
}

/// The object's GETs, in order, `ahead` at a time, each piece sent as it
/// completes in turn. A HEAD first when the listing gave no entity tag.
#[allow(clippy::too_many_arguments)]
async fn fetch(
    conn: &Connection,
    object: &ObjectInfo,
    policy: &GetPolicy,
    counters: &GetCounters,
    limiter: &Arc<Limiter>,
    get_bytes: u64,
    ahead: usize,
    tx: &tokio::sync::mpsc::Sender<Piece>,
) -> std::result::Result<(), (io::ErrorKind, String)> {
    let failed = |e: Error, range: Option<&std::ops::Range<u64>>| match e {
        Error::Io { source, .. }
            if source.kind() == io::ErrorKind::InvalidData && source.to_string().contains("entity tag") =>
        {
            (
                io::ErrorKind::InvalidData,
                format!(
                    "{}the object was replaced while it was read (its entity tag is no longer the one it was listed with)",
                    range
                        .map(|r| format!("bytes {}..{}: ", r.start, r.end))
                        .unwrap_or_default()
                ),
            )
        }
        Error::Io { source, .. } => (source.kind(), source.to_string()),
        e => (io::ErrorKind::Other, e.to_string()),
    };
    if object.size == 0 {
        return Ok(());
    }
    let e_tag = match &object.e_tag {
        Some(t) => Some(t.clone()),
        None => {
            let meta = get::head(conn, &object.key, policy, counters)
                .await
                .map_err(|e| failed(e, None))?;
            if meta.size != object.size {
                return Err((
                    io::ErrorKind::InvalidData,
                    format!(
                        "the object has {} bytes now, {} when it was listed: it was replaced",
                        meta.size, object.size
                    ),
                ));
            }
            meta.e_tag
        }
    };
    let ranges = (0..object.size.div_ceil(get_bytes)).map(|i| i * get_bytes..((i + 1) * get_bytes).min(object.size));
    let e_tag = e_tag.as_deref();
    let mut pieces = futures_util::stream::iter(ranges)
        .map(|range| async move {
            let _permit = limiter.acquire().await;
            let mut buf = vec![0u8; (range.end - range.start) as usize];
            get::get_into(
                conn,
                &object.key,
                range.clone(),
                e_tag,
                &mut buf,
                policy,
                counters,
                limiter,
            )
            .await
            .map(|()| buf)
            .map_err(|e| failed(e, Some(&range)))
        })
        .buffered(ahead);
    while let Some(piece) = pieces.next().await {
        let piece = piece?;
        if tx.send(Ok(piece)).await.is_err() {
            // The reader is gone.
            return Ok(());
        }
    }
    Ok(())
}

impl io::Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.at == self.piece.len() {
            if let Some((kind, what)) = &self.failed {
                return Err(io::Error::new(*kind, what.clone()));
            }
            if self.left == 0 {
                return Ok(0);
            }
            let got = match self.pieces.blocking_recv() {
                Some(Ok(piece)) => Ok(piece),
                Some(Err(e)) => Err(e),
                None => Err((
                    io::ErrorKind::Other,
                    format!("the reads stopped at byte {}", self.size - self.left),
                )),
            };
            match got {
                Ok(piece) => {
                    self.left = self.left.saturating_sub(piece.len() as u64);
                    self.piece = piece;
                    self.at = 0;
                }
                Err(e) => self.failed = Some(e),
            }
        }
        let n = buf.len().min(self.piece.len() - self.at);
        buf[..n].copy_from_slice(&self.piece[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Drop for ObjectReader {
    fn drop(&mut self) {
        // GETs still in flight (read ahead of a caller that stopped early)
        // are not waited for.
        self.task.abort();
        let r = self.counters.report(None);
        tracing::info!(
            "{}: {} requests, {:.1} MiB, {} retries",
            self.url,
            r.requests,
            r.bytes as f64 / f64::from(1 << 20),
            r.retries
        );
    }
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectReader({})", self.url)
    }
}
