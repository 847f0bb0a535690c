//! What one worker's health or drain flip costs the router as the fleet grows (150 virtual nodes
//! per worker, every worker idle).
//!
//! * `health_flip/{16,1000,10000}_workers`: `Router::set_health` of one worker to unhealthy and
//!   back, one pair per iteration: two tables published (selection install, fleet aggregates, the
//!   table swap). A rack whose workers all fail their probes at once is this many flips.
//! * `health_flip/10000_workers_two_models`: the same on a fleet whose even workers serve one
//!   model and odd workers another (two pools, each with its own routable list and aggregates).
//! * `health_flip/drain_10000_workers`: `Router::set_state` to draining and back: the operator's
//!   drain, the same path with the other flag.
//!
//! Run: `cargo bench -p bch-core --bench health_flip -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use bch_core::policy::PolicySettings;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::telemetry::WorkerState;
use criterion::{Criterion, criterion_group, criterion_main};

/// A router over `n` idle workers `w0`..`w{n-1}`, worker `i` serving `models(i)`.
fn router(n: usize, models: impl Fn(usize) -> Vec<String>) -> Router {
    let specs = (0..n)
        .map(|i| WorkerSpec {
            name: format!("w{i}"),
            url: format!(
                "http://10.{}.{}.{}:8000",
                i / 65536,
                (i / 256) % 256,
                i % 256
            ),
            ring_id: None,
            source: WorkerSource::Static,
            max_in_flight: None,
            models: models(i),
        })
        .collect();
    Router::new(specs, PolicySettings::default()).unwrap()
}

/// One unhealthy-then-healthy pair on the worker called `name`.
fn flip_health(router: &Router, name: &str) {
    assert!(router.set_health(black_box(name), false));
    assert!(router.set_health(black_box(name), true));
}

fn health_flip(c: &mut Criterion) {
    let mut group = c.benchmark_group("health_flip");
    for n in [16, 1_000, 10_000] {
        let router = router(n, |_| Vec::new());
        // A worker in the middle of the list: a name search from the front pays half the fleet.
        let name = format!("w{}", n / 2);
        group.bench_function(format!("{n}_workers"), |b| {
            b.iter(|| flip_health(&router, &name))
        });
    }
    let two_models = router(10_000, |i| vec![["model-a", "model-b"][i % 2].to_owned()]);
    group.bench_function("10000_workers_two_models", |b| {
        b.iter(|| flip_health(&two_models, "w5000"))
    });
    let router = router(10_000, |_| Vec::new());
    group.bench_function("drain_10000_workers", |b| {
        b.iter(|| {
            assert_eq!(router.set_state("w5000", WorkerState::Draining), Some(true));
            assert_eq!(router.set_state("w5000", WorkerState::Active), Some(true));
        })
    });
    group.finish();
}

criterion_group!(benches, health_flip);
criterion_main!(benches);
