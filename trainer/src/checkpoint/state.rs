//! What a resumed run needs besides the weights: the update count, the optimizer's tensors,
//! the caller's RNG state and data cursor, and the hashes of the recipe and plan it ran under.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::CheckpointError;
use super::durable::StagedDir;
use super::error::io;
use super::safetensors_file::{read_safetensors, write_safetensors};

pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const FORMAT: &str = "mindxtrain.trainer_state.v1";

#[derive(Debug, Clone)]
pub struct TrainingState {
    /// Optimizer updates taken.
    pub step: u64,
    /// The recipe's name of the optimizer whose state `optimizer` holds (`adamw`, `lion`, ...):
    /// a resume refuses another optimizer, which would misread it.
    pub optimizer_name: String,
    /// The optimizer's state tensors (`optim::Optimizer::state_tensors`), stored as given.
    pub optimizer: BTreeMap<String, Tensor>,
    /// The caller's RNG state, opaque here.
    pub rng: Vec<u8>,
    /// Where the data pipeline stands, opaque here.
    pub data_cursor: serde_json::Value,
    pub recipe_hash: String,
    pub plan_hash: String,
    /// Ranks the run had when it saved this (1: one process). A resume at another world size
    /// may bring another plan (measured for it); at the same size the plan must be the same.
    pub world_size: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    format: String,
    step: u64,
    /// Absent in checkpoints saved before runs could choose their optimizer: all AdamW's.
    #[serde(default = "adamw")]
    optimizer: String,
    recipe_hash: String,
    plan_hash: String,
    /// Lowercase hex.
    rng: String,
    data_cursor: serde_json::Value,
    /// Absent for one process (and in checkpoints saved before runs had ranks).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    world_size: u64,
}

fn adamw() -> String {
    "adamw".into()
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

/// Writes `trainer_state.json` and `optimizer.safetensors` into `dir`.
pub fn save_training_state(dir: &mut StagedDir, state: &TrainingState) -> Result<(), CheckpointError> {
    let file = StateFile {
        format: FORMAT.into(),
        step: state.step,
        optimizer: state.optimizer_name.clone(),
        recipe_hash: state.recipe_hash.clone(),
        plan_hash: state.plan_hash.clone(),
        rng: state.rng.iter().map(|b| format!("{b:02x}")).collect(),
        data_cursor: state.data_cursor.clone(),
        world_size: state.world_size,
    };
    let mut text = serde_json::to_string_pretty(&file).expect("state always serializes");
    text.push('\n');
    dir.write_file(STATE_FILE, text.as_bytes())?;
    let list: Vec<(&str, &Tensor)> = state.optimizer.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let meta = BTreeMap::from([("format".to_string(), FORMAT.to_string())]);
    dir.write_with(OPTIMIZER_FILE, |w| write_safetensors(w, &list, None, &meta).map(|_| ()))
}

/// Reads what [`save_training_state`] wrote; optimizer tensors come back on the CPU as stored.
pub fn load_training_state(dir: &Path) -> Result<TrainingState, CheckpointError> {
    let path = dir.join(STATE_FILE);
    let bad = |reason: String| CheckpointError::BadState { path: path.clone(), reason };
    let text = std::fs::read(&path).map_err(io(&path))?;
    let file: StateFile = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    if file.format != FORMAT {
        return Err(bad(format!("format `{}`, expected `{FORMAT}`", file.format)));
    }
    let rng = decode_hex(&file.rng).ok_or_else(|| bad("rng is not lowercase hex".into()))?;
    let optimizer = read_safetensors(&dir.join(OPTIMIZER_FILE), None, &Device::Cpu)?;
    Ok(TrainingState {
        step: file.step,
        optimizer_name: file.optimizer,
        optimizer,
        rng,
        data_cursor: file.data_cursor,
        recipe_hash: file.recipe_hash,
        plan_hash: file.plan_hash,
        world_size: file.world_size,
    })
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes().chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> TrainingState {
        TrainingState {
            step: 42,
            optimizer_name: "lion".into(),
            optimizer: BTreeMap::from([
                ("exp_avg.w".to_string(), Tensor::new(&[0.5f32, -1.0], &Device::Cpu).unwrap()),
                ("step".to_string(), Tensor::new(42i64, &Device::Cpu).unwrap()),
            ]),
            rng: vec![0, 1, 0xab, 0xff],
            data_cursor: serde_json::json!({"epoch": 1, "offset": 1234}),
            recipe_hash: "r".repeat(64),
            plan_hash: "p".repeat(64),
            world_size: 3,
        }
    }

    #[test]
    fn round_trip() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = StagedDir::create(&root.path().join("s")).unwrap();
        save_training_state(&mut dir, &state()).unwrap();
        dir.commit().unwrap();
        let back = load_training_state(&root.path().join("s")).unwrap();
        let want = state();
        assert_eq!((back.step, &back.rng, &back.data_cursor), (want.step, &want.rng, &want.data_cursor));
        assert_eq!((back.recipe_hash, back.plan_hash), (want.recipe_hash, want.plan_hash));
        assert_eq!(back.world_size, 3);
        assert_eq!(back.optimizer_name, "lion");
        assert_eq!(back.optimizer["exp_avg.w"].to_vec1::<f32>().unwrap(), [0.5, -1.0]);
        assert_eq!(back.optimizer["step"].to_scalar::<i64>().unwrap(), 42);
    }

    #[test]
    fn a_checkpoint_that_names_no_optimizer_is_adamw_s() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = StagedDir::create(&root.path().join("s")).unwrap();
        save_training_state(&mut dir, &state()).unwrap();
        dir.commit().unwrap();
        let path = root.path().join("s").join(STATE_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"optimizer\": \"lion\""), "{text}");
        std::fs::write(&path, text.replace("  \"optimizer\": \"lion\",\n", "")).unwrap();
        assert_eq!(load_training_state(&root.path().join("s")).unwrap().optimizer_name, "adamw");
    }

    #[test]
    fn damaged_state_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = StagedDir::create(&root.path().join("s")).unwrap();
        save_training_state(&mut dir, &state()).unwrap();
        dir.commit().unwrap();
        let path = root.path().join("s").join(STATE_FILE);
        let good = std::fs::read_to_string(&path).unwrap();
        for bad in [good.replace("\"0001abff\"", "\"xyz\""), good.replace(FORMAT, "other"), "{".into()] {
            std::fs::write(&path, bad).unwrap();
            assert!(matches!(load_training_state(&root.path().join("s")), Err(CheckpointError::BadState { .. })));
        }
        std::fs::write(&path, good).unwrap();
        std::fs::remove_file(root.path().join("s").join(OPTIMIZER_FILE)).unwrap();
        assert!(matches!(load_training_state(&root.path().join("s")), Err(CheckpointError::Io { .. })));
    }
}
