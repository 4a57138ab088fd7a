//! LMDB's B+tree, read for `--from lmdb` ([`super`]).
//!
//! The data file is read here in pure Rust with positioned reads, never
//! memory-mapped: LMDB's C library maps it, and a truncated or damaged file
//! then kills the process with SIGBUS or SIGSEGV. Nothing read from the file is
//! trusted. Every page number, offset and length is checked against the page
//! and the file before use; the B+tree walk keeps an explicit stack no deeper
//! than LMDB's own limit and visits each page at most once, so a cyclic or
//! malicious tree ends in an error naming the page. LMDB keeps no checksums,
//! so a damaged byte inside a key or value cannot be detected; damage to the
//! structure (headers, node sizes, page links, key order, entry counts) can.
//! The lock file is not used, so a writer may change the file while it is
//! read; each read checks its page and key again.
//!
//! On-disk layout read here: LMDB 0.9, data format version 1, 64-bit
//! little-endian (`mdb.c`). All integers are little-endian.
//!
//! ```text
//! page header (16 bytes): pgno u64 | pad u16 | flags u16 | lower u16 | upper u16
//!     (an overflow page has a page count u32 in place of lower and upper)
//!   then lower-16 bytes of u16 node offsets; nodes fill [upper, page size).
//! meta page (pages 0 and 1): header, then magic u32 0xBEEFC0DE | version u32
//!   | address u64 | map size u64 | free DB (48) | main DB (48)
//!   | last page u64 | txnid u64.  The free DB record's pad field is the page size.
//! DB record (48 bytes): pad u32 | flags u16 | depth u16 | branch pages u64
//!   | leaf pages u64 | overflow pages u64 | entries u64 | root u64
//! node (8 bytes, then the key, then a leaf's data): lo u16 | hi u16
//!   | flags u16 | key size u16.  On a leaf, lo | hi << 16 is the data size;
//!   on a branch, lo | hi << 16 | flags << 32 is the child page.
//!   Each node takes its size rounded up to even.
//! ```

use std::cmp::Ordering;
use std::fs;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use brand_format::error::{Error, Result};

/// `mm_magic` of every LMDB meta page.
const MAGIC: u32 = 0xBEEF_C0DE;
/// `mm_version` written by LMDB 0.9 release builds (development builds write
/// 999, a different format).
const DATA_VERSION: u32 = 1;
/// Pages 0 and 1 are the meta pages; data pages follow.
const META_PAGES: u64 = 2;
const PAGE_HEADER: usize = 16;
const NODE_HEADER: usize = 8;

// Byte offsets in a meta page.
const META_FLAGS: usize = 10;
const META_MAGIC: usize = 16;
const META_VERSION: usize = 20;
const META_FREE_DB: usize = 40;
const META_MAIN_DB: usize = 88;
const META_LAST_PAGE: usize = 136;
const META_TXNID: usize = 144;
/// Everything read from a meta page ends with the txnid.
const META_LEN: usize = META_TXNID + 8;

// Byte offsets in a DB record.
const DB_PAD: usize = 0;
const DB_FLAGS: usize = 4;
const DB_DEPTH: usize = 6;
const DB_ENTRIES: usize = 32;
const DB_ROOT: usize = 40;
const DB_LEN: usize = 48;

// Page flags.
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_OVERFLOW: u16 = 0x04;
const P_META: u16 = 0x08;
const P_LEAF2: u16 = 0x20;
const P_SUBP: u16 = 0x40;
/// The flags that say what a page is; the others (dirty, loose, keep) are
/// transient marks a written page may still carry.
const P_KIND: u16 = P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2 | P_SUBP;

// Leaf node flags.
const F_BIGDATA: u16 = 0x01;
const F_SUBDATA: u16 = 0x02;
const F_DUPDATA: u16 = 0x04;

// DB flags that change the key order.
const MDB_REVERSEKEY: u16 = 0x02;
const MDB_INTEGERKEY: u16 = 0x08;

/// The root of an empty tree.
const P_INVALID: u64 = u64::MAX;
/// LMDB uses the OS page size, capped at 32 KiB for format version 1.
const MIN_PAGE_SIZE: u64 = 512;
const MAX_PAGE_SIZE: u64 = 0x8000;
/// LMDB's cursor stack (`CURSOR_STACK`): it cannot use a deeper tree.
const MAX_DEPTH: u16 = 32;

#[derive(Debug, Clone, Copy)]
pub(super) struct NodeAt {
    pub(super) page: u64,
    pub(super) index: usize,
}

/// Bits of a packed [`NodeAt`] that hold the node's index in its page (a
/// page of at most 32 KiB holds fewer than 2^14 nodes of 2 bytes each).
const NODE_INDEX_BITS: u32 = 16;

