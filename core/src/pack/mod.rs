//! `brand pack`: turn a source of samples into a dataset (DESIGN.md §2).

pub mod source;

pub mod lmdb;
mod protobuf;
pub mod tfrecord;
