//! A small `log` backend: one line per record on stderr, `key=value` friendly.
//!
//! While serving ([`write_in_batches`]), lines reach stderr through a writer thread, one
//! `write(2)` per batch: the access log alone was a system call per request, the largest part of
//! the CPU Quipu adds to a request after the work itself. A line waits at most [`GATHER`] plus
//! the write before it; [`Log::flush`] (called before the process exits) waits for every line
//! queued before it. If stderr stalls, [`QUEUED_LINES`] lines queue and then the logging thread
//! waits, as a direct write would. Before that (the CLI, tests) each line is written directly.
//!
//! Level from `QUIPU_LOG` (or `RUST_LOG`): a level (`info`), optionally with per-target
//! overrides (`warn,quipu::access=info`). The access log is the `quipu::access` target at
//! `info`; `QUIPU_LOG=info,quipu::access=off` turns it off. No secret is ever logged: keys
//! appear only by their public id.

use log::{LevelFilter, Log, Metadata, Record};
use std::cell::RefCell;
use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::OnceLock;
use std::time::Duration;

/// A line longer than this does not keep its buffer for the next record.
const MAX_KEPT_LINE: usize = 16 * 1024;

/// How long the writer lets lines gather after the first one of a batch.
pub const GATHER: Duration = Duration::from_millis(20);

/// Lines that may wait for the writer before a logging thread blocks.
pub const QUEUED_LINES: usize = 16 * 1024;

/// A batch is written once it holds this many bytes, even if more lines wait.
const MAX_BATCH_BYTES: usize = 256 * 1024;

/// How long [`Log::flush`] waits for the writer (a stalled stderr must not hang an exit).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The writer thread's queue, once [`write_in_batches`] has started it.
static BATCHED: OnceLock<SyncSender<ToWriter>> = OnceLock::new();

enum ToWriter {
    Line(Box<[u8]>),
    /// Answered once every line queued before it is written.
    Flush(mpsc::Sender<()>),
}

/// From now on, lines go to stderr in batches, through a writer thread (see the module docs).
/// Idempotent.
pub fn write_in_batches() -> std::io::Result<()> {
    if BATCHED.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = mpsc::sync_channel(QUEUED_LINES);
    std::thread::Builder::new()
        .name("quipu-log".into())
        .spawn(move || {
            crate::threads::run_behind_requests();
            write_batches(rx, &mut std::io::stderr())
        })?;
    // A racing second call's sender is dropped, and its thread ends at once.
    let _ = BATCHED.set(tx);
    Ok(())
}

