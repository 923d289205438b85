//! A small valid MI300X recipe whose line numbers the tests rely on.

#![allow(dead_code)]

use mindxtrain_trainer::recipe::{Recipe, RecipeError, RecipeErrors};

/// Line numbers matter: tests assert `line:col` against this text.
pub const BASE: &str = "\
meta:
  project: p
  run_name: r
hardware:
  name: mi300x
  gpus: 0
autotune:
  policy: aot_only
model:
  name: Qwen/Qwen3-8B
data:
  source: hf
  hf_id: HuggingFaceH4/ultrachat_200k
train:
  method:
    kind: lora
    r: 16
  optimizer:
    betas: [0.9, 0.95]
  env:
    HSA_NO_SCRATCH_RECLAIM: \"1\"
    NVTE_CK_USES_BWD_V3: \"1\"
    NVTE_CK_IS_V3_ATOMIC_FP32: \"1\"
    PRIMUS_TURBO_ATTN_V3_ATOMIC_FP32: \"1\"
    NCCL_MIN_NCHANNELS: \"112\"
    HIP_FORCE_DEV_KERNARG: \"1\"
    PYTORCH_ROCM_ARCH: gfx942
";

/// `BASE` with one exact substring replaced; panics if the substring is absent so a test
/// cannot silently check the unmodified recipe.
pub fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE lacks {from:?}");
    BASE.replacen(from, to, 1)
}

pub fn errors(src: &str) -> RecipeErrors {
    match Recipe::check_str(src, "x.yaml") {
        Ok(_) => panic!("accepted:\n{src}"),
        Err(e) => e,
    }
}

/// The one error expected, as `(line, column, path, message)`.
pub fn only_error(src: &str) -> RecipeError {
    let all = errors(src);
    assert_eq!(all.len(), 1, "expected one error, got:\n{all}");
    all.first().clone()
}

pub fn at(e: &RecipeError) -> (usize, usize, &str) {
    let loc = e.location().expect("a located error");
    (loc.line, loc.column, e.path())
}
