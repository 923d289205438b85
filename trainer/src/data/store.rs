//! The tokenized documents of a dataset, fetched by index: a document is (block, row, length)
//! in memory; its tokens are in a bounded cache of whole blocks, or read again from the source
//! (the block re-read, its kept rows rendered and tokenized) when they are not.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::error::DataError;
use super::example::{Conversation, Example};
use super::source::Source;
use super::template::{ChatTemplate, Encoded, Targets, encode_pieces};
use super::tokenizer::Tokenizer;

/// Tokens the cache holds (5 bytes each: the id and its label flag): ~320 MiB.
pub const CACHE_TOKENS: usize = 64 << 20;

/// Where a document lives, and its length in tokens (the longer side of a preference pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DocRef {
    pub block: u32,
    pub row: u32,
    pub len: u32,
}

/// A tokenized document: one sequence, or the chosen and rejected sides of a pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doc {
    Sft(Encoded),
    Pair(Encoded, Encoded),
}

impl Doc {
    pub fn tokens(&self) -> usize {
        match self {
            Doc::Sft(e) => e.ids.len(),
            Doc::Pair(c, r) => c.ids.len() + r.ids.len(),
        }
    }
    pub fn sft(&self) -> &Encoded {
        match self {
            Doc::Sft(e) | Doc::Pair(e, _) => e,
        }
    }
}

/// How examples become documents.
pub struct Encoder {
    pub template: ChatTemplate,
    pub tokenizer: Tokenizer,
    /// Every token learned (continued pre-training on rendered conversations).
    pub learn_all: bool,
    pub preference: bool,
}

impl Encoder {
    /// The document of `example`, and how many of its assistant turns could not be located.
    pub fn encode(&self, example: &Example) -> Result<(Doc, u32), DataError> {
        let eos = self.tokenizer.eos_id();
        let render = |conv: &Conversation, targets: Targets| -> Result<(Encoded, u32), DataError> {
            let rendering = self.template.render(conv, targets)?;
            let mut doc = encode_pieces(&self.tokenizer, &rendering.pieces)?;
            // The end of a document is learned only where every token is.
            doc.ids.push(eos);
            doc.targets.push(targets == Targets::All);
            Ok((doc, rendering.unlocated_turns))
        };
        match (example, self.preference) {
            (Example::Text(text), false) => {
                let mut ids = self.tokenizer.encode(text)?;
                ids.push(eos);
                Ok((Doc::Sft(Encoded { targets: vec![true; ids.len()], ids }), 0))
            }
            (Example::Chat(conv), false) => {
                let targets = if self.learn_all { Targets::All } else { Targets::AssistantFrom(0) };
                let (doc, unlocated) = render(conv, targets)?;
                Ok((Doc::Sft(doc), unlocated))
            }
            (Example::Preference(p), true) => {
                let side = |answer: &Vec<super::example::Message>| {
                    let messages = p.prompt.iter().chain(answer).cloned().collect();
                    render(&Conversation { messages, tools: p.tools.clone() }, Targets::AssistantFrom(p.prompt.len()))
                };
                let ((chosen, a), (rejected, b)) = (side(&p.chosen)?, side(&p.rejected)?);
                Ok((Doc::Pair(chosen, rejected), a + b))
            }
            (Example::Preference(_), false) => {
                Err(DataError::Config("preference pairs need data.format `preference`".into()))
            }
            (_, true) => Err(DataError::Config("preference format holds only preference pairs".into())),
        }
    }
}

/// A block's documents by row, as the cache keeps them.
type BlockDocs = Vec<(u32, Arc<Doc>)>;

/// Tokenized blocks, least recently used evicted first.
#[derive(Default)]
pub struct DocCache {
    capacity: usize,
    /// Each block's documents and their tokens.
    blocks: HashMap<u32, (BlockDocs, usize)>,
    /// Least recently used first.
    order: VecDeque<u32>,
    tokens: usize,
}

impl DocCache {
    pub fn new(capacity: usize) -> DocCache {
        DocCache { capacity, ..DocCache::default() }
    }

    /// Keeps documents the index pass already tokenized, while there is room.
    pub fn offer(&mut self, block: u32, docs: Vec<(u32, Arc<Doc>)>) {
        let tokens: usize = docs.iter().map(|d| d.1.tokens()).sum();
        if self.tokens + tokens <= self.capacity && !docs.is_empty() {
            self.insert(block, docs);
        }
    }

    fn get(&mut self, block: u32, row: u32) -> Option<Arc<Doc>> {
        let (docs, _) = self.blocks.get(&block)?;
        let doc = docs.binary_search_by_key(&row, |d| d.0).ok().map(|i| docs[i].1.clone())?;
        if let Some(at) = self.order.iter().rposition(|&b| b == block) {
            self.order.remove(at);
        }
        self.order.push_back(block);
        Some(doc)
    }

