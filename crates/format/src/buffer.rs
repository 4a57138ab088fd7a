//! Aligned heap buffers: page-aligned for O_DIRECT reads (and io_uring fixed
//! buffers), 64-byte-aligned for samples handed to consumers (SIMD decoders,
//! zero-copy tensors). A read buffer can become a sample without a copy
//! ([`AlignedBuf::into_window`]): the sample owns the whole allocation and
//! shows the bytes of one record.

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ALIGN;

/// Alignment of sample buffers handed to consumers.
pub const SAMPLE_ALIGN: usize = 64;

/// Sample buffers of at least this many bytes are sized in whole pages and
/// recycled (see [`recycle`]); smaller ones are left to the allocator.
const RECYCLE_MIN: usize = 64 << 10;

/// Most bytes of freed sample buffers kept for reuse, process-wide, until a
/// reader sizes it ([`size_recycling`]); its bounds.
const RECYCLE_DEFAULT: usize = 64 << 20;
const RECYCLE_FLOOR: usize = 4 << 20;

/// The recycler's limit in bytes; 0: [`RECYCLE_DEFAULT`].
static RECYCLE_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Sizes the recycler of large sample buffers for a reader whose memory and
/// read-ahead come to `budget` bytes: a quarter of it, within 4..=64 MiB
/// (the largest any reader of the process asked for). Freed buffers of
/// sizes no later read wants (an object store's GETs vary in size) stay in
/// the recycler until it is full: at 64 MiB whatever the budget, they were
/// half of the RSS above the budget of a reader at `memory` 1 % over S3
/// (151–181 MiB against 105–110 with 4 MiB).
pub fn size_recycling(budget: u64) {
    let want = usize::try_from(budget / 4)
        .unwrap_or(usize::MAX)
        .clamp(RECYCLE_FLOOR, RECYCLE_DEFAULT);
    let _ = RECYCLE_LIMIT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
        (now == 0 || want > now).then_some(want)
    });
}

/// Bytes the recycler of large sample buffers holds now, and its limit.
pub fn recycling() -> (usize, usize) {
    (recycle::held(), recycle_limit())
}

fn recycle_limit() -> usize {
    match RECYCLE_LIMIT.load(Ordering::Relaxed) {
        0 => RECYCLE_DEFAULT,
        n => n,
    }
}

/// Freed sample buffers kept for the next samples (or extent reads, see
/// [`AlignedBuf::for_extent`]) of about their size. Every buffer in it is
/// page-aligned with a whole number of pages and fully initialised.
///
/// Why: samples are allocated on the engine's threads and freed on the
/// consumer's, a gigabyte a second on a fast device; the system allocator
/// hands such churn back to the kernel and faults it in again (about 15 %
/// of `brand read`'s CPU on tmpfs went to page faults and page clearing),
/// or keeps it in per-thread arenas: with samples read into place on the
/// io thread and copied on decode threads, a 16 MiB cache left peak RSS
/// 20 % higher than this one (64 MiB, reuse within 1/8) on a 256 MiB budget.
/// Bounded by [`size_recycling`]; a buffer is reused only for a sample of at
/// most 1/8 less than its capacity, so the waste is small. Never blocks:
/// when the lock is taken (or poisoned), buffers go to the allocator.
mod recycle {
    use std::collections::BTreeMap;
    use std::ptr::NonNull;
    use std::sync::Mutex;

    struct Free(NonNull<u8>);
    // SAFETY: a free buffer is owned by the cache alone; nothing else holds
    // its pointer, so it may move between threads with the cache.
    unsafe impl Send for Free {}

    struct Cache {
        by_cap: BTreeMap<usize, Vec<Free>>,
        bytes: usize,
    }

    static CACHE: Mutex<Cache> = Mutex::new(Cache {
        by_cap: BTreeMap::new(),
        bytes: 0,
    });

    /// A free buffer (pointer, capacity) of capacity in `need..=need + need/8`.
    pub fn take(need: usize) -> Option<(NonNull<u8>, usize)> {
        let mut c = CACHE.try_lock().ok()?;
        let (&cap, list) = c.by_cap.range_mut(need..=need + need / 8).next()?;
        let Free(ptr) = list.pop()?;
        if list.is_empty() {
            c.by_cap.remove(&cap);
        }
        c.bytes -= cap;
        Some((ptr, cap))
    }

    /// Bytes held (0 when the lock is busy).
    pub fn held() -> usize {
        CACHE.try_lock().map_or(0, |c| c.bytes)
    }

