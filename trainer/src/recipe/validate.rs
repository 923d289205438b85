//! Rules a recipe must keep beyond its shape: ranges, hardware invariants, cross-field
//! consistency. Every rule is checked and every break reported, each under the path of the
//! field to change.

use std::collections::HashSet;
use std::hash::Hash;
use std::net::IpAddr;

use serde::Serialize;

use super::env::{is_env_key, lists_arch, mandatory_rocm_env_keys};
use super::error::FieldPath;
use super::publish::{Pricing, Usdc};
use super::schema::{DataFormat, DataSource, Generator, HardwareName, ModelFamily, Recipe, Vendor};
use super::train::Method;
use crate::data::{Families, TaskParams};

mod hybrid;
mod receipt;
mod train;

pub(crate) type Issue = (FieldPath, String);

/// A value's name as written in recipes (`mi300x`, `preference`, `q_proj`).
fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Fills what depends on other fields (so a loaded recipe shows resolved values).
pub(crate) fn resolve(recipe: &mut Recipe) {
    if recipe.hardware.arch.is_empty() {
        recipe.hardware.arch = recipe.hardware.name.default_arch().to_owned();
    }
    if recipe.train.precision.is_none() {
        recipe.train.precision = Some(recipe.model.dtype.precision());
    }
}

#[derive(Default)]
struct Checks(Vec<Issue>);

impl Checks {
    fn fail(&mut self, path: &str, message: impl Into<String>) {
        self.0.push((FieldPath::keys(path), message.into()));
    }

    fn int(&mut self, path: &str, v: u64, lo: u64, hi: u64) {
        if !(lo..=hi).contains(&v) {
            self.fail(path, format!("expected integer {lo}..={hi}, found {v}"));
        }
    }

    /// `v` within `lo..hi`, each end open or closed as `ends` says (`"[)"`, `"(]"`, ...).
    /// Written so that NaN fails every range.
    fn num(&mut self, path: &str, v: f64, lo: f64, hi: f64, ends: &str) {
        let (lo_open, hi_open) = (ends.starts_with('('), ends.ends_with(')'));
        let above = if lo_open { v > lo } else { v >= lo };
        let below = if hi_open { v < hi } else { v <= hi };
        if !(above && below) {
            let (open, close) = (if lo_open { '(' } else { '[' }, if hi_open { ')' } else { ']' });
            self.fail(path, format!("expected a number in {open}{lo}, {hi}{close}, found {v:?}"));
        }
    }

    fn positive(&mut self, path: &str, v: f64) {
        if !(v > 0.0 && v.is_finite()) {
            self.fail(path, format!("expected a number > 0, found {v:?}"));
        }
    }

    fn non_negative(&mut self, path: &str, v: f64) {
        if !(v >= 0.0 && v.is_finite()) {
            self.fail(path, format!("expected a number >= 0, found {v:?}"));
        }
    }

    fn text(&mut self, path: &str, v: &str) {
        if v.trim().is_empty() {
            self.fail(path, "must not be empty");
        }
    }

    fn opt_text(&mut self, path: &str, v: Option<&String>) {
        if let Some(v) = v {
            self.text(path, v);
        }
    }

    fn unique<T: Eq + Hash + Serialize>(&mut self, path: &str, items: &[T]) {
        let mut seen = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            if !seen.insert(item) {
                let p = FieldPath::keys(path).index(i);
                self.0.push((p, format!("{} is listed twice", name_of(item))));
            }
        }
    }
}

/// Every rule the recipe breaks.
pub(crate) fn validate(r: &Recipe) -> Vec<Issue> {
    let mut c = Checks::default();
    meta(&mut c, r);
    hardware(&mut c, r);
    c.int("autotune.budget_seconds", r.autotune.budget_seconds.into(), 1, 3600);
    c.opt_text("autotune.plan", r.autotune.plan.as_ref());
    model(&mut c, r);
    hybrid::rules(&mut c, r);
    data(&mut c, r);
    train::method(&mut c, r);
    train::train(&mut c, r);
    eval(&mut c, r);
    serve(&mut c, r);
    publish(&mut c, r);
    quantize(&mut c, r);
    let include = &r.receipt.include;
    c.unique("receipt.include", include);
    if !include.contains(&super::schema::ReceiptItem::RecipeHash) {
        c.fail("receipt.include", "must include recipe_hash: the receipt is what binds a run to its recipe");
    }
    c.opt_text("receipt.output", r.receipt.output.as_ref());
    receipt::output(&mut c, r);
    c.0
}

