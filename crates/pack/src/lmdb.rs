//! LMDB environments as a pack source: Caffe datum databases (DESIGN.md §2,
//! seeds/004) or any LMDB whose main database maps keys to samples.
//!
//! Samples are the main database's key/value pairs in LMDB's key order
//! (sorted bytes, so deterministic). Values are returned as stored; a value
//! that is a Caffe `Datum` carrying a label gives the sample its label.

use std::fs;
use std::path::{Path, PathBuf};

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions};

use super::protobuf::{self, Value};
use super::source::{Entry, Source};
use brand_format::error::{Error, Result};

/// The samples of an LMDB environment, opened read-only.
#[derive(Debug)]
pub struct LmdbSource {
    path: PathBuf,
    env: Env,
    db: Database<'static, Bytes, Bytes>,
    entries: Vec<Entry>,
}

impl LmdbSource {
    /// Open the environment at `path` (a directory holding `data.mdb`, or
    /// the data file itself) read-only and list its keys and labels.
    pub fn open(path: &Path) -> Result<Self> {
        let fail = |what: String| Error::input(path, "open", what);

        let metadata = fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        let (data_file, flags) = if metadata.is_dir() {
            (path.join("data.mdb"), EnvFlags::READ_ONLY)
        } else {
            (path.to_path_buf(), EnvFlags::READ_ONLY | EnvFlags::NO_SUB_DIR)
        };
        // Checked here because LMDB's own reports for these are a bare "No
        // such file or directory" and, for an empty file, "Bad file
        // descriptor" (it tries to initialise the file it may not write).
        match fs::metadata(&data_file) {
            Ok(data) if data.is_file() && data.len() == 0 => {
                return Err(fail("not an LMDB environment: the data file is empty".into()));
            }
            Ok(data) if data.is_file() => {}
            _ if metadata.is_dir() => {
                return Err(fail("not an LMDB environment: the directory has no data.mdb".into()));
            }
            _ => return Err(fail("not an LMDB environment: not a regular file".into())),
        }

        let mut options = EnvOpenOptions::new();
        // SAFETY: heed marks `flags` unsafe for the flags that give up
        // durability or locking (NO_SYNC, NO_META_SYNC, NO_LOCK); READ_ONLY
        // and NO_SUB_DIR are neither.
        unsafe { options.flags(flags) };
        // SAFETY: the map is read-only, so nothing in this process writes
        // through it, and heed refuses a second open of the same path in one
        // process. Writers in other processes go through LMDB's lock file,
        // and LMDB never reuses pages a live read transaction can see, so the
        // bytes read below do not change underneath us. What remains is a
        // file altered outside LMDB (truncated, or written without locks),
        // the risk every memory map carries.
        let env = unsafe { options.open(path) }.map_err(|e| fail(describe(e)))?;

        let rtxn = env.read_txn().map_err(|e| fail(describe(e)))?;
        let opened = env
            .open_databases_and_commit(rtxn, |opener, rtxn| {
                opener
                    .open_database::<Bytes, Bytes>(rtxn, None)
                    .map(CommitOrAbort::<_, ()>::Commit)
            })
            .map_err(|e| fail(describe(e)))?;
        let Some(db) = opened.commit().flatten() else {
            return Err(fail("the environment has no main database".into()));
        };

        let entries = list_entries(&env, db).map_err(fail)?;
        if entries.is_empty() {
            return Err(fail("the database is empty".into()));
        }
        Ok(LmdbSource {
            path: path.to_path_buf(),
            env,
            db,
            entries,
        })
    }
}

/// Every key in LMDB order, each with the label of its value.
fn list_entries(env: &Env, db: Database<'static, Bytes, Bytes>) -> std::result::Result<Vec<Entry>, String> {
    let rtxn = env.read_txn().map_err(describe)?;
    let mut entries: Vec<Entry> = Vec::new();
    for item in db.iter(&rtxn).map_err(describe)? {
        let (key, value) = item.map_err(describe)?;
        // Only a DUPSORT database repeats a key; `read` fetches by key and
        // could not tell the duplicates apart.
        if entries.last().is_some_and(|last| last.key == key) {
            return Err(format!(
                "key {} holds several values (a DUPSORT database); \
                 only one value per key is supported",
                key.escape_ascii()
            ));
        }
        entries.push(Entry {
            key: key.to_vec(),
            label: caffe_datum_label(value).unwrap_or(-1),
        });
    }
    Ok(entries)
}

