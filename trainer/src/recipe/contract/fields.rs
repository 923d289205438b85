//! Every field of the recipe schema and its contract (see the parent module).
//!
//! `differs` is a JSON merge patch on the contract's training base (a micro LoRA run on the
//! CPU, `contract/tests.rs`): the run with the field changed must end differently (weights,
//! events, files) from the run without, which is what "carried out" means for a training
//! setting. `test` names a test of this workspace that fails if the field were ignored, for
//! fields whose effect is elsewhere (a file, an event, the server).

use super::{Field, Refusal};

const fn field(path: &'static str, does: &'static str) -> Field {
    Field { path, does, test: "", differs: None, refused: &[], inert_unless: None }
}

impl Field {
    const fn test(self, test: &'static str) -> Field {
        Field { test, ..self }
    }
    /// The run with `change` on the training base ends differently from the run without.
    const fn differs(self, change: &'static str) -> Field {
        Field { differs: Some(("{}", change)), ..self }
    }
    /// As [`Field::differs`], both runs on the training base patched with `base` first.
    const fn differs_on(self, base: &'static str, change: &'static str) -> Field {
        Field { differs: Some((base, change)), ..self }
    }
    const fn refuses(self, refused: &'static [Refusal]) -> Field {
        Field { refused, ..self }
    }
    /// The field configures a step that only runs when `switch` is on, and the check refuses
    /// turning it on today.
    const fn inert_unless(self, switch: &'static str) -> Field {
        Field { inert_unless: Some(switch), ..self }
    }
}

/// A refused value as a struct literal, so `&[no!(…)]` is a constant slice.
macro_rules! no {
    ($value:expr, $patch:expr, $says:expr $(,)?) => {
        Refusal { value: $value, patch: $patch, says: $says }
    };
}

