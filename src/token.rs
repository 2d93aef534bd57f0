use crate::{Error, Result};

/// Bytes of OS randomness in a token: 128 bits, so two guards never share one.
const TOKEN_BYTES: usize = 16;

/// Characters in a random token (hex).
pub(crate) const RANDOM_TOKEN_LEN: usize = 2 * TOKEN_BYTES;

/// A fresh owner token: 16 bytes from the OS generator, hex-encoded (32 characters).
pub(crate) fn random_token() -> Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(Error::Random)?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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
