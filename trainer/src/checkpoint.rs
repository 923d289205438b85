//! Weights in and out: HF safetensors (single and sharded), PEFT adapters, training state, and
//! whole models loaded onto a device ([`load_checkpoint`], [`load_base`]).
//!
//! * [`WeightFiles`] reads an HF model directory (`model.safetensors` or a sharded
//!   `model.safetensors.index.json`), converting bf16/f16/f32 to the dtype asked for.
//! * [`ReleasedLayout`]: the released Qwen3.5/3.6 multimodal checkpoints, their text model
//!   loaded and written back beside the vision tower and MTP layer copied byte for byte.
//! * A checkpoint is written into a [`StagedDir`] and appears at its final path only when
//!   [`StagedDir::commit`] has synced every file and renamed the directory: after a crash at
//!   any point a checkpoint directory is either complete or absent. [`publish_latest`] moves
//!   the `latest` pointer the same way.
//! * Every file written is listed with its size and BLAKE3 ([`FileDigest`]), for the
//!   `checkpoint.saved` event; safetensors output is byte-deterministic (sorted names, fixed
//!   metadata), so identical weights give identical digests.

mod durable;
mod error;
mod hf;
mod load;
mod peft;
mod released;
mod safetensors_file;
mod state;

pub use durable::{FileDigest, StagedDir, latest, prune, publish_latest};
pub use error::CheckpointError;
pub use hf::{
    CONFIG_FILE, DEFAULT_MAX_SHARD_BYTES, INDEX_FILE, SINGLE_FILE, WeightFiles, load_hf_weights, save_hf_model,
    write_weight_file,
};
pub use load::{
    LoadError, digest_file, is_adapter, load_adapter, load_adapter_tensors, load_base, load_checkpoint, load_hf_model,
    model_dtype,
};
pub use peft::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterConfig, load_peft_adapter, save_peft_adapter};
pub use released::{
    RELEASED_TEXT_PREFIX, ReleasedLayout, released_adapter_names, released_name, released_source, text_name,
};
pub use safetensors_file::{read_safetensors, safetensors_bytes};
pub use state::{OPTIMIZER_FILE, STATE_FILE, TrainingState, load_training_state, save_training_state};
