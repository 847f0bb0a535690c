//! A recording and the files it was rotated into, read as one: `--replay FILE` plays `FILE.8` …
//! `FILE.1`, then `FILE` (gatewayd's `[telemetry] record_file` rotation, `FILE.1` the newest
//! rotated file), so a drill that spans rotations plays through in time order and seeks across
//! the files' joins.
//!
//! Each rotated file opens like a console's new connection (`connected`, then a snapshot at seq
//! 0), so the files' events laid end to end are what a console that reconnected at each join
//! would have applied: nothing is rewritten. What is left out, and why:
//! - an older file written by another recorder or over other replicas (a gateway restarted with
//!   another control address, a console's own recording of the same name): the chain ends there,
//!   since its replica indices mean other gateways;
//! - a file seen under two names, one file on disk (a rotation links `FILE.1` to `FILE` just
//!   before a fresh `FILE` replaces it): it plays once. Files are told apart by what the file
//!   system says, never by their headers: a file that filled at once is rotated in the
//!   millisecond it was created, and the next one's header is the same;
//! - an older file's events received after the newer file's first event (a clock stepped back):
//!   the replay's recorded time only moves forward.
//!
//! Older files left out (past a missing number, past a file that is no recording, past another
//! recorder's) are named with why in [`Chain::left_out`], for the operator.

use std::path::{Path, PathBuf};

use std::io::Read;

use anyhow::Context;
use bch_core::recording::{Recording, RecordingError};
use same_file::Handle;

/// The most rotated files looked for: gatewayd keeps `FILE.1` to `FILE.8`.
pub(super) const ROTATED_FILES_READ: u32 = 8;

/// `FILE` and the rotated files beside it that exist, oldest first (`FILE.8` … `FILE.1`,
/// `FILE`). A gap in the numbers ends the search (a file removed by hand breaks the chain there,
/// so the replay does not jump over missing time); the files past the gap that exist are left
/// out, and the second value says so.
pub(super) fn chain_paths(path: &Path) -> (Vec<PathBuf>, Option<String>) {
    let rotated = |n: u32| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    };
    let mut paths = vec![path.to_path_buf()];
    let mut left_out = None;
    for n in 1..=ROTATED_FILES_READ {
        let file = rotated(n);
        if !file.is_file() {
            let beyond: Vec<PathBuf> = (n + 1..=ROTATED_FILES_READ)
                .map(rotated)
                .filter(|later| later.is_file())
                .collect();
            if let (Some(first), Some(last)) = (beyond.first(), beyond.last()) {
                left_out = Some(format!(
                    "{} left out: {} is missing",
                    files_text(first, last),
                    name_of(&file)
                ));
            }
            break;
        }
        paths.push(file);
    }
    paths.reverse();
    (paths, left_out)
}

/// A recording and its rotated files, joined.
#[derive(Debug)]
pub(super) struct Chain {
    /// The events of every file that belongs, in time order, under the newest file's header.
    pub recording: Recording,
    /// How many files `recording` came from.
    pub files: usize,
    /// Which older files were left out and why (`rec.jsonl.3 … rec.jsonl.8 left out:
    /// rec.jsonl.3 is not a bch recording (…)`), for the operator: `None` when every rotated
    /// file found plays.
    pub left_out: Option<String>,
}

