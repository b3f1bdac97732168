//! API key material: generating secrets, hashing them for storage and lookup, comparing
//! digests without timing leaks.
//!
//! A key has two names. The **secret** (`sk-qp-` + 43 base62 characters, 256 bits from the
//! operating system's CSPRNG) is shown to the operator once and then exists only on the
//! client; the store keeps its SHA-256 and its first characters (the *prefix*, to recognise a
//! key in listings). The **key id** (`key_` + 12 hex characters) is public: it appears in
//! listings, the ledger and logs, and is what an operator revokes.
//!
//! This module owns no storage and no policy (who may create keys, limits): see `store` and
//! `ops`.
//!
//! ```
//! let (secret, key_id, hash, prefix) = quipu::keys::generate_key();
//! assert!(secret.starts_with("sk-qp-") && key_id.starts_with("key_"));
//! assert_eq!(quipu::keys::hash_secret(&secret), hash);
//! assert!(secret.starts_with(&prefix));
//! ```

use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Every secret starts with this, so scanners and people can tell a Quipu key.
pub const SECRET_PREFIX: &str = "sk-qp-";
/// Random base62 characters after [`SECRET_PREFIX`]: 43 × log2(62) ≈ 256 bits.
pub const SECRET_RANDOM_CHARS: usize = 43;
/// How many leading characters of a secret are stored and listed (`sk-qp-AbC1`).
pub const DISPLAY_PREFIX_CHARS: usize = 10;
/// Hex characters of a key id after `key_` (48 bits: unique among a gateway's keys; a clash
/// is reported by the store as a conflict and the caller draws again).
pub const KEY_ID_HEX_CHARS: usize = 12;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A new key: `(secret, key_id, sha256(secret), display prefix)`.
///
/// The secret is drawn from the OS CSPRNG ([`OsRng`]); base62 characters are chosen by
/// rejection sampling so each is uniform. Panics only if the operating system cannot provide
/// randomness at all (`getrandom` failing), which no caller could recover from anyway.
pub fn generate_key() -> (String, String, [u8; 32], String) {
    let mut secret = String::with_capacity(SECRET_PREFIX.len() + SECRET_RANDOM_CHARS);
    secret.push_str(SECRET_PREFIX);
    let mut buf = [0u8; 64];
    while secret.len() < SECRET_PREFIX.len() + SECRET_RANDOM_CHARS {
        OsRng.fill_bytes(&mut buf);
        for &b in &buf {
            // 248 = 4 × 62: bytes at or above it would bias the first 8 characters.
            if b < 248 && secret.len() < SECRET_PREFIX.len() + SECRET_RANDOM_CHARS {
                secret.push(char::from(BASE62[usize::from(b % 62)]));
            }
        }
    }
    let key_id = random_id("key_", KEY_ID_HEX_CHARS);
    let hash = hash_secret(&secret);
    let prefix = secret.chars().take(DISPLAY_PREFIX_CHARS).collect();
    (secret, key_id, hash, prefix)
}

/// `prefix` followed by `hex_chars` random lowercase hex characters from the OS CSPRNG; used
/// for key ids and top-up entry ids.
pub fn random_id(prefix: &str, hex_chars: usize) -> String {
    let mut bytes = vec![0u8; hex_chars.div_ceil(2)];
    OsRng.fill_bytes(&mut bytes);
    let mut id = String::with_capacity(prefix.len() + hex_chars);
    id.push_str(prefix);
    for b in bytes {
        id.push_str(&format!("{b:02x}"));
    }
    id.truncate(prefix.len() + hex_chars);
    id
}

/// SHA-256 of a secret, as stored in `api_keys` and held in the gateway's key snapshot.
///
/// A fast, unsalted hash is the right choice here, unlike for passwords: a Quipu secret carries
/// 256 bits of CSPRNG entropy, so even with a leaked table nobody can enumerate candidate
/// secrets, however cheap each guess is. Slow salted hashes (argon2, bcrypt) exist to protect
/// low-entropy human passwords; here they would only add milliseconds to *every* request (each
/// one authenticates) and, being salted, would stop the gateway from finding a key by its hash
/// in one map lookup.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Compares two byte strings in time that depends only on their lengths, never on where they
/// differ (no early exit): for comparing secrets or digests an attacker can probe.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let len = a.len().max(b.len());
    // Different lengths are unequal, but we still walk the longer input.
    let mut diff: u8 = u8::from(a.len() != b.len());
    for i in 0..len {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn key_format() {
        let (secret, key_id, hash, prefix) = generate_key();
        assert_eq!(secret.len(), SECRET_PREFIX.len() + SECRET_RANDOM_CHARS);
        assert!(secret.starts_with(SECRET_PREFIX));
        assert!(secret[SECRET_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(key_id.len(), 4 + KEY_ID_HEX_CHARS);
        assert!(key_id.starts_with("key_"));
        assert!(key_id[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(prefix.len(), DISPLAY_PREFIX_CHARS);
        assert!(secret.starts_with(&prefix));
        assert_eq!(hash, hash_secret(&secret));
    }

    #[test]
    fn keys_are_unique_and_use_the_whole_alphabet() {
        let mut secrets = HashSet::new();
        let mut ids = HashSet::new();
        let mut seen = HashSet::new();
        for _ in 0..2000 {
            let (secret, key_id, _, _) = generate_key();
            seen.extend(secret[SECRET_PREFIX.len()..].bytes());
            assert!(secrets.insert(secret));
            assert!(ids.insert(key_id));
        }
        // 86,000 draws: every one of the 62 characters shows up.
        assert_eq!(seen.len(), 62);
    }

    #[test]
    fn hash_is_sha256() {
        // FIPS 180-2 test vector.
        let h = hash_secret("abc");
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(hash_secret("sk-qp-a"), hash_secret("sk-qp-b"));
    }

    #[test]
    fn random_ids() {
        let id = random_id("topup_", 16);
        assert_eq!(id.len(), 6 + 16);
        assert_eq!(random_id("x", 5).len(), 6);
        assert_ne!(random_id("", 16), random_id("", 16));
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"xbc"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        // A shorter input padded with zeros is still not equal.
        assert!(!constant_time_eq(b"ab\0", b"ab"));
        assert!(!constant_time_eq(b"", b"\0"));
        let (s, _, h, _) = generate_key();
        assert!(constant_time_eq(&hash_secret(&s), &h));
    }
}