/// `quantize`: FP8 with dynamic per-token activations is built (`crate::quantize`); the other
/// schemes, calibration (which dynamic scales do not use) and MoE experts are refused by name.
fn quantize(c: &mut Checks, r: &Recipe) {
    let q = &r.quantize;
    if q.calibration_samples != super::schema::Quantize::default().calibration_samples {
        c.fail(
            "quantize.calibration_samples",
            "fp8 scales activations per token at run time (dynamic), so nothing is calibrated: leave \
             calibration_samples out (static activation scales are not built)",
        );
    }
    if !q.enabled {
        return;
    }
    if q.scheme != super::schema::QuantScheme::Fp8 {
        c.fail("quantize.scheme", format!("{} is not built: fp8 is", name_of(&q.scheme)));
    }
    if r.model.family == ModelFamily::Qwen3Moe || r.model.config.as_ref().is_some_and(|m| m.moe.is_some()) {
        c.fail(
            "quantize.enabled",
            "FP8 for mixture-of-experts models is not built: transformers holds their experts as fused \
             parameters, not the Linear modules the compressed-tensors scheme targets",
        );
    }
}

fn meta(c: &mut Checks, r: &Recipe) {
    c.text("meta.project", &r.meta.project);
    c.text("meta.license", &r.meta.license);
    let name = &r.meta.run_name;
    let ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if name.is_empty() || name.len() > 128 || !ok || name.starts_with('.') {
        c.fail(
            "meta.run_name",
            format!("expected 1-128 characters of [A-Za-z0-9._-] not starting with '.', found {name:?}"),
        );
    }
}

fn hardware(c: &mut Checks, r: &Recipe) {
    let hw = &r.hardware;
    let gpus = hw.gpus;
    match hw.name.vendor() {
        Vendor::Cpu if gpus != 0 => c.fail("hardware.gpus", format!("expected 0 for `cpu`, found {gpus}")),
        Vendor::Nvidia if ![0, 1, 2, 4, 8].contains(&gpus) => {
            c.fail("hardware.gpus", format!("expected 0 (CPU), 1, 2, 4 or 8 on {}, found {gpus}", name_of(&hw.name)))
        }
        Vendor::Amd if ![0, 1, 8].contains(&gpus) => c.fail(
            "hardware.gpus",
            format!(
                "expected 0 (CPU), 1 or 8 on {}, found {gpus}: 2- and 4-GPU groups get asymmetric \
                 xGMI bandwidth on MI300-class boards",
                name_of(&hw.name)
            ),
        ),
        _ => {}
    }
    if hw.name.vendor() == Vendor::Amd && gpus > 0 {
        c.fail(
            "hardware.gpus",
            format!(
                "{} GPUs have no launch path in this build (its kernels compile for HIP, but nothing runs them on \
                 an AMD GPU yet): set hardware.gpus: 0 to train on the CPU, or name NVIDIA hardware",
                name_of(&hw.name)
            ),
        );
    }
    let arch_ok = match hw.name {
        HardwareName::Cpu => ["native", "x86_64", "aarch64"].contains(&hw.arch.as_str()),
        name => hw.arch == name.default_arch(),
    };
    if !arch_ok {
        let want = match hw.name {
            HardwareName::Cpu => "native, x86_64 or aarch64",
            name => name.default_arch(),
        };
        c.fail("hardware.arch", format!("expected {want} for this hardware, found {:?}", hw.arch));
    }
    if let Some(gb) = hw.memory_gb {
        c.int("hardware.memory_gb", gb.into(), 1, 4096);
    }
    for key in r.train.env.keys().filter(|k| !is_env_key(k)) {
        c.0.push((FieldPath::keys("train.env").key(key), "expected an env name matching [A-Z_][A-Z0-9_]*".into()));
    }
    if !hw.name.is_mi300_class() {
        return;
    }
    for key in mandatory_rocm_env_keys() {
        let path = FieldPath::keys("train.env").key(key);
        match r.train.env.get(*key) {
            None => {
                c.0.push((path, format!("missing mandatory ROCm env key {key}: every MI300-class recipe must set it")))
            }
            Some(v) if v.trim().is_empty() => c.0.push((path, "mandatory ROCm env key must not be empty".into())),
            Some(_) => {}
        }
    }
    if let Some(archs) = r.train.env.get("PYTORCH_ROCM_ARCH")
        && !archs.is_empty()
        && !lists_arch(archs, &hw.arch)
    {
        c.fail("train.env.PYTORCH_ROCM_ARCH", format!("must include {} (hardware.arch), found {archs:?}", hw.arch));
    }
}

