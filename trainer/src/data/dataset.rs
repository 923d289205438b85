//! A recipe's data, ready to train on: read, deduplicated, split, tokenized, with its manifest.

use std::path::Path;

use super::batches::{BatchIter, DataCursor, Layout, PreferenceIter, epoch_order, single_pass};
use super::error::DataError;
use super::example::{Example, Message, Role};
use super::generator::{GENERATOR_VERSION, TaskParams, generate_jsonl};
use super::jsonl::{FileDigest, ReadOutcome, parse_line};
use super::manifest::{DatasetManifest, GeneratorInfo, MANIFEST_VERSION};
use super::pack::learned_tokens;
use super::split::{dedupe_exact, holdout_split};
use super::template::{ChatTemplate, Encoded, Targets, encode_pieces};
use super::tokenizer::Tokenizer;
use crate::batch::PackedBatch;
use crate::recipe::{DataFormat, DataSource, GeneratorKind, Recipe};

/// Choices the recipe does not make.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataOptions {
    /// Count and report malformed lines instead of failing on the first (`--skip-bad`).
    pub skip_bad: bool,
}

/// A prompt to generate from and the answer it should produce (exact-match eval).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptItem {
    pub prompt_ids: Vec<u32>,
    pub reference: String,
}

#[derive(Debug, Clone)]
enum Docs {
    Sft(Vec<Encoded>),
    Preference(Vec<(Encoded, Encoded)>),
}

#[derive(Debug, Clone)]
pub struct Dataset {
    pub manifest: DatasetManifest,
    pub train: Vec<Example>,
    pub holdout: Vec<Example>,
    pub template: ChatTemplate,
    train_docs: Docs,
    holdout_docs: Docs,
    layout: Layout,
    eos_id: u32,
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
        if let Some(t) = data.dedupe.near_threshold {
            return Err(DataError::Config(format!(
                "data.dedupe.near_threshold {t}: near-duplicate removal is not implemented; remove the field \
                 (exact dedupe stays on)"
            )));
        }
        let seq_len = data.seq_len as usize;
        if seq_len < 2 {
            return Err(DataError::Config(format!("data.seq_len {seq_len} leaves nothing to predict")));
        }

        let mut read = ReadOutcome::default();
        let mut generator = None;
        // Generated pre-training text is the rendered task conversations, every token learned.
        let mut learn_all = data.format == DataFormat::Text;
        match data.source {
            DataSource::Jsonl | DataSource::Hf => {
                if data.paths.is_empty() {
                    let what = match (&data.source, &data.hf_id) {
                        (DataSource::Hf, Some(id)) => format!("a local JSONL copy of `{id}` (nothing is downloaded)"),
                        _ => "JSONL files".to_owned(),
                    };
                    return Err(DataError::Config(format!("data.paths must list {what}")));
                }
                for path in &data.paths {
                    read.read_file(&base_dir.join(path), path, data.format, options.skip_bad)?;
                }
                learn_all = false;
            }
            DataSource::Generated => {
                let g = data.generator.as_ref().ok_or_else(|| {
                    DataError::Config("data.source is `generated` but data.generator is missing".into())
                })?;
                let GeneratorKind::Tasks = g.kind;
                let params = TaskParams { seed: g.seed, count: g.count, multi_arg_tools: seq_len >= 192 };
                let record_format = if data.format == DataFormat::Text { DataFormat::Chat } else { data.format };
                let text = generate_jsonl(&params, record_format);
                let name = "generated:tasks";
                for (i, line) in text.lines().enumerate() {
                    let example = parse_line(line.as_bytes(), record_format).map_err(|reason| DataError::BadLine {
                        path: name.into(),
                        line: i as u64 + 1,
                        reason,
                    })?;
                    read.examples.extend(example);
                }
                read.files.push(FileDigest {
                    path: name.into(),
                    blake3: blake3::hash(text.as_bytes()).to_hex().to_string(),
                    bytes: text.len() as u64,
                    lines: u64::from(g.count),
                });
                generator = Some(GeneratorInfo {
                    kind: g.kind,
                    seed: g.seed,
                    count: g.count,
                    version: GENERATOR_VERSION,
                    multi_arg_tools: params.multi_arg_tools,
                });
            }
        }

