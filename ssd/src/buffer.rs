//! The controller's DRAM write buffer: write-back, page-granular slots holding
//! sector-granular data, FIFO or LRU eviction.
//!
//! A slot whose page is being programmed stays occupied until the program completes, so a
//! full buffer makes new writes wait for the flash exactly as long as a real one would.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use afa_sim::TimeNs;

use crate::config::BufferPolicy;
use crate::ftl::NONE;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub lpn: u32,
    /// Sectors of the page present in the slot.
    pub mask: u64,
    pub transient: bool,
    prev: u32,
    next: u32,
}

#[derive(Debug)]
pub(crate) struct WriteBuffer {
    capacity_pages: usize,
    policy: BufferPolicy,
    page_units_bytes: usize,
    page_tag_bytes: usize,
    slot_of_lpn: Vec<u32>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Most recently inserted (or used, under LRU) slot, and the eviction end.
    head: u32,
    tail: u32,
    dirty: usize,
    pub data: Vec<u8>,
    pub tags: Vec<u8>,
    /// Times at which slots that are being programmed become free again.
    inflight: BinaryHeap<Reverse<TimeNs>>,
}

impl WriteBuffer {
    pub fn new(
        capacity_pages: usize,
        policy: BufferPolicy,
        logical_pages: u32,
        page_units_bytes: usize,
        page_tag_bytes: usize,
    ) -> Self {
        let capacity_pages = capacity_pages.max(1);
        Self {
            capacity_pages,
            policy,
            page_units_bytes,
            page_tag_bytes,
            slot_of_lpn: vec![NONE; logical_pages as usize],
            slots: Vec::with_capacity(capacity_pages),
            free_slots: Vec::new(),
            head: NONE,
            tail: NONE,
            dirty: 0,
            data: Vec::new(),
            tags: Vec::new(),
            inflight: BinaryHeap::new(),
        }
    }

    pub fn dirty_pages(&self) -> usize {
        self.dirty
    }

    #[inline]
    pub fn lookup(&self, lpn: u32) -> Option<u32> {
        let s = self.slot_of_lpn[lpn as usize];
        (s != NONE).then_some(s)
    }

    #[inline]
    pub fn slot(&self, slot: u32) -> &Slot {
        &self.slots[slot as usize]
    }

    #[inline]
    pub fn slot_data(&self, slot: u32) -> &[u8] {
        let start = slot as usize * self.page_units_bytes;
        &self.data[start..start + self.page_units_bytes]
    }

    #[inline]
    pub fn slot_data_mut(&mut self, slot: u32) -> &mut [u8] {
        let start = slot as usize * self.page_units_bytes;
        &mut self.data[start..start + self.page_units_bytes]
    }

    pub fn has_tags(&self) -> bool {
        !self.tags.is_empty()
    }

    pub fn slot_tags(&self, slot: u32) -> &[u8] {
        let start = slot as usize * self.page_tag_bytes;
        &self.tags[start..start + self.page_tag_bytes]
    }

    pub fn slot_tags_mut(&mut self, slot: u32) -> &mut [u8] {
        if self.tags.is_empty() {
            self.tags = vec![0; self.capacity_pages * self.page_tag_bytes];
        }
        let start = slot as usize * self.page_tag_bytes;
        &mut self.tags[start..start + self.page_tag_bytes]
    }

    fn unlink(&mut self, slot: u32) {
        let Slot { prev, next, .. } = self.slots[slot as usize];
        if prev != NONE {
            self.slots[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NONE {
            self.slots[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.prev = NONE;
        s.next = self.head;
        if self.head != NONE {
            self.slots[self.head as usize].prev = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
    }

    /// Records a use of a buffered page (a rewrite or a read hit): LRU moves it to the front.
    pub fn touch(&mut self, slot: u32) {
        if self.policy == BufferPolicy::Lru && self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    /// Frees the slots whose programs have completed by `now_ns`.
    fn release_until(&mut self, now_ns: TimeNs) {
        while let Some(&Reverse(t)) = self.inflight.peek() {
            if t > now_ns {
                break;
            }
            self.inflight.pop();
        }
    }

    /// Programs of evicted pages still running at `now_ns` (their slots are not free yet).
    pub fn programs_in_flight(&mut self, now_ns: TimeNs) -> usize {
        self.release_until(now_ns);
        self.inflight.len()
    }

    /// Whether inserting a page needs an eviction first.
    pub fn is_full(&mut self, now_ns: TimeNs) -> bool {
        self.release_until(now_ns);
        self.dirty + self.inflight.len() >= self.capacity_pages
    }

    /// The least valuable dirty page under the policy, if any.
    pub fn eviction_candidate(&self) -> Option<u32> {
        (self.tail != NONE).then_some(self.tail)
    }

    /// Inserts an empty slot for `lpn`; the caller has made room. Returns the slot and the
    /// time it is free to be filled (after an in-flight program releases it, if the buffer
    /// was full).
    pub fn insert(&mut self, lpn: u32, now_ns: TimeNs) -> (u32, TimeNs) {
        self.release_until(now_ns);
        let mut ready = now_ns;
        if self.dirty + self.inflight.len() >= self.capacity_pages {
            if let Some(Reverse(t)) = self.inflight.pop() {
                ready = t;
            }
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                let s = self.slots.len() as u32;
                self.slots.push(Slot {
                    lpn: NONE,
                    mask: 0,
                    transient: false,
                    prev: NONE,
                    next: NONE,
                });
                self.data
                    .resize(self.slots.len() * self.page_units_bytes, 0);
                if !self.tags.is_empty() {
                    self.tags.resize(self.slots.len() * self.page_tag_bytes, 0);
                }
                s
            }
        };
        let s = &mut self.slots[slot as usize];
        s.lpn = lpn;
        s.mask = 0;
        s.transient = false;
        self.slot_of_lpn[lpn as usize] = slot;
        self.push_front(slot);
        self.dirty += 1;
        (slot, ready)
    }

    pub fn mark(&mut self, slot: u32, mask: u64, transient: bool) {
        let s = &mut self.slots[slot as usize];
        s.mask |= mask;
        s.transient = transient;
    }

    /// Removes a slot whose page has been handed to the flash; its space is held until
    /// `release_ns`, when the program completes.
    pub fn remove_evicted(&mut self, slot: u32, release_ns: TimeNs) {
        self.remove(slot);
        self.inflight.push(Reverse(release_ns));
    }

    /// Drops a slot whose data is no longer wanted (TRIM of the whole page).
    pub fn remove(&mut self, slot: u32) {
        self.unlink(slot);
        let lpn = self.slots[slot as usize].lpn;
        self.slot_of_lpn[lpn as usize] = NONE;
        self.slots[slot as usize].lpn = NONE;
        self.free_slots.push(slot);
        self.dirty -= 1;
    }

    /// When every in-flight program has completed.
    pub fn drained_at(&self) -> TimeNs {
        self.inflight.iter().map(|Reverse(t)| *t).max().unwrap_or(0)
    }
}
