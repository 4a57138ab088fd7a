//! Tar import: WebDataset grouping, payload fields, labels, PAX and GNU long
//! names, tars of tars against the extracted tree, `.tar.gz` against the
//! plain tar, and a named error for each kind of damaged input. Archives are
//! written here with a small tar writer.

use std::fs;
use std::io::Write;
use std::path::Path;

use brand_format::Dataset;
use brand_import::files::FileSource;
use brand_import::tar::{TarLabel, TarOptions, TarSource};
use brand_pack::source::Source;
use brand_pack::{PackOptions, pack};

// ---- writing tars ----

/// A 512-byte header with a valid checksum; `magic` is POSIX's or GNU's.
fn header_with(name: &[u8], size_field: &[u8], typeflag: u8, magic: &[u8; 8]) -> [u8; 512] {
    assert!(name.len() <= 100, "a header name holds 100 bytes");
    let mut block = [0u8; 512];
    block[..name.len()].copy_from_slice(name);
    block[100..107].copy_from_slice(b"0000644");
    block[124..124 + size_field.len()].copy_from_slice(size_field);
    block[156] = typeflag;
    block[257..265].copy_from_slice(magic);
    block[148..156].fill(b' ');
    let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
    block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    block
}

fn size_field(size: u64) -> Vec<u8> {
    format!("{size:011o}\0").into_bytes()
}

const USTAR: &[u8; 8] = b"ustar\x0000";
const GNU: &[u8; 8] = b"ustar  \0";

#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn raw(&mut self, name: &[u8], typeflag: u8, data: &[u8], magic: &[u8; 8]) -> &mut Self {
        self.0
            .extend(header_with(name, &size_field(data.len() as u64), typeflag, magic));
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().next_multiple_of(512), 0);
        self
    }

    /// A regular member, named in the header.
    fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.raw(name.as_bytes(), b'0', data, USTAR)
    }

    /// A regular member named by a PAX `path` record (as Python's tarfile
    /// writes long or non-ASCII names).
    fn pax_file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        let record = pax_record("path", name);
        self.raw(b"PaxHeaders/x", b'x', &record, USTAR);
        self.raw(b"truncated-name", b'0', data, USTAR)
    }

    /// A regular member named by a GNU `L` entry (as GNU tar writes long names).
    fn gnu_file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        let mut long = name.as_bytes().to_vec();
        long.push(0);
        self.raw(b"././@LongLink", b'L', &long, GNU);
        self.raw(&name.as_bytes()[..100.min(name.len())], b'0', data, GNU)
    }

    fn dir(&mut self, name: &str) -> &mut Self {
        self.raw(name.as_bytes(), b'5', b"", USTAR)
    }

    /// The two zero blocks that end an archive.
    fn finish(&mut self) -> Vec<u8> {
        self.0.extend([0u8; 1024]);
        std::mem::take(&mut self.0)
    }
}

/// `"<len> key=value\n"`, `len` counting itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}").len() + body.len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

// ---- reading back ----

fn options(dir: &Path, fields: &str, label: TarLabel) -> TarOptions {
    TarOptions {
        fields: if fields.is_empty() {
            Vec::new()
        } else {
            TarOptions::parse_fields(fields).unwrap()
        },
        label,
        spool_dir: dir.to_path_buf(),
        store: brand_store::GetPolicy::default(),
        listing: Default::default(),
    }
}

/// Every sample as `(key, label, bytes)`, in source order.
fn samples(src: &dyn Source) -> Vec<(String, i64, Vec<u8>)> {
    (0..src.len())
        .map(|i| {
            let key = String::from_utf8(src.key(i).into_owned()).unwrap();
            (key, src.label(i), src.read(i).unwrap())
        })
        .collect()
}

/// Every sample of a packed dataset as `(key, label, bytes)`, sorted by key.
fn packed(dir: &Path) -> Vec<(String, i64, Vec<u8>)> {
    let d = Dataset::open(dir).unwrap();
    let mut out: Vec<_> = (0..d.index.samples())
        .map(|id| {
            let key = String::from_utf8(d.index.key(id).to_vec()).unwrap();
            (key, d.index.label(id), d.read_sample(id).unwrap())
        })
        .collect();
    out.sort();
    out
}

