//! The prompt text of a storm, derived from its seed: a long shared prefix followed by a short suffix
//! of each request's own. The prefix belongs to a routing key (every group of the key shares it, like
//! the turns of a long-lived session) or to a group (every group brings a fresh one, like the n
//! samples of one prompt in RL rollouts): [`PrefixScope`].

use serde::{Deserialize, Serialize};

use crate::sim::{filler_text, fnv1a_extend};

/// Who shares a storm's prompt prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixScope {
    /// One prefix per routing key, shared by all of the key's groups: once a worker has it, every
    /// later group of the key hits it (long-lived sessions). The default.
    #[default]
    Key,
    /// A fresh prefix per group, shared only by its siblings: a spilled sibling always pays a cold
    /// prefill on the second worker (the original bounded-policy A/B's shape).
    Group,
}

impl std::str::FromStr for PrefixScope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "key" => Ok(PrefixScope::Key),
            "group" => Ok(PrefixScope::Group),
            other => Err(format!("prefix scope must be key or group, got {other:?}")),
        }
    }
}

/// Prompt text for each key and request.
pub(super) struct Prompts {
    seed: u64,
    scope: PrefixScope,
    prefix_tokens: usize,
    /// Key scope: the prefix of each key, made once.
    key_prefixes: Vec<String>,
    suffix_tokens: usize,
}

impl Prompts {
    /// Prompts for `keys` keys: `prefix_tokens` tokens shared as `scope` says, then `suffix_tokens`
    /// per request.
    pub(super) fn new(
        seed: u64,
        keys: usize,
        scope: PrefixScope,
        prefix_tokens: usize,
        suffix_tokens: usize,
    ) -> Self {
        let key_prefixes = match scope {
            PrefixScope::Key => (0..keys)
                .map(|k| filler_text(mix(seed, &[k as u64]), prefix_tokens))
                .collect(),
            PrefixScope::Group => Vec::new(),
        };
        Self {
            seed,
            scope,
            prefix_tokens,
            key_prefixes,
            suffix_tokens,
        }
    }

    /// The prompts of the `siblings` requests of group `group`, which uses key index `key`.
    pub(super) fn group(&self, key: usize, group: usize, siblings: usize) -> Vec<String> {
        let group_prefix;
        let prefix = match self.scope {
            PrefixScope::Key => &self.key_prefixes[key],
            PrefixScope::Group => {
                // `u64::MAX - 1` keeps group prefixes apart from key prefixes and suffixes.
                group_prefix = filler_text(
                    mix(self.seed, &[u64::MAX - 1, group as u64]),
                    self.prefix_tokens,
                );
                &group_prefix
            }
        };
        (0..siblings)
            .map(|sibling| {
                let suffix = filler_text(
                    mix(self.seed, &[u64::MAX, group as u64, sibling as u64]),
                    self.suffix_tokens,
                );
                format!("{prefix}\n{suffix}")
            })
            .collect()
    }
}

/// A seed for one piece of text; `u64::MAX` in the parts keeps suffix seeds apart from prefix seeds.
pub(super) fn mix(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(
        fnv1a_extend(0xcbf2_9ce4_8422_2325, &seed.to_le_bytes()),
        |h, p| fnv1a_extend(h, &p.to_le_bytes()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_scope_shares_a_prefix_across_groups_and_group_scope_does_not() {
        let prefix = |p: &str| p.split('\n').next().unwrap().to_owned();
        let keyed = Prompts::new(7, 2, PrefixScope::Key, 20, 4);
        let (a, b) = (keyed.group(0, 0, 2), keyed.group(0, 2, 2));
        assert_eq!(prefix(&a[0]), prefix(&b[1]));
        assert_ne!(a[0], a[1], "siblings differ in their suffix");
        assert_ne!(prefix(&a[0]), prefix(&keyed.group(1, 1, 1)[0]));

        let grouped = Prompts::new(7, 2, PrefixScope::Group, 20, 4);
        let (a, b) = (grouped.group(0, 0, 3), grouped.group(0, 2, 3));
        assert_eq!(
            prefix(&a[0]),
            prefix(&a[2]),
            "siblings share the group's prefix"
        );
        assert_ne!(
            prefix(&a[0]),
            prefix(&b[0]),
            "the next group of the key brings a new one"
        );
        assert_ne!(
            prefix(&a[0]),
            prefix(&Prompts::new(8, 2, PrefixScope::Group, 20, 4).group(0, 0, 1)[0])
        );
        assert_eq!("group".parse::<PrefixScope>(), Ok(PrefixScope::Group));
        assert!("session".parse::<PrefixScope>().is_err());
    }
}
