//! `brand gen`: an ImageNet-like directory of synthetic samples, the embedded
//! default data for the demo, tests and benchmarks.
//!
//! Sizes follow a log-normal (right-skewed, like JPEG sizes) clipped to
//! `[min, max]`, with its location solved so the clipped mean hits the
//! requested mean. Contents are pseudo-random, hence incompressible like
//! real JPEG payloads. Everything is a function of the seed.

use std::path::{Path, PathBuf};

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
        }
    }
}

/// Largest sample `gen` writes: a record is limited to 4 GiB.
pub const MAX_SAMPLE_BYTES: u64 = u32::MAX as u64;

/// Most classes `gen` makes (one directory each).
pub const MAX_CLASSES: u32 = 1 << 20;

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

/// Writes the dataset into `dir` as `dir/class-CCCC/sample-NNNNNNNN.bin`
/// (`.png` with `images`).
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
    for c in 0..opts.classes {
        let d = class_dir(dir, c);
        std::fs::create_dir_all(&d).at(&d)?;
    }
    let done = std::sync::atomic::AtomicU64::new(0);
    let total = std::sync::atomic::AtomicU64::new(0);
    crate::parallel::try_map(opts.samples as usize, |i| -> Result<()> {
        let i = i as u64;
        let mut r = Prng::stream(opts.seed, &[domain::GEN, 2, i]);
        let class = classes[i as usize];
        let (bytes, ext) = match opts.images {
            Some(side) => (class_image(class, opts.classes, side, &mut r)?, "png"),
            None => {
                let mut bytes = vec![0u8; sizes[i as usize] as usize];
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
        };
        total.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let path = class_dir(dir, class).join(format!("sample-{i:08}.{ext}"));
        std::fs::write(&path, &bytes).at(&path)?;
        let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if d.is_multiple_of(256) || d == opts.samples {
            progress(d, opts.samples);
        }
        Ok(())
    })?;
    Ok(total.into_inner())
}

/// Generates samples into `root/src` and packs them into `root/ds`, quietly:
/// the small datasets of tests and examples. Returns the dataset's path.
pub fn generate_and_pack(root: &Path, options: &GenOptions, pack: &crate::PackOptions) -> Result<PathBuf> {
    let src = root.join("src");
    generate(&src, options, &|_, _| {})?;
    let source = crate::files::FileSource::image_folder(&src)?;
    let out = root.join("ds");
    crate::pack(&source, &out, pack, &|_, _, _| {})?;
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
    let pack = crate::PackOptions {
        chunk_size: 16,
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
    fn absurd_options_are_refused_before_writing() {
        let t = std::env::temp_dir().join(format!("brand-gen-absurd-{}", std::process::id()));
        let cases: [(&str, GenOptions); 7] = [
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