impl NodeAt {
    /// Page and index in one u64, or None for a page number beyond 2^48
    /// (more than 2^57 bytes of file).
    pub(super) fn packed(self) -> Option<u64> {
        let index = u64::try_from(self.index).ok().filter(|&i| i >> NODE_INDEX_BITS == 0)?;
        (self.page >> (64 - NODE_INDEX_BITS) == 0).then_some(self.page << NODE_INDEX_BITS | index)
    }

    pub(super) fn unpacked(packed: u64) -> Self {
        NodeAt {
            page: packed >> NODE_INDEX_BITS,
            index: (packed & ((1 << NODE_INDEX_BITS) - 1)) as usize,
        }
    }
}

impl DataFile {
    /// Opens the environment at `path` (a directory holding `data.mdb`, or
    /// the data file itself) read-only: its meta page checked, a truncated
    /// file's missing pages named, and its main database.
    pub(super) fn open(path: &Path) -> Result<(DataFile, Db)> {
        let fail = |what: String| Error::input(path, "open", what);

        let metadata = fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        let data_file = if metadata.is_dir() {
            path.join("data.mdb")
        } else {
            path.to_path_buf()
        };
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
        let file = File::open(&data_file).map_err(|e| fail(format!("{}: {e}", data_file.display())))?;
        // The open file's length, not the path's: the path may be replaced.
        let len = file
            .metadata()
            .map_err(|e| fail(format!("{}: {e}", data_file.display())))?
            .len();

        let meta = read_meta(&file, len).map_err(fail)?;
        // read_meta checked the page size's range.
        let page_size = meta.page_size as usize;
        let data = DataFile {
            path: data_file,
            file,
            page_size,
            pages: len / meta.page_size,
            last_page: meta.last_page,
        };
        if data.pages <= meta.last_page {
            let needed = match meta
                .last_page
                .checked_add(1)
                .and_then(|n| n.checked_mul(meta.page_size))
            {
                Some(bytes) => format!("{bytes} bytes"),
                None => "more bytes than a file can hold".into(),
            };
            data.check_missing_tail(&meta.free).map_err(|what| {
                fail(format!(
                    "truncated: the data file holds {len} bytes ({} pages of {}), but its meta page says \
                     the environment runs through page {} ({needed}); {what}",
                    data.pages, meta.page_size, meta.last_page
                ))
            })?;
        }

        let main = meta.main;
        if main.root == P_INVALID {
            if main.entries != 0 || main.depth != 0 {
                return Err(fail(format!(
                    "the main database has no root page but claims {} entries and depth {}",
                    main.entries, main.depth
                )));
            }
            return Err(fail("the database is empty".into()));
        }

        Ok((data, main))
    }

    /// Walks the main database in key order ([`DataFile::walk`]).
    pub(super) fn walk_main(
        &self,
        main: &Db,
        visit: impl FnMut(NodeAt, &[u8], &[u8]) -> std::result::Result<(), String>,
    ) -> Result<()> {
        self.walk("main database", main, KeyOrder::of(main.flags), visit)
    }

    /// The value of `key`, whose node the walk found `at`.
    pub(super) fn value(&self, at: NodeAt, key: &[u8]) -> Result<Vec<u8>> {
        let data = self;
        let fail = |what: String| {
            Error::input(
                &data.path,
                format!("key {} ({})", show_key(key), data.position(at.page)),
                what,
            )
        };
        // The page is read again and checked as at open: the file may have
        // changed since (LMDB readers register in the lock file so writers
        // keep their pages; this reader does not).
        let page = data.load(at.page).map_err(fail)?;
        let gone = || fail("the key is gone (the database changed since it was opened)".into());
        if !page.leaf {
            return Err(gone());
        }
        let node = page.node(at.index).map_err(fail)?;
        if node.key != key {
            return Err(gone());
        }
        let mut value = Vec::new();
        match data.leaf_data(&node, &mut value, None).map_err(fail)? {
            Data::Inline(inline) => Ok(inline.to_vec()),
            Data::Overflow => Ok(value),
            Data::SubDatabase | Data::Duplicates(_) => Err(gone()),
        }
    }
}

/// The meta page fields this reader uses.
#[derive(Debug, Clone, Copy)]
struct Meta {
    page_size: u64,
    free: Db,
    main: Db,
    last_page: u64,
    txnid: u64,
}

/// A B+tree's record in the meta page (`MDB_db`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Db {
    flags: u16,
    depth: u16,
    entries: u64,
    root: u64,
}

impl Db {
    fn parse(record: &[u8]) -> Option<Db> {
        Some(Db {
            flags: le_u16(record, DB_FLAGS)?,
            depth: le_u16(record, DB_DEPTH)?,
            entries: le_u64(record, DB_ENTRIES)?,
            root: le_u64(record, DB_ROOT)?,
        })
    }
}

