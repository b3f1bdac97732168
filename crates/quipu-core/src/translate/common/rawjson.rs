//! Small helpers over raw JSON text: reading string literals without decoding them, joining
//! them, compacting a value into a JSON string, bounding nesting depth.
//!
//! Everything here works on text that serde_json has already validated (a `&RawValue`), so a
//! raw value that starts with `"` is a complete, well-formed string literal. Joining escaped
//! literal contents is valid because the concatenation of escaped strings is the escaping of
//! the concatenated strings: text goes to the upstream exactly as the client escaped it.

use serde_json::value::RawValue;
use std::borrow::Cow;

/// Nesting allowed in pass-through JSON (tool schemas, tool inputs): serde_json's own limit,
/// so anything Quipu forwards could also be parsed by a serde_json-based reader.
pub const MAX_DEPTH: usize = 128;

/// Whether the raw value is a JSON string.
#[inline]
pub fn is_string(raw: &RawValue) -> bool {
    raw.get().as_bytes().first() == Some(&b'"')
}

/// Whether the raw value is a JSON object.
#[inline]
pub fn is_object(raw: &RawValue) -> bool {
    raw.get().as_bytes().first() == Some(&b'{')
}

/// Whether the raw value is a JSON array.
#[inline]
pub fn is_array(raw: &RawValue) -> bool {
    raw.get().as_bytes().first() == Some(&b'[')
}

/// The escaped contents of a string literal (between the quotes). Call only on strings.
#[inline]
pub fn inner(raw: &RawValue) -> &str {
    let s = raw.get();
    s.get(1..s.len().saturating_sub(1)).unwrap_or("")
}

/// The decoded string, borrowed when the literal has no escapes; `None` if not a string.
pub fn decode(raw: &RawValue) -> Option<Cow<'_, str>> {
    if !is_string(raw) {
        return None;
    }
    let content = inner(raw);
    if !content.contains('\\') {
        return Some(Cow::Borrowed(content));
    }
    serde_json::from_str::<String>(raw.get())
        .ok()
        .map(Cow::Owned)
}

/// Whether a string literal's decoded text is `expected` (no allocation in the usual case).
pub fn str_eq(raw: &RawValue, expected: &str) -> bool {
    if !is_string(raw) {
        return false;
    }
    let content = inner(raw);
    if content == expected {
        return true;
    }
    content.contains('\\') && decode(raw).is_some_and(|d| d == expected)
}

/// Whether a string literal's decoded text starts with `prefix`.
pub fn str_starts_with(raw: &RawValue, prefix: &str) -> bool {
    let content = inner(raw);
    let head = content
        .get(..prefix.len().min(content.len()))
        .unwrap_or(content);
    if !head.contains('\\') {
        return content.starts_with(prefix);
    }
    decode(raw).is_some_and(|d| d.starts_with(prefix))
}

/// Whether a string literal is empty.
#[inline]
pub fn str_is_empty(raw: &RawValue) -> bool {
    raw.get() == "\"\""
}

