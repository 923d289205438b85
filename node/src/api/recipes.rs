//! Recipes over HTTP: the embedded ones and those registered here, each resolved with its
//! defaults; YAML validated with every error located (file, line, column, field); a recipe
//! registered (`recipe.registered`, its bytes kept under `node-dir/recipes/<blake3>.yaml`).

use std::path::Path as FsPath;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mindxtrain_trainer::recipe::{LoadedRecipe, Recipe, RecipeErrors};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiState;
use super::records::{seqs_of, unreadable};
use crate::recipes::{EMBEDDED_RECIPES, RECIPE_REGISTERED, stored_path};
use crate::serve::openai::ApiError;

/// Names a recipe in a request: an embedded one, one registered here (by its BLAKE3), or
/// YAML text with the name its errors should carry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeRef {
    /// An embedded recipe's file name (`tiny_cpu_pretrain.yaml`) or a registered recipe's blake3.
    pub recipe: Option<String>,
    pub yaml: Option<String>,
    pub name: Option<String>,
}

impl RecipeRef {
    /// The recipe's name and text.
    pub fn source(&self, node_dir: &FsPath) -> Result<(String, String), ApiError> {
        match (&self.recipe, &self.yaml) {
            (Some(name), None) => lookup(node_dir, name).ok_or_else(|| {
                ApiError::invalid("recipe", format!("no recipe {name} here (GET /api/recipes lists them)"))
            }),
            (None, Some(yaml)) => Ok((self.name.clone().unwrap_or_else(|| "recipe.yaml".into()), yaml.clone())),
            _ => Err(ApiError::invalid("recipe", "give either `recipe` (a name from GET /api/recipes) or `yaml`")),
        }
    }

    /// The recipe's name and text, checked.
    pub fn load(&self, node_dir: &FsPath) -> Result<(String, String, LoadedRecipe), Rejected> {
        let (name, src) = self.source(node_dir).map_err(|e| Rejected::Unknown(Box::new(e)))?;
        let loaded = Recipe::check_str(&src, &name).map_err(Rejected::Invalid)?;
        Ok((name, src, loaded))
    }
}

/// Why a recipe in a request was refused: a 400 either way, every error located.
pub enum Rejected {
    Unknown(Box<ApiError>),
    Invalid(RecipeErrors),
}

impl IntoResponse for Rejected {
    fn into_response(self) -> Response {
        match self {
            Rejected::Unknown(e) => e.into_response(),
            Rejected::Invalid(errors) => invalid_recipe(&errors),
        }
    }
}

/// An embedded recipe by file name, or a registered one by its hex BLAKE3.
fn lookup(node_dir: &FsPath, name: &str) -> Option<(String, String)> {
    if let Some((n, s)) = EMBEDDED_RECIPES.iter().find(|(n, _)| *n == name) {
        return Some(((*n).to_owned(), (*s).to_owned()));
    }
    let digest: [u8; 32] = hex::decode(name).ok()?.try_into().ok()?;
    let text = std::fs::read_to_string(stored_path(node_dir, &digest)).ok()?;
    (*blake3::hash(text.as_bytes()).as_bytes() == digest).then(|| (format!("{name}.yaml"), text))
}

/// The recipe errors as `{path, line, column, message}` objects.
pub fn error_list(errors: &RecipeErrors) -> Vec<Value> {
    errors
        .iter()
        .map(|e| {
            let loc = e.location();
            json!({"path": e.path(), "line": loc.map(|l| l.line), "column": loc.map(|l| l.column),
                "message": e.message(), "text": e.to_string()})
        })
        .collect()
}

