//! The mindxtrain trainer.
//!
//! * [`recipe`]: strict YAML recipes (every field known, invariants checked at parse time,
//!   errors that name file, line, column and field path).
//! * [`events`]: the [`events::EventSink`] trait through which the trainer reports to
//!   whoever embeds it (the node writes those reports into its signed log).
//! * [`data`], [`model`], [`optim`], [`checkpoint`], [`plan`]: what a run is made of;
//!   [`run`] drives it; [`infer`] serves a model; [`rl`] learns from rewards through it;
//!   [`hub`] finds models and datasets named by hub id in the Hugging Face cache.

pub mod batch;
pub mod bench_eval;
pub mod checkpoint;
pub mod collective;
pub mod data;
pub mod events;
pub mod generate;
pub mod hub;
pub mod infer;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod plan;
pub mod quantize;
pub mod recipe;
pub mod rl;
pub mod run;

/// This crate's version and the kernels' it was built with (a manifest's `code_version`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const KERNELS_VERSION: &str = mindxtrain_kernels::VERSION;
