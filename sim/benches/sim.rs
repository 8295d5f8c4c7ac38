//! Micro-benchmarks of the simulator's core: the event queue and a resource's busy calendar,
//! the two structures every simulated command goes through. Run with `cargo bench -p afa-sim`.

use std::hint::black_box;

use afa_sim::{Calendar, EventQueue, SimRng};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Events pending in the queue while it is measured: about what a run with a few hundred
/// outstanding requests over a few dozen dies keeps.
const PENDING_EVENTS: usize = 1024;

fn event_queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("event_queue");
    group.throughput(Throughput::Elements(1));
    group.bench_function("pop_then_push_1024_pending", |b| {
        let mut rng = SimRng::new(1);
        let mut queue = EventQueue::with_capacity(PENDING_EVENTS);
        for i in 0..PENDING_EVENTS as u64 {
            queue.push(rng.below(1_000_000), i);
        }
        // Each step is what a simulation does per event: take the earliest, and schedule its
        // successor a random latency (up to 1 ms) after it.
        b.iter(|| {
            let (time_ns, event) = queue.pop().expect("the queue is never empty");
            queue.push(time_ns + 1 + rng.below(1_000_000), black_box(event));
        });
    });
    group.finish();
}

fn calendar(c: &mut Criterion) {
    let mut group = c.benchmark_group("calendar");
    group.throughput(Throughput::Elements(1));
    // A die kept busy by 50 µs reads arriving at random within a moving window, so that
    // bookings fill idle gaps as well as extend the end: the gap-filling path of every
    // flash operation.
    group.bench_function("book_into_gaps", |b| {
        let mut rng = SimRng::new(2);
        let mut die = Calendar::default();
        let mut now_ns = 0u64;
        b.iter(|| {
            now_ns += 40_000;
            let ready_ns = now_ns + rng.below(400_000);
            black_box(die.book(ready_ns, 50_000));
        });
    });
    group.finish();
}

criterion_group!(benches, event_queue, calendar);
criterion_main!(benches);
