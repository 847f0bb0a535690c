//! The health prober at fleet scale, against real HTTP workers that record every probe: no more
//! than `[health] max_concurrent_probes` probes are ever in flight at once, a round's probes are
//! spread over `interval_ms` instead of sent in one burst, and every worker is still probed once
//! per interval.

use crate::common;
use crate::counting_fleet::{config, gaps, start_fleet, wait_rounds};

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

#[tokio::test]
async fn probes_are_capped_and_spread_over_the_interval_and_each_worker_is_probed_every_interval() {
    const WORKERS: usize = 200;
    let interval = Duration::from_millis(1_000);
    let (addrs, fleet) = start_fleet(WORKERS, "/health", "ok", Duration::from_millis(20)).await;
    let mut config = config(&addrs);
    config.health.interval = interval;
    config.health.timeout = Duration::from_millis(900);
    config.health.max_concurrent_probes = 8;
    let gateway = common::start(config).await;
    // The first probes of the 200 workers present at start go at once (so waiting for the first
    // probe stays quick), but never more than 8 at a time.
    gateway.first_probes_applied().await;
    // The periodic probes that came due while the first ones (200 of 20 ms, 8 at a time: some
    // 500 ms) held every slot waited, and came late; from here on they come on time.
    let settled = Instant::now();
    let probes = wait_rounds(&fleet, WORKERS, 3, Some(settled)).await;
    let most = fleet.most_in_flight.load(Ordering::SeqCst);
    assert!(most <= 8, "{most} probes in flight at once, the cap is 8");
    assert_eq!(most, 8, "the first probes reached the cap");

    // Spread: the probes of a round come at offsets of the interval stable per worker, about 20
    // per 100 ms, not all 200 within a few milliseconds. Half the fleet in one 100 ms window is
    // asserted against, as timers on a loaded machine fire late and in clumps.
    let periodic: Vec<Instant> = probes.iter().map(|(_, at)| *at).collect();
    for (at, start) in periodic.iter().enumerate() {
        let within = periodic[at..]
            .iter()
            .take_while(|t| **t - *start < Duration::from_millis(100))
            .count();
        assert!(
            within <= WORKERS / 2,
            "{within} periodic probes within 100 ms of probe {at}: a burst, not a spread"
        );
    }
    // Each worker still probed once per interval: its probes are about one interval apart (half
    // an interval either side for a loaded machine).
    for worker in 0..WORKERS {
        for gap in gaps(&probes, worker) {
            assert!(
                gap >= interval / 2 && gap <= interval * 3 / 2,
                "w{worker}: {gap:?} between two probes, the interval is {interval:?}"
            );
        }
    }
    gateway.shutdown().await;
}
