//! A pack's input files: local paths, or objects in a store named by URL
//! (`s3://bucket/prefix/…`, `gs://…`, `az://…`, `https://…`; DESIGN.md §2).
//! An input names a file or a directory; a URL names an object or a prefix,
//! listed as a directory is (the objects directly under it). A local file
//! can be read anywhere; an object is read once, whole and in order
//! ([`Input::reader`]: large ranged GETs ahead of the reader, each pinned
//! to the entity tag the object was listed with), so an importer copies
//! what it will need again (payloads) to its spool as it reads.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use brand_format::error::{Error, IoContext, Result};
use brand_store::{GetPolicy, Location, ObjectInfo, ObjectReader, ObjectUrl, Objects};

/// One input file.
#[derive(Debug)]
pub enum Input {
    File(PathBuf),
    Object(StoredObject),
}

/// An object of a store, as listed.
#[derive(Debug)]
pub struct StoredObject {
    objects: Arc<Objects>,
    info: ObjectInfo,
    /// Its URL, as errors name it.
    url: PathBuf,
}

impl Input {
    /// The path, or the object's URL: what errors name.
    pub fn path(&self) -> &Path {
        match self {
            Input::File(p) => p,
            Input::Object(o) => &o.url,
        }
    }

    /// The file's (or object key's) last component, as bytes.
    pub fn file_name(&self) -> Vec<u8> {
        match self {
            Input::File(p) => p.file_name().map_or(Vec::new(), |n| n.as_encoded_bytes().to_vec()),
            Input::Object(o) => o.info.file_name().as_bytes().to_vec(),
        }
    }

    /// The object to read in order, or None for a local file.
    pub fn object(&self) -> Option<&StoredObject> {
        match self {
            Input::File(_) => None,
            Input::Object(o) => Some(o),
        }
    }

    /// What says the input is the one listed before: its size and
    /// modification time, or an object's size and entity tag.
    pub fn identity(&self) -> Result<String> {
        match self {
            Input::File(p) => {
                let meta = fs::metadata(p).at(p)?;
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                Ok(format!("{} bytes, modified {mtime} ns", meta.len()))
            }
            Input::Object(o) => Ok(format!(
                "{} bytes, entity tag {}",
                o.info.size,
                o.info.e_tag.as_deref().unwrap_or("none")
            )),
        }
    }

    /// The whole input in memory (a small file: an MDS `index.json`).
    pub fn read_all(&self) -> Result<Vec<u8>> {
        match self {
            Input::File(p) => fs::read(p).at(p),
            Input::Object(o) => {
                let mut bytes = Vec::new();
                o.reader().read_to_end(&mut bytes).at(&o.url)?;
                Ok(bytes)
            }
        }
    }
}

impl StoredObject {
    /// Its size as listed.
    pub fn size(&self) -> u64 {
        self.info.size
    }

    /// A reader of the object from its start; its GETs start now. Logged
    /// (`-v`), so a long listing pass shows how far it is.
    pub fn reader(&self) -> ObjectReader {
        tracing::info!(
            "reading {} ({:.1} MiB)",
            self.url.display(),
            self.info.size as f64 / f64::from(1 << 20)
        );
        self.objects.reader(&self.info)
    }
}

impl StoredObject {
    /// Copies the whole object, read in order, to `out` (a file in
    /// `out_dir`, as errors name it); returns the bytes copied.
    pub fn copy_to(&self, out: &mut impl Write, out_dir: &Path) -> Result<u64> {
        let mut reader = self.reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut copied = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(copied),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Error::input(
                        &self.url,
                        format!("byte {copied}"),
                        format!("reading: {e}"),
                    ));
                }
            };
            out.write_all(buf.get(..n).unwrap_or(&[])).map_err(|e| {
                Error::input(
                    &self.url,
                    format!("byte {copied}"),
                    format!("copying to an anonymous file in {}: {e}", out_dir.display()),
                )
            })?;
            copied += n as u64;
        }
    }
}

/// Stores connected to so far, one per bucket, their requests under `policy`.
struct Stores<'a> {
    policy: &'a GetPolicy,
    connected: Vec<(String, Arc<Objects>)>,
}

impl<'a> Stores<'a> {
    fn new(policy: &'a GetPolicy) -> Self {
        Stores {
            policy,
            connected: Vec::new(),
        }
    }

    fn of(&mut self, url: &ObjectUrl) -> Result<Arc<Objects>> {
        if let Some((_, o)) = self.connected.iter().find(|(root, _)| *root == url.root) {
            return Ok(Arc::clone(o));
        }
        let o = Arc::new(Objects::connect(url, self.policy)?);
        self.connected.push((url.root.clone(), Arc::clone(&o)));
        Ok(o)
    }
}

