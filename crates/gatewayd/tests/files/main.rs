//! The files shipped in the workspace: the configurations in `config/`, and the Prometheus rules
//! and Grafana dashboard in `deploy/`, checked against `Config` and a running gateway.

#[path = "../common/mod.rs"]
mod common;

mod config_files;
mod deploy_files;
