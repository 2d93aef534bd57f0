//! Where each key's fencing counter and queue live.
//!
//! A counter (and a queue) must share its lock key's Redis Cluster hash slot, so that one
//! script can update both. A key's slot is the hash of its hash tag (the text between its first `{`
//! and the next `}`, when not empty), or else of the whole key.

use super::slot::hash_tag;

/// The counter of `key`: `redguard:fence:{<key>}` (the whole key becomes the hash tag),
/// or `redguard:fence:t:<key>` when the key has a hash tag of its own (the counter then
/// has the same tag). The two forms never collide. A key with a `}` but no tag cannot be
/// wrapped either; its counter is in another slot, which matters only on a cluster.
pub(crate) fn fence_key(key: &str) -> String {
    companion("fence", key)
}

/// The keys of the election `name`, each after the locker's `prefix`, all in one Cluster
/// hash slot: its lock (`redguard:election:{<name>}`, or `redguard:election:t:<name>` for a
/// name with a hash tag of its own), the lock's fencing counter (the term counter), and
/// the value its leader proclaimed last (see `lua/election/leader.lua`).
pub(crate) fn election_keys(prefix: &str, name: &str) -> [String; 3] {
    let lock = format!("{prefix}{}", companion("election", name));
    let counter = format!("{prefix}{}", fence_key(&lock));
    let proclaimed = format!("{prefix}{}", companion("proclaimed", &lock));
    [lock, counter, proclaimed]
}

/// Where [`fenced_set`](crate::Leadership::fenced_set) records the largest fencing token
/// that wrote `key` (a Redis key, after the locker's `prefix`): beside it, in its slot.
pub(crate) fn fenced_record(prefix: &str, key: &str) -> String {
    format!("{prefix}{}", companion("fenced", key))
}

/// `redguard:<role>:{<key>}`, or `redguard:<role>:t:<key>` (see [`fence_key`]).
fn companion(role: &str, key: &str) -> String {
    if hash_tag(key).is_some() || key.contains('}') {
        format!("redguard:{role}:t:{key}")
    } else {
        format!("redguard:{role}:{{{key}}}")
    }
}

/// The keys a script with the server's queue gets after the hold's own `keys`: each key's
/// queue, then each one's expiries, tickets and fencing counter (see
/// `lua/queue/queue.lua`), each after the locker's `prefix`.
pub(crate) fn queue_keys(prefix: &str, keys: &[String]) -> Vec<String> {
    ["queue", "alive", "ticket", "fence"]
        .iter()
        .flat_map(|role| {
            keys.iter()
                .map(move |key| format!("{prefix}{}", companion(role, key)))
        })
        .collect()
}

/// An entry's keys for its renewal (see `lua/refresh.lua`): the keys, then each one's
/// queue, expiries and tickets.
pub(crate) fn entry_keys(prefix: &str, keys: &[String]) -> Vec<String> {
    let mut all = keys.to_vec();
    all.extend(queue_keys(prefix, keys));
    all.truncate(4 * keys.len());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keeps_the_keys_hash_tag() {
        assert_eq!(fence_key("{user42}:a"), "redguard:fence:t:{user42}:a");
        assert_eq!(fence_key("job:7"), "redguard:fence:{job:7}");
        assert_eq!(fence_key("{}x"), "redguard:fence:t:{}x");
        assert_eq!(fence_key("ключ"), "redguard:fence:{ключ}");
    }

    #[test]
    fn a_queue_shares_its_keys_slot() {
        let keys = ["{user42}:a".to_string(), "job".to_string()];
        let all = queue_keys("p:", &keys);
        assert_eq!(all.len(), 8);
        assert_eq!(all[0], "p:redguard:queue:t:{user42}:a");
        assert_eq!(all[3], "p:redguard:alive:{job}");
        assert_eq!(all[7], format!("p:{}", fence_key("job")));
        assert_eq!(entry_keys("p:", &keys)[2..], all[..6]);
    }

    #[test]
    fn an_elections_keys_share_its_slot() {
        use crate::backend::slot;
        for (prefix, name) in [("", "scheduler"), ("p:", "{tag}:x"), ("app:", "a}b")] {
            let keys = election_keys(prefix, name);
            assert!(keys.iter().all(|key| key.starts_with(prefix)), "{keys:?}");
            if !name.contains('}') || name.starts_with('{') {
                let first = slot(&keys[0]);
                assert!(keys.iter().all(|key| slot(key) == first), "{keys:?}");
            }
        }
        assert_eq!(election_keys("", "s")[0], "redguard:election:{s}");
        assert_eq!(fenced_record("p:", "p:jobs"), "p:redguard:fenced:{p:jobs}");
    }

    #[test]
    fn different_keys_never_share_a_counter() {
        assert_ne!(fence_key("a"), fence_key("{a}"));
        assert_ne!(fence_key("t:{a}"), fence_key("{t:{a}}"));
    }
}
