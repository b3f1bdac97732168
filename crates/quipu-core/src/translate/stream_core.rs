//! The stream core: the one lifecycle every client format's stream translator runs, so a
//! format writes only its own frames.
//!
//! A format implements [`StreamFormat`] — what it writes for a chunk, for the held finish
//! once usage is known, for an error, for an idle tick — and [`Stream`] runs it as a
//! [`StreamTranslator`]. The core owns, once for every format:
//!
//! - **metering** ([`Metered`]): the usage the upstream reported, else one token per
//!   fragment relayed since, so a stream cut before its usage chunk still bills what was sent;
//! - **the cost** ([`Metered::bill`]): where a format writes the final usage (the held finish,
//!   a failure's last frame, the chat format's usage chunk after the finish) it writes the
//!   cost of that usage ([`Charging::cost`]), and that usage becomes what the stream bills
//!   ([`StreamTranslator::usage`]): output an upstream sends after its final report (no known
//!   server does) changes neither, so the ledger row always charges the last cost written;
//! - **the held finish** ([`Core::hold`]): OpenAI-style servers send usage in a chunk after the
//!   finish, so what the finish writes waits for it and is written
//!   ([`StreamFormat::complete`]) when it comes, or at the end of the stream with the usage
//!   known so far; an error that comes *with* the finish is held the same way
//!   ([`Core::hold_error`]), so the tokens are metered before it is written;
//! - **the end and the error**: the upstream's `[DONE]` or end of stream completes the held
//!   finish, or fails a stream that never finished; a failure (a chunk the format refuses, a
//!   broken upstream, [`StreamTranslator::on_failure`]) is scrubbed of the upstream's model name
//!   ([`scrub_error`]), written once in the format's shape ([`StreamFormat::write_error`], by
//!   default [`ApiError::write_sse`]) and ends the stream; nothing is written after the end;
//! - **pings**: whether the format keeps a silent stream alive ([`StreamFormat::PINGS`], which
//!   the proxy reads through [`StreamTranslator::pings`]), and that an idle tick after the end
//!   writes nothing.
//!
//! The formats that walk each chunk's parts (reasoning, text, tool calls) build their `chunk`
//! on [`super::chunk_parts`]; the chat format relays chunks and only meters and holds.

use crate::billing::Charging;
use crate::error::{ApiError, ClientFormat};
use crate::money::Pen;
use crate::sse::{SseDecoder, SseError};
use crate::translate::{malformed_stream, scrub_error, ResponseContext};
use crate::usage::Usage;

/// Why a stream ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamEnd {
    /// Still running.
    #[default]
    Open,
    /// The upstream finished and the client got a complete stream.
    Complete,
    /// The upstream failed; the client got an error frame.
    Failed,
}

/// A streaming translator: upstream SSE payloads in, client bytes out.
///
/// The proxy decodes SSE (see [`crate::sse`]) and calls [`on_event`](Self::on_event) with each
/// event's data — including the literal `[DONE]`, which the translator interprets. Output is
/// appended to `out`, which the proxy writes to the client as is and clears. Implemented once,
/// by [`Stream`].
pub trait StreamTranslator: Send {
    /// One upstream `data:` payload.
    fn on_event(&mut self, data: &[u8], out: &mut Vec<u8>);
    /// The upstream stream ended (clean EOF). Emits whatever closing frames are still owed;
    /// a stream that ended without a finish reason is reported to the client as an error.
    fn on_end(&mut self, out: &mut Vec<u8>);
    /// The upstream failed mid-stream (reset, idle timeout, malformed bytes).
    fn on_failure(&mut self, error: &ApiError, out: &mut Vec<u8>);
    /// The upstream has been silent for a ping interval (a long prefill).
    fn on_idle(&mut self, out: &mut Vec<u8>);
    /// Whether [`on_idle`](Self::on_idle) writes anything: the proxy arms no ping timer for a
    /// format without pings.
    fn pings(&self) -> bool;
    /// Tokens metered so far: the last usage the upstream reported, else counted from the
    /// relayed deltas; once a cost was written, the usage it was written for
    /// ([`Metered::bill`]). What the request is settled on.
    fn usage(&self) -> Usage;
    /// `Open` until a final frame has been written.
    fn end(&self) -> StreamEnd;
    /// The client-format error the stream ended with, if it failed.
    fn error(&self) -> Option<&ApiError>;
    /// The finished response object, once, for a format whose responses the gateway stores
    /// (the Responses API, when the request asked to store it); `None` for the others and
    /// while the stream is open.
    fn take_object(&mut self) -> Option<Vec<u8>>;
}

/// The output metered so far, and an error held from the finish.
#[derive(Debug, Default)]
pub struct Metered {
    /// The last usage the upstream reported.
    reported: Option<Usage>,
    /// Non-empty fragments since that report: the fallback count of output tokens.
    fragments_since_usage: u64,
    /// The usage of the last cost written ([`Metered::bill`]): what the stream bills.
    billed: Option<Usage>,
    /// An error that came with the finish, written once usage is known.
    held_error: Option<ApiError>,
}

