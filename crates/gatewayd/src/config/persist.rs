//! The configuration in force as a file: `GET /admin/config` renders it as TOML so that runtime
//! changes (thresholds set from the console, workers added over the API) can be saved before a
//! reload or restart puts the file's values back.

use super::{Config, WorkerConfig};

/// `config` as TOML, without the `pinned` workers (`--worker` flags, the demo's simulated
/// workers): they are added after the file's workers on every reload, so a file that listed them
/// too would hold duplicates and fail to load. A comment at the top says what the text is.
pub fn to_toml(config: &Config, pinned: &[WorkerConfig]) -> Result<String, toml::ser::Error> {
    let mut file = config.clone();
    file.workers
        .retain(|w| !pinned.iter().any(|p| p.url == w.url));
    let body = toml::to_string(&file)?;
    let mut text = String::from(
        "# The configuration gatewayd has in force, runtime changes included (GET /admin/config).\n\
         # Command-line flags and GATEWAYD_* variables in force are written in as values.\n",
    );
    if !pinned.is_empty() {
        text.push_str(&format!(
            "# Left out: {} worker(s) from --worker flags or the demo, added on every reload anyway.\n",
            pinned.len()
        ));
    }
    text.push('\n');
    text.push_str(&body);
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_without_the_pinned_workers() {
        let mut config = Config {
            workers: vec![
                WorkerConfig::from_url("http://a:1"),
                WorkerConfig::from_url("http://pinned:1"),
            ],
            ..Config::default()
        };
        config.policy.min_load_gap = 7;
        let text = to_toml(&config, &[WorkerConfig::from_url("http://pinned:1")]).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        back.validate().unwrap();
        assert_eq!(back.policy.min_load_gap, 7);
        assert_eq!(back.workers, vec![WorkerConfig::from_url("http://a:1")]);
        assert!(text.starts_with("# The configuration gatewayd has in force"));
    }
}
