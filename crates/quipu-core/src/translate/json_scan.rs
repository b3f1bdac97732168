//! An incremental syntax check of one JSON object received in fragments: the arguments of an
//! upstream tool call, which stream in pieces that may split anywhere (inside a string, an
//! escape, a number, a multi-byte character).
//!
//! [`ObjectScanner::feed`] looks at each byte once and keeps only a few bytes of state (the
//! container stack and where it is in the grammar), so checking a call's arguments costs
//! O(fragment) per fragment and nothing is re-read or buffered. Both messages-format
//! translators use it — the stream per fragment, the non-streaming path on the whole string —
//! so they agree exactly on which arguments are valid, incomplete or malformed.
//!
//! Grammar: RFC 8259, with a top level that must be an object (a tool's input is an object)
//! and only whitespace after it; as strict as serde_json where RFC 8259 leaves room (no raw
//! control characters in strings, `\u` surrogates must pair) and limited to [`MAX_NESTING`]
//! containers, like serde_json, so whatever passes can be parsed by any serde_json-based
//! reader.

/// Most nested containers: serde_json's recursion limit of 128 admits 127.
pub const MAX_NESTING: usize = 127;

/// JSON's whitespace: what may stand around a value (RFC 8259 §2).
pub const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Where the text fed so far stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Nothing but whitespace yet.
    Empty,
    /// A proper prefix of a JSON object: more is needed.
    Partial,
    /// One complete JSON object (possibly followed by whitespace).
    Complete,
    /// Not the beginning of a JSON object, whatever follows.
    Invalid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Backslash,
    /// Inside `\uXXXX`: digits still to read, value so far, whether it is the low half of a
    /// surrogate pair.
    Hex {
        left: u8,
        value: u16,
        low: bool,
    },
    /// After a high surrogate: the `\` of its low half is required.
    NeedLowBackslash,
    /// After a high surrogate and `\`: the `u` of its low half is required.
    NeedLowU,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object: a key.
    Key,
    Colon,
    /// A value is required (after `:` or after `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ValueOrEnd,
    /// After a value: `,` or the container's closer.
    AfterValue,
    Str {
        key: bool,
        esc: Esc,
    },
    Number(Num),
    /// Inside `true`, `false` or `null`: which literal, and bytes matched so far.
    Literal {
        word: &'static [u8],
        at: u8,
    },
    Done,
    Invalid,
}

/// The incremental checker (see the module docs).
#[derive(Debug, Clone)]
pub struct ObjectScanner {
    /// Open containers, innermost last: `true` for an object, `false` for an array.
    stack: Vec<bool>,
    state: State,
}

