//! The run's weights in and out: the base it loads, and the checkpoints and `final/` it writes
//! (a PEFT adapter, or full weights in the HF layout or the released checkpoint's own).

use super::*;

/// Loads the base model from `base` ([`base::check_base_choice`] settled it), else draws it
/// from the seed, with the record of what was loaded.
pub(super) fn load_base_model(
    recipe: &Recipe,
    base: Option<&base::BaseDir>,
    device: &Device,
) -> Result<(CausalLm, BaseRecord), RunError> {
    let (model, files) = checkpoint::load_base(recipe, base.map(|b| b.dir.as_path()), device)?;
    let record = match base {
        Some(b) => b.record(files),
        None => BaseRecord::RandomInit { seed: recipe.meta.seed },
    };
    Ok((model, record))
}

/// A model's full weights with its `config.json`, in the HF layout (a Qwen3-MoE model's
/// experts one tensor each, as transformers itself writes them), or written back into the
/// released checkpoint `released` it was loaded from (a Qwen3.5/3.6 multimodal one).
pub(in crate::run) fn save_model(
    dir: &mut StagedDir,
    model: &CausalLm,
    released: Option<&checkpoint::ReleasedLayout>,
) -> Result<(), RunError> {
    save_params(dir, model, model.params(), released)
}

/// `params` (all of `model`'s weights, maybe gathered from the ranks that shard them) with the
/// model's `config.json`, in the HF layout or `released`'s.
fn save_params(
    dir: &mut StagedDir,
    model: &CausalLm,
    params: &crate::model::Params,
    released: Option<&checkpoint::ReleasedLayout>,
) -> Result<(), RunError> {
    let dtype = model.dtype();
    if let Some(released) = released {
        released.save(dir, &crate::model::moe::split_experts(model.config(), params)?)?;
        return Ok(());
    }
    let config: Value = serde_json::from_str(&model.config().to_hf_json(torch_dtype(dtype)))
        .map_err(|e| RunError::Recipe(format!("model config: {e}")))?;
    let weights = crate::model::moe::split_experts(model.config(), params)?;
    checkpoint::save_hf_model(dir, &config, &weights, dtype, checkpoint::DEFAULT_MAX_SHARD_BYTES)?;
    Ok(())
}

