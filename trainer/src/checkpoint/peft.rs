//! LoRA adapters in PEFT's layout: `adapter_config.json` + `adapter_model.safetensors`, tensor
//! names `base_model.model.<module>.lora_A.weight` (`[r, in]`) and `.lora_B.weight`
//! (`[out, r]`), without the `.default` adapter name PEFT uses in memory. Adapters on a
//! Qwen3-MoE layer's stacked expert weights are PEFT's `target_parameters` ones, under
//! `<layer>.mlp.experts[.base_layer]` with `A` `[E·r, in]` and `B` `[out, r·E]`
//! (`model::expert_adapter_name`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::CheckpointError;
use super::durable::StagedDir;
use super::error::io;
use super::safetensors_file::{read_safetensors, write_safetensors};
use crate::recipe::{Lora, TargetModule};

pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The Qwen3-MoE experts' fused gate/up weight, as `target_parameters` names it, and the
/// `rank_pattern` / `alpha_pattern` key PEFT writes for it.
const FUSED: &str = "gate_up_proj";
const FUSED_PATTERN: &str = r".*\.gate_up_proj";
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
const PREFIX: &str = "base_model.model.";

/// The fields of PEFT's `LoraConfig` that describe our adapters; the rest are written with
/// PEFT's defaults so PEFT loads the file unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterConfig {
    pub peft_type: String,
    pub task_type: String,
    pub base_model_name_or_path: Option<String>,
    pub r: u32,
    pub lora_alpha: u32,
    pub lora_dropout: f64,
    /// Module names (`q_proj`, ...), sorted.
    pub target_modules: Vec<String>,
    pub bias: String,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    #[serde(default)]
    pub inference_mode: bool,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    pub layers_pattern: Option<serde_json::Value>,
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default = "yes")]
    pub init_lora_weights: serde_json::Value,
    #[serde(default)]
    pub revision: Option<String>,
    /// Parameters adapted directly (PEFT's `target_parameters`): a Qwen3-MoE sparse layer's
    /// stacked expert weights, `gate_up_proj` and `down_proj` (matched against the end of a
    /// parameter's name). Absent for a model without sparse layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_parameters: Option<Vec<String>>,
}

fn yes() -> serde_json::Value {
    serde_json::Value::Bool(true)
}

pub(crate) fn module_name(m: TargetModule) -> &'static str {
    match m {
        TargetModule::QProj => "q_proj",
        TargetModule::KProj => "k_proj",
        TargetModule::VProj => "v_proj",
        TargetModule::OProj => "o_proj",
        TargetModule::GateProj => "gate_proj",
        TargetModule::UpProj => "up_proj",
        TargetModule::DownProj => "down_proj",
        TargetModule::InProjQkv => "in_proj_qkv",
        TargetModule::InProjZ => "in_proj_z",
        TargetModule::InProjB => "in_proj_b",
        TargetModule::InProjA => "in_proj_a",
        TargetModule::OutProj => "out_proj",
        TargetModule::SharedExpertGate => "shared_expert_gate",
    }
}

impl AdapterConfig {
    pub fn from_recipe(lora: &Lora, base_model_name_or_path: Option<String>) -> Self {
        let mut target_modules: Vec<String> = lora.target_modules.iter().map(|m| module_name(*m).to_string()).collect();
        target_modules.sort();
        target_modules.dedup();
        AdapterConfig {
            peft_type: "LORA".into(),
            task_type: "CAUSAL_LM".into(),
            base_model_name_or_path,
            r: lora.r,
            lora_alpha: lora.alpha,
            lora_dropout: lora.dropout,
            target_modules,
            bias: "none".into(),
            use_rslora: lora.rslora,
            use_dora: false,
            fan_in_fan_out: false,
            inference_mode: true,
            modules_to_save: None,
            layers_to_transform: None,
            layers_pattern: None,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            init_lora_weights: yes(),
            revision: None,
            target_parameters: None,
        }
    }

    /// The same, also naming the expert weights adapted (`LoraConfig::target_parameters`; none
    /// leaves the field out, as for a dense model), with the fused gate/up weight's rank and alpha
    /// doubled as PEFT's own conversion of `gate_proj` + `up_proj` targets writes them.
    pub fn with_target_parameters(mut self, parameters: Vec<String>) -> Self {
        if parameters.iter().any(|p| p == FUSED) {
            self.rank_pattern.insert(FUSED_PATTERN.into(), (2 * self.r).into());
            self.alpha_pattern.insert(FUSED_PATTERN.into(), (2 * self.lora_alpha).into());
        }
        self.target_parameters = (!parameters.is_empty()).then_some(parameters);
        self
    }

