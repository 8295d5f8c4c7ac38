//! Memory advice for the simulator's big flat tables.
//!
//! The mapping tables of a large SSD (hundreds of MB) are accessed at random. With 4 KiB
//! pages nearly every access also misses the TLB, and the page walk itself misses the
//! cache; asking the kernel for transparent huge pages on these tables roughly halves the
//! cost of a random access. The advice is only a hint: where it is unavailable nothing
//! changes but speed.

/// Allocates a vector of `len` copies of `value` and advises the kernel to back it with
/// huge pages. Small vectors are allocated normally.
pub fn huge_vec<T: Copy>(value: T, len: usize) -> Vec<T> {
    let mut v = vec![value; 0];
    v.reserve_exact(len);
    advise_huge_pages(v.as_mut_ptr() as usize, len * std::mem::size_of::<T>());
    v.resize(len, value);
    v
}

const HUGE_PAGE_BYTES: usize = 2 << 20;

#[cfg(target_os = "linux")]
fn advise_huge_pages(addr: usize, bytes: usize) {
    if bytes < 4 * HUGE_PAGE_BYTES {
        return;
    }
    // madvise needs a page-aligned start; advise only the whole huge pages inside.
    let start = addr.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
    let end = (addr + bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end <= start {
        return;
    }
    // SAFETY: the range lies inside an allocation this process owns (the vector's reserved
    // capacity), and MADV_HUGEPAGE changes no content or permission: it only tells the
    // kernel how to back the pages. A failure leaves everything as it was.
    #[allow(unsafe_code)]
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_addr: usize, _bytes: usize) {}

/// Asks the processor to start loading the cache line holding `slice[index]` without
/// waiting for it. The simulator pipelines its random table accesses with this: it
/// prefetches the entries the next requests will touch while it serves the current one.
/// An index out of range is ignored.
#[inline]
pub fn prefetch<T>(slice: &[T], index: usize) {
    if index >= slice.len() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let ptr = slice[index..].as_ptr() as *const i8;
        // SAFETY: PREFETCHT0 is a hint that never faults and changes no architectural
        // state; the address is inside the slice besides. SSE is part of the x86_64 baseline.
        #[allow(unsafe_code)]
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn huge_vec_holds_the_value() {
        let v = super::huge_vec(7u32, 3 << 20);
        assert_eq!(v.len(), 3 << 20);
        assert!(v.iter().all(|&x| x == 7));
        assert_eq!(super::huge_vec(1u8, 3), vec![1, 1, 1]);
    }
}