fn torch_dtype(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

impl Session<'_> {
    /// The weights as a whole model has them: the model's own, or (ZeRO-3) every rank's gathered
    /// on rank 0 (`None` on the others, which take part in the gather).
    pub(super) fn whole_weights(&self) -> Result<Option<std::borrow::Cow<'_, crate::model::Params>>, RunError> {
        let gathered = match &self.ranks {
            Some(r) => r.gather_weights(&self.model)?,
            None => None,
        };
        Ok(match gathered {
            _ if !self.writes() => None,
            Some(all) => Some(std::borrow::Cow::Owned(all)),
            None => Some(std::borrow::Cow::Borrowed(self.model.params())),
        })
    }

    pub(super) fn weights_to(
        &self,
        dir: &mut StagedDir,
        weights: Option<&crate::model::Params>,
    ) -> Result<(), RunError> {
        let recipe = &self.spec.recipe.recipe;
        match (&self.adapters, recipe.train.method.adapter()) {
            (Some(a), Some(lora)) => {
                let parameters = a.config.target_parameters(self.model.config());
                let config = checkpoint::AdapterConfig::from_recipe(lora, self.base.name_or_path())
                    .with_target_parameters(parameters);
                match &self.released {
                    Some(_) => {
                        checkpoint::save_peft_adapter(dir, &config, &checkpoint::released_adapter_names(&a.tensors))?
                    }
                    None => checkpoint::save_peft_adapter(dir, &config, &a.tensors)?,
                }
                dir.write_file(BASE_FILE, &self.base.to_bytes())?;
            }
            _ => save_params(dir, &self.model, weights.unwrap_or(self.model.params()), self.released.as_ref())?,
        }
        Ok(())
    }

    /// Whether checkpoints and final/ hold a PEFT adapter (else full weights).
    pub(super) fn saves_adapter(&self) -> bool {
        self.adapters.is_some() && self.spec.recipe.recipe.train.method.adapter().is_some()
    }

    /// Adapters are whole on every rank; full weights may be sharded (ZeRO-3).
    pub(super) fn checkpoint_weights(&self) -> Result<Option<std::borrow::Cow<'_, crate::model::Params>>, RunError> {
        if self.saves_adapter() {
            return Ok(self.writes().then(|| std::borrow::Cow::Borrowed(self.model.params())));
        }
        self.whole_weights()
    }

    pub(super) fn save_checkpoint(&mut self, sink: &mut impl EventSink) -> Result<(), RunError> {
        let dir = self.out.checkpoint_dir(self.step);
        let exists = match &self.ranks {
            Some(r) => r.rank0_value(&[u8::from(self.writes() && dir.exists())])?.first() == Some(&1),
            None => dir.exists(),
        };
        if exists {
            return Ok(());
        }
        // Every rank takes part in gathering sharded state; rank 0 writes it.
        let optimizer = match &self.ranks {
            Some(r) => r.gather_optimizer(&self.optimizer)?,
            None => self.optimizer.state_tensors()?,
        };
        let Some(weights) = self.checkpoint_weights()? else { return Ok(()) };
        let state = TrainingState {
            step: self.step,
            optimizer_name: self.optimizer.name().to_string(),
            optimizer,
            // Every random draw derives from (seed, step) or (seed, epoch): the seed is the
            // whole RNG state.
            rng: self.spec.recipe.recipe.meta.seed.to_le_bytes().to_vec(),
            data_cursor: serde_json::to_value(self.cursor).unwrap_or(Value::Null),
            recipe_hash: self.record.recipe_blake3.clone(),
            plan_hash: self.record.plan_blake3.clone(),
            world_size: self.ranks.as_ref().map_or(1, |r| r.world()) as u64,
        };
        let root = self.out.checkpoints_root();
        std::fs::create_dir_all(&root)
            .map_err(|e| RunError::Io { path: root.display().to_string(), message: e.to_string() })?;
        let mut staged = StagedDir::create(&dir)?;
        self.weights_to(&mut staged, Some(&weights))?;
        checkpoint::save_training_state(&mut staged, &state)?;
        let files = staged.commit()?;
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        checkpoint::publish_latest(&root, &name)?;
        checkpoint::prune(&root, "step-", self.spec.recipe.recipe.train.checkpoint.keep_last as usize)?;
        emit(
            sink,
            "checkpoint.saved",
            &self.record.run_id,
            json!({"run_id": self.record.run_id, "step": self.step, "dir": dir.display().to_string(), "files": files}),
        )
    }

    /// The final weights with their model card (rank 0 writes them; the others take part in
    /// gathering sharded ones).
    pub(super) fn save_final(&self, eval: Option<&EvalReport>) -> Result<Vec<SavedFile>, RunError> {
        let Some(weights) = self.checkpoint_weights()? else { return Ok(Vec::new()) };
        let dir = self.out.final_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| RunError::Io { path: dir.display().to_string(), message: e.to_string() })?;
        }
        let mut staged = StagedDir::create(&dir)?;
        self.weights_to(&mut staged, Some(&weights))?;
        // The tokenizer and chat template beside the weights: the directory loads in
        // transformers (and PEFT) with the ids and prompts it was trained on.
        let max_len = self.spec.recipe.recipe.serve.max_model_len as usize;
        crate::run::export::write_tokenizer(&mut staged, &self.tokenizer, max_len)?;
        let card = crate::run::card::model_card(&crate::run::card::CardFacts {
            recipe: &self.spec.recipe.recipe,
            recipe_dir: &self.spec.recipe_dir,
            base: Some(&self.base),
            adapter: self.saves_adapter(),
            eval,
        });
        staged.write_file(crate::run::card::MODEL_CARD_FILE, card.as_bytes())?;
        Ok(staged.commit()?)
    }
}
