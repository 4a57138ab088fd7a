//! Fuzzing of the two parsers that read untrusted bytes: `index.bin` and
//! chunk headers. cargo-fuzz needs a nightly toolchain, which this project's
//! machines do not have, so this drives the same parsers with proptest on
//! stable: arbitrary bytes and mutations of valid files must give a named
//! error or a valid result, never a panic, hang or huge allocation.

use std::path::Path;

use brand_format::chunk::{RecordIn, encode, parse_header, peek_lengths};
use brand_format::index::{ChunkLoc, Index, SampleMeta};
use proptest::prelude::*;

fn valid_index() -> Vec<u8> {
    let samples = (0..10u32)
        .map(|i| SampleMeta {
            rel_offset: 200 + (i % 4) * 7,
            stored_len: 7,
            raw_len: 7,
            crc: i,
            label: i as i64,
            key: vec![b'k'; i as usize],
        })
        .collect();
    let chunks = (0..3u64)
        .map(|c| ChunkLoc {
            segment: 0,
            record_count: if c < 2 { 4 } else { 2 },
            offset: c * 4096,
        })
        .collect();
    Index::new(4, 1, chunks, samples).expect("valid").as_bytes().to_vec()
}

fn valid_chunk() -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 30 * i]).collect();
    let recs: Vec<RecordIn> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| RecordIn {
            stored: p,
            raw_len: p.len() as u32,
            label: i as i64,
            key: b"key",
        })
        .collect();
    encode(3, 0, &recs).expect("encode").0
}

/// Mutations: (position, xor byte) pairs plus an optional truncation.
fn mutate(mut bytes: Vec<u8>, flips: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(pos, x) in flips {
        let n = bytes.len();
        if n > 0 {
            bytes[pos % n] ^= x;
        }
    }
    if let Some(c) = cut {
        bytes.truncate(c % (bytes.len() + 1));
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn index_parser_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Index::from_bytes(&bytes, Path::new("fuzz/index.bin"));
    }

    #[test]
    fn index_parser_names_every_mutation(
        flips in proptest::collection::vec((any::<usize>(), 1u8..), 0..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let original = valid_index();
        let bytes = mutate(original.clone(), &flips, cut);
        match Index::from_bytes(&bytes, Path::new("fuzz/index.bin")) {
            // The keys are checked when asked for (check_keys), not at open.
            Ok(idx) => prop_assert!(
                idx.as_bytes() == &original[..] || idx.check_keys().is_err(),
                "a changed index parsed as valid"
            ),
            Err(e) => prop_assert!(e.to_string().starts_with("fuzz/index.bin: at byte"), "{}", e),
        }
    }

    #[test]
    fn chunk_parser_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = peek_lengths(&bytes);
        let _ = parse_header(&bytes);
    }

    #[test]
    fn chunk_parser_rejects_header_mutations(
        flips in proptest::collection::vec((0usize..400, 1u8..), 1..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        let original = valid_chunk();
        let hlen = parse_header(&original).expect("valid").header_len as usize;
        let in_header: Vec<(usize, u8)> = flips.iter().map(|&(p, x)| (p % hlen, x)).collect();
        let bytes = mutate(original.clone(), &in_header, cut.map(|c| c % hlen));
        // Flips may cancel each other out; otherwise the crc must catch them.
        if bytes[..hlen.min(bytes.len())] != original[..hlen.min(bytes.len())] || bytes.len() < hlen {
            prop_assert!(parse_header(&bytes).is_err());
        }
    }
}
