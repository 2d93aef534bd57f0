//! Where each key's fencing counter lives.
//!
//! A counter must share its lock key's Redis Cluster hash slot, so that one script can
//! update both. A key's slot is the hash of its hash tag (the text between its first `{`
//! and the next `}`, when not empty), or else of the whole key.

/// The counter of `key`: `redguard:fence:` followed by the key when the key has a hash
/// tag (the counter then has the same tag), or by the key in braces (the whole key becomes
/// the tag). A key with a `}` but no tag cannot be wrapped; its counter is in another slot,
/// which matters only on a cluster.
pub(crate) fn fence_key(key: &str) -> String {
    if has_hash_tag(key) || key.contains('}') {
        format!("redguard:fence:{key}")
    } else {
        format!("redguard:fence:{{{key}}}")
    }
}

/// Whether `key` has a non-empty `{...}` hash tag.
fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keeps_the_keys_hash_tag() {
        assert_eq!(fence_key("{user42}:a"), "redguard:fence:{user42}:a");
        assert_eq!(fence_key("job:7"), "redguard:fence:{job:7}");
        assert_eq!(fence_key("{}x"), "redguard:fence:{}x");
        assert_eq!(fence_key("ключ"), "redguard:fence:{ключ}");
    }
}
