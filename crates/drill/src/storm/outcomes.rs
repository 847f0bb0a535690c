//! How each request of a measured storm ended, counted so that every request lands in exactly one
//! class ([`OutcomeCounts`]), overall and per gateway replica ([`ReplicaOutcomes`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::shooter::{NoResponse, Outcome};

/// How the requests of a storm ended. Every request counts in exactly one field, so the fields
/// add up to the requests sent ([`OutcomeCounts::total`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeCounts {
    /// Answered 2xx and read to completion (a stream up to `data: [DONE]`).
    pub ok: u64,
    /// Answered with a status other than 2xx, per status.
    pub http_status: BTreeMap<u16, u64>,
    /// Answered 2xx, then the answer failed: a stream that ended before `data: [DONE]`, a body cut
    /// off or timed out, invalid JSON.
    pub broken: u64,
    /// No answer: the connection was refused (nothing was sent).
    pub refused: u64,
    /// No answer within the request timeout.
    pub timed_out: u64,
    /// No answer for another reason: a connection reset or closed before the response.
    pub transport_error: u64,
    /// Never sent: the request could not be built, every replica had been ejected, or the storm
    /// was stopped first.
    pub not_sent: u64,
    /// Sent, then abandoned unfinished because the storm was stopped (Ctrl-C or SIGTERM).
    pub interrupted: u64,
}

impl OutcomeCounts {
    /// Every request counted: the sum of all fields.
    pub fn total(&self) -> u64 {
        self.ok
            + self.http_status.values().sum::<u64>()
            + self.broken
            + self.refused
            + self.timed_out
            + self.transport_error
            + self.not_sent
            + self.interrupted
    }

    /// Requests without a complete answer other than a non-2xx status: broken, refused, timed
    /// out, transport errors, not sent and interrupted.
    pub fn errors(&self) -> u64 {
        self.broken
            + self.refused
            + self.timed_out
            + self.transport_error
            + self.not_sent
            + self.interrupted
    }

    /// Counts `outcome` in its one class.
    pub(super) fn add(&mut self, outcome: &Outcome) {
        match Class::of(outcome) {
            Class::Ok => self.ok += 1,
            Class::Status(status) => *self.http_status.entry(status).or_insert(0) += 1,
            Class::Broken => self.broken += 1,
            Class::Refused => self.refused += 1,
            Class::TimedOut => self.timed_out += 1,
            Class::Transport => self.transport_error += 1,
            Class::NotSent => self.not_sent += 1,
            Class::Interrupted => self.interrupted += 1,
        }
    }

    /// The classes as the text report names them, `ok` always and the others when not zero.
    pub fn lines(&self) -> Vec<(String, u64)> {
        let mut lines = vec![("ok".to_owned(), self.ok)];
        lines.extend(
            self.http_status
                .iter()
                .map(|(status, n)| (format!("HTTP {status}"), *n)),
        );
        for (name, n) in [
            ("2xx then broken", self.broken),
            ("refused", self.refused),
            ("timed out", self.timed_out),
            ("transport error", self.transport_error),
            ("not sent", self.not_sent),
            ("interrupted", self.interrupted),
        ] {
            if n > 0 {
                lines.push((name.to_owned(), n));
            }
        }
        lines
    }
}

