//! The messages between a job and the cache, over a Unix stream socket.
//! Each is a frame: `u32` length (of what follows), a `u8` kind, then the
//! fields, little-endian. The job speaks first (`Hello`); the cache answers
//! `Welcome` with its shared memory's descriptor attached, or `Refused`.
//! Then the job asks `Next` and gets a `Batch` (or `Failed`); `Release`
//! tells the cache the job let go of a batch's samples and needs no answer.

use std::io::{self, Read};

use brand_format::Dataset;

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
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if !(1..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let kind = body.remove(0);
    Ok(Some((kind, body)))
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
}