/// Read both meta pages and pick the current one, as LMDB does: both must be
/// valid, and the one with the higher txnid wins (meta page 0 on a tie).
fn read_meta(file: &File, len: u64) -> std::result::Result<Meta, String> {
    let mut head = vec![0; META_LEN.min(usize::try_from(len).unwrap_or(META_LEN))];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| format!("reading meta page 0: {e}"))?;
    let first = parse_meta(&head, 0)?;

    let second_at = first.page_size;
    if len < META_PAGES * first.page_size {
        return Err(format!(
            "truncated: the data file holds {len} bytes, less than its two {}-byte meta pages",
            first.page_size
        ));
    }
    let mut head = vec![0; META_LEN];
    file.read_exact_at(&mut head, second_at)
        .map_err(|e| format!("reading meta page 1 at byte {second_at}: {e}"))?;
    let second = parse_meta(&head, 1)?;
    if second.page_size != first.page_size {
        return Err(format!(
            "the meta pages disagree on the page size ({} and {} bytes)",
            first.page_size, second.page_size
        ));
    }
    let meta = if second.txnid > first.txnid { second } else { first };
    if meta.last_page < META_PAGES - 1 {
        return Err(format!(
            "the current meta page says the last page is {}, inside the meta pages",
            meta.last_page
        ));
    }
    Ok(meta)
}

/// Parse meta page `n` from its first `META_LEN` bytes (fewer if the file is
/// shorter).
fn parse_meta(page: &[u8], n: u64) -> std::result::Result<Meta, String> {
    let Some(magic) = le_u32(page, META_MAGIC) else {
        return Err("not an LMDB environment (data file has no LMDB header)".into());
    };
    if magic != MAGIC {
        if n > 0 {
            return Err(format!("meta page {n} is damaged: it has no LMDB magic number"));
        }
        // Other layouts of the same header, named so the user knows why.
        let swapped = MAGIC.swap_bytes();
        return Err(if magic == swapped {
            "a big-endian LMDB environment; only 64-bit little-endian LMDB files can be read".into()
        } else if le_u32(page, META_MAGIC - 4).is_some_and(|m| m == MAGIC || m == swapped) {
            "a 32-bit LMDB environment; only 64-bit little-endian LMDB files can be read".into()
        } else {
            "not an LMDB environment (data file has no LMDB header)".into()
        });
    }
    let version = le_u32(page, META_VERSION).unwrap_or(0);
    if version != DATA_VERSION {
        return Err(format!(
            "LMDB data format version {version} is not supported (only version {DATA_VERSION}, \
             written by LMDB 0.9, 64-bit little-endian)"
        ));
    }
    let Some(flags) = le_u16(page, META_FLAGS) else {
        return Err(format!("truncated: the data file ends inside meta page {n}"));
    };
    if flags & P_META == 0 {
        return Err(format!(
            "meta page {n} is damaged: its header is not marked as a meta page"
        ));
    }
    let (Some(free_record), Some(main_record), Some(last_page), Some(txnid)) = (
        page.get(META_FREE_DB..META_FREE_DB + DB_LEN),
        page.get(META_MAIN_DB..META_MAIN_DB + DB_LEN),
        le_u64(page, META_LAST_PAGE),
        le_u64(page, META_TXNID),
    ) else {
        return Err(format!("truncated: the data file ends inside meta page {n}"));
    };
    let (Some(free), Some(main), Some(page_size)) = (
        Db::parse(free_record),
        Db::parse(main_record),
        le_u32(free_record, DB_PAD),
    ) else {
        return Err(format!("truncated: the data file ends inside meta page {n}"));
    };
    let page_size = u64::from(page_size);
    if !page_size.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        return Err(format!(
            "meta page {n} gives a page size of {page_size} bytes; LMDB page sizes are powers of two \
             from {MIN_PAGE_SIZE} to {MAX_PAGE_SIZE}"
        ));
    }
    Ok(Meta {
        page_size,
        free,
        main,
        last_page,
        txnid,
    })
}

/// The data file, read with positioned reads so any thread can read.
#[derive(Debug)]
pub(super) struct DataFile {
    path: PathBuf,
    file: File,
    page_size: usize,
    /// Whole pages the file holds.
    pages: u64,
    /// The current meta page's last page in use (`mm_last_pg`).
    last_page: u64,
}

/// One branch or leaf page, read whole and checked (`DataFile::load`).
struct TreePage {
    pgno: u64,
    leaf: bool,
    bytes: Vec<u8>,
    upper: usize,
    nodes: usize,
}

/// A node of a checked page; `key` and `data` lie inside the page.
struct Node<'a> {
    /// Leaf: F_* flags. Branch: bits 32..48 of the child page number.
    flags: u16,
    /// Leaf: the data size. Branch: bits 0..32 of the child page number.
    size: u32,
    key: &'a [u8],
    /// The data on the page: a value, an overflow page number, a DB record
    /// or a sub-page. Empty on branch pages.
    data: &'a [u8],
    /// The node's bytes on the page, rounded up to even as LMDB allocates.
    start: usize,
    end: usize,
}

impl Node<'_> {
    fn child(&self) -> u64 {
        u64::from(self.size) | (u64::from(self.flags) << 32)
    }
}

