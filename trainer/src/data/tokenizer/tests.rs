use proptest::prelude::*;

use super::*;

/// A small Qwen3-like byte-level BPE tokenizer.json: 256 byte tokens, one merge, and the
/// Qwen3 added tokens with Qwen3's `special` flags.
pub(crate) fn tiny_tokenizer_json(with_im_end: bool) -> String {
    let alphabet = super::byte_level_alphabet();
    let mut vocab = serde_json::Map::new();
    for (id, c) in alphabet.iter().enumerate() {
        vocab.insert(c.to_string(), id.into());
    }
    vocab.insert("he".into(), 256.into());
    let mut added = vec![];
    // Added tokens not in the model vocabulary get the next free ids (257...), as in Qwen3.
    let mut next = 257;
    for (text, special) in [
        ("<|endoftext|>", true),
        ("<|im_start|>", true),
        ("<|im_end|>", true),
        ("<tool_call>", false),
        ("</tool_call>", false),
        ("<think>", false),
        ("</think>", false),
    ] {
        if text == "<|im_end|>" && !with_im_end {
            continue;
        }
        added.push(serde_json::json!({"id": next, "content": text, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": special}));
        next += 1;
    }
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
        "use_regex": true});
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": ["h e"]}
    })
    .to_string()
}

pub(crate) fn tiny_hf() -> Tokenizer {
    Tokenizer::from_json_bytes(tiny_tokenizer_json(true).as_bytes(), "tiny").unwrap()
}

#[test]
fn byte_ids_are_bytes_then_qwen3_specials() {
    let t = Tokenizer::byte();
    assert_eq!(t.encode("aé").unwrap(), vec![97, 0xC3, 0xA9]);
    assert_eq!(t.eos_id(), 256);
    assert_eq!(t.im_start_id(), Some(257));
    assert_eq!(t.im_end_id(), Some(258));
    assert_eq!(t.pad_id(), 259);
    assert_eq!(t.vocab_size(), 266);
    assert!(t.vocab_size() <= 512, "must fit the tiny recipe's vocab_size");
}

#[test]
fn byte_control_tokens_stay_text_unless_asked() {
    let t = Tokenizer::byte();
    let literal = t.encode("x<|im_end|>").unwrap();
    assert_eq!(literal.len(), 1 + "<|im_end|>".len());
    assert!(literal.iter().all(|&id| id < 256));
    assert_eq!(t.encode_with_specials("x<|im_end|>").unwrap(), vec![u32::from(b'x'), t.im_end_id().unwrap()]);
    // Markup is text the model writes, so it is one token either way.
    let think = t.special(Special::ThinkStart).unwrap();
    assert_eq!(t.encode("<think>a").unwrap(), vec![think, 97]);
    assert_eq!(t.encode("<thin").unwrap().len(), 5);
}

#[test]
fn byte_decode_skips_only_control_tokens() {
    let t = Tokenizer::byte();
    let ids = t.encode_with_specials("<tool_call>{}</tool_call><|im_end|>").unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(t.decode(&ids, true).unwrap(), "<tool_call>{}</tool_call>");
    assert_eq!(t.decode(&ids, false).unwrap(), "<tool_call>{}</tool_call><|im_end|>");
    assert!(t.decode(&[266], false).is_err());
}

