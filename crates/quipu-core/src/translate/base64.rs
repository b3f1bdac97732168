//! Whether inline image data is base64 an upstream will decode: the one check behind both
//! formats' inline images (chat `data:image/…;base64,…` URLs, messages `base64` image
//! sources). The data is checked, never decoded: it is forwarded as the client wrote it.

/// The standard alphabet (RFC 4648 §4): `A–Z`, `a–z`, `0–9`, `+`, `/`.
const ALPHABET: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = b'A';
    while c <= b'Z' {
        t[c as usize] = true;
        t[(c + 32) as usize] = true;
        c += 1;
    }
    let mut d = b'0';
    while d <= b'9' {
        t[d as usize] = true;
        d += 1;
    }
    t[b'+' as usize] = true;
    t[b'/' as usize] = true;
    t
};

/// Whether `data` is standard padded base64 (RFC 4648 §4), as data URLs carry it and as the
/// upstreams' decoders accept it: a non-zero multiple of 4 bytes of the standard alphabet,
/// ending in at most two `=`, with no `=` elsewhere. No whitespace, no URL-safe alphabet, no
/// missing padding. Empty data is not an image, so it is refused too.
///
/// The unused low bits of the last symbol are not checked (`YR==` passes): decoders ignore
/// them, and refusing them would refuse images the upstream reads.
pub fn is_base64(data: &[u8]) -> bool {
    if data.is_empty() || data.len() % 4 != 0 {
        return false;
    }
    let body = data
        .strip_suffix(b"==")
        .or_else(|| data.strip_suffix(b"="))
        .unwrap_or(data);
    body.iter().all(|&c| ALPHABET[usize::from(c)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_standard_base64_passes() {
        for ok in [
            "aGVsbG8=",
            "aGVsbG8h",
            "aGk=",
            "YQ==",
            "aGVs",
            "+/9A",
            "AAAA",
            "////",
            "YR==",
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
        ] {
            assert!(is_base64(ok.as_bytes()), "{ok}");
        }
    }

    #[test]
    fn everything_else_is_refused() {
        for bad in [
            "",          // no data
            "a",         // length not a multiple of 4
            "aGk",       // padding missing
            "aGVsbG8",   // padding missing
            "aGVsbG8==", // one `=` too many for the length
            "====",      // padding only
            "a===",      // three `=`
            "=aGk",      // `=` first
            "ab=c",      // `=` inside
            "aG==aGk=",  // `=` inside, between quanta
            "aGV sbG8=", // a space
            "aGVs\n",    // a newline
            "aGVs\r\n",  // CRLF
            "aGVs*",     // not in the alphabet
            "aG-_",      // the URL-safe alphabet
            "aGk%3D",    // percent-encoded padding
            "aGVsbG8\u{0}",
            "añVs",
        ] {
            assert!(!is_base64(bad.as_bytes()), "{bad:?}");
        }
        assert!(!is_base64(&[0xff, 0xfe, b'A', b'A']));
    }
}
