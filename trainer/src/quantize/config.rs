//! The `quantization_config` of config.json, in compressed-tensors' schema (the dump of its
//! `QuantizationConfig` for the `FP8_DYNAMIC` preset, as llm-compressor saves it): FP8 weights
//! with static scales, FP8 activations scaled per token at run time (`dynamic`, so nothing is
//! calibrated), `float-quantized` storage, kept Linears in `ignore`.

use serde_json::{Value, json};

use super::Granularity;
use super::QuantizeError;
use crate::recipe::{QuantScheme, Quantize};

/// What `quantize: fp8` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Options {
    pub weights: Granularity,
}

impl Default for Fp8Options {
    fn default() -> Self {
        Fp8Options { weights: Granularity::Channel }
    }
}

impl Fp8Options {
    /// The options of a recipe's `quantize` section (its scheme must be `fp8`: `recipe check`
    /// refuses the others by name, this refuses them again for a recipe that skipped the check).
    pub fn from_recipe(q: &Quantize) -> Result<Fp8Options, QuantizeError> {
        if q.scheme != QuantScheme::Fp8 {
            let name =
                serde_json::to_value(q.scheme).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
            return Err(QuantizeError::NotBuilt(format!("quantize.scheme {name} is not built: fp8 is")));
        }
        let weights = if q.per_channel { Granularity::Channel } else { Granularity::Tensor };
        Ok(Fp8Options { weights })
    }
}

/// The scheme's name in events and messages.
pub const SCHEME: &str = "fp8";

/// `quantization_config` for weights scaled per `granularity`, `ignore` the kept Linears.
pub fn quantization_config(options: Fp8Options, ignore: &[String]) -> Value {
    let args = |strategy: &str, dynamic: bool| {
        json!({
            "num_bits": 8, "type": "float", "symmetric": true, "group_size": null,
            "strategy": strategy, "dynamic": dynamic,
        })
    };
    json!({
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": args(options.weights.strategy(), false),
                "input_activations": args("token", true),
                "output_activations": null,
                "format": null,
            }
        },
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": null,
        "format": "float-quantized",
        "quantization_status": "compressed",
        "global_compression_ratio": null,
        "ignore": ignore,
    })
}
