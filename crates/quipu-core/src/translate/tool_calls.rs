//! The upstream's streamed tool calls (`delta.tool_calls` of chat-completion chunks), tracked
//! for the stream translators that show each call as a block of its own, one open at a time:
//! the messages format's `tool_use` blocks and the Responses API's `function_call` items.
//!
//! [`ToolCalls`] owns what both formats do alike, and nothing else — no events, no I/O:
//!
//! - which call an entry belongs to: the last call at its `index` (an entry without one takes
//!   the previous entry's), unless it brings a non-empty id and that call already has another
//!   one from the upstream — a new call at a known index (lmdeploy#3412). A re-sent id or name
//!   (vllm#31438) changes nothing: the first non-empty ones are kept;
//! - the check of the arguments as they pass ([`ObjectScanner`]): they must form one JSON
//!   object (or stay empty), and whitespace around it is dropped as [`Whitespace`] says;
//! - when a call may start: once it has a name, and no other call's block is open with
//!   arguments still to come. Until then its fragments are held, at most
//!   [`MAX_HELD_ARGUMENTS`] bytes for all calls, and handed over when it starts; calls held
//!   behind an open one start in order once its arguments are complete;
//! - arguments for a call whose block had to be closed early (blocks do not reopen) are an
//!   error, since the client would get the call's input cut short.
//!
//! Which block is open stays with the translator (text and reasoning blocks are its own);
//! it passes the open call's slot in. Per entry it runs:
//!
//! ```text
//! let mut step = calls.delta(entry)?;
//! while let Some(action) = step.next(&calls, open_call) {
//!     Arguments { text, .. } => write `text` as the open call's arguments
//!     Start(slot) => close the open block (`calls.close` if it is a call), then
//!                    `calls.start(slot, mint)`, write the block's start and its held arguments
//! }
//! ```
//!
//! and at the finish starts every call still waiting ([`ToolCalls::next_waiting`]). A format
//! writes that loop by implementing [`CallBlocks`] (how it writes arguments and a call's
//! start) and calling [`CallBlocks::call_delta`] and [`CallBlocks::start_waiting`].

use crate::error::{ApiError, ErrorKind};
use crate::protocol::upstream::ToolCallDelta;
use crate::translate::common::finish::malformed_tool_arguments;
use crate::translate::json_scan::{ObjectScanner, Scan, JSON_WS};

/// What a stream translator writes of the calls it shows as blocks; the driving (the loop in
/// the module docs) is written once, in the provided methods.
pub trait CallBlocks {
    /// The error for arguments of a call whose block had to be closed early, in the format's
    /// words.
    const CLOSED_EARLY: &'static str;
    fn calls(&mut self) -> &mut ToolCalls;
    /// The slot of the call whose block is open, if a call's is.
    fn open_call(&self) -> Option<usize>;
    /// Writes `text` as arguments of the open call.
    fn arguments(&mut self, text: &str, out: &mut Vec<u8>);
    /// Closes the open block, [`ToolCalls::start`]s call `slot`, and writes its start and the
    /// arguments held for it.
    fn start_call(&mut self, slot: usize, out: &mut Vec<u8>);

    /// One entry of `delta.tool_calls`.
    fn call_delta(&mut self, tc: &ToolCallDelta<'_>, out: &mut Vec<u8>) -> Result<(), ApiError> {
        let mut step = self
            .calls()
            .delta(tc)
            .map_err(|e| e.into_api_error(Self::CLOSED_EARLY))?;
        loop {
            let open = self.open_call();
            let Some(action) = step.next(self.calls(), open) else {
                break;
            };
            match action {
                Action::Arguments { text, .. } => self.arguments(text, out),
                Action::Start(slot) => self.start_call(slot, out),
            }
        }
        Ok(())
    }

    /// Starts (and so flushes) the calls still waiting — for a name, or for the open call to
    /// complete: the generation is over.
    fn start_waiting(&mut self, out: &mut Vec<u8>) {
        while let Some(slot) = self.calls().next_waiting() {
            self.start_call(slot, out);
        }
    }
}