/// The families this build trains and serves; the others are refused by name.
pub(crate) const RUNNABLE_FAMILIES: [ModelFamily; 4] =
    [ModelFamily::Qwen3, ModelFamily::Qwen3Moe, ModelFamily::Instella, ModelFamily::Qwen3Hybrid];

fn model(c: &mut Checks, r: &Recipe) {
    let m = &r.model;
    if !RUNNABLE_FAMILIES.contains(&m.family) {
        let runnable = RUNNABLE_FAMILIES.iter().map(name_of).collect::<Vec<_>>().join(" and ");
        c.fail(
            "model.family",
            format!(
                "family `{}` has no implementation in this build: nothing could load, train or serve it; \
                 the families that run today are {runnable}",
                name_of(&m.family)
            ),
        );
    }
    c.text("model.name", &m.name);
    c.opt_text("model.revision", m.revision.as_ref());
    c.opt_text("model.path", m.path.as_ref());
    c.opt_text("model.tokenizer", m.tokenizer.as_ref());
    if m.revision.is_some() && (m.path.is_some() || m.config.is_some() || !crate::hub::is_repo_id(&m.name)) {
        c.fail(
            "model.revision",
            "picks the snapshot of model.name in the Hugging Face cache, which is read only for a hub id \
             (owner/name) without model.path and model.config: drop it",
        );
    }
    if m.random_init && m.path.is_some() {
        c.fail("model.random_init", "random weights and model.path exclude each other: drop one");
    }
    if m.random_init && m.config.is_none() {
        c.fail("model.random_init", "random weights need a shape: give model.config");
    }
    let Some(cfg) = &m.config else { return };
    let dims = [
        ("hidden_size", cfg.hidden_size, 65_536),
        ("num_layers", cfg.num_layers, 1024),
        ("num_heads", cfg.num_heads, 1024),
        ("num_kv_heads", cfg.num_kv_heads, 1024),
        ("head_dim", cfg.head_dim, 1024),
        ("intermediate_size", cfg.intermediate_size, 1 << 20),
        ("vocab_size", cfg.vocab_size, 1 << 22),
    ];
    for (field, v, hi) in dims {
        c.int(&format!("model.config.{field}"), v.into(), 1, hi);
    }
    if cfg.num_kv_heads > 0 && cfg.num_heads % cfg.num_kv_heads != 0 {
        c.fail("model.config.num_kv_heads", format!("must divide num_heads ({})", cfg.num_heads));
    }
    if cfg.head_dim % 2 != 0 {
        c.fail("model.config.head_dim", "must be even: rotary embeddings rotate pairs of dimensions");
    }
    if m.family == ModelFamily::Instella && cfg.head_dim * cfg.num_heads != cfg.hidden_size {
        c.fail(
            "model.config.head_dim",
            format!(
                "Instella's head_dim is hidden_size / num_heads ({} / {}): its attention splits the hidden size",
                cfg.hidden_size, cfg.num_heads
            ),
        );
    }
    c.int("model.config.max_position_embeddings", cfg.max_position_embeddings.into(), 16, 1_048_576);
    if r.data.seq_len > cfg.max_position_embeddings {
        c.fail(
            "data.seq_len",
            format!("exceeds model.config.max_position_embeddings ({})", cfg.max_position_embeddings),
        );
    }
    c.positive("model.config.rope_theta", cfg.rope_theta);
    c.num("model.config.rms_norm_eps", cfg.rms_norm_eps, 0.0, 1.0, "()");
    match (&cfg.moe, m.family) {
        (Some(_), family) if !matches!(family, ModelFamily::Qwen3Moe | ModelFamily::Qwen3Hybrid) => c.fail(
            "model.config.moe",
            format!("only families qwen3_moe and qwen3_hybrid have experts; family is `{}`", name_of(&family)),
        ),
        (Some(moe), _) => {
            c.int("model.config.moe.num_experts", moe.num_experts.into(), 2, 1024);
            c.int("model.config.moe.experts_per_token", moe.experts_per_token.into(), 1, moe.num_experts.max(1).into());
            c.int("model.config.moe.expert_intermediate_size", moe.expert_intermediate_size.into(), 1, 1 << 20);
            c.num("model.config.moe.router_aux_loss_coef", moe.router_aux_loss_coef, 0.0, 1.0, "[]");
        }
        (None, ModelFamily::Qwen3Moe) => c.fail("model.config.moe", "required for family qwen3_moe"),
        (None, _) => {}
    }
    match m.tokenizer.as_deref() {
        None if m.path.is_none() => c.fail(
            "model.tokenizer",
            "required for an inline model without weights: `byte` or a path to tokenizer.json",
        ),
        Some("byte") if cfg.vocab_size < 256 => {
            c.fail("model.config.vocab_size", "the byte tokenizer needs vocab_size >= 256")
        }
        _ => {}
    }
}

