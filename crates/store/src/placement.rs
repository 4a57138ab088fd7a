//! Benefit-aware placement in a shared local tier (Quiver §5.3; DESIGN.md
//! §4, "A local tier"): which dataset versions the tier's space goes to
//! when the jobs of a machine want more than it holds.
//!
//! Each process reading a version through a tier publishes a claim: the
//! bytes of the version (all a tier could hold of it) and its *benefit*,
//! the share of its time the job waits for the store (its consumer's
//! stall, measured while it reads mostly from the store: what a tier
//! holding the whole dataset would save it). A version's benefit is its
//! processes' summed (each rank or job waits on its own); its benefit per
//! byte ranks it. The space goes greedily by that rank to every version
//! that benefits, each up to its size; a version whose jobs hide the
//! store's latency behind their compute (benefit below [`MIN_BENEFIT`]),
//! or that nobody has measured yet, is owed nothing. A tier's free space
//! is anyone's: the placement only says who gives room to whom when it is
//! full ([`Placement::owed`]).
//!
//! Pure: the tier (`crate::tier`) reads the claims and acts on the result.

/// Below this share of its time waiting for the store, a job's version is
/// owed no room (its compute hides the store).
pub const MIN_BENEFIT: f64 = 0.05;

/// One process's claim on a tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The version's directory name in the tier.
    pub version: String,
    /// The version's bytes: the most a tier could hold of it.
    pub want: u64,
    /// Share of the process's time spent waiting for the store (None: not
    /// measured yet).
    pub benefit: Option<f64>,
}

impl Claim {
    /// The claim as its file holds it: three lines, `key value`.
    pub fn encode(&self) -> String {
        let benefit = self.benefit.map_or("-".to_string(), |b| format!("{b:.6}"));
        format!("version {}\nwant {}\nbenefit {benefit}\n", self.version, self.want)
    }

    /// A claim file's text; None for one that is not (partly written, or
    /// not a claim).
    pub fn decode(text: &str) -> Option<Claim> {
        let (mut version, mut want, mut benefit) = (None, None, None);
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("version", v)) if !v.is_empty() => version = Some(v.to_string()),
                Some(("want", v)) => want = v.parse::<u64>().ok(),
                Some(("benefit", "-")) => benefit = Some(None),
                Some(("benefit", v)) => benefit = Some(v.parse::<f64>().ok().filter(|b| b.is_finite() && *b >= 0.0)),
                _ => {}
            }
        }
        Some(Claim {
            version: version?,
            want: want?,
            benefit: benefit?,
        })
    }
}

/// One version's share of a tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub version: String,
    /// Its bytes (the largest any claim gave).
    pub want: u64,
    /// Its processes' benefits summed (None: none measured yet).
    pub benefit: Option<f64>,
    /// Bytes of the tier it is owed.
    pub owed: u64,
}

/// The tier's space shared out among the versions claimed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Placement {
    /// Every version claimed, in the order the space went (most benefit
    /// per byte first).
    pub shares: Vec<Share>,
}

impl Placement {
    /// Shares `limit` bytes among `claims`: versions that benefit, by
    /// benefit per byte, each up to its size; the rest owed nothing.
    pub fn of(claims: &[Claim], limit: u64) -> Placement {
        let mut shares: Vec<Share> = Vec::new();
        for c in claims {
            match shares.iter_mut().find(|s| s.version == c.version) {
                Some(s) => {
                    s.want = s.want.max(c.want);
                    s.benefit = match (s.benefit, c.benefit) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                }
                None => shares.push(Share {
                    version: c.version.clone(),
                    want: c.want,
                    benefit: c.benefit,
                    owed: 0,
                }),
            }
        }
        let rank = |s: &Share| match s.benefit {
            Some(b) if b >= MIN_BENEFIT => b / s.want.max(1) as f64,
            _ => -1.0,
        };
        // Ties (and the versions owed nothing) in name order: every process
        // computes the same placement from the same claims.
        shares.sort_by(|a, b| rank(b).total_cmp(&rank(a)).then_with(|| a.version.cmp(&b.version)));
        let mut left = limit;
        for s in &mut shares {
            if rank(s) < 0.0 {
                break;
            }
            s.owed = s.want.min(left);
            left -= s.owed;
        }
        Placement { shares }
    }

