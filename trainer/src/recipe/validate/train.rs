//! Rules for the `train` section: method parameters, optimizer, schedule, budget, batch.

use super::{Checks, FieldPath, Recipe};
use crate::recipe::schema::ModelFamily;
use crate::recipe::train::{
    DpoLoss, Lora, Method, Optimizer, OptimizerName, Precision, ScheduleKind, Sharding, TargetModule,
};

/// `moe`: the model is a Qwen3-MoE, whose MLP projections are its experts' stacked weights
/// (`model::ExpertProj`): gate and up are one weight there, and adapters on them take no dropout.
fn lora(c: &mut Checks, at: &str, l: &Lora, moe: bool) {
    c.int(&format!("{at}.r"), l.r.into(), 1, 512);
    c.int(&format!("{at}.alpha"), l.alpha.into(), 1, 1024);
    c.num(&format!("{at}.dropout"), l.dropout, 0.0, 1.0, "[]");
    if l.target_modules.is_empty() {
        c.fail(&format!("{at}.target_modules"), "must list at least one projection");
    }
    c.unique(&format!("{at}.target_modules"), &l.target_modules);
    if !moe {
        return;
    }
    let has = |m: TargetModule| l.target_modules.contains(&m);
    if has(TargetModule::GateProj) != has(TargetModule::UpProj) {
        c.fail(
            &format!("{at}.target_modules"),
            "gate_proj and up_proj are one fused weight in a qwen3_moe model's experts (mlp.experts.gate_up_proj): \
             target both or neither",
        );
    }
    let experts = [TargetModule::GateProj, TargetModule::UpProj, TargetModule::DownProj].into_iter().any(has);
    if experts && l.dropout > 0.0 {
        c.fail(
            &format!("{at}.dropout"),
            "LoRA on a qwen3_moe model's experts (gate_proj, up_proj, down_proj targets) takes no dropout: \
             set 0, or target only attention",
        );
    }
}

pub(super) fn method(c: &mut Checks, r: &Recipe) {
    let seq_len = r.data.seq_len;
    let moe = r.model.family == ModelFamily::Qwen3Moe;
    let m = "train.method";
    match &r.train.method {
        Method::Full | Method::Cpt => {}
        Method::Lora(l) => lora(c, m, l, moe),
        Method::Qlora(q) => {
            lora(c, m, &q.lora, moe);
            if q.bits != 4 {
                c.fail(
                    "train.method.bits",
                    format!(
                        "expected 4, found {}: QLoRA holds the base in 4-bit NF4; 8-bit bases are not built",
                        q.bits
                    ),
                );
            }
        }
        Method::Dpo(d) => {
            c.positive("train.method.beta", d.beta);
            c.num("train.method.label_smoothing", d.label_smoothing, 0.0, 0.5, "[)");
            if d.loss != DpoLoss::Sigmoid && d.label_smoothing != 0.0 {
                c.fail(
                    "train.method.label_smoothing",
                    format!(
                        "label smoothing belongs to the sigmoid loss (conservative DPO); `loss: {}` has none: set 0",
                        super::name_of(&d.loss)
                    ),
                );
            }
        }
        Method::Orpo(o) => c.positive("train.method.beta", o.beta),
        Method::Kto(k) => {
            c.positive("train.method.beta", k.beta);
            c.positive("train.method.desirable_weight", k.desirable_weight);
            c.positive("train.method.undesirable_weight", k.undesirable_weight);
        }
        Method::Grpo(g) => {
            rl(c, [g.num_generations, g.max_new_tokens], [g.kl_coef, g.clip_epsilon, g.temperature], seq_len);
            c.unique("train.method.rewards", &g.rewards);
        }
        Method::Gspo(g) => {
            rl(c, [g.num_generations, g.max_new_tokens], [g.kl_coef, g.clip_epsilon, g.temperature], seq_len);
            c.unique("train.method.rewards", &g.rewards);
        }
    }
    let rewards_empty = match &r.train.method {
        Method::Grpo(g) => g.rewards.is_empty(),
        Method::Gspo(g) => g.rewards.is_empty(),
        _ => false,
    };
    if rewards_empty {
        c.fail("train.method.rewards", "must list at least one reward");
    }
    let nested = matches!(&r.train.method, Method::Lora(_) | Method::Qlora(_));
    if let (Some(l), false) = (r.train.method.adapter(), nested) {
        lora(c, "train.method.lora", l, moe);
    }
}

