//! `brand simulate`: run the plan of every rank for some epochs, without
//! reading anything, and report what it would read and how random the
//! order is.

use std::fmt;

use serde::Serialize;

use crate::order::OrderMeter;
use crate::tier::{ChunkRead, TierEpoch, TierModel, simulate_kept, simulate_tier};
use crate::{Event, Geometry, PlanConfig, Planner, Policy, Residency, Start};
use brand_format::error::{Error, Result};
use brand_format::extents::{ReadGap, extents, get_parts, group_touching};
use brand_format::ids::IdBits;
use brand_format::index::Index;

/// What to simulate besides the plan config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    pub epochs: u64,
    /// Serves per batch, for the label-diversity metric.
    pub batch: u64,
    /// Count the requests and bytes of reading from an object store this
    /// way (`None`: not counted).
    pub fetch: Option<FetchModel>,
    /// Count what a local tier of whole chunks of this size would fetch
    /// ([`crate::tier`]; every rank on one machine, sharing it).
    pub tier: Option<TierModel>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            epochs: 1,
            batch: 256,
            fetch: None,
            tier: None,
        }
    }
}

/// How the engine would fetch each plan read from an object store: the
/// read's extents under `gap` (what the engine submits), touching ones
/// grouped and long ones split into GETs of at most `get_bytes`, as the
/// objects backend does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchModel {
    pub gap: ReadGap,
    pub get_bytes: u64,
}

/// What a plan read costs on an object store under a [`FetchModel`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCost {
    /// Extents the engine submits.
    pub extents: u64,
    /// GETs the objects backend issues for them.
    pub gets: u64,
    /// Bytes those GETs fetch.
    pub bytes: u64,
}

/// The cost of one plan read `Read { chunk, mask }` fetched as `model`
/// says, with the functions the engine and the objects backend use
/// ([`extents`], [`group_touching`], [`get_parts`]). Only this read's
/// extents are grouped: the backend also merges extents of other reads
/// waiting with it where they touch, which sparse reads of different
/// chunks do not, and whole chunks of ≥ half `get_bytes` cannot (two
/// pass the limit); elsewhere this is an upper bound on GETs.
pub fn read_cost(index: &Index, chunk: u64, mask: u64, model: FetchModel) -> ReadCost {
    let ext = extents(index, chunk, mask, model.gap);
    let ranges: Vec<(u32, u64, u64)> = ext.iter().map(|e| (e.segment, e.offset, e.len)).collect();
    let groups = group_touching(&ranges, model.get_bytes);
    ReadCost {
        extents: ext.len() as u64,
        gets: groups.iter().map(|g| get_parts(g.end - g.start, model.get_bytes)).sum(),
        bytes: groups.iter().map(|g| g.end - g.start).sum(),
    }
}

/// Which of an epoch's tier counts a table shows.
type TierOf = fn(&EpochReport) -> Option<TierEpoch>;

#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub policy: Policy,
    pub memory: String,
    pub seed: u64,
    pub world: u32,
    pub drop_last: bool,
    pub run_length: u32,
    pub batch: u64,
    /// The read gap requests are counted with: `"whole"` or a byte count
    /// (absent: not counted).
    pub read_gap: Option<String>,
    /// GETs are at most this many bytes (with `read_gap`).
    pub get_bytes: Option<u64>,
    /// The tier's size in bytes (absent: no tier counted).
    pub tier_limit_bytes: Option<u64>,
    pub mean_sample_bytes: f64,
    pub geometry: Geometry,
    pub epochs: Vec<EpochReport>,
}

