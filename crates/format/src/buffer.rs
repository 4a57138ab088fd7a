//! Aligned heap buffers: page-aligned for O_DIRECT reads (and io_uring fixed
//! buffers), 64-byte-aligned for samples handed to consumers (SIMD decoders,
//! zero-copy tensors).

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use crate::ALIGN;

/// Alignment of sample buffers handed to consumers.
pub const SAMPLE_ALIGN: usize = 64;

/// A zeroed heap buffer whose start is aligned to `align` and whose capacity
/// is a multiple of it. `len` counts the bytes holding data. The allocation
/// never moves or grows, so its address is stable for the buffer's life (the
/// io engine hands it to the kernel on that promise).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    align: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); moving it
// between threads moves that ownership.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give `&[u8]` access, which is safe to share.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A page-aligned buffer of at least `cap` bytes (rounded up to
    /// [`ALIGN`], at least one block), for device reads.
    pub fn new(cap: usize) -> Self {
        Self::with_alignment(cap, ALIGN as usize)
    }

    /// A [`SAMPLE_ALIGN`]-aligned buffer holding exactly `len` bytes of zeros.
    pub fn for_sample(len: usize) -> Self {
        let mut b = Self::with_alignment(len, SAMPLE_ALIGN);
        b.len = len;
        b
    }

    /// A [`SAMPLE_ALIGN`]-aligned copy of `src`. Not zeroed first: every
    /// byte is written by the copy before the buffer exists, which saves a
    /// memset and its page faults on the hot path.
    pub fn copy_of(src: &[u8]) -> Self {
        let cap = src.len().max(1).div_ceil(SAMPLE_ALIGN) * SAMPLE_ALIGN;
        let layout = Self::layout(cap, SAMPLE_ALIGN);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: the allocation holds cap ≥ src.len() bytes and cannot
        // overlap src; then the tail past src.len() is zeroed, so all cap
        // bytes are initialised as the type requires.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr(), src.len());
            std::ptr::write_bytes(ptr.as_ptr().add(src.len()), 0, cap - src.len());
        }
        AlignedBuf {
            ptr,
            cap,
            len: src.len(),
            align: SAMPLE_ALIGN,
        }
    }

    /// `align` must be a power of two.
    pub fn with_alignment(cap: usize, align: usize) -> Self {
        let cap = cap.max(1).div_ceil(align) * align;
        let layout = Self::layout(cap, align);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf {
            ptr,
            cap,
            len: 0,
            align,
        }
    }

    fn layout(cap: usize, align: usize) -> Layout {
        // cap is a non-zero multiple of align, a power of two: always valid
        // unless cap overflows isize, which alloc would reject anyway.
        Layout::from_size_align(cap, align).unwrap_or_else(|e| panic!("buffer of {cap} bytes: {e}"))
    }

    /// The data bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap ≥ len bytes, initialised, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn capacity(&self) -> usize {
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
        // SAFETY: ptr is valid for cap ≥ len bytes, all initialised when allocated.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole capacity, for synchronous reads into it.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap bytes, all initialised when allocated, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Marks the first `len` bytes as holding data.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "set_len {len} beyond capacity {}", self.cap);
        self.len = len;
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AlignedBuf({} of {} bytes, align {})",
            self.len, self.cap, self.align
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
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.cap, self.align)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let c = AlignedBuf::copy_of(b"hello");
        assert_eq!((&c[..], c.capacity()), (&b"hello"[..], 64));
        assert_eq!(c.as_ptr() as usize % SAMPLE_ALIGN, 0);
    }
}
