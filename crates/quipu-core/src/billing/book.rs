//! One tenant's money on one gateway replica, as a state machine: events in, decisions out.
//!
//! A replica admits a request only against money it holds a **lease** on: part of the
//! tenant's balance the store has set aside for it, with `Σ leases ≤ balance` kept by the
//! store. The I/O layer (`src/billing/accounts.rs`) drives one [`Book`] per tenant: it asks
//! [`Book::admit`] what to do with a request, makes the store calls the book asks for, and
//! hands every answer back. The book does no I/O and reads no clock (times are [`Tick`]s the
//! caller passes in), so every interleaving of reserve, settle, ledger write, lease grant,
//! release and heartbeat can be played out in a test (`book_model`).
//!
//! ## The store's readings, in one frame
//!
//! The store keeps, per (tenant, replica), the lease `amount` and `spent`: the charges of
//! this replica's requests recorded against it (the ledger writer lowers `amount` and raises
//! `spent` by each charge, in the transaction that writes the row), and a `version` that every
//! change raises. Every call that touches the row answers with a [`Reading`] of all three,
//! taken in its transaction. Locally the book counts `settled`: every charge billed here
//! (minus rows the store refused for good). So a reading says exactly how much of what was
//! billed here it already holds (`spent`), whatever was in flight when it was taken:
//!
//! ```text
//! available = amount − (settled − spent) − reserved − releasing
//! ```
//!
//! where `settled − spent` are charges billed here that the reading's `amount` does not
//! reflect yet, `reserved` what requests in flight hold, and `releasing` what is being given
//! back. The newest reading (highest `version`) wins; an older one answered late is ignored.
//! Nothing is ever "corrected" by guessing which writes a reading saw: a charge is counted
//! once, in `spent` or outside it. (Counting a charge both as written and as not yet
//! written strands money: a funded tenant is refused while its balance still holds it.)
//!
//! ## Invariants (proven for every interleaving in `book_model`)
//!
//! - **Safety.** What this replica has reserved or billed but not yet written never exceeds
//!   what the store leases it: `reserved + (settled − spent_now) ≤ amount_now`, so no charge
//!   can take a balance below zero, however many replicas share it.
//! - **No false refusal.** A request is refused for balance only when the balance, minus every
//!   charge not yet written and every reservation in flight, does not cover it: the store had
//!   nothing unleased that would do (one grant asked for all of it), and, with several
//!   replicas, the others were asked to return what they hold idle.
//! - **Exact at rest.** With nothing in flight, the book's view is the store's to the pico-sol.
//!
//! ## What the book asks for
//!
//! At most one lease call (a grant or a release) is in flight per tenant: a request that
//! needs more waits for the call in flight rather than sending its own, so a burst makes one
//! round trip, not a hundred. A release is subtracted before it is sent (admission cannot
//! reserve money being given back); a release whose answer is lost stays subtracted until a
//! reading sent [`Timing::doubt_settle`] after the failure says where the money is. After the
//! store had nothing unleased, requests that do not fit are refused for
//! [`Timing::dry_memory`] without a store call each ([`Book::money_arrived`] ends that early:
//! another replica returned money, or a top-up came). After a lease call failed, requests are
//! refused for [`Timing::failure_memory`]. A lease is admitted against only while the store
//! confirmed it within [`Timing::fence`] (a grant or heartbeat sent since then succeeded):
//! another replica reclaims a lease whose heartbeat is stale, and a replica cut off from the
//! store must stop admitting before that happens.

use super::lease::lease_grant;
use crate::money::Pen;

/// Milliseconds since an origin the caller chooses (a process's start), never read here.
pub type Tick = u64;

/// This replica's lease row on the tenant, as one store transaction saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reading {
    /// Leased and not yet charged.
    pub amount: Pen,
    /// Charges of this replica's requests recorded against the lease, ever.
    pub spent: Pen,
    /// Raised by every change of the row: the newest reading is the truth.
    pub version: i64,
}

/// What a grant call answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantReply {
    /// The row after the grant.
    pub reading: Reading,
    /// Added by this grant (possibly zero).
    pub granted: Pen,
    /// What the other replicas hold on the tenant: what a recall could bring home.
    pub elsewhere: Pen,
}