impl fmt::Display for OutcomeCounts {
    /// `ok: 1254, HTTP 503: 4, refused: 300`: every class that has requests, `ok` always.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .lines()
            .iter()
            .map(|(name, n)| format!("{name}: {n}"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// The one class of [`OutcomeCounts`] a request lands in; per-request records name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Ok,
    Status(u16),
    Broken,
    Refused,
    TimedOut,
    Transport,
    NotSent,
    Interrupted,
}

impl Class {
    /// The class of `outcome`: interrupted first, then a non-2xx status, then a 2xx complete or
    /// broken, then why no response came.
    pub(super) fn of(outcome: &Outcome) -> Self {
        if outcome.interrupted {
            return Class::Interrupted;
        }
        match (outcome.status, &outcome.error) {
            (Some(status), _) if !(200..300).contains(&status) => Class::Status(status),
            (Some(_), None) => Class::Ok,
            (Some(_), Some(_)) => Class::Broken,
            (None, _) => match outcome.no_response.unwrap_or(NoResponse::Transport) {
                NoResponse::Refused => Class::Refused,
                NoResponse::TimedOut => Class::TimedOut,
                NoResponse::Transport => Class::Transport,
                NoResponse::NotSent => Class::NotSent,
            },
        }
    }

    /// The field of [`OutcomeCounts`] it counts in (`http_503` for a status).
    pub(super) fn name(self) -> String {
        match self {
            Class::Ok => "ok".to_owned(),
            Class::Status(status) => format!("http_{status}"),
            Class::Broken => "broken".to_owned(),
            Class::Refused => "refused".to_owned(),
            Class::TimedOut => "timed_out".to_owned(),
            Class::Transport => "transport_error".to_owned(),
            Class::NotSent => "not_sent".to_owned(),
            Class::Interrupted => "interrupted".to_owned(),
        }
    }
}

/// What one gateway replica did with the requests of a storm.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaOutcomes {
    /// The replica's data-plane URL.
    pub gateway: String,
    /// The requests this replica had last (a refused request sent on to another replica counts
    /// there), by how they ended.
    pub outcomes: OutcomeCounts,
    /// Requests whose connection this replica refused and that were sent to another replica
    /// (only with ejection of refused replicas).
    pub refused_and_resent: u64,
    /// When the replica was taken out of the rotation for refusing a connection, in seconds from
    /// the start of the storm (0 when it refused before the first request); `None` while it was
    /// in the rotation to the end.
    pub ejected_after_s: Option<f64>,
}

/// Counts `outcomes` per replica of `gateways`: each outcome at the replica that had it last, and
/// each refusal that was resent at the replica that refused.
pub(super) fn per_replica<'a>(
    gateways: &[String],
    outcomes: impl IntoIterator<Item = &'a Outcome>,
    ejections: &[Option<f64>],
) -> Vec<ReplicaOutcomes> {
    let mut replicas: Vec<ReplicaOutcomes> = gateways
        .iter()
        .zip(ejections.iter().chain(std::iter::repeat(&None)))
        .map(|(gateway, ejected)| ReplicaOutcomes {
            gateway: gateway.clone(),
            outcomes: OutcomeCounts::default(),
            refused_and_resent: 0,
            ejected_after_s: *ejected,
        })
        .collect();
    for o in outcomes {
        if let Some(replica) = o.replica.and_then(|r| replicas.get_mut(r)) {
            replica.outcomes.add(o);
        }
        for &refusing in &o.refused_by {
            if let Some(replica) = replicas.get_mut(refusing) {
                replica.refused_and_resent += 1;
            }
        }
    }
    replicas
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng as _, SeedableRng as _};
    use rand_chacha::ChaCha8Rng;

    fn outcome(rng: &mut ChaCha8Rng) -> Outcome {
        let mut o = Outcome::default();
        match rng.random_range(0..8) {
            0 => o.status = Some(200),
            1 => o.status = Some(*[404u16, 429, 500, 503].get(rng.random_range(0..4)).unwrap()),
            2 => {
                o.status = Some(200);
                o.error = Some("stream ended without data: [DONE]".to_owned());
            }
            3 => o.no_response = Some(NoResponse::Refused),
            4 => o.no_response = Some(NoResponse::TimedOut),
            5 => o.no_response = Some(NoResponse::NotSent),
            6 => o.no_response = Some(NoResponse::Transport),
            _ => {
                // Abandoned mid-answer: a status may have arrived already.
                o.status = rng.random_bool(0.5).then_some(200);
                o.interrupted = true;
                o.error = Some("interrupted".to_owned());
            }
        }
        if o.no_response.is_some() {
            o.error = Some("failed".to_owned());
        }
        o.replica = (o.no_response != Some(NoResponse::NotSent)).then(|| rng.random_range(0..3));
        o
    }

    #[test]
    fn every_outcome_lands_in_exactly_one_class_and_the_lines_add_up() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for n in [0usize, 1, 2, 17, 500] {
            let outcomes: Vec<Outcome> = (0..n).map(|_| outcome(&mut rng)).collect();
            let mut counts = OutcomeCounts::default();
            for o in &outcomes {
                counts.add(o);
            }
            assert_eq!(counts.total(), n as u64);
            let lines: u64 = counts.lines().iter().map(|(_, n)| n).sum();
            assert_eq!(lines, n as u64, "{counts}");
            let ok = outcomes.iter().filter(|o| o.ok()).count() as u64;
            assert_eq!(counts.ok, ok);
            let errors = outcomes.iter().filter(|o| o.error.is_some()).count() as u64;
            assert_eq!(counts.errors(), errors);

            let gateways: Vec<String> = (0..3).map(|r| format!("http://r{r}/")).collect();
            let replicas = per_replica(&gateways, &outcomes, &[None, None, None]);
            let sent: u64 = replicas.iter().map(|r| r.outcomes.total()).sum();
            assert_eq!(sent + counts.not_sent, n as u64);
        }
    }

    #[test]
    fn a_records_class_names_the_field_its_request_counts_in() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..200 {
            let o = outcome(&mut rng);
            let mut counts = OutcomeCounts::default();
            counts.add(&o);
            let json = serde_json::to_value(&counts).unwrap();
            let counted = match Class::of(&o) {
                Class::Status(status) => json["http_status"][status.to_string()].clone(),
                class => json[class.name()].clone(),
            };
            assert_eq!(counted, 1, "{:?} in {json}", Class::of(&o));
        }
    }

    #[test]
    fn the_text_names_each_class_once_and_ok_always() {
        let mut counts = OutcomeCounts::default();
        assert_eq!(counts.to_string(), "ok: 0");
        counts.ok = 1254;
        counts.http_status.insert(503, 4);
        counts.broken = 8;
        counts.refused = 300;
        assert_eq!(
            counts.to_string(),
            "ok: 1254, HTTP 503: 4, 2xx then broken: 8, refused: 300"
        );
        assert_eq!(counts.total(), 1566);
    }

    #[test]
    fn a_resent_refusal_counts_at_the_replica_that_refused() {
        let gateways: Vec<String> = (0..3).map(|r| format!("http://r{r}/")).collect();
        let resent = Outcome {
            status: Some(200),
            replica: Some(2),
            refused_by: vec![1],
            ..Outcome::default()
        };
        let replicas = per_replica(&gateways, [&resent], &[None, Some(1.5), None]);
        assert_eq!(replicas[2].outcomes.ok, 1);
        assert_eq!(replicas[1].refused_and_resent, 1);
        assert_eq!(replicas[1].ejected_after_s, Some(1.5));
        assert_eq!(replicas[0].refused_and_resent, 0);
    }
}