/// Reads `path` and the files it was rotated into, joined as [`join`] does.
///
/// # Errors
///
/// `path` itself cannot be read or is no recording (a rotated file that cannot be read ends the
/// chain instead: the newer files still play, and [`Chain::left_out`] says why the older ones
/// do not).
pub(super) fn read_chain(path: &Path) -> anyhow::Result<Chain> {
    let (paths, mut left_out) = chain_paths(path);
    let (newest, older) = paths.split_last().expect("the chain holds `path`");
    let (newest, newest_file) =
        read(newest).with_context(|| format!("--replay {}", path.display()))?;
    let mut recordings = vec![newest];
    // The name each of `recordings` was read under.
    let mut names = vec![path];
    // Each file read so far: a name that leads to one of them again was linked to it while the
    // replay read (a rotation in progress), and is the same recording, not an older one.
    let mut files_read = vec![newest_file];
    for rotated in older.iter().rev() {
        match read(rotated) {
            Ok((_, file)) if files_read.contains(&file) => {}
            Ok((recording, file)) => {
                recordings.push(recording);
                names.push(rotated);
                files_read.push(file);
            }
            Err(error) => {
                let why = match error.downcast_ref::<RecordingError>() {
                    Some(RecordingError::NotARecording(_)) => "is not a bch recording".to_owned(),
                    _ => format!("is unreadable ({error:#})"),
                };
                left_out = Some(format!(
                    "{} left out: {} {why}",
                    files_text(rotated, &older[0]),
                    name_of(rotated)
                ));
                break;
            }
        }
    }
    recordings.reverse();
    names.reverse();
    let (recording, files, other_chain) = join(recordings);
    if let Some(index) = other_chain {
        let (newest_left_out, oldest) = (names[index], &paths[0]);
        left_out = Some(format!(
            "{} left out: {} was recorded by another recorder or of other replicas",
            files_text(newest_left_out, oldest),
            name_of(newest_left_out)
        ));
    }
    Ok(Chain {
        recording,
        files,
        left_out,
    })
}

/// `rec.jsonl.3`, or `rec.jsonl.3 … rec.jsonl.8` for more than one file.
fn files_text(newest: &Path, oldest: &Path) -> String {
    if newest == oldest {
        name_of(newest)
    } else {
        format!("{} … {}", name_of(newest), name_of(oldest))
    }
}

/// The file's name without its directory (the operator named the directory already).
fn name_of(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    )
}

/// The recording at `path`, and which file on disk it was read from (the same handle for two
/// names of one file).
fn read(path: &Path) -> anyhow::Result<(Recording, Handle)> {
    // Read through the handle compared: the name may lead elsewhere a moment later.
    let file = Handle::from_path(path)?;
    let mut bytes = Vec::new();
    file.as_file().read_to_end(&mut bytes)?;
    let recording = Recording::parse(&bytes)?;
    Ok((recording, file))
}

/// Joins `recordings`, oldest first, into one with the newest's header: every older file that
/// belongs to the same chain contributes its events before the newer ones (see the module's
/// rules for what is left out). Returns the joined recording, how many files it holds, and the
/// index in `recordings` of the file that ended the chain as another recorder's or other
/// replicas' (it and every older one left out), if one did.
pub(super) fn join(mut recordings: Vec<Recording>) -> (Recording, usize, Option<usize>) {
    let Some(mut joined) = recordings.pop() else {
        unreachable!("join is given at least the newest file")
    };
    let mut files = 1;
    while let Some(older) = recordings.pop() {
        let same_chain = older.header.recorder == joined.header.recorder
            && older.header.replicas == joined.header.replicas;
        if !same_chain {
            return (joined, files, Some(recordings.len()));
        }
        let first_at = joined.events.first().map_or(u64::MAX, |e| e.at_ms);
        let mut events: Vec<_> = older
            .events
            .into_iter()
            .filter(|e| e.at_ms <= first_at)
            .collect();
        // Damaged lines keep their places: the older file's within its kept events, the newer
        // files' after them.
        let kept = events.len();
        let mut damaged: Vec<usize> = older.damaged.iter().map(|&at| at.min(kept)).collect();
        damaged.extend(joined.damaged.iter().map(|&at| at + kept));
        events.append(&mut joined.events);
        joined.events = events;
        joined.damaged = damaged;
        files += 1;
    }
    (joined, files, None)
}

#[cfg(test)]
mod tests {
    use bch_core::recording::{RecordedEvent, RecordedKind, RecordingHeader};

    use super::*;

