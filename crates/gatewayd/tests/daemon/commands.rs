//! `gatewayd reload`, the connection cap's log lines, `gatewayd envoy-config`, and the one-shot
//! subcommands with their output's reader gone.

use std::path::Path;
use std::time::Duration;

use super::*;

// ---------------------------------------------------------------------------------------------
// gatewayd reload

/// `gatewayd reload ARGS`: exit status, stdout, stderr.
fn reload_command(args: &[&str], config: &Path) -> (Option<i32>, String, String) {
    let output = gatewayd()
        .arg("reload")
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("GATEWAYD_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn gatewayd_reload_fails_when_the_reload_fails() {
    let token = TempFile::new("reload-test-token\n");
    let with_token = |gap: u64, skew: f64| {
        format!(
            "[server]\nadmin_token_file = \"{}\"\nshutdown_grace_ms = 1000\n\n[policy]\nkind = \"bounded_consistent_hashing\"\nmin_load_gap = {gap}\nmax_load_skew = {skew:?}\n",
            token.path().display(),
        )
    };
    let file = TempFile::new(&with_token(2, 1.5));
    let mut daemon = Daemon::with_config(file.path());
    let control = format!("http://{}", daemon.control);

    // A good file: exit 0. The token comes from the file's admin_token_file.
    std::fs::write(file.path(), with_token(3, 1.5)).unwrap();
    let (code, stdout, stderr) = reload_command(&["--control", &control], file.path());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("reloaded: policy bounded_consistent_hashing"),
        "{stdout}"
    );
    daemon.wait_for_stderr("configuration reloaded");

    // A bad file: the gateway keeps its configuration and `gatewayd reload` exits 1 saying why
    // (kill -HUP would have exited 0).
    std::fs::write(
        file.path(),
        with_token(3, 1.5).replace("max_load_skew = 1.5", "max_load_skew = 0.5"),
    )
    .unwrap();
    let (code, _, stderr) = reload_command(&["--control", &control], file.path());
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("reload failed") && stderr.contains("policy.max_load_skew"),
        "{stderr}"
    );

    // A wrong token, and nobody listening: exit 1 too.
    let wrong = TempFile::new("not-the-token\n");
    let wrong_path = wrong.path().display().to_string();
    let (code, _, stderr) = reload_command(
        &["--control", &control, "--token-file", &wrong_path],
        file.path(),
    );
    assert_eq!(code, Some(1));
    assert!(stderr.contains("401"), "{stderr}");
    let (code, _, stderr) = reload_command(&["--control", "http://127.0.0.1:9"], file.path());
    assert_eq!(code, Some(1));
    assert!(stderr.contains("cannot reach"), "{stderr}");

    daemon.signal("TERM");
    assert!(daemon.wait().success());
}

#[test]
fn connections_refused_at_the_cap_are_logged_without_flooding() {
    let file = TempFile::new(&format!(
        "{}\nmax_connections = 1\n",
        daemon_config(2, 1.5, &[]).trim_end()
    ));
    let mut daemon = Daemon::with_config(file.path());
    // One connection holds the only slot (it sends nothing); the next ones are refused with a
    // raw 503 that no request line records.
    let _held = std::net::TcpStream::connect(&daemon.data).unwrap();
    let mut refused = Vec::new();
    for _ in 0..3 {
        use std::io::Read;
        let mut stream = std::net::TcpStream::connect(&daemon.data).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        refused.push(answer);
    }
    assert!(
        refused.iter().all(|a| a.starts_with("HTTP/1.1 503")),
        "{refused:?}"
    );
    let line = daemon.wait_for_stderr("connections refused at max_connections");
    assert!(line.contains("max_connections=1"), "{line}");
    daemon.signal("TERM");
    assert!(daemon.wait().success());
    // Three refusals within a second: one line, not three.
    let more = daemon
        .stderr
        .try_iter()
        .filter(|l| l.contains("connections refused at max_connections"))
        .count();
    assert_eq!(more, 0, "one line per second at most");
}