/// Most bytes of tool arguments held back for calls waiting for their block. A response is at
/// most 8192 tokens, so real interleaved calls stay far below it.
pub const MAX_HELD_ARGUMENTS: usize = 1024 * 1024;

/// What becomes of whitespace around a call's arguments object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whitespace {
    /// Fragments that are nothing but whitespace before the object are dropped (a client's
    /// JSON accumulator may choke on a buffer of whitespace alone); every other fragment
    /// passes as sent. The messages format: clients parse the arguments into an object.
    SkipBlankLead,
    /// All whitespace before the object and after it is dropped, so the arguments equal the
    /// non-streaming translation's (`responses::response::shown_arguments`). The Responses
    /// API: clients see them as a string.
    Trim,
}

/// Why an entry ends the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The arguments are no longer the beginning of one JSON object.
    Malformed,
    /// Holding the fragment would pass [`MAX_HELD_ARGUMENTS`].
    HeldTooMuch,
    /// Arguments for a call whose block was closed before they were complete.
    AfterClose,
}

impl CallError {
    /// The client's error; `after_close` words [`CallError::AfterClose`] in the format's terms.
    pub fn into_api_error(self, after_close: &'static str) -> ApiError {
        match self {
            CallError::Malformed => malformed_tool_arguments(),
            CallError::HeldTooMuch => ApiError::new(
                ErrorKind::Upstream,
                "the model server interleaved parallel tool calls beyond what the gateway can hold back",
            ),
            CallError::AfterClose => ApiError::new(ErrorKind::Upstream, after_close),
        }
    }
}

/// Where a call's block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not started: no name yet, or another call's block is open.
    Waiting,
    Open,
    Closed,
}

/// One upstream tool call.
#[derive(Debug)]
pub struct ToolCall {
    /// The upstream's `index` for it.
    index: u32,
    id: String,
    /// `id` was minted by the gateway: an id the upstream sends later is not a new call.
    minted: bool,
    name: String,
    state: State,
    /// Argument fragments received before the block could start.
    pending: String,
    /// The arguments so far, checked incrementally.
    scan: ObjectScanner,
}

impl ToolCall {
    /// The upstream's id, or the minted one once started; empty before.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The upstream's function name; empty while unknown.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its arguments stand.
    pub fn status(&self) -> Scan {
        self.scan.status()
    }
}

/// A call just started by [`ToolCalls::start`].
#[derive(Debug)]
pub struct Started<'a> {
    /// The upstream's id, or the one just minted.
    pub id: &'a str,
    /// The upstream's function name; empty only when the finish starts a call that never
    /// got one.
    pub name: &'a str,
    /// The arguments held until now, to write right after the block's start.
    pub pending: String,
}

/// What the translator does next for an entry (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'t> {
    /// Write `text` as arguments of call `slot`, whose block is the open one.
    Arguments { slot: usize, text: &'t str },
    /// Start call `slot`: close the open block, [`ToolCalls::start`] it, write its start.
    Start(usize),
}

/// The actions an entry calls for, taken one by one with [`Step::next`].
#[derive(Debug, Default)]
#[must_use = "the entry's actions are taken with `next`"]
pub struct Step<'t> {
    /// Arguments for the open call, to write first.
    forward: Option<(usize, &'t str)>,
    /// The entry's call, if it is waiting: it may start now.
    held: Option<usize>,
}

impl<'t> Step<'t> {
    /// The next action, given `open`: the slot of the call whose block is open now, `None`
    /// when no call's is (nothing open, or text). Every [`Action::Start`] must be carried out
    /// (with [`ToolCalls::start`]) before asking again; `None` when nothing is left to do.
    pub fn next(&mut self, calls: &ToolCalls, open: Option<usize>) -> Option<Action<'t>> {
        if let Some((slot, text)) = self.forward.take() {
            return Some(Action::Arguments { slot, text });
        }
        if let Some(slot) = self.held.take() {
            if calls.may_start(slot, open) {
                return Some(Action::Start(slot));
            }
        }
        calls.next_behind(open).map(Action::Start)
    }
}

