//! Issuing collectives without waiting for them: the backward pass hands a bucket over and goes
//! on; the result is collected when it is needed.
//!
//! NCCL queues its work on a CUDA stream of its own, so it is called inline and returns at once.
//! The TCP mesh blocks while bytes move, so it runs on a thread of its own (`mindxtrain-comm`),
//! taking jobs in order: every rank issues the same jobs in the same order, which is what the
//! mesh needs, and the compute thread never waits on the network until it asks for a result.
//!
//! An inline collective's input is held for a few operations after it is queued: dropping a
//! buffer makes the stream it was allocated on (the compute stream) wait for its last reader,
//! NCCL, so a bucket dropped as soon as its reduction is queued stalls the backward until that
//! reduction is done, and nothing overlaps. Held `HOLD` operations longer (or until its result
//! is waited for), its operation has usually finished by the time it is dropped.

use crate::collective::{Collective, CollectiveError, Span};
use candle_core::Tensor;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

/// One collective to run.
#[derive(Debug)]
pub enum Job {
    AllReduce(Tensor),
    ReduceScatter(Tensor, Vec<Span>),
    AllGather(Tensor, Vec<Span>),
    Bytes(Vec<u8>),
}

/// Queued inline operations whose inputs are held (see the module's doc): enough that a
/// bucket or a block's gather is dropped a few blocks after it was queued, few enough that the
/// held buckets (at most an embedding's gradient and three blocks' at 8B: ~2.7 GB) stay small.
const HOLD: usize = 4;

impl Job {
    /// The device tensor the operation reads, if any.
    fn input(&self) -> Option<&Tensor> {
        match self {
            Job::AllReduce(t) | Job::ReduceScatter(t, _) | Job::AllGather(t, _) => Some(t),
            Job::Bytes(_) => None,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Job::AllReduce(_) => "all-reduce",
            Job::ReduceScatter(..) => "reduce-scatter",
            Job::AllGather(..) => "all-gather",
            Job::Bytes(_) => "host gather",
        }
    }
}

/// A job's result.
#[derive(Debug)]
pub enum Output {
    Tensor(Tensor),
    Bytes(Vec<Vec<u8>>),
}

impl Output {
    pub fn tensor(self) -> Result<Tensor, CollectiveError> {
        match self {
            Output::Tensor(t) => Ok(t),
            Output::Bytes(_) => Err(CollectiveError::Mismatch("expected a tensor result".into())),
        }
    }

    pub fn bytes(self) -> Result<Vec<Vec<u8>>, CollectiveError> {
        match self {
            Output::Bytes(b) => Ok(b),
            Output::Tensor(_) => Err(CollectiveError::Mismatch("expected host values".into())),
        }
    }
}

/// A job handed to [`Comm::submit`]; [`Comm::wait`] turns it into its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

impl Ticket {
    /// The job's number, in the order jobs were submitted.
    pub fn id(self) -> u64 {
        self.0
    }
}

/// When a job ran on the communication thread (host clock), for the timing trace.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub start: Instant,
    pub end: Instant,
}

type Done = (u64, Result<Output, CollectiveError>, Timing);

/// A job's result and, when it ran, when.
type Finished = (Result<Output, CollectiveError>, Option<Timing>);

enum Worker {
    Inline(RefCell<Box<dyn Collective>>),
    Thread { jobs: Option<Sender<(u64, Job)>>, done: Receiver<Done>, handle: Option<std::thread::JoinHandle<()>> },
}

