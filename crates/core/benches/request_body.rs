//! The body scan a request pays when workers serve several models: [`BodyScanner`] over bodies in
//! openai-python's order (`messages` first, `model` last), fed in 16 KiB chunks as hyper hands
//! them over.
//!
//! * `request_body/chat_1k`: a one-turn chat of about 1 KiB.
//! * `request_body/chat_64k`: a long chat of about 64 KiB (many turns, quotes and braces in it).
//! * `request_body/one_message_1k`: one plain message of about 1 KiB, no escapes (the body
//!   `bench/instructions.sh --openai-order` sends through the gateway).
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

/// One plain user message of about `bytes` bytes, then `model`.
fn one_message(bytes: usize) -> Vec<u8> {
    let words = "the quick brown fox jumps over the lazy dog ";
    let mut content = String::new();
    while content.len() + words.len() + 80 < bytes {
        content.push_str(words);
    }
    format!(
        r#"{{"messages": [{{"role": "user", "content": "{content}"}}], "model": "llama-3.1-8b"}}"#
    )
    .into_bytes()
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
    let bodies = [
        ("chat_1k", chat(1024)),
        ("chat_64k", chat(64 * 1024)),
        ("one_message_1k", one_message(1024)),
    ];
    for (name, body) in bodies {
        assert!(scan(&body));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| b.iter(|| scan(black_box(&body))));
    }
    group.finish();
}

criterion_group!(benches, request_body);
criterion_main!(benches);
