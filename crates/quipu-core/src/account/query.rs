//! A URL query string read into its parameters (`a=1&b=x%20y`), for the account endpoints and
//! the admin API alike.
//!
//! Values are percent-decoded and `+` reads as a space; a malformed escape is kept as it is. A
//! parameter given twice keeps its first value; [`Query::only`] refuses names an endpoint does
//! not take, so a typo (`groupby=day`) is an error rather than silently ignored.

use crate::error::ApiError;

/// The parameters of a query string, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Reads `raw` (the part of the target after `?`, without it).
    pub fn parse(raw: &str) -> Query {
        let pairs = raw
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (decode(k), decode(v))
            })
            .collect();
        Query { pairs }
    }

    /// The first value of `name`, if given (an empty value counts as not given).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// Refuses a parameter whose name is not in `names`.
    pub fn only(&self, names: &[&str]) -> Result<(), ApiError> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !names.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((k, _)) => Err(ApiError::invalid(
                k.clone(),
                if names.is_empty() {
                    format!("unknown parameter \"{k}\": this endpoint takes none")
                } else {
                    format!(
                        "unknown parameter \"{k}\"; this endpoint takes {}",
                        names.join(", ")
                    )
                },
            )),
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Decodes `%XX` and `+` in a query name or value; invalid UTF-8 is replaced.
pub fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_and_decoding() {
        let q = Query::parse("tenant=acme&from=2026-01-01&to=&x=a%20b+c&tenant=other");
        assert_eq!(q.get("from"), Some("2026-01-01"));
        assert_eq!(q.get("tenant"), Some("acme"), "the first value wins");
        assert_eq!(q.get("to"), None, "an empty value is not given");
        assert_eq!(q.get("x"), Some("a b c"));
        assert_eq!(q.get("nope"), None);
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("%C3%B1"), "ñ");
        assert_eq!(decode("%ñ1"), "%ñ1");
        assert_eq!(
            decode("2026-11-01T00%3A00%3A00%2B05%3A00"),
            "2026-11-01T00:00:00+05:00"
        );
        assert_eq!(Query::parse(""), Query::default());
    }

    #[test]
    fn unknown_names_are_refused() {
        let q = Query::parse("from=x&limt=3");
        assert!(q.only(&["from", "limit"]).is_err());
        assert!(q.only(&["from", "limt"]).is_ok());
        let e = Query::parse("a=1").only(&[]).unwrap_err();
        assert!(e.message.contains("takes none"), "{e:?}");
    }
}
