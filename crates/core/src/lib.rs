//! # bch-core
//!
//! The pure heart of bch: the consistent-hash [`ring`], [`routing_key`] extraction, the routing
//! [`policy`] with its bounded spill rule, the [`decide`] function, [`load`] accounting, the
//! [`fleet_aggregates`] a decision reads in O(1), the fleet-wide load formula of [`fleet_load`],
//! the [`request_body`] scanner that finds a JSON body's `model` and `rid` as the body arrives,
//! the atomically swapped routing snapshot in
//! [`router`], the offline [`explain`] what-if, the [`telemetry`] wire types shared by gatewayd
//! and bch-tui, the [`recording`] format of recorded telemetry, and the [`token`] file format
//! every binary reads.
//!
//! No I/O and no async runtime: everything here is deterministic given its inputs and is tested with
//! unit, property and golden-vector tests (`tests/fixtures/*.json`, computed by an independent
//! implementation of SGLang Model Gateway's placement).
//!
//! ```
//! use bch_core::policy::{Branch, PolicySettings};
//! use bch_core::router::{Router, WorkerSource, WorkerSpec};
//! use bch_core::routing_key::{ExplicitKey, RoutingKey};
//!
//! let workers = ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
//!     .iter()
//!     .enumerate()
//!     .map(|(i, url)| WorkerSpec { name: format!("w{i}"), url: url.to_string(), ring_id: None, source: WorkerSource::Static, max_in_flight: None, models: Vec::new() })
//!     .collect();
//! let router = Router::new(workers, PolicySettings::default()).unwrap();
//! let key = RoutingKey::Explicit(ExplicitKey::parse(b"session-a").unwrap());
//! // Eight same-key requests held in flight on two idle workers land 6:2 (docs/policy.md, "The 6:2 burst").
//! let held: Vec<_> = (0..8).map(|_| router.route(&key)).collect();
//! let on = |w: usize| held.iter().filter(|r| r.decision.worker == Some(w)).count();
//! assert_eq!((on(0), on(1)), (2, 6));
//! assert_eq!(held[0].decision.branch, Branch::ExplicitRoutingKeyHit);
//! drop(held);
//! assert!(router.table().workers().iter().all(|w| w.stats.active() == 0));
//! ```
#![forbid(unsafe_code)]

pub mod admission;
pub mod decide;
pub mod explain;
pub mod fleet_aggregates;
pub mod fleet_load;
pub mod generation_cache;
pub mod load;
pub mod policy;
pub mod recording;
pub mod request_body;
pub mod ring;
mod ring_points;
pub mod router;
pub mod routing_key;
pub mod telemetry;
pub mod token;