fn data(c: &mut Checks, r: &Recipe) {
    let d = &r.data;
    let source = d.source;
    let only_for = |c: &mut Checks, field: &str, allowed: DataSource| {
        c.fail(&format!("data.{field}"), format!("only allowed with `source: {}`", name_of(&allowed)));
    };
    if source == DataSource::Jsonl && d.paths.is_empty() {
        c.fail("data.paths", "required with `source: jsonl`: at least one JSONL file");
    }
    if source == DataSource::Generated && !d.paths.is_empty() {
        only_for(c, "paths", DataSource::Jsonl);
    }
    match (&d.hf_id, source) {
        (None, DataSource::Hf) if d.paths.is_empty() => c.fail(
            "data.hf_id",
            "`source: hf` needs data.hf_id (a dataset in the Hugging Face cache, fetched with `mindxtrain fetch \
             ID --dataset`; nothing is downloaded at run time) or data.paths (Parquet, Arrow or JSONL files or \
             directories)",
        ),
        (Some(id), DataSource::Hf) if !id.contains('/') || id.trim() != id => {
            c.fail("data.hf_id", format!("expected `owner/name`, found {id:?}"));
        }
        (Some(_), DataSource::Jsonl | DataSource::Generated) => only_for(c, "hf_id", DataSource::Hf),
        _ => {}
    }
    if d.revision.is_some() && source != DataSource::Hf {
        only_for(c, "revision", DataSource::Hf);
    } else if d.revision.is_some() && d.hf_id.is_none() {
        c.fail("data.revision", "is the revision of data.hf_id, which is not given: drop it or name the dataset");
    }
    match (&d.generator, source) {
        (None, DataSource::Generated) => c.fail("data.generator", "required with `source: generated`"),
        (Some(g), DataSource::Generated) => {
            c.int("data.generator.count", g.count.into(), 1, 10_000_000);
            generator_families(c, g, d.seq_len);
        }
        (Some(_), _) => only_for(c, "generator", DataSource::Generated),
        (None, _) => {}
    }
    for (i, p) in d.paths.iter().enumerate() {
        if p.trim().is_empty() {
            c.0.push((FieldPath::keys("data.paths").index(i), "must not be empty".into()));
        }
    }
    c.text("data.split", &d.split);
    let fields = crate::data::source::format_fields(d.format);
    for (field, column) in &d.columns {
        if !fields.contains(&field.as_str()) {
            c.fail(
                &format!("data.columns.{field}"),
                format!("`{}` records have no field `{field}`; they read {}", name_of(&d.format), fields.join(", ")),
            );
        } else if column.trim().is_empty() {
            c.fail(&format!("data.columns.{field}"), "must name a column");
        }
    }
    if !d.columns.is_empty() && source != DataSource::Hf {
        only_for(c, "columns", DataSource::Hf);
    }
    if let Some(n) = d.max_samples {
        c.int("data.max_samples", n, 1, u64::MAX);
    }
    c.int("data.seq_len", d.seq_len.into(), 16, 1_048_576);
    if let Some(t) = d.dedupe.near_threshold {
        c.num("data.dedupe.near_threshold", t, 0.0, 1.0, "[]");
    }
    let kind = r.train.method.kind();
    let (wanted, why): (&[DataFormat], &str) = match &r.train.method {
        Method::Dpo(_) | Method::Orpo(_) | Method::Kto(_) => (&[DataFormat::Preference], "preference methods"),
        Method::Cpt => (&[DataFormat::Text], "continued pretraining"),
        Method::Grpo(_) | Method::Gspo(_) => {
            (&[DataFormat::Chat, DataFormat::Instruction], "RL methods, which need prompts with reference answers")
        }
        _ => (&[DataFormat::Chat, DataFormat::Instruction, DataFormat::Text], "supervised methods"),
    };
    if !wanted.contains(&d.format) {
        let list = wanted.iter().map(name_of).collect::<Vec<_>>().join(" or ");
        c.fail("data.format", format!("`kind: {}` needs {list} data ({why})", name_of(&kind)));
    }
}

