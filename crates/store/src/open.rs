//! A dataset from a path or a URL. A URL's dataset is its `manifest.toml`
//! and `index.bin` fetched, and every segment object's entity tag and size
//! taken (HEAD) and checked against the manifest: reads are pinned to them.

use std::path::{Path, PathBuf};

use brand_format::MANIFEST_FILE;
use brand_format::dataset::{Dataset, ObjectVersion, Origin};
use brand_format::error::{Error, Result};
use brand_format::manifest::Manifest;

use crate::connect::Connection;
use crate::get::{self, GetCounters, GetPolicy};
use crate::limiter::Limiter;
use crate::location::{Location, ObjectUrl, Scheme};
use crate::runtime::IoRuntime;
use object_store::ObjectMeta;

/// Opens the whole dataset at `location` (a path or a URL); a partition is
/// refused as [`Dataset::open`] refuses it.
pub fn open(location: impl AsRef<Path>) -> Result<Dataset> {
    open_with(location, &GetPolicy::default())
}

/// [`open`], a URL's requests under `policy` (the reader's: its
/// `stall_timeout` and retries).
pub fn open_with(location: impl AsRef<Path>, policy: &GetPolicy) -> Result<Dataset> {
    match Location::of_path(location.as_ref())? {
        Location::Dir(d) => Dataset::open(d),
        Location::Url(u) => {
            let ds = open_url(&u, policy)?;
            if ds.manifest.partition.is_some() {
                return Err(Error::config(format!(
                    "{u}: a partition (brand pack --partitions): serve it with `brand serve`"
                )));
            }
            Ok(ds)
        }
    }
}

/// Opens a whole dataset or one partition (as [`Dataset::open_any`]).
pub fn open_any(location: impl AsRef<Path>) -> Result<Dataset> {
    open_any_with(location, &GetPolicy::default())
}

/// [`open_any`], a URL's requests under `policy`.
pub fn open_any_with(location: impl AsRef<Path>, policy: &GetPolicy) -> Result<Dataset> {
    match Location::of_path(location.as_ref())? {
        Location::Dir(d) => Dataset::open_any(d),
        Location::Url(u) => open_url(&u, policy),
    }
}

/// Most HEADs of segment objects in flight at open.
const HEADS_IN_FLIGHT: usize = 16;

/// Above this many segments, their sizes and entity tags come from a
/// listing of the prefix (a request per 1,000 objects), not a HEAD each: a
/// dataset of 25,000 segments opened by every rank and DataLoader worker
/// would send bursts of HEADs a store throttles (S3: 5,500 a second per
/// prefix), and take a round trip per 16 segments to open.
const LIST_ABOVE: usize = HEADS_IN_FLIGHT;

/// The dataset under `url`: manifest, index and every segment's version.
pub fn open_url(url: &ObjectUrl, policy: &GetPolicy) -> Result<Dataset> {
    let rt = IoRuntime::new(1)?;
    let conn = Connection::new(url, policy.stall)?;
    let counters = GetCounters::default();
    let limiter = std::sync::Arc::new(Limiter::new(HEADS_IN_FLIGHT));
    rt.block_on(async {
        let manifest_url = PathBuf::from(url.object_url(MANIFEST_FILE));
        let bytes = match get::get_whole(&conn, MANIFEST_FILE, policy, &counters, &limiter).await {
            Ok((bytes, _)) => bytes,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(missing(&conn).await);
            }
            // S3 refuses a missing key with 403, not 404, to credentials
            // that may not list the bucket, and a HEAD's 403 has no body to
            // tell it from refused credentials: a mistyped prefix would
            // look like refused credentials.
            Err(Error::Io { path, source })
                if source.kind() == std::io::ErrorKind::PermissionDenied && url.scheme == Scheme::S3 =>
            {
                let why = format!(
                    "{source}; S3 answers so for a missing {MANIFEST_FILE} too when the credentials may not \
                     list the bucket: check the URL"
                );
                return Err(Error::io(path, std::io::Error::new(source.kind(), why)));
            }
            Err(e) => return Err(e),
        };
        let manifest = Manifest::from_bytes(bytes, &manifest_url)?;
        let index = crate::index_cache::index(&conn, policy, &counters, &limiter).await?;
        let metas = segment_metas(&conn, &manifest, policy, &counters).await?;
        let mut versions = Vec::with_capacity(metas.len());
        for (seg, meta) in manifest.segments.iter().zip(metas) {
            // A partition's store holds only its own segments.
            let Some(meta) = meta else {
                versions.push(ObjectVersion { e_tag: None, size: 0 });
                continue;
            };
            if meta.size != seg.bytes {
                return Err(Error::format(
                    url.object_url(&seg.name),
                    meta.size,
                    format!(
                        "the object has {} bytes, {MANIFEST_FILE} says {}: truncated or from another dataset",
                        meta.size, seg.bytes
                    ),
                ));
            }
            versions.push(ObjectVersion {
                e_tag: meta.e_tag,
                size: meta.size,
            });
        }
        Dataset::from_parts(PathBuf::from(url.url()), manifest, index, Origin::Objects(versions))
    })
}

