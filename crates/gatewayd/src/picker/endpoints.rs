//! Workers as Envoy knows them: by address. The `IP:PORT` of every worker of a membership
//! generation, parsed once when the generation is first seen (never per request), and the answer's
//! endpoint list: the chosen worker, then its fallbacks.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bch_core::policy::Branch;
use bch_core::router::RoutingTable;

use crate::config::MAX_PICKER_FALLBACKS;
use crate::config::WorkerUrl;
use crate::routing::Choice;

/// One worker's address and the header value naming it.
#[derive(Debug)]
pub struct WorkerAddress {
    /// `IP:PORT`, parsed.
    pub addr: SocketAddr,
    /// The address as Envoy writes a host's address (`10.0.0.7:8000`, `[::1]:8000`).
    pub text: String,
}

/// The addresses of one membership generation, indexed like the table's workers; `None` for a
/// worker whose URL is no `http://IP:PORT` (start-up and the admin owner refuse those while the
/// picker runs, so only a table built before a picker existed could hold one).
#[derive(Debug)]
pub struct Addresses {
    generation: u64,
    workers: Vec<Option<WorkerAddress>>,
}

impl Addresses {
    fn of(table: &RoutingTable) -> Self {
        let workers = table
            .workers()
            .iter()
            .map(|worker| {
                let addr = WorkerUrl::parse(&worker.spec.url)
                    .ok()?
                    .picker_endpoint()
                    .ok()?;
                Some(WorkerAddress {
                    addr,
                    text: addr.to_string(),
                })
            })
            .collect();
        Self {
            generation: table.membership_generation(),
            workers,
        }
    }

    /// Worker `index`'s address, when it has one.
    pub fn get(&self, index: usize) -> Option<&WorkerAddress> {
        self.workers.get(index)?.as_ref()
    }

    /// The worker at `addr`, as an index into the table these addresses were built from.
    pub fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.workers
            .iter()
            .position(|w| w.as_ref().is_some_and(|w| w.addr == addr))
    }
}

/// The addresses of the latest membership generation seen, rebuilt when the generation changes.
#[derive(Default)]
pub struct AddressBook {
    current: ArcSwapOption<Addresses>,
}

impl AddressBook {
    /// The addresses of `table`'s workers: a lock-free load, and a rebuild once per membership
    /// generation. A table older than the cached one gets its own (uncached) addresses.
    pub fn for_table(&self, table: &RoutingTable) -> Arc<Addresses> {
        let generation = table.membership_generation();
        if let Some(current) = self.current.load_full() {
            if current.generation == generation {
                return current;
            }
            if current.generation > generation {
                return Arc::new(Addresses::of(table));
            }
        }
        let fresh = Arc::new(Addresses::of(table));
        self.current.store(Some(Arc::clone(&fresh)));
        fresh
    }
}

/// Writes the answer's endpoint list into `out`: the chosen worker's `IP:PORT`, then up to
/// `fallbacks` other healthy workers, comma-separated. Keyed requests fall back in ring order
/// from the key (the workers the data plane's retry would walk to); keyless ones to the least
/// loaded others; target-worker requests never move. Returns the workers listed (so the response
/// can tell a fallback Envoy was given from an endpoint it picked itself), or `None` when the
/// chosen worker has no address. Allocates nothing but `out`'s growth: the walk keeps the listed
/// workers in a fixed array.
pub fn endpoint_list(
    table: &RoutingTable,
    addresses: &Addresses,
    choice: &Choice,
    fallbacks: usize,
    out: &mut String,
) -> Option<Listed> {
    let chosen = addresses.get(choice.worker)?;
    out.push_str(&chosen.text);
    let healthy_others = table
        .health()
        .iter()
        .enumerate()
        .filter(|(w, healthy)| **healthy && *w != choice.worker && addresses.get(*w).is_some())
        .count();
    let wanted = fallbacks.min(MAX_PICKER_FALLBACKS).min(healthy_others);
    let mut listed = Listed::new(choice.worker);
    if wanted == 0 || choice.branch == Branch::TargetWorkerHit {
        return Some(listed);
    }
    let health = table.health();
    match choice.position {
        Some(position) => {
            for worker in table.ring().points_from(position) {
                if health[worker] {
                    listed.add(worker, addresses, out);
                    if listed.fallbacks() == wanted {
                        break;
                    }
                }
            }
        }
        None => {
            while listed.fallbacks() < wanted {
                let next = (0..table.workers().len())
                    .filter(|w| health[*w] && !listed.contains(*w) && addresses.get(*w).is_some())
                    .min_by_key(|w| table.workers()[*w].stats.active());
                match next {
                    Some(worker) => listed.add(worker, addresses, out),
                    None => break,
                }
            }
        }
    }
    Some(listed)
}

/// The workers of an endpoint list, chosen first, in a fixed array (no allocation per request).
#[derive(Debug, Clone, Copy)]
pub struct Listed {
    workers: [usize; MAX_PICKER_FALLBACKS + 1],
    count: usize,
}

impl Listed {
    fn new(chosen: usize) -> Self {
        Self {
            workers: [chosen; MAX_PICKER_FALLBACKS + 1],
            count: 1,
        }
    }

    /// Whether `worker` is in the list (the chosen worker or a fallback).
    pub fn contains(&self, worker: usize) -> bool {
        self.workers[..self.count].contains(&worker)
    }

    /// Fallbacks listed so far (the chosen worker is not one).
    fn fallbacks(&self) -> usize {
        self.count - 1
    }

    /// Appends `worker` to the list and to `out`, unless it is listed already, has no address or
    /// the list is full.
    fn add(&mut self, worker: usize, addresses: &Addresses, out: &mut String) {
        if self.contains(worker) || self.count == self.workers.len() {
            return;
        }
        if let Some(address) = addresses.get(worker) {
            self.workers[self.count] = worker;
            self.count += 1;
            let _ = write!(out, ",{}", address.text);
        }
    }
}