/// The book's clocks (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timing {
    pub fence: u64,
    pub dry_memory: u64,
    pub failure_memory: u64,
    pub doubt_settle: u64,
}

/// A request's way through admission: the I/O layer keeps one per request and passes it to
/// every [`Book::admit`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pending {
    pub amount: Pen,
    /// Counted among the book's requests in admission.
    counted: bool,
    /// The need of the grant it asked for, until it must ask again.
    asked: Option<Pen>,
    /// Its last grant got less than it needed: the store had nothing more unleased.
    store_short: bool,
    /// The book's [`Book::money_arrived`] count when it asked.
    arrivals: u64,
    elsewhere: Pen,
    recall: Recall,
}

/// Where a request is with calling other replicas' leases home.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Recall {
    NotYet,
    /// Asked; waiting for a replica to say it returned money.
    Waiting,
    /// Over: the wait ended, or there is nobody to ask.
    Over,
}

impl Pending {
    pub fn new(amount: Pen) -> Pending {
        Pending {
            amount,
            counted: false,
            asked: None,
            store_short: false,
            arrivals: 0,
            elsewhere: Pen::ZERO,
            recall: Recall::NotYet,
        }
    }

    /// Whether the book counts it among its requests in admission (see [`Book::forget`]).
    pub fn in_admission(&self) -> bool {
        self.counted
    }

    /// The other replicas said they returned money: ask the store again.
    pub fn money_returned(&mut self) {
        self.asked = None;
    }

    /// No replica answered in time, or there is no channel to them: decide with what is here.
    pub fn recall_over(&mut self) {
        self.recall = Recall::Over;
    }

    /// Its grant for `ask` was answered (the book has it already, see [`Book::granted`]).
    pub fn granted(&mut self, ask: LeaseAsk, reply: &GrantReply) {
        self.elsewhere = reply.elsewhere;
        self.store_short = reply.granted < ask.need;
    }
}

/// What to do next with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Reserved: forward it.
    Admit,
    /// Refuse it.
    Refuse(Refusal),
    /// Ask the store for a lease (the call is this request's to make; answer with
    /// [`Book::granted`]), then call [`Book::admit`] again.
    Ask(LeaseAsk),
    /// Another request's lease call is in flight: wait for it to end, then ask again.
    Wait,
    /// Ask the other replicas to return their idle leases, wait for one to say it did
    /// ([`Pending::money_returned`]) or for the wait to end ([`Pending::recall_over`]), then
    /// ask again.
    Recall,
}

/// A store grant to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseAsk {
    /// What the request needs beyond what this replica has free.
    pub need: Pen,
    /// What the replica would like to hold (its lease chunk); see [`lease_grant`].
    pub want: Pen,
}

impl LeaseAsk {
    /// The grant the store makes for this ask out of `unleased`.
    pub fn grant(&self, unleased: Pen) -> Pen {
        lease_grant(self.need, self.want, unleased)
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The balance, minus what is held in flight, does not cover the request.
    Insufficient { needed: Pen, available: Pen },
    /// A lease call failed a moment ago.
    StoreFailed,
    /// This replica's lease row is gone from the store (it was cut off for longer than the
    /// store keeps a silent replica's rows): its books no longer line up, it must restart.
    LeaseLost,
}

/// One tenant's money on this replica.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Book {
    newest: Option<Reading>,
    /// When an answer first showed this replica's row (see [`Book::apply`]).
    row_known_since: Option<Tick>,
    lost: bool,
    settled: Pen,
    reserved: Pen,
    open: u64,
    /// Requests between their first [`Book::admit`] and its answer.
    admitting: u64,
    releasing: Pen,
    doubtful: Pen,
    doubt_until: Tick,
    /// When the newest confirming call (grant or heartbeat) was sent.
    confirmed: Option<Tick>,
    dry_at: Option<Tick>,
    failed_at: Option<Tick>,
    last_activity: Option<Tick>,
    call_in_flight: bool,
    /// Times money came home to the store (see [`Book::money_arrived`]).
    arrivals: u64,
}

