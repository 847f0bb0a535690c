//! The points of a ring before it is assembled: each worker's `virtual_nodes` labels hashed to
//! positions, and the points put in ring order. This is where building a large ring spends its
//! time (10,000 workers × 150 points is 1.5 million BLAKE3 hashes and a sort), so both steps are
//! built for size: hashing can be split over threads the embedding process allows
//! ([`set_build_threads`]), and the sort is a bucket sort on the positions' top bits, which are
//! uniformly spread because they are hash outputs. Neither changes placement: the points and their
//! order are exactly those of hashing one by one and sorting by (position, ring id).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Ring position of `bytes`: BLAKE3 digest, first 8 bytes, little-endian.
pub fn hash_position(bytes: &[u8]) -> u64 {
    let digest = blake3::hash(bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// Threads a ring build may hash on; 1 (the default) hashes on the calling thread.
static BUILD_THREADS: AtomicUsize = AtomicUsize::new(1);

/// Points below which a build hashes on the calling thread whatever [`set_build_threads`] says:
/// starting a thread costs tens of microseconds, about as much as hashing a few hundred points.
const POINTS_PER_THREAD_AT_LEAST: usize = 16_384;

/// Lets every later ring build hash its points on up to `threads` threads (scoped `std` threads,
/// joined before the build returns; 0 counts as 1). Meant to be called once, by the process that
/// embeds the router, with what the machine offers (`std::thread::available_parallelism`): the
/// library itself never decides to start threads. Builds of fewer than 16,384 points per thread
/// stay on the calling thread. Placement does not depend on it.
pub fn set_build_threads(threads: usize) {
    BUILD_THREADS.store(threads.max(1), Ordering::Relaxed);
}

/// The points (position, worker index) of `ring_ids` with `virtual_nodes` points each, in worker
/// order: worker `i`'s points are `[i * virtual_nodes, (i + 1) * virtual_nodes)`, labelled
/// `<ring id>#<node>`. Indices are the ids' places in `ring_ids` (the caller checked they fit in
/// a `u32`).
pub(crate) fn hash_points<S: AsRef<str> + Sync>(
    ring_ids: &[S],
    virtual_nodes: u32,
) -> Vec<(u64, u32)> {
    let per_worker = virtual_nodes as usize;
    let mut points = vec![(0u64, 0u32); ring_ids.len() * per_worker];
    let threads = BUILD_THREADS
        .load(Ordering::Relaxed)
        .min(points.len() / POINTS_PER_THREAD_AT_LEAST)
        .max(1);
    if threads == 1 || per_worker == 0 {
        hash_range(&mut points, ring_ids, 0, virtual_nodes);
        return points;
    }
    // Whole workers per thread, so each thread writes one contiguous slice of the output.
    let workers_per_thread = ring_ids.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut rest = points.as_mut_slice();
        for (part, ids) in ring_ids.chunks(workers_per_thread).enumerate() {
            let (mine, after) = rest.split_at_mut(ids.len() * per_worker);
            rest = after;
            let first = part * workers_per_thread;
            scope.spawn(move || hash_range(mine, ids, first, virtual_nodes));
        }
    });
    points
}

/// Fills `out` with the points of `ring_ids`, the first of which has worker index `first`.
fn hash_range<S: AsRef<str>>(
    out: &mut [(u64, u32)],
    ring_ids: &[S],
    first: usize,
    virtual_nodes: u32,
) {
    let mut label = String::new();
    let per_worker = out.chunks_mut(virtual_nodes as usize);
    for (offset, (slots, id)) in per_worker.zip(ring_ids).enumerate() {
        let index = (first + offset) as u32;
        for (node, slot) in (0..virtual_nodes).zip(slots) {
            label.clear();
            label.push_str(id.as_ref());
            label.push('#');
            push_decimal(&mut label, node);
            *slot = (hash_position(label.as_bytes()), index);
        }
    }
}