fn eval(c: &mut Checks, r: &Recipe) {
    let e = &r.eval;
    c.num("eval.holdout.fraction", e.holdout.fraction, 0.0, 0.5, "[]");
    if let Some(n) = e.holdout.max_samples {
        c.int("eval.holdout.max_samples", n.into(), 1, u32::MAX.into());
    }
    if let Some(n) = e.every_steps {
        c.int("eval.every_steps", n, 1, u64::MAX);
    }
    for (i, task) in e.tasks.iter().enumerate() {
        let ok = !task.is_empty()
            && task.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_:.-".contains(&b));
        if !ok {
            c.0.push((
                FieldPath::keys("eval.tasks").index(i),
                format!("expected a task name of [a-z0-9_:.-], found {task:?}"),
            ));
        }
    }
    c.unique("eval.tasks", &e.tasks);
    c.int("eval.fewshot", e.fewshot.into(), 0, 32);
    for (i, task) in e.tasks.iter().enumerate() {
        if let Some(why) = crate::bench_eval::refusal(task) {
            c.0.push((FieldPath::keys("eval.tasks").index(i), why));
        }
    }
    if !e.tasks.is_empty() && !e.enabled {
        c.fail("eval.tasks", "benchmark tasks are scored by the evaluation, which eval.enabled: false turns off");
    }
    if e.tasks.is_empty() && e.fewshot != 0 {
        c.fail("eval.fewshot", "few-shot examples are for eval.tasks, which lists none: list tasks or leave it at 0");
    }
    if e.enabled && e.tasks.is_empty() && e.holdout.fraction == 0.0 {
        c.fail("eval.tasks", "nothing to evaluate: list tasks or keep a holdout fraction above 0");
    }
    if let Some(reg) = &e.regression {
        c.text("eval.regression.baseline", &reg.baseline);
        c.num("eval.regression.threshold_pct", reg.threshold_pct, 0.0, 100.0, "[]");
        if !e.enabled {
            c.fail("eval.regression", "a regression gate needs the evaluation it gates: eval.enabled is false");
        }
        if reg.baseline != r.model.name && !reg.baseline.ends_with(".json") {
            c.fail(
                "eval.regression.baseline",
                format!(
                    "`{}` is neither this run's model.name (`{}`: its base, evaluated before the first step) nor \
                     the path of an earlier run's eval.json; comparing with another model is not built",
                    reg.baseline, r.model.name
                ),
            );
        }
    }
}

