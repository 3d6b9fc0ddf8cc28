//! Hints to the memory system ahead of reads at random places: a loop whose every step
//! starts with a cache miss (a document's length in a 5 MB index, its tokens somewhere in a
//! 1 GB file) waits for each miss in turn; asking for the next steps' lines first lets the
//! misses overlap. A hint never faults and changes nothing the program computes; on targets
//! without the instruction it is nothing.

/// Ask for the cache line holding `items[i]` (nothing if `i` is out of range).
#[inline]
pub(crate) fn item<T>(items: &[T], i: usize) {
    if let Some(x) = items.get(i) {
        line(std::ptr::from_ref(x).cast());
    }
}

/// Ask for the cache lines of the first `cap` bytes of `bytes`.
#[inline]
pub(crate) fn lines(bytes: &[u8], cap: usize) {
    for l in bytes[..bytes.len().min(cap)].chunks(64) {
        line(l.as_ptr());
    }
}

#[inline]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