fn rl(c: &mut Checks, [generations, new_tokens]: [u32; 2], [kl, clip, temperature]: [f64; 3], seq_len: u32) {
    c.int("train.method.num_generations", generations.into(), 2, 64);
    c.non_negative("train.method.kl_coef", kl);
    c.num("train.method.clip_epsilon", clip, 0.0, 1.0, "()");
    c.num("train.method.temperature", temperature, 0.0, 2.0, "(]");
    if new_tokens == 0 || new_tokens >= seq_len {
        c.fail(
            "train.method.max_new_tokens",
            format!("expected integer 1..{seq_len} (below data.seq_len), found {new_tokens}"),
        );
    }
}

/// What each optimizer reads of `train.optimizer` (the rest of the optimizer is fixed by
/// `optim`): every one reads `lr` (the schedule's peak), `weight_decay` and `grad_clip` (the
/// gradients are clipped before any update); `adamw` reads all of `betas` and `eps`, `lion` both
/// `betas` but no `eps`, `sgd` only `betas[0]` (its momentum), `adafactor` `betas[0]` (its β1,
/// 0 for none) and `eps` (added to g²) but no `betas[1]` (its second-moment decay is
/// `1 − step^−0.8`). A field an optimizer does not read, written with another value than its
/// default, would be ignored: it is refused. `adamw_8bit` is not built.
fn optimizer_reads(c: &mut Checks, o: &Optimizer) {
    let name = super::name_of(&o.name);
    let (reads_eps, reads_beta2) = match o.name {
        OptimizerName::AdamW => (true, true),
        OptimizerName::Lion => (false, true),
        OptimizerName::Sgd => (false, false),
        OptimizerName::Adafactor => (true, false),
        OptimizerName::AdamW8bit => {
            c.fail("train.optimizer.name", format!("{name} is not built; use adamw, lion, adafactor or sgd"));
            return;
        }
    };
    let default = Optimizer::default();
    if !reads_eps && o.eps != default.eps {
        c.fail("train.optimizer.eps", format!("{name} takes no eps; leave it out"));
    }
    if !reads_beta2 && o.betas[1] != default.betas[1] {
        let why = match o.name {
            OptimizerName::Sgd => "betas[0] is its momentum",
            _ => "its second-moment decay is 1 - step^-0.8",
        };
        c.0.push((
            FieldPath::keys("train.optimizer.betas").index(1),
            format!("{name} takes no betas[1] ({why}); leave it at {} or leave betas out", default.betas[1]),
        ));
    }
}