fn serve(c: &mut Checks, r: &Recipe) {
    let s = &r.serve;
    match s.host.parse::<IpAddr>() {
        Err(_) => c.fail("serve.host", format!("expected an IP address such as 127.0.0.1, found {:?}", s.host)),
        Ok(ip) if !ip.is_loopback() => c.fail(
            "serve.host",
            format!(
                "{ip} is not a loopback address: the node binds loopback only (127.0.0.0/8 or ::1); put a \
                 reverse proxy in front of it to serve other hosts"
            ),
        ),
        Ok(_) => {}
    }
    c.int("serve.port", s.port.into(), 1024, 65_535);
    c.int("serve.max_model_len", s.max_model_len.into(), 16, 1_048_576);
    if let Some(cfg) = &r.model.config
        && s.max_model_len > cfg.max_position_embeddings
    {
        c.fail(
            "serve.max_model_len",
            format!("exceeds model.config.max_position_embeddings ({})", cfg.max_position_embeddings),
        );
    }
    c.int("serve.max_batch", s.max_batch.into(), 1, 4096);
    if s.tensor_parallel != 1 {
        c.fail(
            "serve.tensor_parallel",
            format!(
                "expected 1, found {}: the serving engine runs a model on one device (tensor-parallel serving \
                 is not built)",
                s.tensor_parallel
            ),
        );
    }
}

fn publish(c: &mut Checks, r: &Recipe) {
    let p = &r.publish;
    if p.enabled {
        c.fail(
            "publish.enabled",
            "publishing to the Hugging Face Hub is not built yet (the node never uploads weights): set \
             enabled: false; `mindxtrain export` writes an HF directory you can upload yourself",
        );
    }
    if let Some(hf) = &p.hf {
        let parts: Vec<&str> = hf.repo.split('/').collect();
        if parts.len() != 2 || parts.iter().any(|s| s.is_empty() || s.trim() != *s) {
            c.fail("publish.hf.repo", format!("expected `owner/name`, found {:?}", hf.repo));
        }
    }
    let Some(x) = &p.billing.x402 else { return };
    if !r.serve.enabled {
        c.fail("publish.billing.x402", "billing sells the served model, but serve.enabled is false");
    }
    pricing(c, &x.pricing);
    if let Some(rental) = &x.rental {
        positive_amount(c, "publish.billing.x402.rental.per_hour", rental.per_hour);
        c.int("publish.billing.x402.rental.min_minutes", rental.min_minutes.into(), 1, 1440);
        c.int("publish.billing.x402.rental.max_hours", rental.max_hours.into(), 1, 720);
        if u64::from(rental.min_minutes) > u64::from(rental.max_hours) * 60 {
            c.fail("publish.billing.x402.rental.min_minutes", "exceeds max_hours");
        }
    }
}

fn positive_amount(c: &mut Checks, path: &str, a: Usdc) {
    if a.atomic() == 0 {
        c.fail(path, "must be above 0; leave billing out to serve for free");
    }
}

fn pricing(c: &mut Checks, p: &Pricing) {
    let at = "publish.billing.x402.pricing";
    match (p.per_call, p.per_1k_tokens, p.max_charge) {
        (Some(_), Some(_), _) => c.fail(&format!("{at}.per_1k_tokens"), "set per_call or per_1k_tokens, not both"),
        (None, None, _) => c.fail(at, "set per_call, or per_1k_tokens with max_charge"),
        (Some(call), None, max) => {
            positive_amount(c, &format!("{at}.per_call"), call);
            if max.is_some() {
                c.fail(&format!("{at}.max_charge"), "only used with per_1k_tokens");
            }
        }
        (None, Some(rate), None) => {
            positive_amount(c, &format!("{at}.per_1k_tokens"), rate);
            c.fail(
                &format!("{at}.max_charge"),
                "required with per_1k_tokens: x402 states the most a call may cost up front",
            );
        }
        (None, Some(rate), Some(max)) => {
            positive_amount(c, &format!("{at}.per_1k_tokens"), rate);
            if max < rate {
                c.fail(&format!("{at}.max_charge"), format!("must be at least per_1k_tokens ({rate})"));
            }
        }
    }
}

/// `data.generator.families`: no repeats, and something to draw (`convert` alone needs the
/// multi-argument tools, which come with `seq_len` 192 and more).
fn generator_families(c: &mut Checks, g: &Generator, seq_len: u32) {
    c.unique("data.generator.families", &g.families);
    let params =
        TaskParams { multi_arg_tools: seq_len >= 192, families: Families::of(&g.families), ..TaskParams::new(0, 1) };
    if !params.can_draw() {
        c.fail("data.generator.families", "only `convert`, whose examples need data.seq_len 192 or more");
    }
}
