use crate::{Error, Result};

/// Bytes of OS randomness in a token: 128 bits, so two guards never share one.
const TOKEN_BYTES: usize = 16;

/// Characters in a random token (hex).
const RANDOM_TOKEN_LEN: usize = 2 * TOKEN_BYTES;

/// A fresh owner token: 16 bytes from the OS generator, hex-encoded (32 characters).
pub(crate) fn random_token() -> Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(Error::Random)?;
    Ok(hex::encode(bytes))
}

/// What every key of a lock stores before the metadata, naming its owner. It is
/// self-delimiting, so that no owner's part can read as the start of another's value (the
/// acquire script re-obtains when a value starts with ours):
/// - a random token, or any token of exactly 32 lowercase hex digits (say one given back
///   from [`LockGuard::token`](crate::LockGuard::token)), as it is: its length is fixed;
/// - any other fixed token as its length in bytes, `:`, then the token (`8:worker-1`).
///   The `:` comes within the first 32 characters, where a random token has only hex.
pub(crate) fn owner_part(token: &str) -> String {
    if is_random_form(token) {
        token.to_owned()
    } else {
        format!("{}:{token}", token.len())
    }
}

/// The metadata in a stored `value`: what follows its owner part (see [`owner_part`]).
/// A random-form token has no `:` in its first 32 characters, so a value that starts with
/// a few digits and a `:` is in the `<length>:<token>` form.
pub(crate) fn metadata_of(value: &str) -> &str {
    let length_form = value.split_once(':').and_then(|(len, rest)| {
        let digits = !len.is_empty() && len.len() <= 20 && len.bytes().all(|b| b.is_ascii_digit());
        digits
            .then(|| len.parse::<usize>().ok())
            .flatten()
            .and_then(|len| rest.get(len..))
    });
    length_form
        .or_else(|| value.get(RANDOM_TOKEN_LEN..))
        .unwrap_or_default()
}

/// Whether `token` has the form of one `random_token` makes (32 lower-case hex digits).
pub(crate) fn is_random_form(token: &str) -> bool {
    token.len() == RANDOM_TOKEN_LEN
        && token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn no_owner_part_is_the_start_of_another() {
        let random = random_token().unwrap();
        let tokens = [
            "worker-1",
            "worker-10",
            "1",
            "1:",
            "8:worker-1",
            "abc",
            "ABC",
            random.as_str(),
            &random[..31],
            "Ünïcode",
            "a:b:c",
        ];
        for a in tokens {
            for b in tokens {
                let (a_part, b_part) = (owner_part(a), owner_part(b));
                // Another owner's whole value: its part and any metadata after it.
                let b_value = format!("{b_part}meta");
                assert_eq!(b_value.starts_with(&a_part), a == b, "{a:?} vs {b:?}");
            }
        }
        assert_eq!(owner_part("worker-1"), "8:worker-1");
        assert_eq!(
            owner_part(&random),
            random,
            "random tokens are stored as they are"
        );
    }

    #[test]
    fn metadata_is_what_follows_the_owner_part() {
        let random = random_token().unwrap();
        for token in [
            "worker-1",
            "1",
            "a:b",
            "12",
            random.as_str(),
            &"1".repeat(32),
        ] {
            for metadata in ["", "host:7", ":", "9:x"] {
                let value = owner_part(token) + metadata;
                assert_eq!(metadata_of(&value), metadata, "{value:?}");
            }
        }
    }

    #[test]
    fn tokens_are_32_hex_chars_and_distinct() {
        let tokens: HashSet<String> = (0..10_000).map(|_| random_token().unwrap()).collect();
        assert_eq!(tokens.len(), 10_000);
        for token in &tokens {
            assert_eq!(token.len(), RANDOM_TOKEN_LEN);
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
    }
}
