//! A recipe's data, ready to train on: indexed, deduplicated, split, tokenized, with its
//! manifest.
//!
//! One streaming pass reads every block of every input once: each record is checked,
//! hashed for exact dedupe, sketched for near dedupe when the recipe asks for it
//! ([`super::near_dedupe`]), rendered with the chat template and tokenized. What stays in
//! memory per example is small and fixed: during the pass a 16-byte digest (dedupe), a
//! 32-byte candidate (block, row, lengths, holdout rank) and, with near dedupe, its band
//! entries (about 20 bytes per band); afterwards a 12-byte [`DocRef`]
//! (block, row, length) and its place in the epoch's row plan. Tokens live in a bounded
//! cache of whole blocks ([`super::store::CACHE_TOKENS`]); a block that was evicted (or never
//! fitted) is read again from its file and tokenized again when a batch needs it. A dataset
//! whose tokens fit the cache is read once.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use super::batches::{BatchIter, DataCursor, Layout, PreferenceIter, plan_epoch, single_pass};
use super::error::DataError;
use super::example::{Example, Message, Role};
use super::generator::{Families, GENERATOR_VERSION, TaskFamily, TaskParams, generate_jsonl};
use super::jsonl::{FileDigest, MAX_REPORTED_SKIPS, SkippedLine};
use super::manifest::{DatasetManifest, GeneratorInfo, MANIFEST_VERSION};
use super::near_dedupe::NearDedupe;
use super::pack::learned_tokens;
use super::source::{Locate, Source, files};
use super::store::{CACHE_TOKENS, Doc, DocCache, DocRef, DocStore, Encoder, Part};
use super::template::{ChatTemplate, encode_pieces};
use super::tokenizer::Tokenizer;
use crate::batch::PackedBatch;
use crate::recipe::{DataFormat, DataSource, GeneratorKind, Recipe};

/// Choices the recipe does not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataOptions {
    /// Count and report malformed records instead of failing on the first (`--skip-bad`).
    pub skip_bad: bool,
    /// Tokens the document cache may hold ([`CACHE_TOKENS`] by default).
    pub cache_tokens: usize,
}

impl Default for DataOptions {
    fn default() -> DataOptions {
        DataOptions { skip_bad: false, cache_tokens: CACHE_TOKENS }
    }
}

/// A prompt to generate from and the answer it should produce (exact-match eval).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptItem {
    pub prompt_ids: Vec<u32>,
    pub reference: String,
    /// The task family, for data from the task generator (exact match is reported per family).
    pub family: Option<TaskFamily>,
}

pub struct Dataset {
    pub manifest: DatasetManifest,
    pub template: ChatTemplate,
    store: DocStore,
    layout: Layout,
    eos_id: u32,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("manifest", &self.manifest)
            .field("train", &self.train_len())
            .field("holdout", &self.holdout_len())
            .finish_non_exhaustive()
    }
}

/// One deduplicated example of the pass, before the holdout split.
struct Candidate {
    block: u32,
    row: u32,
    /// Tokens (the longer side of a pair), tokens within `seq_len`, learned tokens.
    len: u32,
    tokens: u32,
    learned: u32,
    truncated: u8,
    rank: u64,
}

#[derive(Default)]
struct Pass {
    seen: HashSet<[u8; 16]>,
    /// With `data.dedupe.near_threshold`.
    near: Option<NearDedupe>,
    candidates: Vec<Candidate>,
    read: u64,
    duplicates: u64,
    over_max: u64,
    dropped_no_target: u64,
    unlocated_turns: u64,
    skipped: u64,
    skipped_lines: Vec<SkippedLine>,
}

