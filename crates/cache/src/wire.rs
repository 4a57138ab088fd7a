//! The messages between a job and the cache, over a Unix stream socket.
//! Each is a frame: `u32` length (of what follows), a `u8` kind, then the
//! fields, little-endian. The job speaks first (`Hello`); the cache answers
//! `Welcome` with its shared memory's descriptor attached, or `Refused`.
//! Then the job asks `Next` and gets a `Batch` (or `Failed`); `Release`
//! tells the cache the job let go of a batch's samples and needs no answer.

use std::io::{self, Read};

use brand_format::Dataset;
use brand_format::ids::IdBits;

pub const MAGIC: [u8; 8] = *b"BRDCACHE";
pub const VERSION: u32 = 2;

/// What a job and its cache must agree on: the dataset, by content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    pub samples: u64,
    pub chunk_size: u32,
    /// crc32c over every record's crc32c, in id order.
    pub content: u32,
    pub pack_seed: u64,
}

impl Digest {
    pub fn of(ds: &Dataset) -> Self {
        let content = ds.index.content_digest();
        Digest {
            samples: ds.index.samples(),
            chunk_size: ds.index.chunk_size(),
            content,
            pack_seed: ds.manifest.pack_seed,
        }
    }

    /// What differs, one phrase each (the job's value first).
    pub fn differences(&self, cache: &Digest) -> Vec<String> {
        let mut d = Vec::new();
        let mut cmp = |what: &str, job: String, ours: String| {
            if job != ours {
                d.push(format!("{what} {job} in the job's, {ours} in the cache's"));
            }
        };
        cmp("samples", self.samples.to_string(), cache.samples.to_string());
        cmp("chunk size", self.chunk_size.to_string(), cache.chunk_size.to_string());
        cmp(
            "content checksum",
            format!("{:08x}", self.content),
            format!("{:08x}", cache.content),
        );
        cmp("pack seed", self.pack_seed.to_string(), cache.pack_seed.to_string());
        d
    }
}

/// A job introducing itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub digest: Digest,
    /// The job's own order: its seed.
    pub seed: u64,
    pub batch_size: u32,
    pub epoch: u64,
    /// Samples of `epoch` the job served already (a resume): the words of
    /// a `brand_format::ids::IdBits` of `samples` bits, or empty for none.
    pub served: Vec<u64>,
}

impl Hello {
    /// The samples the job served already, or why it cannot attach to a
    /// cache of `cache`'s dataset (`cache_name`: which cache, for the
    /// message) whose shared memory is `memory` bytes, a batch of `size`
    /// samples taking about `batch_bytes(size)` of it.
    pub fn check(
        &self,
        cache: &Digest,
        cache_name: &str,
        memory: u64,
        batch_bytes: impl Fn(u64) -> u64,
    ) -> Result<IdBits, String> {
        let diffs = self.digest.differences(cache);
        if !diffs.is_empty() {
            return Err(format!("{cache_name} serves another dataset: {}", diffs.join("; ")));
        }
        // A job counts on to the next epoch at every epoch's end.
        if self.epoch == u64::MAX {
            return Err(format!(
                "epoch {}: the last a count can hold, the job could not start the next",
                self.epoch
            ));
        }
        // No words: none served.
        let n = cache.samples;
        let served = if self.served.is_empty() {
            IdBits::new(n)
        } else {
            IdBits::from_words(self.served.clone(), n).map_err(|e| format!("the served bitmap {e}"))?
        };
        let batch = batch_bytes(self.batch_size as u64);
        if batch.saturating_mul(2) > memory {
            return Err(format!(
                "the cache's memory ({memory} bytes) holds fewer than 2 batches of {} samples (about {batch} bytes each): start the cache with more --memory or use a smaller batch_size",
                self.batch_size
            ));
        }
        Ok(served)
    }
}

