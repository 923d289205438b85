//! The process environment a recipe asks for, and how an autotune plan may change it.

use std::collections::BTreeMap;

use super::error::EnvOverrideError;
use super::schema::Recipe;

/// Keys every MI300-class recipe must set in `train.env`. Without them ROCm reclaims scratch
/// memory mid-step, CK attention falls back to slower or non-deterministic backward kernels,
/// RCCL under-uses the xGMI links, or kernels get built for the wrong arch.
const MANDATORY_ROCM_ENV_KEYS: [&str; 7] = [
    "HSA_NO_SCRATCH_RECLAIM",
    "NVTE_CK_USES_BWD_V3",
    "NVTE_CK_IS_V3_ATOMIC_FP32",
    "PRIMUS_TURBO_ATTN_V3_ATOMIC_FP32",
    "NCCL_MIN_NCHANNELS",
    "HIP_FORCE_DEV_KERNARG",
    "PYTORCH_ROCM_ARCH",
];

/// The seven env keys an MI300-class recipe must carry in `train.env`.
///
/// ```
/// let keys = mindxtrain_trainer::recipe::mandatory_rocm_env_keys();
/// assert_eq!(keys.len(), 7);
/// assert!(keys.contains(&"HSA_NO_SCRATCH_RECLAIM"));
/// ```
pub fn mandatory_rocm_env_keys() -> &'static [&'static str] {
    &MANDATORY_ROCM_ENV_KEYS
}

/// Whether a `PYTORCH_ROCM_ARCH` value (`;`-separated) lists the hardware's arch.
pub(crate) fn lists_arch(archs: &str, arch: &str) -> bool {
    archs.split(';').any(|a| a.trim() == arch)
}

/// `[A-Z_][A-Z0-9_]*`: portable across shells and what ROCm/CUDA variables look like.
pub(crate) fn is_env_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_uppercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Applies a plan's env overrides to the recipe's `train.env` and returns the environment to
/// run with.
///
/// `Some(value)` sets or replaces a key; `None` removes it. On MI300-class hardware a plan
/// may retune the mandatory keys (say `NCCL_MIN_NCHANNELS`) but removing one, or emptying
/// it, is refused, and the recipe's environment is left as it was.
///
/// ```
/// use std::collections::BTreeMap;
/// use mindxtrain_trainer::recipe::{apply_plan_env, EnvOverrideError, Recipe};
///
/// let rocm = "\
/// meta: {project: p, run_name: r}
/// hardware: {name: mi300x, gpus: 0}
/// model: {name: Qwen/Qwen3-8B}
/// data: {source: hf, hf_id: HuggingFaceH4/ultrachat_200k}
/// train:
///   method: {kind: lora}
///   env: {HSA_NO_SCRATCH_RECLAIM: '1', NVTE_CK_USES_BWD_V3: '1', NVTE_CK_IS_V3_ATOMIC_FP32: '1',
///         PRIMUS_TURBO_ATTN_V3_ATOMIC_FP32: '1', NCCL_MIN_NCHANNELS: '112', HIP_FORCE_DEV_KERNARG: '1',
///         PYTORCH_ROCM_ARCH: gfx942}
/// ";
/// let loaded = Recipe::from_str(rocm, "rocm.yaml").unwrap();
/// let retune = BTreeMap::from([("NCCL_MIN_NCHANNELS".to_string(), Some("64".to_string()))]);
/// let env = apply_plan_env(&loaded.recipe, &retune).unwrap();
/// assert_eq!(env["NCCL_MIN_NCHANNELS"], "64");
///
/// let drop = BTreeMap::from([("HSA_NO_SCRATCH_RECLAIM".to_string(), None)]);
/// assert!(matches!(
///     apply_plan_env(&loaded.recipe, &drop),
///     Err(EnvOverrideError::RemovesMandatoryKey { .. })
/// ));
/// ```
pub fn apply_plan_env(
    recipe: &Recipe,
    overrides: &BTreeMap<String, Option<String>>,
) -> Result<BTreeMap<String, String>, EnvOverrideError> {
    let guarded = recipe.hardware.name.is_mi300_class();
    let mut env = recipe.train.env.clone();
    for (key, value) in overrides {
        if !is_env_key(key) {
            return Err(EnvOverrideError::InvalidKey { key: key.clone() });
        }
        let mandatory = guarded && MANDATORY_ROCM_ENV_KEYS.contains(&key.as_str());
        match value {
            None if mandatory => {
                return Err(EnvOverrideError::RemovesMandatoryKey { key: key.clone() });
            }
            Some(v) if mandatory && v.trim().is_empty() => {
                return Err(EnvOverrideError::EmptiesMandatoryKey { key: key.clone() });
            }
            // Kernels built for another arch would not load: the recipe's check, kept.
            Some(v) if mandatory && key == "PYTORCH_ROCM_ARCH" && !lists_arch(v, &recipe.hardware.arch) => {
                return Err(EnvOverrideError::DropsHardwareArch {
                    value: v.clone(),
                    arch: recipe.hardware.arch.clone(),
                });
            }
            None => {
                env.remove(key);
            }
            Some(v) => {
                env.insert(key.clone(), v.clone());
            }
        }
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::is_env_key;

    #[test]
    fn env_key_syntax() {
        assert!(is_env_key("NCCL_MIN_NCHANNELS"));
        assert!(is_env_key("_X1"));
        assert!(!is_env_key("1X"));
        assert!(!is_env_key("lower"));
        assert!(!is_env_key(""));
        assert!(!is_env_key("A-B"));
    }
}
