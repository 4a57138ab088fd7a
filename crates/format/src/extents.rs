//! How a plan `Read { chunk, mask }` becomes device reads: the whole chunk,
//! or only the records in the mask, 4 KiB-aligned, neighbours merged when the
//! gap between them is at most `gap` bytes (into reads of at most
//! [`merged_read_limit`] bytes). What is served never depends on this
//! choice; only the bytes and requests sent to the device do.

use crate::index::Index;
use crate::{align_down, align_up};

/// How to read chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadGap {
    /// Read every chunk whole (the paper; best when requests are expensive).
    Whole,
    /// Read only filled records, merging neighbours whose gap is ≤ this many bytes.
    Bytes(u64),
}

/// Reads of filled records merge into reads of at most this many bytes
/// (with a small gap; see [`merged_read_limit`]). Why: where bytes are
/// what costs (the gap is small), a 512 KiB read is as fast as a larger
/// one, and it fits a buffer registered with io_uring (the engine
/// registers buffers of this size), so runs of filled records (a whole
/// chunk filled at an epoch's start) need no large buffers.
pub const MERGED_READ_BYTES: u64 = 512 << 10;

/// The most bytes neighbours merge into under `gap`: [`MERGED_READ_BYTES`],
/// or 16 gaps where requests cost enough that the gap is large (a merged
/// read must stay far longer than the gap it saves requests on). A record
/// longer than the limit is read alone, whole.
pub fn merged_read_limit(gap: u64) -> u64 {
    MERGED_READ_BYTES.max(gap.saturating_mul(16))
}

/// Where the gap is below one page (bytes are what costs), an uncompressed
/// record of at least this many bytes is read alone, not merged with its
/// neighbours: the engine then serves it from its read buffer without a
/// copy, for at most the one page it shares with a neighbour read twice.
pub const READ_ALONE_BYTES: u64 = 64 << 10;

/// One aligned device read and the records it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    pub segment: u32,
    /// Absolute, [`ALIGN`](crate::ALIGN)-aligned byte offset in the segment.
    pub offset: u64,
    /// Aligned length.
    pub len: u64,
    /// `(sample id, byte offset of its record inside this extent)`.
    pub records: Records,
}

/// An extent's records: inline when there is one (a small sample read
/// alone), so issuing such a read allocates nothing for them.
pub type Records = smallvec::SmallVec<[(u64, u64); 1]>;

/// The extents that read the records of `chunk` selected by `mask` (bit j =
/// record j). Records outside the chunk's record count are ignored.
pub fn extents(index: &Index, chunk: u64, mask: u64, gap: ReadGap) -> Vec<Extent> {
    let mut out = Vec::new();
    extents_into(index, chunk, mask, gap, &mut out);
    out
}