pub(super) fn train(c: &mut Checks, r: &Recipe) {
    let t = &r.train;
    let o = &t.optimizer;
    if !(o.lr > 0.0 && o.lr <= 1.0) {
        c.fail("train.optimizer.lr", format!("expected a number in (0, 1], found {:?}", o.lr));
    }
    for (i, b) in o.betas.iter().enumerate() {
        if !(0.0..1.0).contains(b) {
            c.0.push((
                FieldPath::keys("train.optimizer.betas").index(i),
                format!("expected a number in [0, 1), found {b:?}"),
            ));
        }
    }
    c.positive("train.optimizer.eps", o.eps);
    c.non_negative("train.optimizer.weight_decay", o.weight_decay);
    c.non_negative("train.optimizer.grad_clip", o.grad_clip);
    optimizer_reads(c, o);
    let s = &t.schedule;
    c.num("train.schedule.warmup_ratio", s.warmup_ratio, 0.0, 1.0, "[]");
    c.num("train.schedule.min_lr_ratio", s.min_lr_ratio, 0.0, 1.0, "[]");
    c.num("train.schedule.decay_ratio", s.decay_ratio, 0.0, 1.0, "[]");
    if s.kind == ScheduleKind::Wsd && s.warmup_ratio + s.decay_ratio > 1.0 {
        c.fail("train.schedule.decay_ratio", "warmup_ratio + decay_ratio must not exceed 1");
    }
    match (t.budget.epochs, t.budget.max_steps) {
        (None, None) => c.fail("train.budget", "set epochs, max_steps, or both"),
        (epochs, steps) => {
            if let Some(e) = epochs {
                c.int("train.budget.epochs", e.into(), 1, 100);
            }
            if let Some(s) = steps {
                c.int("train.budget.max_steps", s, 1, 100_000_000);
            }
        }
    }
    c.int("train.batch.per_device", t.batch.per_device.into(), 1, 4096);
    c.int("train.batch.grad_accum", t.batch.grad_accum.into(), 1, 4096);
    let gpus = r.hardware.gpus;
    precision(c, r);
    let sharding = t.distributed.sharding(t.fsdp);
    if sharding == Sharding::Zero3 {
        let why = match &t.method {
            Method::Dpo(_) | Method::Orpo(_) => {
                Some("its preference loss's reference passes run outside the sharded step")
            }
            Method::Qlora(_) => Some("a 4-bit NF4 base is not sharded"),
            _ => None,
        };
        if let Some(why) = why {
            let at = if t.fsdp { "train.fsdp" } else { "train.distributed.sharding" };
            c.fail(
                at,
                format!(
                    "ZeRO-3 does not cover `kind: {}`: {why}; use distributed.sharding: zero2",
                    super::name_of(&t.method.kind())
                ),
            );
        }
    }
    if gpus > 1
        && let Some(why) = crate::run::MethodPlan::single_process_only(&t.method)
    {
        c.fail("hardware.gpus", why);
    }
    if t.fsdp && gpus < 2 {
        c.fail("train.fsdp", format!("needs at least 2 GPUs to shard over; hardware.gpus is {gpus}"));
    }
    let d = &t.distributed;
    if t.fsdp && d.sharding.is_some_and(|s| s != super::super::Sharding::Zero3) {
        c.fail(
            "train.distributed.sharding",
            "train.fsdp: true is ZeRO-3 sharding; leave distributed.sharding out or set it to zero3",
        );
    }
    c.num("train.distributed.bucket_mb", d.bucket_mb, 0.0, 4096.0, "(]");
    c.int("train.distributed.timeout_seconds", d.timeout_seconds.into(), 1, 86_400);
    if let Some(n) = t.checkpoint.every_steps {
        c.int("train.checkpoint.every_steps", n, 1, u64::MAX);
    }
    c.int("train.checkpoint.keep_last", t.checkpoint.keep_last.into(), 1, 1000);
    c.int("train.log_every_steps", t.log_every_steps.into(), 1, 1_000_000);
}

/// `train.precision` is the dtype the run computes in, and the trainer computes in the dtype it
/// holds the weights in (`model.dtype`): the two must agree (unset, it is `model.dtype`'s).
/// Mixed precision (bf16 compute over f32 master weights) and FP8 GEMMs are not built, so a
/// precision that differs is refused rather than silently run in `model.dtype`.
fn precision(c: &mut Checks, r: &Recipe) {
    let dtype = r.model.dtype;
    match r.train.precision {
        None => {}
        Some(Precision::Fp8) => {
            c.fail("train.precision", "fp8 training (FP8 GEMMs under bf16 master weights) is not built yet: use bf16")
        }
        Some(p) if p != dtype.precision() => c.fail(
            "train.precision",
            format!(
                "`{}` differs from model.dtype `{}`: the trainer computes in the dtype the weights are held in \
                 (optimizer state and reductions in f32 either way), and mixed precision is not built; set both \
                 to the same dtype, or leave precision out",
                super::name_of(&p),
                super::name_of(&dtype)
            ),
        ),
        Some(_) => {}
    }
}

