//! Sources made of plain files: an ImageFolder directory or a list file.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use brand_format::error::{Error, IoContext, Result};
use brand_pack::source::{Entries, Source};

/// Samples that are files on disk. Each sample's path relative to `base` is
/// held once, in an arena, and is also its key (ImageFolder keys are the
/// path made valid UTF-8): no allocation per sample.
pub struct FileSource {
    kind: &'static str,
    base: PathBuf,
    /// Each sample's path relative to `base`, as the OS spells it, and label.
    paths: Entries,
    label_names: Vec<String>,
}

impl FileSource {
    fn path(&self, i: usize) -> PathBuf {
        self.base.join(OsStr::from_bytes(self.paths.key(i)))
    }
}

impl Source for FileSource {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn len(&self) -> usize {
        self.paths.len()
    }
    fn key(&self, i: usize) -> Cow<'_, [u8]> {
        // A list's paths were checked to be UTF-8; a directory's names are
        // made so (as to_string_lossy did to each name: the separators are
        // ASCII, so the whole path converts as its parts do).
        match String::from_utf8_lossy(self.paths.key(i)) {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        }
    }
    fn label(&self, i: usize) -> i64 {
        self.paths.label(i)
    }
    fn read(&self, i: usize) -> Result<Vec<u8>> {
        let path = self.path(i);
        std::fs::read(&path).at(&path)
    }
    fn label_names(&self) -> Vec<String> {
        self.label_names.clone()
    }
    fn listing_bytes(&self) -> usize {
        self.paths.heap_bytes()
    }
}

/// Names in a directory, sorted by bytes so the listing is deterministic.
fn sorted_children(dir: &Path) -> Result<Vec<OsString>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).at(dir)? {
        let name = e.at(dir)?.file_name();
        // Hidden files (editor droppings, .DS_Store, our own temp dirs) are not samples.
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        out.push(name);
    }
    out.sort();
    Ok(out)
}

/// Lists the files under `root/rel` (`rel` relative to `root`, `/`-separated),
/// depth first in name order, into `out` with `label`.
fn walk_files(root: &Path, rel: &mut Vec<u8>, label: i64, out: &mut Entries) -> Result<()> {
    let dir = root.join(OsStr::from_bytes(rel));
    for name in sorted_children(&dir)? {
        let path = dir.join(&name);
        let meta = std::fs::metadata(&path).at(&path)?;
        let len = rel.len();
        rel.push(b'/');
        rel.extend_from_slice(name.as_bytes());
        if meta.is_dir() {
            walk_files(root, rel, label, out)?;
        } else if meta.is_file() {
            out.push(rel, label);
        }
        rel.truncate(len);
    }
    Ok(())
}

impl FileSource {
    /// ImageFolder convention: `root/<class>/**/<file>`; label = index of the
    /// class directory in sorted order, key = path relative to `root`.
    /// Files directly in `root` are not in any class and are skipped with a warning.
    pub fn image_folder(root: &Path) -> Result<Self> {
        let meta = std::fs::metadata(root).at(root)?;
        if !meta.is_dir() {
            return Err(Error::input(
                root,
                "open",
                "not a directory (use --from list or tfrecord for files)",
            ));
        }
        let mut paths = Entries::new();
        let mut label_names = Vec::new();
        let mut skipped = 0usize;
        for name in sorted_children(root)? {
            let path = root.join(&name);
            if !std::fs::metadata(&path).at(&path)?.is_dir() {
                skipped += 1;
                continue;
            }
            let label = label_names.len() as i64;
            walk_files(root, &mut name.as_bytes().to_vec(), label, &mut paths)?;
            label_names.push(name.to_string_lossy().into_owned());
        }
        paths.shrink_to_fit();
        if skipped > 0 {
            tracing::warn!("{}: skipped {skipped} files outside class directories", root.display());
        }
        if paths.is_empty() {
            return Err(Error::input(
                root,
                "open",
                "no sample files found (expected <root>/<class>/<file>)",
            ));
        }
        Ok(FileSource {
            kind: "dir",
            base: root.to_path_buf(),
            paths,
            label_names,
        })
    }

    /// A text file of `path<TAB>label` lines (label optional, -1 if absent;
    /// blank lines and `#` comments skipped). Relative paths are relative to
    /// the list file's directory; the key is the path as written.
    pub fn list(list: &Path) -> Result<Self> {
        let text = std::fs::read(list).at(list)?;
        let base = list.parent().unwrap_or(Path::new("."));
        let mut paths = Entries::new();
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() || line.starts_with(b"#") {
                continue;
            }
            let position = format!("line {}", n + 1);
            let line = std::str::from_utf8(line).map_err(|_| Error::input(list, &position, "not valid UTF-8"))?;
            let (path, label) = match line.rsplit_once('\t') {
                Some((p, l)) => {
                    let label = l
                        .trim()
                        .parse::<i64>()
                        .map_err(|_| Error::input(list, &position, format!("label {l:?} is not an integer")))?;
                    (p, label)
                }
                None => (line, -1),
            };
            if path.is_empty() {
                return Err(Error::input(list, &position, "empty path"));
            }
            let full = base.join(path);
            if !full.is_file() {
                return Err(Error::input(
                    list,
                    &position,
                    format!("{}: no such file", full.display()),
                ));
            }
            paths.push(path.as_bytes(), label);
        }
        paths.shrink_to_fit();
        if paths.is_empty() {
            return Err(Error::input(list, "open", "the list names no files"));
        }
        Ok(FileSource {
            kind: "list",
            base: base.to_path_buf(),
            paths,
            label_names: Vec::new(),
        })
    }
}