/// What a leaf node holds.
enum Data<'a> {
    /// A value on the leaf page.
    Inline(&'a [u8]),
    /// A value on overflow pages, read into the caller's buffer.
    Overflow,
    /// A named database's record.
    SubDatabase,
    /// A DUPSORT key's values (a sub-page or sub-database), and how many.
    Duplicates(u64),
}

/// The comparison LMDB sorts a database's keys with.
#[derive(Debug, Clone, Copy)]
enum KeyOrder {
    /// memcmp, a shorter key first when one is a prefix of the other.
    Bytes,
    /// Bytes compared from the end (MDB_REVERSEKEY); for MDB_INTEGERKEY's
    /// equal-sized little-endian integers this is numeric order.
    Reversed,
}

impl KeyOrder {
    fn of(db_flags: u16) -> KeyOrder {
        if db_flags & (MDB_REVERSEKEY | MDB_INTEGERKEY) != 0 {
            KeyOrder::Reversed
        } else {
            KeyOrder::Bytes
        }
    }

    fn compare(self, a: &[u8], b: &[u8]) -> Ordering {
        match self {
            KeyOrder::Bytes => a.cmp(b),
            KeyOrder::Reversed => a.iter().rev().cmp(b.iter().rev()),
        }
    }
}

/// A page to visit, with the key range its parent's separators allow:
/// `low <= key < high` for every key below it.
struct Pending {
    pgno: u64,
    level: u16,
    low: Option<Vec<u8>>,
    high: Option<Vec<u8>>,
}

/// A branch page on the walk's stack and the next child to visit.
struct Frame {
    page: TreePage,
    next: usize,
    level: u16,
    low: Option<Vec<u8>>,
    high: Option<Vec<u8>>,
}

/// The state of one tree walk (`DataFile::walk`).
struct Walk<'f> {
    file: &'f DataFile,
    depth: u16,
    order: KeyOrder,
    /// Pages entered so far, tree and overflow: none may be entered twice.
    visited: PageSet,
    last_key: Option<Vec<u8>>,
    count: u64,
    /// The current overflow value.
    overflow: Vec<u8>,
}

impl Walk<'_> {
    /// Read and check page `next.pgno`; visit its pairs if it is a leaf, or
    /// return it as a frame to descend through if it is a branch.
    fn enter(
        &mut self,
        next: Pending,
        visit: &mut impl FnMut(NodeAt, &[u8], &[u8]) -> std::result::Result<(), String>,
    ) -> Result<Option<Frame>> {
        let file = self.file;
        let fail = |what: String| file.page_error(next.pgno, what);
        // The root and every child were checked to be data pages the file
        // holds, all inside the set's bound.
        if !self.visited.insert(next.pgno) {
            return Err(fail(
                "the page is reached twice: the tree has a cycle or shares a page".into(),
            ));
        }
        let page = file.load(next.pgno).map_err(fail)?;
        if page.leaf != (next.level == self.depth) {
            return Err(fail(format!(
                "a {} page at level {} of a tree of depth {}",
                if page.leaf { "leaf" } else { "branch" },
                next.level,
                self.depth
            )));
        }
        if !page.leaf {
            return Ok(Some(Frame {
                page,
                next: 0,
                level: next.level,
                low: next.low,
                high: next.high,
            }));
        }
        for index in 0..page.nodes {
            let node = page.node(index).map_err(fail)?;
            let key = node.key;
            let key_fail = |what: String| fail(format!("key {}: {what}", show_key(key)));
            let order = self.order;
            let below = next.low.as_deref().is_some_and(|low| order.compare(key, low).is_lt());
            let above = next
                .high
                .as_deref()
                .is_some_and(|high| order.compare(key, high).is_ge());
            if below || above {
                return Err(key_fail(
                    "the key lies outside the range its parent page gives: the tree is damaged".into(),
                ));
            }
            if let Some(last) = self.last_key.as_deref()
                && order.compare(key, last).is_le()
            {
                return Err(key_fail(format!(
                    "the key is out of order (after key {}): the tree is damaged",
                    show_key(last)
                )));
            }
            let value = match file.leaf_data(&node, &mut self.overflow, Some(&mut self.visited)) {
                Ok(Data::Inline(value)) => value,
                Ok(Data::Overflow) => self.overflow.as_slice(),
                Ok(Data::SubDatabase) => {
                    return Err(fail(format!(
                        "key {} names a sub-database (the environment holds named databases); \
                         only an environment whose main database holds the samples is supported",
                        show_key(key)
                    )));
                }
                Ok(Data::Duplicates(n)) if n > 1 => {
                    return Err(fail(format!(
                        "key {} holds several values (a DUPSORT database); only one value per key is supported",
                        show_key(key)
                    )));
                }
                Ok(Data::Duplicates(_)) => {
                    return Err(fail(format!(
                        "key {} holds its value as a DUPSORT duplicate set; DUPSORT databases are not supported",
                        show_key(key)
                    )));
                }
                Err(what) => return Err(key_fail(what)),
            };
            let at = NodeAt { page: next.pgno, index };
            visit(at, key, value).map_err(fail)?;
            self.count += 1;
            let last = self.last_key.get_or_insert_with(Vec::new);
            last.clear();
            last.extend_from_slice(key);
        }
        Ok(None)
    }

    /// The next child of `frame` to enter, with the key range its
    /// separators give, or None when the branch is done.
    fn next_child(&self, frame: &mut Frame) -> Result<Option<Pending>> {
        let index = frame.next;
        if index >= frame.page.nodes {
            return Ok(None);
        }
        frame.next += 1;
        let fail = |what: String| self.file.page_error(frame.page.pgno, what);
        let node = frame.page.node(index).map_err(fail)?;
        // A branch's first key is unused: everything below the separator of
        // its second node belongs to its first child.
        let low = if index == 0 {
            frame.low.clone()
        } else {
            Some(node.key.to_vec())
        };
        let high = if index + 1 < frame.page.nodes {
            Some(frame.page.node(index + 1).map_err(fail)?.key.to_vec())
        } else {
            frame.high.clone()
        };
        let child = node.child();
        self.file
            .data_page_offset(child)
            .map_err(|what| fail(format!("node {index} points to a bad child: {what}")))?;
        Ok(Some(Pending {
            pgno: child,
            level: frame.level + 1,
            low,
            high,
        }))
    }
}