/// What a book holds, for views and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// The lease as the newest reading has it.
    pub lease: Pen,
    /// What a new request could use without asking the store.
    pub available: Pen,
    pub reserved: Pen,
    /// Billed here, not in the newest reading yet.
    pub unrecorded: Pen,
    /// Every charge billed here.
    pub settled: Pen,
    pub open: u64,
}

impl Book {
    fn within(at: Option<Tick>, span: u64, now: Tick) -> bool {
        at.is_some_and(|t| now.saturating_sub(t) < span)
    }

    fn lease(&self) -> Pen {
        self.newest.map_or(Pen::ZERO, |r| r.amount)
    }

    fn unrecorded(&self) -> Pen {
        self.settled - self.newest.map_or(Pen::ZERO, |r| r.spent)
    }

    /// What a new request may use now without asking the store.
    pub fn available(&self) -> Pen {
        self.lease() - self.unrecorded() - self.reserved - self.releasing - self.doubtful
    }

    fn fresh(&self, t: &Timing, now: Tick) -> bool {
        Self::within(self.confirmed, t.fence, now)
    }

    /// The next step for `req` (see [`Step`]). Reserves when it says [`Step::Admit`].
    pub fn admit(&mut self, req: &mut Pending, chunk: Pen, t: &Timing, now: Tick) -> Step {
        self.last_activity = Some(now);
        if !req.counted {
            req.counted = true;
            self.admitting += 1;
        }
        let step = self.next_step(req, chunk, t, now);
        if matches!(step, Step::Admit | Step::Refuse(_)) {
            self.forget(req);
        }
        step
    }

    /// A request leaves admission without an answer (its task was cancelled): it no longer
    /// keeps the tenant's lease from being returned.
    pub fn forget(&mut self, req: &mut Pending) {
        if req.counted {
            req.counted = false;
            self.admitting = self.admitting.saturating_sub(1);
        }
    }

    fn next_step(&mut self, req: &mut Pending, chunk: Pen, t: &Timing, now: Tick) -> Step {
        if self.lost {
            return Step::Refuse(Refusal::LeaseLost);
        }
        let available = self.available();
        if self.fresh(t, now) && available >= req.amount {
            self.reserved += req.amount;
            self.open += 1;
            return Step::Admit;
        }
        if Self::within(self.failed_at, t.failure_memory, now) {
            return Step::Refuse(Refusal::StoreFailed);
        }
        let insufficient = Refusal::Insufficient {
            needed: req.amount,
            available: available.max(Pen::ZERO),
        };
        if req.asked.is_some() && (!req.store_short || req.arrivals != self.arrivals) {
            // Its grant covered it, but requests beside it took the money meanwhile (or the
            // answer came so late that the lease it confirmed is stale already); or money came
            // home since the store said it had none: ask again.
            req.asked = None;
        }
        if req.asked.is_none() {
            if Self::within(self.dry_at, t.dry_memory, now) && self.fresh(t, now) {
                return Step::Refuse(insufficient);
            }
            if self.call_in_flight {
                return Step::Wait;
            }
            let need = (req.amount - available.max(Pen::ZERO)).max(Pen::ZERO);
            self.call_in_flight = true;
            req.asked = Some(need);
            req.arrivals = self.arrivals;
            return Step::Ask(LeaseAsk { need, want: chunk });
        }
        match req.recall {
            Recall::NotYet | Recall::Waiting if req.elsewhere > Pen::ZERO => {
                req.recall = Recall::Waiting;
                Step::Recall
            }
            _ => {
                self.dry_at = Some(now);
                Step::Refuse(insufficient)
            }
        }
    }

    /// A grant this book asked for ended (`sent`: when the call was sent). The request that
    /// asked learns from the answer with [`Pending::granted`] (if it is still there).
    pub fn granted(&mut self, sent: Tick, result: &Result<GrantReply, CallFailed>, now: Tick) {
        self.call_in_flight = false;
        match result {
            Ok(reply) => {
                self.apply(Some(reply.reading), sent, now);
                self.confirmed = self.confirmed.max(Some(sent));
                self.failed_at = None;
                self.dry_at = None;
            }
            Err(CallFailed) => self.failed_at = Some(now),
        }
    }

