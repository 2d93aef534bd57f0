//! Redis Cluster hash slots, computed here so that keys in different slots are refused
//! before any round trip.

use std::collections::BTreeMap;

/// How many hash slots a cluster has.
const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag, or else of the whole key.
pub(crate) fn slot(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16(hashed.as_bytes()) % SLOTS
}

/// The text between the first `{` and the next `}`, when not empty: the part of the key
/// Redis Cluster hashes.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// `keys` grouped by slot, in ascending slot order, each group in the order given.
pub(crate) fn by_slot(keys: &[String]) -> Vec<(u16, Vec<String>)> {
    let mut groups: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for key in keys {
        groups.entry(slot(key)).or_default().push(key.clone());
    }
    groups.into_iter().collect()
}

/// CRC-16/XMODEM (polynomial 0x1021, no reflection), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_cluster_specification() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_ne!(
            slot("foo{}{bar}"),
            slot("bar"),
            "an empty tag: the whole key is hashed"
        );
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
    }

    #[test]
    fn hash_tag_is_the_first_non_empty_braces() {
        assert_eq!(hash_tag("{a}:b"), Some("a"));
        assert_eq!(hash_tag("x{}y{z}"), None);
        assert_eq!(hash_tag("a{b"), None);
        assert_eq!(hash_tag("}{a}"), Some("a"));
    }

    #[test]
    fn keys_are_grouped_by_slot_in_slot_order() {
        let keys: Vec<String> = ["{b}2", "{a}1", "{b}1", "{a}2"].map(String::from).into();
        let groups = by_slot(&keys);
        let mut expected = vec![
            (slot("a"), vec!["{a}1".to_string(), "{a}2".to_string()]),
            (slot("b"), vec!["{b}2".to_string(), "{b}1".to_string()]),
        ];
        expected.sort_by_key(|(slot, _)| *slot);
        assert_eq!(groups, expected);
    }
}