/// 400 with every recipe error, located (and how many more were left out).
pub fn invalid_recipe(errors: &RecipeErrors) -> Response {
    let body = json!({"error": {"message": errors.to_string(), "type": "invalid_request_error",
        "code": "invalid_recipe", "param": "recipe"}, "errors": error_list(errors), "omitted": errors.omitted()});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn summary(name: &str, l: &LoadedRecipe) -> Value {
    json!({"name": name, "blake3": hex::encode(l.bytes_blake3), "run_name": l.recipe.meta.run_name,
        "method": serde_json::to_value(&l.recipe.train.method).ok().and_then(|m| m.get("kind").cloned()),
        "valid": true})
}

/// `GET /api/recipes`: the embedded recipes, each checked, and those registered here.
pub async fn list(State(s): State<Arc<ApiState>>) -> Result<Json<Value>, ApiError> {
    let embedded: Vec<Value> = s
        .cpu
        .run(|| {
            EMBEDDED_RECIPES
                .iter()
                .map(|(name, src)| match Recipe::check_str(src, name) {
                    Ok(l) => summary(name, &l),
                    Err(e) => json!({"name": name, "valid": false, "errors": error_list(&e)}),
                })
                .collect()
        })
        .await?;
    let s2 = s.clone();
    let seqs = tokio::task::spawn_blocking(move || seqs_of(&s2, &[RECIPE_REGISTERED])).await.map_err(unreadable)??;
    let mut registered = Vec::new();
    for seq in seqs {
        let ev = s.log.get(seq).map_err(unreadable)?;
        registered.push(json!({"seq": seq, "time": ev.envelope.time, "blake3": ev.envelope.subject,
            "file": ev.envelope.data.get("file"), "run_name": ev.envelope.data.get("name"),
            "method": ev.envelope.data.get("method")}));
    }
    Ok(Json(json!({"recipes": embedded, "registered": registered})))
}

/// `GET /api/recipes/{name}`: one recipe (embedded name or registered blake3) resolved with
/// every default filled in, and its text.
pub async fn show(State(s): State<Arc<ApiState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let (name, src) = lookup(&s.node_dir, &name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "recipe_not_found",
            format!("no recipe {name} here"),
        )
    })?;
    let body = s
        .cpu
        .run(move || match Recipe::check_str(&src, &name) {
            Ok(l) => serde_json::to_value(&l.recipe)
                .map(|resolved| json!({"summary": summary(&name, &l), "resolved": resolved, "yaml": src})),
            Err(e) => Ok(json!({"summary": {"name": name, "valid": false}, "errors": error_list(&e), "yaml": src})),
        })
        .await?;
    body.map(Json).map_err(unreadable)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidateRequest {
    yaml: String,
    name: Option<String>,
}

/// `POST /api/recipes/validate`: `{yaml, name}` → `{valid, errors: [{path, line, column, message}],
/// omitted}`. Open to anyone, so it computes on the [`CpuPool`](super::cpu::CpuPool).
pub async fn validate(
    State(s): State<Arc<ApiState>>,
    Json(req): Json<ValidateRequest>,
) -> Result<Json<Value>, ApiError> {
    let name = req.name.unwrap_or_else(|| "recipe.yaml".into());
    let body = s
        .cpu
        .run(move || match Recipe::check_str(&req.yaml, &name) {
            Ok(l) => json!({"valid": true, "errors": [], "omitted": 0, "blake3": hex::encode(l.bytes_blake3)}),
            Err(e) => json!({"valid": false, "errors": error_list(&e), "omitted": e.omitted()}),
        })
        .await?;
    Ok(Json(body))
}

/// `POST /api/recipes`: `{yaml, name}` registered: the bytes kept for later launches by
/// digest, then `recipe.registered` in the log (once per digest). 201 when new, 200 when known.
pub async fn register(State(s): State<Arc<ApiState>>, Json(req): Json<ValidateRequest>) -> Response {
    let name = req.name.unwrap_or_else(|| "recipe.yaml".into());
    let (log, dir, yaml) = (s.log.clone(), s.node_dir.clone(), req.yaml);
    // Checking, storing and the append's wait all happen on the pool's thread.
    let done = s
        .cpu
        .run(move || {
            let loaded = Recipe::check_str(&yaml, &name).map_err(Rejected::Invalid)?;
            let stored = crate::recipes::store(&dir, &loaded.bytes_blake3, &yaml);
            stored.map_err(|e| Rejected::Unknown(Box::new(unreadable(format!("keeping the recipe: {e}")))))?;
            match crate::recipes::record(&log, &name, &yaml, loaded) {
                Ok(r) => Ok((name, r)),
                Err(e) => Err(Rejected::Unknown(Box::new(unreadable(e)))),
            }
        })
        .await;
    match done {
        Ok(Ok((name, r))) => {
            let status = if r.already { StatusCode::OK } else { StatusCode::CREATED };
            (status, Json(json!({"seq": r.seq, "already": r.already, "recipe": summary(&name, &r.loaded)})))
                .into_response()
        }
        Ok(Err(rejected)) => rejected.into_response(),
        Err(e) => e.into_response(),
    }
}
