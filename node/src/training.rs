//! The node side of training: the trainer's events go into the signed log.

use crate::log::{AppendError, AppendRequest, EventLog};
use mindxtrain_trainer::events::{EventSink, TrainerEvent};

/// Kind of the event that records a measured autotune plan.
pub const PLAN_EMITTED: &str = "plan.emitted";

/// Appends every trainer event to the log; `emit` returns once the event is fsynced, so a
/// run never gets ahead of its record.
pub struct LogSink<'a> {
    log: &'a EventLog,
}

impl<'a> LogSink<'a> {
    pub fn new(log: &'a EventLog) -> Self {
        LogSink { log }
    }
}

impl EventSink for LogSink<'_> {
    type Error = AppendError;

    fn emit(&mut self, event: TrainerEvent) -> Result<(), AppendError> {
        self.log.append(AppendRequest::new(event.kind, event.subject, event.data))?;
        Ok(())
    }
}
