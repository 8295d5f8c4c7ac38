//! The DRAM write buffer, allocated sector by sector (§III: "the buffer is allocated to
//! write requests at the unit of a sector"). Pages are kept in one stack, most recent at
//! the head; which page leaves is the policy's choice (see `device.rs`), the buffer only
//! keeps the order, the sectors and the space.
//!
//! Destaged sectors keep their space until their program completes, so a full buffer makes
//! new writes wait for the flash as long as a real one would.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use afa_sim::TimeNs;

use crate::config::BufferPolicy;

const NONE: u32 = u32::MAX;

/// A page's neighbours in one of the buffer's lists.
#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
}

const UNLINKED: Links = Links {
    prev: NONE,
    next: NONE,
};

/// The first (most recent) and last slots of one of the buffer's lists.
#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
}

const EMPTY: Ends = Ends {
    head: NONE,
    tail: NONE,
};

#[derive(Debug, Clone, Copy)]
struct Entry {
    lpn: u32,
    mask: u64,
    /// Neighbours in the stack of every buffered page.
    stack: Links,
    /// Neighbours in the list of full pages (LRU policies only), in the stack's order.
    full: Links,
}

/// Which of an entry's links a list uses.
type Field = fn(&mut Entry) -> &mut Links;

fn stack_links(e: &mut Entry) -> &mut Links {
    &mut e.stack
}

fn full_links(e: &mut Entry) -> &mut Links {
    &mut e.full
}

/// Takes `slot` out of the list whose ends are `ends` and whose links are `field`.
fn unlink(entries: &mut [Entry], ends: &mut Ends, field: Field, slot: u32) {
    let Links { prev, next } = *field(&mut entries[slot as usize]);
    if prev != NONE {
        field(&mut entries[prev as usize]).next = next;
    } else {
        ends.head = next;
    }
    if next != NONE {
        field(&mut entries[next as usize]).prev = prev;
    } else {
        ends.tail = prev;
    }
}

/// Puts `slot` at the head of the list whose ends are `ends` and whose links are `field`.
fn push_front(entries: &mut [Entry], ends: &mut Ends, field: Field, slot: u32) {
    *field(&mut entries[slot as usize]) = Links {
        prev: NONE,
        next: ends.head,
    };
    if ends.head != NONE {
        field(&mut entries[ends.head as usize]).prev = slot;
    } else {
        ends.tail = slot;
    }
    ends.head = slot;
}

#[derive(Debug)]
pub(crate) struct WriteBuffer {
    policy: BufferPolicy,
    full_mask: u64,
    unit: usize,
    spp: usize,
    capacity_sectors: u64,
    slot_of_lpn: Vec<u32>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    data: Vec<u8>,
    /// Every buffered page, most recent first.
    stack: Ends,
    /// The full pages alone, in the stack's order, so that PC-LRU finds "the full page
    /// closest to the bottom" without walking past the partial pages below it. Kept for the
    /// LRU-based policies; FIFO reorders nothing and never asks.
    full: Ends,
    dirty_sectors: u64,
    pages: u64,
    partial_pages: u64,
    inflight: BinaryHeap<Reverse<(TimeNs, u64)>>,
    inflight_sectors: u64,
    /// FIFO only: the pages of each buffered request, oldest first.
    requests: VecDeque<Vec<u32>>,
    /// FIFO with the whole-buffer drain: the requests marked for destaging when the drain
    /// began, oldest first. Requests written later wait in `requests` for the next drain.
    draining: VecDeque<Vec<u32>>,
}

