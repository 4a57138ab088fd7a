//! `brand simulate`: plan-only run over all ranks, reporting read
//! amplification and order quality for a memory budget. Reads the manifest
//! and index only, never the segments.

use std::io::Write;
use std::path::PathBuf;

use brand_format::extents::ReadGap;
use brand_io::config::ReadGapSetting;
use brand_plan::simulate::{FetchModel, SimOptions, simulate_with};
use brand_plan::tier::TierModel;

use crate::configure::{Flag, resolve};

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// Dataset directory (written by `brand pack`).
    pub dataset: PathBuf,
    /// Memory budget of each rank: bytes (`512MiB`, `2G`, `1048576`) or a
    /// percentage of the dataset (`10%`).
    #[arg(long, value_name = "BYTES|PCT")]
    pub memory: String,
    /// brand, brand-random, direct, chunk-shuffle, sequential or tiered.
    #[arg(long, default_value = "brand")]
    pub policy: String,
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Number of ranks; all of them are simulated.
    #[arg(long, default_value_t = 1)]
    pub world: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Samples per batch, for the label-diversity metric.
    #[arg(long, default_value_t = 256)]
    pub batch: u64,
    /// Brand policies: fill records in runs of this many neighbours, each
    /// read in one request (1..=64; 1 is record by record). `auto` is chosen
    /// when a loader opens, from the device: give the number here.
    #[arg(long, default_value_t = 1)]
    pub run_length: u32,
    /// Also count what reading from an object store costs with this read
    /// gap: `whole` or bytes (`auto` is probed from a store when a loader
    /// opens: give the gap it chose, `brand read --json` reports it).
    #[arg(long, value_name = "BYTES|whole")]
    pub read_gap: Option<String>,
    /// With `--read-gap`: GETs of at most this many bytes (the store's
    /// `get_size`).
    #[arg(long, value_name = "BYTES", default_value = "8MiB")]
    pub get_size: String,
    /// Also count what a local tier this large (bytes, or a share of the
    /// dataset: "30%") would fetch from a store, every rank on one machine
    /// sharing it, misses fetched whole in GETs of `--get-size`: as built
    /// (chunks kept as first read, never evicted; the others read as
    /// without a tier) and if it evicted by the plan (Belady).
    #[arg(long, value_name = "BYTES|PCT")]
    pub disk_cache_limit: Option<String>,
    /// Drop the tail so ranks get ⌊N/world⌋ samples instead of padding.
    #[arg(long)]
    pub drop_last: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &SimulateArgs) -> brand_format::Result<()> {
    let dataset = brand_store::open(&args.dataset)?;
    // The plan settings as every command resolves them (rank 0: every
    // rank is simulated).
    let mut config = resolve(
        None,
        &[
            ("memory", Flag::Text(&Some(args.memory.clone()))),
            ("policy", Flag::Text(&Some(args.policy.clone()))),
            ("seed", Flag::Int(Some(args.seed))),
            ("world", Flag::Int(Some(args.world.into()))),
            ("drop_last", Flag::Bool(args.drop_last)),
            ("run_length", Flag::Int(Some(args.run_length.into()))),
        ],
        false,
    )?
    .loader
    .plan;
    let fetch = args
        .read_gap
        .as_deref()
        .map(|gap| fetch_model(gap, &args.get_size))
        .transpose()?;
    let tier = args
        .disk_cache_limit
        .as_deref()
        .map(|limit| tier_model(&dataset, limit, &args.get_size))
        .transpose()?;
    if let Some(t) = tier {
        // What a tiered reader pins under this limit (IoConfig::pinned_share).
        config.pinned_share = match config.policy {
            brand_plan::Policy::Tiered => brand_format::pin::share_within(&dataset.index, t.limit_bytes),
            _ => 0,
        };
    }
    let options = SimOptions {
        epochs: args.epochs,
        batch: args.batch,
        fetch,
        tier,
    };
    let report = simulate_with(&dataset.index, &config, &options)?;
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&report)
            .map_err(|e| brand_format::Error::config(format!("cannot encode the report as JSON: {e}")))?;
        json.push('\n');
        json
    } else {
        report.to_string()
    };
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // `brand simulate … | head` is not an error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(brand_format::Error::io("<stdout>", e)),
        _ => Ok(()),
    }
}

/// `--disk-cache-limit` (parsed as the key `disk_cache_limit` is, a share
/// of the dataset's bytes as the tier takes it) and `--get-size` as the
/// simulator's tier.
fn tier_model(ds: &brand_format::Dataset, limit: &str, get_size: &str) -> brand_format::Result<TierModel> {
    Ok(TierModel {
        limit_bytes: limit.parse::<brand_store::tier::TierLimit>()?.bytes_for(ds),
        get_bytes: get_bytes(get_size)?,
    })
}

/// `--read-gap` and `--get-size` as the simulator counts GETs with them.
fn fetch_model(gap: &str, get_size: &str) -> brand_format::Result<FetchModel> {
    let gap = match gap.parse::<ReadGapSetting>()? {
        ReadGapSetting::Whole => ReadGap::Whole,
        ReadGapSetting::Bytes(b) => ReadGap::Bytes(b),
        ReadGapSetting::Auto => {
            return Err(brand_format::Error::config(
                "read gap auto: the simulator reads no device to probe; give the gap in bytes (brand read --json reports the one auto chose) or whole",
            ));
        }
    };
    Ok(FetchModel {
        gap,
        get_bytes: get_bytes(get_size)?,
    })
}

/// `--get-size`: bytes, at least one.
fn get_bytes(get_size: &str) -> brand_format::Result<u64> {
    let get_bytes = brand_format::units::parse_bytes(get_size)
        .map_err(|why| brand_format::Error::config(format!("get size {get_size:?}: {why}")))?;
    if get_bytes == 0 {
        return Err(brand_format::Error::config(
            "get size 0: a GET fetches at least one byte",
        ));
    }
    Ok(get_bytes)
}