#[test]
fn envoy_config_takes_the_file_refuses_unaddressable_workers_and_warns_about_discovery() {
    let envoy_config = |file: &TempFile| {
        let mut command = gatewayd();
        command.args([
            "envoy-config",
            "--listen",
            "127.0.0.1:10000",
            "--picker",
            "127.0.0.1:9002",
        ]);
        command.arg("--config").arg(file.path());
        command.output().unwrap()
    };
    let named = TempFile::new(
        "[[workers]]\nurl = \"http://127.0.0.1:8101\"\n[[workers]]\nname = \"gpu-1\"\nurl = \"http://gpu-1.internal:8000\"\n",
    );
    let out = envoy_config(&named);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("workers[1].url: worker gpu-1"), "{stderr}");
    assert!(out.stdout.is_empty());

    let discovered = TempFile::new(
        "[picker]\nfallbacks = 3\n[[workers]]\nurl = \"http://127.0.0.1:8101\"\n[[discovery]]\ndns = \"_http._tcp.llm.example\"\n",
    );
    let out = envoy_config(&discovered);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("_http._tcp.llm.example"), "{stderr}");
    assert!(stderr.contains("not in the generated cluster"), "{stderr}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(yaml.contains("socket_address: { address: \"127.0.0.1\", port_value: 8101 }"));
    assert!(
        yaml.contains("num_retries: 3"),
        "[picker] fallbacks sets Envoy's retries"
    );

    // Two models: the picker serves one pool, named, and Envoy's cluster holds its workers only.
    let two_models = "[[workers]]\nurl = \"http://127.0.0.1:8101\"\nmodels = [\"llama\"]\n\
                      [[workers]]\nurl = \"http://127.0.0.1:8102\"\nmodels = [\"qwen\"]\n\
                      [[workers]]\nurl = \"http://127.0.0.1:8103\"\nmodels = [\"llama\", \"qwen\"]\n";
    let unnamed = TempFile::new(two_models);
    let out = envoy_config(&unnamed);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("picker.model: several models"), "{stderr}");
    let on_qwen = TempFile::new(&format!("[picker]\nmodel = \"qwen\"\n{two_models}"));
    let out = envoy_config(&on_qwen);
    assert!(out.status.success(), "{out:?}");
    let yaml = String::from_utf8(out.stdout).unwrap();
    let endpoint = |port: u16| format!("address: \"127.0.0.1\", port_value: {port} }}");
    assert!(
        !yaml.contains(&endpoint(8101)),
        "a llama-only worker: {yaml}"
    );
    assert!(yaml.contains(&endpoint(8102)) && yaml.contains(&endpoint(8103)));
}

// ---------------------------------------------------------------------------------------------
// One-shot subcommands whose stdout's reader is gone

/// Runs `command` with stdout a pipe whose reader is already closed (`gatewayd explain … | head
/// -1` once `head` has exited): every write to it fails with a broken pipe.
fn with_stdout_closed(mut command: Command, stdin: &str) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("gatewayd runs");
    // The command may exit before reading its input: a failed write here is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

#[test]
fn one_shot_subcommands_stop_cleanly_when_stdout_is_closed() {
    let config = TempFile::new("[[workers]]\nurl = \"http://127.0.0.1:8101\"\n");
    let scenario = r#"{"workers":["http://a:1","http://b:1"],"routing_key":"k"}"#;
    let cases: Vec<(&str, Command, String)> = vec![
        (
            "explain",
            {
                let mut c = gatewayd();
                c.args([
                    "explain",
                    "--worker",
                    "http://a:1",
                    "--worker",
                    "http://b:1",
                ])
                .args(["--routing-key", "k"]);
                c
            },
            String::new(),
        ),
        (
            "explain --batch",
            {
                let mut c = gatewayd();
                c.args(["explain", "--batch"]);
                c
            },
            format!("{scenario}\n").repeat(1000),
        ),
        (
            "envoy-config",
            {
                let mut c = gatewayd();
                c.args([
                    "envoy-config",
                    "--listen",
                    "127.0.0.1:10000",
                    "--picker",
                    "127.0.0.1:9002",
                ])
                .arg("--config")
                .arg(config.path());
                c
            },
            String::new(),
        ),
        (
            "check-config",
            {
                let mut c = gatewayd();
                c.arg("check-config").arg(config.path());
                c
            },
            String::new(),
        ),
    ];
    for (name, command, stdin) in cases {
        let output = with_stdout_closed(command, &stdin);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.is_empty(),
            "{name}: a closed reader is no error to report: {stderr}"
        );
    }
}
