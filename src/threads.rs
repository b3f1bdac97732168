//! Thread priorities: the request path first, bookkeeping after it.
//!
//! The ledger writer, the key refresh and the log writer run on threads of their own, off the
//! request path. When they share a busy core with the proxy's workers, a ledger commit
//! (a few hundred rows, about a millisecond of CPU) used to delay the requests that arrived
//! during it: that was most of Quipu's p99 at concurrency 1 with everything on one core. At
//! nice +10 the scheduler gives such a thread about a tenth of a contended core and lets a
//! worker that wakes up preempt it. A tenth is still several times what the ledger needs at full
//! load, and `store.max_unstored_rows` bounds the backlog if it ever falls behind. The SQLite
//! writer also yields the core every few rows while it keeps up ([`let_requests_run`]): the
//! nice value alone let a batch run out its time slice first.

use std::sync::atomic::{AtomicBool, Ordering};

/// The nice value of bookkeeping threads (0 is the default, 19 the lowest priority).
pub const BOOKKEEPING_NICE: i32 = 10;

/// Lowers the calling thread's priority to [`BOOKKEEPING_NICE`]. On Linux a nice value belongs
/// to a thread, not to the whole process. Failure (a sandbox that forbids it) only costs
/// latency, so it is logged at debug level and otherwise ignored.
pub fn run_behind_requests() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), BOOKKEEPING_NICE) {
        log::debug!("could not lower a bookkeeping thread's priority: {e}");
    }
}

/// Rows a bookkeeping thread writes between two [`let_requests_run`] calls: about 25 µs of
/// SQLite work at ~3 µs a row.
pub const ROWS_PER_YIELD: usize = 8;

/// The largest backlog at which the ledger writer yields. More queued rows than this at the
/// start of a pass mean the writer is behind (a saturated core leaves it only its nice share);
/// there, each yield would push it further back — the scheduler moves a yielding thread's
/// deadline a whole weighted slice, tens of milliseconds at nice +10 — and its backlog would
/// grow without bound. So a writer that falls behind stops yielding until it has caught up.
/// (Decided on the backlog, not on the size of one store transaction: a small
/// `store.ledger_batch_rows`, or a failed batch split in halves, makes small transactions of a
/// large backlog.)
pub const MAX_YIELDING_BACKLOG: usize = 128;

/// Whether the ledger writer is behind, as of the start of its last pass.
static LEDGER_BEHIND: AtomicBool = AtomicBool::new(false);

/// Whether a writer that found `backlog` rows queued is keeping up.
fn keeps_up(backlog: usize) -> bool {
    backlog <= MAX_YIELDING_BACKLOG
}

/// Called by the ledger writer at the start of each pass with the rows it found queued.
pub fn note_ledger_backlog(backlog: usize) {
    LEDGER_BEHIND.store(!keeps_up(backlog), Ordering::Relaxed);
}

/// Whether the store's ledger writes should [`let_requests_run`] every [`ROWS_PER_YIELD`] rows.
pub fn ledger_yields() -> bool {
    !LEDGER_BEHIND.load(Ordering::Relaxed)
}

/// Gives the core to a request that is waiting for it, if there is one. A nice value alone
/// does not do that: the scheduler protects a running thread's time slice (EEVDF's
/// run-to-parity, milliseconds), so a worker woken by a request could wait for a whole ledger
/// batch. Yielding gives up the rest of the slice; with nobody waiting it costs one cheap
/// system call.
pub fn let_requests_run() {
    std::thread::yield_now();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_yields_only_while_its_backlog_is_small() {
        assert!(keeps_up(0));
        assert!(keeps_up(MAX_YIELDING_BACKLOG));
        assert!(!keeps_up(MAX_YIELDING_BACKLOG + 1));
        assert!(!keeps_up(100_000));
    }

    #[test]
    fn lowers_only_the_calling_thread() {
        let own = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let lowered = std::thread::spawn(|| {
            run_behind_requests();
            rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
        })
        .join()
        .unwrap();
        if own < BOOKKEEPING_NICE {
            assert_eq!(lowered, BOOKKEEPING_NICE);
        }
        let still = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert_eq!(still, own, "the calling thread keeps its priority");
    }
}
