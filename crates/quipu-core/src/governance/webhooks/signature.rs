//! Signed deliveries, Stripe-style: each request carries
//! `Quipu-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" with the endpoint's
//! secret>`. A receiver recomputes the HMAC over the raw body it got, compares in constant
//! time, and refuses a timestamp outside its tolerance (a replayed old delivery). While a
//! secret is being rotated a header may carry several `v1=` values, one per secret; one match
//! is enough. Unknown schemes (`v0=`, …) are ignored, so a later scheme can be added beside.
//!
//! ```
//! use quipu_core::governance::webhooks::signature::{sign, verify};
//! use std::time::Duration;
//! let header = sign(b"whsec_test", 1_795_782_600, b"{\"id\":\"evt_1\"}");
//! assert!(header.starts_with("t=1795782600,v1="));
//! let now_ms = 1_795_782_660_000; // a minute later
//! assert!(verify(&header, b"{\"id\":\"evt_1\"}", b"whsec_test", now_ms, Duration::from_secs(300)).is_ok());
//! ```

use super::event::HEX;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::time::Duration;

/// The header's name.
pub const HEADER: &str = "Quipu-Signature";
/// The tolerance receivers are told to use (Stripe's default): five minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> HmacSha256 {
    #[expect(
        clippy::expect_used,
        reason = "HMAC takes keys of any length: new_from_slice never fails"
    )]
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    m.update(timestamp.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m
}

/// The header value for `body` sent at `timestamp` (Unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let tag = mac(secret, timestamp, body).finalize().into_bytes();
    let mut out = format!("t={timestamp},v1=");
    for b in tag {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// Why a signature was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureError {
    /// No `t=` with a whole number of seconds.
    NoTimestamp,
    /// No well-formed `v1=` (64 hex digits).
    NoSignature,
    /// The timestamp is further than the tolerance from now (`age` in seconds, negative when
    /// in the future).
    OutsideTolerance { age: i64 },
    /// No `v1=` matches the body and the secret.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureError::NoTimestamp => {
                f.write_str("no t=<unix seconds> in the signature header")
            }
            SignatureError::NoSignature => {
                f.write_str("no v1=<64 hex digits> in the signature header")
            }
            SignatureError::OutsideTolerance { age } => {
                write!(
                    f,
                    "the signature's timestamp is {age} s from now, outside the tolerance"
                )
            }
            SignatureError::Mismatch => f.write_str("no signature matches the body and the secret"),
        }
    }
}

impl std::error::Error for SignatureError {}

/// Checks a `Quipu-Signature` header against the raw `body`, the endpoint's `secret` and the
/// receiver's clock (`now_ms`): the timestamp within `tolerance` either way, and one `v1=`
/// equal to the HMAC (compared in constant time).
pub fn verify(
    header: &str,
    body: &[u8],
    secret: &[u8],
    now_ms: i64,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut tags: Vec<[u8; 32]> = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) if timestamp.is_none() => {
                timestamp = Some(t.parse::<i64>().map_err(|_| SignatureError::NoTimestamp)?);
            }
            Some(("v1", hex)) => {
                if let Some(tag) = decode_tag(hex) {
                    tags.push(tag);
                }
            }
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::NoTimestamp)?;
    if tags.is_empty() {
        return Err(SignatureError::NoSignature);
    }
    let age = now_ms.div_euclid(1000).saturating_sub(timestamp);
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if age.unsigned_abs() > tolerance.unsigned_abs() {
        return Err(SignatureError::OutsideTolerance { age });
    }
    let expected = mac(secret, timestamp, body);
    if tags
        .iter()
        .any(|tag| expected.clone().verify_slice(tag).is_ok())
    {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// 64 hex digits (either case) as 32 bytes.
fn decode_tag(hex: &str) -> Option<[u8; 32]> {
    let digits = hex.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; 32];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}
