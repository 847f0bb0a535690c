//! The worker list checked as a whole: every entry parsed into a [`Member`], and refused when its
//! name, URL or ring identity clashes with an earlier one, when its URL reaches an earlier
//! worker's backend ([`first_alias`]), is the gateway's own listener ([`loop_of`]), or cannot be
//! named by the endpoint picker. Per-entry checks live in [`super::worker`].

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use super::alias::Backend;
use super::field_error::FieldError;
use super::worker::Member;
use super::{Config, ConfigError};

impl Config {
    /// With the endpoint picker on, every worker must be an `http(s)://IP:PORT` URL: Envoy finds the
    /// picked endpoint among its cluster's hosts by address. The error names `workers[N].url`.
    pub fn picker_workers(&self, members: &[Member]) -> Result<(), FieldError> {
        match self
            .picker_worker_problems(members.iter().enumerate())
            .into_iter()
            .next()
        {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }

    /// Every worker of `members` (each with its index in the worker list) that the endpoint
    /// picker cannot name, one problem each; none when the picker is off.
    pub(super) fn picker_worker_problems<'a>(
        &self,
        members: impl Iterator<Item = (usize, &'a Member)>,
    ) -> Vec<FieldError> {
        if self.picker.listen.is_none() {
            return Vec::new();
        }
        members
            .filter_map(|(index, member)| {
                let message = member.url.picker_endpoint().err()?;
                Some(
                    FieldError::new("url", format!("worker {}: {message}", member.spec.name))
                        .within(&format!("workers[{index}]")),
                )
            })
            .collect()
    }

    /// The worker list validated: names defaulted, URLs parsed, duplicate names, URLs and ring
    /// identities refused, and so is a URL that reaches the same backend as an earlier one (an
    /// alias would give one backend two shares of the ring). The error names the entry and field,
    /// e.g. `workers[2].url`.
    pub fn members(&self) -> Result<Vec<Member>, ConfigError> {
        let (members, problems) = self.collect_members();
        match problems.into_iter().next() {
            Some(error) => Err(ConfigError::Invalid { path: None, error }),
            None => Ok(members),
        }
    }

    /// The valid members and every problem of the worker list. A clash over a name or ring id
    /// the entry did not write (the defaults, derived from the URL) is reported under the entry's
    /// `url`, which is what the operator wrote.
    pub(super) fn collect_members(&self) -> (Vec<Member>, Vec<FieldError>) {
        let mut members: Vec<(usize, Member)> = Vec::with_capacity(self.workers.len());
        let mut problems = Vec::new();
        // Where each name, URL, ring id and backend of an accepted member is (its place in
        // `members`): a lookup per entry, where a scan of the earlier entries would make the
        // check quadratic in the fleet (minutes at 10,000 workers).
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut urls: HashMap<String, usize> = HashMap::new();
        let mut ring_ids: HashMap<String, usize> = HashMap::new();
        let mut backends: HashMap<Backend, usize> = HashMap::new();
        for (index, worker) in self.workers.iter().enumerate() {
            let entry = format!("workers[{index}]");
            let invalid =
                |field: &str, message: String| FieldError::new(field, message).within(&entry);
            let member = match worker.member() {
                Ok(member) => member,
                Err(e) => {
                    problems.push(e.within(&entry));
                    continue;
                }
            };
            let spec = &member.spec;
            let fields: [(&str, &str, &HashMap<String, usize>, bool); 3] = [
                ("name", &spec.name, &names, worker.name.is_none()),
                ("url", &spec.url, &urls, false),
                (
                    "ring_id",
                    spec.ring_id(),
                    &ring_ids,
                    worker.ring_id.is_none(),
                ),
            ];
            let clash = fields.into_iter().find_map(|(field, value, taken, defaulted)| {
                let (other, m) = &members[*taken.get(value)?];
                Some(if defaulted {
                    invalid(
                        "url",
                        format!(
                            "{:?} gets the default {field} {value:?}, already the {field} of workers[{other}] ({:?}); set a distinct {field}",
                            worker.url, m.spec.url
                        ),
                    )
                } else {
                    invalid(
                        field,
                        format!("duplicate worker {field} {value:?} (also workers[{other}])"),
                    )
                })
            });
            let alias = || {
                let (_, twin) = &members[*backends.get(&member.url.backend)?];
                Some(invalid("url", alias_message(&member, twin)))
            };
            match clash.or_else(alias) {
                Some(problem) => problems.push(problem),
                None => {
                    let at = members.len();
                    names.insert(member.spec.name.clone(), at);
                    urls.insert(member.spec.url.clone(), at);
                    ring_ids.insert(member.spec.ring_id().to_owned(), at);
                    backends.insert(member.url.backend.clone(), at);
                    members.push((index, member));
                }
            }
        }
        (members.into_iter().map(|(_, m)| m).collect(), problems)
    }
}

/// The first member of `members` whose URL reaches the backend of a member before it: its index
/// and why it may not join. One pass with a map, not a scan of the earlier members per
/// member (quadratic in the fleet).
pub fn first_alias(members: &[Member]) -> Option<(usize, String)> {
    let mut backends: HashMap<&Backend, &Member> = HashMap::with_capacity(members.len());
    members
        .iter()
        .enumerate()
        .find_map(|(index, member)| match backends.get(&member.url.backend) {
            Some(twin) => Some((index, alias_message(member, twin))),
            None => {
                backends.insert(&member.url.backend, member);
                None
            }
        })
}

/// Why `member` may not join beside `twin`, whose URL reaches the same backend.
fn alias_message(member: &Member, twin: &Member) -> String {
    format!(
        "{:?} reaches the same backend ({}) as worker {:?} ({:?}); one backend registered twice would get two shares of the ring",
        member.spec.url, member.url.backend, twin.spec.name, twin.spec.url
    )
}

/// Why `member` may not be a worker of a gateway listening on `listeners`: its URL is one of them,
/// so every request routed to it would come back in and loop.
pub fn loop_of(member: &Member, listeners: &[SocketAddr]) -> Option<String> {
    let listener = listeners
        .iter()
        .find(|l| member.url.backend.is_listener(**l))?;
    Some(format!(
        "{:?} is this gateway's own listener {listener}; requests routed to it would loop",
        member.spec.url
    ))
}
/// The fleet-wide model rules: either no worker declares a model (one pool of every worker,
/// nothing reads a request body) or every one does (a pool per model). A worker without models
/// in a fleet with models would be in no pool, so no request could reach it.
impl Config {
    /// Every model a `[[workers]]` or `[[discovery]]` entry declares, sorted.
    pub fn declared_models(&self) -> BTreeSet<&str> {
        let workers = self.workers.iter().map(|w| &w.models);
        let sources = self.discovery.iter().map(|s| &s.models);
        workers
            .chain(sources)
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// The fleet-wide model rules: when any entry declares models, every `[[workers]]` and
    /// `[[discovery]]` entry must (the first that does not is named, with one that does), and
    /// `[routing] default_model` must be one of the declared models.
    pub fn model_problems(&self) -> Vec<FieldError> {
        let declaring = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("workers[{i}]"), &w.models))
            .chain(
                self.discovery
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (format!("discovery[{i}]"), &s.models)),
            );
        let (with, without): (Vec<_>, Vec<_>) = declaring.partition(|(_, m)| !m.is_empty());
        let mut problems = Vec::new();
        if let (Some((example, models)), Some((entry, _))) = (with.first(), without.first()) {
            problems.push(
                FieldError::new(
                    "models",
                    format!(
                        "this entry declares no model, but {example} serves {:?}: with models configured every worker names the models it serves (a worker without models would get no request)",
                        models[0]
                    ),
                )
                .within(entry),
            );
        }
        problems.extend(self.picker_model_problem());
        if let Some(default) = &self.routing.default_model {
            let declared = self.declared_models();
            if !declared.is_empty() && !declared.contains(default.as_str()) {
                problems.push(FieldError::new(
                    "routing.default_model",
                    format!(
                        "{default:?} is not a model any worker serves (declared: {declared:?})"
                    ),
                ));
            }
        }
        problems
    }

    /// The model whose pool the endpoint picker serves: `[picker] model`, else the one declared
    /// model; `None` for a fleet without models (its one pool). Fixed with the configuration, so
    /// a model added at run time never moves the picker to another pool.
    pub fn picker_model(&self) -> Option<&str> {
        if let Some(model) = &self.picker.model {
            return Some(model);
        }
        let declared = self.declared_models();
        match declared.len() {
            1 => declared.first().copied(),
            _ => None,
        }
    }

    /// `[picker] model` must be a declared model, and is required with the picker on and several
    /// models declared: each pool gets its own picker, and which one this is must not depend on
    /// how the names sort.
    fn picker_model_problem(&self) -> Option<FieldError> {
        let declared = self.declared_models();
        match &self.picker.model {
            Some(model) if declared.is_empty() => Some(FieldError::new(
                "picker.model",
                format!(
                    "{model:?}: no worker declares models, so the picker serves the whole fleet; leave it unset or declare the workers' models"
                ),
            )),
            Some(model) if !declared.contains(model.as_str()) => Some(FieldError::new(
                "picker.model",
                format!("{model:?} is not a model any worker serves (declared: {declared:?})"),
            )),
            None if self.picker.listen.is_some() && declared.len() > 1 => Some(FieldError::new(
                "picker.model",
                format!(
                    "several models are declared ({declared:?}): name the one whose pool this picker serves (one picker per pool)"
                ),
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod model_tests {
    use super::*;
    use crate::config::WorkerConfig;

    fn worker(url: &str, models: &[&str]) -> WorkerConfig {
        WorkerConfig {
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            ..WorkerConfig::from_url(url)
        }
    }

    #[test]
    fn a_fleet_with_models_names_every_workers_models() {
        let mut config = Config {
            workers: vec![
                worker("http://127.0.0.1:9001", &["llama"]),
                worker("http://127.0.0.1:9002", &[]),
            ],
            ..Config::default()
        };
        let problems = config.model_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "workers[1].models");
        assert!(
            problems[0].message.contains("workers[0] serves \"llama\""),
            "{problems:?}"
        );
        config.workers[1].models = vec!["qwen".into()];
        assert!(config.model_problems().is_empty());
        assert_eq!(
            config.declared_models().into_iter().collect::<Vec<_>>(),
            ["llama", "qwen"]
        );
        config.routing.default_model = Some("mistral".into());
        let problems = config.model_problems();
        assert_eq!(problems[0].field, "routing.default_model");
        config.routing.default_model = Some("qwen".into());
        assert!(config.model_problems().is_empty());
    }

    #[test]
    fn the_picker_names_its_pool_when_several_models_are_declared() {
        let mut config = Config {
            workers: vec![
                worker("http://127.0.0.1:9001", &["llama"]),
                worker("http://127.0.0.1:9002", &["qwen"]),
            ],
            ..Config::default()
        };
        assert!(config.model_problems().is_empty(), "no picker, no choice");
        config.picker.listen = Some("127.0.0.1:9100".parse().unwrap());
        let problems = config.model_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "picker.model");
        assert!(
            problems[0].message.contains("several models"),
            "{problems:?}"
        );
        config.picker.model = Some("mistral".into());
        assert!(config.model_problems()[0].message.contains("not a model"));
        config.picker.model = Some("qwen".into());
        assert!(config.model_problems().is_empty());
        assert_eq!(config.picker_model(), Some("qwen"));
        config.picker.model = None;
        config.workers.pop();
        assert_eq!(config.picker_model(), Some("llama"), "the one model");
        config.workers[0].models.clear();
        assert_eq!(config.picker_model(), None, "no models: the one pool");
        config.picker.model = Some("llama".into());
        assert!(
            config.model_problems()[0]
                .message
                .contains("no worker declares")
        );
    }
}
