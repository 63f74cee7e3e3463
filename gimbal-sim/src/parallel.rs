//! Independent simulation runs on several threads, for both reports.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Runs `run` on every spec, on up to `jobs` threads; results come back in
/// the order of `specs`. Each run is a pure function of its spec, so the
/// outcome does not depend on `jobs`.
pub fn run_in_parallel<S: Sync, R: Send>(
    specs: Vec<S>,
    jobs: usize,
    run: impl Fn(&S) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = specs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1).min(specs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(spec) = specs.get(i) else {
                    break;
                };
                let result = run(spec);
                *results[i].lock().expect("no panics while holding the lock") = Some(result);
            });
        }
    });
    results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .expect("no panics while holding the lock")
                .expect("every run finished")
        })
        .collect()
}
