//! The schedule driven as the prober drives it, on simulated time: a millisecond a step, probes
//! that take a fixed time, at most `cap` running.

use super::*;

fn key(index: usize) -> WorkerKey {
    WorkerKey::of(&bch_core::router::WorkerSpec {
        name: format!("w{index}"),
        url: format!(
            "http://10.{}.{}.{}:8000",
            index / 65536,
            (index / 256) % 256,
            index % 256
        ),
        ring_id: None,
        source: bch_core::telemetry::WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    })
}

/// A fleet probed by the schedule for `steps` milliseconds.
struct Simulation {
    schedule: Schedule,
    start: Instant,
    /// The simulated clock.
    now: Instant,
    /// Probes running: `(key, ends at)`.
    running: Vec<(WorkerKey, Instant)>,
    cap: usize,
    took: Duration,
    /// Every start: `(worker, at)`.
    starts: Vec<(WorkerKey, Instant)>,
    most_running: usize,
}

impl Simulation {
    fn new(workers: usize, interval: Duration, cap: usize, took: Duration) -> Self {
        let start = Instant::now();
        let mut schedule = Schedule::new(interval, start);
        let keys: Vec<WorkerKey> = (0..workers).map(key).collect();
        schedule.set_members(&keys, start);
        Self {
            schedule,
            start,
            now: start,
            running: Vec::new(),
            cap,
            took,
            starts: Vec::new(),
            most_running: 0,
        }
    }

    /// One loop of the prober at `now`: finished probes noted, due ones queued, queued ones
    /// started while a slot is free.
    fn step(&mut self, now: Instant) {
        let (done, still): (Vec<_>, Vec<_>) =
            self.running.drain(..).partition(|(_, end)| *end <= now);
        self.running = still;
        for (key, _) in done {
            self.schedule.finished(&key);
        }
        self.schedule.advance(now);
        while self.running.len() < self.cap {
            let Some(key) = self.schedule.next_start() else {
                break;
            };
            self.starts.push((key.clone(), now));
            self.running.push((key, now + self.took));
        }
        self.most_running = self.most_running.max(self.running.len());
    }

    fn run_for(&mut self, millis: u64) {
        for _ in 0..millis {
            self.step(self.now);
            self.now += Duration::from_millis(1);
        }
    }

    /// Each worker's start times, in order.
    fn starts_of(&self) -> HashMap<WorkerKey, Vec<Instant>> {
        let mut by_worker: HashMap<WorkerKey, Vec<Instant>> = HashMap::new();
        for (key, at) in &self.starts {
            by_worker.entry(key.clone()).or_default().push(*at);
        }
        by_worker
    }
}

#[test]
fn ten_thousand_workers_are_probed_once_per_interval_spread_and_never_past_the_cap() {
    let interval = Duration::from_millis(2_000);
    let mut sim = Simulation::new(10_000, interval, 256, Duration::from_millis(5));
    sim.run_for(7_500);
    assert!(sim.most_running <= 256, "{} running", sim.most_running);
    assert_eq!(
        sim.most_running, 256,
        "the first probes go as fast as the cap allows"
    );
    assert_eq!(sim.schedule.firsts_pending(), 0);
    let by_worker = sim.starts_of();
    assert_eq!(by_worker.len(), 10_000, "every worker probed");
    // The first probes: all 10,000 started within 10,000 / 256 probes of 5 ms each (196 ms).
    let last_first = by_worker.values().map(|s| s[0]).max().unwrap();
    assert!(
        last_first - sim.start <= Duration::from_millis(200),
        "{:?}",
        last_first - sim.start
    );
    // After them, exactly one interval between two probes of a worker: its periodic probes start
    // 1 to 3 s after its first, so three each in the 7.25 s left.
    let settled = sim.start + Duration::from_millis(250);
    let mut periodic = Vec::new();
    for (key, starts) in &by_worker {
        let starts: Vec<Instant> = starts.iter().copied().filter(|t| *t >= settled).collect();
        assert!(starts.len() >= 3, "{key}: {} probes", starts.len());
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], interval, "{key}");
        }
        periodic.extend(starts);
    }
    // Spread: about 5 starts a millisecond (10,000 per 2 s), at most 100 in any 10 ms (a burst
    // would be 10,000).
    periodic.sort();
    for (at, start) in periodic.iter().enumerate() {
        let within = periodic[at..]
            .iter()
            .take_while(|t| **t - *start < Duration::from_millis(10))
            .count();
        assert!(within <= 100, "{within} starts within 10 ms");
    }
}

