//! How the trainer reports what it does without knowing who listens.
//!
//! The node implements [`EventSink`] by appending to its signed event log; tests
//! implement it with a vector. The trainer never imports the node.

use serde_json::Value;

/// One thing the trainer wants recorded: an event kind (`recipe.registered`,
/// `run.started`, ...), the subject it is about (a run id or a digest) and its data.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerEvent {
    pub kind: String,
    pub subject: String,
    pub data: Value,
}

/// Receives the trainer's events. An error stops the work that produced the event:
/// a run whose progress cannot be recorded must not go on unrecorded.
pub trait EventSink {
    type Error: std::error::Error + Send + Sync + 'static;

    fn emit(&mut self, event: TrainerEvent) -> Result<(), Self::Error>;
}

/// Drops every event: for runs whose record lives elsewhere (a verifier's replay).
pub struct Discard;

impl EventSink for Discard {
    type Error = std::convert::Infallible;

    fn emit(&mut self, _event: TrainerEvent) -> Result<(), Self::Error> {
        Ok(())
    }
}