impl DataFile {
    fn position(&self, pgno: u64) -> String {
        let page_size = self.page_size as u64;
        match pgno.checked_mul(page_size) {
            Some(offset) => format!("page {pgno} at byte {offset}"),
            None => format!("page {pgno}"),
        }
    }

    fn page_error(&self, pgno: u64, what: impl Into<String>) -> Error {
        Error::input(&self.path, self.position(pgno), what)
    }

    /// Check that `pgno` is a data page the file holds; its byte offset.
    fn data_page_offset(&self, pgno: u64) -> std::result::Result<u64, String> {
        if !(META_PAGES..=self.last_page).contains(&pgno) {
            return Err(format!(
                "page {pgno} is outside the data pages {META_PAGES}..={}",
                self.last_page
            ));
        }
        if pgno >= self.pages {
            return Err(format!(
                "page {pgno} lies past the end of the file ({} pages): the file is truncated",
                self.pages
            ));
        }
        // pgno < pages = file length / page size, so this cannot overflow.
        Ok(pgno * self.page_size as u64)
    }

    /// Read page `pgno` and check it is a branch or leaf page whose nodes
    /// all lie inside it.
    fn load(&self, pgno: u64) -> std::result::Result<TreePage, String> {
        let offset = self.data_page_offset(pgno)?;
        let mut bytes = vec![0; self.page_size];
        self.file
            .read_exact_at(&mut bytes, offset)
            .map_err(|e| format!("reading the page: {}", read_failure(&e)))?;
        TreePage::parse(pgno, bytes)
    }

    /// Walk `db`'s tree depth-first in key order and call `visit` with each
    /// key/value pair and where its node is. Named databases and DUPSORT
    /// duplicates are refused here.
    fn walk(
        &self,
        name: &str,
        db: &Db,
        order: KeyOrder,
        mut visit: impl FnMut(NodeAt, &[u8], &[u8]) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let root_error = |what: String| self.page_error(db.root, format!("the {name}'s root: {what}"));
        if db.depth == 0 || db.depth > MAX_DEPTH {
            return Err(root_error(format!(
                "depth {} (an LMDB tree has depth 1 to {MAX_DEPTH})",
                db.depth
            )));
        }
        self.data_page_offset(db.root).map_err(root_error)?;

        let mut walk = Walk {
            file: self,
            depth: db.depth,
            order,
            visited: PageSet::new(self.pages.min(self.last_page.saturating_add(1))),
            last_key: None,
            count: 0,
            overflow: Vec::new(),
        };
        // At most one frame per level (MAX_DEPTH), and each page is entered
        // once, so the loop ends on any input.
        let mut stack: Vec<Frame> = Vec::new();
        let mut pending = Some(Pending {
            pgno: db.root,
            level: 1,
            low: None,
            high: None,
        });
        loop {
            if let Some(next) = pending.take()
                && let Some(branch) = walk.enter(next, &mut visit)?
            {
                stack.push(branch);
            }
            let Some(frame) = stack.last_mut() else {
                break;
            };
            pending = walk.next_child(frame)?;
            if pending.is_none() {
                stack.pop();
            }
        }

        if walk.count != db.entries {
            return Err(root_error(format!(
                "the meta page says the {name} holds {} entries, but its tree holds {}",
                db.entries, walk.count
            )));
        }
        Ok(())
    }