/// Appends `raw` (a JSON value) compacted and escaped as the contents of a JSON string, without
/// the quotes: `{ "a": "x\"y" }` becomes `{\"a\":\"x\\\"y\"}`. Returns `false` (having written
/// a partial result) when the value nests deeper than [`MAX_DEPTH`].
///
/// One pass, no allocation: whitespace outside strings is dropped, `"` and `\` are escaped, all
/// else is copied (valid JSON has no raw control characters inside strings).
pub fn write_compact_escaped(out: &mut Vec<u8>, raw: &str) -> bool {
    let bytes = raw.as_bytes();
    let mut in_string = false;
    let mut escaped = false;
    let mut depth = 0usize;
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            // An escaped `"` or `\` still needs escaping for the outer string; only an
            // unescaped `"` ends the inner one.
            let was_escaped = escaped;
            escaped = false;
            match b {
                b'\\' => {
                    escaped = !was_escaped;
                    out.extend_from_slice(&bytes[start..i]);
                    out.extend_from_slice(b"\\\\");
                    start = i + 1;
                }
                b'"' => {
                    in_string = was_escaped;
                    out.extend_from_slice(&bytes[start..i]);
                    out.extend_from_slice(b"\\\"");
                    start = i + 1;
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(b"\\\"");
                start = i + 1;
            }
            b' ' | b'\n' | b'\r' | b'\t' => {
                out.extend_from_slice(&bytes[start..i]);
                start = i + 1;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    out.extend_from_slice(&bytes[start..]);
    true
}

/// Appends `raw` (a JSON value serde_json has read) without the whitespace between its tokens:
/// one line, whatever the client's indentation, so it can be echoed inside an SSE `data:`
/// line. Strings are copied as written. No allocation; the common case (nothing to drop) is
/// one `extend_from_slice`.
pub fn write_compact(out: &mut Vec<u8>, raw: &str) {
    let bytes = raw.as_bytes();
    if memchr::memchr3(b'\n', b'\r', b' ', bytes).is_none()
        && memchr::memchr(b'\t', bytes).is_none()
    {
        out.extend_from_slice(bytes);
        return;
    }
    let mut in_string = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b' ' | b'\n' | b'\r' | b'\t' => {
                out.extend_from_slice(&bytes[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Whether the JSON text nests no deeper than [`MAX_DEPTH`].
pub fn depth_ok(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    // Fast path: a value with few brackets cannot be deep.
    if memchr::memchr2_iter(b'[', b'{', bytes)
        .take(MAX_DEPTH + 1)
        .count()
        <= MAX_DEPTH
    {
        return true;
    }
    let mut in_string = false;
    let mut escaped = false;
    let mut depth = 0usize;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn compact_escaped_roundtrips() {
        for src in [
            r#"{ "a" : 1 , "b": [ true, null ], "c": "x \"q\" \\ \n y", "ñ": "🦙" }"#,
            r#"{"k": "\\", "l": "\\\"", "m": "a\\\\\"b c\""}"#,
            r#"{}"#,
            "{\n  \"deep\": {\"x\": [1, 2, {\"y\": \"a b\"}]}\n}",
        ] {
            let mut out = vec![b'"'];
            assert!(write_compact_escaped(&mut out, src));
            out.push(b'"');
            let as_string: String = serde_json::from_slice(&out).unwrap();
            let a: serde_json::Value = serde_json::from_str(&as_string).unwrap();
            let b: serde_json::Value = serde_json::from_str(src).unwrap();
            assert_eq!(a, b);
            assert!(!as_string.contains(": "), "{as_string}");
        }
    }

    #[test]
    fn compact_keeps_strings_and_drops_the_rest() {
        let src = "{\n  \"a b\": [ 1, \"x \\\" y\\n\" ],\t\"c\" : {} }";
        let mut out = Vec::new();
        write_compact(&mut out, src);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, r#"{"a b":[1,"x \" y\n"],"c":{}}"#);
        let a: serde_json::Value = serde_json::from_str(&text).unwrap();
        let b: serde_json::Value = serde_json::from_str(src).unwrap();
        assert_eq!(a, b);
        let mut out = Vec::new();
        write_compact(&mut out, r#"{"k":"v"}"#);
        assert_eq!(out, br#"{"k":"v"}"#);
    }

    #[test]
    fn depth_limits() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(!depth_ok(&deep));
        assert!(depth_ok(&ok));
        assert!(depth_ok(&format!("\"{}\"", "[".repeat(500))));
        let mut out = Vec::new();
        assert!(!write_compact_escaped(&mut out, &deep));
        assert!(write_compact_escaped(&mut out, &ok));
    }

    #[test]
    fn strings() {
        assert_eq!(decode(raw(r#""a\nb""#)).unwrap(), "a\nb");
        assert!(matches!(decode(raw(r#""ab""#)), Some(Cow::Borrowed("ab"))));
        assert!(decode(raw("1")).is_none());
        assert!(str_eq(raw(r#""te\u0078t""#), "text"));
        assert!(str_eq(raw(r#""text""#), "text"));
        assert!(!str_eq(raw(r#""texts""#), "text"));
        assert!(str_starts_with(raw(r#""x-anth: 1""#), "x-anth:"));
        assert!(str_starts_with(raw(r#""\u0078-anth: 1""#), "x-anth:"));
        assert!(!str_starts_with(raw(r#""x-an""#), "x-anth:"));
        assert_eq!(inner(raw(r#""a\"b""#)), r#"a\"b"#);
    }
}
