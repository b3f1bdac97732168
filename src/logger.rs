//! A small `log` backend: one line per record on stderr, `key=value` friendly.
//!
//! Level from `QUIPU_LOG` (or `RUST_LOG`): a level (`info`), optionally with per-target
//! overrides (`warn,quipu::access=info`). The access log is the `quipu::access` target at
//! `info`; `QUIPU_LOG=info,quipu::access=off` turns it off. No secret is ever logged: keys
//! appear only by their public id.

use log::{LevelFilter, Log, Metadata, Record};
use std::cell::RefCell;
use std::io::Write;

/// A line longer than this does not keep its buffer for the next record.
const MAX_KEPT_LINE: usize = 16 * 1024;

thread_local! {
    /// The line being formatted, reused across records of one thread.
    static LINE: RefCell<Line> = const {
        RefCell::new(Line { buf: Vec::new(), second: u64::MAX, prefix: [0; 20] })
    };
}

/// A thread's line buffer, and the `YYYY-MM-DDTHH:MM:SS.` of the last second it logged in:
/// formatting a calendar date is most of a timestamp's cost, and it changes once a second.
struct Line {
    buf: Vec<u8>,
    second: u64,
    prefix: [u8; 20],
}

impl Line {
    /// Appends `2026-11-23T18:47:28.478Z` (UTC, milliseconds).
    fn push_timestamp(&mut self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let second = now.as_secs();
        if second != self.second {
            let at = chrono::DateTime::<chrono::Utc>::from_timestamp(second as i64, 0)
                .unwrap_or_default();
            let text = at.format("%Y-%m-%dT%H:%M:%S.").to_string();
            if text.len() == self.prefix.len() {
                self.prefix.copy_from_slice(text.as_bytes());
                self.second = second;
            } else {
                // A year outside 0000–9999: no caching, write it as it comes.
                self.second = u64::MAX;
                self.buf.extend_from_slice(text.as_bytes());
                let _ = write!(self.buf, "{:03}Z", now.subsec_millis());
                return;
            }
        }
        self.buf.extend_from_slice(&self.prefix);
        let ms = now.subsec_millis();
        self.buf.extend_from_slice(&[
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
            b'Z',
        ]);
    }
}

struct Logger {
    default: LevelFilter,
    overrides: Vec<(String, LevelFilter)>,
}

impl Logger {
    fn level_for(&self, target: &str) -> LevelFilter {
        self.overrides
            .iter()
            .filter(|(t, _)| target.starts_with(t.as_str()))
            .max_by_key(|(t, _)| t.len())
            .map_or(self.default, |(_, l)| *l)
    }
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= self.level_for(metadata.target())
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // Stderr is unbuffered: formatting straight into it costs one write(2) per fragment
        // (dozens per access-log line). Format into a per-thread buffer, write it once.
        LINE.with(|cell| {
            let Ok(mut line) = cell.try_borrow_mut() else {
                return; // a Display impl that logs while being formatted: drop the inner record
            };
            let line = &mut *line;
            line.buf.clear();
            line.push_timestamp();
            let _ = writeln!(
                line.buf,
                " {:<5} {} {}",
                record.level(),
                record.target(),
                record.args()
            );
            let _ = std::io::stderr().lock().write_all(&line.buf);
            if line.buf.capacity() > MAX_KEPT_LINE {
                line.buf = Vec::new();
            }
        });
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

fn parse_level(s: &str) -> Option<LevelFilter> {
    s.trim().parse().ok()
}

/// Installs the logger (once; later calls are ignored).
pub fn init() {
    let spec = std::env::var("QUIPU_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let mut default = LevelFilter::Info;
    let mut overrides = Vec::new();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once('=') {
            Some((target, level)) => {
                if let Some(l) = parse_level(level) {
                    overrides.push((target.trim().to_owned(), l));
                }
            }
            None => {
                if let Some(l) = parse_level(part) {
                    default = l;
                }
            }
        }
    }
    // Pingora logs every client disconnect at error level; keep its noise one level down.
    if !overrides.iter().any(|(t, _)| t.starts_with("pingora")) {
        overrides.push(("pingora".into(), default.min(LevelFilter::Warn)));
    }
    let max = overrides
        .iter()
        .map(|(_, l)| *l)
        .chain([default])
        .max()
        .unwrap_or(LevelFilter::Info);
    // Leaked once: the logger lives as long as the process.
    let logger: &'static Logger = Box::leak(Box::new(Logger { default, overrides }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_with_milliseconds_and_the_cached_prefix_follows_the_clock() {
        let mut line = Line {
            buf: Vec::new(),
            second: u64::MAX,
            prefix: [0; 20],
        };
        line.push_timestamp();
        let first = String::from_utf8(line.buf.clone()).unwrap();
        let parsed = chrono::DateTime::parse_from_rfc3339(&first).unwrap();
        let drift = chrono::Utc::now().signed_duration_since(parsed);
        assert!(drift.num_milliseconds().abs() < 2000, "{first}");
        assert_eq!(first.len(), "2026-11-23T18:47:28.478Z".len());
        // A stale cached second is replaced, not reused.
        line.second = line.second.saturating_sub(3600);
        line.prefix = *b"1999-01-01T00:00:00.";
        line.buf.clear();
        line.push_timestamp();
        assert!(!String::from_utf8(line.buf).unwrap().starts_with("1999"));
    }
}