fn object(objects: &Arc<Objects>, info: ObjectInfo) -> Input {
    Input::Object(StoredObject {
        url: PathBuf::from(objects.url_of(&info.key)),
        objects: Arc::clone(objects),
        info,
    })
}

/// A URL given on the command line: its parsed form, and whether it ends
/// in `/` (then it names a prefix, never an object).
fn url_of(input: &Path) -> Result<Option<(ObjectUrl, bool)>> {
    match Location::of_path(input)? {
        Location::Dir(_) => Ok(None),
        Location::Url(u) => {
            let prefix_only = u.prefix.is_empty() || input.as_os_str().as_encoded_bytes().ends_with(b"/");
            Ok(Some((u, prefix_only)))
        }
    }
}

/// Why a prefix holds nothing: it does not exist.
fn nothing_under(url: &ObjectUrl) -> Error {
    Error::io(
        url.url(),
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such object, and nothing under this prefix",
        ),
    )
}

/// An input as given: a file (or object), or a directory (or prefix) of
/// files.
pub enum Given {
    File(Input),
    Dir(InputDir),
}

/// Each of `inputs` as given. A URL is a prefix if anything is under it
/// (listed once, its objects directly under it), else the object of that
/// name; one ending in `/` is only ever a prefix. Requests go under `policy`.
pub fn given(inputs: &[PathBuf], policy: &GetPolicy) -> Result<Vec<Given>> {
    let mut stores = Stores::new(policy);
    inputs.iter().map(|path| given_one(path, &mut stores)).collect()
}

fn given_one(path: &Path, stores: &mut Stores) -> Result<Given> {
    let Some((url, prefix_only)) = url_of(path)? else {
        return Ok(if fs::metadata(path).at(path)?.is_dir() {
            Given::Dir(InputDir::Local(path.to_path_buf()))
        } else {
            Given::File(Input::File(path.to_path_buf()))
        });
    };
    let objects = stores.of(&url)?;
    // Plain HTTP(S) has no listing: a URL there names one object.
    if url.scheme == brand_store::location::Scheme::Http {
        if prefix_only {
            return Err(Error::config(format!(
                "{}: an http(s) URL names one object (HTTP servers list nothing; give each object's URL, or use the bucket's s3://, gs:// or az:// URL)",
                path.display()
            )));
        }
        return match objects.head(&url.prefix)? {
            Some(info) => Ok(Given::File(object(&objects, info))),
            None => Err(nothing_under(&url)),
        };
    }
    // A prefix first (some servers answer a HEAD of a "directory" with
    // 500), else the object of that name.
    let (listed, prefixes) = objects.list(&url.prefix, false)?;
    if listed.is_empty() && prefixes.is_empty() {
        return match objects.head(&url.prefix)? {
            Some(info) if !prefix_only => Ok(Given::File(object(&objects, info))),
            _ => Err(nothing_under(&url)),
        };
    }
    let listing = by_relative_key(&url.prefix, listed);
    Ok(Given::Dir(InputDir::Prefix { objects, url, listing }))
}

/// Objects listed under `prefix`, by key relative to it.
fn by_relative_key(prefix: &str, listed: Vec<ObjectInfo>) -> HashMap<String, ObjectInfo> {
    let strip = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    listed
        .into_iter()
        .filter_map(|info| Some((info.key.strip_prefix(&strip)?.to_string(), info)))
        .collect()
}

/// Each of `inputs` as given: a file, or a directory's files (not hidden,
/// not in subdirectories) whose lower-cased names `keep` accepts, sorted by
/// name; a URL is an object, or a prefix listed the same way. A directory
/// or prefix with none is an error: "no {kinds} files in the
/// directory{hint}".
pub fn expand(
    inputs: &[PathBuf],
    policy: &GetPolicy,
    keep: fn(&[u8]) -> bool,
    kinds: &str,
    hint: &str,
) -> Result<Vec<Input>> {
    let mut files = Vec::new();
    for input in given(inputs, policy)? {
        match input {
            Given::File(file) => files.push(file),
            Given::Dir(dir) => {
                let in_dir = dir.files(keep)?;
                if in_dir.is_empty() {
                    return Err(dir.none_of(kinds, hint));
                }
                files.extend(in_dir);
            }
        }
    }
    Ok(files)
}

/// A directory of an input that names its files (an MDS dataset's): local,
/// or a prefix whose objects were listed once.
pub enum InputDir {
    Local(PathBuf),
    Prefix {
        objects: Arc<Objects>,
        url: ObjectUrl,
        /// By key relative to the prefix.
        listing: HashMap<String, ObjectInfo>,
    },
}