/// Each segment's object (size, entity tag), in the manifest's order;
/// `None` for one a partition's store does not hold. Listed when there are
/// many (see [`LIST_ABOVE`]), else, or where a listing is refused (a
/// credential may read objects without listing them) or its entity tags
/// differ from a HEAD's, a HEAD each, [`HEADS_IN_FLIGHT`] at a time.
async fn segment_metas(
    conn: &Connection,
    manifest: &Manifest,
    policy: &GetPolicy,
    counters: &GetCounters,
) -> Result<Vec<Option<ObjectMeta>>> {
    use futures_util::StreamExt;
    let names: Vec<&str> = manifest.segments.iter().map(|s| s.name.as_str()).collect();
    let listed = if names.len() > LIST_ABOVE {
        listed_metas(conn, &names, policy, counters).await
    } else {
        None
    };
    let trusted = listed.is_some();
    let mut metas = listed.unwrap_or_else(|| vec![None; names.len()]);
    // A listing is consistent (S3, GCS, Azure): what it lacks is absent,
    // which a partition's store may be; a whole dataset's HEAD names it.
    let to_head: Vec<usize> = (0..names.len())
        .filter(|&i| metas[i].is_none() && !(trusted && manifest.partition.is_some()))
        .collect();
    let mut heads = futures_util::stream::iter(to_head)
        .map(|i| {
            let name = names[i];
            async move { (i, get::head(conn, name, policy, counters).await) }
        })
        .buffer_unordered(HEADS_IN_FLIGHT);
    while let Some((i, head)) = heads.next().await {
        match head {
            Ok(m) => metas[i] = Some(m),
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound && manifest.partition.is_some() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(metas)
}

/// The segments' objects from a listing of the dataset's prefix, if it is
/// allowed and its entity tags are those a HEAD (and `If-Match`) sees:
/// checked on one segment, for stores whose listings spell them otherwise.
async fn listed_metas(
    conn: &Connection,
    names: &[&str],
    policy: &GetPolicy,
    counters: &GetCounters,
) -> Option<Vec<Option<ObjectMeta>>> {
    let (objects, _) = match get::list(conn, &conn.url.prefix, false, policy, counters).await {
        Ok(l) => l,
        Err(e) => {
            tracing::info!("{}: listing refused ({e}); a HEAD per segment instead", conn.url);
            return None;
        }
    };
    let mut by_name: std::collections::HashMap<String, ObjectMeta> = objects
        .into_iter()
        .filter_map(|m| Some((m.location.filename()?.to_string(), m)))
        .collect();
    let mut metas: Vec<Option<ObjectMeta>> = names.iter().map(|n| by_name.remove(*n)).collect();
    // Every GET is pinned to its segment's tag: a listing without them is no use.
    if metas.iter().flatten().any(|m| m.e_tag.is_none()) {
        tracing::info!(
            "{}: the listing gives no entity tags; a HEAD per segment instead",
            conn.url
        );
        return None;
    }
    let (i, listed) = metas.iter().enumerate().find_map(|(i, m)| Some((i, m.as_ref()?)))?;
    let head = get::head(conn, names[i], policy, counters).await.ok()?;
    let bare = |m: &ObjectMeta| m.e_tag.as_deref().map(|t| t.trim_matches('"').to_string());
    let Some(like) = head
        .e_tag
        .as_deref()
        .filter(|_| bare(&head) == bare(listed) && head.size == listed.size)
    else {
        tracing::info!(
            "{}: the listing's entity tag and size of {} ({:?}, {}) are not a HEAD's ({:?}, {}); a HEAD per segment instead",
            conn.url,
            names[i],
            listed.e_tag,
            listed.size,
            head.e_tag,
            head.size
        );
        return None;
    };
    // The tags as a HEAD spells them, for If-Match: Azure lists them bare
    // and quotes them in a HEAD's ETag.
    for m in metas.iter_mut().flatten() {
        m.e_tag = m.e_tag.take().map(|t| spelled_like(&t, like));
    }
    Some(metas)
}

/// Entity tag `tag` quoted as `like` is (or bare, as it is).
fn spelled_like(tag: &str, like: &str) -> String {
    let bare = tag.trim_matches('"');
    if like.starts_with('"') {
        format!("\"{bare}\"")
    } else {
        bare.to_string()
    }
}

/// Why there is no manifest under the URL: no bucket, nothing under the
/// prefix, or objects that are not a dataset (a HEAD's 404 has no body to
/// tell which; a listing does).
async fn missing(conn: &Connection) -> Error {
    use std::io::ErrorKind::NotFound;
    let url = &conn.url;
    let prefix = (!url.prefix.is_empty()).then(|| object_store::path::Path::from(url.prefix.as_str()));
    let what = match conn.store.list_with_delimiter(prefix.as_ref()).await {
        Err(e) if e.to_string().contains("NoSuchBucket") => format!("the bucket {} does not exist", url.bucket()),
        Err(e) => format!(
            "no {MANIFEST_FILE} here, and listing the prefix failed: {}",
            crate::get::describe(&e)
        ),
        Ok(l) if l.objects.is_empty() && l.common_prefixes.is_empty() => {
            "nothing under this prefix (no such dataset)".to_string()
        }
        Ok(l) => format!(
            "not a dataset: no {MANIFEST_FILE} under this prefix ({} objects and {} prefixes there)",
            l.objects.len(),
            l.common_prefixes.len()
        ),
    };
    Error::io(url.url(), std::io::Error::new(NotFound, what))
}

/// One sample of a dataset in object storage, fetched (one ranged GET of
/// its record, pinned to the segment's version, under `policy`) and
/// decoded: `brand cat`.
pub fn read_sample(ds: &Dataset, id: u64, policy: &GetPolicy) -> Result<Vec<u8>> {
    if !matches!(ds.origin, Origin::Objects(_)) {
        return ds.read_sample(id);
    }
    if id >= ds.index.samples() {
        return Err(Error::config(format!(
            "sample {id} out of range: the dataset has {}",
            ds.index.samples()
        )));
    }
    let (segment, offset, len) = ds.index.record_location(id);
    let fetch = Fetch {
        tag: id,
        segment,
        range: offset..offset + u64::from(len),
    };
    let mut sample = Err(Error::config(format!("sample {id}: not fetched")));
    fetch_checked(ds, vec![fetch], 1, policy, &mut |_, bytes, again| {
        sample = bytes.and_then(|buf| ds.decode(id, &buf, true).map(|b| b.to_vec()));
        let damaged = matches!(sample, Err(Error::Corrupt { .. }));
        damaged && !again
    })?;
    sample
}

/// Chunks fetched at once by [`for_each_chunk`].
const CHUNKS_IN_FLIGHT: usize = 16;

/// Each chunk of `chunks` of a dataset in object storage, whole (its padded
/// length, one ranged GET pinned to the segment's version, under
/// `policy`), handed to `each` as it arrives, many in flight: `brand
/// verify`. `each(chunk, bytes, again)` returns whether the bytes were
/// damaged (see [`fetch_checked`]).
pub fn for_each_chunk(
    ds: &Dataset,
    chunks: &[u64],
    policy: &GetPolicy,
    each: &mut dyn FnMut(u64, Result<Vec<u8>>, bool) -> bool,
) -> Result<()> {
    let fetches = chunks
        .iter()
        .map(|&c| {
            let loc = ds.index.chunk(c);
            Fetch {
                tag: c,
                segment: loc.segment,
                range: loc.offset..loc.offset + ds.index.chunk_padded_len(c),
            }
        })
        .collect();
    fetch_checked(ds, fetches, CHUNKS_IN_FLIGHT, policy, each)
}

/// Bytes of one segment object to fetch, `tag` naming them to the caller.
struct Fetch {
    tag: u64,
    segment: u32,
    range: std::ops::Range<u64>,
}

/// `fetches` of a dataset in object storage, `in_flight` at once, each
/// handed to `check(tag, bytes, again)` as it arrives. Bytes that `check`
/// finds damaged (it returns true) are fetched once more and handed to it
/// again with `again` set, and that answer is final: damage may be the
/// network's; damaged twice, it is the object's. (The loader's engine
/// applies the same rule to the reads of a GET, `brand_io::objects`.)
fn fetch_checked(
    ds: &Dataset,
    fetches: Vec<Fetch>,
    in_flight: usize,
    policy: &GetPolicy,
    check: &mut dyn FnMut(u64, Result<Vec<u8>>, bool) -> bool,
) -> Result<()> {
    use futures_util::StreamExt;
    let (Origin::Objects(versions), Location::Url(url)) = (&ds.origin, Location::of_path(ds.dir())?) else {
        return Err(Error::config(format!("{}: not in object storage", ds.dir().display())));
    };
    let rt = IoRuntime::new(in_flight.min(2))?;
    let conn = Connection::new(&url, policy.stall)?;
    let (counters, limiter) = (GetCounters::default(), Limiter::new(in_flight));
    let get = |f: &Fetch| {
        let name = &ds.manifest.segments[f.segment as usize].name;
        let e_tag = versions.get(f.segment as usize).and_then(|v| v.e_tag.as_deref());
        let (conn, counters, limiter, range, tag) = (&conn, &counters, &limiter, f.range.clone(), f.tag);
        // buffer_unordered below bounds the GETs in flight.
        async move {
            let mut buf = vec![0u8; (range.end - range.start) as usize];
            let r = get::get_into(conn, name, range, e_tag, &mut buf, policy, counters, limiter).await;
            (tag, r.map(|()| buf))
        }
    };
    let mut damaged = std::collections::HashSet::new();
    for again in [false, true] {
        let round: Vec<&Fetch> = match again {
            false => fetches.iter().collect(),
            true => fetches.iter().filter(|f| damaged.contains(&f.tag)).collect(),
        };
        if round.is_empty() {
            break;
        }
        rt.block_on(async {
            let mut arrivals = futures_util::stream::iter(round.into_iter().map(get)).buffer_unordered(in_flight);
            while let Some((tag, r)) = arrivals.next().await {
                if check(tag, r, again) && !again {
                    damaged.insert(tag);
                }
            }
        });
    }
    Ok(())
}
