//! Numbers written as ASCII digits straight into a byte buffer: no allocation and no
//! `core::fmt`, for the bytes written on every request (usage objects, event indexes, the
//! access-log line, request ids).

/// Appends `n` in decimal.
pub fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

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
    fn decimal_matches_display() {
        for n in [0, 7, 10, 1_000_507, u64::MAX] {
            let mut out = b"x=".to_vec();
            push_u64(&mut out, n);
            assert_eq!(out, format!("x={n}").into_bytes());
        }
    }

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