/// [`extents`], appended to `out`: a caller issuing one read after another
/// reuses one vector (a 4 KiB sample's read is one extent, and its vector
/// was an allocation of its own).
pub fn extents_into(index: &Index, chunk: u64, mask: u64, gap: ReadGap, out: &mut Vec<Extent>) {
    let loc = index.chunk(chunk);
    let first = chunk * index.chunk_size() as u64;
    let count = loc.record_count as u64;
    let mask = if count >= 64 {
        mask
    } else {
        mask & ((1u64 << count) - 1)
    };
    if mask == 0 {
        return;
    }
    let rec = |slot: u64| {
        let id = first + slot;
        (
            id,
            loc.offset + index.rel_offset(id) as u64,
            index.stored_len(id) as u64,
        )
    };
    let alone = |id: u64, gap: u64| {
        let (stored, raw) = (index.stored_len(id), index.raw_len(id));
        gap < crate::ALIGN && stored == raw && stored as u64 >= READ_ALONE_BYTES
    };
    // The set bits, lowest first.
    let mut bits = mask;
    let slots = std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let s = bits.trailing_zeros() as u64;
            bits &= bits - 1;
            s
        })
    });
    let max_gap = match gap {
        ReadGap::Whole => {
            let records = slots.map(&rec).map(|(id, start, _)| (id, start - loc.offset)).collect();
            out.push(Extent {
                segment: loc.segment,
                offset: loc.offset,
                len: index.chunk_padded_len(chunk),
                records,
            });
            return;
        }
        ReadGap::Bytes(g) => g,
    };
    let limit = merged_read_limit(max_gap);
    // Only this call's extents merge.
    let first_new = out.len();
    // Whether the last extent holds a record read alone.
    let mut last_alone = false;
    for s in slots {
        let (id, start, len) = rec(s);
        let this_alone = alone(id, max_gap);
        let (lo, hi) = (
            align_down(start),
            align_up(start + len).max(align_down(start) + crate::ALIGN),
        );
        match out[first_new..].last_mut() {
            // Saturating: a gap near u64::MAX means "always merge", not a wrap.
            Some(e)
                if !last_alone
                    && !this_alone
                    && lo <= (e.offset + e.len).saturating_add(max_gap)
                    && hi - e.offset <= limit =>
            {
                e.len = hi.max(e.offset + e.len) - e.offset;
                e.records.push((id, start - e.offset));
            }
            _ => out.push(Extent {
                segment: loc.segment,
                offset: lo,
                len: hi - lo,
                records: smallvec::smallvec![(id, start - lo)],
            }),
        }
        last_alone = this_alone;
    }
}

/// A run of touching byte ranges of one segment that an object-store
/// backend fetches with one GET (or [`get_parts`] GETs where it is long).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeGroup {
    pub segment: u32,
    pub start: u64,
    pub end: u64,
    /// Indices (into the ranges given) of its ranges, in offset order.
    pub members: Vec<usize>,
    /// The smallest of `members`: its first range in submission order.
    pub first: usize,
}

/// How ranges `(segment, offset, len)` submitted together become GETs on an
/// object store: ranges of one segment that touch (one ends where the next
/// starts) merge while the group stays within `limit` bytes (a longer range
/// is a group alone). Overlapping ranges are not merged. Groups come in the
/// order of their first submitted range, so what is needed first is asked
/// for first. The objects backend and `brand simulate` both count GETs
/// with this.
pub fn group_touching(ranges: &[(u32, u64, u64)], limit: u64) -> Vec<RangeGroup> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    // Stable: equal starts keep their submission order.
    order.sort_by_key(|&i| (ranges[i].0, ranges[i].1));
    let mut groups: Vec<RangeGroup> = Vec::new();
    for i in order {
        let (segment, start, len) = ranges[i];
        let end = start.saturating_add(len);
        if let Some(g) = groups.last_mut()
            && g.segment == segment
            // Touching only: whole chunks are contiguous in a segment, and
            // the bytes between records of one chunk were weighed against a
            // request by the read gap already (merging across a 1 MiB gap
            // fetched 2× the bytes asked for on a 1.2 MB probed gap).
            && start == g.end
            && end - g.start <= limit
        {
            g.end = end;
            g.first = g.first.min(i);
            g.members.push(i);
            continue;
        }
        groups.push(RangeGroup {
            segment,
            start,
            end,
            members: vec![i],
            first: i,
        });
    }
    groups.sort_by_key(|g| g.first);
    groups
}