impl InputDir {
    /// The file `name` (a relative path inside the directory, checked), if
    /// it exists.
    pub fn file(&self, name: &str) -> std::result::Result<Option<Input>, String> {
        let shown = self.show(name)?;
        Ok(match self {
            InputDir::Local(_) => shown.is_file().then_some(Input::File(shown)),
            InputDir::Prefix { objects, listing, .. } => listing.get(name).map(|info| object(objects, info.clone())),
        })
    }

    /// What errors name: the directory, or the prefix's URL.
    pub fn path(&self) -> PathBuf {
        match self {
            InputDir::Local(root) => root.clone(),
            InputDir::Prefix { url, .. } => PathBuf::from(url.url()),
        }
    }

    /// The files directly in the directory (not hidden, not in
    /// subdirectories) whose lower-cased names `keep` accepts, sorted by
    /// name (a listing is by key, which under one prefix is that order).
    pub fn files(&self, keep: fn(&[u8]) -> bool) -> Result<Vec<Input>> {
        let wanted = |name: &[u8]| {
            let name = name.to_ascii_lowercase();
            keep(&name) && !name.starts_with(b".")
        };
        let mut files = Vec::new();
        match self {
            InputDir::Local(root) => {
                for dir_entry in fs::read_dir(root).at(root)? {
                    let file = dir_entry.at(root)?.path();
                    let name = file.file_name().map_or(&[][..], |n| n.as_encoded_bytes());
                    if wanted(name) && fs::metadata(&file).at(&file)?.is_file() {
                        files.push(Input::File(file));
                    }
                }
            }
            InputDir::Prefix { objects, listing, .. } => {
                for (name, info) in listing {
                    if !name.contains('/') && wanted(name.as_bytes()) {
                        files.push(object(objects, info.clone()));
                    }
                }
            }
        }
        files.sort_by_cached_key(Input::file_name);
        Ok(files)
    }

    /// The error for a directory without the files wanted: "no {kinds}
    /// files in the directory{hint}" (objects under the prefix).
    pub fn none_of(&self, kinds: &str, hint: &str) -> Error {
        let what = match self {
            InputDir::Local(_) => format!("no {kinds} files in the directory{hint}"),
            InputDir::Prefix { .. } => format!("no {kinds} objects under the prefix{hint}"),
        };
        Error::input(self.path(), "listing", what)
    }

    /// Where `name` is (a path, or a URL), refusing names that leave the
    /// directory.
    pub fn show(&self, name: &str) -> std::result::Result<PathBuf, String> {
        let rel = Path::new(name);
        if name.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(format!(
                "file name {name:?} is not a path inside the dataset's directory"
            ));
        }
        Ok(match self {
            InputDir::Local(root) => root.join(rel),
            InputDir::Prefix { url, .. } => PathBuf::from(url.object_url(name)),
        })
    }
}

/// An input naming a directory holding `file_name`, or that file itself:
/// the file, and the directory it is in. A prefix is listed once, whole
/// (the directory's other files are looked up in that listing).
pub fn file_in_dir(input: &Path, file_name: &str, policy: &GetPolicy) -> Result<(Input, InputDir)> {
    let Some((url, prefix_only)) = url_of(input)? else {
        let file = if fs::metadata(input).at(input)?.is_dir() {
            input.join(file_name)
        } else {
            input.to_path_buf()
        };
        let root = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        return Ok((Input::File(file), InputDir::Local(root)));
    };
    let objects = Stores::new(policy).of(&url)?;
    // The prefix listed, whole; if there is nothing under it, the object of
    // that name and the prefix it is in.
    let (mut listed, _) = objects.list(&url.prefix, true)?;
    let mut named = None;
    let mut dir_prefix = url.prefix.clone();
    if listed.is_empty() {
        match objects.head(&url.prefix)? {
            Some(info) if !prefix_only => {
                dir_prefix = url.prefix.rsplit_once('/').map_or("", |p| p.0).to_string();
                listed = objects.list(&dir_prefix, true)?.0;
                named = Some(info);
            }
            _ => return Err(nothing_under(&url)),
        }
    }
    let dir_url = ObjectUrl {
        prefix: dir_prefix.clone(),
        ..url.clone()
    };
    let listing = by_relative_key(&dir_prefix, listed);
    let file = match named {
        Some(info) => info,
        None => listing.get(file_name).cloned().ok_or_else(|| {
            Error::io(
                url.url(),
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no {file_name} under this prefix ({} objects there)", listing.len()),
                ),
            )
        })?,
    };
    let file = object(&objects, file);
    Ok((
        file,
        InputDir::Prefix {
            objects,
            url: dir_url,
            listing,
        },
    ))
}
