//! Membership-change benchmarks at fleet scale (150 virtual nodes per worker).
//!
//! * `membership/ring_build_10000`: `Ring::build` of 10,000 workers: what every membership change
//!   cost before the ring was derived from the previous one, and what start-up still pays once.
//! * `membership/ring_add_one_at_10000` / `ring_remove_one_at_10000`: `Ring::rebuilt` for one
//!   worker joining (at the end) or leaving (from the middle) a 10,000-worker ring.
//! * `membership/router_add_remove_at_10000`: `Router::add_worker` then `Router::remove_worker` of
//!   one worker on a 10,000-worker router: the whole table, counters and health carried over.
//!
//! Run: `cargo bench -p bch-core --bench membership -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use bch_core::policy::PolicySettings;
use bch_core::ring::Ring;
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use criterion::{Criterion, criterion_group, criterion_main};

const FLEET: usize = 10_000;
const VIRTUAL_NODES: u32 = 150;

fn url(i: usize) -> String {
    format!(
        "http://10.{}.{}.{}:8000",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

fn spec(i: usize) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        url: url(i),
        ring_id: None,
        source: WorkerSource::Static,
        max_in_flight: None,
        models: Vec::new(),
    }
}

fn membership(c: &mut Criterion) {
    let ids: Vec<String> = (0..FLEET).map(url).collect();
    let mut group = c.benchmark_group("membership");
    group.sample_size(10);
    group.bench_function("ring_build_10000", |b| {
        b.iter(|| Ring::build(black_box(&ids), VIRTUAL_NODES))
    });
    let ring = Ring::build(&ids, VIRTUAL_NODES);
    let mut grown = ids.clone();
    grown.push(url(FLEET));
    group.bench_function("ring_add_one_at_10000", |b| {
        b.iter(|| ring.rebuilt(&ids, black_box(&grown)))
    });
    let mut shrunk = ids.clone();
    shrunk.remove(FLEET / 2);
    group.bench_function("ring_remove_one_at_10000", |b| {
        b.iter(|| ring.rebuilt(&ids, black_box(&shrunk)))
    });
    let router = Router::new((0..FLEET).map(spec).collect(), PolicySettings::default()).unwrap();
    group.bench_function("router_add_remove_at_10000", |b| {
        b.iter(|| {
            router.add_worker(spec(FLEET)).unwrap();
            router.remove_worker("w10000").unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, membership);
criterion_main!(benches);
