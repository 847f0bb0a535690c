//! What drawing one frame costs: a big fleet (64 workers, 256 keys) at 160×48, and fleets of 16,
//! 1,000 and 10,000 workers at 200×50 and 120×40, where a frame must cost about the same whatever
//! the fleet's size (only the visible rows are built). The console redraws at most every 40 ms, so
//! a frame must stay well below that. Criterion reports the time; compare runs of the same machine
//! (`cargo bench -p bch-tui`), never a fixed bound.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tokio::time::Instant;

#[path = "../tests/common_fleet/big_fleet.rs"]
mod big_fleet;
#[path = "../tests/common_fleet/scale_fleet.rs"]
mod scale_fleet;

fn draw_big_fleet(c: &mut Criterion) {
    let state = big_fleet::big();
    let mut terminal = Terminal::new(TestBackend::new(160, 48)).expect("test backend");
    let now = Instant::now();
    c.bench_function("draw/64_workers_160x48", |b| {
        b.iter(|| {
            terminal
                .draw(|frame| bch_tui::draw(frame, &state, now))
                .expect("test backend draws");
        })
    });
}

/// One frame per fleet size and terminal size: the workers panel focused (the default), in
/// configuration order.
fn draw_scale(c: &mut Criterion) {
    let mut group = c.benchmark_group("draw_scale");
    let now = Instant::now();
    for workers in [16usize, 1_000, 10_000] {
        let state = scale_fleet::fleet(workers);
        for (width, height) in [(200u16, 50u16), (120, 40)] {
            let mut terminal =
                Terminal::new(TestBackend::new(width, height)).expect("test backend");
            let id = BenchmarkId::new(format!("{width}x{height}"), workers);
            group.bench_with_input(id, &state, |b, state| {
                b.iter(|| {
                    terminal
                        .draw(|frame| bch_tui::draw(frame, state, now))
                        .expect("test backend draws");
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, draw_big_fleet, draw_scale);
criterion_main!(benches);
