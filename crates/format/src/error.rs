//! One error type for the library. Every variant names where the problem is
//! (file, chunk, offset, sample) so a user can act on a one-line message.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system error on a named file.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A malformed file of the dataset format (manifest, index, chunk header).
    #[error("{}: at byte {offset}: {what}", path.display())]
    Format { path: PathBuf, offset: u64, what: String },

    /// A record whose bytes do not match what the index promises.
    #[error("{}: chunk {chunk} at byte {offset}, sample {sample}: {what}", segment.display())]
    Corrupt {
        segment: PathBuf,
        chunk: u64,
        offset: u64,
        sample: u64,
        what: String,
    },

    /// Bad input to `pack` (a source file, list line, TFRecord or LMDB entry).
    #[error("{}: {position}: {what}", path.display())]
    Input {
        path: PathBuf,
        position: String,
        what: String,
    },

    /// A configuration or argument that cannot work.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A saved loader state that cannot be restored here: saved for another
    /// dataset or another order (the message says what differs).
    #[error("{0}")]
    StateMismatch(String),
    /// Bytes that are not a loader state (the message says why).
    #[error("{0}")]
    InvalidState(String),
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    pub fn format(path: impl AsRef<Path>, offset: u64, what: impl Into<String>) -> Self {
        Error::Format {
            path: path.as_ref().to_path_buf(),
            offset,
            what: what.into(),
        }
    }

    pub fn input(path: impl AsRef<Path>, position: impl Into<String>, what: impl Into<String>) -> Self {
        Error::Input {
            path: path.as_ref().to_path_buf(),
            position: position.into(),
            what: what.into(),
        }
    }

    pub fn config(what: impl Into<String>) -> Self {
        Error::Config(what.into())
    }

    /// An equal error (io errors keep their kind and message), for errors
    /// that must be reported again.
    pub fn duplicate(&self) -> Self {
        match self {
            Error::Io { path, source } => Error::Io {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Format { path, offset, what } => Error::Format {
                path: path.clone(),
                offset: *offset,
                what: what.clone(),
            },
            Error::Corrupt {
                segment,
                chunk,
                offset,
                sample,
                what,
            } => Error::Corrupt {
                segment: segment.clone(),
                chunk: *chunk,
                offset: *offset,
                sample: *sample,
                what: what.clone(),
            },
            Error::Input { path, position, what } => Error::Input {
                path: path.clone(),
                position: position.clone(),
                what: what.clone(),
            },
            Error::Config(what) => Error::Config(what.clone()),
            Error::StateMismatch(what) => Error::StateMismatch(what.clone()),
            Error::InvalidState(what) => Error::InvalidState(what.clone()),
        }
    }
}

/// Attach a path to `std::io::Result`s.
pub trait IoContext<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}