impl WriteBuffer {
    pub fn new(
        policy: BufferPolicy,
        capacity_sectors: u64,
        logical_pages: u32,
        spp: u32,
        unit: usize,
    ) -> Self {
        Self {
            policy,
            full_mask: if spp == 64 {
                u64::MAX
            } else {
                (1u64 << spp) - 1
            },
            unit,
            spp: spp as usize,
            capacity_sectors,
            slot_of_lpn: vec![NONE; logical_pages as usize],
            entries: Vec::new(),
            free: Vec::new(),
            data: Vec::new(),
            stack: EMPTY,
            full: EMPTY,
            dirty_sectors: 0,
            pages: 0,
            partial_pages: 0,
            inflight: BinaryHeap::new(),
            inflight_sectors: 0,
            requests: VecDeque::new(),
            draining: VecDeque::new(),
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    pub fn partial_pages(&self) -> u64 {
        self.partial_pages
    }

    /// Sectors of `lpn` in the buffer.
    #[inline]
    pub fn mask(&self, lpn: u32) -> u64 {
        match self.slot_of_lpn[lpn as usize] {
            NONE => 0,
            s => self.entries[s as usize].mask,
        }
    }

    /// The buffered sector `s` of `lpn` (the page must hold it).
    pub fn sector(&self, lpn: u32, s: usize) -> &[u8] {
        let slot = self.slot_of_lpn[lpn as usize] as usize;
        let start = (slot * self.spp + s) * self.unit;
        &self.data[start..start + self.unit]
    }

    fn unlink(&mut self, slot: u32) {
        unlink(&mut self.entries, &mut self.stack, stack_links, slot);
    }

    fn push_front(&mut self, slot: u32) {
        push_front(&mut self.entries, &mut self.stack, stack_links, slot);
    }

    fn full_unlink(&mut self, slot: u32) {
        unlink(&mut self.entries, &mut self.full, full_links, slot);
    }

    fn full_push_front(&mut self, slot: u32) {
        push_front(&mut self.entries, &mut self.full, full_links, slot);
    }

    /// Moves a page to the top of the stack (and of the full pages, when it is one).
    fn move_to_front(&mut self, slot: u32) {
        if self.stack.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
        if self.entries[slot as usize].mask == self.full_mask && self.full.head != slot {
            self.full_unlink(slot);
            self.full_push_front(slot);
        }
    }

    /// Records a read hit: the LRU-based policies move the page to the top of the stack.
    pub fn touch(&mut self, lpn: u32) {
        let slot = self.slot_of_lpn[lpn as usize];
        if slot != NONE && self.policy != BufferPolicy::Fifo {
            self.move_to_front(slot);
        }
    }

    /// Stores sectors `first..first + count` of `lpn` from `units` (`count` payload units).
    /// Overwrites merge with the buffered page and move it to the top (except under FIFO,
    /// which keeps insertion order).
    pub fn put(&mut self, lpn: u32, first: usize, count: usize, units: &[u8]) {
        let mut slot = self.slot_of_lpn[lpn as usize];
        if slot == NONE {
            slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    self.entries.push(Entry {
                        lpn,
                        mask: 0,
                        stack: UNLINKED,
                        full: UNLINKED,
                    });
                    self.data
                        .resize(self.entries.len() * self.spp * self.unit, 0);
                    self.entries.len() as u32 - 1
                }
            };
            self.entries[slot as usize].lpn = lpn;
            self.entries[slot as usize].mask = 0;
            self.slot_of_lpn[lpn as usize] = slot;
            self.push_front(slot);
            self.pages += 1;
            self.partial_pages += 1;
        } else if self.policy != BufferPolicy::Fifo {
            self.move_to_front(slot);
        }
        let mask = if count >= 64 {
            u64::MAX
        } else {
            ((1u64 << count) - 1) << first
        };
        let e = &mut self.entries[slot as usize];
        let was_full = e.mask == self.full_mask;
        self.dirty_sectors += (mask & !e.mask).count_ones() as u64;
        e.mask |= mask;
        if !was_full && e.mask == self.full_mask {
            self.partial_pages -= 1;
            if self.policy != BufferPolicy::Fifo {
                // The page is at the top of the stack, so it heads the full pages too.
                self.full_push_front(slot);
            }
        }
        if self.unit > 0 {
            let start = (slot as usize * self.spp + first) * self.unit;
            self.data[start..start + count * self.unit].copy_from_slice(units);
        }
    }