/// One epoch over all ranks. Epoch 0 starts with empty memory; each later
/// epoch continues in the same processes.
#[derive(Debug, Clone, Serialize)]
pub struct EpochReport {
    pub epoch: u64,
    /// Serves over all ranks, padding included.
    pub requests: u64,
    /// Serves that are padding repeats.
    pub padding: u64,
    /// Read events over all ranks: memory misses. With several ranks one
    /// refill of the protocol becomes one read on each rank that serves one
    /// of its records.
    pub reads: u64,
    /// Device requests if each read fetches every run of neighbouring
    /// records it fills in one request (what a read gap of at least the
    /// padding between records does): what `run_length` cuts.
    pub run_requests: u64,
    /// Bytes if every read fetches its whole (padded) chunk.
    pub bytes_whole: u64,
    /// Bytes if a read fetches only its records, each widened to 4 KiB
    /// alignment, merging ranges that touch or overlap (gap 0).
    pub bytes_sparse: u64,
    /// Stored bytes of every served sample, padding included.
    pub useful_bytes: u64,
    /// `bytes_whole / useful_bytes`.
    pub amplification_whole: Option<f64>,
    /// `bytes_sparse / useful_bytes`.
    pub amplification_sparse: Option<f64>,
    /// With a read gap: extents the engine submits for the epoch's reads.
    pub extents: Option<u64>,
    /// With a read gap: GETs the objects backend issues for them.
    pub gets: Option<u64>,
    /// With a read gap: bytes those GETs fetch.
    pub bytes_fetched: Option<u64>,
    /// `gets / reads`.
    pub gets_per_read: Option<f64>,
    /// `bytes_fetched / useful_bytes`.
    pub fetched_per_served: Option<f64>,
    /// With a tier: what its reads cost with the tier as built (chunks kept
    /// as first read while there is room, never evicted: hits on the local
    /// disk, whole chunks fetched, reads passed to the store as without a
    /// tier), and with eviction by the plan (Belady) instead.
    pub tier: Option<TierEpoch>,
    pub tier_by_plan: Option<TierEpoch>,
    /// Every sample served exactly once over all ranks (padding aside); with
    /// `drop_last`, all distinct and `world × ⌊N/world⌋` of them.
    pub exactly_once: bool,
    /// Every serve finds its sample in its rank's memory and no read
    /// fetches a sample the rank already holds.
    pub reads_cover_serves: bool,
    /// Most samples one rank holds at once.
    pub peak_resident: u64,
    /// Mean |served position difference| of records in adjacent slots of
    /// the same packed chunk, over its value for a uniform permutation,
    /// `(N + 1) / 3`. 1 is uniform; near 0, chunk-mates are served together.
    pub chunk_mate_dispersion: Option<f64>,
    /// Spearman correlation of each sample's position with the previous
    /// epoch's (samples served in both). Near 0 for independent epochs.
    pub spearman_vs_previous: Option<f64>,
    /// Mean distinct labels per batch (each rank's consecutive serves) over
    /// its expectation for a uniform random batch of the same size.
    pub label_diversity: Option<f64>,
}

/// [`simulate_with`] with 256-sample batches.
pub fn simulate(index: &Index, config: &PlanConfig, epochs: u64) -> Result<SimReport> {
    simulate_with(
        index,
        config,
        &SimOptions {
            epochs,
            ..SimOptions::default()
        },
    )
}

/// Most bytes of per-rank bitmaps a simulation allocates (1 GiB: 6 700
/// ranks of an ImageNet-sized dataset).
const MAX_BITMAP_BYTES: u128 = 1 << 30;

/// One bitmap of `n` bits per rank. They grow as `world × n`, and more ranks
/// than samples would only serve padding: refused with a clear error instead
/// of aborting on allocation.
fn held_bitmaps(world: usize, n: usize) -> Result<Vec<IdBits>> {
    if world > n {
        return Err(Error::config(format!(
            "world {world} is more ranks than the dataset's {n} samples: nothing to simulate but padding"
        )));
    }
    let words = n.div_ceil(64);
    let bytes = world as u128 * words as u128 * 8;
    if bytes > MAX_BITMAP_BYTES {
        return Err(Error::config(format!(
            "simulating {world} ranks of {n} samples needs {bytes} bytes of bitmaps (at most {MAX_BITMAP_BYTES}): use fewer ranks"
        )));
    }
    Ok(vec![IdBits::new(n as u64); world])
}

