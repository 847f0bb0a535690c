//! What a gateway takes from the machine before it builds anything: the threads a ring build may
//! hash on, and the open-file limit. Both are process-wide, so they are set here, at the
//! composition root, and nowhere else.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Lets ring builds hash on every thread the machine offers (a 10,000-worker ring is 1.5 million
/// BLAKE3 hashes, most of a large fleet's start-up), and raises the open-file limit.
pub(super) fn take_machine() {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    bch_core::ring::set_build_threads(threads);
    raise_open_file_limit();
}

/// Raises the soft limit on open files to the hard one, as HAProxy and Envoy do: the gateway holds
/// a socket per client connection, per upstream connection and per health probe, so the usual
/// soft limit of 1,024 is below what a large fleet needs, while the hard limit is what the
/// operator (systemd's `LimitNOFILE`, the container runtime) allows. One log line when it was
/// raised; a warning, and nothing else, when it could not be.
fn raise_open_file_limit() {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit");
            return;
        }
    };
    if soft >= hard {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => tracing::info!(
            from = soft,
            to = hard,
            "raised the open-file soft limit to the hard limit"
        ),
        Err(error) => tracing::warn!(
            %error,
            soft,
            hard,
            "cannot raise the open-file soft limit to the hard limit"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_ends_at_the_hard_one() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if soft == hard {
            // Lower it first (always allowed; other tests of this binary hold far fewer files), so
            // the test sees a raise.
            setrlimit(Resource::RLIMIT_NOFILE, hard.min(1 << 20) / 2, hard).unwrap();
        }
        raise_open_file_limit();
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
    }
}