    /// Whether a grant or release is in flight.
    pub fn call_in_flight(&self) -> bool {
        self.call_in_flight
    }

    /// Whether this replica's row is gone from the store (see [`Refusal::LeaseLost`]).
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// A reading of the row from a call sent at `sent` (a heartbeat, a ledger write, a
    /// release), answered `now`; `None`: the store has no row of this replica for the tenant.
    pub fn apply(&mut self, reading: Option<Reading>, sent: Tick, now: Tick) {
        match reading {
            Some(r) => {
                if self.newest.is_none_or(|n| r.version > n.version) {
                    self.newest = Some(r);
                }
                self.row_known_since = Some(self.row_known_since.map_or(now, |k| k.min(now)));
                if self.doubtful > Pen::ZERO && sent >= self.doubt_until {
                    self.doubtful = Pen::ZERO;
                }
            }
            // No row is news only from a call sent after an answer showed the row: an older
            // call may have run before the grant that created it. Once created, the row is
            // only deleted after the replica was silent for far longer than the fence.
            None => {
                if self.row_known_since.is_some_and(|k| sent > k) {
                    self.lost = true;
                }
            }
        }
    }

    /// A heartbeat sent at `sent` succeeded (answered `now`): the lease is confirmed as of
    /// then. `reading` is the row it returned for this tenant (`None`: none).
    pub fn heartbeat(&mut self, reading: Option<Reading>, sent: Tick, now: Tick) {
        self.apply(reading, sent, now);
        self.confirmed = self.confirmed.max(Some(sent));
    }

    /// A request ended: its reservation is replaced by its charge, capped at the reservation.
    /// Returns what is billed.
    pub fn settle(&mut self, reserved: Pen, charge: Pen) -> Pen {
        let billed = charge.min(reserved).max(Pen::ZERO);
        self.reserved -= reserved;
        self.settled += billed;
        self.open = self.open.saturating_sub(1);
        billed
    }

    /// The store refused a charge for good (its row is in the dead-letter table): it will
    /// never be recorded against the lease.
    pub fn abandon(&mut self, charge: Pen) {
        self.settled -= charge;
    }

    /// Gives back what is free when the tenant has been idle for `idle_for` with nothing in
    /// flight or unwritten: the amount to release (already subtracted), if any.
    pub fn release_idle(&mut self, idle_for: u64, now: Tick) -> Option<Pen> {
        let idle = self
            .last_activity
            .is_none_or(|t| now.saturating_sub(t) >= idle_for);
        let busy = self.open > 0 || self.admitting > 0 || self.unrecorded() != Pen::ZERO;
        if !idle || busy {
            return None;
        }
        self.release_free()
    }

    /// Gives back what nothing here needs, at once (another replica asked for it): the amount
    /// to release (already subtracted), if any.
    pub fn release_free(&mut self) -> Option<Pen> {
        let free = self.available();
        if self.call_in_flight || self.lost || free <= Pen::ZERO {
            return None;
        }
        self.call_in_flight = true;
        self.releasing += free;
        // What is given back is unleased in the store again.
        self.money_arrived();
        Some(free)
    }

    /// A release of `amount` sent at `sent` ended; `Ok` carries the row after it.
    pub fn released(
        &mut self,
        amount: Pen,
        sent: Tick,
        result: Result<Option<Reading>, CallFailed>,
        t: &Timing,
        now: Tick,
    ) {
        self.call_in_flight = false;
        self.releasing -= amount;
        match result {
            Ok(reading) => self.apply(reading, sent, now),
            Err(CallFailed) => {
                // It may have committed, or may still: keep it subtracted until a reading
                // sent well after this says where the money is.
                self.doubtful += amount;
                self.doubt_until = now.saturating_add(t.doubt_settle);
            }
        }
    }

    /// Another replica returned money on this tenant, or it was topped up: the store may have
    /// unleased money again.
    pub fn money_arrived(&mut self) {
        self.dry_at = None;
        self.arrivals = self.arrivals.wrapping_add(1);
    }

