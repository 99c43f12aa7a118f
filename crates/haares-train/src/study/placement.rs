//! The sweep's scheduler: one queue of runs and a set of slots, each slot bound to a device (or
//! to every device, for data-parallel runs) and training the next run as soon as it is free.
//!
//! A sweep uses devices in one of two ways ([`Placement`]): each run data-parallel over all the
//! devices, `--jobs` runs at a time (Burn's CPU backends run a small model on about one core, so
//! two jobs fill a 2-core machine); or each run on one device, `--runs-per-device` runs at a time
//! on each, with no communication between runs: the paper trains every run on one GPU, so a
//! sweep on a machine with eight GPUs keeps eight runs going.

use std::sync::Mutex;

/// How a sweep places its runs on devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every run trains data-parallel on all the devices; `jobs` runs at a time (1 when there
    /// are several devices: a run then already uses them all). After a failure no new run starts.
    Replicated {
        /// Runs at a time.
        jobs: usize,
    },
    /// Every run trains on one device; at most `runs_per_device` runs at a time on each. A run
    /// that fails is reported and its device takes the next run.
    PerDevice {
        /// Runs at a time on each device.
        runs_per_device: usize,
    },
}

impl Placement {
    /// The device group each slot trains on: with `devices` devices, one group of all of them
    /// (index 0) for every replicated slot, or device `d` for `runs_per_device` slots each.
    pub fn slots(self, devices: usize) -> Vec<usize> {
        match self {
            Placement::Replicated { jobs } => {
                let jobs = if devices > 1 { 1 } else { jobs.max(1) };
                vec![0; jobs]
            }
            Placement::PerDevice { runs_per_device } => (0..devices)
                .flat_map(|device| std::iter::repeat_n(device, runs_per_device))
                .collect(),
        }
    }

    /// Whether a failure stops the queue (replicated) or only its run (per device).
    fn stops_on_failure(self) -> bool {
        matches!(self, Placement::Replicated { .. })
    }
}

/// A run's place in the queue, the slot's device group it trained on, and how it ended.
pub type Placed<R, T, E> = (usize, R, usize, Result<T, E>);

/// Trains `runs` (each with its place in the sweep) on `placement`'s slots over `devices` device
/// groups: `train(place, run, group)` for every run exactly once, unless a failure stops a
/// replicated queue (the runs not started are then left out). Returns the outcomes in queue
/// order.
pub fn train_queue<R: Send, T: Send, E: Send>(
    runs: Vec<(usize, R)>,
    placement: Placement,
    devices: usize,
    train: impl Fn(usize, &R, usize) -> Result<T, E> + Sync,
) -> Vec<Placed<R, T, E>> {
    let queue = Mutex::new(runs.into_iter());
    let results = Mutex::new(Vec::new());
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
    std::thread::scope(|scope| {
        for group in placement.slots(devices) {
            let (next, train, results) = (&next, &train, &results);
            scope.spawn(move || {
                while let Some((place, run)) = next() {
                    let outcome = train(place, &run, group);
                    let failed = outcome.is_err();
                    let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
                    results.push((place, run, group, outcome));
                    drop(results);
                    if failed && placement.stops_on_failure() {
                        // Stop handing out runs; the other slots finish their current run.
                        while next().is_some() {}
                    }
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(place, ..)| *place);
    results
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::{Placement, train_queue};

    /// Stand-in devices that count the runs they hold at once.
    struct Devices {
        active: Vec<AtomicUsize>,
        most: Vec<AtomicUsize>,
        trained: Vec<AtomicUsize>,
    }

    impl Devices {
        fn new(count: usize) -> Self {
            let counters = || (0..count).map(|_| AtomicUsize::new(0)).collect();
            Self {
                active: counters(),
                most: counters(),
                trained: counters(),
            }
        }

        /// Holds `device` for a few milliseconds, as a run would.
        fn hold(&self, device: usize) {
            let now = self.active[device].fetch_add(1, Ordering::SeqCst) + 1;
            self.most[device].fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(3));
            self.trained[device].fetch_add(1, Ordering::SeqCst);
            self.active[device].fetch_sub(1, Ordering::SeqCst);
        }

        fn counts(counters: &[AtomicUsize]) -> Vec<usize> {
            counters.iter().map(|c| c.load(Ordering::SeqCst)).collect()
        }
    }

    fn runs(count: usize) -> Vec<(usize, String)> {
        (0..count).map(|i| (i, format!("run-{i}"))).collect()
    }

    #[test]
    fn every_run_runs_once_and_no_device_holds_more_than_asked() {
        for runs_per_device in [1, 2, 3] {
            let devices = Devices::new(4);
            let placed = train_queue(
                runs(25),
                Placement::PerDevice { runs_per_device },
                4,
                |_, _, device| {
                    devices.hold(device);
                    Ok::<_, ()>(())
                },
            );
            let places: Vec<usize> = placed.iter().map(|(place, ..)| *place).collect();
            assert_eq!(
                places,
                (0..25).collect::<Vec<_>>(),
                "each run once, in order"
            );
            let most = Devices::counts(&devices.most);
            assert!(most.iter().all(|&m| m <= runs_per_device), "{most:?}");
            let trained = Devices::counts(&devices.trained);
            assert_eq!(trained.iter().sum::<usize>(), 25);
            assert!(
                trained.iter().all(|&n| n > 0),
                "every device worked: {trained:?}"
            );
        }
    }

    #[test]
    fn a_failing_run_frees_its_device_for_the_next_run() {
        let devices = Devices::new(2);
        let placed = train_queue(
            runs(12),
            Placement::PerDevice { runs_per_device: 1 },
            2,
            |place, _, device| {
                devices.hold(device);
                if place % 3 == 0 { Err(place) } else { Ok(()) }
            },
        );
        assert_eq!(placed.len(), 12, "the queue goes on after failures");
        let failed: Vec<usize> = placed
            .iter()
            .filter_map(|(_, _, _, outcome)| outcome.err())
            .collect();
        assert_eq!(failed, [0, 3, 6, 9]);
        assert_eq!(Devices::counts(&devices.trained).iter().sum::<usize>(), 12);
    }

    #[test]
    fn a_replicated_queue_stops_handing_out_runs_after_a_failure() {
        let placed = train_queue(
            runs(10),
            Placement::Replicated { jobs: 1 },
            1,
            |place, _, _| if place == 2 { Err(()) } else { Ok(()) },
        );
        let places: Vec<usize> = placed.iter().map(|(place, ..)| *place).collect();
        assert_eq!(places, [0, 1, 2]);
    }

    #[test]
    fn replicated_slots_share_every_device_and_per_device_slots_are_bound_to_one() {
        assert_eq!(Placement::Replicated { jobs: 3 }.slots(1), [0, 0, 0]);
        assert_eq!(
            Placement::Replicated { jobs: 3 }.slots(4),
            [0],
            "a data-parallel run uses every device"
        );
        assert_eq!(
            Placement::PerDevice { runs_per_device: 2 }.slots(3),
            [0, 0, 1, 1, 2, 2]
        );
    }
}