fn pack_to(src: &dyn Source, out: &Path) -> brand_format::Result<()> {
    let opts = PackOptions {
        chunk_size: 4,
        ..PackOptions::default()
    };
    pack(src, out, &opts, &|_, _, _| {}).map(|_| ())
}

fn data(i: usize, ext: &str) -> Vec<u8> {
    format!("{ext} of sample {i}: ")
        .bytes()
        .chain((0..i * 37).map(|b| b as u8))
        .collect()
}

/// A WebDataset shard: samples `first..first+n`, each `.JPEG`, `.cls` and
/// `.json` (and `.png` on even samples), some named by PAX or GNU long names.
fn webdataset_shard(first: usize, n: usize) -> Vec<u8> {
    let mut tar = Tar::default();
    for i in first..first + n {
        let key = format!("shard/s{i:04}");
        let long = format!("{}/s{i:04}", "deep".repeat(30));
        let cls = format!("{}\n", i % 5);
        let json = format!("{{\"label\": {}, \"caption\": \"x\"}}", 1000 + i);
        match i % 3 {
            0 => {
                tar.file(&format!("{key}.JPEG"), &data(i, "jpg"))
                    .file(&format!("{key}.cls"), cls.as_bytes())
                    .file(&format!("{key}.json"), json.as_bytes());
            }
            1 => {
                tar.pax_file(&format!("{long}é.JPEG"), &data(i, "jpg"))
                    .pax_file(&format!("{long}é.cls"), cls.as_bytes())
                    .pax_file(&format!("{long}é.json"), json.as_bytes());
            }
            _ => {
                tar.gnu_file(&format!("{long}.JPEG"), &data(i, "jpg"))
                    .gnu_file(&format!("{long}.cls"), cls.as_bytes())
                    .gnu_file(&format!("{long}.json"), json.as_bytes());
            }
        }
        if i % 2 == 0 {
            let name = match i % 3 {
                0 => key.clone(),
                1 => format!("{long}é"),
                _ => long.clone(),
            };
            tar.gnu_file(&format!("{name}.png"), &data(i, "png"));
        }
    }
    tar.file("__index__", b"webdataset metadata, not a sample");
    tar.finish()
}

fn webdataset_key(i: usize) -> String {
    match i % 3 {
        0 => format!("shard/s{i:04}"),
        1 => format!("{}/s{i:04}é", "deep".repeat(30)),
        _ => format!("{}/s{i:04}", "deep".repeat(30)),
    }
}

#[test]
fn webdataset_shards_keep_keys_payloads_and_labels() {
    let t = tempfile::tempdir().unwrap();
    let shards = t.path().join("shards");
    fs::create_dir(&shards).unwrap();
    fs::write(shards.join("b-000001.tar"), webdataset_shard(10, 10)).unwrap();
    fs::write(shards.join("a-000000.tar"), webdataset_shard(0, 10)).unwrap();
    fs::write(shards.join("notes.txt"), "not a shard").unwrap();

    // Sorted shards, samples in archive order; `--field png;jpeg`: png where
    // the sample has one, else the `.JPEG` (extensions compare without case).
    let src = TarSource::open(
        std::slice::from_ref(&shards),
        &options(t.path(), "png;jpeg", TarLabel::Cls),
    )
    .unwrap();
    let want: Vec<_> = (0..20)
        .map(|i| {
            let payload = if i % 2 == 0 { data(i, "png") } else { data(i, "jpg") };
            (webdataset_key(i), (i % 5) as i64, payload)
        })
        .collect();
    assert_eq!(samples(&src), want);
    assert_eq!(src.kind(), "tar");
    // A few bytes a sample besides the key bytes.
    let key_bytes: usize = want.iter().map(|(k, _, _)| k.len()).sum();
    assert!(src.listing_bytes() <= key_bytes + 20 * 24, "{}", src.listing_bytes());

    let json = TarSource::open(
        &[shards.join("a-000000.tar"), shards.join("b-000001.tar")],
        &options(t.path(), "jpeg", TarLabel::Json("label".into())),
    )
    .unwrap();
    let want_json: Vec<_> = (0..20)
        .map(|i| (webdataset_key(i), 1000 + i as i64, data(i, "jpg")))
        .collect();
    assert_eq!(samples(&json), want_json);

    // Through the packer: every sample's bytes, label and key.
    let out = t.path().join("ds");
    pack_to(&src, &out).unwrap();
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(packed(&out), sorted);
}

