//! Recipes that name their model and data by hub id run from the Hugging Face cache alone
//! (`HF_HUB_CACHE` pointing at a fixture written as huggingface_hub writes it), record the
//! commits they read, pin a revision, and are refused before anything is recorded when the
//! cache lacks what they name; `--init-from DIR` alone finds the tokenizer beside the weights; a
//! `model.config` that contradicts the base is refused naming the field; `mindxtrain fetch`
//! refuses what is not a hub id and reports a hub it cannot reach without printing the token.
//!
//! The fixture is checked against huggingface_hub itself (needs the venv of
//! `scripts/setup-torch`; skipped without it unless MINDXTRAIN_REQUIRE_TORCH is set).

use mindxtrain_tests::hub_cache::{HubFixture, Kind, commit_id, tiny_config};
use mindxtrain_tests::micro::{Node, b3, ok_json, s};
use mindxtrain_tests::{mindxtrain, torch_python};
use mindxtrain_trainer::hub::{HubCache, HubError, RepoKind};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MODEL: &str = "mindxtrain-tests/tiny-qwen3";
const DATASET: &str = "mindxtrain-tests/tiny-chat";
const SPLIT: &str = "train_sft";

/// A cache holding the tiny model (commit `main`, weights from seed 1; and an older commit
/// `v1`, seed 2, tagged `v1`) and the chat dataset (`main`).
struct Cache {
    _tmp: tempfile::TempDir,
    fixture: HubFixture,
    model_main: String,
    model_v1: String,
    dataset_main: String,
}

impl Cache {
    fn new() -> Cache {
        let tmp = tempfile::tempdir().unwrap();
        let fixture = HubFixture::new(&tmp.path().join("hub")).unwrap();
        let (model_main, model_v1, dataset_main) = (commit_id("model main"), commit_id("model v1"), commit_id("data"));
        fixture.add_model(MODEL, &model_v1, &["v1"], &tiny_config(), 2).unwrap();
        fixture.add_model(MODEL, &model_main, &["main"], &tiny_config(), 1).unwrap();
        fixture.add_chat_dataset(DATASET, &dataset_main, &["main"], SPLIT, 40).unwrap();
        Cache { _tmp: tmp, fixture, model_main, model_v1, dataset_main }
    }

    fn root(&self) -> &Path {
        self.fixture.root()
    }

    fn snapshot(&self, kind: Kind, repo: &str, commit: &str) -> PathBuf {
        self.fixture.repo_dir(kind, repo).join("snapshots").join(commit)
    }
}

/// A LoRA recipe whose model is `model` (YAML lines under `model:`, indented two) and whose data
/// is `data` (lines under `data:`).
fn recipe(model: &str, data: &str) -> String {
    format!(
        "meta: {{project: mindxtrain-tests, run_name: hub, seed: 3}}\nhardware: {{name: cpu, gpus: 0}}\n\
         autotune: {{budget_seconds: 2}}\nmodel:\n  family: qwen3\n  dtype: fp32\n{model}data:\n  format: chat\n  \
         seq_len: 64\n{data}train:\n  method: {{kind: lora, r: 4, alpha: 8, target_modules: [q_proj, v_proj]}}\n  \
         optimizer: {{lr: 1.0e-3}}\n  budget: {{max_steps: 2}}\n  batch: {{per_device: 2, grad_accum: 1}}\n  \
         precision: fp32\neval:\n  holdout: {{fraction: 0.1, max_samples: 4}}\nserve:\n  max_model_len: 64\n"
    )
}

fn hub_model(extra: &str) -> String {
    format!("  name: {MODEL}\n{extra}")
}

fn hub_data(extra: &str) -> String {
    format!("  source: hf\n  hf_id: {DATASET}\n  split: {SPLIT}\n{extra}")
}

