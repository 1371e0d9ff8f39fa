//! Page-locked buffers for the messages the device copies its results into: a copy back into
//! pinned memory runs at the bus's speed and needs no staging copy, and a buffer that is reused
//! costs no page faults. A buffer goes back to the pool when its message drops, on whatever thread
//! (a publisher, a bag writer), and a later frame takes it again.
//!
//! Page-locked memory is taken from the host's RAM for good, so the pool holds at most
//! [`OUTPUT_POOL_LIMIT`] bytes; past it (many frames in flight) a message lives on the heap, the
//! copy back is slower, and [`OutputPool::heap_fallbacks`] counts it.

use crate::cloud::{LentBytes, MessageBytes};
use cudarc::driver::{CudaContext, PinnedHostSlice};
use std::sync::{Arc, Mutex};

/// Most page-locked bytes the pool holds (in use and free).
pub const OUTPUT_POOL_LIMIT: usize = 256 << 20;

/// Buffers are sized in steps of this, with a quarter of headroom, so that the next frames'
/// messages (whose sizes vary a little) fit the same buffers.
const GRANULE: usize = 1 << 20;

/// A page-locked buffer and its host address.
struct PinnedBuf {
    slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
}

impl PinnedBuf {
    fn len(&self) -> usize {
        self.slice.len()
    }
}

struct PoolState {
    ctx: Arc<CudaContext>,
    free: Vec<PinnedBuf>,
    /// Bytes of every buffer allocated and not freed (in use or free).
    held: usize,
    heap_fallbacks: u64,
}

#[derive(Clone)]
pub struct OutputPool {
    state: Arc<Mutex<PoolState>>,
}

/// A pool buffer lent to one message.
struct PooledBytes {
    buf: Option<PinnedBuf>,
    len: usize,
    state: Arc<Mutex<PoolState>>,
}

// SAFETY: a buffer is owned by one value at a time (the pool's free list or one message); `ptr`
// points into its page-locked host memory, valid on any thread.
unsafe impl Send for PinnedBuf {}
unsafe impl Sync for PinnedBuf {}

impl LentBytes for PooledBytes {
    fn bytes(&self) -> &[u8] {
        let Some(b) = &self.buf else { return &[] };
        // SAFETY: `ptr` holds `len` <= capacity bytes, initialised (see `OutputPool::take`).
        unsafe { std::slice::from_raw_parts(b.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let Some(b) = &mut self.buf else { return &mut [] };
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(b.ptr, self.len) }
    }
}

impl Drop for PooledBytes {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).free.push(buf);
        }
    }
}

impl OutputPool {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self { state: Arc::new(Mutex::new(PoolState { ctx, free: Vec::new(), held: 0, heap_fallbacks: 0 })) }
    }

    /// `len` bytes for a message: the smallest free pool buffer that holds them, else a new one,
    /// else (over the limit, or the driver refused) the heap. The contents are whatever the
    /// buffer held before (zeroes when new): the caller writes every byte it publishes.
    pub fn take(&self, len: usize) -> MessageBytes {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fit =
            st.free.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
        let buf = match fit {
            Some(i) => Some(st.free.swap_remove(i)),
            None => {
                let cap = (len + len / 4).div_ceil(GRANULE) * GRANULE;
                // Free buffers too small for this size are dropped first to make room.
                while st.held + cap > OUTPUT_POOL_LIMIT {
                    let Some(small) = st.free.pop() else { break };
                    st.held -= small.len();
                }
                if st.held + cap <= OUTPUT_POOL_LIMIT {
                    match Self::alloc(&st.ctx, cap) {
                        Ok(b) => {
                            st.held += cap;
                            Some(b)
                        }
                        Err(e) => {
                            tracing::warn!(
                                "page-locked output buffer of {cap} bytes refused ({e}); this message is on the heap"
                            );
                            None
                        }
                    }
                } else {
                    None
                }
            }
        };
        match buf {
            Some(buf) => MessageBytes::Lent(Box::new(PooledBytes { buf: Some(buf), len, state: self.state.clone() })),
            None => {
                st.heap_fallbacks += 1;
                if st.heap_fallbacks == 1 {
                    tracing::warn!(
                        "output messages in flight hold more than {} MiB of page-locked memory: further ones are on the heap (slower copies back; counted in heap_fallbacks)",
                        OUTPUT_POOL_LIMIT >> 20
                    );
                }
                MessageBytes::zeroed(len)
            }
        }
    }

    /// `cap` zeroed page-locked bytes (not write-combined: the host reads them).
    fn alloc(ctx: &Arc<CudaContext>, cap: usize) -> Result<PinnedBuf, cudarc::driver::DriverError> {
        // SAFETY: zeroed below before anything reads it.
        let mut slice = unsafe { ctx.alloc_pinned_with_flags::<u8>(cap, 0) }?;
        let ptr = slice.as_mut_ptr()?;
        // SAFETY: `ptr` holds `cap` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, cap) };
        Ok(PinnedBuf { slice, ptr })
    }

    /// Messages that got heap bytes instead of a pool buffer.
    pub fn heap_fallbacks(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).heap_fallbacks
    }
}