#[test]
fn a_fleet_the_cap_cannot_probe_every_interval_is_probed_in_turn_each_waiting_once() {
    // 100 workers, probes of 100 ms, 2 at a time: 20 probes a second where 100 are due.
    let interval = Duration::from_millis(1_000);
    let mut sim = Simulation::new(100, interval, 2, Duration::from_millis(100));
    sim.run_for(20_000);
    assert_eq!(sim.most_running, 2);
    let waiting = sim.schedule.urgent.len() + sim.schedule.periodic.len();
    assert!(
        waiting <= 100,
        "{waiting} queued: each worker waits at most once"
    );
    // In turn: every worker probed about every 5 s (100 workers at 20 a second), none starved.
    let by_worker = sim.starts_of();
    assert_eq!(by_worker.len(), 100);
    for (key, starts) in &by_worker {
        assert!(starts.len() >= 3, "{key}: {} probes in 20 s", starts.len());
        for pair in starts.windows(2) {
            assert!(
                pair[1] - pair[0] <= Duration::from_millis(6_500),
                "{key}: {:?}",
                pair[1] - pair[0]
            );
        }
    }
}

#[test]
fn first_and_asked_probes_go_before_periodic_ones_and_an_ask_joins_a_running_probe() {
    let interval = Duration::from_millis(1_000);
    let t0 = Instant::now();
    let mut schedule = Schedule::new(interval, t0);
    let (a, b, c) = (key(1), key(2), key(3));
    schedule.set_members(&[a.clone(), b.clone()], t0);
    assert_eq!(schedule.firsts_pending(), 2);
    let first = [
        schedule.next_start().unwrap(),
        schedule.next_start().unwrap(),
    ];
    assert_eq!(first, [a.clone(), b.clone()]);
    assert_eq!(schedule.next_start(), None);
    // Asked while running: the running probe answers the ask, no second one is queued.
    assert!(schedule.ask(&a));
    assert_eq!(schedule.next_start(), None);
    let finished = schedule.finished(&a).unwrap();
    assert_eq!(
        finished,
        Finished {
            first: true,
            asked: true
        }
    );
    assert_eq!(
        schedule.finished(&b).unwrap(),
        Finished {
            first: true,
            asked: false
        }
    );
    assert_eq!(schedule.firsts_pending(), 0);
    // An interval and a half later both have come due (their periodic probes start half an
    // interval to an interval and a half after they joined); then `c` joins and `b` is asked
    // about: both go first.
    let later = t0 + interval * 3 / 2;
    schedule.advance(later);
    schedule.set_members(&[a.clone(), b.clone(), c.clone()], later);
    assert!(schedule.ask(&b));
    assert!(!schedule.ask(&key(9)), "not scheduled");
    let order: Vec<WorkerKey> = std::iter::from_fn(|| schedule.next_start()).collect();
    assert_eq!(order, [c.clone(), b.clone(), a.clone()]);
    assert_eq!(
        schedule.finished(&b).unwrap(),
        Finished {
            first: false,
            asked: true
        }
    );
    // A worker removed while its probe runs: the result belongs to no one.
    schedule.set_members(std::slice::from_ref(&b), later);
    assert_eq!(schedule.finished(&a), None);
    assert_eq!(schedule.finished(&c), None);
    assert_eq!(
        schedule.firsts_pending(),
        0,
        "c's first probe no longer pending"
    );
}

#[test]
fn a_worker_keeps_its_phase_and_a_new_interval_moves_it() {
    let t0 = Instant::now();
    let mut schedule = Schedule::new(Duration::from_millis(1_000), t0);
    let a = key(7);
    schedule.set_members(std::slice::from_ref(&a), t0);
    // Its first periodic probe half an interval to an interval and a half after it joined.
    let due = schedule.next_due().unwrap();
    assert!(due > t0 + Duration::from_millis(500) && due <= t0 + Duration::from_millis(1_500));
    schedule.advance(due);
    assert_eq!(
        schedule.next_due(),
        Some(due + Duration::from_millis(1_000))
    );
    // Removed and added again, it comes back at the same phase.
    schedule.set_members(&[], due);
    assert_eq!(schedule.next_due(), None);
    schedule.set_members(std::slice::from_ref(&a), due);
    assert_eq!(
        schedule.next_due(),
        Some(due + Duration::from_millis(1_000))
    );
    // A prober more than an interval behind skips the times it missed.
    let late = due + Duration::from_millis(3_500);
    schedule.advance(late);
    let next = schedule.next_due().unwrap();
    assert!(next > late && next <= late + Duration::from_millis(1_000));
    schedule.set_interval(Duration::from_millis(300), late);
    let next = schedule.next_due().unwrap();
    assert!(next > late && next <= late + Duration::from_millis(300));
}
