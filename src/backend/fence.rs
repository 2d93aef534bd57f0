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
    fn different_keys_never_share_a_counter() {
        assert_ne!(fence_key("a"), fence_key("{a}"));
        assert_ne!(fence_key("t:{a}"), fence_key("{t:{a}}"));
    }
}
