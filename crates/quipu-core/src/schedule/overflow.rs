//! A request of a tenant below its fair share, arriving when the engine is full, may wait at
//! the head of the engine's own queue instead of behind this gateway's backlog.
//!
//! With several gateways in front of one engine, a slot freed on one of them is held there for
//! its tenant ([`super::hold`]), but that tenant's next request may reach another gateway —
//! a client that opens a connection per request, behind a balancer — where the engine looks
//! full and a backlog waits. There, a tenant below its fair share with nothing queued may send
//! the request on when the engine's fresh report shows its own queue empty and the engine at
//! most full: it runs at once in the slot the other gateway holds, or waits first in the
//! engine's FIFO for the next slot to free anywhere, which is no later than this gateway's
//! queue would have started it. One such request at a time per gateway and replica: it
//! counts as in use, so the engine looks over-full until a request ends, and the report
//! stops everyone while it waits in the engine.
//!
//! A gateway alone never does this: its own queue starts such a request at the next slot to
//! free just as soon, and keeps it out of the engine's FIFO, where it could no longer be
//! reordered.

use super::types::{Dispatch, Millis, Placement, Priority, Ticket};
use super::Scheduler;

impl Scheduler {
    /// Sends `t` to wait in an engine's own queue, if its tenant is below its share.
    pub(super) fn overflow(
        &mut self,
        t: &Ticket,
        class: Priority,
        now: Millis,
    ) -> Option<Dispatch> {
        if self.gateways.count < 2
            || class != Priority::Interactive
            || t.priority != Priority::Interactive
        {
            return None;
        }
        if self.queued_for(t.tenant) > 0 || !self.below_share(t.tenant, t.weight) {
            return None;
        }
        let c = &self.config;
        let (ttl, allowance) = (c.report_ttl, c.engine_queue_allowance);
        let ok = |s: &Scheduler, r: usize| {
            s.replicas[r].available
                && !t.exclude.contains(&r)
                && s.replicas[r].may_overflow(now, ttl, allowance)
        };
        let n = self.replicas.len();
        let replica = t
            .preferred
            .filter(|&p| p < n && ok(self, p))
            .or_else(|| (0..n).map(|k| (self.cursor + k) % n).find(|&r| ok(self, r)))?;
        self.classes[class as usize].dispatch(t.tenant, None, t.cost(), t.weight);
        Some(self.run(t, false, replica, Placement::EngineQueue, now))
    }
}