    /// FIFO: remembers which pages a request wrote, so they leave together.
    pub fn record_request(&mut self, lpns: Vec<u32>) {
        if self.policy == BufferPolicy::Fifo {
            self.requests.push_back(lpns);
        }
    }

    /// The oldest buffered request's pages that are still buffered (FIFO).
    pub fn pop_request(&mut self) -> Option<Vec<u32>> {
        Self::pop_live(&mut self.requests, &self.slot_of_lpn)
    }

    /// Marks every buffered request for destaging (VSSIM's drain): they leave through
    /// `pop_draining`, oldest first, and requests written from now on wait for the next
    /// drain.
    pub fn start_drain(&mut self) {
        self.draining.append(&mut self.requests);
    }

    /// Whether requests marked by `start_drain` are still waiting to be destaged (some may
    /// have no buffered page left).
    pub fn draining(&self) -> bool {
        !self.draining.is_empty()
    }

    /// The oldest request marked for draining whose pages are still (partly) buffered.
    pub fn pop_draining(&mut self) -> Option<Vec<u32>> {
        Self::pop_live(&mut self.draining, &self.slot_of_lpn)
    }

    /// Forgets every request (a flush has destaged all the pages).
    pub fn clear_requests(&mut self) {
        self.requests.clear();
        self.draining.clear();
    }

    fn pop_live(queue: &mut VecDeque<Vec<u32>>, slot_of_lpn: &[u32]) -> Option<Vec<u32>> {
        while let Some(r) = queue.pop_front() {
            let live: Vec<u32> = r
                .into_iter()
                .filter(|&l| slot_of_lpn[l as usize] != NONE)
                .collect();
            if !live.is_empty() {
                return Some(live);
            }
        }
        None
    }

    /// Pages from the bottom of the stack upwards: (lpn, mask).
    pub fn bottom_up(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let mut at = self.stack.tail;
        std::iter::from_fn(move || {
            if at == NONE {
                return None;
            }
            let e = self.entries[at as usize];
            at = e.stack.prev;
            Some((e.lpn, e.mask))
        })
    }

    /// The full page nearest the bottom of the stack (LRU-based policies).
    pub fn bottom_full(&self) -> Option<u32> {
        debug_assert!(
            self.policy != BufferPolicy::Fifo,
            "FIFO keeps no full-page list"
        );
        (self.full.tail != NONE).then(|| self.entries[self.full.tail as usize].lpn)
    }

    /// Removes a page and returns its mask and page image (sector `s` at `s * unit`).
    pub fn take(&mut self, lpn: u32) -> (u64, Vec<u8>) {
        let slot = self.slot_of_lpn[lpn as usize];
        debug_assert!(slot != NONE, "taking a page that is not buffered");
        self.unlink(slot);
        let e = self.entries[slot as usize];
        if e.mask == self.full_mask && self.policy != BufferPolicy::Fifo {
            self.full_unlink(slot);
        }
        self.slot_of_lpn[lpn as usize] = NONE;
        self.free.push(slot);
        self.pages -= 1;
        if e.mask != self.full_mask {
            self.partial_pages -= 1;
        }
        self.dirty_sectors -= e.mask.count_ones() as u64;
        let len = self.spp * self.unit;
        let image = self.data[slot as usize * len..(slot as usize + 1) * len].to_vec();
        (e.mask, image)
    }

    /// Drops sectors `mask` of a buffered page (TRIM); the page leaves when it is empty.
    pub fn discard(&mut self, lpn: u32, mask: u64) {
        let slot = self.slot_of_lpn[lpn as usize];
        if slot == NONE {
            return;
        }
        let e = self.entries[slot as usize];
        if e.mask & !mask == 0 {
            self.take(lpn);
            return;
        }
        let was_full = e.mask == self.full_mask;
        self.dirty_sectors -= (e.mask & mask).count_ones() as u64;
        self.entries[slot as usize].mask &= !mask;
        if was_full {
            self.partial_pages += 1;
            if self.policy != BufferPolicy::Fifo {
                self.full_unlink(slot);
            }
        }
    }