/// Plans `options.epochs` epochs of every rank of `config.world` (the
/// config's own rank is ignored) and measures them.
pub fn simulate_with(index: &Index, config: &PlanConfig, options: &SimOptions) -> Result<SimReport> {
    let planner = Planner::new(index, config)?;
    let geo = *planner.geometry();
    let n = geo.samples as usize;
    let world = geo.world as usize;
    let batch = options.batch.max(1);
    let mut order = OrderMeter::new(index);
    // Per rank: the samples it holds, one bit each; kept across epochs
    // because resident mode keeps memory.
    let mut held = held_bitmaps(world, n)?;
    let mut residency = vec![Residency::default(); world];
    let mut epochs = Vec::new();
    // Every epoch's chunk reads in the order the ranks make them together
    // (by the position each read is for), for the tier.
    let mut chunk_reads: Vec<ChunkRead> = Vec::new();
    for epoch in 0..options.epochs {
        let global = planner.global_epoch(epoch);
        let start = if epoch == 0 {
            Start::Cold { position: 0 }
        } else {
            Start::Continue
        };
        let mut r = EpochReport {
            epoch,
            requests: 0,
            padding: 0,
            reads: 0,
            run_requests: 0,
            bytes_whole: 0,
            bytes_sparse: 0,
            useful_bytes: 0,
            amplification_whole: None,
            amplification_sparse: None,
            extents: None,
            gets: None,
            bytes_fetched: None,
            gets_per_read: None,
            fetched_per_served: None,
            tier: None,
            tier_by_plan: None,
            exactly_once: true,
            reads_cover_serves: true,
            peak_resident: 0,
            chunk_mate_dispersion: None,
            spearman_vs_previous: None,
            label_diversity: None,
        };
        let mut times_served = vec![0u8; n];
        let mut cost = ReadCost::default();
        // (position of the serve the read is for, rank, read number, chunk,
        // its bytes and GETs from the store without a tier).
        let mut epoch_reads: Vec<(u64, usize, usize, u64, u64, u64)> = Vec::new();
        for rank in 0..world {
            // A rank serves positions rank, rank + world, …: a read comes
            // before the serve of the next one.
            let mut next_position = rank as u64;
            let plan = global.rank_plan(rank as u32, start)?;
            let held = &mut held[rank];
            let residency = &mut residency[rank];
            residency.peak = residency.held;
            let mut batch_samples = Vec::with_capacity(batch as usize);
            for event in plan {
                residency.observe(&event);
                match event {
                    Event::Read { chunk, mask } => {
                        r.reads += 1;
                        if let Some(t) = options.tier {
                            // Without a tier: as the fetch model says, else whole.
                            let (bytes, gets) = match options.fetch {
                                Some(model) => {
                                    let c = read_cost(index, chunk, mask, model);
                                    (c.bytes, c.gets)
                                }
                                None => {
                                    let len = index.chunk_padded_len(chunk);
                                    (len, get_parts(len, t.get_bytes))
                                }
                            };
                            epoch_reads.push((next_position, rank, epoch_reads.len(), chunk, bytes, gets));
                        }
                        // The first record of each run of set bits.
                        r.run_requests += (mask & !(mask << 1)).count_ones() as u64;
                        r.bytes_whole += index.chunk_padded_len(chunk);
                        r.bytes_sparse += sparse_bytes(index, chunk, mask);
                        if let Some(model) = options.fetch {
                            let c = read_cost(index, chunk, mask, model);
                            cost.extents += c.extents;
                            cost.gets += c.gets;
                            cost.bytes += c.bytes;
                        }
                        let first = chunk * geo.chunk_size as u64;
                        for_each_bit(mask, |j| {
                            if !held.insert(first + j as u64) {
                                r.reads_cover_serves = false;
                            }
                        });
                    }
                    Event::Serve {
                        position: p,
                        sample,
                        padding,
                        frees,
                        ..
                    } => {
                        let id = sample as usize;
                        r.requests += 1;
                        next_position = p + world as u64;
                        r.useful_bytes += index.stored_len(id as u64) as u64;
                        if !held.contains(sample) {
                            r.reads_cover_serves = false;
                        }
                        if frees {
                            held.remove(sample);
                        }
                        if padding {
                            r.padding += 1;
                        } else {
                            times_served[id] = times_served[id].saturating_add(1);
                            order.served(sample, p);
                        }
                        batch_samples.push(sample);
                        if batch_samples.len() as u64 == batch {
                            order.batch(&batch_samples);
                            batch_samples.clear();
                        }
                    }
                }
            }
            order.batch(&batch_samples);
            r.peak_resident = r.peak_resident.max(residency.peak);
        }
        let real = r.requests - r.padding;
        r.exactly_once = if config.drop_last {
            times_served.iter().all(|&t| t <= 1) && real == geo.positions
        } else {
            times_served.iter().all(|&t| t == 1)
        };
        let ratio = |bytes: u64| (r.useful_bytes > 0).then(|| bytes as f64 / r.useful_bytes as f64);
        r.amplification_whole = ratio(r.bytes_whole);
        r.amplification_sparse = ratio(r.bytes_sparse);
        if options.fetch.is_some() {
            r.extents = Some(cost.extents);
            r.gets = Some(cost.gets);
            r.bytes_fetched = Some(cost.bytes);
            r.gets_per_read = (r.reads > 0).then(|| cost.gets as f64 / r.reads as f64);
            r.fetched_per_served = ratio(cost.bytes);
        }
        epoch_reads.sort_unstable();
        chunk_reads.extend(
            epoch_reads
                .iter()
                .map(|&(_, _, _, chunk, store_bytes, store_gets)| ChunkRead {
                    epoch,
                    chunk,
                    store_bytes,
                    store_gets,
                }),
        );
        let q = order.end_epoch();
        r.chunk_mate_dispersion = q.chunk_mate_dispersion;
        r.spearman_vs_previous = q.spearman_vs_previous;
        r.label_diversity = q.label_diversity;
        epochs.push(r);
    }
    if let Some(model) = options.tier {
        let pinned = (config.policy == crate::Policy::Tiered)
            .then(|| brand_format::pin::pinned(index.chunk_count(), config.pinned_share));
        let kept = simulate_kept(index, &chunk_reads, options.epochs, model, pinned.as_deref());
        let by_plan = simulate_tier(index, &chunk_reads, options.epochs, model);
        for ((r, k), p) in epochs.iter_mut().zip(kept).zip(by_plan) {
            r.tier = Some(k);
            r.tier_by_plan = Some(p);
        }
    }
    Ok(SimReport {
        policy: config.policy,
        memory: config.memory.to_string(),
        seed: config.seed,
        world: config.world,
        drop_last: config.drop_last,
        run_length: config.run_length,
        batch,
        read_gap: options.fetch.map(|m| match m.gap {
            ReadGap::Whole => "whole".to_string(),
            ReadGap::Bytes(b) => b.to_string(),
        }),
        get_bytes: options.fetch.map(|m| m.get_bytes),
        tier_limit_bytes: options.tier.map(|t| t.limit_bytes),
        mean_sample_bytes: index.stored_lens().map(|l| l as f64).sum::<f64>() / n as f64,
        geometry: geo,
        epochs,
    })
}

