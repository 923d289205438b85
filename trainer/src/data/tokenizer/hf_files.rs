//! The tokenizer as Hugging Face files, written beside trained weights so that
//! `AutoTokenizer.from_pretrained(dir)` gives the ids this crate trained on, with the chat
//! template the model learned.
//!
//! A `tokenizer.json` read from disk is written back byte for byte, with the
//! `tokenizer_config.json` found beside it when there was one (it carries the model's own
//! chat template). The byte tokenizer becomes a byte-level BPE with no merges: GPT-2's
//! byte-to-character table as its 256-entry vocabulary, so id `b` is byte `b`, then Qwen3's
//! specials as added tokens with ids 256.. in [`Special::ALL`] order, control tokens marked
//! `special` (skipped on decode, never matched in message text) as in Qwen3.

use serde_json::{Value, json};

use super::{Inner, Special, Tokenizer};
use crate::data::ChatTemplate;

pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// ChatML for plain conversations (system, user and assistant turns), as
/// [`ChatTemplate::render`] writes them, and its generation prompt.
const CHATML: &str = "{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}";
const EMPTY_THINK: &str = "{{- '<think>\\n\\n</think>\\n\\n' -}}";
const END: &str = "{%- endif -%}";

/// GPT-2's table from bytes to the printable characters byte-level vocabularies are
/// written in.
pub fn byte_level_alphabet() -> [char; 256] {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut table = [' '; 256];
    for (b, c) in printable.iter().zip(chars) {
        table[*b as usize] = char::from_u32(c).unwrap_or(' ');
    }
    table
}

impl Tokenizer {
    /// `tokenizer.json` and `tokenizer_config.json` for this tokenizer, with the chat
    /// template the data was rendered with and `model_max_length`.
    pub fn hf_files(&self, model_max_length: usize) -> Vec<(&'static str, Vec<u8>)> {
        let (tokenizer, config) = match &self.inner {
            Inner::Byte => (byte_tokenizer_json(), None),
            Inner::Hf(hf) => (hf.json.to_vec(), hf.config.as_deref().map(<[u8]>::to_vec)),
        };
        let config = config.unwrap_or_else(|| self.tokenizer_config(model_max_length));
        let mut files = vec![(TOKENIZER_FILE, tokenizer), (TOKENIZER_CONFIG_FILE, config)];
        // transformers reads `chat_template.jinja` before the config's template: the template
        // the data was rendered with is the one users get.
        if let Some(template) = self.chat_template() {
            files.push((super::CHAT_TEMPLATE_FILE, template.text.clone().into_bytes()));
        }
        files
    }

    /// A `tokenizer_config.json` for `PreTrainedTokenizerFast` over our `tokenizer.json`.
    fn tokenizer_config(&self, model_max_length: usize) -> Vec<u8> {
        let text = |s: Special| self.special(s).map(|_| s.text());
        let pad = if self.special(Special::Pad).is_some() { Special::Pad } else { Special::EndOfText };
        let mut template = CHATML.to_string();
        if !matches!(ChatTemplate::for_tokenizer(self), ChatTemplate::Builtin(c) if !c.empty_think_block) {
            template.push_str(EMPTY_THINK);
        }
        template.push_str(END);
        let config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model_max_length,
            "bos_token": Value::Null,
            "eos_token": text(Special::ImEnd).or(text(Special::EndOfText)),
            "pad_token": text(pad),
            "unk_token": Value::Null,
            "add_bos_token": false,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
            "split_special_tokens": false,
            "chat_template": template,
        });
        let mut bytes = serde_json::to_vec_pretty(&config).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

/// The byte tokenizer as a byte-level BPE `tokenizer.json` (see the module doc).
fn byte_tokenizer_json() -> Vec<u8> {
    let alphabet = byte_level_alphabet();
    let mut vocab = serde_json::Map::new();
    for (id, c) in alphabet.iter().enumerate() {
        vocab.insert(c.to_string(), id.into());
    }
    let added: Vec<Value> = Special::ALL
        .iter()
        .map(|&s| {
            json!({"id": super::byte::special_id(s), "content": s.text(), "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": s.is_control()})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    });
    let mut bytes = serde_json::to_vec_pretty(&tokenizer).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn exported_byte() -> Tokenizer {
        let files = Tokenizer::byte().hf_files(128);
        Tokenizer::from_json_bytes(&files[0].1, "exported").unwrap()
    }

    proptest! {
        /// The exported byte tokenizer, read by the `tokenizers` crate (what transformers'
        /// fast tokenizers are), gives the byte tokenizer's ids for any text, specials and
        /// markup included, and decodes them back the same way.
        #[test]
        fn the_exported_byte_tokenizer_matches_the_builtin_one(
            text in "(\\PC|<\\|im_end\\|>|<\\|im_start\\|>|<think>|</tool_call>|<\\|endoftext\\|>|\n| ){0,40}"
        ) {
            let (ours, theirs) = (Tokenizer::byte(), exported_byte());
            prop_assert_eq!(ours.encode(&text).unwrap(), theirs.encode(&text).unwrap());
            let ids = ours.encode_with_specials(&text).unwrap();
            prop_assert_eq!(&ids, &theirs.encode_with_specials(&text).unwrap());
            prop_assert_eq!(ours.decode(&ids, true).unwrap(), theirs.decode(&ids, true).unwrap());
            prop_assert_eq!(ours.decode(&ids, false).unwrap(), theirs.decode(&ids, false).unwrap());
        }
    }

    #[test]
    fn specials_keep_their_ids_and_the_config_names_them() {
        let (ours, theirs) = (Tokenizer::byte(), exported_byte());
        for s in Special::ALL {
            assert_eq!(ours.special(s), theirs.special(s), "{s:?}");
        }
        let files = Tokenizer::byte().hf_files(256);
        let config: Value = serde_json::from_slice(&files[1].1).unwrap();
        assert_eq!(config["eos_token"], "<|im_end|>");
        assert_eq!(config["pad_token"], "<|pad|>");
        assert_eq!(config["model_max_length"], 256);
        let template = config["chat_template"].as_str().unwrap();
        assert!(template.contains("<|im_start|>assistant") && !template.contains("<think>"), "{template}");
    }

    #[test]
    fn a_tokenizer_read_from_a_file_is_written_back_unchanged_with_its_config() {
        let dir = tempfile::tempdir().unwrap();
        let json = super::super::tests::tiny_tokenizer_json(true);
        std::fs::write(dir.path().join(TOKENIZER_FILE), &json).unwrap();
        let t = Tokenizer::from_file(&dir.path().join(TOKENIZER_FILE)).unwrap();
        let files = t.hf_files(64);
        assert_eq!(files[0].1, json.as_bytes());
        let config: Value = serde_json::from_slice(&files[1].1).unwrap();
        assert!(config["chat_template"].as_str().unwrap().contains("<think>"), "Qwen3's empty think block");

        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), b"{\"chat_template\": \"theirs\"}").unwrap();
        let t = Tokenizer::from_file(&dir.path().join(TOKENIZER_FILE)).unwrap();
        assert_eq!(t.hf_files(64)[1].1, b"{\"chat_template\": \"theirs\"}");
    }
}