/// Appends worker `index`'s `virtual_nodes` points (position, owner) to `points`, labelled
/// `<ring_id>#<i>`; `label` is scratch space reused across workers.
pub(crate) fn push_points(
    points: &mut Vec<(u64, u32)>,
    label: &mut String,
    ring_id: &str,
    index: u32,
    virtual_nodes: u32,
) {
    for node in 0..virtual_nodes {
        label.clear();
        label.push_str(ring_id);
        label.push('#');
        push_decimal(label, node);
        points.push((hash_position(label.as_bytes()), index));
    }
}

/// Appends `n` in decimal without going through `fmt` (ring builds hash millions of labels).
pub(crate) fn push_decimal(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in digits[..len].iter().rev() {
        out.push(d as char);
    }
}

/// Sorts `points` by position, equal positions by `ring_id` of their owners: the ring's order.
///
/// Large inputs are bucket-sorted in two levels on the positions' top bits, which hashes spread
/// uniformly: first into 256 buckets on the top 8 bits (256 sequential write streams, which the
/// caches take, where one scatter into a million buckets misses on nearly every write), then each
/// bucket, now small enough to stay in cache, into buckets of about four points on its next bits,
/// each sorted with the full order. Every point of a bucket shares its top bits, so sorting within
/// buckets sorts the whole; any distribution of positions comes out right, uniform ones (hashes)
/// fast. The second level is split over the threads [`set_build_threads`] allows.
pub(crate) fn sort_points<'a>(
    points: &mut Vec<(u64, u32)>,
    ring_id: impl Fn(u32) -> &'a str + Sync,
) {
    /// Below this a comparison sort is as fast and needs no second buffer.
    const BUCKET_SORT_FROM: usize = 4_096;
    if points.len() < BUCKET_SORT_FROM {
        points.sort_unstable_by(|a, b| in_ring_order(a, b, &ring_id));
        return;
    }
    let mut sorted = vec![(0u64, 0u32); points.len()];
    let starts = scatter(points, &mut sorted, 56, 8);
    let threads = BUILD_THREADS
        .load(Ordering::Relaxed)
        .min(points.len() / POINTS_PER_THREAD_AT_LEAST)
        .max(1);
    let ring_id = &ring_id;
    if threads == 1 {
        let mut scratch = Vec::new();
        for bucket in starts.windows(2) {
            sort_bucket(&mut sorted[bucket[0]..bucket[1]], &mut scratch, ring_id);
        }
    } else {
        // The 256 top-level buckets cut into consecutive runs of about one thread's share of the
        // points; `cuts` are the buckets where runs start, then the end.
        let share = points.len().div_ceil(threads);
        let mut cuts = vec![0usize];
        for bucket in 1..starts.len() - 1 {
            if starts[bucket] - starts[cuts[cuts.len() - 1]] >= share {
                cuts.push(bucket);
            }
        }
        cuts.push(starts.len() - 1);
        let starts = &starts;
        std::thread::scope(|scope| {
            let mut rest = sorted.as_mut_slice();
            for run in cuts.windows(2) {
                let (first, end) = (run[0], run[1]);
                let offset = starts[first];
                let (mine, after) = rest.split_at_mut(starts[end] - offset);
                rest = after;
                scope.spawn(move || {
                    let mut scratch = Vec::new();
                    for bucket in starts[first..=end].windows(2) {
                        let within = &mut mine[bucket[0] - offset..bucket[1] - offset];
                        sort_bucket(within, &mut scratch, ring_id);
                    }
                });
            }
        });
    }
    *points = sorted;
}

/// The ring's order: position, then the owners' ring ids.
fn in_ring_order<'a>(
    a: &(u64, u32),
    b: &(u64, u32),
    ring_id: &impl Fn(u32) -> &'a str,
) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then_with(|| ring_id(a.1).cmp(ring_id(b.1)))
}

