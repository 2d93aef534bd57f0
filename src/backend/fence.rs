//! Where each key's fencing counter lives.
//!
//! A counter must share its lock key's Redis Cluster hash slot, so that one script can
//! update both. A key's slot is the hash of its hash tag (the text between its first `{`
//! and the next `}`, when not empty), or else of the whole key.

use super::slot::hash_tag;

/// The counter of `key`: `redguard:fence:{<key>}` (the whole key becomes the hash tag),
/// or `redguard:fence:t:<key>` when the key has a hash tag of its own (the counter then
/// has the same tag). The two forms never collide. A key with a `}` but no tag cannot be
/// wrapped either; its counter is in another slot, which matters only on a cluster.
pub(crate) fn fence_key(key: &str) -> String {
    if hash_tag(key).is_some() || key.contains('}') {
        format!("redguard:fence:t:{key}")
    } else {
        format!("redguard:fence:{{{key}}}")
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
    }

    #[test]
    fn different_keys_never_share_a_counter() {
        assert_ne!(fence_key("a"), fence_key("{a}"));
        assert_ne!(fence_key("t:{a}"), fence_key("{t:{a}}"));
    }
}
