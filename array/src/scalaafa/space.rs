//! Heroes and the lock-free permission management of ScalaAFA §5.1–§5.2.
//!
//! The space manager owns every free hero (horizontal heroes by row, vertical heroes per
//! SSD) and grants them to I/O threads in batches; a thread writes only into heroes it
//! holds. All communication goes through channels, never through shared mutable state, so
//! the same code runs the manager and the threads on real threads in serve mode
//! ([`super::threaded`]). In the simulation the engine pumps both ends in a fixed order,
//! which keeps runs deterministic (a channel delivers in send order).

use std::collections::VecDeque;

use crossbeam_channel::{unbounded as channel, Receiver, Sender};

use afa_sim::TimeNs;

/// What an I/O thread tells the space manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToManager {
    /// The thread runs low on heroes (below its low-water mark) and asks for a batch.
    Ask { thread: usize, at_ns: TimeNs },
    /// Heroes going back to the manager: when a thread ends, or in answer to a recall.
    Return {
        thread: usize,
        hhs: Vec<u32>,
        /// (SSD, VH number).
        vhs: Vec<(usize, u32)>,
    },
    /// A hero group the thread filled, queued on the thread's full-HG list for conversion.
    Full { thread: usize, stripe: u32 },
    /// On real threads only: the thread assembled hero group `stripe` from its heroes, with
    /// VH `vhs[r]` on the stripe's parity member r. The daemon keeps the HGMT.
    Opened {
        thread: usize,
        stripe: u32,
        vhs: Vec<u32>,
    },
    /// On real threads only: the thread is about to draw a timestamp for a write of user
    /// chunk `chunk` (its `Wrote` follows). Array-level GC does not move a chunk that is
    /// being written, so no copy it makes can carry a newer timestamp than the user's.
    Writing { chunk: u32 },
    /// On real threads only: user chunk `chunk` now lives in slot `slot` of `stripe`, its
    /// copies written with timestamp `ts`. The daemon keeps the authoritative AMT and the
    /// stripes' live counts, so it learns of every write in the order each thread made them.
    Wrote {
        thread: usize,
        chunk: u32,
        stripe: u32,
        slot: u32,
        ts: u32,
    },
    /// On real threads only: the thread closed its open group `stripe` early, as the
    /// daemon asked (`Control::Seal`): the slots it had not filled are trimmed, and the
    /// group is full.
    Sealed { thread: usize, stripe: u32 },
    /// On real threads only: user chunk `chunk` was trimmed.
    Unmapped { chunk: u32 },
    /// On real threads only: the thread has passed barrier `epoch`, so it reads no location
    /// it had given up before the barrier was sent.
    Passed { thread: usize, epoch: u64 },
    /// On real threads only, with members behind a volatile cache: member flush number
    /// `upto` is done, so the dead rows held since before it started may be trimmed and
    /// handed out.
    Flushed { upto: u64 },
    /// On real threads only: the daemon stops once it has handled what came before
    /// (`orderly`), or at once, leaving the rest unhandled (a crash).
    Stop { orderly: bool },
}

/// What the space manager tells an I/O thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToThread {
    /// A batch of heroes, usable from `at_ns` on.
    Grant {
        hhs: Vec<u32>,
        vhs: Vec<(usize, u32)>,
        at_ns: TimeNs,
    },
    /// Give back `per_mille` thousandths of the unused heroes.
    Recall { per_mille: u32 },
}

/// One I/O thread's side: the heroes it holds and its channel ends.
#[derive(Debug)]
pub(crate) struct ThreadHeroes {
    pub id: usize,
    /// Horizontal heroes held, each usable from the time its grant arrived.
    pub hhs: VecDeque<(u32, TimeNs)>,
    /// Vertical heroes held, per SSD.
    pub vhs: Vec<VecDeque<(u32, TimeNs)>>,
    /// An Ask is outstanding.
    pub asked: bool,
    pub to_manager: Sender<ToManager>,
    pub inbox: Receiver<ToThread>,
    /// Messages this thread sent and received (the host CPU model charges them).
    pub messages: u64,
    /// Members of the array and parity chunks per stripe (to tell which VHs an HH needs).
    pub members: usize,
    pub m: usize,
}

impl ThreadHeroes {
    /// Receives what the manager sent.
    pub fn pump(&mut self) {
        while let Ok(msg) = self.inbox.try_recv() {
            self.take(msg);
        }
    }

    /// Handles one message from the manager.
    pub fn take(&mut self, msg: ToThread) {
        self.messages += 1;
        match msg {
            ToThread::Grant { hhs, vhs, at_ns } => {
                self.asked = false;
                self.hhs.extend(hhs.into_iter().map(|h| (h, at_ns)));
                for (ssd, vh) in vhs {
                    self.vhs[ssd].push_back((vh, at_ns));
                }
            }
            ToThread::Recall { per_mille } => {
                let n = self.hhs.len();
                let give = (n * per_mille as usize).div_ceil(1000);
                let hhs: Vec<u32> = self.hhs.drain(n - give..).map(|(h, _)| h).collect();
                let vhs = self.surplus_vhs();
                self.send(ToManager::Return {
                    thread: self.id,
                    hhs,
                    vhs,
                });
            }
        }
    }