/// A class directory's name and its files' names and bytes.
type Class = (String, Vec<(String, Vec<u8>)>);

/// `root/<class>/<file>`: the tree ImageFolder and the tars are made from.
fn class_tree(root: &Path) -> Vec<Class> {
    let classes: Vec<Class> = ["n02", "n01", "n10"]
        .iter()
        .enumerate()
        .map(|(c, class)| {
            let files = (0..4 + c)
                .map(|i| (format!("{class}_{i}.JPEG"), data(100 * c + i, class)))
                .collect();
            (class.to_string(), files)
        })
        .collect();
    for (class, files) in &classes {
        fs::create_dir_all(root.join(class)).unwrap();
        for (name, bytes) in files {
            fs::write(root.join(class).join(name), bytes).unwrap();
        }
    }
    classes
}

#[test]
fn a_tar_of_tars_packs_as_the_extracted_tree_does() {
    let t = tempfile::tempdir().unwrap();
    let tree = t.path().join("train");
    let classes = class_tree(&tree);
    // ILSVRC2012_img_train.tar: one tar per class, in no particular order.
    let mut outer = Tar::default();
    for (class, files) in classes.iter().rev() {
        let mut inner = Tar::default();
        for (name, bytes) in files {
            inner.file(name, bytes);
        }
        let mut inner = inner.finish();
        inner.resize(inner.len().next_multiple_of(10240), 0); // a tar record
        outer.file(&format!("{class}.tar"), &inner);
    }
    let outer_path = t.path().join("train.tar");
    fs::write(&outer_path, outer.finish()).unwrap();

    let from_tar = TarSource::open(std::slice::from_ref(&outer_path), &options(t.path(), "", TarLabel::Dir)).unwrap();
    let from_dir = FileSource::image_folder(&tree).unwrap();
    assert_eq!(from_tar.len(), from_dir.len());
    assert_eq!(from_tar.label_names(), from_dir.label_names());
    assert_eq!(from_tar.label_names(), ["n01", "n02", "n10"]);
    let tar_ds = t.path().join("tar-ds");
    let dir_ds = t.path().join("dir-ds");
    pack_to(&from_tar, &tar_ds).unwrap();
    pack_to(&from_dir, &dir_ds).unwrap();
    // `n01/n01_3.JPEG` from the directory is `n01.tar/n01_3` from the tar.
    let mut dir_samples: Vec<_> = packed(&dir_ds)
        .into_iter()
        .map(|(key, label, bytes)| {
            let (class, file) = key.split_once('/').unwrap();
            let stem = file.split_once('.').unwrap().0;
            (format!("{class}.tar/{stem}"), label, bytes)
        })
        .collect();
    dir_samples.sort();
    assert_eq!(packed(&tar_ds), dir_samples);

    // A plain tar of the tree (directory entries and all): `--label dir`
    // numbers the parent directories the same way.
    let mut flat = Tar::default();
    for (class, files) in classes.iter().rev() {
        flat.dir(&format!("{class}/"));
        for (name, bytes) in files {
            flat.file(&format!("{class}/{name}"), bytes);
        }
    }
    let flat_path = t.path().join("flat.tar");
    fs::write(&flat_path, flat.finish()).unwrap();
    let from_flat = TarSource::open(&[flat_path], &options(t.path(), "jpeg", TarLabel::Dir)).unwrap();
    let flat_ds = t.path().join("flat-ds");
    pack_to(&from_flat, &flat_ds).unwrap();
    let mut dir_samples: Vec<_> = packed(&dir_ds)
        .into_iter()
        .map(|(key, label, bytes)| (key.split_once('.').unwrap().0.to_string(), label, bytes))
        .collect();
    dir_samples.sort();
    assert_eq!(packed(&flat_ds), dir_samples);
}