#[cfg(test)]
mod optimizer_tests {
    use crate::recipe::Recipe;

    const BASE: &str = include_str!("../../../../recipes/tiny_cpu_lora.yaml");

    /// The line of `name: adamw` in [`BASE`] (1-based): what replaces it starts there.
    fn name_line() -> usize {
        BASE.lines().position(|l| l == "    name: adamw").expect("tiny_cpu_lora.yaml names adamw") + 1
    }

    /// The shipped LoRA recipe with `lines` in place of `name: adamw`.
    fn with(lines: &str) -> String {
        assert!(BASE.contains("  optimizer:\n    name: adamw\n"), "tiny_cpu_lora.yaml changed shape");
        BASE.replacen("    name: adamw\n", lines, 1)
    }

    /// The errors as `(line, path, message)`; none when the recipe is accepted.
    fn errors(src: &str) -> Vec<(usize, String, String)> {
        match Recipe::check_str(src, "x.yaml") {
            Ok(_) => Vec::new(),
            Err(e) => e
                .iter()
                .map(|e| (e.location().map_or(0, |l| l.line), e.path().to_string(), e.message().to_string()))
                .collect(),
        }
    }

    fn one(line: usize, path: &str, message: &str) -> Vec<(usize, String, String)> {
        vec![(line, path.to_string(), message.to_string())]
    }

    #[test]
    fn each_optimizer_takes_the_fields_it_reads() {
        for name in ["adamw", "lion", "sgd", "adafactor"] {
            // Defaults everywhere, then every field it reads set to a value of its own.
            assert_eq!(errors(&with(&format!("    name: {name}\n"))), [], "{name}");
            let reads = match name {
                "adamw" => "    betas: [0.8, 0.99]\n    eps: 1.0e-6\n",
                "lion" => "    betas: [0.8, 0.99]\n",
                "sgd" => "    betas: [0.5, 0.95]\n",
                _ => "    betas: [0.0, 0.95]\n    eps: 1.0e-30\n",
            };
            assert_eq!(errors(&with(&format!("    name: {name}\n{reads}"))), [], "{name}");
        }
        // A default written out is not a change.
        assert_eq!(errors(&with("    name: lion\n    eps: 1.0e-8\n")), []);
    }

    #[test]
    fn lion_and_sgd_refuse_eps() {
        for name in ["lion", "sgd"] {
            let src = with(&format!("    name: {name}\n    eps: 1.0e-6\n"));
            assert_eq!(
                errors(&src),
                one(name_line() + 1, "train.optimizer.eps", &format!("{name} takes no eps; leave it out"))
            );
        }
    }

    #[test]
    fn sgd_and_adafactor_refuse_a_second_beta() {
        let src = with("    name: sgd\n    betas: [0.9, 0.999]\n");
        let want = "sgd takes no betas[1] (betas[0] is its momentum); leave it at 0.95 or leave betas out";
        assert_eq!(errors(&src), one(name_line() + 1, "train.optimizer.betas[1]", want));
        let src = with("    name: adafactor\n    betas: [0.9, 0.999]\n");
        let want = "adafactor takes no betas[1] (its second-moment decay is 1 - step^-0.8); leave it at 0.95 or leave betas out";
        assert_eq!(errors(&src), one(name_line() + 1, "train.optimizer.betas[1]", want));
    }

    #[test]
    fn adamw_8bit_is_refused_naming_what_works() {
        let want = "adamw_8bit is not built; use adamw, lion, adafactor or sgd";
        assert_eq!(errors(&with("    name: adamw_8bit\n")), one(name_line(), "train.optimizer.name", want));
    }
}