    /// What a leaf node holds; a value on overflow pages is read into
    /// `overflow`, and with `visited` its pages are marked.
    fn leaf_data<'a>(
        &self,
        node: &Node<'a>,
        overflow: &mut Vec<u8>,
        visited: Option<&mut PageSet>,
    ) -> std::result::Result<Data<'a>, String> {
        match node.flags {
            0 => Ok(Data::Inline(node.data)),
            F_BIGDATA => {
                let pgno = le_u64(node.data, 0).ok_or("the overflow page number is cut short")?;
                self.read_overflow(pgno, node.size, overflow, visited)?;
                Ok(Data::Overflow)
            }
            F_SUBDATA => Ok(Data::SubDatabase),
            F_DUPDATA => {
                // A sub-page: a leaf page inside the node, one node per value.
                let lower = le_u16(node.data, 12).ok_or("the duplicate sub-page is cut short")?;
                Ok(Data::Duplicates(u64::from(
                    lower.saturating_sub(PAGE_HEADER as u16) / 2,
                )))
            }
            flags if flags == F_DUPDATA | F_SUBDATA => {
                let db = Db::parse(node.data).ok_or("the duplicate sub-database record is cut short")?;
                Ok(Data::Duplicates(db.entries))
            }
            flags => Err(format!("the node has invalid flags {flags:#06x}")),
        }
    }

    /// Read a `len`-byte value from the overflow pages starting at `pgno`.
    fn read_overflow(
        &self,
        pgno: u64,
        len: u32,
        out: &mut Vec<u8>,
        visited: Option<&mut PageSet>,
    ) -> std::result::Result<(), String> {
        let fail = |what: String| format!("overflow page {pgno}: {what}");
        let offset = self.data_page_offset(pgno).map_err(fail)?;
        let mut header = [0; PAGE_HEADER];
        self.file
            .read_exact_at(&mut header, offset)
            .map_err(|e| fail(format!("reading the page: {}", read_failure(&e))))?;
        let stored = le_u64(&header, 0).unwrap_or(P_INVALID);
        let flags = le_u16(&header, 10).unwrap_or(0);
        let pages = u64::from(le_u32(&header, 12).unwrap_or(0));
        if stored != pgno || flags & P_KIND != P_OVERFLOW {
            return Err(fail(format!(
                "not an overflow page (it says page {stored}, flags {flags:#06x}): the page is damaged"
            )));
        }
        // The header and the value; LMDB may keep a larger run when a value
        // shrinks in place, never a smaller one.
        let needed = (PAGE_HEADER as u64 + u64::from(len)).div_ceil(self.page_size as u64);
        if pages < needed {
            return Err(fail(format!("{pages} page(s) cannot hold a {len}-byte value")));
        }
        let last = pgno + pages - 1;
        if last > self.last_page || last >= self.pages {
            return Err(fail(format!(
                "its {pages} pages run past the end of the {} (last page {}, file holds {} pages)",
                if last > self.last_page { "environment" } else { "file" },
                self.last_page,
                self.pages
            )));
        }
        if let Some(visited) = visited {
            for page in pgno..=last {
                if !visited.insert(page) {
                    return Err(fail(format!(
                        "its page {page} is reached twice: the tree has a cycle or shares a page"
                    )));
                }
            }
        }
        out.clear();
        // len <= the run's bytes <= the file's length: a bounded allocation.
        out.resize(len as usize, 0);
        self.file
            .read_exact_at(out, offset + PAGE_HEADER as u64)
            .map_err(|e| fail(format!("reading the value: {}", read_failure(&e))))
    }

    /// The pages after the file's end, `pages..=last_page`, must all be free:
    /// LMDB does not write a page freed in the transaction that allocated it,
    /// so a valid file can stop short of `mm_last_pg` if the free-page
    /// database lists the rest. Anything else is a truncated file.
    fn check_missing_tail(&self, free: &Db) -> std::result::Result<(), String> {
        // The caller checked pages <= last_page.
        let missing = (self.last_page - self.pages).saturating_add(1);
        // The free-page database spends 8 bytes per page it lists, within
        // this file, so a gap this large cannot be free pages.
        let most_listable = self.pages.saturating_mul(self.page_size as u64) / 8;
        if missing > most_listable || free.root == P_INVALID {
            return Err(format!("{missing} page(s) are missing"));
        }
        let mut listed = PageSet::new(missing);
        let mut found = 0u64;
        let walked = self.walk("free-page database", free, KeyOrder::Reversed, |_, _, ids| {
            // An ID list: its length, then that many page numbers (a record
            // may have room for more).
            let count = le_u64(ids, 0).ok_or("a free-page list is cut short")?;
            if count > (ids.len() / 8).saturating_sub(1) as u64 {
                return Err(format!("a free-page list claims {count} pages but holds fewer"));
            }
            for i in 1..=count as usize {
                let page = le_u64(ids, i * 8).ok_or("a free-page list is cut short")?;
                if (self.pages..=self.last_page).contains(&page) && listed.insert(page - self.pages) {
                    found += 1;
                }
            }
            Ok(())
        });
        match walked {
            Ok(()) if found == missing => Ok(()),
            Ok(()) => Err(format!(
                "{} of the {missing} missing page(s) are in use",
                missing - found
            )),
            // The reason without the path, which the caller's message names.
            Err(Error::Input { position, what, .. }) => {
                Err(format!("{missing} page(s) are missing ({position}: {what})"))
            }
            Err(e) => Err(format!("{missing} page(s) are missing ({e})")),
        }
    }
}