/// The usage a format writes as final and its cost ([`Metered::bill`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Billed {
    pub usage: Usage,
    /// [`Charging::cost`] of `usage`: the `usage.cost` written, the ledger row's charge.
    pub cost: Pen,
}

impl Metered {
    /// The upstream reported `usage`: it replaces the fallback count.
    pub fn report(&mut self, usage: Usage) {
        self.reported = Some(usage);
        self.fragments_since_usage = 0;
    }

    /// `fragments` non-empty fragments were sent without usage.
    pub fn count(&mut self, fragments: u64) {
        self.fragments_since_usage = self.fragments_since_usage.saturating_add(fragments);
    }

    /// What the stream bills: the usage of the last cost written, else [`Self::metered`].
    pub fn usage(&self) -> Usage {
        self.billed.unwrap_or_else(|| self.metered())
    }

    /// The usage reported, plus a token for each fragment sent since.
    pub fn metered(&self) -> Usage {
        let reported = self.reported.unwrap_or_default();
        Usage {
            completion_tokens: reported
                .completion_tokens
                .saturating_add(self.fragments_since_usage),
            ..reported
        }
    }

    /// The usage metered now, to be written as the answer's usage with its cost: from here
    /// on it is what the stream bills (until the next `bill`), so the cost written is the
    /// ledger row's charge.
    pub fn bill(&mut self, charging: &Charging) -> Billed {
        let usage = self.metered();
        self.billed = Some(usage);
        Billed {
            usage,
            cost: charging.cost(usage),
        }
    }

    /// The stream's final usage and its cost, at its end: the usage a cost was already
    /// written for (the chat format's usage chunk), else [`Self::bill`] now.
    fn final_bill(&mut self, charging: &Charging) -> Billed {
        match self.billed {
            Some(usage) => Billed {
                usage,
                cost: charging.cost(usage),
            },
            None => self.bill(charging),
        }
    }
}

/// What a client format writes; [`Stream`] runs the rest (see the module docs).
pub trait StreamFormat: Send {
    /// What the finish leaves to write once usage is known (the stop reason, a status).
    type Held: Send;
    /// The format, for its error frames ([`ApiError::write_sse`]).
    const FORMAT: ClientFormat;
    /// Whether the format has a keep-alive event ([`Self::idle`] writes it).
    const PINGS: bool;

    /// The request's names: the upstream model's is scrubbed from errors.
    fn context(&self) -> &ResponseContext;

    /// Whether `data` ends the stream as the end of the upstream's body does. By default
    /// `[DONE]` (whitespace around it aside); a format that relays the upstream's `[DONE]`
    /// says no and handles it in [`Self::chunk`].
    fn is_end(data: &[u8]) -> bool {
        data.trim_ascii() == b"[DONE]"
    }

    /// One upstream payload (never an end marker): its client frames, metering into
    /// `core.metered`, the finish held with [`Core::hold`]. An error fails the stream.
    fn chunk(
        &mut self,
        core: &mut Core<Self::Held>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError>;

    /// The held finish, written now that the usage is known: the stream's last frames, with
    /// `billed` (the usage and its cost) where the format reports usage.
    fn complete(&mut self, held: Self::Held, billed: Billed, out: &mut Vec<u8>);

    /// The frames of a failed stream's error (already scrubbed); `billed` is what was metered
    /// and its cost, for a format whose failure reports usage.
    fn write_error(&mut self, error: &ApiError, billed: Billed, out: &mut Vec<u8>) {
        let _ = billed;
        error.write_sse(Self::FORMAT, &self.context().request_id, out);
    }

    /// The upstream has been silent for a ping interval; only called when [`Self::PINGS`].
    fn idle(&mut self, out: &mut Vec<u8>) {
        let _ = out;
    }

    /// See [`StreamTranslator::take_object`].
    fn take_object(&mut self) -> Option<Vec<u8>> {
        None
    }
}

/// The state the core keeps for a stream: metering, the held finish, how it ended.
#[derive(Debug)]
pub struct Core<H> {
    /// The output metered so far.
    pub metered: Metered,
    held: Option<H>,
    end: StreamEnd,
    error: Option<ApiError>,
}

impl<H> Core<H> {
    fn new() -> Self {
        Core {
            metered: Metered::default(),
            held: None,
            end: StreamEnd::Open,
            error: None,
        }
    }

    /// The finish arrived (or an error came with it): the generation is over.
    pub fn finished(&self) -> bool {
        self.held.is_some() || self.metered.held_error.is_some()
    }

    /// Holds what the finish writes until usage is known.
    pub fn hold(&mut self, held: H) {
        self.held = Some(held);
    }

    /// Holds an error that came with the finish: written once usage is known.
    pub fn hold_error(&mut self, error: ApiError) {
        self.metered.held_error = Some(error);
    }

