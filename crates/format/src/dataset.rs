//! An opened dataset: its manifest and index, checked against each other.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::index::Index;
use crate::manifest::Manifest;
use crate::{INDEX_FILE, MANIFEST_FILE};

#[derive(Debug, Clone)]
pub struct Dataset {
    /// The directory, or the object-storage URL (`s3://bucket/prefix`) as a
    /// path: it names every file in errors (`dir/data-00000.brd`).
    dir: PathBuf,
    pub manifest: Manifest,
    pub index: Index,
    pub origin: Origin,
}

/// Where a dataset's segments are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Files in a local directory.
    Dir,
    /// Objects in a store (brand-store opened it): what each segment was
    /// when the dataset was opened, so a read of an object replaced since
    /// is refused rather than mixing two datasets.
    Objects(Vec<ObjectVersion>),
}

/// A segment object as it was opened: its entity tag (or version) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    pub e_tag: Option<String>,
    pub size: u64,
}

impl Dataset {
    /// Opens the dataset directory `dir`: loads the manifest and the index and
    /// checks that they describe the same dataset. Segments are not touched.
    /// A partition (`brand pack --partitions`) is refused: it holds only one
    /// node's chunks, and a reader of the whole would serve part of them.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let ds = Self::open_any(dir)?;
        if let Some(p) = ds.manifest.partition {
            return Err(Error::format(
                ds.dir.join(MANIFEST_FILE),
                0,
                format!(
                    "partition {} of {}: it holds only node {}'s chunks of a dataset packed with --partitions {}; serve it with `brand serve` as node {} of {}",
                    p.index, p.count, p.index, p.count, p.index, p.count
                ),
            ));
        }
        Ok(ds)
    }

    /// Opens a whole dataset or one partition of one (`manifest.partition`
    /// says which; a partition's index is the whole dataset's, and only the
    /// chunks [`holds_chunk`](Self::holds_chunk) says are present).
    pub fn open_any(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::io(
                &dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "not a dataset directory"),
            ));
        }
        let mpath = dir.join(MANIFEST_FILE);
        let manifest = Manifest::load(&mpath)?;
        let ipath = dir.join(INDEX_FILE);
        let index = Index::load(&ipath)?;
        Self::from_parts(dir, manifest, index, Origin::Dir)
    }

    /// A dataset from its manifest and index read elsewhere (an object
    /// store): `dir` names it in errors; the two are checked against each
    /// other as [`open_any`](Self::open_any) checks files.
    pub fn from_parts(dir: PathBuf, manifest: Manifest, index: Index, origin: Origin) -> Result<Self> {
        Self::check(&dir.join(INDEX_FILE), &manifest, &index)?;
        if let Origin::Objects(v) = &origin
            && v.len() != manifest.segments.len()
        {
            return Err(Error::config(format!(
                "{}: {} segment objects for {} segments",
                dir.display(),
                v.len(),
                manifest.segments.len()
            )));
        }
        Ok(Dataset {
            dir,
            manifest,
            index,
            origin,
        })
    }

    /// Whether the segments are objects in a store, not local files.
    pub fn is_remote(&self) -> bool {
        matches!(self.origin, Origin::Objects(_))
    }

    fn check(ipath: &Path, m: &Manifest, idx: &Index) -> Result<()> {
        let mismatch = |what: &str, a: u64, b: u64| {
            Error::format(ipath, 0, format!("index has {a} {what}, manifest.toml says {b}"))
        };
        if idx.samples() != m.samples {
            return Err(mismatch("samples", idx.samples(), m.samples));
        }
        if idx.chunk_size() != m.chunk_size {
            return Err(mismatch("as chunk size", idx.chunk_size() as u64, m.chunk_size as u64));
        }
        if idx.segment_count() as usize != m.segments.len() {
            return Err(mismatch(
                "segments",
                idx.segment_count() as u64,
                m.segments.len() as u64,
            ));
        }
        if idx.chunk_count() != m.chunks {
            return Err(mismatch("chunks", idx.chunk_count(), m.chunks));
        }
        // Every chunk inside its segment as the manifest sizes it, so no read
        // planned from the index runs past a segment's end.
        let mut per_segment = vec![0u64; m.segments.len()];
        for (c, loc) in idx.chunk_locs().enumerate() {
            let seg = &m.segments[loc.segment as usize];
            per_segment[loc.segment as usize] += 1;
            let end = loc.offset.saturating_add(idx.chunk_padded_len(c as u64));
            if end > seg.bytes {
                return Err(Error::format(
                    ipath,
                    0,
                    format!(
                        "chunk {c} ends at byte {end} of {}, which manifest.toml says has {} bytes",
                        seg.name, seg.bytes
                    ),
                ));
            }
        }
        // A partition's segment holds the chunks of one partition only, so
        // whether a segment is present follows from its chunks' owner.
        if let Some(p) = m.partition {
            let mut owner: Vec<Option<u32>> = vec![None; m.segments.len()];
            for (c, loc) in idx.chunk_locs().enumerate() {
                let o = p.owner_of_chunk(c as u64);
                if let Some(prev) = owner[loc.segment as usize].replace(o)
                    && prev != o
                {
                    return Err(Error::format(
                        ipath,
                        0,
                        format!(
                            "{} holds chunks of partitions {prev} and {o}; a partition's segment holds one",
                            m.segments[loc.segment as usize].name
                        ),
                    ));
                }
            }
        }
        for (seg, &count) in m.segments.iter().zip(&per_segment) {
            if count != seg.chunks {
                return Err(Error::format(
                    ipath,
                    0,
                    format!(
                        "index has {count} chunks in {}, manifest.toml says {}",
                        seg.name, seg.chunks
                    ),
                ));
            }
        }
        // Uncompressed records are stored as they are: a difference means the
        // records are compressed and manifest.toml's `compression` is wrong.
        if m.compression == "none"
            && let Some(id) = (0..idx.samples()).find(|&i| idx.raw_len(i) != idx.stored_len(i))
        {
            return Err(Error::format(
                ipath,
                0,
                format!(
                    "sample {id} is stored in {} bytes for {} raw bytes, but manifest.toml says compression = \"none\"",
                    idx.stored_len(id),
                    idx.raw_len(id)
                ),
            ));
        }
        Ok(())
    }

    /// Checks the compression flag of chunk `chunk`'s header against
    /// manifest.toml. `head` starts at the chunk and holds at least its
    /// fixed header ([`chunk::FIXED_HEADER`](crate::chunk::FIXED_HEADER)
    /// bytes); the header crc is not checked, so this is cheap enough for
    /// every whole-chunk read.
    pub fn check_chunk_compression(&self, chunk: u64, head: &[u8]) -> Result<()> {
        let loc = (chunk < self.index.chunk_count()).then(|| self.index.chunk(chunk));
        let (segment, offset) = loc.map(|l| (l.segment, l.offset)).unwrap_or((0, 0));
        let path = match self.manifest.segments.get(segment as usize) {
            Some(s) => self.dir.join(&s.name),
            None => self.dir.clone(),
        };
        let zstd = crate::chunk::compression_flag(head)
            .map_err(|e| Error::format(&path, offset, format!("chunk {chunk}: {e}")))?;
        if zstd != self.zstd() {
            return Err(Error::format(
                &path,
                offset,
                format!(
                    "chunk {chunk}: header says {}, manifest.toml says compression = {:?}",
                    if zstd { "zstd" } else { "uncompressed" },
                    self.manifest.compression
                ),
            ));
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `chunk`'s bytes are in this directory: always for a whole
    /// dataset, for its own chunks only in a partition.
    pub fn holds_chunk(&self, chunk: u64) -> bool {
        self.manifest
            .partition
            .is_none_or(|p| p.owner_of_chunk(chunk) == p.index)
    }

    /// Whether segment `segment`'s file belongs in this directory.
    pub fn holds_segment(&self, segment: u32) -> bool {
        self.manifest.partition.is_none_or(|p| {
            let first = self.index.chunk_locs().position(|l| l.segment == segment);
            first.is_some_and(|c| p.owner_of_chunk(c as u64) == p.index)
        })
    }

    pub fn segment_path(&self, segment: u32) -> PathBuf {
        self.dir.join(&self.manifest.segments[segment as usize].name)
    }

    pub fn zstd(&self) -> bool {
        self.manifest.compression == "zstd"
    }

    /// Reads one sample with ordinary buffered I/O (for `cat`, `verify`,
    /// tests). The loader uses the io engine instead.
    pub fn read_sample(&self, id: u64) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        if self.is_remote() {
            return Err(Error::config(format!(
                "{}: in object storage; read its samples through brand-store",
                self.dir.display()
            )));
        }
        if id >= self.index.samples() {
            return Err(Error::config(format!(
                "sample {id} out of range: the dataset has {}",
                self.index.samples()
            )));
        }
        let chunk = self.index.chunk_of(id);
        if let Some(p) = self.manifest.partition.filter(|_| !self.holds_chunk(chunk)) {
            return Err(Error::config(format!(
                "{}: sample {id} is in chunk {chunk}, held by partition {} of {}, not this one ({})",
                self.dir.display(),
                p.owner_of_chunk(chunk),
                p.count,
                p.index
            )));
        }
        let (segment, offset, len) = self.index.record_location(id);
        let path = self.segment_path(segment);
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset).map_err(|e| Error::Corrupt {
            segment: path.clone(),
            chunk: self.index.chunk_of(id),
            offset,
            sample: id,
            what: format!("cannot read {len} bytes: {e}"),
        })?;
        self.decode(id, &buf, true).map(|b| b.to_vec())
    }
}
