//! The I/O engine: executes the plan's reads (DESIGN.md §4).

pub mod buffer;
pub mod engine;
pub mod extents;
pub mod probe;
