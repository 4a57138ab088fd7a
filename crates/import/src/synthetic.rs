//! `brand gen`: an ImageNet-like directory of synthetic samples, the embedded
//! default data for the demo, tests and benchmarks: one file per sample
//! (ImageFolder layout), or a few TFRecord shards of `tf.train.Example`s for
//! datasets of millions of small samples, where a file each is impractical.
//!
//! Sizes follow a log-normal (right-skewed, like JPEG sizes) clipped to
//! `[min, max]`, with its location solved so the clipped mean hits the
//! requested mean. Contents are pseudo-random, hence incompressible like
//! real JPEG payloads. Everything is a function of the seed.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::protobuf;
use crate::tfrecord::masked_crc32c;
use brand_format::error::{Error, IoContext, Result};
use brand_format::rng::{Prng, domain};

#[derive(Debug, Clone)]
pub struct GenOptions {
    pub samples: u64,
    pub mean_bytes: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub classes: u32,
    pub seed: u64,
    pub force: bool,
    /// Write small class-dependent PNG images of this side length instead of
    /// random bytes (sizes then follow from the images, not from the mean).
    pub images: Option<u32>,
    /// Make samples compressible about this many times (zstd): each random
    /// 64-byte block is followed by `ratio - 1` identical filler blocks.
    /// None: random bytes (incompressible, like JPEG payloads).
    pub compressible: Option<u32>,
    /// What to write the samples as.
    pub format: GenFormat,
}

/// How `gen` writes its samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GenFormat {
    /// One file per sample, `dir/class-CCCC/sample-NNNNNNNN.bin` (ImageFolder).
    #[default]
    Files,
    /// TFRecord shards `dir/shard-SSSSS-of-NNNNN.tfrecord`, sample `i` in
    /// order (shard by shard) as a `tf.train.Example` whose bytes feature
    /// `image` holds the sample and int64 feature `label` its class: what
    /// `brand pack --from tfrecord` imports. `shards`: how many (None: one
    /// per 512 MiB of samples).
    TfRecord { shards: Option<u32> },
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            samples: 1000,
            mean_bytes: 110 << 10,
            min_bytes: 10 << 10,
            max_bytes: 300 << 10,
            classes: 100,
            seed: 0,
            force: false,
            images: None,
            compressible: None,
            format: GenFormat::Files,
        }
    }
}

/// Largest sample `gen` writes: a record is limited to 4 GiB.
pub const MAX_SAMPLE_BYTES: u64 = u32::MAX as u64;

/// Most classes `gen` makes (one directory each).
pub const MAX_CLASSES: u32 = 1 << 20;

/// Most TFRecord shards `gen` writes (their names have five digits).
pub const MAX_SHARDS: u32 = 99_999;

/// Sample bytes per TFRecord shard when the number of shards is not given.
const SHARD_BYTES: u64 = 512 << 20;

impl GenOptions {
    /// Refuses what cannot work before anything is written (sizes and
    /// counts come from the command line).
    pub fn check(&self) -> Result<()> {
        if self.samples == 0 || self.samples > u32::MAX as u64 {
            return Err(Error::config(format!(
                "--samples {}: must be 1..={} (a dataset holds at most 2^32 - 1 samples)",
                self.samples,
                u32::MAX
            )));
        }
        if self.classes == 0 || self.classes > MAX_CLASSES {
            return Err(Error::config(format!(
                "--classes {}: must be 1..={MAX_CLASSES}",
                self.classes
            )));
        }
        if self.max_bytes > MAX_SAMPLE_BYTES {
            return Err(Error::config(format!(
                "largest sample {} bytes: at most {MAX_SAMPLE_BYTES} (a record is limited to 4 GiB)",
                self.max_bytes
            )));
        }
        if let Some(side) = self.images
            && !(1..=4096).contains(&side)
        {
            return Err(Error::config(format!("image size {side} outside 1..=4096")));
        }
        if let GenFormat::TfRecord { shards: Some(n) } = self.format
            && !(1..=MAX_SHARDS).contains(&n)
        {
            return Err(Error::config(format!("--shards {n}: must be 1..={MAX_SHARDS}")));
        }
        Ok(())
    }
}

/// Spread of the log-normal in log space: ImageNet's JPEG sizes are roughly this skewed.
const SIGMA: f64 = 0.6;

