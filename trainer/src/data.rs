//! Training data: JSONL, Parquet and Arrow readers, tokenization, chat templates, packing
//! and the task generator.
//!
//! [`Dataset::from_recipe`] is the entry point: it streams the recipe's files (JSONL,
//! Parquet, Arrow IPC; or the seeded task generator's output) block by block, removes exact
//! duplicates and (`data.dedupe.near_threshold`, [`near_dedupe`]) near duplicates, splits off
//! the holdout, renders every example with the model's chat template and tokenizes it, and
//! records a [`DatasetManifest`]. [`Dataset::batches`] then yields
//! [`crate::batch::PackedBatch`]es from a resumable [`DataCursor`], reading blocks again
//! through a bounded cache when the data does not fit in memory.

mod batches;
mod dataset;
mod error;
pub mod example;
pub mod generator;
pub mod json;
pub mod jsonl;
mod manifest;
pub mod near_dedupe;
mod pack;
mod record;
pub mod score;
pub mod source;
mod store;
pub mod template;
pub mod tokenizer;

pub use batches::{BatchIter, DataCursor, Layout, PreferenceIter, WINDOW_TOKENS, epoch_order, window_order};
pub use dataset::{DataOptions, Dataset, PromptItem};
pub use error::{DataError, TableError};
pub use example::{Conversation, Example, Message, PreferencePair, Role, ToolArguments, ToolCall};
pub use generator::{Answer, Families, GENERATOR_VERSION, Task, TaskFamily, TaskParams, generate, generate_jsonl};
pub use json::Json;
pub use jsonl::{FileDigest, SkippedLine};
pub use manifest::{DatasetManifest, GeneratorInfo, MANIFEST_VERSION};
pub use near_dedupe::{NearDedupe, NearDedupeParams};
pub use pack::{plan_rows, push_row};
pub use score::answers_match;
pub use store::{CACHE_TOKENS, DocRef};
pub use template::{ChatTemplate, Encoded, Targets, TemplateInfo};
pub use tokenizer::{Special, Tokenizer};