/// One sample of a batch: where its bytes are in the shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub id: u32,
    pub offset: u64,
    pub len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToCache {
    Hello(Hello),
    Next,
    Release(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToJob {
    /// Attached; the shared memory (`len` bytes) is the descriptor sent
    /// with this message.
    Welcome {
        memory_len: u64,
    },
    Refused(String),
    Batch {
        epoch: u64,
        samples: Vec<Placed>,
        /// Corrupt records left out of the job's epoch (`on_corrupt =
        /// "skip"`): served as far as its bitmap goes, never handed out.
        skipped: Vec<u32>,
    },
    /// The cache cannot go on for this job (it stopped, or a record is
    /// corrupt): the message says why.
    Failed(String),
}

const HELLO: u8 = 1;
const NEXT: u8 = 2;
const RELEASE: u8 = 3;
const WELCOME: u8 = 10;
const REFUSED: u8 = 11;
const BATCH: u8 = 12;
const FAILED: u8 = 13;

/// The largest frame accepted: a hello with a bitmap of 2^32 samples.
const MAX_FRAME: usize = (1 << 29) + 4096;

/// A hello's fields before its bitmap (magic to the bitmap's word count).
const HELLO_FIXED: usize = 8 + 4 + 8 + 4 + 4 + 8 + 8 + 4 + 8 + 8;

/// The largest frame a cache of a dataset of `samples` samples reads
/// first: a hello with a bitmap of every sample, with room to spare (twice
/// the bitmap and 1 KiB), so that a bitmap of the wrong size is refused
/// saying so, and one far past it by its length alone.
pub fn hello_frame_max(samples: u64) -> usize {
    let words = usize::try_from(samples.div_ceil(64)).unwrap_or(usize::MAX);
    words
        .saturating_mul(16)
        .saturating_add(1 + HELLO_FIXED + 1024)
        .min(MAX_FRAME)
}

/// The largest frame of `kind` a job attached with `batch_size` sends
/// afterwards, or what is wrong with a frame of that kind: a request is its
/// kind alone, a release the ids of one batch (at most `batch_size`
/// samples, and at most the dataset's `samples`); a job says hello once.
pub fn attached_frame_max(samples: u64, batch_size: u32, kind: u8) -> Result<usize, String> {
    match kind {
        NEXT => Ok(1),
        RELEASE => {
            let ids = usize::try_from((batch_size.max(1) as u64).min(samples)).unwrap_or(usize::MAX);
            Ok(ids.saturating_mul(4).saturating_add(1).min(MAX_FRAME))
        }
        HELLO => Err("a second hello (it is attached already)".into()),
        k => Err(format!("a message of unknown kind {k}")),
    }
}

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + body.len());
    f.extend(((body.len() + 1) as u32).to_le_bytes());
    f.push(kind);
    f.extend(body);
    f
}

impl ToCache {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            ToCache::Hello(h) => {
                b.extend(MAGIC);
                b.extend(VERSION.to_le_bytes());
                b.extend(h.digest.samples.to_le_bytes());
                b.extend(h.digest.chunk_size.to_le_bytes());
                b.extend(h.digest.content.to_le_bytes());
                b.extend(h.digest.pack_seed.to_le_bytes());
                b.extend(h.seed.to_le_bytes());
                b.extend(h.batch_size.to_le_bytes());
                b.extend(h.epoch.to_le_bytes());
                b.extend((h.served.len() as u64).to_le_bytes());
                for w in &h.served {
                    b.extend(w.to_le_bytes());
                }
                frame(HELLO, &b)
            }
            ToCache::Next => frame(NEXT, &b),
            ToCache::Release(ids) => {
                for id in ids {
                    b.extend(id.to_le_bytes());
                }
                frame(RELEASE, &b)
            }
        }
    }

    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, String> {
        let mut r = Fields(body);
        let m = match kind {
            HELLO => {
                if r.take(8)? != MAGIC {
                    return Err("not a brand job (bad magic)".into());
                }
                let version = r.u32()?;
                if version != VERSION {
                    return Err(format!("protocol version {version}, this cache speaks {VERSION}"));
                }
                let digest = Digest {
                    samples: r.u64()?,
                    chunk_size: r.u32()?,
                    content: r.u32()?,
                    pack_seed: r.u64()?,
                };
                let (seed, batch_size, epoch) = (r.u64()?, r.u32()?, r.u64()?);
                let words = r.u64()?;
                if words > (body.len() / 8) as u64 {
                    return Err(format!("a bitmap of {words} words in {} bytes", body.len()));
                }
                let served = (0..words).map(|_| r.u64()).collect::<Result<_, _>>()?;
                ToCache::Hello(Hello {
                    digest,
                    seed,
                    batch_size,
                    epoch,
                    served,
                })
            }
            NEXT => ToCache::Next,
            RELEASE => {
                if !body.len().is_multiple_of(4) {
                    return Err(format!("a release of {} bytes", body.len()));
                }
                let ids = body
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                return Ok(ToCache::Release(ids.collect()));
            }
            k => return Err(format!("unknown message kind {k}")),
        };
        r.end()?;
        Ok(m)
    }
}