    /// Bytes `version` is owed (0 if it has no claim).
    pub fn owed(&self, version: &str) -> u64 {
        self.share(version).map_or(0, |s| s.owed)
    }

    pub fn share(&self, version: &str) -> Option<&Share> {
        self.shares.iter().find(|s| s.version == version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(version: &str, want: u64, benefit: Option<f64>) -> Claim {
        Claim {
            version: version.into(),
            want,
            benefit,
        }
    }

    #[test]
    fn the_job_that_waits_for_the_store_gets_the_space() {
        // A tier that fits one of two equal datasets: the I/O-bound job's.
        let p = Placement::of(&[claim("b", 100, Some(0.01)), claim("a", 100, Some(0.8))], 120);
        assert_eq!(p.owed("a"), 100);
        assert_eq!(p.owed("b"), 0, "compute hides the store: owed nothing");
        assert_eq!(p.shares[0].version, "a");
    }

    #[test]
    fn space_goes_by_benefit_per_byte_each_up_to_its_size() {
        // c saves less in all but more per byte than a.
        let claims = [
            claim("a", 1000, Some(0.9)),
            claim("c", 100, Some(0.5)),
            claim("d", 500, Some(0.2)),
        ];
        let p = Placement::of(&claims, 1200);
        assert_eq!(
            p.shares
                .iter()
                .map(|s| (s.version.as_str(), s.owed))
                .collect::<Vec<_>>(),
            [("c", 100), ("a", 1000), ("d", 100)]
        );
        let total: u64 = p.shares.iter().map(|s| s.owed).sum();
        assert!(total <= 1200);
    }

    #[test]
    fn a_versions_processes_add_their_benefits() {
        // Two ranks of "a" waiting 0.3 each outrank one job of "b" at 0.5.
        let claims = [
            claim("a", 100, Some(0.3)),
            claim("b", 100, Some(0.5)),
            claim("a", 100, Some(0.3)),
        ];
        let p = Placement::of(&claims, 100);
        assert_eq!((p.owed("a"), p.owed("b")), (100, 0));
        assert_eq!(p.share("a").and_then(|s| s.benefit), Some(0.6));
    }

    #[test]
    fn unmeasured_and_unknown_versions_are_owed_nothing() {
        let p = Placement::of(&[claim("a", 100, None), claim("b", 100, Some(0.2))], 1000);
        assert_eq!((p.owed("a"), p.owed("b"), p.owed("zzz")), (0, 100, 0));
        assert_eq!(Placement::of(&[], 1000), Placement::default());
    }

    #[test]
    fn the_same_claims_give_the_same_placement_in_any_order() {
        let mut claims = vec![
            claim("a", 100, Some(0.5)),
            claim("b", 100, Some(0.5)),
            claim("c", 50, Some(0.25)),
            claim("d", 70, None),
        ];
        let first = Placement::of(&claims, 150);
        claims.reverse();
        assert_eq!(Placement::of(&claims, 150), first);
        claims.swap(0, 2);
        assert_eq!(Placement::of(&claims, 150), first);
        // Equal rank (0.005 a byte each): name order decides.
        assert_eq!((first.owed("a"), first.owed("b"), first.owed("c")), (100, 50, 0));
    }

    #[test]
    fn claims_round_trip_and_torn_ones_are_refused() {
        for c in [claim("0a1b2c3d-deadbeef", 1 << 40, Some(0.125)), claim("x-y", 7, None)] {
            assert_eq!(Claim::decode(&c.encode()), Some(c.clone()));
            let text = c.encode();
            // Cut anywhere before its last line is complete: not a claim.
            for cut in 0..text.trim_end().rfind('\n').unwrap_or(0) {
                assert_eq!(Claim::decode(&text[..cut]), None, "{:?}", &text[..cut]);
            }
        }
        assert_eq!(
            Claim::decode("version a\nwant 5\nbenefit -1\n").map(|c| c.benefit),
            Some(None)
        );
        assert_eq!(Claim::decode("version a\nwant x\nbenefit 0.5\n"), None);
    }
}