        let read_examples = read.examples.len() as u64;
        let mut examples = read.examples;
        let duplicates_removed = if data.dedupe.exact { dedupe_exact(&mut examples) } else { 0 };
        let mut over_max_samples = 0;
        if let Some(max) = data.max_samples
            && (examples.len() as u64) > max
        {
            over_max_samples = examples.len() as u64 - max;
            examples.truncate(max as usize);
        }
        let holdout_cfg = &recipe.eval.holdout;
        let fraction = if recipe.eval.enabled { holdout_cfg.fraction } else { 0.0 };
        let (train, holdout) = holdout_split(examples, fraction, holdout_cfg.max_samples, recipe.meta.seed);

        let template = ChatTemplate::for_tokenizer(tokenizer);
        let preference = data.format == DataFormat::Preference;
        let mut stats = Stats::default();
        let train_docs = encode_all(&train, tokenizer, template, learn_all, preference, seq_len, &mut stats)?;
        let train_stats = std::mem::take(&mut stats);
        let holdout_docs = encode_all(&holdout, tokenizer, template, learn_all, preference, seq_len, &mut stats)?;
        let (train, holdout) = (train_stats.kept(train), stats.kept(holdout));
        if train.is_empty() {
            return Err(DataError::Empty("no training examples are left after reading, dedupe and the split".into()));
        }

        let manifest = DatasetManifest {
            version: MANIFEST_VERSION,
            source: data.source,
            format: data.format,
            files: read.files,
            generator,
            tokenizer: tokenizer.identity().to_owned(),
            seq_len: data.seq_len,
            packing: data.packing,
            read_examples,
            skipped_lines: read.skipped,
            skipped: read.skipped_lines,
            duplicates_removed,
            over_max_samples,
            train_examples: train.len() as u64,
            holdout_examples: holdout.len() as u64,
            dropped_no_target: train_stats.dropped.len() as u64 + stats.dropped.len() as u64,
            truncated: train_stats.truncated + stats.truncated,
            train_tokens: train_stats.tokens,
            train_target_tokens: train_stats.targets,
            holdout_tokens: stats.tokens,
        };
        let layout = Layout {
            seq_len,
            packing: data.packing,
            shuffle: data.shuffle,
            seed: recipe.meta.seed,
            pad_id: tokenizer.pad_id(),
        };
        Ok(Dataset { manifest, train, holdout, template, train_docs, holdout_docs, layout, eos_id: tokenizer.eos_id() })
    }

    /// Rows one epoch of training data fills (packed rows, or preference pairs); sets the
    /// step count of recipes that give `epochs` instead of `max_steps`.
    pub fn train_rows_per_epoch(&self) -> usize {
        match &self.train_docs {
            Docs::Sft(docs) => {
                let lens: Vec<usize> = docs.iter().map(|d| d.ids.len()).collect();
                let order = epoch_order(lens.len(), self.layout.seed, 0, self.layout.shuffle);
                super::pack::plan_rows(&lens, &order, self.layout.seq_len, self.layout.packing).len()
            }
            Docs::Preference(pairs) => pairs.len(),
        }
    }

    pub fn is_preference(&self) -> bool {
        matches!(self.train_docs, Docs::Preference(_))
    }

    /// The endless training stream from `cursor` (start with `DataCursor::default()`).
    pub fn batches(&self, per_device: usize, cursor: DataCursor) -> Result<BatchIter<'_>, DataError> {
        match &self.train_docs {
            Docs::Sft(docs) => BatchIter::new(docs, self.layout, per_device, cursor),
            Docs::Preference(_) => Err(DataError::Config("preference data yields preference_batches".into())),
        }
    }

    /// The endless stream of preference pairs from `cursor`.
    pub fn preference_batches(&self, per_device: usize, cursor: DataCursor) -> Result<PreferenceIter<'_>, DataError> {
        match &self.train_docs {
            Docs::Preference(pairs) => PreferenceIter::new(pairs, self.layout, per_device, cursor),
            Docs::Sft(_) => Err(DataError::Config("only preference data yields preference_batches".into())),
        }
    }

    /// One ordered pass over the holdout for held-out loss (chosen answers for preference
    /// data); empty when there is no holdout.
    pub fn holdout_batches(&self, per_device: usize) -> Vec<PackedBatch> {
        match &self.holdout_docs {
            Docs::Sft(docs) => single_pass(docs, self.layout, per_device),
            Docs::Preference(pairs) => {
                let chosen: Vec<Encoded> = pairs.iter().map(|(c, _)| c.clone()).collect();
                single_pass(&chosen, Layout { packing: false, ..self.layout }, per_device)
            }
        }
    }

    /// Generation prompts with reference answers for the holdout's conversations (plain
    /// text examples have no answer and are left out).
    pub fn holdout_prompts(&self, tokenizer: &Tokenizer) -> Result<Vec<PromptItem>, DataError> {
        self.prompts_of(&self.holdout, tokenizer)
    }

    /// The training examples as prompts with reference answers, in example order (what RL
    /// samples completions for and scores them against).
    pub fn train_prompts(&self, tokenizer: &Tokenizer) -> Result<Vec<PromptItem>, DataError> {
        self.prompts_of(&self.train, tokenizer)
    }

    fn prompts_of(&self, examples: &[Example], tokenizer: &Tokenizer) -> Result<Vec<PromptItem>, DataError> {
        let mut items = Vec::new();
        for example in examples {
            let (prompt, tools) = match example {
                Example::Chat(c) => match c.messages.split_last() {
                    Some((last, before)) if last.role == Role::Assistant => (before.to_vec(), &c.tools),
                    _ => continue,
                },
                Example::Preference(p) => (p.prompt.clone(), &p.tools),
                Example::Text(_) => continue,
            };
            let Some(reference) = example.reference_answer() else { continue };
            let prompt_ids = self.prompt_ids(tokenizer, &prompt, tools)?;
            items.push(PromptItem { prompt_ids, reference });
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
        Ok(encode_pieces(tokenizer, &self.template.generation_prompt(messages, tools))?.ids)
    }

    /// `<|endoftext|>`, which ends every document.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }
}