const LORA_FIELDS: [(&str, &str, &str); 5] = [
    ("r", "the adapter's rank", r#"{"r": 4}"#),
    ("alpha", "the adapter's scale (alpha / r)", r#"{"alpha": 64}"#),
    ("dropout", "dropout on the adapter's input, drawn from the seed and step", r#"{"dropout": 0.3}"#),
    ("target_modules", "which projections get adapters", r#"{"target_modules": ["q_proj", "v_proj"]}"#),
    ("rslora", "scale alpha / sqrt(r) instead of alpha / r", r#"{"rslora": true}"#),
];

/// Every field, in the order of docs/recipes.md.
pub fn fields() -> Vec<Field> {
    let mut out = vec![
        field("meta.project", "recorded in `recipe.registered`, the manifest and the model card")
            .test("meta_license_reaches_the_manifest_and_the_model_card_and_energy_is_null_with_its_reason"),
        field("meta.run_name", "names the run's directory (`runs/<run_name>` when `train --out` is not given)")
            .test("train_without_out_writes_runs_run_name"),
        field("meta.seed", "seeds initial weights, adapters, dropout, data order and sampling")
            .differs(r#"{"meta": {"seed": 8}}"#),
        field("meta.license", "the manifest and the model card's `license`")
            .test("meta_license_reaches_the_manifest_and_the_model_card_and_energy_is_null_with_its_reason"),
        field("meta.description", "the manifest and the model card")
            .test("meta_license_reaches_the_manifest_and_the_model_card_and_energy_is_null_with_its_reason"),
        field("hardware.name", "the device: `cpu` the host, NVIDIA names one CUDA GPU per rank")
            .test("gpus_this_build_cannot_use_are_refused_with_what_to_do"),
        field("hardware.gpus", "0: the host CPU; N ≥ 1 on NVIDIA: one rank process per GPU")
            .test("gpus_this_build_cannot_use_are_refused_with_what_to_do")
            .refuses(&[
                no!(
                    "> 0 on AMD",
                    r#"{"hardware": {"name": "mi300x", "gpus": 1, "arch": "gfx942"}}"#,
                    "no launch path in this build",
                ),
                no!(
                    "> 1 with qwen3_hybrid",
                    r#"{"model": {"family": "qwen3_hybrid"}, "hardware": {"name": "h100", "gpus": 2, "arch": "sm_90"}}"#,
                    "training on several GPUs is not built yet for family qwen3_hybrid",
                ),
            ]),
        field(
            "hardware.arch",
            "checked against the machine when the run starts (CPU architecture, GPU compute capability)",
        )
        .test("a_cpu_recipe_for_another_architecture_is_refused"),
        field(
            "hardware.memory_gb",
            "compared with the device's memory by the probe: a plan warning when it is more than 10% off",
        )
        .test("a_device_whose_memory_differs_from_memory_gb_gets_a_plan_warning"),
        field("autotune.enabled", "`false`: nothing is measured; the plan holds the defaults and says so")
            .test("autotune_off_measures_nothing_and_says_so"),
        field("autotune.policy", "only `aot_only`: a run replays its recorded plan").test("jit_autotune_is_refused"),
        field("autotune.budget_seconds", "bounds the probe's time").test("the_probe_keeps_to_the_recipe_s_budget"),
        field("autotune.plan", "the plan file read, or written by the probe when absent")
            .test("a_recipe_s_plan_file_is_written_once_then_read"),
        field("autotune.deterministic", "`false` lets the GPU probe time the atomic split-dQ attention backward")
            .test("attention_candidates_keep_the_base_and_respect_determinism"),
        field("model.name", "the hub id resolved in the Hugging Face cache when there is no path or config; recorded")
            .test("a_recipe_of_hub_ids_alone_trains_from_the_cache_and_records_the_commits"),
        field("model.family", "which architecture loads, trains and serves the weights")
            .test("the_tiny_moe_recipe_plans_and_trains_on_the_cpu")
            .refuses(&[
                no!("qwen3_vl", r#"{"model": {"family": "qwen3_vl"}}"#, "has no implementation in this build"),
            ]),
        field("model.revision", "the hub revision resolved in the cache, recorded by commit")
            .test("a_pinned_revision_picks_that_snapshot")
            .refuses(&[no!(
                "without a hub base",
                r#"{"model": {"revision": "main"}}"#,
                "picks the snapshot of model.name in the Hugging Face cache",
            )]),
        field("model.path", "the base weights' directory").test("a_recipe_s_model_path_is_its_base"),
        field("model.tokenizer", "`byte`, or the tokenizer.json used").test("recipe_names_the_tokenizer"),
        field("model.chat_template", "the chat template conversations are rendered with")
            .differs(r#"{"model": {"chat_template": "plain.jinja"}}"#),
        field("model.enable_thinking", "passed to the chat template")
            .differs(r#"{"model": {"enable_thinking": true}}"#),
        field("model.dtype", "the dtype weights are held and computed in")
            .differs(r#"{"model": {"dtype": "bf16"}, "train": {"precision": "bf16"}}"#),
        field("model.random_init", "says an adapter on random weights is meant")
            .test("an_adapter_on_random_weights_is_refused_unless_the_recipe_asks_for_it"),
    ];
    for (name, patch) in [
        ("hidden_size", r#"{"hidden_size": 48}"#),
        ("num_layers", r#"{"num_layers": 2}"#),
        ("num_heads", r#"{"num_heads": 4, "num_kv_heads": 1, "head_dim": 8}"#),
        ("num_kv_heads", r#"{"num_kv_heads": 2}"#),
        ("head_dim", r#"{"head_dim": 8}"#),
        ("intermediate_size", r#"{"intermediate_size": 48}"#),
        ("vocab_size", r#"{"vocab_size": 520}"#),
        ("rope_theta", r#"{"rope_theta": 100.0}"#),
        ("rms_norm_eps", r#"{"rms_norm_eps": 0.1}"#),
        ("tie_word_embeddings", r#"{"tie_word_embeddings": false}"#),
    ] {
        out.push(field(leak(format!("model.config.{name}")), "the model's shape").differs(config(patch)));
    }
    out.push(
        field(
            "model.config.max_position_embeddings",
            "bounds data.seq_len and serve.max_model_len; written to config.json",
        )
        .test("converts_the_recipe_shape"),
    );
    for (name, patch) in [
        ("num_experts", r#"{"num_experts": 3}"#),
        ("experts_per_token", r#"{"experts_per_token": 1}"#),
        ("expert_intermediate_size", r#"{"expert_intermediate_size": 24}"#),
        ("norm_topk_prob", r#"{"norm_topk_prob": false}"#),
        ("router_aux_loss_coef", r#"{"router_aux_loss_coef": 0.5}"#),
    ] {
        out.push(
            field(leak(format!("model.config.moe.{name}")), "the experts' shape and routing")
                .differs_on(MOE_BASE, leak(format!(r#"{{"model": {{"config": {{"moe": {patch}}}}}}}"#))),
        );
    }
    for (name, patch) in [
        ("full_attention_interval", r#"{"full_attention_interval": 1}"#),
        ("num_key_heads", r#"{"num_key_heads": 2}"#),
        ("num_value_heads", r#"{"num_value_heads": 4}"#),
        ("key_head_dim", r#"{"key_head_dim": 4}"#),
        ("value_head_dim", r#"{"value_head_dim": 4}"#),
        ("conv_kernel", r#"{"conv_kernel": 2}"#),
        ("partial_rotary_factor", r#"{"partial_rotary_factor": 0.5}"#),
    ] {
        out.push(
            field(leak(format!("model.config.linear_attention.{name}")), "the Gated DeltaNet layers' shape")
                .differs_on(
                    HYBRID_BASE,
                    leak(format!(r#"{{"model": {{"config": {{"linear_attention": {patch}}}}}}}"#)),
                ),
        );
    }
    out.extend([
        field("data.source", "where examples come from: JSONL files, the seeded generator, or HF tables")
            .test("parquet_and_arrow_load_to_the_examples_of_the_same_jsonl"),
        field("data.format", "how records are read and rendered").differs(r#"{"data": {"format": "chat"}}"#),
        field("data.paths", "the files read").test("jsonl_files_are_hashed_deduped_and_bad_lines_named"),
        field("data.hf_id", "the hub dataset resolved in the cache when there are no paths; recorded")
            .test("a_recipe_of_hub_ids_alone_trains_from_the_cache_and_records_the_commits"),
        field("data.revision", "the dataset revision resolved in the cache, recorded by commit")
            .test("a_pinned_revision_picks_that_snapshot"),
        field("data.split", "which files of a directory are read").test("hub_split_rule"),
        field("data.columns", "record field → table column")
            .test("parquet_and_arrow_load_to_the_examples_of_the_same_jsonl"),
        field("data.generator.kind", "the generator (one kind: `tasks`)")
            .test("every_family_appears_and_answers_are_right"),
        field("data.generator.seed", "the generated examples").differs(r#"{"data": {"generator": {"seed": 6}}}"#),
        field("data.generator.count", "how many examples are generated")
            .differs(r#"{"data": {"generator": {"count": 96}}}"#),
        field("data.generator.families", "the task families drawn")
            .differs(r#"{"data": {"generator": {"families": ["parity", "review"]}}}"#),
        field("data.max_samples", "caps the examples read").differs(r#"{"data": {"max_samples": 40}}"#),
        field("data.seq_len", "row length").differs(r#"{"data": {"seq_len": 96}}"#),
        field("data.packing", "several examples per row").differs(r#"{"data": {"packing": false}}"#),
        field("data.shuffle", "shuffles each epoch's order").differs(r#"{"data": {"shuffle": false}}"#),
        field("data.dedupe.exact", "drops byte-identical examples").differs_on(
            r#"{"data": {"source": "jsonl", "paths": ["dup.jsonl"], "generator": null}}"#,
            r#"{"data": {"dedupe": {"exact": false}}}"#,
        ),
        field(
            "data.dedupe.near_threshold",
            "drops an example whose word 5-gram Jaccard similarity to an earlier kept one reaches it",
        )
        .test("near_duplicates_are_dropped_at_the_recipe_s_threshold"),
        field("train.method.kind", "the method").test("wrong_method_kind").refuses(&[
            no!(
                "qlora on a GPU with qwen3_hybrid",
                r#"{"model": {"family": "qwen3_hybrid"}, "hardware": {"name": "h100", "gpus": 1, "arch": "sm_90"},
                    "train": {"method": {"kind": "qlora"}}}"#,
                "qlora on a GPU is not built yet for family qwen3_hybrid",
            ),
            no!(
                "grpo with qwen3_hybrid",
                r#"{"model": {"family": "qwen3_hybrid"}, "train": {"method": {"kind": "grpo", "rewards": ["format"]}}}"#,
                "grpo is not built yet for family qwen3_hybrid",
            ),
        ]),
    ]);
    for (kind, base) in [("lora", "{}"), ("qlora", r#"{"train": {"method": {"kind": "qlora"}}}"#)] {
        for (name, does, patch) in LORA_FIELDS {
            out.push(
                field(leak(format!("train.method[{kind}].{name}")), does)
                    .differs_on(base, leak(format!(r#"{{"train": {{"method": {patch}}}}}"#))),
            );
        }
    }
    out.push(field("train.method[qlora].bits", "the base held in 4-bit NF4").refuses(&[no!(
        "8",
        r#"{"train": {"method": {"kind": "qlora", "bits": 8}}}"#,
        "8-bit bases are not built",
    )]));
    for kind in ["dpo", "orpo", "kto", "grpo", "gspo"] {
        for (name, does, _) in LORA_FIELDS {
            out.push(
                field(leak(format!("train.method[{kind}].lora.{name}")), does)
                    .test("every_method_field_reaches_the_method_plan"),
            );
        }
    }
    out.extend([
        field("train.method[dpo].beta", "DPO's β").test("every_method_field_reaches_the_method_plan"),
        field("train.method[dpo].loss", "the DPO loss form (sigmoid, hinge, IPO)")
            .test("each_dpo_loss_form_starts_at_its_own_value_when_the_policy_is_the_reference"),
        field("train.method[dpo].label_smoothing", "the sigmoid loss's ε")
            .test("every_method_field_reaches_the_method_plan")
            .refuses(&[no!(
                "> 0 with hinge or ipo",
                r#"{"train": {"method": {"kind": "dpo", "loss": "ipo", "label_smoothing": 0.1}}}"#,
                "label smoothing belongs to the sigmoid loss",
            )]),
        field("train.method[orpo].beta", "ORPO's λ").test("every_method_field_reaches_the_method_plan"),
        field("train.method[kto].beta", "KTO's β").test("every_method_field_reaches_the_method_plan"),
        field("train.method[kto].desirable_weight", "weight of desirable examples")
            .test("every_method_field_reaches_the_method_plan"),
        field("train.method[kto].undesirable_weight", "weight of undesirable examples")
            .test("every_method_field_reaches_the_method_plan"),
    ]);
    for kind in ["grpo", "gspo"] {
        for (name, does) in [
            ("num_generations", "completions sampled per prompt"),
            ("kl_coef", "weight of the KL term against the reference"),
            ("clip_epsilon", "the ratio clip range"),
            ("max_new_tokens", "longest completion"),
            ("temperature", "sampling temperature"),
            ("rewards", "the reward functions summed"),
        ] {
            out.push(
                field(leak(format!("train.method[{kind}].{name}")), does)
                    .test("every_method_field_reaches_the_method_plan"),
            );
        }
    }
    out.extend([
        field("train.optimizer.name", "the optimizer: AdamW, SGD, Lion or Adafactor")
            .test("each_optimizer_trains_its_own_adapter_and_checkpoints_its_own_state")
            .refuses(&[no!(
                "adamw_8bit",
                r#"{"train": {"optimizer": {"name": "adamw_8bit"}}}"#,
                "adamw_8bit is not built"
            )]),
        field("train.optimizer.lr", "peak learning rate").differs(r#"{"train": {"optimizer": {"lr": 0.003}}}"#),
        field("train.optimizer.betas", "moment decay rates (SGD: betas[0] is the momentum)")
            .differs(r#"{"train": {"optimizer": {"betas": [0.5, 0.9]}}}"#)
            .refuses(&[no!(
                "betas[1] with sgd or adafactor",
                r#"{"train": {"optimizer": {"name": "sgd", "betas": [0.9, 0.5]}}}"#,
                "sgd takes no betas[1]",
            )]),
        field("train.optimizer.eps", "AdamW's and Adafactor's ε")
            .differs(r#"{"train": {"optimizer": {"eps": 0.01}}}"#)
            .refuses(&[no!(
                "with lion or sgd",
                r#"{"train": {"optimizer": {"name": "lion", "eps": 0.01}}}"#,
                "lion takes no eps",
            )]),
        field("train.optimizer.weight_decay", "decoupled weight decay of matrices")
            .differs(r#"{"train": {"optimizer": {"weight_decay": 0.5}}}"#),
        field("train.optimizer.grad_clip", "global gradient-norm clip (0: off)")
            .differs(r#"{"train": {"optimizer": {"grad_clip": 0.001}}}"#),
        field("train.schedule.kind", "the learning-rate schedule")
            .differs(r#"{"train": {"schedule": {"kind": "linear"}}}"#),
        field("train.schedule.warmup_ratio", "warmup share of the steps")
            .differs(r#"{"train": {"schedule": {"warmup_ratio": 0.5}}}"#),
        field("train.schedule.min_lr_ratio", "final lr as a share of lr")
            .differs(r#"{"train": {"schedule": {"min_lr_ratio": 0.5}}}"#),
        field("train.schedule.decay_ratio", "`wsd`: decay share of the steps").differs_on(
            r#"{"train": {"schedule": {"kind": "wsd"}}}"#,
            r#"{"train": {"schedule": {"decay_ratio": 0.5}}}"#,
        ),
        field("train.budget.epochs", "passes over the data (whichever of the two ends first)")
            .test("the_budget_stops_at_whichever_comes_first"),
        field("train.budget.max_steps", "optimizer steps (whichever of the two ends first)")
            .differs(r#"{"train": {"budget": {"max_steps": 3}}}"#),
        field("train.batch.per_device", "rows per device per batch")
            .differs(r#"{"train": {"batch": {"per_device": 2}}}"#),
        field("train.batch.grad_accum", "batches per optimizer step")
            .differs(r#"{"train": {"batch": {"grad_accum": 2}}}"#),
        field("train.precision", "the dtype the run computes in: the one weights are held in (model.dtype)")
            .differs(r#"{"model": {"dtype": "bf16"}, "train": {"precision": "bf16"}}"#)
            .refuses(&[
                no!("fp8", r#"{"train": {"precision": "fp8"}}"#, "fp8 training"),
                no!("≠ model.dtype", r#"{"train": {"precision": "bf16"}}"#, "differs from model.dtype"),
            ]),
        field("train.gradient_checkpointing", "a constraint on the plan: true always recomputes, false never")
            .test("a_plan_keeps_the_recipe_s_gradient_checkpointing"),
        field("train.fsdp", "ZeRO-3 sharding over the ranks")
            .test("fsdp_is_zero3_and_the_distributed_knobs_have_ranges")
            .refuses(&[no!(
                "with dpo, orpo or qlora",
                r#"{"hardware": {"name": "h100", "gpus": 2, "arch": "sm_90"}, "model": {"dtype": "bf16"},
               "train": {"precision": "bf16", "fsdp": true, "method": {"kind": "qlora"}}}"#,
                "ZeRO-3 does not cover",
            )]),
        field("train.distributed.sharding", "what each rank keeps (none, ZeRO-1/2/3)")
            .test("zero_1_2_3_end_on_the_bytes_of_unsharded_data_parallel"),
        field("train.distributed.bucket_mb", "gradient bucket size")
            .test("buckets_are_cut_where_the_reducer_cuts_them"),
        field("train.distributed.timeout_seconds", "how long a rank or collective may take")
            .test("a_killed_rank_ends_the_run_with_a_clear_error_within_the_timeout"),
        field("train.checkpoint.every_steps", "checkpoint cadence")
            .differs(r#"{"train": {"checkpoint": {"every_steps": 2}}}"#),
        field("train.checkpoint.keep_last", "checkpoints kept").differs_on(
            r#"{"train": {"checkpoint": {"every_steps": 1}}}"#,
            r#"{"train": {"checkpoint": {"keep_last": 1}}}"#,
        ),
        field("train.log_every_steps", "`train.progress` cadence").differs(r#"{"train": {"log_every_steps": 2}}"#),
        field("train.env", "set in every training process's environment before it starts")
            .test("train_env_is_in_the_training_process_environment"),
        field("eval.enabled", "evaluation on the held-out split").differs(r#"{"eval": {"enabled": false}}"#),
        field("eval.holdout.fraction", "share of the data held out")
            .differs(r#"{"eval": {"holdout": {"fraction": 0.3}}}"#),
        field("eval.holdout.max_samples", "caps the held-out examples")
            .differs(r#"{"eval": {"holdout": {"max_samples": 2}}}"#),
        field("eval.every_steps", "evaluation cadence (and a step-0 evaluation)")
            .differs(r#"{"eval": {"every_steps": 2}}"#),
        field(
            "eval.tasks",
            "benchmark tasks scored in-process from the HF cache: gsm8k, mmlu, hellaswag, arc_easy, arc_challenge, ifeval",
        )
        .test("eval_tasks_are_scored_with_the_recipe_s_few_shot_and_gated_against_the_base")
        .refuses(&[
            no!("humaneval", r#"{"eval": {"tasks": ["humaneval"]}}"#, "no sandbox to run it in is built"),
            no!(
                "any with eval.enabled false",
                r#"{"eval": {"enabled": false, "tasks": ["gsm8k"]}}"#,
                "scored by the evaluation, which eval.enabled: false turns off",
            ),
        ]),
        field("eval.fewshot", "examples before each task prompt: the first k of the task's few-shot split")
            .test("eval_tasks_are_scored_with_the_recipe_s_few_shot_and_gated_against_the_base")
            .refuses(&[no!(
                "≠ 0 without eval.tasks",
                r#"{"eval": {"fewshot": 5}}"#,
                "few-shot examples are for eval.tasks"
            )]),
        field(
            "eval.regression.baseline",
            "what the final evaluation (held-out and tasks) is compared with: the base (model.name) or an eval.json",
        )
        .test("a_baseline_report_is_read_before_the_run_and_the_base_named_by_model_name")
        .refuses(&[no!(
            "another model",
            r#"{"eval": {"regression": {"baseline": "Qwen/Qwen3-8B", "threshold_pct": 1}}}"#,
            "comparing with another model is not built",
        )]),
        field("eval.regression.threshold_pct", "the largest drop allowed, per held-out exact match and task metric")
            .test("regression_threshold_is_relative_to_the_baseline"),
        field(
            "quantize.enabled",
            "after training: `quantized/`, the final model as FP8 E4M3 in the compressed-tensors format, sealed \
             with the run (`model.quantized`)",
        )
        .test("a_tiny_run_with_quantize_writes_a_sealed_fp8_directory_that_transformers_loads")
        .refuses(&[no!(
            "true with experts",
            r#"{"quantize": {"enabled": true}, "model": {"family": "qwen3_moe"}}"#,
            "FP8 for mixture-of-experts models is not built",
        )]),
        field("quantize.scheme", "`fp8`: E4M3 weights, activations quantized per token at run time")
            .test("a_tiny_run_with_quantize_writes_a_sealed_fp8_directory_that_transformers_loads")
            .refuses(&[
                no!("mxfp4", r#"{"quantize": {"enabled": true, "scheme": "mxfp4"}}"#, "mxfp4 is not built"),
                no!("int8", r#"{"quantize": {"enabled": true, "scheme": "int8"}}"#, "int8 is not built"),
                no!("int4", r#"{"quantize": {"enabled": true, "scheme": "int4"}}"#, "int4 is not built"),
            ]),
        field("quantize.per_channel", "one weight scale per output channel; `false`: one per tensor")
            .test("per_channel_false_writes_one_scale_per_tensor_and_says_so"),
        field("quantize.calibration_samples", "").refuses(&[no!(
            "≠ 512",
            r#"{"quantize": {"enabled": true, "calibration_samples": 64}}"#,
            "nothing is calibrated",
        )]),
        field("serve.enabled", "`false`: `mindxtrain serve` refuses to serve the recipe's model")
            .test("a_recipe_with_serve_enabled_false_is_not_served"),
        field("serve.host", "`mindxtrain serve`'s listen address unless --listen")
            .test("serve_listens_where_the_recipe_says_and_bounds_requests_by_its_max_model_len")
            .refuses(&[no!("not loopback", r#"{"serve": {"host": "0.0.0.0"}}"#, "not a loopback address")]),
        field("serve.port", "`mindxtrain serve`'s listen port unless --listen")
            .test("serve_listens_where_the_recipe_says_and_bounds_requests_by_its_max_model_len"),
        field("serve.max_model_len", "longest prompt + answer served")
            .test("max_model_len_and_max_batch_shape_the_engine"),
        field("serve.max_batch", "requests decoded at once").test("max_model_len_and_max_batch_shape_the_engine"),
        field("serve.tensor_parallel", "one device per model").refuses(&[no!(
            "> 1",
            r#"{"serve": {"tensor_parallel": 2}}"#,
            "tensor-parallel serving",
        )]),
        field("serve.reasoning", "splits the think block into `reasoning_content`")
            .test("serve_reasoning_decides_whether_text_inside_think_is_reasoning_content"),
        field("serve.tool_calls", "parses tool calls into `tool_calls`; `false` refuses requests with tools")
            .test("tools_reach_the_template_only_when_the_recipe_allows_them"),
        field("publish.enabled", "").refuses(&[no!(
            "true",
            r#"{"publish": {"enabled": true, "hf": {"repo": "o/n"}}}"#,
            "publishing to the Hugging Face Hub is not built yet",
        )]),
        field("publish.hf.repo", "the hub repository").inert_unless("publish.enabled"),
        field("publish.hf.private", "the repository's visibility").inert_unless("publish.enabled"),
        field("publish.billing.x402.network", "the chain paid on (`mindxtrain serve`)")
            .test("x402_accepts_networks_by_name_or_caip2"),
        field("publish.billing.x402.asset", "the token paid in").test("addresses_and_assets"),
        field("publish.billing.x402.pay_to", "who is paid").test("addresses_and_assets"),
        field("publish.billing.x402.pricing.per_call", "price of one call")
            .test("quotes_calls_and_time_and_names_bad_requests"),
        field("publish.billing.x402.pricing.per_1k_tokens", "price per 1,000 tokens")
            .test("quotes_calls_and_time_and_names_bad_requests"),
        field("publish.billing.x402.pricing.max_charge", "the most one call may cost")
            .test("quotes_calls_and_time_and_names_bad_requests"),
        field("publish.billing.x402.rental.per_hour", "price of an hour's rental")
            .test("quotes_calls_and_time_and_names_bad_requests"),
        field("publish.billing.x402.rental.min_minutes", "shortest rental")
            .test("quotes_calls_and_time_and_names_bad_requests"),
        field("publish.billing.x402.rental.max_hours", "longest rental")
            .test("quotes_calls_and_time_and_names_bad_requests"),
        field("receipt.output", "where the sealed run's receipt is written")
            .test("receipt_output_is_where_the_sealed_run_writes_its_receipt_and_never_over_another_runs")
            .refuses(&[no!(
                "inside the run's own files",
                r#"{"receipt": {"output": "final/r.json"}}"#,
                "is inside the run's own",
            )]),
        field(
            "receipt.include",
            "what the sealed manifest and the receipt carry (energy measured where there is a counter)",
        )
        .test("receipt_include_recipe_hash_only_seals_that_alone_and_both_verifiers_name_what_is_left_out"),
    ]);
    out
}

/// `patch` as a `model.config` patch.
fn config(patch: &str) -> &'static str {
    leak(format!(r#"{{"model": {{"config": {patch}}}}}"#))
}

/// The training base as a mixture of experts, for the `moe` fields (attention-only adapters:
/// expert adapters take no dropout).
const MOE_BASE: &str = r#"{"model": {"family": "qwen3_moe", "config": {"moe": {"num_experts": 4,
    "experts_per_token": 2, "expert_intermediate_size": 32}}}, "train": {"method": {"target_modules": ["q_proj"]}}}"#;

/// The training base as a Qwen3.5 hybrid: its one layer a Gated DeltaNet layer (every 4th
/// attends), on the CPU, nothing generated (evaluation and serving are not built for it).
const HYBRID_BASE: &str = r#"{"model": {"family": "qwen3_hybrid", "config": {"linear_attention": {"num_key_heads": 1,
    "num_value_heads": 2, "key_head_dim": 8, "value_head_dim": 8}}}, "eval": {"enabled": false},
    "serve": {"enabled": false}}"#;

/// The registry lives for the program; its few generated strings are leaked once per call.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}