/// A standard normal draw (Box–Muller on two 53-bit uniforms).
fn normal(r: &mut Prng) -> f64 {
    let u = |r: &mut Prng| ((r.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (a, b) = (u(r), u(r));
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// The sample sizes for `opts`, deterministic in the seed.
pub fn sizes(opts: &GenOptions) -> Result<Vec<u64>> {
    opts.check()?;
    let (lo, hi, mean) = (opts.min_bytes, opts.max_bytes, opts.mean_bytes);
    if !(lo <= mean && mean <= hi) || hi == 0 {
        return Err(Error::config(format!(
            "need min ≤ mean ≤ max and max > 0 (got {lo}, {mean}, {hi} bytes)"
        )));
    }
    let mut r = Prng::stream(opts.seed, &[domain::GEN, 0]);
    let z: Vec<f64> = (0..opts.samples).map(|_| normal(&mut r)).collect();
    let size_at = |mu: f64, z: f64| (mu + SIGMA * z).exp().clamp(lo as f64, hi as f64);
    let mean_at = |mu: f64| z.iter().map(|&z| size_at(mu, z)).sum::<f64>() / z.len().max(1) as f64;
    // The clipped mean is monotone in mu: bisect.
    let (mut a, mut b) = ((lo.max(1) as f64).ln() - 4.0, (hi as f64).ln() + 4.0);
    for _ in 0..100 {
        let m = 0.5 * (a + b);
        if mean_at(m) < mean as f64 { a = m } else { b = m }
    }
    let mu = 0.5 * (a + b);
    Ok(z.iter().map(|&z| size_at(mu, z).round() as u64).collect())
}

/// Writes the dataset into `dir`: as `dir/class-CCCC/sample-NNNNNNNN.bin`
/// (`.png` with `images`), or as TFRecord shards (see [`GenFormat`]).
/// Returns the total bytes written. Calls `progress(done, total)`.
pub fn generate(dir: &Path, opts: &GenOptions, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<u64> {
    opts.check()?;
    if dir.exists() {
        let empty = std::fs::read_dir(dir).at(dir)?.next().is_none();
        if !empty && !opts.force {
            return Err(Error::config(format!(
                "{} exists and is not empty (use --force)",
                dir.display()
            )));
        }
    }
    let sizes = sizes(opts)?;
    let mut r = Prng::stream(opts.seed, &[domain::GEN, 1]);
    let classes: Vec<u32> = (0..opts.samples).map(|_| r.below(opts.classes as u64) as u32).collect();
    let samples = Samples {
        opts,
        sizes: &sizes,
        classes: &classes,
        done: AtomicU64::new(0),
        progress,
    };
    match opts.format {
        GenFormat::Files => samples.write_files(dir),
        GenFormat::TfRecord { shards } => {
            let total: u64 = sizes.iter().sum();
            let shards = shards.unwrap_or_else(|| {
                total
                    .div_ceil(SHARD_BYTES)
                    .clamp(1, opts.samples.min(MAX_SHARDS as u64)) as u32
            });
            samples.write_tfrecords(dir, shards)
        }
    }
}

/// What every sample of one `generate` is made from.
struct Samples<'a> {
    opts: &'a GenOptions,
    sizes: &'a [u64],
    classes: &'a [u32],
    done: AtomicU64,
    progress: &'a (dyn Fn(u64, u64) + Sync),
}

impl Samples<'_> {
    /// Sample `i`'s bytes and file extension: a function of the seed and
    /// `i` alone, whatever the format.
    fn sample(&self, i: u64) -> Result<(Vec<u8>, &'static str)> {
        let opts = self.opts;
        let mut r = Prng::stream(opts.seed, &[domain::GEN, 2, i]);
        Ok(match opts.images {
            Some(side) => (
                class_image(self.classes[i as usize], opts.classes, side, &mut r)?,
                "png",
            ),
            None => {
                let mut bytes = vec![0u8; self.sizes[i as usize] as usize];
                let repeat = opts.compressible.unwrap_or(1).max(1) as usize;
                for (i, block) in bytes.chunks_mut(64).enumerate() {
                    if i % repeat == 0 {
                        for word in block.chunks_mut(8) {
                            let v = r.next_u64().to_le_bytes();
                            word.copy_from_slice(&v[..word.len()]);
                        }
                    } else {
                        // The run's filler, the same in every block of the run.
                        for (j, b) in block.iter_mut().enumerate() {
                            *b = (i / repeat * 64 + j) as u8 ^ 0x5a;
                        }
                    }
                }
                (bytes, "bin")
            }
        })
    }

    /// Counts one more sample written.
    fn one_done(&self) {
        let d = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if d.is_multiple_of(256) || d == self.opts.samples {
            (self.progress)(d, self.opts.samples);
        }
    }

    fn write_files(&self, dir: &Path) -> Result<u64> {
        let opts = self.opts;
        for c in 0..opts.classes {
            let d = class_dir(dir, c);
            std::fs::create_dir_all(&d).at(&d)?;
        }
        let total = AtomicU64::new(0);
        brand_format::parallel::try_map(opts.samples as usize, |i| -> Result<()> {
            let (bytes, ext) = self.sample(i as u64)?;
            total.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            let path = class_dir(dir, self.classes[i]).join(format!("sample-{i:08}.{ext}"));
            std::fs::write(&path, &bytes).at(&path)?;
            self.one_done();
            Ok(())
        })?;
        Ok(total.into_inner())
    }

    /// `shards` files of consecutive samples, written in parallel; shards a
    /// previous `gen --force` left in `dir` are removed first, so the
    /// directory holds this dataset alone.
    fn write_tfrecords(&self, dir: &Path, shards: u32) -> Result<u64> {
        std::fs::create_dir_all(dir).at(dir)?;
        for e in std::fs::read_dir(dir).at(dir)? {
            let path = e.at(dir)?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with("shard-") && name.ends_with(".tfrecord") {
                std::fs::remove_file(&path).at(&path)?;
            }
        }
        let n = self.opts.samples;
        let written = brand_format::parallel::try_map(shards as usize, |s| -> Result<u64> {
            let path = dir.join(format!("shard-{s:05}-of-{shards:05}.tfrecord"));
            let (lo, hi) = (n * s as u64 / shards as u64, n * (s as u64 + 1) / shards as u64);
            let mut out = BufWriter::with_capacity(1 << 20, File::create(&path).at(&path)?);
            let mut bytes = 0u64;
            for i in lo..hi {
                let (sample, _) = self.sample(i)?;
                let record = example(&sample, self.classes[i as usize].into());
                let len = (record.len() as u64).to_le_bytes();
                out.write_all(&len).at(&path)?;
                out.write_all(&masked_crc32c(&len).to_le_bytes()).at(&path)?;
                out.write_all(&record).at(&path)?;
                out.write_all(&masked_crc32c(&record).to_le_bytes()).at(&path)?;
                bytes += record.len() as u64 + 16;
                self.one_done();
            }
            out.into_inner().map_err(|e| e.into_error()).at(&path)?;
            Ok(bytes)
        })?;
        Ok(written.iter().sum())
    }
}

/// `Example { features { feature { "image": bytes_list [image] }
/// feature { "label": int64_list [label] } } }`, serialized.
fn example(image: &[u8], label: i64) -> Vec<u8> {
    let mut bytes_list = Vec::with_capacity(image.len() + 8);
    protobuf::put_bytes(&mut bytes_list, 1, image);
    let mut image_feature = Vec::with_capacity(bytes_list.len() + 8);
    protobuf::put_bytes(&mut image_feature, 1, &bytes_list);
    let mut packed = Vec::new();
    // int64 is two's complement on the wire.
    protobuf::put_varint(&mut packed, label as u64);
    let mut int64_list = Vec::new();
    protobuf::put_bytes(&mut int64_list, 1, &packed);
    let mut label_feature = Vec::new();
    protobuf::put_bytes(&mut label_feature, 3, &int64_list);
    let mut features = Vec::with_capacity(image_feature.len() + label_feature.len() + 32);
    for (name, feature) in [(&b"image"[..], &image_feature), (b"label", &label_feature)] {
        let mut entry = Vec::with_capacity(feature.len() + name.len() + 8);
        protobuf::put_bytes(&mut entry, 1, name);
        protobuf::put_bytes(&mut entry, 2, feature);
        protobuf::put_bytes(&mut features, 1, &entry);
    }
    let mut out = Vec::with_capacity(features.len() + 8);
    protobuf::put_bytes(&mut out, 1, &features);
    out
}

/// Generates samples into `root/src` and packs them into `root/ds`, quietly:
/// the small datasets of tests and examples. Returns the dataset's path.
pub fn generate_and_pack(root: &Path, options: &GenOptions, pack: &brand_pack::PackOptions) -> Result<PathBuf> {
    let src = root.join("src");
    generate(&src, options, &|_, _| {})?;
    let source = crate::files::FileSource::image_folder(&src)?;
    let out = root.join("ds");
    brand_pack::pack(&source, &out, pack, &|_, _, _| {})?;
    Ok(out)
}

/// The small dataset the tests of several crates share: `samples` samples
/// of mean 8 KB (10 B to 40 KB, log-normal), 4 classes, packed with chunk
/// size 16 into `root/ds` (sources in `root/src`). Returns the dataset's path.
pub fn small_dataset(root: &Path, samples: u64) -> Result<PathBuf> {
    let options = GenOptions {
        samples,
        mean_bytes: 8000,
        min_bytes: 10,
        max_bytes: 40_000,
        classes: 4,
        ..Default::default()
    };
    let pack = brand_pack::PackOptions {
        chunk_size: 16,
        ..Default::default()
    };
    generate_and_pack(root, &options, &pack)
}

/// A dataset of large samples the tests of several crates share: `samples`
/// samples of mean 96 KiB (80 to 112 KiB), 4 classes, packed with
/// `chunk_size` into `root/ds`: chunks of 16 or more are reads above the
/// 1 MiB a start splits record by record. Returns the dataset's path.
pub fn large_dataset(root: &Path, samples: u64, chunk_size: u32) -> Result<PathBuf> {
    let options = GenOptions {
        samples,
        mean_bytes: 96 << 10,
        min_bytes: 80 << 10,
        max_bytes: 112 << 10,
        classes: 4,
        ..Default::default()
    };
    let pack = brand_pack::PackOptions {
        chunk_size,
        ..Default::default()
    };
    generate_and_pack(root, &options, &pack)
}

/// A `side`×`side` RGB PNG a small CNN can learn to classify: each class has
/// its own hue, stripe frequency and stripe direction; brightness, phase and
/// per-pixel noise vary per sample.
fn class_image(class: u32, classes: u32, side: u32, r: &mut Prng) -> Result<Vec<u8>> {
    if side == 0 || side > 4096 {
        return Err(Error::config(format!("image size {side} outside 1..=4096")));
    }
    let hue = class as f64 / classes as f64;
    let base = [0.0, 1.0 / 3.0, 2.0 / 3.0].map(|o: f64| 0.5 + 0.5 * (std::f64::consts::TAU * (hue + o)).cos());
    let freq = 1.0 + (class % 4) as f64;
    let vertical = (class / 4) % 2 == 1;
    let phase = r.below(1000) as f64 / 1000.0 * std::f64::consts::TAU;
    let gain = 0.7 + r.below(300) as f64 / 1000.0;
    let mut pixels = Vec::with_capacity((side * side * 3) as usize);
    for y in 0..side {
        for x in 0..side {
            let t = if vertical { x } else { y } as f64 / side as f64;
            let stripe = 0.65 + 0.35 * (std::f64::consts::TAU * freq * t + phase).sin();
            for c in base {
                let noise = r.below(61) as f64 - 30.0;
                pixels.push((255.0 * c * stripe * gain + noise).clamp(0.0, 255.0) as u8);
            }
        }
    }
    encode_png(side, &pixels)
}

#[cfg(feature = "images")]
fn encode_png(side: u32, pixels: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, side, side);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| Error::config(format!("png: {e}")))?;
    w.write_image_data(pixels)
        .map_err(|e| Error::config(format!("png: {e}")))?;
    w.finish().map_err(|e| Error::config(format!("png: {e}")))?;
    Ok(out)
}