#[derive(Debug, Default)]
struct Stats {
    tokens: u64,
    targets: u64,
    truncated: u64,
    /// Indices (ascending) of examples that had nothing left to learn.
    dropped: Vec<usize>,
}

impl Stats {
    fn kept(&self, examples: Vec<Example>) -> Vec<Example> {
        examples
            .into_iter()
            .enumerate()
            .filter(|(i, _)| self.dropped.binary_search(i).is_err())
            .map(|(_, e)| e)
            .collect()
    }

    /// Records a document; false when it has no learned token within `seq_len`.
    fn add(&mut self, doc: &Encoded, seq_len: usize) -> bool {
        let learned = learned_tokens(doc, seq_len);
        self.truncated += u64::from(doc.ids.len() > seq_len);
        if learned > 0 {
            self.tokens += doc.ids.len().min(seq_len) as u64;
            self.targets += learned as u64;
        }
        learned > 0
    }
}

fn encode_all(
    examples: &[Example],
    tokenizer: &Tokenizer,
    template: ChatTemplate,
    learn_all: bool,
    preference: bool,
    seq_len: usize,
    stats: &mut Stats,
) -> Result<Docs, DataError> {
    let eos = tokenizer.eos_id();
    let render = |example: &Example, targets: Targets| -> Result<Encoded, DataError> {
        let mut doc = match example {
            Example::Text(text) => {
                let ids = tokenizer.encode(text)?;
                Encoded { targets: vec![true; ids.len()], ids }
            }
            Example::Chat(conv) => encode_pieces(tokenizer, &template.render(conv, targets))?,
            Example::Preference(_) => {
                return Err(DataError::Config("preference pairs need data.format `preference`".into()));
            }
        };
        // The end of a document is learned only where every token is.
        doc.ids.push(eos);
        doc.targets.push(matches!(example, Example::Text(_)) || targets == Targets::All);
        Ok(doc)
    };
    let sft_targets = if learn_all { Targets::All } else { Targets::AssistantFrom(0) };
    if preference {
        let mut pairs = Vec::with_capacity(examples.len());
        for (i, example) in examples.iter().enumerate() {
            let Example::Preference(p) = example else {
                return Err(DataError::Config("preference format holds only preference pairs".into()));
            };
            let side = |answer: &Vec<Message>| {
                let messages = p.prompt.iter().chain(answer).cloned().collect();
                let conv = super::example::Conversation { messages, tools: p.tools.clone() };
                render(&Example::Chat(conv), Targets::AssistantFrom(p.prompt.len()))
            };
            let (chosen, rejected) = (side(&p.chosen)?, side(&p.rejected)?);
            let (a, b) = (stats.add(&chosen, seq_len), stats.add(&rejected, seq_len));
            if a && b {
                pairs.push((chosen, rejected));
            } else {
                stats.dropped.push(i);
            }
        }
        return Ok(Docs::Preference(pairs));
    }
    let mut docs = Vec::with_capacity(examples.len());
    for (i, example) in examples.iter().enumerate() {
        let doc = render(example, sft_targets)?;
        if stats.add(&doc, seq_len) {
            docs.push(doc);
        } else {
            stats.dropped.push(i);
        }
    }
    Ok(Docs::Sft(docs))
}

#[cfg(test)]
mod tests;
