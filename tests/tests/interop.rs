//! Interop with the Python ecosystem for Qwen3 (the checks: `mindxtrain_tests::interop`), and a
//! trained run as transformers and PEFT load it.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`. Without it the tests skip, unless
//! MINDXTRAIN_REQUIRE_TORCH is set (CI sets it): then they install it, and fail if they cannot.

use std::process::Command;
use std::sync::OnceLock;

use mindxtrain_tests::interop::{self, Family, Fixture, assert_close, flat, read_json, repo_root};
use mindxtrain_trainer::batch::{IGNORE, PackedBatch};
use mindxtrain_trainer::recipe::TargetModule;

const QWEN3: Family = Family {
    script: "qwen3_tiny.py",
    config: r#"{"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false}"#,
    targets: TargetModule::all,
    step_tolerance: 1e-5,
};

fn fixture() -> Option<&'static Fixture> {
    static FIXTURE: OnceLock<Option<Fixture>> = OnceLock::new();
    FIXTURE.get_or_init(|| interop::build_fixture(&QWEN3)).as_ref()
}

#[test]
fn transformers_weights_load_by_name_shape_and_value() {
    fixture().map(interop::transformers_weights_load_by_name_shape_and_value);
}

#[test]
fn logits_match_transformers() {
    fixture().map(interop::logits_match_transformers);
}

/// Dense decoding with the key/value cache continues as transformers' cached `generate` does.
#[test]
fn greedy_generation_matches_transformers() {
    fixture().map(interop::greedy_generation_matches_transformers);
}

#[test]
fn our_saved_model_loads_in_transformers() {
    fixture().map(interop::our_saved_model_loads_in_transformers);
}

#[test]
fn our_adapter_gives_peft_the_same_logits() {
    fixture().map(interop::our_adapter_gives_peft_the_same_logits);
}

#[test]
fn one_lora_step_matches_peft_and_torch_adamw() {
    fixture().map(interop::one_lora_step_matches_peft_and_torch_adamw);
}

/// A run as the ecosystem loads it: `train` writes the tokenizer and chat template beside an
/// adapter whose `adapter_config.json` names the base it was trained on, and `export --merge`
/// writes a standalone HF directory. In transformers, the chat template gives our prompt ids,
/// the adapter over its recorded base (AutoPeftModelForCausalLM) and the merged model
/// (AutoModelForCausalLM) give our logits.
#[test]
fn a_trained_adapter_and_its_merged_export_load_in_peft_and_transformers_with_our_logits() {
    use mindxtrain_tests::micro::{self, Node, ok_json, s};
    use mindxtrain_trainer::data::template::encode_pieces;
    use mindxtrain_trainer::data::{ChatTemplate, Message, Role, Tokenizer};
    use mindxtrain_trainer::recipe::Recipe as RecipeFile;

    let Some(python) = mindxtrain_tests::torch_python() else { return };
    let node = Node::new();
    let base_recipe = node.recipe("base", &micro::recipe("base", 5, micro::FULL, 20, ""));
    let base = node.path("base");
    ok_json(&node.run(&["train", s(&base_recipe), "--out", s(&base), "--eval-prompts", "1"]));
    let lora_recipe = node.recipe("lora", &micro::recipe("lora", 5, micro::LORA, 20, ""));
    let lora = node.path("lora");
    let base_final = base.join("final");
    ok_json(&node.run(&[
        "train",
        s(&lora_recipe),
        "--out",
        s(&lora),
        "--init-from",
        s(&base_final),
        "--eval-prompts",
        "1",
    ]));
    let merged = node.path("hf");
    ok_json(&node.run(&[
        "export",
        s(&lora_recipe),
        "--checkpoint",
        s(&lora.join("final")),
        "--merge",
        "--out",
        s(&merged),
    ]));

    let question = "What is 17 + 25?";
    let messages = node.path("messages.json");
    std::fs::write(&messages, serde_json::json!([{"role": "user", "content": question}]).to_string()).unwrap();
    let answer = node.path("transformers.json");
    let script = repo_root().join("tests/python/qwen3_tiny.py");
    let o = Command::new(&python)
        .arg(script)
        .arg("run-output")
        .args(["--adapter", s(&lora.join("final")), "--merged", s(&merged), "--messages", s(&messages)])
        .args(["--out", s(&answer)])
        .output()
        .unwrap();
    assert!(o.status.success(), "transformers could not load the run:\n{}", String::from_utf8_lossy(&o.stderr));
    let theirs = read_json(&answer);

    let loaded = RecipeFile::from_path(&lora_recipe).unwrap();
    let recipe = &loaded.recipe;
    let tokenizer = Tokenizer::from_recipe(&recipe.model, &node.dir, None).unwrap();
    let pieces = ChatTemplate::for_tokenizer(&tokenizer).generation_prompt(&[Message::new(Role::User, question)], &[]);
    let ids = encode_pieces(&tokenizer, &pieces).unwrap().ids;
    for side in ["adapter_ids", "merged_ids"] {
        let got: Vec<u32> = serde_json::from_value(theirs[side].clone()).unwrap();
        assert_eq!(
            got, ids,
            "{side}: the chat template beside the weights gives our prompt ({})",
            theirs["adapter_text"]
        );
    }
    let (model, adapters) = mindxtrain_trainer::checkpoint::load_checkpoint(
        recipe,
        Some(&base_final),
        &lora.join("final"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let t = ids.len();
    let prompt = PackedBatch {
        batch: 1,
        seq_len: t,
        input_ids: ids,
        position_ids: (0..t as u32).collect(),
        segment_ids: vec![1; t],
        labels: vec![IGNORE; t],
    };
    let ours = flat(&model.logits(&prompt, adapters.as_ref()).unwrap());
    for side in ["adapter_logits", "merged_logits"] {
        let v: Vec<Vec<f32>> = serde_json::from_value(theirs[side].clone()).unwrap();
        assert_close(side, &ours, &v.into_iter().flatten().collect::<Vec<_>>(), 1e-4);
    }
}