#[test]
fn a_gzipped_tar_packs_byte_identical_to_the_plain_tar() {
    let t = tempfile::tempdir().unwrap();
    let plain = t.path().join("shard.tar");
    let tgz = t.path().join("shard.tgz");
    let bytes = webdataset_shard(0, 30);
    fs::write(&plain, &bytes).unwrap();
    // Two gzip members, as pigz or `cat a.gz b.gz` make.
    let (head, tail) = bytes.split_at(5000);
    fs::write(&tgz, [gzip(head), gzip(tail)].concat()).unwrap();
    let spool = t.path().join("spool");
    fs::create_dir(&spool).unwrap();

    let from_plain = TarSource::open(&[plain], &options(t.path(), "png;jpeg", TarLabel::Cls)).unwrap();
    let from_gz = TarSource::open(&[tgz], &options(&spool, "png;jpeg", TarLabel::Cls)).unwrap();
    assert_eq!(samples(&from_gz), samples(&from_plain));
    // The spool is an anonymous file: nothing is left in its directory.
    assert_eq!(fs::read_dir(&spool).unwrap().count(), 0);
    let opts = PackOptions {
        chunk_size: 4,
        inputs: vec!["shard".into()],
        ..PackOptions::default()
    };
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    pack(&from_plain, &a, &opts, &|_, _, _| {}).unwrap();
    pack(&from_gz, &b, &opts, &|_, _, _| {}).unwrap();
    for name in fs::read_dir(&a).unwrap().map(|e| e.unwrap().file_name()) {
        assert_eq!(
            fs::read(a.join(&name)).unwrap(),
            fs::read(b.join(&name)).unwrap(),
            "{name:?}"
        );
    }
}

// ---- damaged input ----

/// A tar of two one-member samples: `a.jpg` (700 bytes, header at 0) and
/// `b.jpg` (10 bytes, header at 1536), then the end blocks at 2560.
fn two_samples() -> Vec<u8> {
    Tar::default().file("a.jpg", &[7; 700]).file("b.jpg", &[8; 10]).finish()
}

/// The error opening `bytes` as `name` (also gzipped, where the damage is
/// not about the file's length), and that packing leaves nothing behind.
fn open_error(name: &str, bytes: &[u8], fields: &str, label: TarLabel) -> String {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join(name);
    fs::write(&path, bytes).unwrap();
    let err = match TarSource::open(std::slice::from_ref(&path), &options(t.path(), fields, label)) {
        Ok(src) => {
            // A damage found only when reading: through the packer.
            let out = t.path().join("out");
            let err = pack_to(&src, &out).expect_err("packing damaged input");
            assert!(!out.exists(), "a failed pack left {}", out.display());
            err
        }
        Err(e) => e,
    };
    // Nothing but the input is left in its directory.
    let left: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from(name)]);
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    message
}

fn contains_all(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }
}

#[test]
fn a_truncated_tar_is_a_named_error() {
    let whole = two_samples();
    // Inside a's data: a runs past the end.
    let e = open_error("t.tar", &whole[..900], "", TarLabel::None);
    contains_all(
        &e,
        &[
            "\"a.jpg\" at byte 0",
            "runs past the end of the file",
            "700 bytes declared, 388 left",
        ],
    );
    // Inside b's header.
    let e = open_error("t.tar", &whole[..1600], "", TarLabel::None);
    contains_all(&e, &["byte 1536", "truncated", "header"]);
    // In the padding after b's data.
    let e = open_error("t.tar", &whole[..1600 + 500], "", TarLabel::None);
    contains_all(&e, &["\"b.jpg\" at byte 1536", "padding"]);
    // Inside the end-of-archive blocks.
    let e = open_error("t.tar", &whole[..2560 + 700], "", TarLabel::None);
    contains_all(&e, &["byte 3072", "end-of-archive"]);
    // Gzipped, cut inside a's data: the stream ends there.
    let gz = gzip(&whole[..900]);
    let e = open_error("t.tar.gz", &gz, "", TarLabel::None);
    contains_all(&e, &["\"a.jpg\" at byte 0", "decompressed tar", "truncated"]);
    // A gzip stream cut short.
    let gz = gzip(&whole);
    let e = open_error("t.tgz", &gz[..gz.len() - 10], "", TarLabel::None);
    contains_all(&e, &["t.tgz"]);
}