    /// Takes out the VHs the thread's remaining HHs do not need (each HH needs one VH on
    /// each of its parity members).
    fn surplus_vhs(&mut self) -> Vec<(usize, u32)> {
        let mut need = vec![0usize; self.vhs.len()];
        for &(hh, _) in &self.hhs {
            for r in 0..self.m {
                need[parity_member(hh, r, self.members)] += 1;
            }
        }
        let mut out = Vec::new();
        for (ssd, list) in self.vhs.iter_mut().enumerate() {
            let keep = need[ssd].min(list.len());
            out.extend(list.drain(keep..).map(|(v, _)| (ssd, v)));
        }
        out
    }

    pub fn send(&mut self, msg: ToManager) {
        self.messages += 1;
        // The manager outlives its threads; a closed channel means the engine is being
        // torn down, when nothing is left to tell it.
        let _ = self.to_manager.send(msg);
    }

    pub fn ask(&mut self, at_ns: TimeNs) {
        if !self.asked {
            self.asked = true;
            self.send(ToManager::Ask {
                thread: self.id,
                at_ns,
            });
        }
    }

    /// Gives every unused hero back (the thread ends).
    pub fn return_all(&mut self) {
        let hhs: Vec<u32> = self.hhs.drain(..).map(|(h, _)| h).collect();
        let mut vhs = Vec::new();
        for (ssd, list) in self.vhs.iter_mut().enumerate() {
            vhs.extend(list.drain(..).map(|(v, _)| (ssd, v)));
        }
        self.send(ToManager::Return {
            thread: self.id,
            hhs,
            vhs,
        });
    }

    pub fn held_hhs(&self) -> usize {
        self.hhs.len()
    }

    /// Pops an HH whose parity members all have a VH in hand, and those VHs (VH r on the
    /// HH's parity member r): a hero group. Returns it with when its heroes are usable.
    pub fn assemble(&mut self) -> Option<(u32, Vec<u32>, TimeNs)> {
        let (n, m) = (self.members, self.m);
        let vhs = &self.vhs;
        let pos = self
            .hhs
            .iter()
            .position(|&(hh, _)| (0..m).all(|r| !vhs[parity_member(hh, r, n)].is_empty()))?;
        let (hh, mut ready) = self.hhs.remove(pos)?;
        let mut group = Vec::with_capacity(m);
        for r in 0..m {
            let (vh, t) = self.vhs[parity_member(hh, r, n)].pop_front()?;
            ready = ready.max(t);
            group.push(vh);
        }
        Some((hh, group, ready))
    }

    /// An end that stands in for a thread running elsewhere: it holds nothing, and what the
    /// manager sends the thread goes to the real end.
    pub fn stand_in(&self) -> Self {
        Self {
            id: self.id,
            hhs: VecDeque::new(),
            vhs: vec![VecDeque::new(); self.vhs.len()],
            asked: false,
            to_manager: self.to_manager.clone(),
            inbox: channel().1,
            messages: 0,
            members: self.members,
            m: self.m,
        }
    }
}

/// Parity member `r` of stripe `stripe` over `n` members: the parity rotates one member per
/// stripe (left-symmetric), and the m parity chunks sit on consecutive members.
pub(crate) fn parity_member(stripe: u32, r: usize, n: usize) -> usize {
    ((n - 1 - stripe as usize % n) % n + r) % n
}

/// The manager's side: free lists and the channel ends to every thread.
#[derive(Debug)]
pub(crate) struct SpaceManager {
    pub free_hhs: VecDeque<u32>,
    /// Free VHs per SSD.
    pub free_vhs: Vec<VecDeque<u32>>,
    pub inbox: Receiver<ToManager>,
    pub to_threads: Vec<Sender<ToThread>>,
    /// Full hero groups per thread, in the order they filled.
    pub full: Vec<VecDeque<u32>>,
    /// Asks that could not be served yet, in arrival order.
    pub waiting: VecDeque<(usize, TimeNs)>,
    /// Messages the manager (the daemon thread) sent and received.
    pub messages: u64,
    pub recalls: u64,
    /// Asks per thread since the last recall: a thread that asked often keeps more heroes.
    pub recent_asks: Vec<u32>,
}

/// Builds the manager and `threads` thread ends connected to it.
pub(crate) fn connect(
    threads: usize,
    ssds: usize,
    m: usize,
    free_hhs: VecDeque<u32>,
    free_vhs: Vec<VecDeque<u32>>,
) -> (SpaceManager, Vec<ThreadHeroes>) {
    let (to_manager, inbox) = channel();
    let mut to_threads = Vec::with_capacity(threads);
    let mut ends = Vec::with_capacity(threads);
    for id in 0..threads {
        let (tx, rx) = channel();
        to_threads.push(tx);
        ends.push(ThreadHeroes {
            id,
            hhs: VecDeque::new(),
            vhs: vec![VecDeque::new(); ssds],
            asked: false,
            to_manager: to_manager.clone(),
            inbox: rx,
            messages: 0,
            members: ssds,
            m,
        });
    }
    (
        SpaceManager {
            free_hhs,
            free_vhs,
            inbox,
            to_threads,
            full: vec![VecDeque::new(); threads],
            waiting: VecDeque::new(),
            messages: 0,
            recalls: 0,
            recent_asks: vec![0; threads],
        },
        ends,
    )
}

impl SpaceManager {
    pub fn send(&mut self, thread: usize, msg: ToThread) {
        self.messages += 1;
        let _ = self.to_threads[thread].send(msg);
    }

    /// Recall share for a thread that asked `recent_asks` times lately: half of its unused
    /// heroes, less for threads that ask often (they would only ask again).
    pub fn recall_per_mille(recent_asks: u32) -> u32 {
        500 / (1 + recent_asks)
    }
}