impl Dataset {
    /// Reads (or generates) the recipe's data. Relative paths are taken from `base_dir`.
    pub fn from_recipe(
        recipe: &Recipe,
        base_dir: &Path,
        tokenizer: &Tokenizer,
        options: DataOptions,
    ) -> Result<Dataset, DataError> {
        let data = &recipe.data;
        if let Some(config) = &recipe.model.config
            && tokenizer.vocab_size() > config.vocab_size as usize
        {
            return Err(DataError::Config(format!(
                "the tokenizer has {} ids but model.config.vocab_size is {}",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        let seq_len = data.seq_len as usize;
        if seq_len < 2 {
            return Err(DataError::Config(format!("data.seq_len {seq_len} leaves nothing to predict")));
        }

        let mut generator = None;
        // Generated pre-training text is the rendered task conversations, every token learned.
        let learn_all = data.format == DataFormat::Text && data.source == DataSource::Generated;
        let record_format = if learn_all { DataFormat::Chat } else { data.format };
        let snapshot = files::hub_snapshot(data)?;
        let mut source = match data.source {
            DataSource::Jsonl | DataSource::Hf => {
                let inputs = match &snapshot {
                    Some(snapshot) => files::resolve_snapshot(snapshot, &data.split)?,
                    None if data.paths.is_empty() => {
                        return Err(DataError::Config(
                            "data.paths must list files (or, with `source: hf`, data.hf_id name a dataset in the \
                             Hugging Face cache)"
                                .into(),
                        ));
                    }
                    None => files::resolve(&data.paths, &data.split, base_dir)?,
                };
                let columns: Vec<(String, String)> = data.columns.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                Source::files(inputs, data.format, &columns)?
            }
            DataSource::Generated => {
                let g = data.generator.as_ref().ok_or_else(|| {
                    DataError::Config("data.source is `generated` but data.generator is missing".into())
                })?;
                let GeneratorKind::Tasks = g.kind;
                let params = TaskParams {
                    multi_arg_tools: seq_len >= 192,
                    families: Families::of(&g.families),
                    ..TaskParams::new(g.seed, g.count)
                };
                let text = generate_jsonl(&params, record_format);
                generator = Some(GeneratorInfo {
                    kind: g.kind,
                    seed: g.seed,
                    count: g.count,
                    version: GENERATOR_VERSION,
                    multi_arg_tools: params.multi_arg_tools,
                    families: g.families.clone(),
                });
                Source::memory("generated:tasks", Arc::from(text), record_format)
            }
        };

        let template = ChatTemplate::load(tokenizer)?;
        let encoder = Encoder {
            template: template.clone(),
            tokenizer: tokenizer.clone(),
            learn_all,
            preference: data.format == DataFormat::Preference,
        };
        let near = match data.dedupe.near_threshold {
            Some(t) if (0.0..=1.0).contains(&t) => Some(NearDedupe::new(t)),
            Some(t) => return Err(DataError::Config(format!("data.dedupe.near_threshold {t} is not in [0, 1]"))),
            None => None,
        };
        let mut pass = Pass { near, ..Pass::default() };
        let max = data.max_samples.unwrap_or(u64::MAX);
        let mut cache = DocCache::new(options.cache_tokens);
        let digests = {
            let mut visit =
                |block: usize, rows: Vec<super::source::Row>, locate: Locate<'_>| -> Result<(), DataError> {
                    let mut unique = Vec::new();
                    for (r, row) in rows.into_iter().enumerate() {
                        match row {
                            Ok(Some(example)) => {
                                pass.read += 1;
                                let digest = example.digest();
                                let short: [u8; 16] = digest[..16].try_into().unwrap_or_default();
                                if data.dedupe.exact && !pass.seen.insert(short) {
                                    pass.duplicates += 1;
                                } else {
                                    unique.push((r, example, digest));
                                }
                            }
                            Ok(None) => {}
                            Err(e) => pass.skip(e, options.skip_bad)?,
                        }
                    }
                    // Dedupe (exact, then near) comes before the cap: `max_samples` counts
                    // examples that are neither.
                    let not_near = match &mut pass.near {
                        Some(near) => near.filter(&unique.iter().map(|u| &u.1).collect::<Vec<_>>())?,
                        None => vec![true; unique.len()],
                    };
                    let mut kept = Vec::new();
                    for (example, _) in unique.into_iter().zip(not_near).filter(|(_, keep)| *keep) {
                        if (pass.candidates.len() + kept.len()) as u64 >= max {
                            pass.over_max += 1;
                        } else {
                            kept.push(example);
                        }
                    }
                    let encoded: Vec<_> = kept.par_iter().map(|(_, example, _)| encoder.encode(example)).collect();
                    let mut docs = Vec::with_capacity(kept.len());
                    for ((r, _, digest), doc) in kept.into_iter().zip(encoded) {
                        let (doc, unlocated) = match doc {
                            Ok(d) => d,
                            Err(e) => {
                                pass.skip(locate(r, e.to_string()), options.skip_bad)?;
                                continue;
                            }
                        };
                        pass.unlocated_turns += u64::from(unlocated);
                        let (len, tokens, learned, truncated) = measure(&doc, seq_len);
                        pass.candidates.push(Candidate {
                            block: block as u32,
                            row: r as u32,
                            len,
                            tokens,
                            learned,
                            truncated,
                            rank: holdout_rank(recipe.meta.seed, &digest),
                        });
                        docs.push((r as u32, Arc::new(doc)));
                    }
                    cache.offer(block as u32, docs);
                    Ok(())
                };
            source.index(&mut visit)?
        };
        let store = DocStore::new(source, encoder, cache);
        let (mut manifest, store) = split_and_describe(recipe, pass, store, digests, generator, &template, tokenizer)?;
        // Which hub dataset the files are: the snapshot read (with the commit it resolved to),
        // or the one `data.paths` is a local copy of.
        manifest.hf_id = data.hf_id.clone();
        manifest.revision = snapshot.as_ref().map(|s| s.source.revision.clone()).or_else(|| data.revision.clone());
        manifest.commit = snapshot.map(|s| s.source.commit);
        let layout = Layout {
            seq_len,
            packing: data.packing,
            shuffle: data.shuffle,
            seed: recipe.meta.seed,
            pad_id: tokenizer.pad_id(),
        };
        Ok(Dataset { manifest, template, store, layout, eos_id: tokenizer.eos_id() })
    }

    /// Rows one epoch of training data fills (packed rows, or preference pairs); sets the
    /// step count of recipes that give `epochs` instead of `max_steps`.
    pub fn train_rows_per_epoch(&self) -> usize {
        let layout = if self.is_preference() { Layout { packing: false, ..self.layout } } else { self.layout };
        plan_epoch(&self.store.train, layout, 0).len()
    }

    pub fn is_preference(&self) -> bool {
        self.store.encoder.preference
    }

    /// Training examples (after dedupe, the split and dropping those with nothing to learn).
    pub fn train_len(&self) -> usize {
        self.store.train.len()
    }

    /// Held-out examples.
    pub fn holdout_len(&self) -> usize {
        self.store.holdout.len()
    }

    /// The endless training stream from `cursor` (start with `DataCursor::default()`).
    pub fn batches(&self, per_device: usize, cursor: DataCursor) -> Result<BatchIter<'_>, DataError> {
        if self.is_preference() {
            return Err(DataError::Config("preference data yields preference_batches".into()));
        }
        BatchIter::new(&self.store, self.layout, per_device, cursor)
    }

    /// The endless stream of preference pairs from `cursor`.
    pub fn preference_batches(&self, per_device: usize, cursor: DataCursor) -> Result<PreferenceIter<'_>, DataError> {
        if !self.is_preference() {
            return Err(DataError::Config("only preference data yields preference_batches".into()));
        }
        PreferenceIter::new(&self.store, self.layout, per_device, cursor)
    }

    /// One ordered pass over the holdout for held-out loss (chosen answers for preference
    /// data); empty when there is no holdout.
    pub fn holdout_batches(&self, per_device: usize) -> Result<Vec<PackedBatch>, DataError> {
        let layout = if self.is_preference() { Layout { packing: false, ..self.layout } } else { self.layout };
        single_pass(&self.store, Part::Holdout, layout, per_device)
    }

    /// Held-out example `i` (read again from its input).
    pub fn holdout_example(&self, i: usize) -> Result<Example, DataError> {
        self.store.example(Part::Holdout, i)
    }

    /// Generation prompts with reference answers for the holdout's conversations (plain
    /// text examples have no answer and are left out), at most `max` of them.
    pub fn holdout_prompts(&self, tokenizer: &Tokenizer) -> Result<Vec<PromptItem>, DataError> {
        self.holdout_prompts_max(tokenizer, usize::MAX)
    }

    /// [`Dataset::holdout_prompts`], the first `max`.
    pub fn holdout_prompts_max(&self, tokenizer: &Tokenizer, max: usize) -> Result<Vec<PromptItem>, DataError> {
        self.prompts_of(Part::Holdout, tokenizer, max)
    }

    /// The training examples as prompts with reference answers, in example order (what RL
    /// samples completions for and scores them against).
    pub fn train_prompts(&self, tokenizer: &Tokenizer) -> Result<Vec<PromptItem>, DataError> {
        self.prompts_of(Part::Train, tokenizer, usize::MAX)
    }

    fn prompts_of(&self, part: Part, tokenizer: &Tokenizer, max: usize) -> Result<Vec<PromptItem>, DataError> {
        let mut items = Vec::new();
        let len = match part {
            Part::Train => self.train_len(),
            Part::Holdout => self.holdout_len(),
        };
        for i in 0..len {
            if items.len() >= max {
                break;
            }
            let example = self.store.example(part, i)?;
            let (prompt, conv) = match &example {
                Example::Chat(c) => match c.messages.split_last() {
                    Some((last, before)) if last.role == Role::Assistant => (before.to_vec(), c.clone()),
                    _ => continue,
                },
                Example::Preference(p) => {
                    let messages = p.prompt.iter().chain(&p.chosen).cloned().collect();
                    (p.prompt.clone(), super::example::Conversation { messages, tools: p.tools.clone() })
                }
                Example::Text(_) => continue,
            };
            let Some(reference) = self.template.reference_answer(&conv, tokenizer)? else { continue };
            let prompt_ids = self.prompt_ids(tokenizer, &prompt, &conv.tools)?;
            let family = match (&self.manifest.generator, prompt.iter().rfind(|m| m.role == Role::User)) {
                (Some(_), Some(user)) => TaskFamily::of_prompt(&user.content),
                _ => None,
            };
            items.push(PromptItem { prompt_ids, reference, family });
        }
        Ok(items)
    }

    /// The token ids a model is given to answer after `messages`.
    pub fn prompt_ids(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        tools: &[super::json::Json],
    ) -> Result<Vec<u32>, DataError> {
        Ok(encode_pieces(tokenizer, &self.template.try_generation_prompt(messages, tools)?)?.ids)
    }

    /// `<|endoftext|>`, which ends every document.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }
}

impl Pass {
    fn skip(&mut self, e: DataError, skip_bad: bool) -> Result<(), DataError> {
        if !skip_bad {
            return Err(e);
        }
        self.skipped += 1;
        if self.skipped_lines.len() < MAX_REPORTED_SKIPS {
            let (path, line, reason) = match &e {
                DataError::BadLine { path, line, reason } => (path.display().to_string(), *line, reason.clone()),
                DataError::BadTable(t) => (t.path.display().to_string(), t.row.map_or(0, |r| r + 1), e.to_string()),
                other => (String::new(), 0, other.to_string()),
            };
            self.skipped_lines.push(SkippedLine { path, line, reason });
        }
        Ok(())
    }
}

/// (length for row planning, tokens within `seq_len`, learned tokens, sides cut).
fn measure(doc: &Doc, seq_len: usize) -> (u32, u32, u32, u8) {
    let sides: Vec<&super::template::Encoded> = match doc {
        Doc::Sft(e) => vec![e],
        Doc::Pair(c, r) => vec![c, r],
    };
    let len = sides.iter().map(|e| e.ids.len()).max().unwrap_or(0);
    let learned: Vec<usize> = sides.iter().map(|e| learned_tokens(e, seq_len)).collect();
    // A pair is only useful when both sides have something to learn.
    let useful = learned.iter().all(|&l| l > 0);
    let tokens = if useful { sides.iter().map(|e| e.ids.len().min(seq_len)).sum::<usize>() } else { 0 };
    let learned = if useful { learned.iter().sum::<usize>() } else { 0 };
    let truncated = sides.iter().filter(|e| e.ids.len() > seq_len).count() as u8;
    (len as u32, tokens as u32, learned as u32, truncated)
}

/// The seeded holdout rank of an example: which examples are held out depends only on the
/// seed and each example itself, so adding data does not reshuffle the holdout.
fn holdout_rank(seed: u64, digest: &[u8; 32]) -> u64 {
    let mut h = blake3::Hasher::new_derive_key("mindxtrain holdout v1");
    h.update(&seed.to_le_bytes());
    h.update(digest);
    u64::from_be_bytes(h.finalize().as_bytes()[..8].try_into().unwrap_or_default())
}

fn split_and_describe(
    recipe: &Recipe,
    pass: Pass,
    mut store: DocStore,
    files: Vec<FileDigest>,
    generator: Option<GeneratorInfo>,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
) -> Result<(DatasetManifest, DocStore), DataError> {
    let data = &recipe.data;
    let n = pass.candidates.len();
    let holdout_cfg = &recipe.eval.holdout;
    let fraction = if recipe.eval.enabled { holdout_cfg.fraction } else { 0.0 };
    let wanted =
        if fraction.is_finite() && fraction > 0.0 { (fraction.min(1.0) * n as f64).floor() as usize } else { 0 };
    let k = wanted.min(holdout_cfg.max_samples.map_or(usize::MAX, |m| m as usize)).min(n.saturating_sub(1));
    let mut held = vec![false; n];
    if k > 0 {
        let mut ranked: Vec<(u64, usize)> = pass.candidates.iter().enumerate().map(|(i, c)| (c.rank, i)).collect();
        ranked.select_nth_unstable(k - 1);
        for &(_, i) in &ranked[..k] {
            held[i] = true;
        }
    }
    #[derive(Default)]
    struct Part {
        examples: u64,
        tokens: u64,
        learned: u64,
    }
    let (mut train, mut hold) = (Part::default(), Part::default());
    let (mut dropped, mut truncated) = (0u64, 0u64);
    for (c, held) in pass.candidates.iter().zip(held) {
        truncated += u64::from(c.truncated);
        if c.learned == 0 {
            dropped += 1;
            continue;
        }
        let part = if held { &mut hold } else { &mut train };
        part.examples += 1;
        part.tokens += u64::from(c.tokens);
        part.learned += u64::from(c.learned);
        let r = DocRef { block: c.block, row: c.row, len: c.len };
        if held { store.holdout.push(r) } else { store.train.push(r) }
    }
    if store.train.is_empty() {
        return Err(DataError::Empty("no training examples are left after reading, dedupe and the split".into()));
    }
    let hf = data.source == DataSource::Hf;
    let manifest = DatasetManifest {
        version: MANIFEST_VERSION,
        source: data.source,
        format: data.format,
        files,
        generator,
        split: hf.then(|| data.split.clone()),
        hf_id: None,
        revision: None,
        commit: None,
        columns: data.columns.clone(),
        tokenizer: tokenizer.identity().to_owned(),
        template: template.info(),
        seq_len: data.seq_len,
        packing: data.packing,
        read_examples: pass.read,
        skipped_lines: pass.skipped,
        skipped: pass.skipped_lines,
        duplicates_removed: pass.duplicates,
        near_duplicates_removed: pass.near.as_ref().map(NearDedupe::removed),
        near_dedupe: pass.near.as_ref().map(NearDedupe::params),
        over_max_samples: pass.over_max,
        train_examples: train.examples,
        holdout_examples: hold.examples,
        dropped_no_target: dropped + pass.dropped_no_target,
        unlocated_turns: pass.unlocated_turns,
        truncated,
        train_tokens: train.tokens,
        train_target_tokens: train.learned,
        holdout_tokens: hold.tokens,
    };
    Ok((manifest, store))
}

#[cfg(test)]
mod tests;