/// The tool calls of one streamed response (see the module docs). Slots are positions in
/// the order calls were first seen, from 0.
#[derive(Debug)]
pub struct ToolCalls {
    calls: Vec<ToolCall>,
    /// `index` of the previous entry, for an entry without one.
    last_index: u32,
    /// Bytes in the `pending` buffers of all calls.
    held_bytes: usize,
    whitespace: Whitespace,
}

impl ToolCalls {
    pub fn new(whitespace: Whitespace) -> Self {
        ToolCalls {
            calls: Vec::new(),
            last_index: 0,
            held_bytes: 0,
            whitespace,
        }
    }

    /// No call seen yet.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    pub fn get(&self, slot: usize) -> Option<&ToolCall> {
        self.calls.get(slot)
    }

    /// Some call's arguments are incomplete.
    pub fn any_partial(&self) -> bool {
        self.calls.iter().any(|c| c.status() == Scan::Partial)
    }

    /// One entry of `delta.tool_calls`: records its id, name and arguments; the step says
    /// what to write.
    pub fn delta<'t>(&mut self, tc: &'t ToolCallDelta<'_>) -> Result<Step<'t>, CallError> {
        let index = tc.index.unwrap_or(self.last_index);
        self.last_index = index;
        let id = tc.id.as_deref().filter(|s| !s.is_empty());
        let (name, args) = match &tc.function {
            Some(f) => (
                f.name.as_deref().filter(|s| !s.is_empty()),
                f.arguments.as_deref().filter(|s| !s.is_empty()),
            ),
            None => (None, None),
        };
        let slot = self.slot_for(index, id);
        let Some(call) = self.calls.get_mut(slot) else {
            return Ok(Step::default());
        };
        if let (true, Some(id)) = (call.id.is_empty(), id) {
            id.clone_into(&mut call.id);
        }
        if let (true, Some(name)) = (call.name.is_empty(), name) {
            name.clone_into(&mut call.name);
        }
        let was_complete = call.status() == Scan::Complete;
        let args = match args {
            Some(a) => shown(&mut call.scan, a, self.whitespace)?,
            None => None,
        };
        match call.state {
            State::Waiting => {
                if let Some(a) = args {
                    if self.held_bytes + a.len() > MAX_HELD_ARGUMENTS {
                        return Err(CallError::HeldTooMuch);
                    }
                    self.held_bytes += a.len();
                    call.pending.push_str(a);
                }
                Ok(Step {
                    forward: None,
                    held: Some(slot),
                })
            }
            State::Open => Ok(Step {
                forward: args.map(|a| (slot, a)),
                held: None,
            }),
            // Whitespace after a complete object changes nothing; any other fragment would
            // be lost.
            State::Closed if args.is_some_and(|a| !(was_complete && a.trim_ascii().is_empty())) => {
                Err(CallError::AfterClose)
            }
            State::Closed => Ok(Step::default()),
        }
    }

    /// Marks call `slot` open, minting its id with `mint` if the upstream sent none, and hands
    /// over its held arguments. The translator has closed the block that was open.
    pub fn start(&mut self, slot: usize, mint: impl FnOnce() -> String) -> Option<Started<'_>> {
        let call = self.calls.get_mut(slot)?;
        if call.id.is_empty() {
            call.id = mint();
            call.minted = true;
        }
        call.state = State::Open;
        let pending = std::mem::take(&mut call.pending);
        self.held_bytes = self.held_bytes.saturating_sub(pending.len());
        Some(Started {
            id: &call.id,
            name: &call.name,
            pending,
        })
    }

    /// Call `slot`'s block was closed: later arguments for it are an error.
    pub fn close(&mut self, slot: usize) -> Option<&ToolCall> {
        let call = self.calls.get_mut(slot)?;
        call.state = State::Closed;
        Some(call)
    }

    /// The first call still waiting, named or not: at the finish every one is started (and so
    /// its held arguments written).
    pub fn next_waiting(&self) -> Option<usize> {
        self.calls.iter().position(|c| c.state == State::Waiting)
    }

    /// The call an entry belongs to (see the module docs); a new one if none.
    fn slot_for(&mut self, index: u32, id: Option<&str>) -> usize {
        let known = self.calls.iter().rposition(|c| c.index == index);
        match known {
            Some(s)
                if id.is_none_or(|id| {
                    self.calls
                        .get(s)
                        .is_none_or(|c| c.id.is_empty() || c.minted || c.id == id)
                }) =>
            {
                s
            }
            _ => {
                self.calls.push(ToolCall {
                    index,
                    id: String::new(),
                    minted: false,
                    name: String::new(),
                    state: State::Waiting,
                    pending: String::new(),
                    scan: ObjectScanner::new(),
                });
                self.calls.len() - 1
            }
        }
    }

    /// Whether waiting call `slot` may start now: it has a name, and no other call's block is
    /// open with arguments still to come.
    fn may_start(&self, slot: usize, open: Option<usize>) -> bool {
        let named = self.calls.get(slot).is_some_and(|c| !c.name.is_empty());
        let free = match open {
            Some(s) if s != slot => self
                .calls
                .get(s)
                .is_none_or(|c| c.status() == Scan::Complete),
            _ => true,
        };
        named && free
    }

    /// Once the open call's arguments are complete, the first named call held behind it.
    fn next_behind(&self, open: Option<usize>) -> Option<usize> {
        let open = self.calls.get(open?)?;
        if open.status() != Scan::Complete {
            return None;
        }
        self.calls
            .iter()
            .position(|c| c.state == State::Waiting && !c.name.is_empty())
    }
}

