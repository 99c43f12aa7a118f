//! One forward pass through a [`ResidualStream`]: the events walked in order, each read and
//! then written, and the final readout. Every call is checked against the event the stream
//! expects, so a misplaced call is an error that names the expected one, never a wrong answer.

use std::fmt;

use burn::tensor::Tensor;

use super::ResidualStream;
use super::sources::{RoutedSources, normed};
use crate::error::{HaaresError, Result};
use crate::norm::RmsNorm;
use crate::ops::HaaresBackend;
use crate::telemetry::{ReadSite, RoutingTrace, SiteTrace, SlotId};

/// A forward pass in progress, from [`ResidualStream::start`]: for each event `t = 0 … T−1`,
/// [`read`](Self::read) (or [`read_normed`](Self::read_normed)) its input, run the sublayer,
/// [`write`](Self::write) its output; then [`finish`](Self::finish) (or
/// [`finish_normed`](Self::finish_normed)) for the final readout.
///
/// A call out of that order returns [`HaaresError::StreamOrder`], naming the call the stream
/// expected, and leaves the state as it was (a refused `finish` consumes it).
pub struct StreamState<'a, B: HaaresBackend> {
    stream: &'a ResidualStream<B>,
    flow: Flow<B>,
    next: Next,
    /// `[batch, seq, d]` of the embedding, which every write must match.
    shape: [usize; 3],
    trace: Option<&'a mut RoutingTrace<B>>,
}

/// What the pass carries between events.
enum Flow<B: HaaresBackend> {
    /// The hidden state `h` of the unrouted methods.
    Additive(Tensor<B, 3>),
    /// The sources of the routed methods.
    Routed(RoutedSources<B>),
}

/// The call the stream expects next; `Read(T)` is the final readout.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Next {
    Read(usize),
    Write(usize),
}

/// A call made to the stream, for the check and its message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Read(usize),
    Write(usize),
    Finish,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::Read(event) => write!(f, "read({event})"),
            Call::Write(event) => write!(f, "write({event}, u)"),
            Call::Finish => f.write_str("finish()"),
        }
    }
}

impl<'a, B: HaaresBackend> StreamState<'a, B> {
    pub(super) fn new(
        stream: &'a ResidualStream<B>,
        embedding: Tensor<B, 3>,
        trace: Option<&'a mut RoutingTrace<B>>,
    ) -> Result<Self> {
        let shape = embedding.dims();
        let d_model = stream.config.d_model;
        if shape[0] == 0 || shape[1] == 0 || shape[2] != d_model {
            return Err(HaaresError::InvalidInput(format!(
                "the residual stream starts from an embedding of shape {shape:?}; it takes \
                 [batch, seq, {d_model}] with batch and seq at least 1 (d_model = {d_model} in its \
                 config)"
            )));
        }
        let flow = match stream.config.method.is_routed() {
            true => Flow::Routed(RoutedSources::new(
                embedding,
                stream.folds_norm(),
                stream.haares_options().copied(),
            )),
            false => Flow::Additive(embedding),
        };
        Ok(Self {
            stream,
            flow,
            next: Next::Read(0),
            shape,
            trace,
        })
    }

    /// The event whose read or write the stream expects next; `None` once every event is
    /// written and only [`finish`](Self::finish) remains.
    pub fn next_event(&self) -> Option<usize> {
        match self.next {
            Next::Read(event) if event == self.stream.config.events => None,
            Next::Read(event) | Next::Write(event) => Some(event),
        }
    }

    /// The input `x_t` of event `event`: the hidden state `h` (unrouted methods) or the routed
    /// mixture `h̃_t` over the bank of eq:sourceset (eq:routingweights), not normalised.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d]`
    pub fn read(&mut self, event: usize) -> Result<Tensor<B, 3>> {
        self.read_through(event, None)
    }

    /// `norm(x_t)`, the sublayer's PreNorm of its input (eq:sublayer). On the fused path
    /// ([`ResidualStream::folds_norm`]) the norm runs inside the read; otherwise after it. The
    /// same value either way, to float rounding.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d]`
    pub fn read_normed(&mut self, event: usize, norm: &RmsNorm<B>) -> Result<Tensor<B, 3>> {
        self.read_through(event, Some(norm))
    }

    fn read_through(&mut self, event: usize, norm: Option<&RmsNorm<B>>) -> Result<Tensor<B, 3>> {
        self.check(Call::Read(event))?;
        let input = match &self.flow {
            Flow::Additive(hidden) => normed(hidden.clone(), norm),
            Flow::Routed(sources) => {
                let bank = sources.source_set();
                let router = self
                    .stream
                    .routers
                    .get(event)
                    .ok_or_else(|| missing("router"))?;
                let read = sources.read(router, &bank, norm);
                if let Some(trace) = self.trace.as_deref_mut() {
                    let m = self.stream.config.events_per_block();
                    trace.sites.push(SiteTrace {
                        site: ReadSite::Event { event },
                        slots: SlotId::name_bank(bank.kinds(), event / m, event % m),
                        weights: read.weights,
                    });
                }
                read.mixture
            }
        };
        self.next = Next::Write(event);
        Ok(input)
    }