    /// Keeps a freed buffer; false (the caller frees it) when full or busy.
    pub fn put(ptr: NonNull<u8>, cap: usize) -> bool {
        let Ok(mut c) = CACHE.try_lock() else {
            return false;
        };
        if c.bytes + cap > super::recycle_limit() {
            return false;
        }
        c.bytes += cap;
        c.by_cap.entry(cap).or_default().push(Free(ptr));
        true
    }
}

/// Freed small sample buffers (under [`RECYCLE_MIN`]) kept for the next
/// samples of their size class, in lock-free queues: small samples come by
/// the hundred thousand a second, allocated on the engine's threads and
/// freed on the consumer's, and the system allocator's aligned allocations
/// and cross-thread frees took ≈ 15 % of the CPU reading 4 KiB samples from
/// tmpfs (aligned_malloc, heap trimming and re-faulting). Bounded by
/// [`small::LIMIT`] bytes; never blocks (a full class frees to the allocator).
///
/// Safe in a forked child: a queue's operation or a class's creation that
/// another thread was in the middle of when the process forked would leave
/// the child spinning on a slot (or waiting on a `OnceLock`) forever. So
/// queues are made without blocking, and the child, in a `pthread_atfork`
/// handler, forgets them all (leaking the buffers they held) and starts
/// with fresh ones.
mod small {
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

    use crossbeam_queue::ArrayQueue;

    /// Most bytes of small buffers kept, process-wide (not sized to the
    /// reader as the large recycler is). At 16 MiB (4,096 samples of 4 KiB, fewer than a
    /// 64 MiB read-ahead holds) the held samples' count swung past it and
    /// the misses went to the allocator's heap growth (`sysmalloc`, page
    /// faults: ≈ 10 % of the CPU reading 4 KiB samples from tmpfs).
    pub const LIMIT: usize = 64 << 20;
    /// Most buffers a class keeps (its queue's slots are allocated with it).
    const PER_CLASS: usize = 16384;
    /// Classes: 16 up to 1 KiB, then 8 a power of two up to [`super::RECYCLE_MIN`].
    const CLASSES: usize = 16 + 8 * 6;

    struct Free(NonNull<u8>);
    // SAFETY: a free buffer is owned by the queue alone; nothing else holds
    // its pointer, so it may move between threads.
    unsafe impl Send for Free {}

    /// Each class's queue, made on first use and never freed (but for a
    /// forked child's, which are forgotten: see [`forget_in_child`]).
    static QUEUES: [AtomicPtr<ArrayQueue<Free>>; CLASSES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; CLASSES];
    static BYTES: AtomicUsize = AtomicUsize::new(0);
    /// Whether [`forget_in_child`] is registered: no queue is made before.
    static AT_FORK: AtomicBool = AtomicBool::new(false);
    static AT_FORK_CLAIMED: AtomicBool = AtomicBool::new(false);

    /// The class of a buffer of `len` bytes and its capacity, a multiple
    /// of 64 bytes: up to 1 KiB, `len` rounded up to 64 bytes (16 classes);
    /// above, to one of 8 steps per power of two (at most 1/8 more).
    pub fn class(len: usize) -> (usize, usize) {
        let unit = super::SAMPLE_ALIGN;
        if len <= 16 * unit {
            let cap = len.max(1).div_ceil(unit) * unit;
            return (cap / unit - 1, cap);
        }
        // 2^octave < len ≤ 2^(octave + 1), octave ≥ 10.
        let octave = (usize::BITS - 1 - (len - 1).leading_zeros()) as usize;
        let step = 1usize << (octave - 3);
        let steps = len.div_ceil(step); // 9..=16
        (16 + (octave - 10) * 8 + steps - 9, steps * step)
    }

    /// Runs in a forked child, alone (async-signal-safe: atomic stores).
    extern "C" fn forget_in_child() {
        for q in &QUEUES {
            q.store(std::ptr::null_mut(), Ordering::Relaxed);
        }
        BYTES.store(0, Ordering::Relaxed);
    }

    /// Registers [`forget_in_child`] once; false until it is registered
    /// (while another thread registers it, or if registering failed).
    fn at_fork_registered() -> bool {
        if AT_FORK.load(Ordering::Acquire) {
            return true;
        }
        if AT_FORK_CLAIMED.swap(true, Ordering::AcqRel) {
            return false;
        }
        // SAFETY: registers a handler that only stores to atomics.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
        AT_FORK.store(rc == 0, Ordering::Release);
        rc == 0
    }