impl ToJob {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            ToJob::Welcome { memory_len } => {
                b.extend(memory_len.to_le_bytes());
                frame(WELCOME, &b)
            }
            ToJob::Refused(why) => frame(REFUSED, why.as_bytes()),
            ToJob::Failed(why) => frame(FAILED, why.as_bytes()),
            ToJob::Batch {
                epoch,
                samples,
                skipped,
            } => {
                b.reserve(12 + 4 * skipped.len() + 16 * samples.len());
                b.extend(epoch.to_le_bytes());
                b.extend((skipped.len() as u32).to_le_bytes());
                for id in skipped {
                    b.extend(id.to_le_bytes());
                }
                for s in samples {
                    b.extend(s.id.to_le_bytes());
                    b.extend(s.len.to_le_bytes());
                    b.extend(s.offset.to_le_bytes());
                }
                frame(BATCH, &b)
            }
        }
    }

    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, String> {
        let mut r = Fields(body);
        let m = match kind {
            WELCOME => ToJob::Welcome { memory_len: r.u64()? },
            REFUSED => return Ok(ToJob::Refused(String::from_utf8_lossy(body).into_owned())),
            FAILED => return Ok(ToJob::Failed(String::from_utf8_lossy(body).into_owned())),
            BATCH => {
                let epoch = r.u64()?;
                let count = r.u32()? as usize;
                if count > r.0.len() / 4 {
                    return Err(format!("{count} skipped records in a batch of {} bytes", body.len()));
                }
                let skipped = (0..count).map(|_| r.u32()).collect::<Result<Vec<u32>, String>>()?;
                if !r.0.len().is_multiple_of(16) {
                    return Err(format!("a batch of {} bytes", body.len()));
                }
                let mut samples = Vec::with_capacity(r.0.len() / 16);
                while !r.0.is_empty() {
                    samples.push(Placed {
                        id: r.u32()?,
                        len: r.u32()?,
                        offset: r.u64()?,
                    });
                }
                ToJob::Batch {
                    epoch,
                    samples,
                    skipped,
                }
            }
            k => return Err(format!("unknown message kind {k}")),
        };
        r.end()?;
        Ok(m)
    }
}

/// Reads one frame: its kind and body. `Ok(None)` at a clean end of stream
/// (the peer closed between frames).
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    read_frame_within(r, |_| Ok(MAX_FRAME))
}

/// [`read_frame`] of a frame at most `max(kind)` bytes long (the length
/// field not counted), or none of a kind for which `max` says why: an
/// `InvalidData` error saying so (or naming both lengths), before anything
/// is allocated for the body. The body is allocated as it arrives, so a
/// length that promises more than comes costs nothing.
pub fn read_frame_within(
    r: &mut impl Read,
    max: impl Fn(u8) -> Result<usize, String>,
) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a frame of 0 bytes (no kind)",
        ));
    }
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    if len > MAX_FRAME {
        return Err(invalid(format!(
            "a frame of {len} bytes, longer than any message ({MAX_FRAME})"
        )));
    }
    let mut kind = [0u8; 1];
    r.read_exact(&mut kind)?;
    let bound = max(kind[0]).map_err(invalid)?.min(MAX_FRAME);
    if len > bound {
        return Err(invalid(format!(
            "a frame of {len} bytes, longer than the {bound} a message of kind {} can be here",
            kind[0]
        )));
    }
    let mut body = Vec::with_capacity((len - 1).min(1 << 16));
    r.take((len - 1) as u64).read_to_end(&mut body)?;
    if body.len() != len - 1 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a frame of {len} bytes cut short after {}", body.len() + 1),
        ));
    }
    Ok(Some((kind[0], body)))
}