fn for_each_bit(mut mask: u64, mut f: impl FnMut(u32)) {
    while mask != 0 {
        f(mask.trailing_zeros());
        mask &= mask - 1;
    }
}

/// Bytes read when fetching only the records of `mask`: each record widened
/// to [`ALIGN`](brand_format::ALIGN) boundaries, ranges that touch or
/// overlap merged (gap 0: a gap of even one block is not read).
pub fn sparse_bytes(index: &Index, chunk: u64, mask: u64) -> u64 {
    // Exactly what the io engine reads with a zero read gap.
    extents(index, chunk, mask, ReadGap::Bytes(0))
        .iter()
        .map(|e| e.len)
        .sum()
}

/// `1536` → `"1.5 KiB"`.
fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.geometry;
        writeln!(
            f,
            "{} samples in {} chunks of {} (mean {:.1} KiB), policy {}, memory {} per rank",
            g.samples,
            g.chunks,
            g.chunk_size,
            self.mean_sample_bytes / 1024.0,
            self.policy,
            self.memory
        )?;
        let mode = if g.holds_all {
            "resident: the whole dataset fits".to_string()
        } else {
            format!("{} groups of {} chunks", g.groups, g.group_size)
        };
        writeln!(
            f,
            "{} slots per rank, world {} ({} slots, {mode}), seed {}, batch {}, {}, run length {}",
            g.rank_slots,
            g.world,
            g.world_slots,
            self.seed,
            self.batch,
            if self.drop_last { "drop last" } else { "pad" },
            self.run_length
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:>5} {:>10} {:>9} {:>9} {:>11} {:>11} {:>11} {:>6} {:>6} {:>5} {:>9} {:>6} {:>8} {:>6}",
            "epoch",
            "requests",
            "reads",
            "runs",
            "read whole",
            "read sparse",
            "served",
            "amp-w",
            "amp-s",
            "once",
            "peak res",
            "disp",
            "spearman",
            "labels"
        )?;
        let opt = |x: Option<f64>, prec: usize| x.map_or("-".to_string(), |v| format!("{v:.prec$}"));
        for e in &self.epochs {
            writeln!(
                f,
                "{:>5} {:>10} {:>9} {:>9} {:>11} {:>11} {:>11} {:>6} {:>6} {:>5} {:>9} {:>6} {:>8} {:>6}",
                e.epoch,
                e.requests,
                e.reads,
                e.run_requests,
                human(e.bytes_whole),
                human(e.bytes_sparse),
                human(e.useful_bytes),
                opt(e.amplification_whole, 2),
                opt(e.amplification_sparse, 2),
                if e.exactly_once && e.reads_cover_serves {
                    "ok"
                } else {
                    "FAIL"
                },
                e.peak_resident,
                opt(e.chunk_mate_dispersion, 3),
                opt(e.spearman_vs_previous, 3),
                opt(e.label_diversity, 3),
            )?;
        }
        if let (Some(gap), Some(get_bytes)) = (&self.read_gap, self.get_bytes) {
            let gap = if gap == "whole" {
                gap.clone()
            } else {
                gap.parse::<u64>().map_or(gap.clone(), human)
            };
            writeln!(
                f,
                "\nfetched from a store with read gap {gap}, GETs of at most {}:",
                human(get_bytes)
            )?;
            writeln!(
                f,
                "{:>5} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11} {:>8}",
                "epoch", "reads", "extents", "GETs", "GETs/read", "fetched", "served", "fetch/s"
            )?;
            for e in &self.epochs {
                writeln!(
                    f,
                    "{:>5} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11} {:>8}",
                    e.epoch,
                    e.reads,
                    e.extents.map_or("-".to_string(), |v| v.to_string()),
                    e.gets.map_or("-".to_string(), |v| v.to_string()),
                    opt(e.gets_per_read, 2),
                    e.bytes_fetched.map_or("-".to_string(), human),
                    human(e.useful_bytes),
                    opt(e.fetched_per_served, 2),
                )?;
            }
            f.write_str(
                "extents: reads the engine submits; GETs: the objects backend's requests for them \
                 (touching extents of a read merged, long ones split); fetch/s: fetched / served\n",
            )?;
        }
        if let Some(limit) = self.tier_limit_bytes {
            let tables: [(&str, TierOf); 2] = [
                (
                    "as built: chunks kept as first read while there is room, never evicted",
                    |e| e.tier,
                ),
                (
                    "if it evicted by the plan: the chunk read furthest ahead first (Belady)",
                    |e| e.tier_by_plan,
                ),
            ];
            for (rule, tier_of) in tables {
                writeln!(f, "\nwith a local tier of {} ({rule}):", human(limit))?;
                writeln!(
                    f,
                    "{:>5} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9} {:>9} {:>11}",
                    "epoch", "reads", "tier hits", "misses", "passed", "fetched", "GETs", "evicted", "tier holds"
                )?;
                for e in &self.epochs {
                    if let Some(t) = tier_of(e) {
                        writeln!(
                            f,
                            "{:>5} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9} {:>9} {:>11}",
                            e.epoch,
                            e.reads,
                            t.hits,
                            t.misses,
                            t.passed,
                            human(t.bytes_fetched),
                            t.gets,
                            t.evictions,
                            human(t.held_bytes),
                        )?;
                    }
                }
            }
            f.write_str(
                "tier hits: reads from the local disk; misses: whole chunks fetched from the store \
                 (GETs of at most the get size); passed: reads of chunks not kept, fetched as without \
                 a tier (with --read-gap, its records; else the whole chunk)\n",
            )?;
        }
        f.write_str(
            "\nruns: device requests if each run of neighbouring records a read fills is one request\n\
             read whole/sparse: bytes if reads fetch whole chunks / only their records \
             (4 KiB-aligned, touching ranges merged)\n\
             amp: read / served. once: every sample served exactly once, each read before its serve\n\
             disp: chunk-mate dispersion (1 = uniform). spearman: rank correlation with the \
             previous epoch\n\
             labels: distinct labels per batch / their expectation for a uniform random batch\n",
        )?;
        Ok(())
    }
}