    /// Holds `sectors` of space until `release_ns` (a destaged page being programmed).
    pub fn hold(&mut self, release_ns: TimeNs, sectors: u64) {
        self.inflight.push(Reverse((release_ns, sectors)));
        self.inflight_sectors += sectors;
    }

    fn release_until(&mut self, now_ns: TimeNs) {
        while let Some(&Reverse((t, n))) = self.inflight.peek() {
            if t > now_ns {
                break;
            }
            self.inflight.pop();
            self.inflight_sectors -= n;
        }
    }

    /// Whether `sectors` more fit at `now_ns`.
    pub fn fits(&mut self, now_ns: TimeNs, sectors: u64) -> bool {
        self.release_until(now_ns);
        self.dirty_sectors + self.inflight_sectors + sectors <= self.capacity_sectors
    }

    /// Whether `sectors` more would not fit even once every in-flight program ended: then
    /// more dirty pages must be destaged, otherwise waiting is enough.
    pub fn must_evict(&self, sectors: u64) -> bool {
        self.dirty_sectors > 0 && self.dirty_sectors + sectors > self.capacity_sectors
    }

    /// The next time held space is released.
    pub fn next_release(&self) -> Option<TimeNs> {
        self.inflight.peek().map(|Reverse((t, _))| *t)
    }

    /// When every held space is released (every destaged program has ended).
    pub fn drained_at(&self) -> TimeNs {
        self.inflight
            .iter()
            .map(|Reverse((t, _))| *t)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One buffer operation on page `lpn`: write sectors `first..first + count`, a read
    /// hit, a destage, or a TRIM of the sectors in `mask`.
    #[derive(Debug, Clone)]
    enum Op {
        Put {
            lpn: u32,
            first: usize,
            count: usize,
        },
        Touch {
            lpn: u32,
        },
        Take {
            lpn: u32,
        },
        Discard {
            lpn: u32,
            mask: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let lpn = 0u32..12;
        prop_oneof![
            4 => (lpn.clone(), 0usize..4, 1usize..=4).prop_map(|(lpn, first, count)| Op::Put {
                lpn,
                first,
                count: count.min(4 - first),
            }),
            1 => lpn.clone().prop_map(|lpn| Op::Touch { lpn }),
            1 => lpn.clone().prop_map(|lpn| Op::Take { lpn }),
            1 => (lpn, 1u64..16).prop_map(|(lpn, mask)| Op::Discard { lpn, mask }),
        ]
    }

    proptest! {
        /// The list of full pages always names the full page a walk up from the bottom of
        /// the stack finds first, whatever writes, hits, destages and TRIMs came before.
        #[test]
        fn the_full_page_list_agrees_with_a_walk_of_the_stack(
            policy in prop_oneof![
                Just(BufferPolicy::Lru),
                Just(BufferPolicy::Mca),
                Just(BufferPolicy::PcLru),
            ],
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut b = WriteBuffer::new(policy, 1 << 20, 12, 4, 0);
            for op in ops {
                match op {
                    Op::Put { lpn, first, count } => b.put(lpn, first, count, &[]),
                    Op::Touch { lpn } => b.touch(lpn),
                    Op::Take { lpn } => {
                        if b.mask(lpn) != 0 {
                            b.take(lpn);
                        }
                    }
                    Op::Discard { lpn, mask } => b.discard(lpn, mask),
                }
                let walk = b.bottom_up().find(|&(_, m)| m == 0b1111).map(|(lpn, _)| lpn);
                prop_assert_eq!(b.bottom_full(), walk);
                let full = b.bottom_up().filter(|&(_, m)| m == 0b1111).count() as u64;
                prop_assert_eq!(b.pages() - b.partial_pages(), full);
            }
        }
    }
}
