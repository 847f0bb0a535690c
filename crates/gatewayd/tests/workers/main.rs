//! How the gateway learns about its workers: DNS discovery, health probes before the first
//! request, discovery health, and the load scraper (its failures and its connections).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/dnsmasq.rs"]
mod dnsmasq;

mod counting_fleet;
mod discovery;
mod discovery_health;
mod discovery_scale;
mod engine_saturation;
mod health;
mod https;
mod load_scrape;
mod probe_pacing;
mod scrape_connections;
mod scrape_pacing;