/// The rank's collective, as the training step uses it (one thread: the step's).
pub struct Comm {
    worker: Worker,
    rank: usize,
    world: usize,
    next: Cell<u64>,
    ready: RefCell<BTreeMap<u64, Finished>>,
    /// Host-clock spans of finished jobs, by label, while a trace is being recorded.
    finished: RefCell<Vec<(u64, &'static str, Timing)>>,
    /// Inputs of the latest inline operations, by ticket (see the module's doc).
    held: RefCell<VecDeque<(u64, Tensor)>>,
}

fn run(c: &mut dyn Collective, job: Job) -> Result<Output, CollectiveError> {
    Ok(match job {
        Job::AllReduce(t) => Output::Tensor(c.all_reduce(&t)?),
        Job::ReduceScatter(t, spans) => Output::Tensor(c.reduce_scatter(&t, &spans)?),
        Job::AllGather(t, spans) => Output::Tensor(c.all_gather(&t, &spans)?),
        Job::Bytes(b) => Output::Bytes(c.all_gather_bytes(&b)?),
    })
}

impl Comm {
    /// `threaded`: run the collective on a thread of its own (the TCP mesh); otherwise call it
    /// inline (NCCL, which only queues work).
    pub fn new(collective: Box<dyn Collective>, threaded: bool) -> Comm {
        let (rank, world) = (collective.rank(), collective.world());
        let worker = if threaded {
            let (jobs, rx) = channel::<(u64, Job)>();
            let (tx, done) = channel::<Done>();
            let mut c = collective;
            let handle = std::thread::Builder::new()
                .name("mindxtrain-comm".into())
                .spawn(move || {
                    for (id, job) in rx {
                        let start = Instant::now();
                        let r = run(c.as_mut(), job);
                        if tx.send((id, r, Timing { start, end: Instant::now() })).is_err() {
                            return;
                        }
                    }
                })
                .expect("spawning the communication thread");
            Worker::Thread { jobs: Some(jobs), done, handle: Some(handle) }
        } else {
            Worker::Inline(RefCell::new(collective))
        };
        Comm {
            worker,
            rank,
            world,
            next: Cell::new(0),
            ready: RefCell::new(BTreeMap::new()),
            finished: RefCell::new(Vec::new()),
            held: RefCell::new(VecDeque::new()),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Starts `job`; its result is [`Comm::wait`]'s.
    pub fn submit(&self, job: Job) -> Ticket {
        let id = self.next.get();
        self.next.set(id + 1);
        match &self.worker {
            Worker::Inline(c) => {
                let input = job.input().cloned();
                let start = Instant::now();
                let r = run(c.borrow_mut().as_mut(), job);
                self.ready.borrow_mut().insert(id, (r, Some(Timing { start, end: Instant::now() })));
                let mut held = self.held.borrow_mut();
                held.extend(input.map(|t| (id, t)));
                while held.len() > HOLD {
                    held.pop_front();
                }
            }
            Worker::Thread { jobs, .. } => {
                let sent = jobs.as_ref().is_some_and(|j| j.send((id, job)).is_ok());
                if !sent {
                    let e = CollectiveError::Aborted { reason: "the communication thread has stopped".into() };
                    self.ready.borrow_mut().insert(id, (Err(e), None));
                }
            }
        }
        Ticket(id)
    }

    /// The result of `ticket` (waiting for it and every job before it).
    pub fn wait(&self, ticket: Ticket) -> Result<Output, CollectiveError> {
        // Its result is needed now, and so is every earlier one's: their inputs may go.
        self.held.borrow_mut().retain(|(id, _)| *id > ticket.0);
        loop {
            if let Some((r, span)) = self.ready.borrow_mut().remove(&ticket.0) {
                if let Some(span) = span {
                    self.finished.borrow_mut().push((ticket.0, "", span));
                }
                return r;
            }
            let Worker::Thread { done, .. } = &self.worker else {
                return Err(CollectiveError::Mismatch(format!("no collective #{} was started", ticket.0)));
            };
            match done.recv() {
                Ok((id, r, span)) => {
                    self.ready.borrow_mut().insert(id, (r, Some(span)));
                }
                Err(_) => {
                    return Err(CollectiveError::Aborted { reason: "the communication thread has stopped".into() });
                }
            }
        }
    }

    /// Records device-side times of the collective's operations (a backend on a device stream).
    pub fn record_timeline(&self, on: bool) {
        if let Worker::Inline(c) = &self.worker {
            c.borrow_mut().record_timeline(on);
        }
    }

    /// The device-side spans recorded since the last call (see [`Comm::record_timeline`]).
    pub fn device_timeline(&self) -> Vec<(String, Instant, Instant)> {
        match &self.worker {
            Worker::Inline(c) => c.borrow_mut().timeline(),
            Worker::Thread { .. } => Vec::new(),
        }
    }

    /// Waits until every collective submitted so far has finished on the device (a thread's
    /// jobs have when they are waited for).
    pub fn synchronize(&self) -> Result<(), CollectiveError> {
        match &self.worker {
            Worker::Inline(c) => c.borrow_mut().synchronize(),
            Worker::Thread { .. } => Ok(()),
        }
    }

    /// Submits and waits.
    pub fn run(&self, job: Job) -> Result<Output, CollectiveError> {
        let t = self.submit(job);
        self.wait(t)
    }

    /// Host-clock spans of the jobs waited for since the last call, by ticket.
    pub fn take_spans(&self) -> Vec<(u64, Timing)> {
        self.finished.borrow_mut().drain(..).map(|(id, _, s)| (id, s)).collect()
    }

    /// f64 values from every rank (any number each), in rank order.
    pub fn gather_f64(&self, values: &[f64]) -> Result<Vec<Vec<f64>>, CollectiveError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.run(Job::Bytes(bytes))?
            .bytes()?
            .into_iter()
            .map(|b| {
                if b.len() % 8 != 0 {
                    return Err(CollectiveError::Mismatch(format!("a rank sent {} bytes of f64 values", b.len())));
                }
                Ok(b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
            })
            .collect()
    }

    /// The sum of one f64 per rank, added in rank order.
    pub fn sum_f64(&self, value: f64) -> Result<f64, CollectiveError> {
        let all = self.gather_f64(&[value])?;
        let mut total = 0.0;
        for (rank, v) in all.iter().enumerate() {
            total += v
                .first()
                .copied()
                .ok_or_else(|| CollectiveError::Mismatch(format!("rank {rank} sent no value to a sum")))?;
        }
        Ok(total)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Worker::Thread { jobs, handle, .. } = &mut self.worker {
            // Closing the queue ends the thread after its current job. It is not joined: a job
            // blocked on a failed peer ends at the collective timeout, and a failing run must not
            // wait for that.
            jobs.take();
            handle.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Backend;
    use candle_core::Device;

    /// One rank that hands every input back (a world of one, inline as NCCL runs).
    struct Echo;

    impl Collective for Echo {
        fn rank(&self) -> usize {
            0
        }
        fn world(&self) -> usize {
            1
        }
        fn backend(&self) -> Backend {
            Backend::Nccl
        }
        fn all_reduce(&mut self, t: &Tensor) -> Result<Tensor, CollectiveError> {
            Ok(t.clone())
        }
        fn reduce_scatter(&mut self, t: &Tensor, _: &[Span]) -> Result<Tensor, CollectiveError> {
            Ok(t.clone())
        }
        fn all_gather(&mut self, t: &Tensor, _: &[Span]) -> Result<Tensor, CollectiveError> {
            Ok(t.clone())
        }
        fn all_gather_bytes(&mut self, b: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
            Ok(vec![b.to_vec()])
        }
    }

    fn held(c: &Comm) -> Vec<u64> {
        c.held.borrow().iter().map(|(id, _)| *id).collect()
    }

    /// Inputs stay held for the last `HOLD` inline operations and go once their result (or a
    /// later one's) is waited for; host gathers hold nothing; results are unchanged.
    #[test]
    fn inline_inputs_are_held_for_the_latest_operations_until_waited_for() {
        let c = Comm::new(Box::new(Echo), false);
        let t = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let tickets: Vec<Ticket> = (0..6).map(|_| c.submit(Job::AllReduce(t.clone()))).collect();
        assert_eq!(held(&c), [2, 3, 4, 5]);
        c.submit(Job::Bytes(vec![1]));
        assert_eq!(held(&c), [2, 3, 4, 5], "a host gather reads no device buffer");
        let out = c.wait(tickets[3]).unwrap().tensor().unwrap();
        assert_eq!(out.to_vec1::<f32>().unwrap(), [1.0, 2.0]);
        assert_eq!(held(&c), [4, 5]);
        c.wait(tickets[5]).unwrap();
        assert!(held(&c).is_empty());
    }
}
