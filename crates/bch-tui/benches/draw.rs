//! What drawing one frame of a big fleet (64 workers, 256 keys) at 160×48 costs: the console
//! redraws at most every 40 ms, so a frame must stay well below that. Criterion reports the time;
//! compare runs of the same machine (`cargo bench -p bch-tui`), never a fixed bound.

use criterion::{Criterion, criterion_group, criterion_main};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use tokio::time::Instant;

#[path = "../tests/common_fleet/big_fleet.rs"]
mod big_fleet;

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

criterion_group!(benches, draw_big_fleet);
criterion_main!(benches);