    /// Class `class`'s queue, made if need be (None: not yet possible).
    fn queue(class: usize) -> Option<&'static ArrayQueue<Free>> {
        let slot = QUEUES.get(class)?;
        let mut q = slot.load(Ordering::Acquire);
        if q.is_null() {
            if !at_fork_registered() {
                return None;
            }
            let made = Box::into_raw(Box::new(ArrayQueue::new(PER_CLASS)));
            q = match slot.compare_exchange(std::ptr::null_mut(), made, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => made,
                Err(theirs) => {
                    // SAFETY: `made` was never published; this is its only owner.
                    drop(unsafe { Box::from_raw(made) });
                    theirs
                }
            };
        }
        // SAFETY: a published queue is never freed (a forked child's
        // forgotten ones are leaked), so it lives for the process.
        Some(unsafe { &*q })
    }

    /// A kept buffer of class `class` (capacity `cap`), if any.
    pub fn take(class: usize, cap: usize) -> Option<NonNull<u8>> {
        let q = QUEUES.get(class)?.load(Ordering::Acquire);
        if q.is_null() {
            return None;
        }
        // SAFETY: as in `queue`: a published queue lives for the process.
        let Free(ptr) = unsafe { &*q }.pop()?;
        BYTES.fetch_sub(cap, Ordering::Relaxed);
        Some(ptr)
    }

    /// Keeps a freed buffer of capacity `cap` (its class's); false (the
    /// caller frees it) when the limit or the class is full.
    pub fn put(ptr: NonNull<u8>, cap: usize) -> bool {
        let (class, class_cap) = class(cap);
        if class_cap != cap || class >= CLASSES {
            return false;
        }
        if BYTES.fetch_add(cap, Ordering::Relaxed) + cap > LIMIT {
            BYTES.fetch_sub(cap, Ordering::Relaxed);
            return false;
        }
        if queue(class).is_none_or(|q| q.push(Free(ptr)).is_err()) {
            BYTES.fetch_sub(cap, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// The capacity and alignment of a sample buffer of `len` bytes: large ones
/// are whole pages, page-aligned, so that they and extent reads share the
/// recycler; small ones are their size class's (see [`small`]).
fn sample_shape(len: usize) -> (usize, usize) {
    if len >= RECYCLE_MIN {
        let unit = crate::ALIGN as usize;
        (len.max(1).div_ceil(unit) * unit, unit)
    } else {
        let cap = small::class(len).1;
        (cap, small_align(cap))
    }
}

/// The alignment of a small buffer of capacity `cap` (a size class's): a
/// whole number of pages is page-aligned, so that a small record can be
/// read with O_DIRECT straight into the buffer that becomes its sample
/// ([`AlignedBuf::for_extent`]); others [`SAMPLE_ALIGN`]. One alignment per
/// class, so a recycled buffer is freed with the layout it was made with.
fn small_align(cap: usize) -> usize {
    if cap.is_multiple_of(ALIGN as usize) {
        ALIGN as usize
    } else {
        SAMPLE_ALIGN
    }
}

/// A zeroed heap buffer whose start is aligned to `align` and whose capacity
/// is a multiple of it. `len` counts the bytes holding data. The allocation
/// never moves or grows, so its address is stable for the buffer's life (the
/// io engine hands it to the kernel on that promise).
///
/// Every accessor sees the bytes from `offset` on: 0 except in a buffer made
/// by [`into_window`](Self::into_window), whose data starts inside the
/// allocation (still [`SAMPLE_ALIGN`]-aligned).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    offset: usize,
    len: usize,
    align: usize,
    /// Memory this buffer does not own (see [`foreign`](Self::foreign)):
    /// what keeps it alive, dropped instead of freeing.
    owner: Option<Box<dyn Send + Sync>>,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); moving it
// between threads moves that ownership.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give `&[u8]` access, which is safe to share.
unsafe impl Sync for AlignedBuf {}

/// The first `cap` bytes of a fresh or recycled sample buffer as zstd's
/// output: possibly uninitialised until zstd reports, through
/// `filled_until`, how many bytes it wrote.
struct UninitOut {
    ptr: *mut u8,
    cap: usize,
    filled: usize,
}

// SAFETY: as_slice covers only the `filled` bytes zstd reported written;
// capacity and as_mut_ptr describe `cap` bytes of one live allocation.
unsafe impl zstd::zstd_safe::WriteBuf for UninitOut {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written (filled_until's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.filled) }
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    unsafe fn filled_until(&mut self, n: usize) {
        self.filled = n;
    }
}

impl AlignedBuf {
    /// A page-aligned buffer of at least `cap` bytes (rounded up to
    /// [`ALIGN`], at least one block), for device reads.
    pub fn new(cap: usize) -> Self {
        Self::with_alignment(cap, ALIGN as usize)
    }

    /// A [`SAMPLE_ALIGN`]-aligned buffer holding exactly `len` bytes of zeros.
    pub fn for_sample(len: usize) -> Self {
        let mut b = Self::sample_uninit(len);
        // SAFETY: the buffer holds cap ≥ len bytes.
        unsafe { std::ptr::write_bytes(b.ptr.as_ptr(), 0, len) };
        b.len = len;
        b
    }

    /// A [`SAMPLE_ALIGN`]-aligned buffer holding the `len` bytes the zstd
    /// frame `frame` decompresses to, by this thread's reused zstd context
    /// (making one per record costs more than copying the record). Not
    /// zeroed first: zstd reports the bytes it wrote, and only a frame that
    /// wrote exactly `len` makes a buffer, which saves a memset of every
    /// decoded byte. The error says what is wrong with the frame.
    pub fn zstd_decompressed(frame: &[u8], len: usize) -> Result<Self, String> {
        thread_local! {
            static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
                const { std::cell::RefCell::new(None) };
        }
        let context = || zstd::bulk::Decompressor::new().map_err(|e| format!("zstd context: {e}"));
        ZSTD.with(|cell| {
            // Only a re-entrant call finds this thread's context taken: it makes its own.
            let Ok(mut cached) = cell.try_borrow_mut() else {
                return Self::zstd_decompressed_by(&mut context()?, frame, len);
            };
            let z = match &mut *cached {
                Some(z) => z,
                empty => empty.insert(context()?),
            };
            Self::zstd_decompressed_by(z, frame, len)
        })
    }

    fn zstd_decompressed_by(z: &mut zstd::bulk::Decompressor<'_>, frame: &[u8], len: usize) -> Result<Self, String> {
        let mut b = Self::sample_uninit(len);
        let mut out = UninitOut {
            ptr: b.ptr.as_ptr(),
            cap: len,
            filled: 0,
        };
        let res = z.decompress_to_buffer(frame, &mut out);
        let filled = out.filled;
        match res {
            Ok(n) if n == len && filled == len => {
                b.len = len;
                Ok(b)
            }
            bad => {
                // SAFETY: cap ≥ len; zeroing the bytes zstd may have left
                // unwritten keeps the buffer fully initialised, as the
                // recycler requires of every buffer dropped into it.
                unsafe { std::ptr::write_bytes(b.ptr.as_ptr(), 0, len) };
                Err(match bad {
                    Err(e) => format!("zstd: {e}"),
                    Ok(n) => format!("decompressed to {n} bytes, index says {len}"),
                })
            }
        }
    }

    /// A sample buffer able to hold `len` bytes, recycled when one fits. Its
    /// `len` is 0; its bytes `[0, len)` are a recycled sample's, or
    /// uninitialised in a fresh one: the caller must write them before the
    /// buffer is read.
    fn sample_uninit(len: usize) -> Self {
        let (need, align) = sample_shape(len);
        if let Some(b) = Self::recycled_small(need).or_else(|| Self::recycled(need)) {
            return b;
        }
        let b = Self::allocate(need, align, false);
        // SAFETY: [len, need) is inside the allocation; the caller writes
        // [0, len), so every byte ends up initialised.
        unsafe { std::ptr::write_bytes(b.ptr.as_ptr().add(len), 0, need - len) };
        b
    }

    /// A recycled small sample buffer of `need`'s class (`len` 0; aligned
    /// as [`small_align`] says), if one is free.
    fn recycled_small(need: usize) -> Option<Self> {
        if need >= RECYCLE_MIN {
            return None;
        }
        let (class, cap) = small::class(need);
        let ptr = small::take(class, cap)?;
        Some(AlignedBuf {
            ptr,
            cap,
            offset: 0,
            len: 0,
            align: small_align(cap),
            owner: None,
        })
    }

    /// A recycled page-aligned buffer of at least `need` bytes (`len` 0), if one fits.
    fn recycled(need: usize) -> Option<Self> {
        if need < RECYCLE_MIN {
            return None;
        }
        let (ptr, cap) = recycle::take(need)?;
        Some(AlignedBuf {
            ptr,
            cap,
            offset: 0,
            len: 0,
            align: ALIGN as usize,
            owner: None,
        })
    }

    /// A page-aligned buffer for one extent read of `len` bytes that will
    /// become a sample ([`into_window`](Self::into_window)): sized to the
    /// read in whole pages (at most 1/8 more when recycled; a small one is
    /// exactly its pages, recycled with the small samples), not to a
    /// read-buffer size class, because the sample keeps all of it resident.
    /// Its bytes are unspecified (zero in a fresh buffer, a previous
    /// sample's in a recycled one) until read into: the kernel writes them
    /// through [`spare_ptr`](Self::spare_ptr); `len` is 0.
    pub fn for_extent(len: usize) -> Self {
        let need = crate::align_up(len.max(1) as u64) as usize;
        // Whole pages under RECYCLE_MIN are a small size class of their own
        // (page-aligned, see small_align).
        debug_assert!(need >= RECYCLE_MIN || small::class(need).1 == need);
        // A fresh one zeroed: the kernel fills it through io_uring, which
        // memory checkers (valgrind) do not see, so unzeroed its bytes would
        // look uninitialised to them after the read; recycled ones, already
        // written, are reused as they are (fresh pages come zeroed anyway).
        Self::recycled_small(need)
            .or_else(|| Self::recycled(need))
            .unwrap_or_else(|| Self::allocate(need, ALIGN as usize, true))
    }

    /// This buffer as a sample of the `len` bytes at `at`, without copying
    /// them elsewhere: the bytes move left (in place) to the
    /// [`SAMPLE_ALIGN`] boundary at or below `at` unless they already start
    /// on one, and the sample keeps (and frees) the whole allocation. With
    /// `checksum`, also the crc32c of the bytes, taken block by block as
    /// they move so each is read while in L1. The buffer back, unchanged,
    /// if `[at, at + len)` is not inside its data.
    pub fn into_window(self, at: usize, len: usize, checksum: bool) -> std::result::Result<(Self, u32), Self> {
        /// Small enough to stay in L1 between the move and the checksum.
        const BLOCK: usize = 16 << 10;
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(self);
        }
        let mut b = self;
        let from = b.offset + at;
        let to = from / SAMPLE_ALIGN * SAMPLE_ALIGN;
        let mut crc = 0;
        if to == from {
            if checksum {
                // SAFETY: [from, from + len) lies inside the data (checked above).
                let bytes = unsafe { std::slice::from_raw_parts(b.ptr.as_ptr().add(from), len) };
                crc = crc32c::crc32c(bytes);
            }
        } else {
            let mut done = 0;
            while done < len {
                let n = BLOCK.min(len - done);
                // SAFETY: both ranges lie inside the allocation (to < from,
                // from + len ≤ cap); ptr::copy allows their overlap, and
                // moving front to back never overwrites bytes not yet moved
                // because the destination is below the source.
                let moved = unsafe {
                    let dst = b.ptr.as_ptr().add(to + done);
                    std::ptr::copy(b.ptr.as_ptr().add(from + done), dst, n);
                    std::slice::from_raw_parts(dst, n)
                };
                if checksum {
                    crc = crc32c::crc32c_append(crc, moved);
                }
                done += n;
            }
        }
        b.offset = to;
        b.len = len;
        Ok((b, crc))
    }

    /// A [`SAMPLE_ALIGN`]-aligned copy of `src`. Not zeroed first: every
    /// byte is written by the copy before the buffer exists, which saves a
    /// memset and its page faults on the hot path.
    pub fn copy_of(src: &[u8]) -> Self {
        Self::copy_and_crc32c(src, false).0
    }

    /// [`copy_of`](Self::copy_of) and the crc32c of `src` in one pass: each
    /// block is checksummed from the copy while it is still in L1, so the
    /// source is read once (how uncompressed records are decoded).
    pub fn copy_of_with_crc32c(src: &[u8]) -> (Self, u32) {
        Self::copy_and_crc32c(src, true)
    }

    fn copy_and_crc32c(src: &[u8], checksum: bool) -> (Self, u32) {
        /// Small enough to stay in L1 between the copy and the checksum.
        const BLOCK: usize = 16 << 10;
        let mut buf = Self::sample_uninit(src.len());
        let ptr = buf.ptr;
        let mut crc = 0;
        for (i, from) in src.chunks(BLOCK).enumerate() {
            // SAFETY: block i lies inside the buffer (cap ≥ src.len()),
            // which cannot overlap src; once copied, its bytes are
            // initialised and only read here.
            let to = unsafe {
                let at = ptr.as_ptr().add(i * BLOCK);
                std::ptr::copy_nonoverlapping(from.as_ptr(), at, from.len());
                std::slice::from_raw_parts(at, from.len())
            };
            if checksum {
                crc = crc32c::crc32c_append(crc, to);
            }
        }
        buf.len = src.len();
        (buf, crc)
    }

    /// `align` must be a power of two.
    pub fn with_alignment(cap: usize, align: usize) -> Self {
        Self::allocate(cap.max(1).div_ceil(align) * align, align, true)
    }

    /// A fresh allocation of `cap` bytes (a non-zero multiple of `align`),
    /// zeroed, or left uninitialised for the caller to write at once.
    fn allocate(cap: usize, align: usize, zeroed: bool) -> Self {
        let layout = Self::layout(cap, align);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { if zeroed { alloc_zeroed(layout) } else { alloc(layout) } };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf {
            ptr,
            cap,
            offset: 0,
            len: 0,
            align,
            owner: None,
        }
    }

    /// `len` bytes at `ptr` that another owner keeps alive as long as
    /// `owner` lives (a sample in memory shared with another process): the
    /// buffer shows them without copying and drops `owner` instead of
    /// freeing.
    ///
    /// # Safety
    /// `ptr` is valid for reads of `len` bytes, [`SAMPLE_ALIGN`]-aligned,
    /// initialised and not written while `owner` lives, and the buffer is
    /// only ever shared (behind an `Arc`): its `&mut` methods would write
    /// to memory it does not own.
    pub unsafe fn foreign(ptr: NonNull<u8>, len: usize, owner: Box<dyn Send + Sync>) -> Self {
        AlignedBuf {
            ptr,
            cap: len,
            offset: 0,
            len,
            align: SAMPLE_ALIGN,
            owner: Some(owner),
        }
    }

    fn layout(cap: usize, align: usize) -> Layout {
        // cap is a non-zero multiple of align, a power of two: always valid
        // unless cap overflows isize, which alloc would reject anyway.
        Layout::from_size_align(cap, align).unwrap_or_else(|e| panic!("buffer of {cap} bytes: {e}"))
    }

    /// The start of the visible bytes (see the type's doc).
    fn base(&self) -> *mut u8 {
        // SAFETY: offset ≤ cap, inside (or one past) the allocation.
        unsafe { self.ptr.as_ptr().add(self.offset) }
    }

    /// Bytes usable from the start of the data.
    pub fn capacity(&self) -> usize {
        self.cap - self.offset
    }

    /// Bytes the buffer keeps allocated (its whole allocation: more than
    /// [`capacity`](Self::capacity) for a window).
    pub fn allocated(&self) -> usize {
        self.cap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the contents (keeps the allocation) so the buffer can be reused.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: base is valid for cap - offset ≥ len bytes, all initialised when allocated.
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }

    /// The whole capacity, for synchronous reads into it.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: base is valid for cap - offset bytes, all initialised,
        // uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.capacity()) }
    }

    /// The start of the whole capacity, for the kernel to read into (no
    /// reference held while it writes). Mark what it wrote with
    /// [`set_len`](Self::set_len).
    pub fn spare_ptr(&mut self) -> *mut u8 {
        self.base()
    }

    /// Marks the first `len` bytes as holding data.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "set_len {len} beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AlignedBuf({} of {} bytes at {}, align {})",
            self.len, self.cap, self.offset, self.align
        )
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // Not ours to free: dropping the owner lets go of it.
            return;
        }
        // Whole-page, page-aligned buffers of recycling size: large samples,
        // windows and read buffers alike.
        // (The recycler's buffers are fully initialised.)
        if self.align == ALIGN as usize && self.cap >= RECYCLE_MIN && recycle::put(self.ptr, self.cap) {
            return;
        }
        // Small sample buffers (of a size class: any other is freed).
        if self.cap < RECYCLE_MIN && self.align == small_align(self.cap) && small::put(self.ptr, self.cap) {
            return;
        }
        // SAFETY: allocated with exactly this layout (size cap, alignment
        // align), by this type or by the recycler's earlier owner.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.cap, self.align)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zstd_frame_decompresses_only_to_its_exact_length() {
        let raw: Vec<u8> = (0..100_000u32).map(|i| (i / 7 % 251) as u8).collect();
        let frame = zstd::bulk::compress(&raw, 3).expect("compress");
        let b = AlignedBuf::zstd_decompressed(&frame, raw.len()).expect("exact length");
        assert_eq!((&b[..], b.as_ptr() as usize % SAMPLE_ALIGN), (&raw[..], 0));
        let short = AlignedBuf::zstd_decompressed(&frame, raw.len() + 10).err();
        assert_eq!(
            short.as_deref(),
            Some("decompressed to 100000 bytes, index says 100010")
        );
        let long = AlignedBuf::zstd_decompressed(&frame, raw.len() - 10).err();
        assert!(long.is_some_and(|e| e.starts_with("zstd: ")));
        let torn = AlignedBuf::zstd_decompressed(&frame[..frame.len() / 2], raw.len()).err();
        assert!(torn.is_some_and(|e| e.starts_with("zstd: ")));
        // This thread's context still works after the errors.
        let again = AlignedBuf::zstd_decompressed(&frame, raw.len()).expect("exact length");
        assert_eq!(&again[..], &raw[..]);
    }

    #[test]
    fn aligned_and_rounded() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.spare_mut().as_ptr() as usize % ALIGN as usize, 0);
        assert!(b.is_empty());
        b.spare_mut()[..3].copy_from_slice(b"abc");
        b.set_len(3);
        assert_eq!(b.as_slice(), b"abc");
        let s = AlignedBuf::for_sample(100);
        assert_eq!((s.len(), s.capacity()), (100, 128));
        assert_eq!(s.as_ptr() as usize % SAMPLE_ALIGN, 0);
        assert!(s.iter().all(|&b| b == 0));
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let (c, crc) = AlignedBuf::copy_of_with_crc32c(&src);
        assert_eq!((&c[..], crc), (&src[..], crc32c::crc32c(&src)));
        assert_eq!(c.as_ptr() as usize % SAMPLE_ALIGN, 0);
        assert_eq!(AlignedBuf::copy_of_with_crc32c(b"").1, 0);
        let c = AlignedBuf::copy_of(b"hello");
        assert_eq!((&c[..], c.capacity()), (&b"hello"[..], 64));
        assert_eq!(c.as_ptr() as usize % SAMPLE_ALIGN, 0);
    }

    /// A window shows exactly the bytes asked for, moved to the 64-byte
    /// boundary at or below them (not moved when already on one), with
    /// their crc32c; it refuses a range outside the data; freeing it frees
    /// (recycles) the whole allocation.
    #[test]
    fn a_read_buffer_becomes_a_window_in_place() {
        let len = 100_000;
        let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        for at in [0, 64, 4096, 1, 63, 65, 4095] {
            let mut b = AlignedBuf::for_extent(at + len);
            let cap = b.capacity();
            let need = crate::align_up((at + len) as u64) as usize;
            assert!((need..=need + need / 8).contains(&cap), "{cap}: sized to the read");
            let base = b.as_ptr() as usize;
            assert_eq!(base % ALIGN as usize, 0);
            b.spare_mut()[at..at + len].copy_from_slice(&src);
            b.set_len(at + len);
            let b = AlignedBuf::into_window(b, at, len + 1, true).expect_err("past the data");
            let (w, crc) = AlignedBuf::into_window(b, at, len, true).expect("inside");
            assert_eq!((&w[..], crc), (&src[..], crc32c::crc32c(&src)), "at {at}");
            assert_eq!(w.as_ptr() as usize, base + at / SAMPLE_ALIGN * SAMPLE_ALIGN, "at {at}");
            assert_eq!(w.capacity(), cap - at / SAMPLE_ALIGN * SAMPLE_ALIGN);
            assert_eq!(w.allocated(), cap);
            let (_, no_crc) = AlignedBuf::into_window(w, 0, 10, false).expect("inside");
            assert_eq!(no_crc, 0);
        }
        // Dropped windows go back whole: an extent read of the same size
        // gets the allocation back (the cache is process-wide and skips a
        // buffer when its lock is busy, so try a few times).
        let n = (5 << 20) + 4096 * 3;
        let mut reused = false;
        for _ in 0..100 {
            let mut b = AlignedBuf::for_extent(n);
            b.set_len(n);
            let base = b.as_ptr();
            drop(AlignedBuf::into_window(b, 4096 + 3, 70_000, false).expect("inside"));
            if AlignedBuf::for_extent(n).as_ptr() == base {
                reused = true;
                break;
            }
        }
        assert!(reused, "a dropped window's allocation was never reused");
    }

    #[test]
    fn small_size_classes_fit_within_an_eighth() {
        let mut last = (0, 64);
        for len in 1..RECYCLE_MIN {
            let (class, cap) = small::class(len);
            assert!(cap >= len && cap % SAMPLE_ALIGN == 0, "{len}: {cap}");
            assert!(
                cap - len < 64 || cap - len < len.div_ceil(8),
                "{len}: {cap} wastes more than 1/8"
            );
            assert_eq!(
                small::class(cap),
                (class, cap),
                "{len}: a class's capacity is its own class"
            );
            assert!(
                class >= last.0 && (class > last.0 || cap == last.1),
                "{len}: classes grow with the size"
            );
            last = (class, cap);
        }
        assert_eq!(last, (63, RECYCLE_MIN));
    }

    #[test]
    fn small_sample_buffers_are_reused_across_threads() {
        // A size no other test uses; other tests may take buffers of its
        // class meanwhile, so try a few times.
        let len = 4093;
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 1).collect();
        let mut reused = false;
        for _ in 0..100 {
            let a = AlignedBuf::copy_of(&src);
            let at = a.as_ptr();
            // Freed on another thread, as the consumer frees the engine's samples.
            std::thread::spawn(move || drop(a)).join().expect("drop");
            let b = AlignedBuf::for_sample(len - 3);
            assert!(b.iter().all(|&x| x == 0), "for_sample zeroes a reused buffer");
            assert_eq!(b.as_ptr() as usize % SAMPLE_ALIGN, 0);
            if b.as_ptr() == at {
                reused = true;
                break;
            }
        }
        assert!(reused, "a freed small buffer was never reused");
    }

    /// Small buffers of whole pages are page-aligned (an O_DIRECT read goes
    /// straight into one), and one read into and dropped serves a later
    /// sample (and read) of its size: the two share the size class.
    #[test]
    fn whole_page_small_buffers_are_page_aligned_and_shared_with_samples() {
        let page = ALIGN as usize;
        for pages in [1, 2, 3, 15] {
            let s = AlignedBuf::for_sample(pages * page - 10);
            assert_eq!((s.as_ptr() as usize % page, s.capacity()), (0, pages * page));
        }
        // A size no other test uses (11 pages); retried as above.
        let len = 11 * page;
        let mut reused = false;
        for _ in 0..100 {
            let mut b = AlignedBuf::for_extent(len);
            assert_eq!((b.spare_ptr() as usize % page, b.capacity()), (0, len));
            b.spare_mut().fill(3);
            b.set_len(len);
            let at = b.as_ptr();
            std::thread::spawn(move || drop(b)).join().expect("drop");
            let c = AlignedBuf::copy_of(&vec![5u8; len - 100]);
            if c.as_ptr() == at {
                reused = true;
                drop(c);
                assert_eq!(
                    AlignedBuf::for_extent(len).spare_ptr() as *const u8,
                    at,
                    "and back to a read"
                );
                break;
            }
        }
        assert!(reused, "a dropped extent buffer never became a sample");
    }

    #[test]
    fn large_sample_buffers_are_recycled_clean_and_whole() {
        // A size no other test uses; the cache is process-wide and skips a
        // buffer when another thread holds its lock, so try a few times.
        let len = (3 << 20) + 12_345;
        let src: Vec<u8> = (0..len).map(|i| (i % 253) as u8 | 1).collect();
        let mut reused = false;
        for _ in 0..100 {
            let a = AlignedBuf::copy_of(&src);
            assert_eq!(a.capacity() % ALIGN as usize, 0);
            let at = a.as_ptr();
            drop(a);
            // A little smaller: still fits the freed buffer.
            let b = AlignedBuf::for_sample(len - 5000);
            assert!(b.iter().all(|&x| x == 0), "a recycled buffer is zeroed for for_sample");
            assert_eq!((b.len(), b.as_ptr() as usize % SAMPLE_ALIGN), (len - 5000, 0));
            let c_at = b.as_ptr();
            drop(b);
            let frame = zstd::bulk::compress(&src[..len - 7000], 1).expect("compress");
            let o = AlignedBuf::zstd_decompressed(&frame, len - 7000).expect("decompresses");
            assert_eq!((&o[..], o.as_ptr() as usize % SAMPLE_ALIGN), (&src[..len - 7000], 0));
            drop(o);
            let (c, crc) = AlignedBuf::copy_of_with_crc32c(&src[..len - 9000]);
            assert_eq!((&c[..], crc), (&src[..len - 9000], crc32c::crc32c(&src[..len - 9000])));
            if c_at == at && c.as_ptr() == at {
                reused = true;
                break;
            }
        }
        assert!(reused, "a freed large sample buffer was never reused");
        // Much smaller samples do not take a large buffer.
        let big = AlignedBuf::copy_of(&src);
        let at = big.as_ptr();
        drop(big);
        let small = AlignedBuf::copy_of(&src[..len / 2]);
        assert!(
            small.capacity() < len / 2 + ALIGN as usize,
            "{small:?} took the buffer at {at:?}"
        );
    }
}