impl Default for ObjectScanner {
    fn default() -> Self {
        ObjectScanner::new()
    }
}

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl ObjectScanner {
    pub fn new() -> Self {
        ObjectScanner {
            stack: Vec::new(),
            state: State::Start,
        }
    }

    /// Where the text fed so far stands.
    pub fn status(&self) -> Scan {
        match self.state {
            State::Start => Scan::Empty,
            State::Done => Scan::Complete,
            State::Invalid => Scan::Invalid,
            _ => Scan::Partial,
        }
    }

    /// Checks one more fragment; returns the new status. Once invalid, always invalid.
    pub fn feed(&mut self, fragment: &str) -> Scan {
        for &b in fragment.as_bytes() {
            if self.state == State::Invalid {
                break;
            }
            self.byte(b);
        }
        self.status()
    }

    /// The whole text at once.
    pub fn check(text: &str) -> Scan {
        ObjectScanner::new().feed(text)
    }

    fn open(&mut self, object: bool) {
        if self.stack.len() >= MAX_NESTING {
            self.state = State::Invalid;
            return;
        }
        self.stack.push(object);
        self.state = if object {
            State::KeyOrEnd
        } else {
            State::ValueOrEnd
        };
    }

    fn close(&mut self, object: bool) {
        if self.stack.pop() != Some(object) {
            self.state = State::Invalid;
            return;
        }
        self.state = if self.stack.is_empty() {
            State::Done
        } else {
            State::AfterValue
        };
    }

    /// The first byte of a value.
    fn value(&mut self, b: u8) {
        self.state = match b {
            b'"' => State::Str {
                key: false,
                esc: Esc::None,
            },
            b'{' => return self.open(true),
            b'[' => return self.open(false),
            b'-' => State::Number(Num::Minus),
            b'0' => State::Number(Num::Zero),
            b'1'..=b'9' => State::Number(Num::Int),
            b't' => State::Literal {
                word: b"true",
                at: 1,
            },
            b'f' => State::Literal {
                word: b"false",
                at: 1,
            },
            b'n' => State::Literal {
                word: b"null",
                at: 1,
            },
            _ => State::Invalid,
        };
    }

    fn byte(&mut self, b: u8) {
        match self.state {
            State::Invalid => {}
            State::Start => match b {
                b'{' => self.open(true),
                _ if is_ws(b) => {}
                _ => self.state = State::Invalid,
            },
            State::Done => {
                if !is_ws(b) {
                    self.state = State::Invalid;
                }
            }
            State::KeyOrEnd | State::Key => match b {
                b'"' => {
                    self.state = State::Str {
                        key: true,
                        esc: Esc::None,
                    }
                }
                b'}' if self.state == State::KeyOrEnd => self.close(true),
                _ if is_ws(b) => {}
                _ => self.state = State::Invalid,
            },
            State::Colon => match b {
                b':' => self.state = State::Value,
                _ if is_ws(b) => {}
                _ => self.state = State::Invalid,
            },
            State::Value | State::ValueOrEnd => match b {
                b']' if self.state == State::ValueOrEnd => self.close(false),
                _ if is_ws(b) => {}
                _ => self.value(b),
            },
            State::AfterValue => match b {
                b',' => {
                    self.state = if self.stack.last() == Some(&true) {
                        State::Key
                    } else {
                        State::Value
                    }
                }
                b'}' => self.close(true),
                b']' => self.close(false),
                _ if is_ws(b) => {}
                _ => self.state = State::Invalid,
            },
            State::Str { key, esc } => self.string(key, esc, b),
            State::Number(n) => self.number(n, b),
            State::Literal { word, at } => {
                let at = usize::from(at);
                if word.get(at) != Some(&b) {
                    self.state = State::Invalid;
                } else if at + 1 == word.len() {
                    self.state = State::AfterValue;
                } else {
                    self.state = State::Literal {
                        word,
                        at: (at + 1) as u8,
                    };
                }
            }
        }
    }

    fn string(&mut self, key: bool, esc: Esc, b: u8) {
        let next = match esc {
            Esc::None => match b {
                b'"' => {
                    self.state = if key { State::Colon } else { State::AfterValue };
                    return;
                }
                b'\\' => Esc::Backslash,
                0x00..=0x1f => {
                    self.state = State::Invalid;
                    return;
                }
                _ => Esc::None,
            },
            Esc::Backslash => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Esc::None,
                b'u' => Esc::Hex {
                    left: 4,
                    value: 0,
                    low: false,
                },
                _ => {
                    self.state = State::Invalid;
                    return;
                }
            },
            Esc::NeedLowBackslash if b == b'\\' => Esc::NeedLowU,
            Esc::NeedLowU if b == b'u' => Esc::Hex {
                left: 4,
                value: 0,
                low: true,
            },
            Esc::NeedLowBackslash | Esc::NeedLowU => {
                self.state = State::Invalid;
                return;
            }
            Esc::Hex { left, value, low } => {
                let Some(d) = char::from(b).to_digit(16) else {
                    self.state = State::Invalid;
                    return;
                };
                let value = (value << 4) | d as u16;
                if left > 1 {
                    Esc::Hex {
                        left: left - 1,
                        value,
                        low,
                    }
                } else {
                    let is_high = (0xD800..=0xDBFF).contains(&value);
                    let is_low = (0xDC00..=0xDFFF).contains(&value);
                    match (low, is_high, is_low) {
                        (false, true, _) => Esc::NeedLowBackslash,
                        (false, false, false) | (true, false, true) => Esc::None,
                        _ => {
                            self.state = State::Invalid;
                            return;
                        }
                    }
                }
            }
        };
        self.state = State::Str { key, esc: next };
    }

    fn number(&mut self, n: Num, b: u8) {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, _) if digit => Some(Num::Int),
            (Num::Int, _) if digit => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpDigits, _) if digit => Some(Num::ExpDigits),
            _ => None,
        };
        match next {
            Some(n) => self.state = State::Number(n),
            // The number ended (it is never the top level, so a delimiter always follows):
            // it must be complete, and the byte is read as what comes after a value.
            None if matches!(n, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits) => {
                self.state = State::AfterValue;
                self.byte(b);
            }
            None => self.state = State::Invalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_partial_empty_invalid() {
        for (text, want) in [
            ("", Scan::Empty),
            (" \n\t", Scan::Empty),
            ("{}", Scan::Complete),
            (" { } \n", Scan::Complete),
            ("{\"a\":1}", Scan::Complete),
            (
                r#"{"a":[1,-2.5e+3,0,0.1,1E9,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9\ud83e\udd99"],"b":{"c":{}},"d":[]}"#,
                Scan::Complete,
            ),
            ("{\"ñ\":\"🦙 日本\"}", Scan::Complete),
            ("{", Scan::Partial),
            ("{\"a", Scan::Partial),
            ("{\"a\":", Scan::Partial),
            ("{\"a\": tr", Scan::Partial),
            ("{\"a\": -", Scan::Partial),
            ("{\"a\": 1.", Scan::Partial),
            ("{\"a\": 1e", Scan::Partial),
            ("{\"a\": 12", Scan::Partial),
            ("{\"a\": \"x\\", Scan::Partial),
            ("{\"a\": \"\\u00", Scan::Partial),
            ("{\"a\": \"\\ud83e", Scan::Partial),
            ("{\"a\": [1, {\"b\"", Scan::Partial),
            ("[1,2]", Scan::Invalid),
            ("null", Scan::Invalid),
            ("\"{}\"", Scan::Invalid),
            ("{}{}", Scan::Invalid),
            ("{} x", Scan::Invalid),
            ("{\"a\" 1}", Scan::Invalid),
            ("{\"a\": }", Scan::Invalid),
            ("{\"a\":1,}", Scan::Invalid),
            ("{,}", Scan::Invalid),
            ("{\"a\":[1,]}", Scan::Invalid),
            ("{\"a\":01}", Scan::Invalid),
            ("{\"a\":1.e3}", Scan::Invalid),
            ("{\"a\":-}", Scan::Invalid),
            ("{\"a\":+1}", Scan::Invalid),
            ("{\"a\":.5}", Scan::Invalid),
            ("{\"a\":tru}", Scan::Invalid),
            ("{\"a\":nulll}", Scan::Invalid),
            ("{\"a\":NaN}", Scan::Invalid),
            ("{\"a\":\"\\x\"}", Scan::Invalid),
            ("{\"a\":\"\\u12g4\"}", Scan::Invalid),
            ("{\"a\":\"\\ud800\"}", Scan::Invalid),
            ("{\"a\":\"\\udc00\"}", Scan::Invalid),
            ("{\"a\":\"\\ud800\\u0041\"}", Scan::Invalid),
            ("{\"a\":\"tab\there\"}", Scan::Invalid),
            ("{\"a\":[}", Scan::Invalid),
            ("{\"a\":{]}", Scan::Invalid),
            ("{'a':1}", Scan::Invalid),
            ("{a:1}", Scan::Invalid),
        ] {
            assert_eq!(ObjectScanner::check(text), want, "{text:?}");
        }
    }

    #[test]
    fn agrees_with_serde_json_on_complete_objects() {
        for text in [
            r#"{"a":1}"#,
            r#"{"a":[1,2,{"b":null}],"c":"\u00e9\ud83e\udd99"}"#,
            r#"{"a":1,}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":01}"#,
            r#"{"a":1e5}"#,
            "{\"a\":\"\u{7f}\"}",
            &("{\"a\":".repeat(MAX_NESTING - 1) + "{}" + &"}".repeat(MAX_NESTING - 1)),
            &("{\"a\":".repeat(MAX_NESTING) + "{}" + &"}".repeat(MAX_NESTING)),
        ] {
            let ours = ObjectScanner::check(text) == Scan::Complete;
            let serde =
                serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object());
            assert_eq!(ours, serde, "{text}");
        }
    }

    #[test]
    fn any_split_gives_the_same_verdict() {
        for text in [
            r#"{"q":"hola ñandú 🦙 \"\\ \n","n":-12.5e-3,"l":[true,false,null,{}]}"#,
            r#"{"s":"\ud83e\udd99"}"#,
            r#"{"a":1}x"#,
            r#"{"a":[1,2"#,
        ] {
            let whole = ObjectScanner::check(text);
            let bytes = text.as_bytes();
            for i in 0..=bytes.len() {
                for j in i..=bytes.len() {
                    if !(text.is_char_boundary(i) && text.is_char_boundary(j)) {
                        continue;
                    }
                    let mut s = ObjectScanner::new();
                    s.feed(&text[..i]);
                    s.feed(&text[i..j]);
                    assert_eq!(s.feed(&text[j..]), whole, "{text} split@{i},{j}");
                }
            }
        }
    }

    #[test]
    fn depth_is_limited_like_serde_json() {
        let ok = "{\"a\":".repeat(MAX_NESTING - 1) + "{}" + &"}".repeat(MAX_NESTING - 1);
        assert_eq!(ObjectScanner::check(&ok), Scan::Complete);
        let deep = "{\"a\":".repeat(MAX_NESTING) + "{}" + &"}".repeat(MAX_NESTING);
        assert_eq!(ObjectScanner::check(&deep), Scan::Invalid);
        let arrays = "{\"a\":".to_owned() + &"[".repeat(500);
        assert_eq!(ObjectScanner::check(&arrays), Scan::Invalid);
    }
}
