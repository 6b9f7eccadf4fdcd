//! Work spread over the CPUs: the symbols and code of large programs,
//! which a recording reads before the program starts, and the threads of
//! the many children whose numbers it makes as it ends.

/// `items` mapped by `f`, in order, in as many parts as there are CPUs,
/// each on a thread of its own; on the calling thread alone when there are
/// fewer than `worth_threads` of them.
pub fn on_all_cpus<T: Send, U: Send>(items: Vec<T>, worth_threads: usize, f: impl Fn(T) -> U + Sync) -> Vec<U> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 || items.len() < worth_threads.max(1) {
        return items.into_iter().map(f).collect();
    }
    let mut parts: Vec<Vec<T>> = Vec::with_capacity(cpus);
    let part_len = items.len().div_ceil(cpus);
    let mut items = items.into_iter();
    for _ in 0..cpus {
        parts.push(items.by_ref().take(part_len).collect());
    }
    let f = &f;
    std::thread::scope(|scope| {
        // A part whose thread could not be made (a limit on threads) is
        // mapped here, in its turn.
        let mapped: Vec<Result<_, Vec<T>>> = parts
            .into_iter()
            .map(|part| {
                let (tx, rx) = std::sync::mpsc::channel();
                let spawned = std::thread::Builder::new().spawn_scoped(scope, move || {
                    let part: Vec<T> = rx.recv().unwrap_or_default();
                    part.into_iter().map(f).collect::<Vec<U>>()
                });
                match spawned {
                    Ok(thread) => {
                        let _ = tx.send(part);
                        Ok(thread)
                    }
                    Err(_) => Err(part),
                }
            })
            .collect();
        mapped
            .into_iter()
            .flat_map(|part| match part {
                Ok(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(part) => part.into_iter().map(f).collect(),
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_spread_over_the_cpus_comes_back_in_order() {
        for len in [0, 3, 99, 1_000 * 2 + 7] {
            let items: Vec<u64> = (0..len as u64).collect();
            let mapped = on_all_cpus(items, 100, |i| (i, i * 3));
            assert_eq!(mapped.len(), len);
            assert!(mapped.iter().enumerate().all(|(n, &(i, t))| i == n as u64 && t == i * 3), "out of order at {len}");
        }
    }
}