    fn recording(recorder: &str, started_ms: u64, url: &str, times: &[u64]) -> Recording {
        Recording {
            header: RecordingHeader::new(recorder, started_ms, vec![url.to_owned()]),
            events: times
                .iter()
                .map(|&at_ms| RecordedEvent {
                    at_ms,
                    replica: 0,
                    kind: RecordedKind::Connected,
                })
                .collect(),
            damaged: Vec::new(),
            truncated: false,
        }
    }

    fn times(recording: &Recording) -> Vec<u64> {
        recording.events.iter().map(|e| e.at_ms).collect()
    }

    #[test]
    fn files_of_one_chain_play_oldest_first() {
        let (joined, files, _) = join(vec![
            recording("gatewayd", 100, "ws://a/ws", &[100, 150]),
            recording("gatewayd", 200, "ws://a/ws", &[200, 250]),
            recording("gatewayd", 300, "ws://a/ws", &[300]),
        ]);
        assert_eq!(files, 3);
        assert_eq!(times(&joined), [100, 150, 200, 250, 300]);
        assert_eq!(joined.header.started_ms, 300, "the newest file's header");
    }

    #[test]
    fn another_gateway_ends_the_chain() {
        let (joined, files, other_chain) = join(vec![
            recording("gatewayd", 50, "ws://other/ws", &[50]),
            recording("gatewayd", 100, "ws://a/ws", &[100, 150]),
            recording("gatewayd", 200, "ws://a/ws", &[200, 250]),
        ]);
        assert_eq!((files, other_chain), (2, Some(0)));
        assert_eq!(times(&joined), [100, 150, 200, 250]);
        let (joined, files, _) = join(vec![
            recording("bch-tui", 100, "ws://a/ws", &[100]),
            recording("gatewayd", 200, "ws://a/ws", &[200]),
        ]);
        assert_eq!((files, times(&joined)), (1, vec![200]));
    }

    /// `recording`'s lines as a recorder writes them.
    fn file_text(recording: &Recording) -> String {
        let mut text = recording.header.to_line();
        for event in &recording.events {
            text.push_str(&event.to_line());
        }
        text
    }

    #[test]
    fn files_started_in_the_same_millisecond_both_play() {
        // A file that filled at once (one large snapshot) rotates in the millisecond it was
        // created: the next file's header is the same, yet its events are others.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        let older = recording("gatewayd", 200, "ws://a/ws", &[200, 200]);
        let newer = recording("gatewayd", 200, "ws://a/ws", &[200, 201, 202]);
        std::fs::write(format!("{}.1", path.display()), file_text(&older)).unwrap();
        std::fs::write(&path, file_text(&newer)).unwrap();
        let chain = read_chain(&path).unwrap();
        assert_eq!(chain.files, 2, "{:?}", chain.left_out);
        assert_eq!(times(&chain.recording), [200, 200, 200, 201, 202]);
    }

    #[test]
    fn a_file_seen_under_two_names_plays_once() {
        // Mid-rotation `FILE.1` is a second name of `FILE`, until a fresh `FILE` replaces it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        let oldest = recording("gatewayd", 100, "ws://a/ws", &[100, 150]);
        let current = recording("gatewayd", 200, "ws://a/ws", &[200, 250]);
        std::fs::write(format!("{}.2", path.display()), file_text(&oldest)).unwrap();
        std::fs::write(&path, file_text(&current)).unwrap();
        std::fs::hard_link(&path, format!("{}.1", path.display())).unwrap();
        let chain = read_chain(&path).unwrap();
        assert_eq!((chain.files, chain.left_out), (2, None));
        assert_eq!(times(&chain.recording), [100, 150, 200, 250]);
    }

    #[test]
    fn an_older_file_never_moves_the_clock_back() {
        let (joined, _, _) = join(vec![
            recording("gatewayd", 100, "ws://a/ws", &[100, 220, 230]),
            recording("gatewayd", 200, "ws://a/ws", &[200, 250]),
        ]);
        assert_eq!(times(&joined), [100, 200, 250]);
    }
}