/// `mindxtrain --json ARGS` on `node` with `HF_HUB_CACHE` at `cache`.
fn run_with_cache(node: &Node, cache: &Path, args: &[&str]) -> Output {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    mindxtrain(&node.dir, &a).env("HF_HUB_CACHE", cache).output().unwrap()
}

fn train(node: &Node, cache: &Path, recipe_text: &str, out: &Path, extra: &[&str]) -> Output {
    let recipe = node.recipe(&format!("r{}", blake3::hash(recipe_text.as_bytes()).to_hex()), recipe_text);
    let mut args = vec!["train", s(&recipe), "--out", s(out), "--eval-prompts", "1"];
    args.extend_from_slice(extra);
    run_with_cache(node, cache, &args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn error_of(o: &Output) -> String {
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    v["error"].as_str().map_or_else(|| stderr(o), str::to_string)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// How many events the node's log holds.
fn event_count(node: &Node) -> usize {
    ok_json(&node.run(&["log", "show"])).as_array().map_or(0, Vec::len)
}

#[test]
fn a_recipe_of_hub_ids_alone_trains_from_the_cache_and_records_the_commits() {
    let cache = Cache::new();
    let node = Node::new();
    let out = node.path("run");
    let v = ok_json(&train(&node, cache.root(), &recipe(&hub_model(""), &hub_data("")), &out, &[]));
    let snapshot = cache.snapshot(Kind::Model, MODEL, &cache.model_main);
    let hub = serde_json::json!({"repo": MODEL, "revision": "main", "commit": cache.model_main});

    // The base: the snapshot of `main`, by commit, with the digests of the files read there.
    let run_json = read_json(&out.join("run.json"));
    assert_eq!(run_json["base"]["hub"], hub);
    assert_eq!(run_json["base"]["path"], s(&std::fs::canonicalize(&snapshot).unwrap()));
    let config = run_json["base"]["files"].as_array().unwrap().iter().find(|f| f["path"] == "config.json").unwrap();
    assert_eq!(config["blake3"], b3(&snapshot.join("config.json")));
    assert_eq!(read_json(&out.join("final/base_model.json"))["hub"], hub);
    assert_eq!(v["base"]["hub"], hub);
    let started = node.events("run.started");
    assert_eq!(started[0]["data"]["base"]["hub"], hub, "{started:?}");

    // The tokenizer and chat template beside the base's weights rendered the data.
    let dataset = &read_json(&out.join("dataset.json"))["manifest"];
    let tokenizer = blake3::hash(&std::fs::read(snapshot.join("tokenizer.json")).unwrap()).to_hex().to_string();
    assert_eq!(dataset["tokenizer"], format!("hf-blake3:{tokenizer}"));
    // The data: the split's file of the dataset's snapshot, with the commit it resolved to.
    assert_eq!((&dataset["hf_id"], &dataset["revision"]), (&Value::from(DATASET), &Value::from("main")));
    assert_eq!(dataset["commit"], cache.dataset_main);
    let files: Vec<&str> = dataset["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(files, [format!("{DATASET}/data/{SPLIT}-00000-of-00001.parquet")]);
    assert_eq!(dataset["read_examples"], 40);

    // The sealed manifest names both by commit.
    let manifest = ok_json(&node.run(&["manifest", "show", v["manifest"]["file"].as_str().unwrap()]));
    let deps = manifest["statement"]["predicate"]["buildDefinition"]["resolvedDependencies"].as_array().unwrap();
    let data = deps.iter().find(|d| d["name"] == "dataset").unwrap();
    assert_eq!(data["uri"], format!("hf://datasets/{DATASET}@{}", cache.dataset_main));
    let base = deps.iter().find(|d| d["name"] == "base/config.json").unwrap();
    assert_eq!(base["annotations"]["hf_commit"], cache.model_main);
    assert_eq!(base["annotations"]["hf_uri"], format!("hf://{MODEL}@{}", cache.model_main));
}

#[test]
fn an_adapter_on_a_hub_base_finds_it_again_by_commit_when_the_cache_moves() {
    let cache = Cache::new();
    let node = Node::new();
    let out = node.path("run");
    let text = recipe(&hub_model(""), &hub_data(""));
    ok_json(&train(&node, cache.root(), &text, &out, &[]));
    let recipe_file = node.recipe("again", &text);
    let adapter = out.join("final");
    let eval = |at: &Path| {
        let args = ["eval", s(&recipe_file), "--checkpoint", s(&adapter), "--eval-prompts", "1"];
        run_with_cache(&node, at, &args)
    };
    let here = ok_json(&eval(cache.root()));
    // The cache as a whole elsewhere (its links are relative): the recorded path is gone, the
    // commit is found there, and the same base gives the same loss.
    let moved = cache.root().with_file_name("moved");
    std::fs::rename(cache.root(), &moved).unwrap();
    let there = ok_json(&eval(&moved));
    assert_eq!(there["loss"], here["loss"]);
    assert!(there["base"].as_str().unwrap().starts_with(s(&moved)), "{}", there["base"]);
    // Without it, the error says how to get it back.
    let o = eval(&moved.with_file_name("empty"));
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = error_of(&o);
    assert!(e.contains(&format!("mindxtrain fetch {MODEL} --revision {}", cache.model_main)), "{e}");
}

#[test]
fn a_pinned_revision_picks_that_snapshot() {
    let cache = Cache::new();
    let node = Node::new();
    for (revision, commit) in [(cache.model_v1.clone(), cache.model_v1.clone()), ("v1".into(), cache.model_v1.clone())]
    {
        let out = node.path(&format!("run-{revision}"));
        let pinned = hub_model(&format!("  revision: {revision}\n"));
        let data = hub_data(&format!("  revision: {}\n", cache.dataset_main));
        ok_json(&train(&node, cache.root(), &recipe(&pinned, &data), &out, &[]));
        let base = &read_json(&out.join("run.json"))["base"];
        assert_eq!((&base["hub"]["revision"], &base["hub"]["commit"]), (&Value::from(revision), &Value::from(commit)));
        let older = cache.snapshot(Kind::Model, MODEL, &cache.model_v1);
        let weights = base["files"].as_array().unwrap().iter().find(|f| f["path"] == "model.safetensors").unwrap();
        assert_eq!(weights["blake3"], b3(&older.join("model.safetensors")), "the v1 weights were read");
        let dataset = &read_json(&out.join("dataset.json"))["manifest"];
        assert_eq!(dataset["revision"], cache.dataset_main);
        assert_eq!(dataset["commit"], cache.dataset_main);
    }
    // The two snapshots hold other weights: the pin is what chose.
    let main = cache.snapshot(Kind::Model, MODEL, &cache.model_main);
    assert_ne!(
        b3(&main.join("model.safetensors")),
        b3(&cache.snapshot(Kind::Model, MODEL, &cache.model_v1).join("model.safetensors"))
    );
}

#[test]
fn what_the_cache_lacks_is_refused_before_any_event_or_plan_naming_the_cache_and_the_fetch_command() {
    let cache = Cache::new();
    let empty = tempfile::tempdir().unwrap();
    let node = Node::new();
    let events = event_count(&node);
    let out = node.path("run");

    let o = train(&node, empty.path(), &recipe(&hub_model(""), &hub_data("")), &out, &[]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = error_of(&o);
    let looked = empty.path().join("models--mindxtrain-tests--tiny-qwen3/refs/main");
    assert!(e.contains(&looked.display().to_string()), "{e}");
    assert!(e.contains(&format!("mindxtrain fetch {MODEL}`")), "{e}");

    // The model is there, the dataset (at this revision) is not.
    let o = train(&node, cache.root(), &recipe(&hub_model(""), &hub_data("  revision: v9\n")), &out, &[]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = error_of(&o);
    assert!(e.contains(&cache.root().display().to_string()), "{e}");
    assert!(e.contains(&format!("mindxtrain fetch {DATASET} --dataset --revision v9")), "{e}");

    // A pinned commit whose snapshot is absent names the snapshot it looked for.
    let absent = commit_id("never fetched");
    let o =
        train(&node, cache.root(), &recipe(&hub_model(&format!("  revision: {absent}\n")), &hub_data("")), &out, &[]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(error_of(&o).contains(&format!("snapshots/{absent}")), "{}", error_of(&o));

    assert_eq!(event_count(&node), events, "nothing was recorded");
    assert!(!out.exists(), "no run directory, so no plan either");
}

#[test]
fn init_from_alone_finds_the_tokenizer_and_template_beside_the_weights() {
    let cache = Cache::new();
    let node = Node::new();
    // A plain HF directory (no hub id anywhere), as `--init-from` gives it.
    let base = node.path("base");
    std::fs::create_dir_all(&base).unwrap();
    for (name, bytes) in mindxtrain_tests::hub_cache::model_files(&tiny_config(), 4).unwrap() {
        std::fs::write(base.join(name), bytes).unwrap();
    }
    let out = node.path("run");
    let local = "  name: my-local-model\n";
    let v = ok_json(&train(&node, cache.root(), &recipe(local, &hub_data("")), &out, &["--init-from", s(&base)]));
    assert_eq!(v["base"]["path"], s(&std::fs::canonicalize(&base).unwrap()));
    assert!(v["base"].get("hub").is_none(), "a local base has no hub record: {}", v["base"]);
    let dataset = &read_json(&out.join("dataset.json"))["manifest"];
    assert_eq!(dataset["tokenizer"], format!("hf-blake3:{}", b3(&base.join("tokenizer.json"))));
    let template = dataset["template"]["source"].as_str().unwrap();
    assert!(template.ends_with("tokenizer_config.json"), "{template}");
}

#[test]
fn a_model_config_that_contradicts_the_base_is_refused_naming_the_field() {
    let cache = Cache::new();
    let node = Node::new();
    let base = cache.snapshot(Kind::Model, MODEL, &cache.model_main);
    let t = tiny_config();
    let config = |layers: usize| {
        format!(
            "  name: local\n  tokenizer: byte\n  config: {{hidden_size: {}, num_layers: {layers}, num_heads: {}, \
             num_kv_heads: {}, head_dim: {}, intermediate_size: {}, vocab_size: {}, max_position_embeddings: {}, \
             tie_word_embeddings: true}}\n",
            t.hidden_size,
            t.num_attention_heads,
            t.num_key_value_heads,
            t.head_dim,
            t.intermediate_size,
            t.vocab_size,
            t.max_position_embeddings
        )
    };
    let events = event_count(&node);
    let out = node.path("run");
    let o = train(&node, cache.root(), &recipe(&config(3), &hub_data("")), &out, &["--init-from", s(&base)]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let e = error_of(&o);
    assert!(e.contains("model.config.num_layers is 3 but the base has 1"), "{e}");
    assert_eq!(event_count(&node), events, "refused before anything was recorded");
    assert!(!out.exists());
    // The same shape is the base's own: it trains.
    ok_json(&train(&node, cache.root(), &recipe(&config(1), &hub_data("")), &out, &["--init-from", s(&base)]));
}

#[test]
fn the_cache_resolves_branches_tags_and_commits_and_names_what_it_lacks() {
    let cache = Cache::new();
    let hub = HubCache::at(cache.root()).unwrap();
    let main = hub.resolve(MODEL, RepoKind::Model, None).unwrap();
    assert_eq!((main.source.revision.as_str(), main.source.commit.as_str()), ("main", cache.model_main.as_str()));
    assert_eq!(main.dir, cache.snapshot(Kind::Model, MODEL, &cache.model_main));
    assert_eq!(hub.resolve(MODEL, RepoKind::Model, Some("v1")).unwrap().source.commit, cache.model_v1);
    let pinned = hub.resolve(MODEL, RepoKind::Model, Some(&cache.model_v1)).unwrap();
    assert_eq!(pinned.dir, cache.snapshot(Kind::Model, MODEL, &cache.model_v1));
    // The same id as a dataset is another repository.
    assert!(matches!(hub.resolve(MODEL, RepoKind::Dataset, None), Err(HubError::Missing { .. })));
    let data = hub.resolve(DATASET, RepoKind::Dataset, None).unwrap();
    assert_eq!(data.source.commit, cache.dataset_main);
    // A ref whose snapshot was deleted names the snapshot.
    std::fs::remove_dir_all(cache.snapshot(Kind::Dataset, DATASET, &cache.dataset_main)).unwrap();
    let err = hub.resolve(DATASET, RepoKind::Dataset, None).unwrap_err().to_string();
    assert!(err.contains(&format!("snapshots/{}", cache.dataset_main)) && err.contains("--dataset"), "{err}");
}

#[test]
fn the_fixture_is_the_layout_huggingface_hub_reads() {
    let Some(py) = torch_python() else { return };
    let cache = Cache::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/hub_cache.py");
    let data_file = format!("data/{SPLIT}-00000-of-00001.parquet");
    let o = Command::new(py)
        .arg(script)
        .args(["check", "--model", MODEL, "--dataset", DATASET, "--data-file", &data_file])
        .env("HF_HUB_CACHE", cache.root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    let repos = v["repos"].as_array().unwrap();
    let model = repos.iter().find(|r| r["type"] == "model" && r["id"] == MODEL).unwrap();
    assert_eq!(model["revisions"][&cache.model_main]["refs"], serde_json::json!(["main"]));
    assert_eq!(model["revisions"][&cache.model_v1]["refs"], serde_json::json!(["v1"]));
    let files = &model["revisions"][&cache.model_main]["files"];
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(files.as_array().unwrap().iter().any(|x| x == f), "{f} in {files}");
    }
    let dataset = repos.iter().find(|r| r["type"] == "dataset" && r["id"] == DATASET).unwrap();
    assert_eq!(dataset["revisions"][&cache.dataset_main]["refs"], serde_json::json!(["main"]));
    let snapshot = cache.snapshot(Kind::Model, MODEL, &cache.model_main);
    assert_eq!(v["config"], s(&snapshot.join("config.json")));
    assert_eq!(v["data_file"], s(&cache.snapshot(Kind::Dataset, DATASET, &cache.dataset_main).join(&data_file)));
    assert_eq!(v["data_rows"], 40);
    assert_eq!((&v["layers"], &v["chat_template"]), (&Value::from(1), &Value::from(true)));
}

#[test]
fn fetch_refuses_what_is_not_a_hub_id_and_reports_an_unreachable_hub_without_the_token() {
    let node = Node::new();
    let cache = tempfile::tempdir().unwrap();
    let token = "hf_mindxtraintestsecret0123456789";
    let fetch = |args: &[&str]| {
        let mut a = vec!["--json", "fetch"];
        a.extend_from_slice(args);
        mindxtrain(&node.dir, &a)
            .env("HF_HUB_CACHE", cache.path())
            // Nothing listens there: the hub cannot be reached, as on a machine without a network.
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            .env("HF_TOKEN", token)
            .output()
            .unwrap()
    };
    for bad in [vec!["gpt2"], vec!["../x/y"], vec![MODEL, "--revision", "../../etc"]] {
        let o = fetch(&bad);
        assert_eq!(o.status.code(), Some(4), "{bad:?}: {}", stderr(&o));
    }
    let o = fetch(&[DATASET, "--dataset"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(all.contains(DATASET), "{all}");
    assert!(!all.contains(token), "the token was printed: {all}");
    assert!(std::fs::read_dir(cache.path()).unwrap().all(|e| !e.unwrap().path().join("snapshots").exists()));
}
