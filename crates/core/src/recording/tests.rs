use super::*;

const TICK: &str = r#"{"v":2,"seq":1,"type":"tick","ts_ms":1767268800100,"workers":[],"keys":[],
"spills":[{"ts_ms":1767268800040,"key":"chat-1","branch":"explicit_routing_key_spillover","from":"w0",
"to":"w1","preferred_load":9,"min_load":1,"mean_load":3.25,"min_load_gap":2,"max_load_skew":1.5}],
"totals":{"requests_per_s":1.0,"spills_per_s":1.0,"requests_total":3,"spills_total":1},"dropped_events":0}"#;

fn frame(json: &str) -> ServerFrame {
    serde_json::from_str(json).unwrap()
}

fn header() -> RecordingHeader {
    RecordingHeader::new(
        "bch-tui",
        1_767_268_800_000,
        vec!["ws://a/ws".into(), "ws://b/ws".into()],
    )
}

fn events() -> Vec<RecordedEvent> {
    vec![
        RecordedEvent {
            at_ms: 1_767_268_800_001,
            replica: 0,
            kind: RecordedKind::Connected,
        },
        RecordedEvent {
            at_ms: 1_767_268_800_101,
            replica: 0,
            kind: RecordedKind::Frame {
                frame: Box::new(frame(&TICK.replace('\n', ""))),
            },
        },
        RecordedEvent {
            at_ms: 1_767_268_800_150,
            replica: 1,
            kind: RecordedKind::Disconnected {
                reason: "Connection refused".into(),
            },
        },
        RecordedEvent {
            at_ms: 1_767_268_800_160,
            replica: 1,
            kind: RecordedKind::BadFrame {
                error: "expected value".into(),
            },
        },
    ]
}

fn file(header: &RecordingHeader, events: &[RecordedEvent]) -> String {
    let mut text = header.to_line();
    for event in events {
        text.push_str(&event.to_line());
    }
    text
}

#[test]
fn a_recording_round_trips() {
    let text = file(&header(), &events());
    assert_eq!(text.lines().count(), 5, "one line per record: {text}");
    let read = Recording::parse(text.as_bytes()).unwrap();
    assert_eq!(read.header, header());
    assert_eq!(read.events, events());
    assert_eq!((read.damaged.len(), read.truncated), (0, false));
    let marks: Vec<(bool, bool)> = read
        .events
        .iter()
        .map(|e| (e.has_spills(), e.is_error()))
        .collect();
    assert_eq!(
        marks,
        [(false, false), (true, false), (false, true), (false, true)]
    );
}

#[test]
fn a_frame_line_from_serialised_json_reads_as_the_frame() {
    let json = TICK.replace('\n', "");
    let mut text = header().to_line();
    text.push_str(&frame_line(42, 0, &json));
    let read = Recording::parse(text.as_bytes()).unwrap();
    assert_eq!(
        read.events,
        [RecordedEvent {
            at_ms: 42,
            replica: 0,
            kind: RecordedKind::Frame {
                frame: Box::new(frame(&json))
            },
        }]
    );
}

#[test]
fn a_truncated_file_reads_up_to_its_last_whole_record() {
    let text = file(&header(), &events());
    let whole_three = text.lines().take(4).map(|l| l.len() + 1).sum::<usize>();
    // Cut anywhere inside the last record: the first three events survive.
    for cut in [whole_three + 1, whole_three + 20, text.len() - 1] {
        let read = Recording::parse(&text.as_bytes()[..cut]).unwrap();
        assert_eq!(read.events, events()[..3], "cut at {cut}");
        assert!(read.truncated, "cut at {cut}");
    }
    // A damaged whole line in the middle loses that event only.
    let damaged = text.replacen("\"event\":\"connected\"", "\"event\":", 1);
    let read = Recording::parse(damaged.as_bytes()).unwrap();
    assert_eq!(read.events, events()[1..]);
    assert_eq!(read.damaged, [0], "before the first event left");
    // A header cut short is no recording at all.
    assert_eq!(Recording::parse(b""), Err(RecordingError::Empty));
    assert_eq!(
        Recording::parse(&text.as_bytes()[..10]),
        Err(RecordingError::Empty)
    );
}

#[test]
fn bytes_without_a_newline_are_not_a_recording_unless_a_header_cut_short() {
    // Random bytes with no newline in them (as `head -c 300 /dev/urandom` often gives).
    let random: Vec<u8> = (0u32..300)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .filter(|&b| b != b'\n')
        .collect();
    assert!(
        matches!(
            Recording::parse(&random),
            Err(RecordingError::NotARecording(_))
        ),
        "{:?}",
        Recording::parse(&random)
    );
    assert!(matches!(
        Recording::parse(b"hello, world"),
        Err(RecordingError::NotARecording(_))
    ));
    assert_eq!(Recording::parse(b" \n\n "), Err(RecordingError::Empty));
}

#[test]
fn damaged_lines_are_placed_among_the_events() {
    let text = file(&header(), &events());
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(3, "GARBAGE LINE {{{");
    lines.push("\u{1}");
    let read = Recording::parse((lines.join("\n") + "\n").as_bytes()).unwrap();
    assert_eq!(read.events, events());
    assert_eq!(read.damaged, [2, events().len()]);
}

#[test]
fn a_newer_version_is_refused_with_a_clear_error() {
    let mut newer = header();
    newer.version = RECORDING_VERSION + 1;
    let text = file(&newer, &events());
    let error = Recording::parse(text.as_bytes()).unwrap_err();
    assert_eq!(
        error,
        RecordingError::NewerVersion {
            found: RECORDING_VERSION + 1
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("version 2 is newer") && message.contains("newer bch-tui"),
        "{message}"
    );
    let other = Recording::parse(b"{\"type\":\"tick\"}\n").unwrap_err();
    assert!(
        matches!(other, RecordingError::NotARecording(_)),
        "{other:?}"
    );
}
