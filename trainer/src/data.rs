//! Training data: JSONL readers, tokenization, chat template, packing and the task generator.
//!
//! [`Dataset::from_recipe`] is the entry point: it reads the recipe's JSONL files (or runs
//! the seeded task generator), removes exact duplicates, splits off the holdout, renders
//! every example with Qwen3's chat template and tokenizes it, and records a
//! [`DatasetManifest`]. [`Dataset::batches`] then yields [`crate::batch::PackedBatch`]es
//! from a resumable [`DataCursor`].

mod batches;
mod dataset;
mod error;
pub mod example;
pub mod generator;
pub mod json;
pub mod jsonl;
mod manifest;
mod pack;
mod record;
pub mod score;
mod split;
pub mod template;
pub mod tokenizer;

pub use batches::{BatchIter, DataCursor, Layout, PreferenceIter, epoch_order};
pub use dataset::{DataOptions, Dataset, PromptItem};
pub use error::DataError;
pub use example::{Conversation, Example, Message, PreferencePair, Role, ToolArguments, ToolCall};
pub use generator::{Answer, GENERATOR_VERSION, Task, TaskFamily, TaskParams, generate, generate_jsonl};
pub use json::Json;
pub use jsonl::{FileDigest, SkippedLine};
pub use manifest::{DatasetManifest, GeneratorInfo, MANIFEST_VERSION};
pub use pack::{plan_rows, push_row};
pub use score::answers_match;
pub use split::{dedupe_exact, holdout_split};
pub use template::{ChatTemplate, Encoded, Targets};
pub use tokenizer::{Special, Tokenizer};
