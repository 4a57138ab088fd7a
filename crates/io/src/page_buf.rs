//! Read buffers handed to the kernel: page-aligned [`AlignedBuf`]s that a
//! ring loop's slot owns while a read is in flight.

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
