use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const BOTH: WantedFields = WantedFields {
    model: true,
    rid: true,
};
const MODEL: WantedFields = WantedFields {
    model: true,
    rid: false,
};

fn scan_chunks<'a>(
    wanted: WantedFields,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<BodyFields, BodyProblem> {
    let mut scanner = BodyScanner::new(wanted);
    for chunk in chunks {
        if scanner.feed(chunk) == Progress::Answered {
            break;
        }
    }
    scanner.finish()
}

fn scan(wanted: WantedFields, body: &[u8]) -> Result<BodyFields, BodyProblem> {
    scan_chunks(wanted, [body])
}

/// What serde_json reads from the whole body, in the scanner's terms.
fn serde_answer(wanted: WantedFields, body: &[u8]) -> Option<Result<BodyFields, BodyProblem>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let Value::Object(object) = value else {
        return Some(Err(BodyProblem::NotAnObject));
    };
    let model = match object.get("model") {
        Some(Value::String(model)) if wanted.model => Some(model.clone()),
        Some(_) if wanted.model => return Some(Err(BodyProblem::ModelNotAString)),
        _ => None,
    };
    let rid = match object.get("rid") {
        Some(Value::String(rid)) if wanted.rid => Some(rid.clone()),
        _ => None,
    };
    Some(Ok(BodyFields { model, rid }))
}

fn fields(model: Option<&str>, rid: Option<&str>) -> BodyFields {
    BodyFields {
        model: model.map(str::to_owned),
        rid: rid.map(str::to_owned),
    }
}

#[test]
fn reads_model_and_rid_from_an_openai_body() {
    let body = br#"{"messages":[{"role":"user","content":"hi {not} \"model\": x"}],"model":"llama","rid":"conv9_t5_r1","stream":true}"#;
    assert_eq!(
        scan(BOTH, body),
        Ok(fields(Some("llama"), Some("conv9_t5_r1")))
    );
    assert_eq!(scan(MODEL, body), Ok(fields(Some("llama"), None)));
}