    /// The expert weights adapted, as written (`mlp.experts.` prefixes taken off).
    pub fn expert_parameters(&self) -> Vec<&str> {
        self.target_parameters.iter().flatten().map(|p| p.strip_prefix("mlp.experts.").unwrap_or(p)).collect()
    }

    /// Rank and alpha patterns are only the fused gate/up weight's doubling.
    fn patterns_are_the_fused_doubling(&self) -> bool {
        if self.rank_pattern.is_empty() && self.alpha_pattern.is_empty() {
            return true;
        }
        let one = |m: &BTreeMap<String, serde_json::Value>, v: u32| {
            m.len() == 1 && m.get(FUSED_PATTERN).and_then(|x| x.as_u64()) == Some(2 * u64::from(v))
        };
        one(&self.rank_pattern, self.r)
            && one(&self.alpha_pattern, self.lora_alpha)
            && self.expert_parameters().contains(&FUSED)
    }

    /// `adapter_config.json` as written: pretty JSON and a newline.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut text = serde_json::to_string_pretty(self).expect("config always serializes");
        text.push('\n');
        text.into_bytes()
    }

    /// The factor on `B A x`: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA (PEFT's `scaling`).
    pub fn scaling(&self) -> f64 {
        let r = self.r as f64;
        self.lora_alpha as f64 / if self.use_rslora { r.sqrt() } else { r }
    }

    fn check(&self) -> Result<(), String> {
        let unsupported = [
            (self.peft_type != "LORA", "peft_type must be LORA"),
            (self.bias != "none", "only bias \"none\" is supported"),
            (self.use_dora, "DoRA is not supported"),
            (self.fan_in_fan_out, "fan_in_fan_out is not supported"),
            (
                !self.patterns_are_the_fused_doubling(),
                "rank/alpha patterns are not supported (but for PEFT's doubling of the fused experts' gate_up_proj)",
            ),
            (self.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()), "modules_to_save is not supported"),
            (self.r == 0, "r must be > 0"),
        ];
        match unsupported.iter().find(|(bad, _)| *bad) {
            Some((_, why)) => Err(why.to_string()),
            None => Ok(()),
        }
    }
}

/// Checks names and shapes of adapter tensors: every module has an A `[r, in]` and a B
/// `[out, r]`, its projection is a target module, and no name carries `.default`.
fn check_tensors(config: &AdapterConfig, tensors: &BTreeMap<String, Tensor>) -> Result<(), CheckpointError> {
    let bad = |name: &str, reason: String| Err(CheckpointError::BadAdapterTensor { name: name.to_string(), reason });
    let r = config.r as usize;
    let mut a_modules = BTreeSet::new();
    let mut b_modules = BTreeSet::new();
    for (name, t) in tensors {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return bad(name, format!("does not start with `{PREFIX}`"));
        };
        if rest.split('.').any(|part| part == "default") {
            return bad(name, "saved names carry no adapter name (`.default`)".into());
        }
        let (module, is_a) = if let Some(m) = rest.strip_suffix(".lora_A.weight") {
            (m, true)
        } else if let Some(m) = rest.strip_suffix(".lora_B.weight") {
            (m, false)
        } else {
            return bad(name, "is neither `.lora_A.weight` nor `.lora_B.weight`".into());
        };
        let dims = t.dims();
        // An expert weight's adapter: `r` rows (A) or columns (B) per expert.
        if module.ends_with(".mlp.experts") || module.ends_with(".mlp.experts.base_layer") {
            if config.target_parameters.as_ref().is_none_or(|p| p.is_empty()) {
                return bad(name, "adapts the experts, but the config has no target_parameters".into());
            }
            let ranks = if is_a { dims.first() } else { dims.get(1) };
            if dims.len() != 2 || ranks.is_none_or(|&n| n == 0 || n % r != 0) {
                let want = if is_a { format!("[experts·{r}, in]") } else { format!("[out, {r}·experts]") };
                return bad(name, format!("shape {dims:?}, expected {want}"));
            }
        } else {
            let projection = module.rsplit('.').next().unwrap_or(module);
            if !config.target_modules.iter().any(|m| m == projection) {
                return bad(name, format!("`{projection}` is not in target_modules {:?}", config.target_modules));
            }
            let ok = dims.len() == 2 && if is_a { dims[0] == r } else { dims[1] == r };
            if !ok {
                let want = if is_a { format!("[{r}, in]") } else { format!("[out, {r}]") };
                return bad(name, format!("shape {dims:?}, expected {want}"));
            }
        }
        if is_a {
            a_modules.insert(module)
        } else {
            b_modules.insert(module)
        };
    }
    if let Some(m) = a_modules.symmetric_difference(&b_modules).next() {
        return bad(&format!("{PREFIX}{m}"), "has only one of lora_A / lora_B".into());
    }
    Ok(())
}