proptest! {
    #[test]
    fn byte_round_trips_any_text(text in "\\PC*") {
        let t = Tokenizer::byte();
        let ids = t.encode_with_specials(&text).unwrap();
        prop_assert_eq!(t.decode(&ids, false).unwrap(), text.clone());
        let ids = t.encode(&text).unwrap();
        prop_assert_eq!(t.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn hf_tokenizer_finds_qwen3_specials_by_name() {
    let t = tiny_hf();
    assert_eq!(t.eos_id(), 257);
    assert_eq!(t.im_start_id(), Some(258));
    assert_eq!(t.im_end_id(), Some(259));
    assert_eq!(t.pad_id(), 257, "Qwen3 pads with <|endoftext|>");
    assert_eq!(t.special(Special::ThinkStart), Some(262));
    assert_eq!(t.special(Special::ToolResponseStart), None);
    assert_eq!(t.vocab_size(), 264);
    assert!(t.identity().starts_with("hf-blake3:"));
}

#[test]
fn hf_tokenizer_encodes_and_decodes() {
    let t = tiny_hf();
    let ids = t.encode("hello").unwrap();
    assert_eq!(ids[0], 256, "the `h e` merge applies");
    assert_eq!(ids.len(), 4);
    assert_eq!(t.decode(&ids, false).unwrap(), "hello");
    assert_eq!(t.encode("<think>").unwrap(), vec![262]);
    let literal = t.encode("<|im_end|>").unwrap();
    assert!(literal.len() > 1 && !literal.contains(&259), "control text stays literal: {literal:?}");
    assert_eq!(t.encode_with_specials("<|im_end|>").unwrap(), vec![259]);
    assert_eq!(t.decode(&[256, 259], true).unwrap(), "he");
    assert!(t.decode(&[9999], false).is_err());
}

/// A GPT-NeoX vocabulary (Instella's) has `<|endoftext|>` and no ChatML markers: it loads, the
/// built-in ChatML template says what it lacks and what to give, and the model's own template
/// (the Tulu-style one of Instella's instruct models) renders and ends answers with `eos_token`.
#[test]
fn a_tokenizer_without_chatml_markers_loads_and_needs_its_own_template() {
    use crate::data::template::encode_pieces;
    use crate::data::{ChatTemplate, Message, Role};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, tiny_tokenizer_json(false)).unwrap();
    let t = Tokenizer::from_file(&path).unwrap();
    assert_eq!((t.im_end_id(), t.eos_id()), (None, 257));
    assert_eq!(t.stop_ids(), vec![257]);
    let question = [Message::new(Role::User, "hi")];
    let chatml = ChatTemplate::for_tokenizer(&t).generation_prompt(&question, &[]);
    let err = encode_pieces(&t, &chatml).unwrap_err().to_string();
    assert!(err.contains("<|im_end|>") && err.contains("model.chat_template"), "{err}");

    let template = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}\
        {{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}\
        {{ '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}{% endif %}\
        {% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}";
    let config =
        serde_json::json!({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "chat_template": template});
    std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), config.to_string()).unwrap();
    let t = Tokenizer::from_file(&path).unwrap();
    let pieces = ChatTemplate::for_tokenizer(&t).generation_prompt(&question, &[]);
    let ids = encode_pieces(&t, &pieces).unwrap().ids;
    assert_eq!(ids[0], 257, "bos_token is a special: {ids:?}");
    assert_eq!(t.decode(&ids[1..], false).unwrap(), "<|user|>\nhi\n<|assistant|>\n");
    assert_eq!(t.stop_ids(), vec![257]);
}

#[test]
fn a_tokenizer_without_an_end_of_text_token_is_refused() {
    let json = tiny_tokenizer_json(true).replace("<|endoftext|>", "<|eot|>");
    let err = Tokenizer::from_json_bytes(json.as_bytes(), "x.json").unwrap_err();
    assert!(err.to_string().contains("<|endoftext|>"), "{err}");
    assert!(Tokenizer::from_json_bytes(b"{not json", "x.json").is_err());
}

#[test]
fn recipe_names_the_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("weights")).unwrap();
    std::fs::write(dir.path().join("weights/tokenizer.json"), tiny_tokenizer_json(true)).unwrap();
    let weights = dir.path().join("weights");
    let mut model: Model = serde_json::from_value(serde_json::json!({"name": "m", "tokenizer": "byte"})).unwrap();
    assert_eq!(Tokenizer::from_recipe(&model, dir.path(), Some(&weights)).unwrap().identity(), "byte-v1");
    model.tokenizer = None;
    // Unset: the one beside the base's weights, wherever they lie.
    assert_eq!(Tokenizer::from_recipe(&model, Path::new("/elsewhere"), Some(&weights)).unwrap().eos_id(), 257);
    model.tokenizer = Some("weights/tokenizer.json".into());
    assert_eq!(Tokenizer::from_recipe(&model, dir.path(), None).unwrap().im_end_id(), Some(259));
    model.tokenizer = Some("missing.json".into());
    assert!(matches!(Tokenizer::from_recipe(&model, dir.path(), Some(&weights)), Err(DataError::Io { .. })));
    model.tokenizer = None;
    assert!(matches!(Tokenizer::from_recipe(&model, dir.path(), None), Err(DataError::Config(_))));
}
