//! The body scan a request pays when workers serve several models: [`BodyScanner`] over bodies in
//! openai-python's order (`messages` first, `model` last), fed in 16 KiB chunks as hyper hands
//! them over.
//!
//! * `request_body/chat_1k`: a one-turn chat of about 1 KiB.
//! * `request_body/chat_64k`: a long chat of about 64 KiB (many turns, quotes and braces in it).
//!
//! Throughput is reported in bytes, so the cost per request of any body size follows.
//!
//! Run: `cargo bench -p bch-core --bench request_body -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use bch_core::request_body::{BodyScanner, Progress, WantedFields};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// A chat body of about `bytes` bytes with `model` after `messages`.
fn chat(bytes: usize) -> Vec<u8> {
    let turn = r#"{"role":"user","content":"Summarise {\"a\": [1, 2]} and say \"done\"."},"#;
    let mut body = String::from(r#"{"messages":["#);
    while body.len() + turn.len() < bytes {
        body.push_str(turn);
    }
    body.push_str(r#"{"role":"user","content":"go"}],"stream":true,"model":"llama-3.1-8b"}"#);
    body.into_bytes()
}

fn scan(body: &[u8]) -> bool {
    let mut scanner = BodyScanner::new(WantedFields {
        model: true,
        rid: false,
    });
    for chunk in body.chunks(16 * 1024) {
        if scanner.feed(chunk) == Progress::Answered {
            break;
        }
    }
    scanner.finish().is_ok_and(|fields| fields.model.is_some())
}

fn request_body(c: &mut Criterion) {
    let mut group = c.benchmark_group("request_body");
    for (name, size) in [("chat_1k", 1024), ("chat_64k", 64 * 1024)] {
        let body = chat(size);
        assert!(scan(&body));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| b.iter(|| scan(black_box(&body))));
    }
    group.finish();
}

criterion_group!(benches, request_body);
criterion_main!(benches);