/// Scatters `from` into `to` (same length) by the `bits` bits of the position below `shift`
/// (`(position >> shift) & mask`), keeping the order within a bucket; returns the buckets'
/// boundaries in `to`: bucket `b` is `to[starts[b]..starts[b + 1]]`.
fn scatter(from: &[(u64, u32)], to: &mut [(u64, u32)], shift: u32, bits: u32) -> Vec<usize> {
    let mask = (1u64 << bits) - 1;
    let bucket = |position: u64| ((position >> shift) & mask) as usize;
    let mut starts = vec![0usize; (1 << bits) + 1];
    for &(position, _) in from {
        starts[bucket(position) + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut next = starts.clone();
    for &point in from {
        let slot = &mut next[bucket(point.0)];
        to[*slot] = point;
        *slot += 1;
    }
    starts
}

/// Sorts one top-level bucket (its points share the top 8 bits): into buckets of about four
/// points on the following bits, each then sorted in ring order. `scratch` is reused.
fn sort_bucket<'a>(
    points: &mut [(u64, u32)],
    scratch: &mut Vec<(u64, u32)>,
    ring_id: &impl Fn(u32) -> &'a str,
) {
    if points.len() < 64 {
        points.sort_unstable_by(|a, b| in_ring_order(a, b, ring_id));
        return;
    }
    let bits = (points.len() / 4).ilog2().min(16);
    scratch.clear();
    scratch.extend_from_slice(points);
    let starts = scatter(scratch, points, 56 - bits, bits);
    for bucket in starts.windows(2) {
        let within = &mut points[bucket[0]..bucket[1]];
        if within.len() > 1 {
            within.sort_unstable_by(|a, b| in_ring_order(a, b, ring_id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_labels_match_format() {
        for n in [0, 7, 10, 149, 150, 9999, u32::MAX] {
            let mut s = String::new();
            push_decimal(&mut s, n);
            assert_eq!(s, n.to_string());
        }
    }

    /// The points one by one, sorted by a comparison sort: what the fast paths must equal.
    fn plain(ids: &[String], virtual_nodes: u32) -> Vec<(u64, u32)> {
        let mut points = Vec::new();
        let mut label = String::new();
        for (index, id) in ids.iter().enumerate() {
            push_points(&mut points, &mut label, id, index as u32, virtual_nodes);
        }
        points.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| ids[a.1 as usize].cmp(&ids[b.1 as usize]))
        });
        points
    }

    #[test]
    fn threaded_hashing_and_bucket_sort_equal_the_plain_build() {
        let ids: Vec<String> = (0..700)
            .map(|i| format!("http://10.0.{i}.1:8000"))
            .collect();
        let expected = plain(&ids, 150);
        for threads in [1, 2, 3, 8] {
            set_build_threads(threads);
            let mut points = hash_points(&ids, 150);
            sort_points(&mut points, |i| ids[i as usize].as_str());
            assert_eq!(points, expected, "{threads} threads");
        }
        set_build_threads(1);
    }

    #[test]
    fn bucket_sort_orders_any_distribution_with_ties_by_ring_id() {
        // Clustered positions (all in a few buckets), duplicates, and the extremes.
        let ids = ["b", "a", "c"];
        let mut points: Vec<(u64, u32)> = (0..70_000u64)
            .map(|i| (((i % 7) << 60) | ((i * 31) % 1000), (i % 3) as u32))
            .chain([(u64::MAX, 2), (u64::MAX, 1), (0, 0), (0, 1)])
            .collect();
        let mut expected = points.clone();
        expected.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| ids[a.1 as usize].cmp(ids[b.1 as usize]))
        });
        for threads in [1, 2, 5] {
            set_build_threads(threads);
            let mut sorted = points.clone();
            sort_points(&mut sorted, |i| ids[i as usize]);
            assert_eq!(sorted, expected, "{threads} threads");
        }
        set_build_threads(1);
        sort_points(&mut points, |i| ids[i as usize]);
        // Same ring id and position: equal elements, whose order cannot be told apart.
        assert_eq!(points, expected);
    }
}