    /// Adds event `event`'s sublayer output `u_t`: `h ← h + u` (or `h + g·u`, `h + λ ⊙ u`), or
    /// for the routed methods to the active block's `C` and `D` (eq:update), completing the
    /// block's pair at its `m`-th write.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d]`, the embedding's shape
    pub fn write(&mut self, event: usize, output: Tensor<B, 3>) -> Result<()> {
        self.check(Call::Write(event))?;
        if output.dims() != self.shape {
            return Err(HaaresError::InvalidInput(format!(
                "write({event}, u): the sublayer output has shape {:?}, the stream's hidden state \
                 {:?}; a sublayer returns [batch, seq, d_model] like its input",
                output.dims(),
                self.shape
            )));
        }
        let stream = self.stream;
        match &mut self.flow {
            Flow::Additive(hidden) => {
                // `h + u` takes `h`'s buffer where it is the only handle: move it out first.
                let placeholder = output.clone();
                let before = std::mem::replace(hidden, placeholder);
                *hidden = stream.additive_update(event, before, output);
            }
            Flow::Routed(sources) => {
                let (blocks, m) = (stream.config.blocks, stream.config.events_per_block());
                let (block, r) = (event / m, event % m + 1);
                let sign = stream
                    .signs
                    .get(block)
                    .and_then(|signs| signs.get(r - 1))
                    .copied();
                // The last block's detail is never read: the final readout is cumulative-only.
                sources.write(output, sign, r == m, block + 1 < blocks);
            }
        }
        self.next = Next::Read(event + 1);
        Ok(())
    }

    /// The final readout: `h` (unrouted methods) or eq:final's read over `{e, C_1 … C_N}`.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d]`
    pub fn finish(self) -> Result<Tensor<B, 3>> {
        self.finish_through(None)
    }

    /// `norm` of the final readout (the final RMSNorm before a head), folded into the read on
    /// the fused path as in [`read_normed`](Self::read_normed).
    ///
    /// # Shapes
    /// - output: `[batch, seq, d]`
    pub fn finish_normed(self, norm: &RmsNorm<B>) -> Result<Tensor<B, 3>> {
        self.finish_through(Some(norm))
    }

    fn finish_through(self, norm: Option<&RmsNorm<B>>) -> Result<Tensor<B, 3>> {
        self.check(Call::Finish)?;
        match self.flow {
            Flow::Additive(hidden) => Ok(normed(hidden, norm)),
            Flow::Routed(sources) => {
                let bank = sources.final_set();
                let router = self
                    .stream
                    .final_router
                    .as_ref()
                    .ok_or_else(|| missing("final_router"))?;
                let read = sources.read(router, &bank, norm);
                if let Some(trace) = self.trace {
                    trace.sites.push(SiteTrace {
                        site: ReadSite::Final,
                        slots: SlotId::name_bank(bank.kinds(), sources.completed(), 0),
                        weights: read.weights,
                    });
                }
                Ok(read.mixture)
            }
        }
    }

    /// Refuses a call the stream does not expect now, saying which it expects.
    fn check(&self, call: Call) -> Result<()> {
        let events = self.stream.config.events;
        let expected = match self.next {
            Next::Read(event) if event == events => Call::Finish,
            Next::Read(event) => Call::Read(event),
            Next::Write(event) => Call::Write(event),
        };
        if call == expected {
            return Ok(());
        }
        let why = match (call, expected) {
            (Call::Read(event) | Call::Write(event), _) if event >= events => format!(
                "event {event} is past the stream's {events} events (0 to {})",
                events - 1
            ),
            (Call::Read(event), Call::Write(written)) if event == written => {
                format!("event {event} was already read, and its output not yet written")
            }
            (Call::Write(event), Call::Read(read)) if event == read => {
                format!("event {event} is written before it is read")
            }
            (Call::Finish, _) => format!(
                "the pass finishes after all {events} events, and {} are written",
                self.next_event().unwrap_or(events)
            ),
            _ => "events run 0, 1, 2, … in order, each read and then written".to_string(),
        };
        Err(HaaresError::StreamOrder(format!(
            "{call} refused: {why}; the stream expects {expected} next"
        )))
    }
}

/// A part `start` found in place is gone: it cannot be, since the stream is borrowed for the
/// pass; an error rather than a panic all the same.
fn missing(field: &'static str) -> HaaresError {
    HaaresError::InvalidStream {
        field,
        message: "the stream lacks a part its configuration needs".into(),
    }
}

impl<B: HaaresBackend> ResidualStream<B> {
    /// The additive update of the unrouted methods: `h + u` (Standard), `h + g·u` (ReZero) or
    /// `h + λ ⊙ u` (LayerScale) (docs/decisions.md, decision 4).
    fn additive_update(
        &self,
        event: usize,
        hidden: Tensor<B, 3>,
        output: Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        match (self.gates.get(event), self.scales.get(event)) {
            (Some(gate), _) => hidden + output * gate.val().unsqueeze::<3>(),
            (None, Some(scale)) => hidden + output * scale.val().unsqueeze::<3>(),
            (None, None) => hidden + output,
        }
    }
}