impl TreePage {
    /// Page `pgno`'s bytes checked as a branch or leaf page: its number,
    /// kind, free-space bounds and that its nodes tile the rest of the page.
    fn parse(pgno: u64, bytes: Vec<u8>) -> std::result::Result<TreePage, String> {
        let page_size = bytes.len();
        let header = |at| le_u16(&bytes, at).ok_or_else(|| "the page is shorter than its header".to_string());
        let stored = le_u64(&bytes, 0).unwrap_or(P_INVALID);
        if stored != pgno {
            return Err(format!("the page header says it is page {stored}: the page is damaged"));
        }
        let flags = header(10)?;
        let leaf = match flags & P_KIND {
            P_BRANCH => false,
            P_LEAF => true,
            kind if kind & P_LEAF2 != 0 => {
                return Err("a LEAF2 page (MDB_DUPFIXED duplicates), which this reader does not support".into());
            }
            _ => return Err(format!("not a branch or leaf page (flags {flags:#06x})")),
        };
        let (lower, upper) = (usize::from(header(12)?), usize::from(header(14)?));
        if lower < PAGE_HEADER || !(lower - PAGE_HEADER).is_multiple_of(2) || lower > upper || upper > page_size {
            return Err(format!(
                "bad free-space bounds lower {lower}, upper {upper} (page size {})",
                page_size
            ));
        }
        let page = TreePage {
            pgno,
            leaf,
            bytes,
            upper,
            nodes: (lower - PAGE_HEADER) / 2,
        };

        // LMDB packs nodes from the end of the page down to `upper`, each
        // rounded up to even, and closes gaps on delete. A node whose sizes
        // were damaged overlaps a neighbour or leaves a gap.
        let mut spans = Vec::with_capacity(page.nodes);
        for i in 0..page.nodes {
            let node = page.node(i)?;
            spans.push((node.start, node.end));
        }
        spans.sort_unstable();
        let mut expected = page.upper;
        for (start, end) in spans {
            if start != expected {
                return Err(format!(
                    "the nodes overlap or leave a gap at offset {start} (expected a node at {expected})"
                ));
            }
            expected = end;
        }
        if expected != page_size {
            return Err(format!(
                "the last node ends at offset {expected}, not at the page's end"
            ));
        }
        Ok(page)
    }

    /// Node `i`, checked to lie between `upper` and the page's end.
    fn node(&self, i: usize) -> std::result::Result<Node<'_>, String> {
        let fail = |what: &str| format!("node {i} {what}");
        if i >= self.nodes {
            return Err(fail("does not exist"));
        }
        let start = le_u16(&self.bytes, PAGE_HEADER + 2 * i)
            .map(usize::from)
            .ok_or_else(|| fail("has no offset"))?;
        if start < self.upper {
            return Err(format!(
                "node {i} at offset {start} lies in the page's free space (nodes start at {})",
                self.upper
            ));
        }
        let header = self
            .bytes
            .get(start..start + NODE_HEADER)
            .ok_or_else(|| fail("runs past the end of the page"))?;
        let (lo, hi, flags, key_len) = (
            le_u16(header, 0).unwrap_or(0),
            le_u16(header, 2).unwrap_or(0),
            le_u16(header, 4).unwrap_or(0),
            usize::from(le_u16(header, 6).unwrap_or(0)),
        );
        let size = u32::from(lo) | (u32::from(hi) << 16);
        let key_start = start + NODE_HEADER;
        let key_end = key_start + key_len;
        let data_len = match (self.leaf, flags & F_BIGDATA != 0) {
            (false, _) => 0,
            (true, true) => 8,
            (true, false) => size as usize,
        };
        // A saturated end lies past the page, so the slicing below refuses it.
        let data_end = key_end.saturating_add(data_len);
        let (Some(key), Some(data)) = (self.bytes.get(key_start..key_end), self.bytes.get(key_end..data_end)) else {
            return Err(format!(
                "node {i} at offset {start} ({key_len}-byte key, {data_len}-byte data) runs past the end of the page"
            ));
        };
        Ok(Node {
            flags,
            size,
            key,
            data,
            start,
            end: data_end + (data_end - start) % 2,
        })
    }
}

/// A set of page numbers below a bound, one bit each: a walk's record of the
/// pages it has been to, at a bit per page of the file.
struct PageSet {
    words: Vec<u64>,
}

