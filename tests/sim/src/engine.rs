//! The engine's own scheduler: at most `--max-num-seqs` requests generate at once, and the
//! rest wait first come, first served, whoever sent them — as vLLM's scheduler does (and
//! SGLang's, and llama.cpp's slots with `--parallel`). A waiting request starts when a running
//! one finishes or its client disconnects; a waiting client that disconnects leaves the queue.
//!
//! It also keeps what the engine would report (running and waiting gauges, rendered per
//! flavor for `GET /metrics` and llama.cpp's `GET /slots`) and what a benchmark needs: busy
//! slot-seconds over a window, for slot utilization = busy / (slots × elapsed).

use crate::render::Flavor;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Instant;
use tokio::sync::oneshot;

pub struct Engine {
    /// `None`: unbounded, every request generates at once (the simulator's old behaviour).
    max: Option<usize>,
    state: Mutex<State>,
}

struct State {
    running: usize,
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
    next_ticket: u64,
    /// The utilization window (since start or the last `/sim/reset`).
    window_start: Instant,
    /// Slot-seconds busy in the window, up to `last_change`.
    busy: f64,
    last_change: Instant,
    /// Requests started in the window, and how many of them had to wait first.
    started: u64,
    waited: u64,
}

impl State {
    /// Brings `busy` up to `now`; call before `running` changes.
    fn account(&mut self, now: Instant) {
        let dt = now
            .saturating_duration_since(self.last_change)
            .as_secs_f64();
        self.busy += self.running as f64 * dt;
        self.last_change = now;
    }
}

/// A generating request's slot; dropping it frees the slot for the next waiter.
pub struct Slot<'a> {
    engine: &'a Engine,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.engine.release();
    }
}

/// A request waiting for a slot. Dropped before it got one, it leaves the queue; dropped after
/// the slot was handed to it but before it took it, it passes the slot on.
pub struct Waiting<'a> {
    engine: &'a Engine,
    ticket: u64,
    rx: oneshot::Receiver<()>,
    taken: bool,
}

impl<'a> Waiting<'a> {
    /// Waits for the slot (cancel-safe: drop the future to give up).
    pub async fn slot(&mut self) -> Option<Slot<'a>> {
        (&mut self.rx).await.ok()?;
        self.taken = true;
        Some(Slot {
            engine: self.engine,
        })
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let mut st = self.engine.state.lock();
        if let Some(i) = st.waiting.iter().position(|(t, _)| *t == self.ticket) {
            st.waiting.remove(i);
            return;
        }
        drop(st);
        // Not in the queue any more: the slot was handed over; pass it on.
        if self.rx.try_recv().is_ok() {
            self.engine.release();
        }
    }
}

