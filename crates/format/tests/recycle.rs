//! The recycler of large sample buffers is sized by the readers of the
//! process (its own test binary: the recycler is process-wide).

use brand_format::buffer::{AlignedBuf, recycling, size_recycling};

#[test]
fn freed_buffers_are_kept_up_to_a_quarter_of_the_largest_readers_budget() {
    assert_eq!(recycling(), (0, 64 << 20), "unsized: 64 MiB");
    // A reader of 16 MiB (memory + read-ahead): 4 MiB kept, the rest freed.
    size_recycling(16 << 20);
    let bufs: Vec<AlignedBuf> = (0..12).map(|_| AlignedBuf::for_extent(1 << 20)).collect();
    drop(bufs);
    let (held, limit) = recycling();
    assert_eq!(limit, 4 << 20);
    assert!((3 << 20..=4 << 20).contains(&held), "{held}");
    // A reused buffer leaves the recycler.
    let again = AlignedBuf::for_extent(1 << 20);
    assert_eq!(recycling().0, held - again.capacity());
    drop(again);
    // A larger reader raises it (a quarter, at most 64 MiB); a smaller one
    // does not lower it again.
    size_recycling(200 << 20);
    assert_eq!(recycling().1, 50 << 20);
    size_recycling(u64::MAX);
    assert_eq!(recycling().1, 64 << 20);
    size_recycling(16 << 20);
    assert_eq!(recycling().1, 64 << 20);
    let bufs: Vec<AlignedBuf> = (0..12).map(|_| AlignedBuf::for_extent(1 << 20)).collect();
    drop(bufs);
    assert!(recycling().0 >= 11 << 20, "{:?}", recycling());
}
