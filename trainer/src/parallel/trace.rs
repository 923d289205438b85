//! A timeline of the first steps of a distributed run, to see the gradient reductions overlap
//! the backward pass: `MINDXTRAIN_TRACE=DIR` makes each rank write `DIR/rank-N.trace.json` in the
//! Chrome trace format (open it in Perfetto or chrome://tracing), with a summary of how much of
//! the communication ran while the backward was computing.
//!
//! On a GPU the compute stream is synchronised at each stage boundary of a traced step (so the
//! compute lane shows when the work ran, not when it was queued); NCCL's own stream is timed with
//! CUDA events. The communication keeps running during those waits, so the overlap is real.

use serde_json::{Value, json};
use std::cell::RefCell;
use std::time::Instant;

/// One span on one lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub lane: &'static str,
    pub name: String,
    pub step: u64,
    pub start_us: f64,
    pub end_us: f64,
}

/// Spans recorded for the first `steps` steps.
pub struct Trace {
    base: Instant,
    steps: u64,
    events: RefCell<Vec<Event>>,
    open: RefCell<Vec<(String, Instant)>>,
}

impl Trace {
    pub fn new(steps: u64) -> Trace {
        Trace { base: Instant::now(), steps, events: RefCell::new(Vec::new()), open: RefCell::new(Vec::new()) }
    }

    pub fn base(&self) -> Instant {
        self.base
    }

    /// Whether `step` (1-based) is traced.
    pub fn covers(&self, step: u64) -> bool {
        step <= self.steps
    }

    pub fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.base).as_secs_f64() * 1e6
    }

    pub fn begin(&self, name: String) {
        self.open.borrow_mut().push((name, Instant::now()));
    }

    pub fn end(&self, lane: &'static str, step: u64) {
        if let Some((name, start)) = self.open.borrow_mut().pop() {
            let (s, e) = (self.us(start), self.us(Instant::now()));
            self.events.borrow_mut().push(Event { lane, name, step, start_us: s, end_us: e });
        }
    }

    pub fn add(&self, e: Event) {
        self.events.borrow_mut().push(e);
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.borrow().clone()
    }

    /// The Chrome trace document with the overlap summary of each traced step.
    pub fn to_json(&self, rank: usize) -> Value {
        let events = self.events.borrow();
        let lane_id = |l: &str| match l {
            "compute" => 1,
            "comm" => 2,
            _ => 3,
        };
        let trace: Vec<Value> = events
            .iter()
            .map(|e| {
                json!({"name": e.name, "cat": e.lane, "ph": "X", "pid": rank, "tid": lane_id(e.lane),
                    "ts": e.start_us, "dur": (e.end_us - e.start_us).max(0.0), "args": {"step": e.step}})
            })
            .collect();
        let steps: Vec<Value> = summarize(&events)
            .into_iter()
            .map(|(step, s)| {
                json!({"step": step, "comm_us": s.comm_us, "overlapped_us": s.overlapped_us,
                    "backward_us": s.backward_us, "buckets": s.buckets})
            })
            .collect();
        json!({"traceEvents": trace, "displayTimeUnit": "ms", "mindxtrain": {"rank": rank, "steps": steps}})
    }
}

/// How much of a step's communication ran while its backward was computing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overlap {
    pub comm_us: f64,
    pub overlapped_us: f64,
    pub backward_us: f64,
    pub buckets: usize,
}

/// Per step: the communication spans measured against the union of the backward stages.
pub fn summarize(events: &[Event]) -> Vec<(u64, Overlap)> {
    let mut steps: Vec<u64> = events.iter().map(|e| e.step).collect();
    steps.sort_unstable();
    steps.dedup();
    steps
        .into_iter()
        .map(|step| {
            let backward: Vec<&Event> = events
                .iter()
                .filter(|e| e.step == step && e.lane == "compute" && e.name.contains("backward"))
                .collect();
            let comm: Vec<&Event> = events.iter().filter(|e| e.step == step && e.lane == "comm").collect();
            let mut o = Overlap { buckets: comm.len(), ..Overlap::default() };
            for c in &comm {
                o.comm_us += c.end_us - c.start_us;
                for b in &backward {
                    o.overlapped_us += (c.end_us.min(b.end_us) - c.start_us.max(b.start_us)).max(0.0);
                }
            }
            o.backward_us = backward.iter().map(|b| b.end_us - b.start_us).sum();
            (step, o)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(lane: &'static str, name: &str, s: f64, e: f64) -> Event {
        Event { lane, name: name.into(), step: 1, start_us: s, end_us: e }
    }

    #[test]
    fn overlap_is_the_communication_inside_the_backward() {
        let events = [
            ev("compute", "block 1 backward", 0.0, 10.0),
            ev("compute", "block 0 backward", 10.0, 20.0),
            ev("comm", "all-reduce 1", 12.0, 26.0),
            ev("compute", "block 0 forward", 30.0, 40.0),
        ];
        let s = summarize(&events);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].1, Overlap { comm_us: 14.0, overlapped_us: 8.0, backward_us: 20.0, buckets: 1 });
        let doc = Trace::new(1).to_json(0);
        assert!(doc["traceEvents"].as_array().unwrap().is_empty());
    }
}