#[cfg(not(feature = "images"))]
fn encode_png(_side: u32, _pixels: &[u8]) -> Result<Vec<u8>> {
    Err(Error::config(
        "images: this build of brand-pack has no PNG encoder (feature \"images\")",
    ))
}

fn class_dir(dir: &Path, class: u32) -> PathBuf {
    dir.join(format!("class-{class:04}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_hit_the_mean_within_bounds() {
        let opts = GenOptions {
            samples: 5000,
            ..Default::default()
        };
        let s = sizes(&opts).expect("sizes");
        let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
        assert!(
            (mean - opts.mean_bytes as f64).abs() < 0.01 * opts.mean_bytes as f64,
            "mean {mean}"
        );
        assert!(s.iter().all(|&x| (opts.min_bytes..=opts.max_bytes).contains(&x)));
        // Skewed: the median sits below the mean.
        let mut sorted = s.clone();
        sorted.sort_unstable();
        assert!((sorted[s.len() / 2] as f64) < mean);
        assert_eq!(s, sizes(&opts).expect("sizes"), "deterministic");
    }

    #[test]
    fn tfrecord_shards_hold_the_same_samples_as_files_and_import_with_labels() {
        use brand_pack::source::Source;
        let t = tempfile::tempdir().expect("tempdir");
        let base = GenOptions {
            samples: 203,
            mean_bytes: 512,
            min_bytes: 256,
            max_bytes: 1024,
            classes: 300,
            seed: 9,
            ..Default::default()
        };
        let files = t.path().join("files");
        generate(&files, &base, &|_, _| {}).expect("gen files");
        let tf = GenOptions {
            format: GenFormat::TfRecord { shards: Some(4) },
            ..base.clone()
        };
        let shards = t.path().join("tf");
        // A stale shard of an earlier run is replaced, not imported.
        std::fs::create_dir_all(&shards).expect("mkdir");
        std::fs::write(shards.join("shard-00000-of-00009.tfrecord"), b"stale").expect("write");
        let forced = GenOptions { force: true, ..tf };
        let written = generate(&shards, &forced, &|_, _| {}).expect("gen tfrecord");
        let names: Vec<String> = {
            let mut v: Vec<String> = std::fs::read_dir(&shards)
                .expect("ls")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names,
            (0..4)
                .map(|s| format!("shard-{s:05}-of-00004.tfrecord"))
                .collect::<Vec<_>>()
        );
        let on_disk: u64 = names
            .iter()
            .map(|n| std::fs::metadata(shards.join(n)).expect("stat").len())
            .sum();
        assert_eq!(written, on_disk);

        let source = crate::tfrecord::TfRecordSource::open(std::slice::from_ref(&shards), Some("label")).expect("open");
        assert_eq!(source.len(), 203);
        let mut r = Prng::stream(9, &[domain::GEN, 1]);
        for i in 0..203 {
            let class = r.below(300) as i64;
            assert_eq!(source.label(i), class, "label of sample {i}");
            let file = class_dir(&files, class as u32).join(format!("sample-{i:08}.bin"));
            let sample = std::fs::read(&file).expect("read sample file");
            let record = source.read(i).expect("read record");
            assert!(
                (256..=1024).contains(&sample.len()) && record.windows(sample.len()).any(|w| w == sample),
                "record {i} holds sample {i}'s bytes"
            );
            assert!(
                record.len() <= sample.len() + 48,
                "record {i}: {} bytes of overhead",
                record.len() - sample.len()
            );
        }
        assert_eq!(&*source.key(0), b"shard-00000-of-00004.tfrecord:0");
        assert_eq!(&*source.key(202), b"shard-00003-of-00004.tfrecord:50");
    }

    #[test]
    fn absurd_options_are_refused_before_writing() {
        let t = std::env::temp_dir().join(format!("brand-gen-absurd-{}", std::process::id()));
        let cases: [(&str, GenOptions); 8] = [
            (
                "--shards",
                GenOptions {
                    format: GenFormat::TfRecord { shards: Some(0) },
                    ..Default::default()
                },
            ),
            (
                "--samples",
                GenOptions {
                    samples: 1 << 63,
                    ..Default::default()
                },
            ),
            (
                "--samples",
                GenOptions {
                    samples: 0,
                    ..Default::default()
                },
            ),
            (
                "--classes",
                GenOptions {
                    classes: u32::MAX,
                    ..Default::default()
                },
            ),
            (
                "--classes",
                GenOptions {
                    classes: 0,
                    ..Default::default()
                },
            ),
            (
                "largest sample",
                GenOptions {
                    mean_bytes: 1 << 63,
                    max_bytes: 1 << 63,
                    ..Default::default()
                },
            ),
            (
                "largest sample",
                GenOptions {
                    mean_bytes: u64::MAX,
                    max_bytes: u64::MAX,
                    ..Default::default()
                },
            ),
            (
                "image size",
                GenOptions {
                    images: Some(u32::MAX),
                    ..Default::default()
                },
            ),
        ];
        for (what, opts) in cases {
            let msg = generate(&t, &opts, &|_, _| {})
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(msg.contains(what), "{what}: {msg}");
            assert!(!t.exists(), "{what}: nothing is written");
        }
    }

    #[test]
    #[cfg(feature = "images")]
    fn images_are_valid_pngs_that_differ_by_class() {
        let img = |class, seed| class_image(class, 10, 32, &mut Prng::stream(seed, &[])).expect("png");
        let decode = |bytes: Vec<u8>| {
            let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
                .read_info()
                .expect("png header");
            let mut buf = vec![0; reader.output_buffer_size().expect("size")];
            let info = reader.next_frame(&mut buf).expect("frame");
            assert_eq!(
                (info.width, info.height, info.color_type),
                (32, 32, png::ColorType::Rgb)
            );
            buf
        };
        let mean = |v: &[u8], ch: usize| v.iter().skip(ch).step_by(3).map(|&x| x as f64).sum::<f64>() / 1024.0;
        let (a, b) = (decode(img(0, 1)), decode(img(5, 1)));
        // Classes 0 and 5 have different hues: their channel means differ a lot.
        let d: f64 = (0..3).map(|c| (mean(&a, c) - mean(&b, c)).abs()).sum();
        assert!(d > 60.0, "class images too alike: {d}");
        assert_ne!(decode(img(0, 1)), decode(img(0, 2)), "samples of a class vary");
    }
}
