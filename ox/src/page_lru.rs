//! The host page cache's recency order: an intrusive doubly linked list over page numbers,
//! so that a hit moves its page to the front, and an eviction takes the least recently used
//! page, in constant time. Every B-tree operation touches three or four pages, so an
//! ordered map keyed by access time cost a tree insert and remove on each of them.

const NONE: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct PageLru {
    prev: Vec<u32>,
    next: Vec<u32>,
    cached: Vec<bool>,
    /// The most recently used page.
    head: u32,
    /// The least recently used page, the next to leave.
    tail: u32,
    len: usize,
}

impl PageLru {
    /// An order over `pages` pages, none of them cached.
    pub fn new(pages: usize) -> Self {
        let mut lru = Self {
            prev: Vec::new(),
            next: Vec::new(),
            cached: Vec::new(),
            head: NONE,
            tail: NONE,
            len: 0,
        };
        for _ in 0..pages {
            lru.add_page();
        }
        lru
    }

    /// One more page, not cached.
    pub fn add_page(&mut self) {
        assert!(
            self.cached.len() < NONE as usize,
            "page numbers fit in 32 bits"
        );
        self.prev.push(NONE);
        self.next.push(NONE);
        self.cached.push(false);
    }

    pub fn contains(&self, page: u64) -> bool {
        self.cached[page as usize]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Makes `page` the most recently used, caching it if it was not.
    pub fn touch(&mut self, page: u64) {
        let p = page as u32;
        if self.cached[page as usize] {
            if self.head == p {
                return;
            }
            self.unlink(p);
        } else {
            self.cached[page as usize] = true;
            self.len += 1;
        }
        self.prev[p as usize] = NONE;
        self.next[p as usize] = self.head;
        if self.head != NONE {
            self.prev[self.head as usize] = p;
        } else {
            self.tail = p;
        }
        self.head = p;
    }

    /// Removes and returns the least recently used page.
    pub fn pop_lru(&mut self) -> Option<u64> {
        if self.tail == NONE {
            return None;
        }
        let p = self.tail;
        self.unlink(p);
        self.cached[p as usize] = false;
        self.len -= 1;
        Some(p as u64)
    }

    /// Uncaches every page.
    pub fn clear(&mut self) {
        while self.pop_lru().is_some() {}
    }

    fn unlink(&mut self, p: u32) {
        let (prev, next) = (self.prev[p as usize], self.next[p as usize]);
        if prev != NONE {
            self.next[prev as usize] = next;
        } else {
            self.head = next;
        }
        if next != NONE {
            self.prev[next as usize] = prev;
        } else {
            self.tail = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Against a plain list kept in recency order: the same pages cached, the same
        /// page evicted each time.
        #[test]
        fn evicts_in_the_order_of_a_plain_recency_list(
            ops in proptest::collection::vec((0u64..16, proptest::bool::weighted(0.2)), 1..300)
        ) {
            let mut lru = PageLru::new(16);
            let mut model: Vec<u64> = Vec::new(); // most recent first
            for (page, evict) in ops {
                if evict {
                    proptest::prop_assert_eq!(lru.pop_lru(), model.pop());
                } else {
                    lru.touch(page);
                    model.retain(|&p| p != page);
                    model.insert(0, page);
                }
                proptest::prop_assert_eq!(lru.len(), model.len());
                for p in 0..16 {
                    proptest::prop_assert_eq!(lru.contains(p), model.contains(&p));
                }
            }
            lru.clear();
            proptest::prop_assert_eq!(lru.len(), 0);
            proptest::prop_assert_eq!(lru.pop_lru(), None);
        }
    }
}
