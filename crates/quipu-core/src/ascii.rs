//! Fixed-width lowercase hex written straight into a byte buffer, for bytes written on every
//! request (request ids, `\u00XX` escapes, shortened tool names). Decimal numbers use the
//! `itoa` crate.
//!
//! Why [`fill_hex`] is ours: callers need the *low* `n` digits of an integer, zero-padded, in
//! a slice they already hold (12 digits of a millisecond clock, 4 of a byte, 8 of a hash).
//! The well-kept crates do other things: `hex` and `const-hex` encode byte slices (whole bytes,
//! most significant first, into a new buffer or one of exactly twice the input's length), and
//! `format!("{n:0w$x}")` goes through `core::fmt` and allocates. Six lines, tested against
//! `format!` below, are less than adapting either at every call site.

/// Fills `out` with the low `4 * out.len()` bits of `n` in lowercase hex, zero-padded (`out`
/// holds at most 16 digits).
pub fn fill_hex(out: &mut [u8], n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let last = out.len().saturating_sub(1);
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = HEX[((n >> (4 * (last - i))) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_zero_padded_lower_hex() {
        for (n, width) in [
            (0u64, 4),
            (0xabc, 12),
            (0x1a20b26953, 12),
            (u64::MAX, 16),
            (0xfff, 2),
        ] {
            let mut out = vec![0u8; width];
            fill_hex(&mut out, n);
            let full = format!("{n:016x}");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                full[16 - width..],
                "{n:x}/{width}"
            );
        }
    }
}
