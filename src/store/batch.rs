//! Writing to the store in batches, off the request path: what the ledger writer
//! (`billing::ledger`) and the stored-responses writer (`proxy::responses`) share.
//!
//! Producers [`BatchQueue::push`] without blocking: a plain vector under a mutex (tens of
//! nanoseconds, measured against a channel, whose send wakes the writer's thread once per
//! item). Only an item that lands in an empty queue wakes the writer ([`run`]); it then waits
//! out the rest of the interval since its last pass, takes what queued, hands it to its
//! [`Sink`] in batches of at most N, in the order pushed, and counts what is owed: an item is
//! owed from its push until the batch holding it has been handed on ([`BatchQueue::owed`]).
//! An idle writer never wakes (a timer that ticked every interval cost an idle gateway a
//! wake-up every 10 ms). One store transaction per batch turns a transaction per item into
//! one per interval under load; items pushed while a batch is being written wait for the next
//! pass.
//!
//! What a failed write means is the sink's own policy: the ledger retries with backoff, splits a
//! refused batch to find the bad row, sets it aside and spills what it could not store at
//! shutdown; stored responses are dropped on failure. Whatever the sink did, its batch counts
//! as paid when [`Sink::write`] returns.

use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// Items waiting for a writer.
pub struct BatchQueue<T> {
    items: Mutex<Vec<T>>,
    /// Items owed to the store: queued, or taken by the writer and not yet handed on. Counted
    /// up under the queue's lock (so the writer never takes an item before it is counted),
    /// down by the writer once the batch holding it is written.
    owed: AtomicUsize,
    /// Wakes the writer when an item lands in an empty queue: once a pass, not once an item.
    queued: Notify,
}

impl<T> Default for BatchQueue<T> {
    fn default() -> Self {
        BatchQueue {
            items: Mutex::new(Vec::new()),
            owed: AtomicUsize::new(0),
            queued: Notify::new(),
        }
    }
}

impl<T> BatchQueue<T> {
    /// Queues an item; never blocks for longer than another push. Only the first item of a
    /// pass wakes the writer.
    pub fn push(&self, item: T) {
        let first = {
            let mut items = self.items.lock();
            items.push(item);
            self.owed.fetch_add(1, Ordering::Relaxed);
            items.len() == 1
        };
        if first {
            self.queued.notify_one();
        }
    }

    /// Items not yet handed on: queued, or taken by the writer and being written. One atomic
    /// load, no lock.
    pub fn owed(&self) -> usize {
        self.owed.load(Ordering::Relaxed)
    }

    fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.items.lock())
    }

    fn paid(&self, n: usize) {
        self.owed.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Where a writer's batches go, with its failure policy.
pub trait Sink<T>: Sync {
    /// Writes one batch (at most the writer's batch size, in the order pushed). Its items are
    /// paid once this returns, whether they were stored, set aside or dropped.
    fn write(&self, batch: Vec<T>) -> impl Future<Output = ()> + Send;

    /// `taken` items were just taken from the queue; `owed` are owed in all.
    fn taken(&self, _taken: usize, _owed: usize) {}

    /// A batch was written; `owed` are owed now.
    fn paid(&self, _owed: usize) {}
}

/// Writes what `queue` holds, at most once every `interval` and not at all while it is empty
/// (an idle writer never wakes), in batches of at most `max_batch` items, until
/// `stop` turns true (or its sender is dropped); then writes what is still queued (items pushed
/// by requests still finishing after the signal land in that last pass) and returns. With no
/// `stop`, runs for good.
pub async fn run<T: Send, S: Sink<T>>(
    queue: &BatchQueue<T>,
    sink: &S,
    interval: Duration,
    max_batch: usize,
    stop: Option<watch::Receiver<bool>>,
) {
    let mut stop = stop;
    let mut last = tokio::time::Instant::now();
    loop {
        // Asleep while nothing is queued; then at most one pass per interval.
        let mut stopping = until_stop(queue.queued.notified(), &mut stop).await;
        if !stopping {
            stopping = until_stop(tokio::time::sleep_until(last + interval), &mut stop).await;
        }
        last = tokio::time::Instant::now();
        drain(queue, sink, max_batch).await;
        if stopping {
            drain(queue, sink, max_batch).await;
            return;
        }
    }
}

/// Awaits `f`; whether `stop` turned true (or its sender went away) first.
async fn until_stop(f: impl Future<Output = ()>, stop: &mut Option<watch::Receiver<bool>>) -> bool {
    match stop.as_mut() {
        Some(stop) => tokio::select! {
            _ = f => false,
            _ = stop.wait_for(|s| *s) => true,
        },
        None => {
            f.await;
            false
        }
    }
}

/// Takes what queued and writes it, `max_batch` items at a time.
async fn drain<T: Send, S: Sink<T>>(queue: &BatchQueue<T>, sink: &S, max_batch: usize) {
    let mut items = queue.take();
    sink.taken(items.len(), queue.owed());
    while !items.is_empty() {
        let rest = items.split_off(items.len().min(max_batch.max(1)));
        let n = items.len();
        sink.write(items).await;
        queue.paid(n);
        sink.paid(queue.owed());
        items = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// Records every batch it is handed; on its first write, pushes `during` into the queue
    /// (a producer racing the writer) and notes what was owed meanwhile.
    #[derive(Default)]
    struct Recorder {
        queue: Arc<BatchQueue<u32>>,
        batches: Mutex<Vec<Vec<u32>>>,
        during: Mutex<Vec<u32>>,
        owed_while_writing: Mutex<Vec<usize>>,
        passes: AtomicUsize,
    }

    impl Sink<u32> for Recorder {
        async fn write(&self, batch: Vec<u32>) {
            for item in std::mem::take(&mut *self.during.lock()) {
                self.queue.push(item);
            }
            self.owed_while_writing.lock().push(self.queue.owed());
            self.batches.lock().push(batch);
        }

        fn taken(&self, _taken: usize, _owed: usize) {
            self.passes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn recorder(queue: &Arc<BatchQueue<u32>>, during: Vec<u32>) -> Recorder {
        Recorder {
            queue: Arc::clone(queue),
            during: Mutex::new(during),
            ..Recorder::default()
        }
    }

    #[tokio::test]
    async fn what_queued_is_handed_on_in_order_in_batches_of_at_most_n() {
        let queue = Arc::new(BatchQueue::default());
        for i in 0..5 {
            queue.push(i);
        }
        assert_eq!(queue.owed(), 5);
        let sink = recorder(&queue, vec![]);
        let (_tx, stop) = watch::channel(true);
        run(&queue, &sink, Duration::from_secs(3600), 2, Some(stop)).await;
        assert_eq!(*sink.batches.lock(), [vec![0, 1], vec![2, 3], vec![4]]);
        // Owed while each batch was written: the batch and those behind it.
        assert_eq!(*sink.owed_while_writing.lock(), [5, 3, 1]);
        assert_eq!(queue.owed(), 0);
    }

    #[tokio::test]
    async fn items_pushed_while_a_batch_is_written_are_owed_and_go_in_the_next_pass() {
        let queue = Arc::new(BatchQueue::default());
        for i in 0..3 {
            queue.push(i);
        }
        let sink = recorder(&queue, vec![10, 11]);
        let (_tx, stop) = watch::channel(true);
        run(&queue, &sink, Duration::from_secs(3600), 2, Some(stop)).await;
        // The pass that took 0..3 writes them alone; 10 and 11 wait for the pass at the stop.
        assert_eq!(
            *sink.batches.lock(),
            [vec![0, 1], vec![2], vec![10, 11]],
            "nothing lost, nothing written twice, order kept"
        );
        assert_eq!(*sink.owed_while_writing.lock(), [5, 3, 2]);
        assert_eq!(queue.owed(), 0);
    }

    /// Waits, at most 10 s, until `sink` has been handed `n` items in all.
    async fn until_written(sink: &Recorder, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while sink.batches.lock().iter().map(Vec::len).sum::<usize>() < n {
            assert!(Instant::now() < deadline, "{:?}", sink.batches.lock());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn each_interval_gathers_what_queued_since_the_last_one() {
        let queue = Arc::new(BatchQueue::default());
        let sink = Arc::new(recorder(&queue, vec![]));
        let (tx, stop) = watch::channel(false);
        let writer = tokio::spawn({
            let (queue, sink) = (Arc::clone(&queue), Arc::clone(&sink));
            async move { run(&queue, &*sink, Duration::from_millis(5), 100, Some(stop)).await }
        });
        for i in 0..3 {
            queue.push(i);
        }
        until_written(&sink, 3).await;
        for i in 3..5 {
            queue.push(i);
        }
        // Written by the ticks alone, the writer still running.
        until_written(&sink, 5).await;
        assert_eq!(queue.owed(), 0);
        assert_eq!(sink.batches.lock().concat(), [0, 1, 2, 3, 4]);
        assert!(!writer.is_finished());
        queue.push(5);
        tx.send(true).unwrap();
        writer.await.unwrap();
        assert_eq!(sink.batches.lock().concat(), [0, 1, 2, 3, 4, 5]);
    }

    /// On a paused clock: an hour of intervals with nothing queued passes without the writer
    /// waking; the next item is written at once, the one after within an interval.
    #[tokio::test(start_paused = true)]
    async fn an_idle_writer_sleeps_until_something_is_queued() {
        let queue = Arc::new(BatchQueue::default());
        let sink = Arc::new(recorder(&queue, vec![]));
        let writer = tokio::spawn({
            let (queue, sink) = (Arc::clone(&queue), Arc::clone(&sink));
            async move { run(&queue, &*sink, Duration::from_millis(10), 100, None).await }
        });
        queue.push(0);
        until_written(&sink, 1).await;
        let passes = sink.passes.load(Ordering::Relaxed);
        for _ in 0..360 {
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        assert_eq!(sink.passes.load(Ordering::Relaxed), passes);
        let before = tokio::time::Instant::now();
        queue.push(1);
        queue.push(2);
        until_written(&sink, 3).await;
        assert!(before.elapsed() <= Duration::from_millis(10));
        assert_eq!(sink.batches.lock().concat(), [0, 1, 2]);
        writer.abort();
    }
}