#[test]
fn a_tar_changed_after_listing_fails_the_pack_and_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("t.tar");
    fs::write(&path, two_samples()).unwrap();
    let src = TarSource::open(std::slice::from_ref(&path), &options(t.path(), "", TarLabel::None)).unwrap();
    fs::write(&path, &two_samples()[..600]).unwrap();
    let out = t.path().join("out");
    let e = pack_to(&src, &out).unwrap_err().to_string();
    contains_all(&e, &["t.tar", "sample \"a\" at byte 512", "ended early"]);
    assert!(!out.exists());
    let left: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("t.tar")]);
}

#[test]
fn a_bad_header_is_a_named_error() {
    let mut bad = two_samples();
    bad[1536 + 3] ^= 1; // b's name, not its checksum
    let e = open_error("t.tar", &bad, "", TarLabel::None);
    contains_all(&e, &["byte 1536", "bad header checksum"]);
    let e = open_error("t.tar.gz", &gzip(&bad), "", TarLabel::None);
    contains_all(&e, &["byte 1536 of the decompressed tar", "bad header checksum"]);
    // Not a tar at all.
    let e = open_error("t.tar", &[b'x'; 2048], "", TarLabel::None);
    contains_all(&e, &["byte 0", "not a tar"]);

    // Sizes of 2^63 (GNU base-256) and of 2^64 + 1: checked, never trusted.
    for (size, what) in [
        (
            &[0x80, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0][..],
            "9223372036854775808 bytes declared",
        ),
        (&[0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1][..], "above 2^64"),
        (b"77777777777\0", "8589934591 bytes declared"),
        (
            &[0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            "overflows",
        ),
    ] {
        let mut tar = Tar(header_with(b"huge.jpg", size, b'0', GNU).to_vec());
        tar.file("b.jpg", b"x");
        let e = open_error("t.tar", &tar.finish(), "", TarLabel::None);
        contains_all(&e, &["byte 0", what]);
    }
    // A PAX size that runs past the end.
    let mut tar = Tar::default();
    tar.raw(b"PaxHeaders/x", b'x', &pax_record("size", "1000000"), USTAR)
        .file("a.jpg", b"x");
    let e = open_error("t.tar", &tar.finish(), "", TarLabel::None);
    contains_all(&e, &["\"a.jpg\" at byte 1024", "1000000 bytes declared"]);
    // A PAX header that is not PAX records.
    let mut tar = Tar::default();
    tar.raw(b"PaxHeaders/x", b'x', b"garbage", USTAR).file("a.jpg", b"x");
    let e = open_error("t.tar", &tar.finish(), "", TarLabel::None);
    contains_all(&e, &["\"PaxHeaders/x\" at byte 0", "PAX"]);
}

#[test]
fn the_end_of_archive_may_be_missing_but_not_half_there() {
    let t = tempfile::tempdir().unwrap();
    let whole = two_samples();
    // Ending right after b's padding, or after one zero block: accepted
    // with a warning, as GNU tar accepts them.
    for (name, end) in [("no-end.tar", 2560), ("lone-zero.tar", 3072)] {
        let path = t.path().join(name);
        fs::write(&path, &whole[..end]).unwrap();
        for path in [path.clone(), {
            let gz = t.path().join(format!("{name}.gz"));
            fs::write(&gz, gzip(&whole[..end])).unwrap();
            gz
        }] {
            let src = TarSource::open(&[path], &options(t.path(), "", TarLabel::None)).unwrap();
            let got: Vec<_> = samples(&src).into_iter().map(|(k, _, b)| (k, b)).collect();
            assert_eq!(got, [("a".to_string(), vec![7; 700]), ("b".to_string(), vec![8; 10])]);
        }
    }
    // A zero block, then a header: damage, not an end.
    let mut bad = Tar::default().file("a.jpg", b"x").0.clone();
    bad.extend([0; 512]);
    bad.extend(Tar::default().file("b.jpg", b"y").finish());
    let e = open_error("t.tar", &bad, "", TarLabel::None);
    contains_all(&e, &["byte 1024", "zero block followed by a header"]);
    // Anything after the end of archive is not read (tar records pad it).
    let mut padded = two_samples();
    padded.extend([0xAB; 700]);
    let path = t.path().join("padded.tar");
    fs::write(&path, padded).unwrap();
    assert_eq!(
        TarSource::open(&[path], &options(t.path(), "", TarLabel::None))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn samples_that_do_not_fit_the_fields_or_labels_are_named_errors() {
    let shard = |members: &[(&str, &[u8])]| {
        let mut tar = Tar::default();
        for (name, bytes) in members {
            tar.file(name, bytes);
        }
        tar.finish()
    };
    let ok: &[(&str, &[u8])] = &[
        ("s1.jpg", b"1"),
        ("s1.cls", b"1"),
        ("s2.jpg", b"2"),
        ("s2.cls", b" 2\n"),
    ];
    // Without the chosen field.
    let mut no_png = ok.to_vec();
    no_png.push(("s3.txt", b"text"));
    no_png.push(("s3.cls", b"3"));
    let e = open_error("t.tar", &shard(&no_png), "png;jpg", TarLabel::Cls);
    contains_all(
        &e,
        &[
            "sample \"s3\" (member at byte 4096)",
            "none of the fields png, jpg",
            "it has txt, cls",
        ],
    );
    // A duplicate extension (by case) within a sample.
    let mut dup = ok.to_vec();
    dup.push(("s2.JPG", b"again"));
    let e = open_error("t.tar", &shard(&dup), "jpg", TarLabel::Cls);
    contains_all(
        &e,
        &[
            "member \"s2.JPG\" at byte 4096",
            "duplicate extension \"jpg\" in sample \"s2\"",
        ],
    );
    // A `.cls` that is no integer, and a sample with no `.cls`.
    let mut bad_cls = ok.to_vec();
    bad_cls[3] = ("s2.cls", b"two");
    let e = open_error("t.tar", &shard(&bad_cls), "jpg", TarLabel::Cls);
    contains_all(
        &e,
        &["sample \"s2\" (member at byte 2048)", "\"two\" is not an integer"],
    );
    let e = open_error("t.tar", &shard(&ok[..3]), "jpg", TarLabel::Cls);
    contains_all(&e, &["sample \"s2\" (member at byte 2048)", "no .cls member"]);
    // `--label json:FIELD` without such an integer field.
    let json: &[(&str, &[u8])] = &[("s1.jpg", b"1"), ("s1.json", br#"{"label": "cat"}"#)];
    let e = open_error("t.tar", &shard(json), "jpg", TarLabel::Json("label".into()));
    contains_all(&e, &["sample \"s1\"", "no integer field \"label\""]);
    // No --field and several members: asks for one.
    let e = open_error("t.tar", &shard(ok), "", TarLabel::None);
    contains_all(
        &e,
        &["sample \"s1\" (member at byte 0)", "2 members (jpg, cls)", "--field"],
    );
    // `--label dir` on a member in no directory.
    let e = open_error("t.tar", &shard(&ok[..1]), "jpg", TarLabel::Dir);
    contains_all(&e, &["sample \"s1\"", "neither in an inner tar nor in a directory"]);
}

#[test]
fn no_damaged_archive_panics() {
    // Every truncation and many one-byte changes of a tar of tars with PAX
    // and GNU names, listed and read, plain and gzipped: errors, no panics.
    let mut inner = Tar::default();
    inner.file("x.jpg", &[1; 600]).pax_file("long/é.jpg", b"2");
    let mut outer = Tar::default();
    outer
        .file("c.tar", &inner.finish())
        .gnu_file(&format!("{}.jpg", "d".repeat(150)), &[3; 1000]);
    let archive = outer.finish();
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("fuzz.tar");
    let gz_path = t.path().join("fuzz.tgz");
    let try_open = |bytes: &[u8]| {
        fs::write(&path, bytes).unwrap();
        fs::write(&gz_path, gzip(bytes)).unwrap();
        for p in [&path, &gz_path] {
            for label in [TarLabel::Dir, TarLabel::None] {
                if let Ok(src) = TarSource::open(std::slice::from_ref(p), &options(t.path(), "", label)) {
                    (0..src.len()).for_each(|i| drop(src.read(i)));
                }
            }
        }
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for cut in (0..archive.len()).step_by(61) {
        try_open(&archive[..cut]);
    }
    for _ in 0..300 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut damaged = archive.clone();
        let at = (seed % archive.len() as u64) as usize;
        damaged[at] = (seed >> 32) as u8;
        try_open(&damaged);
    }
}