/// GETs that fetch `len` bytes in parts of at most `part_bytes` (at least
/// one, and parts of at least [`ALIGN`](crate::ALIGN) bytes).
pub fn get_parts(len: u64, part_bytes: u64) -> u64 {
    len.div_ceil(part_bytes.max(crate::ALIGN)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{ChunkLoc, SampleMeta};

    /// One chunk at 8192 with 4 records of 3000 bytes after a 200-byte header.
    fn index() -> Index {
        let samples = (0..4)
            .map(|i| SampleMeta {
                rel_offset: 200 + 3000 * i,
                stored_len: 3000,
                raw_len: 3000,
                crc: 0,
                label: 0,
                key: vec![],
            })
            .collect();
        Index::new(
            4,
            1,
            vec![ChunkLoc {
                segment: 0,
                record_count: 4,
                offset: 8192,
            }],
            samples,
        )
        .expect("index")
    }

    /// Appending to a vector that holds another read's extents gives exactly
    /// what `extents` gives, after them: nothing merges into an extent of
    /// the earlier read, even one that touches it.
    #[test]
    fn extents_into_appends_and_never_merges_into_earlier_extents() {
        let idx = index();
        for gap in [ReadGap::Whole, ReadGap::Bytes(0), ReadGap::Bytes(1 << 20)] {
            for (first, second) in [(0b0001u64, 0b0010u64), (0b0101, 0b1010), (0b1111, 0b1111), (0b0011, 0)] {
                let mut out = Vec::new();
                extents_into(&idx, 0, first, gap, &mut out);
                assert_eq!(out, extents(&idx, 0, first, gap), "{gap:?} {first:#b}");
                let before = out.clone();
                extents_into(&idx, 0, second, gap, &mut out);
                let want: Vec<Extent> = before.into_iter().chain(extents(&idx, 0, second, gap)).collect();
                assert_eq!(out, want, "{gap:?} {first:#b} then {second:#b}");
            }
        }
    }

    /// One chunk at 8192 of adjacent records of these stored lengths (raw:
    /// `raw(stored)`).
    fn index_of(lens: &[u32], raw: impl Fn(u32) -> u32) -> Index {
        let mut at = 200;
        let samples = lens
            .iter()
            .map(|&l| {
                let m = SampleMeta {
                    rel_offset: at,
                    stored_len: l,
                    raw_len: raw(l),
                    crc: 0,
                    label: 0,
                    key: vec![],
                };
                at += l;
                m
            })
            .collect();
        let loc = ChunkLoc {
            segment: 0,
            record_count: lens.len() as u32,
            offset: 8192,
        };
        Index::new(lens.len() as u32, 1, vec![loc], samples).expect("index")
    }

    /// Adjacent 200 KB records: merged two by two (three would pass
    /// 512 KiB); a record longer than the limit is read alone.
    #[test]
    fn merged_reads_stop_at_the_limit() {
        let lens = [200_000u32, 200_000, 200_000, 200_000, 600_000, 200_000];
        let idx = index_of(&lens, |l| l);
        let e = extents(&idx, 0, 0b111111, ReadGap::Bytes(4096));
        let ids: Vec<Vec<u64>> = e.iter().map(|e| e.records.iter().map(|r| r.0).collect()).collect();
        assert_eq!(ids, vec![vec![0, 1], vec![2, 3], vec![4], vec![5]]);
        for x in &e {
            assert!(x.len <= MERGED_READ_BYTES || x.records.len() == 1, "{x:?}");
            for &(id, off) in &x.records {
                let end = off + lens[id as usize] as u64;
                assert!(end <= x.len, "record {id} inside its read");
            }
        }
        // Where the gap is large, merged reads may be 16 gaps long.
        assert_eq!(extents(&idx, 0, 0b111111, ReadGap::Bytes(1 << 20)).len(), 1);
    }

    /// Below a page of gap, uncompressed records of 64 KiB or more are read
    /// alone (served from their read buffers); smaller or compressed ones
    /// still merge.
    #[test]
    fn large_uncompressed_records_are_read_alone_where_bytes_cost() {
        let lens = [70_000u32, 70_000, 3_000, 3_000, 70_000];
        let ids =
            |e: &[Extent]| -> Vec<Vec<u64>> { e.iter().map(|e| e.records.iter().map(|r| r.0).collect()).collect() };
        let plain = index_of(&lens, |l| l);
        let e = extents(&plain, 0, 0b11111, ReadGap::Bytes(0));
        assert_eq!(ids(&e), vec![vec![0], vec![1], vec![2, 3], vec![4]]);
        // Shared pages are read by both neighbours: the records stay whole.
        for x in &e {
            for &(id, off) in &x.records {
                assert!(off + lens[id as usize] as u64 <= x.len, "record {id} inside its read");
            }
        }
        assert_eq!(extents(&plain, 0, 0b11111, ReadGap::Bytes(4096)).len(), 1);
        let compressed = index_of(&lens, |l| 3 * l);
        assert_eq!(extents(&compressed, 0, 0b11111, ReadGap::Bytes(0)).len(), 1);
    }

    #[test]
    fn whole_reads_the_padded_chunk() {
        let e = extents(&index(), 0, 0b0101, ReadGap::Whole);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].offset, e[0].len), (8192, 12288));
        assert_eq!(e[0].records[..], [(0, 200), (2, 6200)]);
    }

    #[test]
    fn sparse_reads_align_and_merge_by_gap() {
        let idx = index();
        // Records 0 and 3: [8392, 11392) → [8192, 12288); [17392, 20392) → [16384, 20480).
        let e = extents(&idx, 0, 0b1001, ReadGap::Bytes(0));
        assert_eq!(
            e.iter().map(|x| (x.offset, x.len)).collect::<Vec<_>>(),
            vec![(8192, 4096), (16384, 4096)]
        );
        assert_eq!(e[1].records[..], [(3, 17392 - 16384)]);
        // A gap of 4096 bytes between them merges with gap ≥ 4096.
        let e = extents(&idx, 0, 0b1001, ReadGap::Bytes(4096));
        assert_eq!(
            e.iter().map(|x| (x.offset, x.len)).collect::<Vec<_>>(),
            vec![(8192, 12288)]
        );
        assert_eq!(e[0].records[..], [(0, 200), (3, 9200)]);
        // Touching records share an aligned block: always merged.
        let e = extents(&idx, 0, 0b0011, ReadGap::Bytes(0));
        assert_eq!(e.len(), 1);
        assert!(extents(&idx, 0, 0, ReadGap::Bytes(0)).is_empty());
    }

    #[test]
    fn a_huge_gap_merges_everything_instead_of_wrapping() {
        let idx = index();
        for gap in [u64::MAX, u64::MAX - 4096, 1 << 63] {
            let e = extents(&idx, 0, 0b1001, ReadGap::Bytes(gap));
            assert_eq!(
                e.iter().map(|x| (x.offset, x.len)).collect::<Vec<_>>(),
                vec![(8192, 12288)],
                "gap {gap}"
            );
        }
    }
    #[test]
    fn touching_ranges_group_up_to_the_limit_in_submission_order() {
        let mb = 1 << 20;
        let ranges = [
            (1, 10 * mb, mb),
            (0, 0, 4 * mb),
            (0, 4 * mb, 4 * mb),
            (0, 8 * mb, 4 * mb), // would pass 8 MiB: a new group
            (1, 0, mb),
            (1, mb, mb),            // touching: merged
            (1, 2 * mb + 4096, mb), // a gap: its own
            (1, 2 * mb + 8192, mb), // overlapping the one before: its own
        ];
        let g = group_touching(&ranges, 8 * mb);
        let shape: Vec<_> = g
            .iter()
            .map(|g| (g.segment, g.start, g.end, g.members.clone()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (1, 10 * mb, 11 * mb, vec![0]),
                (0, 0, 8 * mb, vec![1, 2]),
                (0, 8 * mb, 12 * mb, vec![3]),
                (1, 0, 2 * mb, vec![4, 5]),
                (1, 2 * mb + 4096, 3 * mb + 4096, vec![6]),
                (1, 2 * mb + 8192, 3 * mb + 8192, vec![7]),
            ]
        );
        assert!(group_touching(&[], 8 * mb).is_empty());
    }

    #[test]
    fn long_reads_are_fetched_in_parts() {
        let mb = 1 << 20;
        assert_eq!(get_parts(8 * mb, 8 * mb), 1);
        assert_eq!(get_parts(8 * mb + 1, 8 * mb), 2);
        assert_eq!(get_parts(0, 8 * mb), 1);
        // Parts are never smaller than a block.
        assert_eq!(get_parts(8192, 1), 2);
    }
}
