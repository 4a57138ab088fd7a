//! Read buffers handed to the kernel: page-aligned [`AlignedBuf`]s that
//! tokio-uring may own while a read is in flight.

use brand_format::buffer::AlignedBuf;

/// A page-aligned read buffer (see [`AlignedBuf::new`]).
#[derive(Debug)]
pub struct PageBuf(pub AlignedBuf);

impl PageBuf {
    pub fn new(cap: usize) -> Self {
        PageBuf(AlignedBuf::new(cap))
    }
}

impl std::ops::Deref for PageBuf {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        &self.0
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        &mut self.0
    }
}

// SAFETY: an AlignedBuf's allocation never moves or grows, so the pointer is
// stable for the buffer's life; bytes_init = len ≤ bytes_total = capacity,
// the allocation's size.
unsafe impl tokio_uring::buf::IoBuf for PageBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0.len()
    }
    fn bytes_total(&self) -> usize {
        self.0.capacity()
    }
}

// SAFETY: as above; set_init only raises the mark within the allocation, to
// bytes the kernel has written (an extent buffer may be uninitialised beyond
// it: it is never viewed there, see AlignedBuf::for_extent).
unsafe impl tokio_uring::buf::IoBufMut for PageBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.spare_ptr()
    }
    unsafe fn set_init(&mut self, pos: usize) {
        if pos > self.0.len() {
            let cap = self.0.capacity();
            self.0.set_len(pos.min(cap));
        }
    }
}