#[test]
fn answers_as_soon_as_the_wanted_fields_were_read() {
    let mut scanner = BodyScanner::new(MODEL);
    assert_eq!(scanner.feed(br#"{"model": "a"#), Progress::NeedMore);
    assert_eq!(
        scanner.feed(br#"b", "messages": [ unfinished"#),
        Progress::Answered
    );
    assert_eq!(scanner.finish(), Ok(fields(Some("ab"), None)));
}

#[test]
fn the_end_of_the_object_answers_without_the_missing_fields() {
    assert_eq!(scan(BOTH, br#"{"prompt":"x"}"#), Ok(fields(None, None)));
    assert_eq!(scan(BOTH, br#" { } "#), Ok(fields(None, None)));
    assert_eq!(
        scan(BOTH, br#"{"text":"x","rid":"r"}"#),
        Ok(fields(None, Some("r")))
    );
}

#[test]
fn decodes_escapes_in_keys_and_values() {
    let body = br#"{"mod\u0065l":"a\"b\\c\/d\u00e9\ud83d\ude00\n"}"#;
    assert_eq!(
        scan(MODEL, body),
        Ok(fields(Some("a\"b\\c/d\u{e9}\u{1F600}\n"), None))
    );
}

#[test]
fn refuses_what_is_not_a_json_object_early() {
    assert_eq!(scan(MODEL, b""), Err(BodyProblem::Empty));
    assert_eq!(scan(MODEL, b"  \n"), Err(BodyProblem::Empty));
    assert_eq!(
        scan(MODEL, b"prompt=hello"),
        Err(BodyProblem::NotJson { offset: 0 })
    );
    assert_eq!(scan(MODEL, b"[1,2]"), Err(BodyProblem::NotAnObject));
    assert_eq!(scan(MODEL, br#""model""#), Err(BodyProblem::NotAnObject));
    assert_eq!(
        scan(MODEL, br#"{"a" 1}"#),
        Err(BodyProblem::NotJson { offset: 5 })
    );
    // Known at the first bad byte, before the rest of a long body arrives.
    let mut scanner = BodyScanner::new(MODEL);
    assert_eq!(scanner.feed(b"<html>"), Progress::Answered);
    // A body that ends inside the object.
    assert_eq!(
        scan(MODEL, br#"{"messages":[1,2"#),
        Err(BodyProblem::NotJson { offset: 16 })
    );
}

#[test]
fn refuses_a_model_that_is_not_a_string() {
    assert_eq!(
        scan(MODEL, br#"{"model":42}"#),
        Err(BodyProblem::ModelNotAString)
    );
    assert_eq!(
        scan(MODEL, br#"{"model":["a"]}"#),
        Err(BodyProblem::ModelNotAString)
    );
    // A batch's list of ids is no routing key, and reads as absent.
    assert_eq!(
        scan(BOTH, br#"{"rid":["a","b"],"model":"m"}"#),
        Ok(fields(Some("m"), None))
    );
}

#[test]
fn refuses_bad_strings_and_mismatched_brackets() {
    for body in [
        &br#"{"model":"a\qb"}"#[..],
        br#"{"model":"\ud800"}"#,
        br#"{"model":"\udc00x"}"#,
        b"{\"model\":\"a\x01\"}",
        b"{\"model\":\"\xff\"}",
        br#"{"messages":[1}, "model":"m"}"#,
        br#"{"n":01,"model":"m"}"#,
        br#"{"n":tru,"model":"m"}"#,
    ] {
        assert!(
            matches!(scan(MODEL, body), Err(BodyProblem::NotJson { .. })),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn a_model_after_a_megabyte_of_messages_is_found() {
    let content = "x{\"[}]\\".repeat((1 << 20) / 7 + 1);
    let body =
        json!({"messages": [{"role": "user", "content": content}], "temperature": 0.5}).to_string();
    // serde_json writes keys in order; put `model` last, as openai-python does.
    let body = format!("{},\"model\":\"llama-3.1-8b\"}}", &body[..body.len() - 1]);
    assert!(body.len() > 1 << 20);
    let chunks = body.as_bytes().chunks(16 * 1024);
    assert_eq!(
        scan_chunks(MODEL, chunks),
        Ok(fields(Some("llama-3.1-8b"), None))
    );
}

#[test]
fn every_split_of_a_body_gives_the_same_answer() {
    let body = br#" {"a":{"b":["}",{"c":"\""}]},"rid":"r\u00e9","x":-1.5e3,"y":true,"model":"m\ud83d\ude00"} "#;
    let whole = scan(BOTH, body);
    assert_eq!(whole, Ok(fields(Some("m\u{1F600}"), Some("r\u{e9}"))));
    for first in 0..body.len() {
        for second in first..body.len() {
            let chunks = [&body[..first], &body[first..second], &body[second..]];
            assert_eq!(
                scan_chunks(BOTH, chunks),
                whole,
                "split at {first} and {second}"
            );
        }
    }
}

#[test]
fn a_request_ids_lineage_suffixes_are_stripped() {
    for (rid, root) in [
        ("conv9_t5_r1", "conv9"),
        ("conv9_t5", "conv9"),
        ("conv9_r2_t5", "conv9"),
        ("conv9", "conv9"),
        ("conv_9", "conv_9"),
        ("conv9_t", "conv9_t"),
        ("conv9_x5", "conv9_x5"),
        ("a_b_t12_r3", "a_b"),
        ("_t5_r1", "_t5"),
        ("", ""),
    ] {
        assert_eq!(rid_lineage_root(rid), root, "{rid}");
    }
}

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,6}",
        any::<String>(),
        Just("model".to_owned()),
        Just("rid".to_owned()),
        "[{}\\[\\]\"\\\\:,]{0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(Value::from),
        json_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((json_string(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
        ]
    })
}

fn top_level_object() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        3 => (json_string(), json_value()),
        1 => (Just("model".to_owned()), json_string().prop_map(Value::from)),
        1 => (Just("rid".to_owned()), json_string().prop_map(Value::from)),
        1 => (Just("model".to_owned()), json_value()),
        1 => (Just("rid".to_owned()), json_value()),
    ];
    prop::collection::vec(field, 0..8).prop_map(|pairs| Value::Object(pairs.into_iter().collect()))
}

/// Cuts `body` at the given points (taken modulo its length).
fn split(body: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    points.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for point in points.into_iter().chain([body.len()]) {
        chunks.push(body[start..point].to_vec());
        start = point;
    }
    chunks
}

proptest! {
    #[test]
    fn any_split_of_a_json_body_reads_what_serde_json_reads(
        object in top_level_object(),
        pretty in any::<bool>(),
        want_rid in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let body = if pretty {
            serde_json::to_vec_pretty(&object).unwrap()
        } else {
            serde_json::to_vec(&object).unwrap()
        };
        let wanted = WantedFields { model: true, rid: want_rid };
        let expected = serde_answer(wanted, &body).unwrap();
        let chunks = split(&body, &cuts);
        prop_assert_eq!(scan_chunks(wanted, chunks.iter().map(Vec::as_slice)), expected);
    }

    #[test]
    fn arbitrary_bytes_never_contradict_serde_json(
        body in prop::collection::vec(prop_oneof![
            any::<u8>(),
            prop::sample::select(b"{}[]\",:\\ 0123456789.-eEtruefalsnmodelrid".to_vec()),
        ], 0..64),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        // serde_json keeps a duplicate key's last value, the scanner its first.
        let text = String::from_utf8_lossy(&body);
        prop_assume!(text.matches("\"model\"").count() < 2 && text.matches("\"rid\"").count() < 2);
        let chunks = split(&body, &cuts);
        let answer = scan_chunks(BOTH, chunks.iter().map(Vec::as_slice));
        if let Some(expected) = serde_answer(BOTH, &body) {
            prop_assert_eq!(answer, expected);
        }
    }
}
