//! Where the keys that go with a key live: a lock key's fencing counter, a semaphore's
//! stored limit (and its counter, that of its holders' key).
//!
//! Each must share its key's Redis Cluster hash slot, so that one script can update both. A key's slot is the hash of its hash tag (the text between its first `{`
//! and the next `}`, when not empty), or else of the whole key.

use super::slot::hash_tag;

/// The counter of `key`: `redguard:fence:{<key>}` (the whole key becomes the hash tag),
/// or `redguard:fence:t:<key>` when the key has a hash tag of its own (the counter then
/// has the same tag). The two forms never collide. A key with a `}` but no tag cannot be
/// wrapped either; its counter is in another slot, which matters only on a cluster.
pub(crate) fn fence_key(key: &str) -> String {
    companion("fence", key)
}

/// The stored limit of the semaphore whose holders live at `key`: `redguard:limit:{<key>}`,
/// or `redguard:limit:t:<key>`, as for [`fence_key`].
pub(crate) fn limit_key(key: &str) -> String {
    companion("limit", key)
}

fn companion(what: &str, key: &str) -> String {
    if hash_tag(key).is_some() || key.contains('}') {
        format!("redguard:{what}:t:{key}")
    } else {
        format!("redguard:{what}:{{{key}}}")
    }
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
        assert_eq!(limit_key("jobs"), "redguard:limit:{jobs}");
        assert_eq!(limit_key("{jobs}"), "redguard:limit:t:{jobs}");
    }

    #[test]
    fn different_keys_never_share_a_counter() {
        assert_ne!(fence_key("a"), fence_key("{a}"));
        assert_ne!(fence_key("t:{a}"), fence_key("{t:{a}}"));
    }
}