    fn insert(&mut self, block: u32, mut docs: Vec<(u32, Arc<Doc>)>) {
        docs.sort_by_key(|d| d.0);
        let tokens = docs.iter().map(|d| d.1.tokens()).sum();
        while self.tokens + tokens > self.capacity
            && let Some(old) = self.order.pop_front()
        {
            if let Some((_, t)) = self.blocks.remove(&old) {
                self.tokens -= t;
            }
        }
        self.tokens += tokens;
        self.blocks.insert(block, (docs, tokens));
        self.order.push_back(block);
    }
}

/// The documents of a dataset's training and held-out parts.
pub struct DocStore {
    pub source: Source,
    pub encoder: Encoder,
    /// Sorted by (block, row).
    pub train: Vec<DocRef>,
    pub holdout: Vec<DocRef>,
    cache: Mutex<DocCache>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Train,
    Holdout,
}

impl DocStore {
    pub fn new(source: Source, encoder: Encoder, cache: DocCache) -> DocStore {
        DocStore { source, encoder, train: Vec::new(), holdout: Vec::new(), cache: Mutex::new(cache) }
    }

    pub fn refs(&self, part: Part) -> &[DocRef] {
        match part {
            Part::Train => &self.train,
            Part::Holdout => &self.holdout,
        }
    }

    /// Document `i` of `part`.
    pub fn get(&self, part: Part, i: usize) -> Result<Arc<Doc>, DataError> {
        let r = self.refs(part)[i];
        if let Some(doc) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(r.block, r.row) {
            return Ok(doc);
        }
        let docs = self.load(r.block)?;
        let doc = docs.iter().find(|d| d.0 == r.row).map(|d| d.1.clone()).ok_or_else(|| DataError::Changed {
            path: format!("block {}", r.block).into(),
            reason: format!("row {} is no longer a document", r.row),
        })?;
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(r.block, docs);
        Ok(doc)
    }

    /// The example of document `i` of `part`, read again from its block.
    pub fn example(&self, part: Part, i: usize) -> Result<Example, DataError> {
        let r = self.refs(part)[i];
        let rows = self.source.read(r.block as usize)?;
        match rows.into_iter().nth(r.row as usize) {
            Some(Ok(Some(example))) => Ok(example),
            Some(Err(e)) => Err(e),
            _ => {
                Err(DataError::Changed { path: format!("block {}", r.block).into(), reason: "a row is missing".into() })
            }
        }
    }

    /// Reads `block` again and tokenizes its documents (of both parts).
    fn load(&self, block: u32) -> Result<Vec<(u32, Arc<Doc>)>, DataError> {
        let rows = self.source.read(block as usize)?;
        let mut wanted: Vec<u32> = [&self.train, &self.holdout]
            .into_iter()
            .flat_map(|refs| {
                let start = refs.partition_point(|d| d.block < block);
                refs[start..].iter().take_while(move |d| d.block == block).map(|d| d.row)
            })
            .collect();
        wanted.sort_unstable();
        wanted
            .into_par_iter()
            .map(|row| {
                let example = match rows.get(row as usize) {
                    Some(Ok(Some(e))) => e,
                    Some(Err(e)) => return Err(DataError::Changed { path: "input".into(), reason: e.to_string() }),
                    _ => {
                        return Err(DataError::Changed {
                            path: "input".into(),
                            reason: format!("row {row} is missing"),
                        });
                    }
                };
                Ok((row, Arc::new(self.encoder.encode(example)?.0)))
            })
            .collect()
    }
}

#[cfg(test)]
impl DocStore {
    /// A store over documents already tokenized, `per_block` to a block, all cached.
    pub fn in_memory(docs: Vec<Doc>, per_block: usize) -> DocStore {
        let source = Source::memory("test", Arc::from(""), crate::recipe::DataFormat::Chat);
        let encoder = Encoder {
            template: ChatTemplate::COMPACT,
            tokenizer: Tokenizer::byte(),
            learn_all: false,
            preference: matches!(docs.first(), Some(Doc::Pair(..))),
        };
        let mut cache = DocCache::new(usize::MAX);
        let mut train = Vec::new();
        for (b, chunk) in docs.chunks(per_block).enumerate() {
            let mut entries = Vec::new();
            for (r, doc) in chunk.iter().enumerate() {
                let len = match doc {
                    Doc::Sft(e) => e.ids.len(),
                    Doc::Pair(c, r) => c.ids.len().max(r.ids.len()),
                };
                train.push(DocRef { block: b as u32, row: r as u32, len: len as u32 });
                entries.push((r as u32, Arc::new(doc.clone())));
            }
            cache.offer(b as u32, entries);
        }
        let mut store = DocStore::new(source, encoder, cache);
        store.train = train;
        store
    }
}