/// Writes the adapter in PEFT layout into `dir` (tensors in their own dtype).
pub fn save_peft_adapter(
    dir: &mut StagedDir,
    config: &AdapterConfig,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<(), CheckpointError> {
    let path = dir.target_path().join(ADAPTER_CONFIG_FILE);
    config.check().map_err(|reason| CheckpointError::BadAdapterConfig { path, reason })?;
    check_tensors(config, tensors)?;
    dir.write_file(ADAPTER_CONFIG_FILE, &config.to_json_bytes())?;
    let list: Vec<(&str, &Tensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    dir.write_with(ADAPTER_WEIGHTS_FILE, |w| write_safetensors(w, &list, None, &meta).map(|_| ()))
}

/// Reads a PEFT adapter directory (ours or PEFT's), tensors as f32 on `device`, named over our
/// model whether saved over a released base or not.
pub fn load_peft_adapter(
    dir: &Path,
    device: &Device,
) -> Result<(AdapterConfig, BTreeMap<String, Tensor>), CheckpointError> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = std::fs::read(&path).map_err(io(&path))?;
    let config: AdapterConfig = serde_json::from_slice(&text)
        .map_err(|e| CheckpointError::BadAdapterConfig { path: path.clone(), reason: e.to_string() })?;
    config.check().map_err(|reason| CheckpointError::BadAdapterConfig { path, reason })?;
    let tensors = read_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), Some(DType::F32), device)?;
    // Saved over a released Qwen3.5/3.6 base, its modules sit under `model.language_model`.
    let tensors = tensors.into_iter().map(|(n, t)| (super::released::our_adapter_name(&n), t)).collect();
    check_tensors(&config, &tensors)?;
    Ok((config, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(r: usize) -> BTreeMap<String, Tensor> {
        let t = |rows: usize, cols: usize, s: f32| {
            Tensor::from_vec((0..rows * cols).map(|i| i as f32 * s).collect(), (rows, cols), &Device::Cpu).unwrap()
        };
        let m = "base_model.model.model.layers.0.self_attn.q_proj";
        BTreeMap::from([(format!("{m}.lora_A.weight"), t(r, 8, 0.01)), (format!("{m}.lora_B.weight"), t(8, r, -0.02))])
    }

    fn config(r: u32) -> AdapterConfig {
        AdapterConfig::from_recipe(&Lora { r, alpha: 16, ..Lora::default() }, Some("tiny-qwen3".into()))
    }

    #[test]
    fn round_trip_and_peft_fields() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = StagedDir::create(&root.path().join("a")).unwrap();
        save_peft_adapter(&mut dir, &config(4), &adapter(4)).unwrap();
        let files = dir.commit().unwrap();
        assert_eq!(
            files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.path().join("a").join(ADAPTER_CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(json["peft_type"], "LORA");
        assert_eq!(json["task_type"], "CAUSAL_LM");
        assert_eq!(json["bias"], "none");
        assert_eq!(json["r"], 4);
        assert_eq!(json["target_modules"][0], "down_proj");
        let (cfg, tensors) = load_peft_adapter(&root.path().join("a"), &Device::Cpu).unwrap();
        assert_eq!(cfg, config(4));
        assert_eq!(cfg.scaling(), 4.0);
        for (name, t) in adapter(4) {
            assert_eq!(tensors[&name].to_vec2::<f32>().unwrap(), t.to_vec2::<f32>().unwrap());
        }
    }

    #[test]
    fn malformed_adapters_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = StagedDir::create(&root.path().join("a")).unwrap();
        let wrong_rank = save_peft_adapter(&mut dir, &config(2), &adapter(4));
        assert!(matches!(wrong_rank, Err(CheckpointError::BadAdapterTensor { .. })));
        let mut lonely = adapter(4);
        lonely.retain(|k, _| k.ends_with("lora_A.weight"));
        assert!(save_peft_adapter(&mut dir, &config(4), &lonely).is_err());
        let with_default: BTreeMap<_, _> =
            adapter(4).into_iter().map(|(k, v)| (k.replace("lora_A.weight", "lora_A.default.weight"), v)).collect();
        assert!(save_peft_adapter(&mut dir, &config(4), &with_default).is_err());
        let mut untargeted = config(4);
        untargeted.target_modules = vec!["v_proj".into()];
        assert!(save_peft_adapter(&mut dir, &untargeted, &adapter(4)).is_err());
        let mut dora = config(4);
        dora.use_dora = true;
        assert!(matches!(
            save_peft_adapter(&mut dir, &dora, &adapter(4)),
            Err(CheckpointError::BadAdapterConfig { .. })
        ));
    }

    /// Expert adapters: `target_parameters` and PEFT's doubling of the fused gate/up weight's rank
    /// and alpha written and read back; any other pattern, an expert tensor without
    /// `target_parameters`, or one whose rows are not a multiple of r, refused.
    #[test]
    fn expert_adapters_carry_target_parameters_and_the_fused_doubling() {
        let root = tempfile::tempdir().unwrap();
        let experts = |e: usize, r: usize| {
            let t = |rows: usize, cols: usize| Tensor::zeros((rows, cols), DType::F32, &Device::Cpu).unwrap();
            let m = "base_model.model.model.layers.0.mlp.experts";
            BTreeMap::from([
                (format!("{m}.base_layer.lora_A.weight"), t(e * 2 * r, 8)),
                (format!("{m}.base_layer.lora_B.weight"), t(12, 2 * r * e)),
                (format!("{m}.lora_A.weight"), t(e * r, 6)),
                (format!("{m}.lora_B.weight"), t(8, r * e)),
            ])
        };
        let c = config(4).with_target_parameters(vec!["gate_up_proj".into(), "down_proj".into()]);
        assert_eq!(c.rank_pattern.get(FUSED_PATTERN), Some(&serde_json::Value::from(8)));
        assert_eq!(c.alpha_pattern.get(FUSED_PATTERN), Some(&serde_json::Value::from(32)));
        let mut dir = StagedDir::create(&root.path().join("e")).unwrap();
        save_peft_adapter(&mut dir, &c, &experts(3, 4)).unwrap();
        dir.commit().unwrap();
        let (back, tensors) = load_peft_adapter(&root.path().join("e"), &Device::Cpu).unwrap();
        assert_eq!((back, tensors.len()), (c.clone(), 4));
        let text = String::from_utf8(c.to_json_bytes()).unwrap();
        assert!(text.contains(r#"".*\\.gate_up_proj": 8"#), "PEFT's key, JSON-escaped: {text}");
        // A dense adapter's config has no target_parameters field at all.
        assert!(!String::from_utf8(config(4).to_json_bytes()).unwrap().contains("target_parameters"));
        let mut other = c.clone();
        other.rank_pattern.insert("q_proj".into(), 2.into());
        assert!(other.check().unwrap_err().contains("patterns"));
        let mut dir = StagedDir::create(&root.path().join("f")).unwrap();
        assert!(save_peft_adapter(&mut dir, &config(4), &experts(3, 4)).is_err(), "experts need target_parameters");
        let ragged = BTreeMap::from([
            (
                "base_model.model.model.layers.0.mlp.experts.lora_A.weight".to_string(),
                Tensor::zeros((7, 6), DType::F32, &Device::Cpu).unwrap(),
            ),
            (
                "base_model.model.model.layers.0.mlp.experts.lora_B.weight".to_string(),
                Tensor::zeros((8, 7), DType::F32, &Device::Cpu).unwrap(),
            ),
        ]);
        let down = config(4).with_target_parameters(vec!["down_proj".into()]);
        assert!(save_peft_adapter(&mut dir, &down, &ragged).is_err(), "7 rows are not experts × 4");
    }

    #[test]
    fn rslora_scaling() {
        let mut c = config(16);
        c.use_rslora = true;
        assert_eq!(c.scaling(), 4.0);
    }
}
