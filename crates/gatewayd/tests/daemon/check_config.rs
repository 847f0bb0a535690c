//! `gatewayd check-config`: every shipped file accepted, bad files refused naming the field or
//! line, credentials never printed, every start-up check run.

use std::path::Path;

use super::*;

#[test]
fn check_config_accepts_every_shipped_file() {
    for name in ["gatewayd.toml", "llama-cpp.toml", "demo.toml"] {
        let file = workspace().join("config").join(name);
        let output = gatewayd().arg("check-config").arg(&file).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("ok"), "{stdout}");
        // The summary names the load signal, the setting that differs between replicas most.
        assert!(stdout.contains(", load_source "), "{stdout}");
    }
}

#[test]
fn check_config_rejects_bad_files_naming_the_field_or_line() {
    let cases = [
        ("[policy]\nmax_load_skew = 0.5\n", "policy.max_load_skew"),
        ("[policy]\nmax_load_skew = nan\n", "policy.max_load_skew"),
        ("[policy]\nmin_load_gap = -1\n", "min_load_gap"),
        ("[policy]\nkind = \"strict\"\n", "kind"),
        ("[server]\nlisten = \"nowhere\"\n", "listen"),
        ("[health]\ninterval_ms = 0\n", "health.interval_ms"),
        ("[log]\nlevels = \"debug\"\n", "levels"),
        ("[[workers]]\nurl = \"not a url\"\n", "workers[0].url"),
        (
            "[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nname = \"a\"\nurl = \"http://127.0.0.1:2\"\n",
            "workers[1].name",
        ),
        ("[server]\nlisten = \"127.0.0.1:1\"\n\n[policy\n", "line 4"),
        (
            "[[workers]]\nurl = \"http://127.0.0.1:0\"\n",
            "workers[0].url",
        ),
        (
            "[[workers]]\nurl = \"http://127.0.0.1:99999\"\n",
            "workers[0].url",
        ),
        (
            "[[workers]]\nurl = \"http://127.0.0.1:1\"\n[[workers]]\nurl = \"HTTP://LOCALHOST:1/\"\n",
            "workers[1].url",
        ),
    ];
    for (text, needle) in cases {
        let file = TempFile::new(text);
        let output = gatewayd()
            .arg("check-config")
            .arg(file.path())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{text}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{text}: {stderr:?} lacks {needle}");
        assert!(
            stderr.contains(&*file.path().to_string_lossy()),
            "{stderr:?} names the file"
        );
    }
    let output = gatewayd()
        .args(["check-config", "/nonexistent/bch/gatewayd.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}

/// A worker URL with credentials is refused by the file check and by `--worker`, naming the field
/// and never printing the password.
#[test]
fn credentials_in_worker_urls_are_refused_without_being_printed() {
    let url = "http://operator:pa55-w0rd@127.0.0.1:1";
    let file = TempFile::new(&format!("[[workers]]\nurl = \"{url}\"\n"));
    let checked = gatewayd()
        .arg("check-config")
        .arg(file.path())
        .output()
        .unwrap();
    let served = gatewayd()
        .args(["--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0"])
        .args(["--worker", url])
        .output()
        .unwrap();
    for output in [checked, served] {
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("workers[0].url"), "{stderr}");
        assert!(stderr.contains("credentials"), "{stderr}");
        assert!(!stderr.contains("pa55-w0rd"), "{stderr}");
        assert!(
            output.stdout.is_empty() || !String::from_utf8_lossy(&output.stdout).contains("pa55")
        );
    }
}

/// `check-config FILE`: exit status, stdout, stderr.
fn check(file: &Path) -> (Option<i32>, String, String) {
    let output = gatewayd().arg("check-config").arg(file).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_config_runs_every_start_up_check_and_reports_every_problem() {
    // Three problems at once: a bad value, listeners on one port, an open control plane beyond
    // loopback. Each used to pass check-config (or all but the first went unreported) and then
    // refused to start.
    let file = TempFile::new(
        "[server]\nlisten = \"127.0.0.1:9100\"\ncontrol_listen = \"0.0.0.0:9100\"\n\n[policy]\nmax_load_skew = 0.5\n\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n",
    );
    let (code, _, stderr) = check(file.path());
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(errors[0].contains("policy.max_load_skew"), "{stderr}");
    assert!(
        errors[1].contains("server.control_listen") && errors[1].contains("9100"),
        "{stderr}"
    );
    assert!(errors[2].contains("without a token"), "{stderr}");
    // The daemon refuses the same file with the same problems.
    let output = gatewayd()
        .arg("--config")
        .arg(file.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let started = String::from_utf8_lossy(&output.stderr);
    assert!(started.contains("3 problems"), "{started}");
    for error in &errors {
        assert!(
            started.contains(error.trim_start_matches("error: ")),
            "{started}"
        );
    }

    // Token files: missing, empty.
    let empty = TempFile::new("  \n");
    for (token, needle) in [
        (
            "/nonexistent/bch/admin.token".to_owned(),
            "cannot read admin_token_file",
        ),
        (empty.path().display().to_string(), "is empty"),
    ] {
        let file = TempFile::new(&format!(
            "[server]\nadmin_token_file = \"{token}\"\n\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n"
        ));
        let (code, _, stderr) = check(file.path());
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }

    // A duplicate name the user never wrote is reported under the URLs they did write.
    let file = TempFile::new(
        "[[workers]]\nurl = \"http://h:8000\"\n\n[[workers]]\nurl = \"http://h:8000/\"\n",
    );
    let (code, _, stderr) = check(file.path());
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("workers[1].url: \"http://h:8000/\" gets the default name \"h:8000\", already the name of workers[0] (\"http://h:8000\")"),
        "{stderr}"
    );

    // No workers: fine, but said.
    let file = TempFile::new("[policy]\nmin_load_gap = 3\n");
    let (code, stdout, stderr) = check(file.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("ok (0 workers"), "{stdout}");
    assert!(
        stderr.starts_with("warning: no workers configured"),
        "{stderr}"
    );
}

/// A missing or empty metrics token file is reported under its own key, not the admin token's.
#[test]
fn check_config_names_the_metrics_token_file() {
    let admin = TempFile::new("s3cret-admin-token\n");
    let empty = TempFile::new("  \n");
    let missing = "/nonexistent/bch/metrics.token".to_owned();
    for (metrics, needle) in [
        (
            missing.clone(),
            format!("cannot read metrics_token_file {missing}"),
        ),
        (
            empty.path().display().to_string(),
            format!("metrics_token_file {} is empty", empty.path().display()),
        ),
    ] {
        let file = TempFile::new(&format!(
            "[server]\nadmin_token_file = \"{}\"\nmetrics_token_file = \"{metrics}\"\n\n[[workers]]\nurl = \"http://127.0.0.1:1\"\n",
            admin.path().display()
        ));
        let (code, _, stderr) = check(file.path());
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(&needle), "{stderr:?} lacks {needle:?}");
        assert!(!stderr.contains("admin_token_file"), "{stderr}");
    }
}

/// In picker mode every worker that is no `http(s)://IP:PORT` is reported, each under its own index
/// in the file (an invalid worker before them does not shift the index).
#[test]
fn check_config_reports_every_bad_worker_in_picker_mode() {
    let file = TempFile::new(
        "[picker]\nlisten = \"127.0.0.1:9002\"\n\n\
         [[workers]]\nurl = \"not a url\"\n\n\
         [[workers]]\nname = \"gpu-1\"\nurl = \"http://gpu-1.internal:8000\"\n\n\
         [[workers]]\nurl = \"http://127.0.0.1:8102\"\n\n\
         [[workers]]\nname = \"gpu-3\"\nurl = \"http://127.0.0.1\"\n",
    );
    let (code, _, stderr) = check(file.path());
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(errors[0].contains("workers[0].url"), "{stderr}");
    assert!(
        errors[1].contains("workers[1].url: worker gpu-1:"),
        "{stderr}"
    );
    assert!(
        errors[2].contains("workers[3].url: worker gpu-3:"),
        "{stderr}"
    );
    assert!(stderr.contains("3 problem(s)"), "{stderr}");
}