fn describe(e: heed::Error) -> String {
    match e {
        heed::Error::EnvAlreadyOpened => {
            "the environment is already open in this process (heed allows one open at a time)".into()
        }
        heed::Error::Mdb(heed::MdbError::Invalid) => "not an LMDB environment (data file has no LMDB header)".into(),
        e => e.to_string(),
    }
}

impl Source for LmdbSource {
    fn kind(&self) -> &'static str {
        "lmdb"
    }

    fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn read(&self, i: usize) -> Result<Vec<u8>> {
        let entry = self.entries.get(i).ok_or_else(|| {
            Error::config(format!(
                "sample {i} out of range: the LMDB database has {} keys",
                self.entries.len()
            ))
        })?;
        let fail = |what: String| Error::input(&self.path, format!("key {}", entry.key.escape_ascii()), what);
        // A read transaction per read: cheap in LMDB, and heed's default
        // transactions are tied to the thread that opens them.
        let rtxn = self.env.read_txn().map_err(|e| fail(describe(e)))?;
        match self.db.get(&rtxn, &entry.key) {
            Ok(Some(value)) => Ok(value.to_vec()),
            Ok(None) => Err(fail(
                "the key is gone (the database changed since it was opened)".into(),
            )),
            Err(e) => Err(fail(describe(e))),
        }
    }
}

/// The label of a serialized Caffe `Datum`, or None if `value` has no label
/// or is not a Datum (a field Datum lacks, a wrong wire type, or bytes that
/// are not protobuf at all).
///
/// ```text
/// message Datum { optional int32 channels = 1; optional int32 height = 2;
///   optional int32 width = 3; optional bytes data = 4; optional int32 label = 5;
///   repeated float float_data = 6; optional bool encoded = 7; }
/// ```
fn caffe_datum_label(value: &[u8]) -> Option<i64> {
    let mut label = None;
    for field in protobuf::fields(value) {
        match field.ok()? {
            (1 | 2 | 3 | 7, Value::Varint(_)) | (4, Value::Bytes(_)) => {}
            // int32 is sign-extended to 64 bits on the wire; protobuf keeps
            // the low 32. The last occurrence wins.
            (5, Value::Varint(v)) => label = Some(i64::from(v as i32)),
            // float_data: unpacked (Caffe's proto2 default) or packed.
            (6, Value::Fixed32(_)) => {}
            (6, Value::Bytes(packed)) if packed.len() % 4 == 0 => {}
            _ => return None,
        }
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datum_labels() {
        // channels 3, height 2, width 1, data "abcdef", label 7, encoded false.
        let datum = [
            0x08, 3, 0x10, 2, 0x18, 1, 0x22, 6, b'a', b'b', b'c', b'd', b'e', b'f', 0x28, 7, 0x38, 0,
        ];
        assert_eq!(caffe_datum_label(&datum), Some(7));
        // Unpacked and packed float_data.
        let floats = [0x35, 0, 0, 0x80, 0x3f, 0x32, 4, 0, 0, 0, 0x40, 0x28, 1];
        assert_eq!(caffe_datum_label(&floats), Some(1));
        // A negative int32 label: ten-byte sign-extended varint.
        let negative = [0x28, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(caffe_datum_label(&negative), Some(-2));
        // Bits above 32 are dropped, as protobuf does for int32.
        let wide = [0x28, 0x81, 0x80, 0x80, 0x80, 0x10];
        assert_eq!(caffe_datum_label(&wide), Some(1));
        // The last label wins.
        assert_eq!(caffe_datum_label(&[0x28, 1, 0x28, 2]), Some(2));
    }

    #[test]
    fn non_datums_have_no_label() {
        assert_eq!(caffe_datum_label(b""), None, "empty Datum, no label");
        assert_eq!(caffe_datum_label(&[0x08, 3]), None, "no label field");
        assert_eq!(caffe_datum_label(&[0x28, 1, 0x40, 1]), None, "field 8");
        assert_eq!(caffe_datum_label(&[0x2a, 1, 0, 0x28, 1]), None, "label as bytes");
        assert_eq!(
            caffe_datum_label(&[0x32, 3, 0, 0, 0, 0x28, 1]),
            None,
            "packed floats cut"
        );
        assert_eq!(caffe_datum_label(&[0x28, 1, 0x22, 9, 0]), None, "data past the end");
        assert_eq!(caffe_datum_label(b"\x89PNG\r\n\x1a\n"), None, "PNG bytes");
    }
}
