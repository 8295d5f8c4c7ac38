//! fio's flow control between jobs (`flow`, `flow_id`, `flow_sleep`; fio's `flow.c`): the
//! running streams that share a flow id keep their requests in proportion to their
//! weights. Each flow counts the requests its streams have issued (from 1, as fio's does),
//! and before each request a stream compares its own count's share of it with its weight's
//! share of the flow's weight; while it is ahead it waits.

/// One flow id's shared counters and the streams waiting for them to move.
#[derive(Debug, Clone)]
struct Group {
    /// Requests issued by the flow's running streams, plus one.
    counter: u64,
    /// The weights of the flow's running streams.
    total_weight: u64,
    /// Streams that were ahead and wait for another stream of the flow to issue or leave.
    waiters: Vec<u32>,
}

/// Every flow of a run, by flow id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flows {
    groups: std::collections::BTreeMap<u64, Group>,
}

impl Flows {
    /// A stream of weight `weight` starts in flow `id` (fio's `flow_init_job`).
    pub(crate) fn join(&mut self, id: u64, weight: u64) {
        let group = self.groups.entry(id).or_insert(Group {
            counter: 1,
            total_weight: 0,
            waiters: Vec::new(),
        });
        group.total_weight += weight;
    }

    /// A stream of weight `weight` that issued `issued` requests in flow `id` has finished
    /// (fio's `flow_exit_job`): its share leaves the flow, and the streams waiting in it may
    /// go on. Returns them.
    pub(crate) fn leave(&mut self, id: u64, weight: u64, issued: u64) -> Vec<u32> {
        let Some(group) = self.groups.get_mut(&id) else {
            return Vec::new();
        };
        group.counter = group.counter.saturating_sub(issued).max(1);
        group.total_weight = group.total_weight.saturating_sub(weight);
        std::mem::take(&mut group.waiters)
    }

    /// fio's `flow_threshold_exceeded` for a stream of weight `weight` that has issued
    /// `*issued` requests in flow `id`: `Err(())` while it is ahead of its share (it waits);
    /// otherwise the request is counted and the streams that waited for the flow to move
    /// are returned, to try again.
    pub(crate) fn pass(&mut self, id: u64, weight: u64, issued: &mut u64) -> Result<Vec<u32>, ()> {
        let Some(group) = self.groups.get_mut(&id) else {
            // A stream that never joined is not held back.
            return Ok(Vec::new());
        };
        let own_share = *issued as f64 / group.counter as f64;
        let weight_share = weight as f64 / group.total_weight.max(1) as f64;
        if own_share > weight_share {
            return Err(());
        }
        group.counter += 1;
        *issued += 1;
        Ok(std::mem::take(&mut group.waiters))
    }

    /// `stream` waits in flow `id` until another stream of it issues or leaves.
    pub(crate) fn wait(&mut self, id: u64, stream: u32) {
        if let Some(group) = self.groups.get_mut(&id) {
            if !group.waiters.contains(&stream) {
                group.waiters.push(stream);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights 3 and 1 with both streams always ready: the requests go three to one, and a
    /// stream that waits is handed back once the other has issued.
    #[test]
    fn streams_issue_in_proportion_to_their_weights() {
        let mut flows = Flows::default();
        flows.join(7, 3);
        flows.join(7, 1);
        let (mut a, mut b) = (0, 0);
        for _ in 0..400 {
            // Each stream tries in turn; one that is ahead waits.
            if flows.pass(7, 3, &mut a).is_err() {
                flows.wait(7, 0);
            }
            match flows.pass(7, 1, &mut b) {
                // Only the other stream can have been waiting.
                Ok(woken) => assert!(woken.iter().all(|&w| w == 0)),
                Err(()) => flows.wait(7, 1),
            }
        }
        let ratio = a as f64 / b as f64;
        assert!((ratio - 3.0).abs() < 0.1, "{a} against {b}");
        // Once the heavier stream leaves, the other is never held back.
        flows.leave(7, 3, a);
        for _ in 0..10 {
            assert!(flows.pass(7, 1, &mut b).is_ok());
        }
    }

    /// A stream alone in its flow is never ahead of its share: its count is always below
    /// the flow's, which starts at one.
    #[test]
    fn a_stream_alone_always_passes() {
        let mut flows = Flows::default();
        flows.join(0, 5);
        let mut issued = 0;
        for _ in 0..100 {
            assert!(flows.pass(0, 5, &mut issued).is_ok());
        }
        assert_eq!(issued, 100);
    }
}
