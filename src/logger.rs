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
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
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
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        // Stderr is unbuffered: formatting straight into it costs one write(2) per fragment
        // (dozens per access-log line). Format into a per-thread buffer, write it once.
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return; // a Display impl that logs while being formatted: drop the inner record
            };
            line.clear();
            let _ = writeln!(
                line,
                "{now} {:<5} {} {}",
                record.level(),
                record.target(),
                record.args()
            );
            let _ = std::io::stderr().lock().write_all(&line);
            if line.capacity() > MAX_KEPT_LINE {
                *line = Vec::new();
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