    /// The usage-only chunk after the finish arrived: `Err` with the held error, else the
    /// held finish is written ([`StreamFormat::complete`]).
    pub fn usage_arrived<F: StreamFormat<Held = H>>(
        &mut self,
        format: &mut F,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        if let Some(e) = self.metered.held_error.take() {
            return Err(e);
        }
        self.complete(format, out);
        Ok(())
    }

    /// Writes the held finish, if any, and completes the stream.
    fn complete<F: StreamFormat<Held = H>>(&mut self, format: &mut F, out: &mut Vec<u8>) {
        if let Some(held) = self.held.take() {
            let billed = self.metered.final_bill(&format.context().charging);
            format.complete(held, billed, out);
            self.end = StreamEnd::Complete;
        }
    }

    /// The stream is complete as it stands (a relayed `[DONE]`).
    pub fn completed(&mut self) {
        self.end = StreamEnd::Complete;
    }
}

/// A format's stream translator: its [`StreamFormat`] run by the core.
pub struct Stream<F: StreamFormat> {
    core: Core<F::Held>,
    format: F,
}

impl<F: StreamFormat> Stream<F> {
    /// The translator of a stream written by `format`.
    pub fn with(format: F) -> Self {
        Stream {
            core: Core::new(),
            format,
        }
    }

    /// The format's writer (for its own accessors).
    pub fn format(&self) -> &F {
        &self.format
    }

    fn fail(&mut self, error: ApiError, out: &mut Vec<u8>) {
        let error = scrub_error(error, self.format.context());
        let billed = self
            .core
            .metered
            .final_bill(&self.format.context().charging);
        self.format.write_error(&error, billed, out);
        self.core.error = Some(error);
        self.core.end = StreamEnd::Failed;
    }
}

impl<F: StreamFormat> StreamTranslator for Stream<F> {
    fn on_event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.core.end != StreamEnd::Open {
            return;
        }
        if F::is_end(data) {
            self.on_end(out);
            return;
        }
        if let Err(e) = self.format.chunk(&mut self.core, data, out) {
            self.fail(e, out);
        }
    }

    fn on_end(&mut self, out: &mut Vec<u8>) {
        if self.core.end != StreamEnd::Open {
            return;
        }
        if let Some(e) = self.core.metered.held_error.take() {
            self.fail(e, out);
        } else if self.core.held.is_some() {
            self.core.complete(&mut self.format, out);
        } else {
            self.fail(
                malformed_stream("the stream ended before the model finished"),
                out,
            );
        }
    }

    fn on_failure(&mut self, error: &ApiError, out: &mut Vec<u8>) {
        if self.core.end == StreamEnd::Open {
            // An error held from the finish is what went wrong first.
            let e = self
                .core
                .metered
                .held_error
                .take()
                .unwrap_or_else(|| error.clone());
            self.fail(e, out);
        }
    }

    fn on_idle(&mut self, out: &mut Vec<u8>) {
        if F::PINGS && self.core.end == StreamEnd::Open {
            self.format.idle(out);
        }
    }

    fn pings(&self) -> bool {
        F::PINGS
    }

    fn usage(&self) -> Usage {
        self.core.metered.usage()
    }

    fn end(&self) -> StreamEnd {
        self.core.end
    }

    fn error(&self) -> Option<&ApiError> {
        self.core.error.as_ref()
    }

    fn take_object(&mut self) -> Option<Vec<u8>> {
        self.format.take_object()
    }
}

/// Feeds raw upstream bytes through an SSE decoder into a translator.
///
/// A framing error (an event over the size cap) ends the stream with an error frame: the
/// upstream is broken, and the client must not see a silently truncated success.
pub fn feed_stream(
    decoder: &mut SseDecoder,
    translator: &mut dyn StreamTranslator,
    bytes: &[u8],
    out: &mut Vec<u8>,
) {
    if translator.end() != StreamEnd::Open {
        return;
    }
    let result = decoder.feed::<SseError, _>(bytes, |event| {
        if translator.end() == StreamEnd::Open {
            translator.on_event(event.data, out);
        }
        Ok(())
    });
    if let Err(e) = result {
        translator.on_failure(&malformed_stream(&e.to_string()), out);
    }
}

/// Ends a stream whose upstream closed cleanly: flushes a pending event, then `on_end`.
pub fn finish_stream(
    decoder: &mut SseDecoder,
    translator: &mut dyn StreamTranslator,
    out: &mut Vec<u8>,
) {
    if translator.end() != StreamEnd::Open {
        return;
    }
    let result = decoder.finish::<SseError, _>(|event| {
        if translator.end() == StreamEnd::Open {
            translator.on_event(event.data, out);
        }
        Ok(())
    });
    match result {
        Err(e) => translator.on_failure(&malformed_stream(&e.to_string()), out),
        Ok(()) => {
            if translator.end() == StreamEnd::Open {
                translator.on_end(out);
            }
        }
    }
}