pub enum Admission<'a> {
    Now(Slot<'a>),
    Wait(Waiting<'a>),
}

impl Engine {
    pub fn new(max_num_seqs: Option<usize>) -> Engine {
        let now = Instant::now();
        Engine {
            max: max_num_seqs,
            state: Mutex::new(State {
                running: 0,
                waiting: VecDeque::new(),
                next_ticket: 0,
                window_start: now,
                busy: 0.0,
                last_change: now,
                started: 0,
                waited: 0,
            }),
        }
    }

    /// A request asks for a slot: it starts now if one is free and nobody waits, else it
    /// joins the end of the queue.
    pub fn admit(&self) -> Admission<'_> {
        let mut st = self.state.lock();
        if st.waiting.is_empty() && self.max.is_none_or(|m| st.running < m) {
            st.account(Instant::now());
            st.running += 1;
            st.started += 1;
            return Admission::Now(Slot { engine: self });
        }
        st.next_ticket += 1;
        let ticket = st.next_ticket;
        let (tx, rx) = oneshot::channel();
        st.waiting.push_back((ticket, tx));
        Admission::Wait(Waiting {
            engine: self,
            ticket,
            rx,
            taken: false,
        })
    }

    /// A running request ended: its slot goes to the oldest waiter, or is freed.
    fn release(&self) {
        let mut st = self.state.lock();
        while let Some((_, tx)) = st.waiting.pop_front() {
            if tx.send(()).is_ok() {
                st.started += 1;
                st.waited += 1;
                return;
            }
        }
        st.account(Instant::now());
        st.running = st.running.saturating_sub(1);
    }

    /// Running and waiting now.
    pub fn load(&self) -> (usize, usize) {
        let st = self.state.lock();
        (st.running, st.waiting.len())
    }

    /// Starts a new utilization window.
    pub fn reset_window(&self) {
        let mut st = self.state.lock();
        let now = Instant::now();
        st.account(now);
        st.window_start = now;
        st.busy = 0.0;
        st.started = 0;
        st.waited = 0;
    }

    /// `/sim/engine`: gauges, and the window's busy slot-seconds and utilization.
    pub fn report(&self) -> Value {
        let mut st = self.state.lock();
        let now = Instant::now();
        st.account(now);
        let elapsed = now.duration_since(st.window_start).as_secs_f64();
        let utilization = self
            .max
            .filter(|_| elapsed > 0.0)
            .map(|m| st.busy / (m as f64 * elapsed));
        json!({
            "max_num_seqs": self.max,
            "running": st.running,
            "waiting": st.waiting.len(),
            "busy_slot_seconds": st.busy,
            "elapsed_seconds": elapsed,
            "utilization": utilization,
            "started": st.started,
            "started_after_waiting": st.waited,
        })
    }

    /// `GET /metrics`: the running and waiting gauges under the flavor's own names.
    pub fn metrics(&self, flavor: Flavor, model: &str) -> String {
        let (running, waiting) = self.load();
        let model = model.replace('\\', "\\\\").replace('"', "\\\"");
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, labels: &str, v: String| {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{labels} {v}\n"
            );
        };
        match flavor {
            Flavor::Vllm => {
                let labels = format!("{{engine=\"0\",model_name=\"{model}\"}}");
                let (r, w) = (format!("{running}.0"), format!("{waiting}.0"));
                gauge(
                    "vllm:num_requests_running",
                    "Number of requests in model execution batches.",
                    &labels,
                    r,
                );
                gauge(
                    "vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.",
                    &labels,
                    w,
                );
            }
            Flavor::Sglang => {
                let labels = format!("{{model_name=\"{model}\"}}");
                let (r, w) = (format!("{running}.0"), format!("{waiting}.0"));
                gauge(
                    "sglang:num_running_reqs",
                    "The number of running requests.",
                    &labels,
                    r,
                );
                gauge(
                    "sglang:num_queue_reqs",
                    "The number of requests in the waiting queue.",
                    &labels,
                    w,
                );
            }
            Flavor::Llamacpp => {
                gauge(
                    "llamacpp:requests_processing",
                    "Number of requests processing.",
                    "",
                    running.to_string(),
                );
                gauge(
                    "llamacpp:requests_deferred",
                    "Number of requests deferred.",
                    "",
                    waiting.to_string(),
                );
            }
        }
        out
    }

    /// llama.cpp's `GET /slots`: one object per slot, the first `running` processing. With no
    /// `--max-num-seqs`, one slot per running request.
    pub fn slots(&self, n_ctx: usize) -> Value {
        let (running, _) = self.load();
        let n = self.max.unwrap_or(running);
        Value::Array(
            (0..n)
                .map(|id| {
                    json!({"id": id, "id_task": if id < running { id as i64 } else { -1 },
                           "n_ctx": n_ctx, "speculative": false, "is_processing": id < running})
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn slot(a: Admission<'_>) -> Slot<'_> {
        match a {
            Admission::Now(s) => s,
            Admission::Wait(_) => panic!("had to wait"),
        }
    }

    fn waiting(a: Admission<'_>) -> Waiting<'_> {
        match a {
            Admission::Wait(w) => w,
            Admission::Now(_) => panic!("started at once"),
        }
    }

    #[tokio::test]
    async fn beyond_max_num_seqs_requests_wait_in_arrival_order() {
        let e = Engine::new(Some(2));
        let a = slot(e.admit());
        let b = slot(e.admit());
        let mut c = waiting(e.admit());
        let mut d = waiting(e.admit());
        assert_eq!(e.load(), (2, 2));
        drop(a);
        let c_slot = c.slot().await.unwrap();
        assert_eq!(e.load(), (2, 1));
        drop(b);
        let d_slot = d.slot().await.unwrap();
        assert_eq!(e.load(), (2, 0));
        drop((c_slot, d_slot));
        assert_eq!(e.load(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_gives_up_its_place_or_its_slot() {
        let e = Engine::new(Some(1));
        let a = slot(e.admit());
        let b = waiting(e.admit());
        let mut c = waiting(e.admit());
        drop(b); // gone before its turn
        assert_eq!(e.load(), (1, 1));
        let d = waiting(e.admit());
        drop(a); // the slot goes to c
        drop(c.slot().await.unwrap()); // c ends: the slot goes to d
        drop(d); // d leaves before taking it: the slot is passed on, nobody left
        assert_eq!(e.load(), (0, 0));
    }

    #[test]
    fn unbounded_never_waits_and_gauges_follow_the_flavor() {
        let e = Engine::new(None);
        let slots: Vec<Slot<'_>> = (0..50).map(|_| slot(e.admit())).collect();
        assert_eq!(e.load(), (50, 0));
        let text = e.metrics(Flavor::Vllm, "m\"x");
        assert!(
            text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"m\\\"x\"} 50.0\n")
        );
        assert!(text.contains("# TYPE vllm:num_requests_waiting gauge\n"));
        assert!(e
            .metrics(Flavor::Llamacpp, "m")
            .contains("llamacpp:requests_deferred 0\n"));
        assert!(e
            .metrics(Flavor::Sglang, "m")
            .contains("sglang:num_running_reqs{model_name=\"m\"} 50.0\n"));
        drop(slots);
        assert_eq!(e.load(), (0, 0));
        assert_eq!(e.report()["utilization"], Value::Null);
    }

    #[test]
    fn utilization_counts_busy_slot_time() {
        let e = Engine::new(Some(4));
        let start = Instant::now();
        let s = slot(e.admit());
        std::thread::sleep(Duration::from_millis(40));
        let r = e.report();
        drop(s);
        let elapsed = start.elapsed().as_secs_f64();
        let busy = r["busy_slot_seconds"].as_f64().unwrap();
        assert!(busy > 0.035 && busy <= elapsed, "{r}");
        let u = r["utilization"].as_f64().unwrap();
        assert!(u > 0.2 && u <= 0.25 + 1e-9, "one of four slots: {r}");
        e.reset_window();
        assert_eq!(e.report()["started"], 0);
    }
}
