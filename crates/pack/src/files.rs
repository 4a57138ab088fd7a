//! Sources made of plain files: an ImageFolder directory or a list file.

use std::path::{Path, PathBuf};

use super::source::{Entry, Source};
use brand_format::error::{Error, IoContext, Result};

/// Samples that are files on disk: entry `i` is read from `paths[i]`.
pub struct FileSource {
    kind: &'static str,
    entries: Vec<Entry>,
    paths: Vec<PathBuf>,
    label_names: Vec<String>,
}

impl Source for FileSource {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn entries(&self) -> &[Entry] {
        &self.entries
    }
    fn read(&self, i: usize) -> Result<Vec<u8>> {
        let path = &self.paths[i];
        std::fs::read(path).at(path)
    }
    fn label_names(&self) -> Vec<String> {
        self.label_names.clone()
    }
}

/// Names in a directory, sorted by bytes so the listing is deterministic.
fn sorted_children(dir: &Path) -> Result<Vec<(std::ffi::OsString, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).at(dir)? {
        let e = e.at(dir)?;
        let name = e.file_name();
        // Hidden files (editor droppings, .DS_Store, our own temp dirs) are not samples.
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        out.push((name, e.path()));
    }
    out.sort();
    Ok(out)
}

fn walk_files(dir: &Path, rel: &str, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    for (name, path) in sorted_children(dir)? {
        let name = name.to_string_lossy();
        let rel = format!("{rel}/{name}");
        let meta = std::fs::metadata(&path).at(&path)?;
        if meta.is_dir() {
            walk_files(&path, &rel, out)?;
        } else if meta.is_file() {
            out.push((rel, path));
        }
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
        let mut entries = Vec::new();
        let mut paths = Vec::new();
        let mut label_names = Vec::new();
        let mut skipped = 0usize;
        for (name, path) in sorted_children(root)? {
            if !std::fs::metadata(&path).at(&path)?.is_dir() {
                skipped += 1;
                continue;
            }
            let class = name.to_string_lossy().into_owned();
            let label = label_names.len() as i64;
            let mut files = Vec::new();
            walk_files(&path, &class, &mut files)?;
            for (rel, p) in files {
                entries.push(Entry {
                    key: rel.into_bytes(),
                    label,
                });
                paths.push(p);
            }
            label_names.push(class);
        }
        if skipped > 0 {
            tracing::warn!("{}: skipped {skipped} files outside class directories", root.display());
        }
        if entries.is_empty() {
            return Err(Error::input(
                root,
                "open",
                "no sample files found (expected <root>/<class>/<file>)",
            ));
        }
        Ok(FileSource {
            kind: "dir",
            entries,
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
        let mut entries = Vec::new();
        let mut paths = Vec::new();
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
            entries.push(Entry {
                key: path.as_bytes().to_vec(),
                label,
            });
            paths.push(full);
        }
        if entries.is_empty() {
            return Err(Error::input(list, "open", "the list names no files"));
        }
        Ok(FileSource {
            kind: "list",
            entries,
            paths,
            label_names: Vec::new(),
        })
    }
}
