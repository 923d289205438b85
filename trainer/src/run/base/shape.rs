//! A recipe's `model.family` and `model.config` against the `config.json` of the base it is
//! given: a run trains the base's architecture and shape, so a family or a `model.config` that
//! says another one would be accepted and ignored. Every field is compared (defaults included:
//! they are what the recipe says once loaded).

use std::path::Path;

use super::RunError;
use crate::checkpoint::CONFIG_FILE;
use crate::model::LmConfig;
use crate::recipe::Model;

/// Refuses `model` when its family is not the base's (the base's `config.json` in `base_dir`),
/// or any field of its `model.config` differs, naming each such field with both values.
pub(super) fn check(model: &Model, base_dir: &Path) -> Result<(), RunError> {
    let path = base_dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| RunError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let base = LmConfig::from_hf_json(&text)?;
    if base.family() != model.family {
        let name = |f| serde_json::to_value(f).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        return Err(RunError::Base(format!(
            "model.family is `{}` but the base is a `{}` model ({}): the base's architecture is what would train; \
             set model.family: {}",
            name(model.family),
            name(base.family()),
            path.display(),
            name(base.family())
        )));
    }
    let Some(config) = &model.config else { return Ok(()) };
    let ours = LmConfig::from_recipe(config, model.family).unwrap_or_else(|| base.clone());
    let conflicts = differences(&ours, &base);
    if conflicts.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = conflicts
        .iter()
        .map(|(field, ours, theirs)| format!("model.config.{field} is {ours} but the base has {theirs}"))
        .collect();
    Err(RunError::Base(format!(
        "{} ({}): the base's shape is what would train; make model.config match it, or leave model.config out",
        list.join("; "),
        path.display()
    )))
}

/// `(recipe field, recipe's value, base's value)` for every field where the shapes differ.
fn differences(ours: &LmConfig, base: &LmConfig) -> Vec<(&'static str, String, String)> {
    let mut rows = vec![
        ("hidden_size", ours.hidden_size.to_string(), base.hidden_size.to_string()),
        ("num_layers", ours.num_hidden_layers.to_string(), base.num_hidden_layers.to_string()),
        ("num_heads", ours.num_attention_heads.to_string(), base.num_attention_heads.to_string()),
        ("num_kv_heads", ours.num_key_value_heads.to_string(), base.num_key_value_heads.to_string()),
        ("head_dim", ours.head_dim.to_string(), base.head_dim.to_string()),
        ("intermediate_size", ours.intermediate_size.to_string(), base.intermediate_size.to_string()),
        ("vocab_size", ours.vocab_size.to_string(), base.vocab_size.to_string()),
        ("max_position_embeddings", ours.max_position_embeddings.to_string(), base.max_position_embeddings.to_string()),
        ("rope_theta", format!("{:?}", ours.rope_theta), format!("{:?}", base.rope_theta)),
        ("rms_norm_eps", format!("{:?}", ours.rms_norm_eps), format!("{:?}", base.rms_norm_eps)),
        ("tie_word_embeddings", ours.tie_word_embeddings.to_string(), base.tie_word_embeddings.to_string()),
    ];
    match (&ours.moe, &base.moe) {
        (Some(a), Some(b)) => rows.extend([
            ("moe.num_experts", a.num_experts.to_string(), b.num_experts.to_string()),
            ("moe.experts_per_token", a.num_experts_per_tok.to_string(), b.num_experts_per_tok.to_string()),
            ("moe.expert_intermediate_size", a.moe_intermediate_size.to_string(), b.moe_intermediate_size.to_string()),
            ("moe.norm_topk_prob", a.norm_topk_prob.to_string(), b.norm_topk_prob.to_string()),
            (
                "moe.router_aux_loss_coef",
                format!("{:?}", a.router_aux_loss_coef),
                format!("{:?}", b.router_aux_loss_coef),
            ),
            // The recipe's shape makes every layer sparse; a base with dense layers is another shape.
            ("moe (sparse layers)", sparse_layers(a), sparse_layers(b)),
        ]),
        (None, None) => {}
        (a, b) => rows.push(("moe", present(a.is_some()), present(b.is_some()))),
    }
    // A hybrid's layer kinds and Gated DeltaNet shape are one field: any difference is another model.
    let hybrid = |h: &Option<crate::model::HybridShape>| match h {
        Some(h) => format!("{h:?}"),
        None => "no linear-attention layers".into(),
    };
    rows.push(("linear_attention", hybrid(&ours.hybrid), hybrid(&base.hybrid)));
    rows.retain(|(_, a, b)| a != b);
    rows
}

fn sparse_layers(m: &crate::model::MoeShape) -> String {
    match (m.decoder_sparse_step, m.mlp_only_layers.as_slice()) {
        (1, []) => "every layer".into(),
        (step, dense) => format!("every {step}th layer but {dense:?}"),
    }
}

fn present(moe: bool) -> String {
    if moe { "a mixture of experts" } else { "dense MLPs" }.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::StagedDir;
    use crate::recipe::{ModelConfig, ModelFamily};

    fn written(config: &LmConfig) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut staged = StagedDir::create(&dir.path().join("base")).unwrap();
        staged.write_file(CONFIG_FILE, config.to_hf_json("float32").as_bytes()).unwrap();
        staged.commit().unwrap();
        dir
    }

    fn recipe_config() -> ModelConfig {
        serde_json::from_value(serde_json::json!({
            "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
            "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512,
        }))
        .unwrap()
    }

    #[test]
    fn a_config_that_matches_the_base_passes_and_each_difference_is_named_with_both_values() {
        let ours = recipe_config();
        let model = |config: Option<ModelConfig>, family: ModelFamily| Model {
            family,
            config,
            ..serde_json::from_value(serde_json::json!({"name": "m"})).unwrap()
        };
        let shape = LmConfig::from_recipe(&ours, ModelFamily::Qwen3).unwrap();
        let same = written(&shape);
        check(&model(Some(ours.clone()), ModelFamily::Qwen3), &same.path().join("base")).unwrap();
        check(&model(None, ModelFamily::Qwen3), &same.path().join("base")).unwrap();
        // The family is the base's architecture: another one is refused, with or without a shape.
        let err = check(&model(None, ModelFamily::Instella), &same.path().join("base")).unwrap_err().to_string();
        assert!(err.contains("model.family is `instella` but the base is a `qwen3` model"), "{err}");

        let base = LmConfig { num_hidden_layers: 3, rope_theta: 10_000.0, ..shape };
        let other = written(&base);
        let err = check(&model(Some(ours), ModelFamily::Qwen3), &other.path().join("base")).unwrap_err().to_string();
        assert!(err.contains("model.config.num_layers is 2 but the base has 3"), "{err}");
        assert!(err.contains("model.config.rope_theta is 1000000.0 but the base has 10000.0"), "{err}");
        assert!(!err.contains("hidden_size"), "{err}");
        assert!(err.contains("config.json"), "{err}");
    }
}