/// What of fragment `a` is shown, after feeding it to `scan`: `None` when nothing is.
fn shown<'t>(
    scan: &mut ObjectScanner,
    a: &'t str,
    whitespace: Whitespace,
) -> Result<Option<&'t str>, CallError> {
    let before = scan.status();
    let after = scan.feed(a);
    Ok(match (after, whitespace) {
        (Scan::Invalid, _) => return Err(CallError::Malformed),
        // Nothing but whitespace so far.
        (Scan::Empty, _) => None,
        (_, Whitespace::SkipBlankLead) => Some(a),
        // Only whitespace may follow a complete object.
        (Scan::Complete, _) if before == Scan::Complete => None,
        (Scan::Complete, _) => Some(trim_lead(a, before).trim_end_matches(JSON_WS)),
        _ => Some(trim_lead(a, before)),
    })
}

/// `a` without leading whitespace if it is where the object starts (`before` is empty).
fn trim_lead(a: &str, before: Scan) -> &str {
    match before {
        Scan::Empty => a.trim_start_matches(JSON_WS),
        _ => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A translator in miniature: one block open at a time, every action logged.
    struct Driver {
        calls: ToolCalls,
        /// The open call's slot.
        open: Option<usize>,
        log: Vec<String>,
    }

    impl Driver {
        fn new(whitespace: Whitespace) -> Self {
            Driver {
                calls: ToolCalls::new(whitespace),
                open: None,
                log: Vec::new(),
            }
        }

        fn entry(&mut self, json: &str) -> Result<(), CallError> {
            let tc: ToolCallDelta<'_> = serde_json::from_str(json).unwrap();
            let mut step = self.calls.delta(&tc)?;
            while let Some(action) = step.next(&self.calls, self.open) {
                match action {
                    Action::Arguments { slot, text } => {
                        assert_eq!(self.open, Some(slot), "arguments for a closed block");
                        self.log.push(format!("{slot}:{text}"));
                    }
                    Action::Start(slot) => self.start(slot),
                }
            }
            Ok(())
        }

        fn start(&mut self, slot: usize) {
            self.close();
            let started = self.calls.start(slot, || format!("minted{slot}")).unwrap();
            self.log
                .push(format!("start {slot} {} {}", started.id, started.name));
            if !started.pending.is_empty() {
                self.log.push(format!("{slot}:{}", started.pending));
            }
            self.open = Some(slot);
        }

        /// Text or reasoning, or the finish, closes the open block.
        fn close(&mut self) {
            if let Some(slot) = self.open.take() {
                self.calls.close(slot).unwrap();
                self.log.push(format!("stop {slot}"));
            }
        }

        fn finish(&mut self) {
            while let Some(slot) = self.calls.next_waiting() {
                self.start(slot);
            }
            self.close();
        }

        fn log(&mut self) -> Vec<String> {
            std::mem::take(&mut self.log)
        }
    }

    fn args(index: u32, text: &str) -> String {
        serde_json::json!({"index": index, "function": {"arguments": text}}).to_string()
    }

    fn named(index: u32, id: &str, name: &str, text: &str) -> String {
        serde_json::json!({"index": index, "id": id, "function": {"name": name, "arguments": text}})
            .to_string()
    }

    #[test]
    fn a_named_call_streams_its_arguments_unheld() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "call_a", "f", "")).unwrap();
        assert_eq!(d.log(), ["start 0 call_a f"]);
        d.entry(&args(0, "{\"a\"")).unwrap();
        d.entry(&args(0, ":1}")).unwrap();
        assert_eq!(d.log(), ["0:{\"a\"", "0::1}"]);
        assert!(!d.calls.any_partial());
        assert_eq!(d.calls.get(0).unwrap().status(), Scan::Complete);
    }

    #[test]
    fn arguments_before_the_name_are_held_until_it_comes() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&args(0, "{\"x\":")).unwrap();
        assert!(d.log().is_empty());
        assert!(d.calls.any_partial());
        d.entry(r#"{"index":0,"id":"c","function":{"name":"f"}}"#)
            .unwrap();
        d.entry(&args(0, "1}")).unwrap();
        assert_eq!(d.log(), ["start 0 c f", "0:{\"x\":", "0:1}"]);
    }

    #[test]
    fn interleaved_calls_start_in_order_once_the_open_one_is_complete() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{")).unwrap();
        d.entry(&named(1, "b", "g", "{\"b\":2}")).unwrap();
        d.entry(&named(2, "c", "h", "{")).unwrap();
        d.entry(&args(2, "}")).unwrap();
        assert_eq!(d.log(), ["start 0 a f", "0:{"]);
        d.entry(&args(0, "}")).unwrap();
        assert_eq!(
            d.log(),
            [
                "0:}",
                "stop 0",
                "start 1 b g",
                "1:{\"b\":2}",
                "stop 1",
                "start 2 c h",
                "2:{}"
            ]
        );
    }

    #[test]
    fn a_call_may_start_while_text_is_open() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{")).unwrap();
        d.entry(&named(1, "b", "g", "{}")).unwrap();
        d.close(); // text between: call 0's block closes early, call 1 still waits
        assert_eq!(d.log(), ["start 0 a f", "0:{", "stop 0"]);
        d.entry(&named(2, "c", "h", "")).unwrap();
        assert_eq!(d.log(), ["start 2 c h"]);
        d.finish();
        assert_eq!(d.log(), ["stop 2", "start 1 b g", "1:{}", "stop 1"]);
        assert!(d.calls.any_partial(), "call 0 was cut off");
    }

    #[test]
    fn a_new_id_at_a_known_index_is_a_new_call_a_resent_one_is_not() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{")).unwrap();
        d.entry(&named(0, "a", "f", "}")).unwrap(); // vllm#31438
        d.entry(&named(0, "b", "g", "{}")).unwrap(); // lmdeploy#3412
        assert_eq!(
            d.log(),
            ["start 0 a f", "0:{", "0:}", "stop 0", "start 1 b g", "1:{}"]
        );
        assert_eq!(d.calls.get(0).unwrap().name(), "f");
    }

    #[test]
    fn a_minted_id_is_kept_and_a_late_upstream_id_is_the_same_call() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(r#"{"index":3,"function":{"name":"f","arguments":"{"}}"#)
            .unwrap();
        d.entry(r#"{"index":3,"id":"late","function":{"arguments":"}"}}"#)
            .unwrap();
        assert_eq!(d.log(), ["start 0 minted0 f", "0:{", "0:}"]);
        assert_eq!(d.calls.get(0).unwrap().id(), "minted0");
    }

    #[test]
    fn an_entry_without_index_belongs_to_the_previous_entrys_call() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{")).unwrap();
        d.entry(&named(5, "b", "g", "{")).unwrap();
        d.entry(r#"{"function":{"arguments":"}"}}"#).unwrap();
        assert_eq!(d.log(), ["start 0 a f", "0:{"]);
        assert_eq!(d.calls.get(1).unwrap().status(), Scan::Complete);
    }

    #[test]
    fn arguments_that_are_not_an_object_fail() {
        for text in ["[", "1", "{\"a\" 1", "{} x"] {
            let mut d = Driver::new(Whitespace::Trim);
            let e = d.entry(&named(0, "a", "f", text));
            assert_eq!(e, Err(CallError::Malformed), "{text}");
        }
    }

    #[test]
    fn held_arguments_are_capped_and_released_at_the_start() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{")).unwrap();
        let big = "x".repeat(MAX_HELD_ARGUMENTS / 2);
        d.entry(&named(1, "b", "g", &format!("{{\"k\":\"{big}")))
            .unwrap();
        assert_eq!(d.entry(&args(1, &big)), Err(CallError::HeldTooMuch));
        d.entry(&args(0, "}")).unwrap();
        assert_eq!(d.calls.held_bytes, 0);
        d.entry(&args(1, &big)).unwrap();
    }

    #[test]
    fn arguments_after_an_early_close_fail_whitespace_after_the_object_does_not() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{}")).unwrap();
        d.entry(&named(1, "b", "g", "{")).unwrap();
        d.close();
        d.entry(&args(0, " \n")).unwrap();
        assert_eq!(d.entry(&args(1, "}")), Err(CallError::AfterClose));
        assert_eq!(
            CallError::AfterClose.into_api_error("closed").message,
            "closed"
        );
    }

    #[test]
    fn whitespace_around_the_object_as_each_format_wants_it() {
        let fragments = [" ", "\n {", "\"a\" :1", "} ", "\t"];
        for (whitespace, want) in [
            (
                Whitespace::SkipBlankLead,
                vec!["0:\n {", "0:\"a\" :1", "0:} ", "0:\t"],
            ),
            (Whitespace::Trim, vec!["0:{", "0:\"a\" :1", "0:}"]),
        ] {
            let mut d = Driver::new(whitespace);
            d.entry(&named(0, "a", "f", "")).unwrap();
            for f in fragments {
                d.entry(&args(0, f)).unwrap();
            }
            let log = d.log();
            assert_eq!(log[1..], want, "{whitespace:?}");
        }
        let mut d = Driver::new(Whitespace::Trim);
        d.entry(&named(0, "a", "f", " {} ")).unwrap();
        assert_eq!(d.log(), ["start 0 a f", "0:{}"]);
    }

    #[test]
    fn the_finish_starts_every_waiting_call_named_or_not() {
        let mut d = Driver::new(Whitespace::SkipBlankLead);
        d.entry(&named(0, "a", "f", "{")).unwrap();
        d.entry(&args(1, "{\"n\":")).unwrap();
        d.entry(&named(2, "c", "h", "{}")).unwrap();
        assert_eq!(d.log(), ["start 0 a f", "0:{"]);
        d.finish();
        assert_eq!(
            d.log(),
            [
                "stop 0",
                "start 1 minted1 ",
                "1:{\"n\":",
                "stop 1",
                "start 2 c h",
                "2:{}",
                "stop 2"
            ]
        );
        assert_eq!(d.calls.next_waiting(), None);
    }
}
