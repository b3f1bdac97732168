//! Rewriting upstream JSON in place, by byte ranges, without re-serialising it.
//!
//! The chat format relays the upstream's responses almost verbatim; only a few values change
//! (the model name becomes the slug, unrequested usage is nulled, a reasoning field is renamed
//! or duplicated). Parsing a chunk once into borrowed `&RawValue`s gives the exact byte range
//! of each value; a [`Splice`] collects replacements and [`Splice::apply`] copies the untouched
//! bytes around them. Everything the upstream sent that Quipu does not touch (logprobs, tool
//! call deltas, extension fields) reaches the client byte for byte.

use serde_json::value::RawValue;
use std::ops::Range;

/// Byte range of `raw` within `src`, if `raw` borrows from it.
pub fn range_of(src: &[u8], raw: &RawValue) -> Option<Range<usize>> {
    let start = (raw.get().as_ptr() as usize).checked_sub(src.as_ptr() as usize)?;
    let end = start + raw.get().len();
    (end <= src.len()).then_some(start..end)
}

/// The range of a whole object member (`"key": value`) given its value's range, including one
/// separating comma, so that removing it leaves valid JSON. `None` if the bytes around the value
/// are not a member (which cannot happen for a value parsed out of an object).
pub fn member_range(src: &[u8], value: Range<usize>) -> Option<Range<usize>> {
    let is_ws = |b: u8| matches!(b, b' ' | b'\n' | b'\r' | b'\t');
    // Back over `"key"\s*:\s*`.
    let mut i = value.start;
    while i > 0 && is_ws(src[i - 1]) {
        i -= 1;
    }
    if i == 0 || src[i - 1] != b':' {
        return None;
    }
    i -= 1;
    while i > 0 && is_ws(src[i - 1]) {
        i -= 1;
    }
    if i == 0 || src[i - 1] != b'"' {
        return None;
    }
    i -= 1; // closing quote of the key
    loop {
        if i == 0 {
            return None;
        }
        i -= 1;
        if src[i] == b'"' {
            // An escaped quote has an odd number of backslashes before it.
            let backslashes = src[..i].iter().rev().take_while(|&&b| b == b'\\').count();
            if backslashes % 2 == 0 {
                break;
            }
        }
    }
    let key_start = i;
    // Prefer eating the comma before the member; else the one after it.
    let mut j = key_start;
    while j > 0 && is_ws(src[j - 1]) {
        j -= 1;
    }
    if j > 0 && src[j - 1] == b',' {
        return Some(j - 1..value.end);
    }
    let mut k = value.end;
    while k < src.len() && is_ws(src[k]) {
        k += 1;
    }
    if k < src.len() && src[k] == b',' {
        return Some(key_start..k + 1);
    }
    Some(key_start..value.end)
}

/// The key's range of a member, given its value's range (`"reasoning"` in `"reasoning":"x"`).
pub fn key_range(src: &[u8], value: Range<usize>) -> Option<Range<usize>> {
    let member = member_range(src, value.clone())?;
    let start = member.start + src[member.start..].iter().position(|&b| b == b'"')?;
    let colon = start + src[start..value.start].iter().rposition(|&b| b == b':')?;
    let end = start + 1 + src[start + 1..colon].iter().rposition(|&b| b == b'"')? + 1;
    Some(start..end)
}

/// A set of non-overlapping replacements on one source buffer.
#[derive(Debug, Default)]
pub struct Splice {
    edits: Vec<(Range<usize>, Vec<u8>)>,
}

impl Splice {
    pub fn clear(&mut self) {
        self.edits.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Replace `range` with `with`. Ranges must not overlap (insertions are empty ranges).
    pub fn replace(&mut self, range: Range<usize>, with: &[u8]) {
        self.edits.push((range, with.to_vec()));
    }

    /// [`Splice::replace`] with bytes built for it: moved in, not copied.
    pub fn replace_with(&mut self, range: Range<usize>, with: Vec<u8>) {
        self.edits.push((range, with));
    }

    /// Appends `src` with the edits applied to `out`.
    pub fn apply(&mut self, src: &[u8], out: &mut Vec<u8>) {
        self.edits.sort_by_key(|(r, _)| (r.start, r.end));
        let mut pos = 0;
        for (range, with) in &self.edits {
            if range.start < pos || range.end > src.len() {
                continue; // overlapping or foreign edit: skip rather than corrupt
            }
            out.extend_from_slice(&src[pos..range.start]);
            out.extend_from_slice(with);
            pos = range.end;
        }
        out.extend_from_slice(&src[pos..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Doc<'a> {
        #[serde(borrow)]
        model: &'a RawValue,
        #[serde(borrow)]
        usage: Option<&'a RawValue>,
        #[serde(borrow)]
        first: Option<&'a RawValue>,
    }

    fn edit(src: &str, f: impl Fn(&[u8], &Doc, &mut Splice)) -> String {
        let d: Doc = serde_json::from_str(src).unwrap();
        let mut s = Splice::default();
        f(src.as_bytes(), &d, &mut s);
        let mut out = Vec::new();
        s.apply(src.as_bytes(), &mut out);
        let text = String::from_utf8(out).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap();
        text
    }

    #[test]
    fn replace_a_value() {
        let src = r#"{"id":"x","model":"Qwen/Qwen3","n":1}"#;
        let out = edit(src, |b, d, s| {
            s.replace(range_of(b, d.model).unwrap(), br#""aguila""#)
        });
        assert_eq!(out, r#"{"id":"x","model":"aguila","n":1}"#);
    }

    #[test]
    fn remove_members_anywhere() {
        let src = r#"{"model":"m","usage":{"a":1},"z":2}"#;
        let out = edit(src, |b, d, s| {
            let r = member_range(b, range_of(b, d.usage.unwrap()).unwrap()).unwrap();
            s.replace(r, b"")
        });
        assert_eq!(out, r#"{"model":"m","z":2}"#);
        let src = r#"{ "first" : 1 , "model":"m"}"#;
        let out = edit(src, |b, d, s| {
            let r = member_range(b, range_of(b, d.first.unwrap()).unwrap()).unwrap();
            s.replace(r, b"")
        });
        assert_eq!(out, r#"{  "model":"m"}"#);
        let src = r#"{"model":"m"}"#;
        let out = edit(src, |b, d, s| {
            let r = member_range(b, range_of(b, d.model).unwrap()).unwrap();
            s.replace(r, b"")
        });
        assert_eq!(out, r#"{}"#);
    }

    #[test]
    fn keys_with_escapes() {
        let src = r#"{"a\"b":"x","model":"m"}"#;
        let d: Doc = serde_json::from_str(src).unwrap();
        let r = key_range(src.as_bytes(), range_of(src.as_bytes(), d.model).unwrap()).unwrap();
        assert_eq!(&src[r], "\"model\"");
    }

    #[test]
    fn insertion_after_a_value() {
        let src = r#"{"model":"m"}"#;
        let out = edit(src, |b, d, s| {
            let r = range_of(b, d.model).unwrap();
            s.replace(r.end..r.end, br#","extra":true"#)
        });
        assert_eq!(out, r#"{"model":"m","extra":true}"#);
    }
}