    /// Whether this book holds nothing and may be forgotten.
    pub fn is_empty(&self) -> bool {
        self.open == 0 && self.lease() == Pen::ZERO && self.unrecorded() == Pen::ZERO
    }

    pub fn held(&self) -> Held {
        Held {
            lease: self.lease(),
            available: self.available(),
            reserved: self.reserved,
            unrecorded: self.unrecorded(),
            settled: self.settled,
            open: self.open,
        }
    }
}

/// A store call failed or timed out: it may or may not have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallFailed;

/// What a tenant may use, as `/v1/account` shows it: the store's `balance` and this replica's
/// lease row, read in one transaction, and this replica's `settled` and `reserved` read after
/// it. Charges billed here that the snapshot's `spent` does not hold are not in its balance
/// yet (`pending`). Never below zero while the book's safety invariant holds.
pub fn account_view(balance: Pen, snapshot: Option<Reading>, held: &Held) -> AccountMoney {
    let pending = held.settled - snapshot.map_or(Pen::ZERO, |r| r.spent);
    AccountMoney {
        pending,
        reserved: held.reserved,
        available: balance - pending - held.reserved,
    }
}

/// The money lines of an account view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountMoney {
    pub pending: Pen,
    pub reserved: Pen,
    pub available: Pen,
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        fence: 15_000,
        dry_memory: 1_000,
        failure_memory: 1_000,
        doubt_settle: 2_000,
    };

    fn s(x: &str) -> Pen {
        Pen::parse(x, 12).unwrap()
    }

    fn reading(amount: &str, spent: &str, version: i64) -> Reading {
        Reading {
            amount: s(amount),
            spent: s(spent),
            version,
        }
    }

    /// A book holding `amount`, confirmed at `now`.
    fn holding(amount: &str, now: Tick) -> Book {
        let mut b = Book::default();
        let mut req = Pending::new(s("0.01"));
        let Step::Ask(ask) = b.admit(&mut req, s("1"), &T, now) else {
            panic!("a new book asks the store first");
        };
        let reply = GrantReply {
            reading: reading(amount, "0", 1),
            granted: s(amount),
            elsewhere: Pen::ZERO,
        };
        b.granted(now, &Ok(reply), now);
        req.granted(ask, &reply);
        assert_eq!(b.admit(&mut req, s("1"), &T, now), Step::Admit);
        b.settle(s("0.01"), Pen::ZERO);
        b
    }

    #[test]
    fn a_request_that_fits_is_admitted_without_the_store() {
        let mut b = holding("1.00", 0);
        let mut req = Pending::new(s("0.60"));
        assert_eq!(b.admit(&mut req, s("1"), &T, 10), Step::Admit);
        let mut more = Pending::new(s("0.60"));
        assert!(matches!(b.admit(&mut more, s("1"), &T, 10), Step::Ask(_)));
        // A second request meanwhile waits for that call instead of sending its own.
        let mut third = Pending::new(s("0.60"));
        assert_eq!(b.admit(&mut third, s("1"), &T, 10), Step::Wait);
    }

    #[test]
    fn past_the_fence_the_store_is_asked_first() {
        let mut b = holding("1.00", 0);
        let mut req = Pending::new(s("0.10"));
        assert!(matches!(
            b.admit(&mut req, s("1"), &T, T.fence),
            Step::Ask(a) if a.need == Pen::ZERO
        ));
    }

    #[test]
    fn a_failed_call_refuses_for_a_moment_then_asks_again() {
        let mut b = holding("0.10", 0);
        let mut req = Pending::new(s("0.50"));
        assert!(matches!(b.admit(&mut req, s("1"), &T, 5), Step::Ask(_)));
        b.granted(5, &Err(CallFailed), 6);
        assert_eq!(
            b.admit(&mut req, s("1"), &T, 7),
            Step::Refuse(Refusal::StoreFailed)
        );
        let mut later = Pending::new(s("0.50"));
        assert!(matches!(
            b.admit(&mut later, s("1"), &T, 6 + T.failure_memory),
            Step::Ask(_)
        ));
    }

    #[test]
    fn a_dry_store_is_remembered_until_money_arrives() {
        let mut b = holding("0.10", 0);
        let mut req = Pending::new(s("0.50"));
        let Step::Ask(ask) = b.admit(&mut req, s("1"), &T, 5) else {
            panic!()
        };
        let reply = GrantReply {
            reading: reading("0.10", "0", 2),
            granted: Pen::ZERO,
            elsewhere: Pen::ZERO,
        };
        b.granted(5, &Ok(reply), 6);
        req.granted(ask, &reply);
        let refused = Step::Refuse(Refusal::Insufficient {
            needed: s("0.50"),
            available: s("0.10"),
        });
        assert_eq!(b.admit(&mut req, s("1"), &T, 6), refused);
        // Refused from memory, without a call...
        let mut next = Pending::new(s("0.50"));
        assert_eq!(b.admit(&mut next, s("1"), &T, 7), refused);
        // ...until money comes home.
        b.money_arrived();
        let mut after = Pending::new(s("0.50"));
        assert!(matches!(b.admit(&mut after, s("1"), &T, 8), Step::Ask(_)));
    }

    #[test]
    fn an_older_reading_answered_late_changes_nothing() {
        let mut b = holding("1.00", 0);
        b.apply(Some(reading("0.40", "0.60", 5)), 1, 2);
        b.apply(Some(reading("1.00", "0", 1)), 0, 3);
        assert_eq!(b.held().lease, s("0.40"));
    }

    #[test]
    fn a_release_whose_answer_is_lost_stays_given_back_until_a_later_reading() {
        let mut b = holding("1.00", 0);
        let given = b.release_idle(0, 10).unwrap();
        assert_eq!((given, b.available()), (s("1.00"), Pen::ZERO));
        b.released(given, 10, Err(CallFailed), &T, 11);
        assert_eq!(b.available(), Pen::ZERO, "it may have gone");
        // A reading sent before the doubt settles proves nothing...
        b.heartbeat(Some(reading("1.00", "0", 1)), 12, 13);
        assert_eq!(b.available(), Pen::ZERO);
        // ...one sent after it says where the money is: here, it never left.
        b.heartbeat(Some(reading("1.00", "0", 1)), 11 + T.doubt_settle, 2_100);
        assert_eq!(b.available(), s("1.00"));
    }

    #[test]
    fn a_row_gone_after_it_was_seen_refuses_everything() {
        let mut b = holding("1.00", 10);
        // A heartbeat sent before the grant's answer may not have seen the row: no news.
        b.heartbeat(None, 5, 20);
        assert!(!b.is_lost());
        b.heartbeat(None, 30, 31);
        assert!(b.is_lost());
        let mut req = Pending::new(s("0.01"));
        assert_eq!(
            b.admit(&mut req, s("1"), &T, 32),
            Step::Refuse(Refusal::LeaseLost)
        );
    }

    #[test]
    fn a_request_in_admission_keeps_the_lease_from_idling_home() {
        let mut b = holding("0.10", 0);
        let mut req = Pending::new(s("0.50"));
        assert!(matches!(b.admit(&mut req, s("1"), &T, 5), Step::Ask(_)));
        b.granted(5, &Err(CallFailed), 6);
        assert_eq!(b.release_idle(0, 7), None);
        b.forget(&mut req);
        assert_eq!(b.release_idle(0, 8), Some(s("0.10")));
    }

    #[test]
    fn the_account_view_counts_each_charge_once() {
        let mut b = holding("1.00", 0);
        let mut req = Pending::new(s("0.50"));
        assert_eq!(b.admit(&mut req, s("1"), &T, 1), Step::Admit);
        b.settle(s("0.50"), s("0.30"));
        // The snapshot's balance (9.70) holds the charge: its row's `spent` says so.
        let snap = Some(reading("0.70", "0.30", 2));
        let v = account_view(s("9.70"), snap, &b.held());
        assert_eq!((v.pending, v.available), (Pen::ZERO, s("9.70")));
        // An older snapshot (balance 10.00) does not: the charge is pending.
        let v = account_view(s("10.00"), Some(reading("1.00", "0", 1)), &b.held());
        assert_eq!((v.pending, v.available), (s("0.30"), s("9.70")));
    }
}
