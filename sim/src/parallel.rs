//! Independent simulations side by side.
//!
//! A simulation is single-threaded and deterministic: its results depend on its seed alone.
//! Experiments made of several such runs (a sweep over request sizes, one run per engine)
//! can therefore run them on every core and still report exactly what one run after the
//! other would.

/// Applies `f` to every item on up to one thread per core and returns the results in item
/// order. Each run must build its own state from its own seed; then the results (and what
/// the caller prints from them afterwards) are the same as a sequential loop's, whatever
/// the threads' timing.
pub fn map_in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return out;
                        };
                        out.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(out) => out,
                // A run that panicked is a bug: carry the panic to the caller.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    done.sort_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::map_in_parallel;

    /// Results come back in item order however long each item takes, and each item is
    /// run exactly once.
    #[test]
    fn map_in_parallel_keeps_item_order_and_runs_each_item_once() {
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let items: Vec<u64> = (0..37).collect();
        let out = map_in_parallel(&items, |&i| {
            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Uneven work, so threads finish their items out of order.
            std::thread::sleep(std::time::Duration::from_micros((37 - i) * 50));
            i * i
        });
        assert_eq!(out, items.iter().map(|i| i * i).collect::<Vec<_>>());
        assert_eq!(runs.into_inner(), items.len());
        assert!(map_in_parallel(&[] as &[u64], |&i| i).is_empty());
    }
}