/// The writer thread: waits for a line, lets more gather for [`GATHER`], writes them all.
fn write_batches(rx: Receiver<ToWriter>, out: &mut impl Write) {
    let mut batch = Vec::with_capacity(64 * 1024);
    let mut waiting = Vec::new();
    while let Ok(first) = rx.recv() {
        if matches!(first, ToWriter::Line(_)) {
            std::thread::sleep(GATHER);
        }
        let mut next = Some(first);
        while let Some(msg) = next {
            match msg {
                ToWriter::Line(line) => batch.extend_from_slice(&line),
                ToWriter::Flush(done) => waiting.push(done),
            }
            next = if batch.len() < MAX_BATCH_BYTES {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let _ = out.write_all(&batch);
        let _ = out.flush();
        batch.clear();
        if batch.capacity() > 4 * MAX_BATCH_BYTES {
            batch = Vec::with_capacity(64 * 1024);
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

thread_local! {
    /// The line being formatted, reused across records of one thread.
    static LINE: RefCell<Line> = const {
        RefCell::new(Line::new())
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
    /// An empty buffer whose cached second matches no clock reading.
    const fn new() -> Line {
        Line {
            buf: Vec::new(),
            second: u64::MAX,
            prefix: [0; 20],
        }
    }

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

    /// Starts a line: `2026-11-23T18:47:28.478Z INFO  target` (the level padded to 5).
    fn start(&mut self, level: log::Level, target: &str) {
        self.buf.clear();
        self.push_timestamp();
        self.buf.push(b' ');
        let level = level.as_str();
        self.buf.extend_from_slice(level.as_bytes());
        self.buf.extend(std::iter::repeat_n(
            b' ',
            5usize.saturating_sub(level.len()) + 1,
        ));
        self.buf.extend_from_slice(target.as_bytes());
    }

    /// Sends the finished line to stderr (through the writer thread, once it runs).
    fn emit(&mut self) {
        match BATCHED.get() {
            // Blocks only when QUEUED_LINES already wait (stderr has stalled).
            Some(writer) => {
                let _ = writer.send(ToWriter::Line(self.buf.as_slice().into()));
            }
            None => {
                let _ = std::io::stderr().lock().write_all(&self.buf);
            }
        }
        if self.buf.capacity() > MAX_KEPT_LINE {
            self.buf = Vec::new();
        }
    }
}

/// Writes an `info` line of `target` whose message `fill` writes as `key=value` fields,
/// without `format_args!`: the access log writes one per request, and formatting its 17
/// fields through `Display` cost more than the rest of the line. The caller checks
/// `log::log_enabled!` first; the line looks exactly like one from `log::info!`.
pub fn info_fields(target: &str, fill: impl FnOnce(&mut Fields<'_>)) {
    LINE.with(|cell| {
        let Ok(mut line) = cell.try_borrow_mut() else {
            return;
        };
        let line = &mut *line;
        line.start(log::Level::Info, target);
        fill(&mut Fields(&mut line.buf));
        line.buf.push(b'\n');
        line.emit();
    });
}

/// The `key=value` fields of a line being written by [`info_fields`].
pub struct Fields<'a>(&'a mut Vec<u8>);

impl Fields<'_> {
    fn key(&mut self, key: &str) {
        self.0.push(b' ');
        self.0.extend_from_slice(key.as_bytes());
        self.0.push(b'=');
    }

    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        self.0.extend_from_slice(value.as_bytes());
        self
    }

    pub fn num(&mut self, key: &str, value: u64) -> &mut Self {
        self.key(key);
        self.0
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        self
    }

    /// Milliseconds with three decimals (`12.345`), or `-`.
    pub fn millis(&mut self, key: &str, value: Option<std::time::Duration>) -> &mut Self {
        self.key(key);
        match value {
            Some(d) => {
                let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                self.0
                    .extend_from_slice(itoa::Buffer::new().format(us / 1000).as_bytes());
                let frac = us % 1000;
                self.0.extend_from_slice(&[
                    b'.',
                    b'0' + (frac / 100) as u8,
                    b'0' + (frac / 10 % 10) as u8,
                    b'0' + (frac % 10) as u8,
                ]);
            }
            None => self.0.push(b'-'),
        }
        self
    }

    /// Any other value, through its `Display`.
    pub fn display(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Self {
        self.key(key);
        let _ = write!(self.0, "{value}");
        self
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
            line.start(record.level(), record.target());
            let _ = writeln!(line.buf, " {}", record.args());
            line.emit();
        });
    }

    fn flush(&self) {
        if let Some(writer) = BATCHED.get() {
            let (done, written) = mpsc::channel();
            if writer.send(ToWriter::Flush(done)).is_ok() {
                let _ = written.recv_timeout(FLUSH_TIMEOUT);
            }
        }
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
    use std::sync::{Arc, Mutex};

    /// Records every `write` call, to count the system calls a real stderr would see.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_starts_with_the_timestamp_the_padded_level_and_the_target() {
        let mut line = Line::new();
        for level in [log::Level::Info, log::Level::Error, log::Level::Warn] {
            line.start(level, "quipu::access");
            let text = String::from_utf8(line.buf.clone()).unwrap();
            let stamp = "2026-11-23T18:47:28.478Z".len();
            assert_eq!(
                text[stamp..],
                format!(" {level:<5} quipu::access"),
                "{text}"
            );
        }
    }

    #[test]
    fn fields_match_what_display_would_write() {
        let mut buf = Vec::new();
        Fields(&mut buf)
            .str("a", "x")
            .num("n", 0)
            .num("big", u64::MAX)
            .num("mid", 1_000_507)
            .millis("t", Some(Duration::from_micros(12_345)))
            .millis("small", Some(Duration::from_micros(7)))
            .millis("none", None)
            .display("d", 1.5);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            format!(
                " a=x n=0 big={} mid=1000507 t=12.345 small=0.007 none=- d=1.5",
                u64::MAX
            )
        );
    }

    #[test]
    fn lines_are_written_in_order_in_few_writes_and_a_flush_waits_for_them() {
        let (tx, rx) = mpsc::sync_channel(QUEUED_LINES);
        let recorder = Recorder::default();
        let mut out = recorder.clone();
        let writer = std::thread::spawn(move || write_batches(rx, &mut out));
        let lines: Vec<String> = (0..2000).map(|i| format!("line {i}\n")).collect();
        for line in &lines {
            tx.send(ToWriter::Line(line.as_bytes().into())).unwrap();
        }
        let (done, written) = mpsc::channel();
        tx.send(ToWriter::Flush(done)).unwrap();
        written.recv_timeout(Duration::from_secs(10)).unwrap();
        // Everything sent before the flush is out once it is answered, in order.
        let writes = recorder.0.lock().unwrap().clone();
        assert_eq!(writes.concat(), lines.concat().into_bytes());
        // 2,000 lines sent within one gathering pause: a handful of writes, not one per line.
        assert!(writes.len() <= 20, "{} writes for 2000 lines", writes.len());
        drop(tx);
        writer.join().unwrap();
    }

    #[test]
    fn timestamps_are_utc_with_milliseconds_and_the_cached_prefix_follows_the_clock() {
        let mut line = Line::new();
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