/// A body being read field by field.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("message cut short".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} bytes after the message", self.0.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let digest = Digest {
            samples: 9,
            chunk_size: 4,
            content: 7,
            pack_seed: 3,
        };
        for m in [
            ToCache::Hello(Hello {
                digest,
                seed: 5,
                batch_size: 2,
                epoch: 1,
                served: vec![0b101],
            }),
            ToCache::Next,
            ToCache::Release(vec![1, 2, 3]),
        ] {
            let f = m.encode();
            let (kind, body) = read_frame(&mut &f[..]).expect("frame").expect("some");
            assert_eq!(ToCache::decode(kind, &body).expect("decodes"), m);
            assert!(ToCache::decode(kind, &body[..body.len().saturating_sub(1)]).is_err() || body.is_empty());
        }
        let b = ToJob::Batch {
            epoch: 2,
            samples: vec![Placed {
                id: 4,
                offset: 64,
                len: 9,
            }],
            skipped: vec![7, 8],
        };
        let f = b.encode();
        let (kind, body) = read_frame(&mut &f[..]).expect("frame").expect("some");
        assert_eq!(ToJob::decode(kind, &body).expect("decodes"), b);
        assert!(ToJob::decode(99, &[]).is_err());
        assert!(read_frame(&mut &[255u8, 255, 255, 255][..]).is_err());
        assert!(read_frame(&mut &[][..]).expect("clean end").is_none());
    }

    #[test]
    fn a_frame_past_its_bound_is_refused_naming_both_before_its_body_is_allocated() {
        let max = hello_frame_max(600);
        assert_eq!(max, 1 + 64 + 1024 + 16 * 10);
        let hello = ToCache::Hello(Hello {
            digest: Digest {
                samples: 600,
                chunk_size: 4,
                content: 7,
                pack_seed: 3,
            },
            seed: 5,
            batch_size: 2,
            epoch: 1,
            served: vec![0; 10],
        })
        .encode();
        let first = |_| Ok(max);
        assert!(read_frame_within(&mut &hello[..], first).is_ok_and(|f| f.is_some()));
        let mut long = ((max + 1) as u32).to_le_bytes().to_vec();
        long.extend(vec![HELLO; max + 1]);
        let e = read_frame_within(&mut &long[..], first).expect_err("one byte past");
        assert_eq!(
            e.to_string(),
            "a frame of 1250 bytes, longer than the 1249 a message of kind 1 can be here"
        );
        // A length of 4 GiB - 1 with nothing behind it: refused by its
        // length, not by running out of memory or waiting for the bytes.
        let e = read_frame_within(&mut &[255u8, 255, 255, 255][..], first).expect_err("too long");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            "a frame of 4294967295 bytes, longer than any message (536875008)"
        );
        let e = read_frame_within(&mut &[0u8, 0, 0, 0][..], first).expect_err("empty");
        assert_eq!(e.to_string(), "a frame of 0 bytes (no kind)");
        // A length that promises more than comes: an error, and only what
        // came was allocated.
        let e = read_frame_within(&mut &[100u8, 0, 0, 0, NEXT, 1, 2][..], first).expect_err("cut short");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(e.to_string(), "a frame of 100 bytes cut short after 3");
        let attached = |kind| attached_frame_max(600, 10, kind);
        assert_eq!(attached(RELEASE), Ok(41));
        assert_eq!(attached(NEXT), Ok(1));
        assert_eq!(attached(HELLO), Err("a second hello (it is attached already)".into()));
        assert_eq!(attached(99), Err("a message of unknown kind 99".into()));
        assert_eq!(
            attached_frame_max(3, 10, RELEASE),
            Ok(13),
            "a batch is at most the dataset"
        );
        assert_eq!(
            attached_frame_max(600, 0, RELEASE),
            Ok(5),
            "batch_size 0 is served as 1"
        );
        let e = read_frame_within(&mut &ToCache::Release(vec![1; 11]).encode()[..], attached).expect_err("11 ids");
        assert_eq!(
            e.to_string(),
            "a frame of 45 bytes, longer than the 41 a message of kind 3 can be here"
        );
    }

    #[test]
    fn a_hello_is_checked_against_the_cache_naming_what_is_wrong() {
        let digest = Digest {
            samples: 100,
            chunk_size: 4,
            content: 7,
            pack_seed: 3,
        };
        let hello = Hello {
            digest,
            seed: 1,
            batch_size: 10,
            epoch: 0,
            served: Vec::new(),
        };
        let check = |h: &Hello| h.check(&digest, "the cache at c.sock", 1000, |size| size * 10);
        assert_eq!(check(&hello).map(|s| s.len()), Ok(0));
        let other = Hello {
            digest: Digest { samples: 99, ..digest },
            ..hello.clone()
        };
        assert_eq!(
            check(&other),
            Err("the cache at c.sock serves another dataset: samples 99 in the job's, 100 in the cache's".into())
        );
        let last = Hello {
            epoch: u64::MAX,
            served: vec![u64::MAX, (1 << 36) - 1],
            ..hello.clone()
        };
        assert_eq!(
            check(&last),
            Err("epoch 18446744073709551615: the last a count can hold, the job could not start the next".into())
        );
        let bitmap = Hello {
            served: vec![0; 3],
            ..hello.clone()
        };
        assert_eq!(
            check(&bitmap),
            Err("the served bitmap has 3 words for 100 samples (needs 2)".into())
        );
        let big = Hello {
            batch_size: 51,
            ..hello
        };
        assert!(check(&big).is_err_and(|e| e.contains("fewer than 2 batches of 51 samples")));
    }
}