impl PageSet {
    fn new(pages: u64) -> PageSet {
        PageSet {
            words: vec![0; usize::try_from(pages.div_ceil(64)).unwrap_or(0)],
        }
    }

    /// Add `page`; false if it was there already (or is beyond the bound,
    /// which callers check first).
    fn insert(&mut self, page: u64) -> bool {
        let Some(word) = usize::try_from(page / 64).ok().and_then(|w| self.words.get_mut(w)) else {
            return false;
        };
        let bit = 1u64 << (page % 64);
        let fresh = *word & bit == 0;
        *word |= bit;
        fresh
    }
}

/// One page's bytes checked as a meta page and as a branch or leaf page
/// (numbered as its header says): the parsing of untrusted bytes behind
/// `--from lmdb`, without a file, for the fuzz target `lmdb_page`. Returns
/// the nodes of a tree page.
#[doc(hidden)]
pub fn parse_page(bytes: &[u8]) -> std::result::Result<usize, String> {
    let _ = parse_meta(bytes, 0);
    let pgno = le_u64(bytes, 0).ok_or("shorter than a page header")?;
    Ok(TreePage::parse(pgno, bytes.to_vec())?.nodes)
}

/// A failed read, worded for the usual cause: the file shrank after open.
fn read_failure(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        "the file ends before it (the file was truncated)".into()
    } else {
        e.to_string()
    }
}

fn le_u16(bytes: &[u8], at: usize) -> Option<u16> {
    bytes.get(at..)?.first_chunk().copied().map(u16::from_le_bytes)
}

fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..)?.first_chunk().copied().map(u32::from_le_bytes)
}

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    bytes.get(at..)?.first_chunk().copied().map(u64::from_le_bytes)
}

/// A key for an error message: escaped, and cut if long (a damaged key size
/// can make a key of 64 KiB).
pub(super) fn show_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    match key.get(..SHOWN) {
        Some(head) if key.len() > SHOWN => format!("{}... ({} bytes)", head.escape_ascii(), key.len()),
        _ => key.escape_ascii().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_orders_match_lmdb() {
        use Ordering::{Greater, Less};
        // memcmp, a prefix first.
        assert_eq!(KeyOrder::Bytes.compare(b"a", b"ab"), Less);
        assert_eq!(KeyOrder::Bytes.compare(b"ab", b"b"), Less);
        // From the end: little-endian 1 before 256, "ba" before "ab".
        assert_eq!(
            KeyOrder::Reversed.compare(&1u32.to_le_bytes(), &256u32.to_le_bytes()),
            Less
        );
        assert_eq!(KeyOrder::Reversed.compare(b"ab", b"ba"), Greater);
        assert_eq!(KeyOrder::Reversed.compare(b"b", b"ab"), Less);
        assert!(matches!(KeyOrder::of(MDB_INTEGERKEY), KeyOrder::Reversed));
        assert!(matches!(KeyOrder::of(0x04), KeyOrder::Bytes));
    }

    #[test]
    fn page_set_refuses_repeats_and_pages_past_its_bound() {
        let mut set = PageSet::new(130);
        assert!(set.insert(0) && set.insert(129) && set.insert(64));
        assert!(!set.insert(129));
        assert!(!set.insert(192), "past the bound");
        assert!(!set.insert(u64::MAX));
    }

    /// A 512-byte leaf page with one node at `at` whose key and data sizes
    /// are `key_len` and `data_len`.
    fn leaf_page(at: u16, key_len: u16, data_len: u32) -> TreePage {
        let mut bytes = vec![0u8; 512];
        bytes[16..18].copy_from_slice(&at.to_le_bytes());
        let node = usize::from(at).min(504);
        bytes[node..node + 2].copy_from_slice(&(data_len as u16).to_le_bytes());
        bytes[node + 2..node + 4].copy_from_slice(&((data_len >> 16) as u16).to_le_bytes());
        bytes[node + 6..node + 8].copy_from_slice(&key_len.to_le_bytes());
        TreePage {
            pgno: 2,
            leaf: true,
            bytes,
            upper: 400,
            nodes: 1,
        }
    }

    #[test]
    fn nodes_must_lie_inside_their_page() {
        let fits = leaf_page(400, 4, 100);
        let node = fits.node(0).unwrap();
        assert_eq!((node.key.len(), node.data.len(), node.end), (4, 100, 512));
        for (page, what) in [
            (leaf_page(400, 4, 101), "runs past the end of the page"),
            (leaf_page(400, 200, 0), "runs past the end of the page"),
            (leaf_page(400, 0, u32::MAX), "runs past the end of the page"),
            (leaf_page(508, 0, 0), "runs past the end of the page"),
            (leaf_page(300, 0, 0), "lies in the page's free space"),
        ] {
            let err = page.node(0).err().unwrap();
            assert!(err.contains(what), "{err}");
        }
        assert!(fits.node(1).is_err(), "only one node");
    }
}
