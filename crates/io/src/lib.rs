//! brand-io: the I/O engine. It executes the plan's reads (DESIGN.md §4) with
//! O_DIRECT through io_uring (or, where io_uring is refused, threads doing
//! `pread`) and knows nothing of sampling: what to read comes from the
//! loader, how to read it (extents, read gap) is decided here.

pub mod engine;
pub mod page_buf;
pub mod probe;
mod threads;
mod uring;
