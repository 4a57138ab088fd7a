//! brand-store: datasets in object storage (DESIGN.md §4, "Object
//! storage"). A dataset is a directory or a URL — `s3://bucket/prefix`,
//! `gs://…`, `az://…`, `https://…` (read only) — and this crate is what
//! turns a URL into bytes:
//!
//! * [`location`]: [`Location`], a path or a URL, parsed once; URLs name
//!   objects in errors without credentials or query strings.
//! * [`connect`]: an `object_store` client for a URL, with the credentials
//!   and endpoint the user's environment gives (as the cloud's own tools
//!   read them; `~/.aws` profiles with static keys too).
//! * [`runtime`]: the async runtime a reader owns (made where it reads, so
//!   a `fork()`ed child that opens a reader makes its own).
//! * [`get`]: one ranged GET into a caller's buffer: a stall timeout per
//!   GET, retries with backoff on 5xx, 429 and broken connections, bodies
//!   resumed where they were cut, a hedged second GET for a slow first
//!   byte, the object pinned to the entity tag it was opened with;
//!   [`get::GetCounters`] counts what happened.
//! * [`limiter`]: how many GETs are in flight — sized from their first
//!   bytes and rate as they complete (or fixed), halved on throttling.
//! * [`open`]: a dataset from a URL: manifest and index fetched, every
//!   segment's entity tag and size pinned.
//! * [`index_cache`]: a fetched index kept in a local file and mapped
//!   (shared by the machine's processes; fetched once per version).
//! * [`tier`]: a dataset's chunks kept on a local disk that the
//!   machine's processes share (a chunk fetched once, not every epoch);
//!   [`placement`]: whose chunks its space goes to when it is full.
//! * [`upload`]: a packed dataset written to a store, manifest last.
//! * [`sequential`]: objects listed and read whole, in order, by large
//!   ranged GETs made ahead of the reader: a pack's inputs in a store.
//! * [`verify`] (`brand verify`: every chunk re-read and checked, a
//!   directory's index rebuilt from its chunks) and [`inspect`] (`brand
//!   inspect`: a dataset's vital statistics): what reads a whole dataset,
//!   wherever it is, to check or describe it.

pub mod connect;
pub mod get;
pub mod index_cache;
pub mod inspect;
pub mod limiter;
pub mod location;
pub mod open;
pub mod placement;
pub mod runtime;
pub mod sequential;
pub mod tier;
pub mod upload;
pub mod verify;

pub use connect::Connection;
pub use get::{GetCounters, GetPolicy, GetReport};
pub use limiter::Limiter;
pub use location::{Location, ObjectUrl};
pub use open::{for_each_chunk, open, open_any, open_any_with, open_with, read_sample};
pub use sequential::{ObjectInfo, ObjectReader, Objects, ReadAhead};
