//! Recipe fields the command line carries out (the field contract of docs/recipes.md names
//! these tests): the run directory's default name, `train.env` in the training process, and a
//! recipe's own plan file.

use mindxtrain_node::training::{self, Origin, RecipeInput, TrainError, TrainRequest};
use mindxtrain_tests::micro::{self, FULL, Node, ok_json};
use mindxtrain_tests::mindxtrain;
use std::path::Path;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn train_without_out_writes_runs_run_name() {
    let node = Node::new();
    let recipe = node.recipe("named", &micro::recipe("contract_named_run", 5, FULL, 4, ""));
    let work = tempfile::tempdir().unwrap();
    let o = mindxtrain(&node.dir, &["--json", "train", s(&recipe), "--eval-prompts", "0"])
        .current_dir(work.path())
        .output()
        .unwrap();
    let v = ok_json(&o);
    let out = work.path().join("runs/contract_named_run");
    assert!(out.join("final/config.json").is_file(), "{v}");
    assert!(out.join("run.json").is_file());
}

/// `train.env` reaches the training process before it starts: the command line re-executes
/// itself with it (this test process does not have the variable, so a `train` that did not
/// would be refused by the driver, as a run in a process without it is below).
#[test]
fn train_env_is_in_the_training_process_environment() {
    const KEY: &str = "MINDXTRAIN_CONTRACT_ENV_PROBE";
    assert!(std::env::var_os(KEY).is_none(), "the test needs {KEY} unset");
    let node = Node::new();
    let text = micro::recipe("env", 5, FULL, 4, "")
        .replace("  log_every_steps: 10\n", &format!("  log_every_steps: 10\n  env:\n    {KEY}: \"on\"\n"));
    let recipe = node.recipe("env", &text);
    let out = node.path("with-env");
    ok_json(&node.run(&["train", s(&recipe), "--out", s(&out), "--eval-prompts", "0"]));
    let started = node.events("run.started");
    assert_eq!(started[0]["data"]["env"][KEY], "on");

    // In a process that lacks it (this one), the run is refused before anything is written.
    let (log, key, _) = mindxtrain_node::node::open(&node.dir).unwrap();
    let before = log.len();
    let input = RecipeInput::from_file(&recipe).unwrap();
    let fresh = node.path("without-env");
    let req = TrainRequest {
        recipe: input,
        plan: None,
        out_dir: fresh.clone(),
        resume: false,
        force: false,
        init_from: None,
        force_base: false,
        data: Default::default(),
        eval_prompts: 0,
        origin: Origin::Cli,
        launch: None,
        recipe_path: None,
    };
    let err = match training::train_and_seal(&log, &key, &node.dir, &req, &mut NoHooks) {
        Err(e) => e,
        Ok(_) => panic!("a run without its train.env in the process trained"),
    };
    assert!(matches!(err, TrainError::Refused(_)), "{err}");
    assert!(err.to_string().starts_with(&format!("train.env.{KEY}: ")), "{err}");
    assert_eq!(log.len(), before, "nothing recorded");
    assert!(!fresh.exists(), "nothing written");
}

struct NoHooks;
impl mindxtrain_trainer::run::Observer for NoHooks {}
impl training::Hooks for NoHooks {}

#[test]
fn a_recipe_s_plan_file_is_written_once_then_read() {
    let node = Node::new();
    let text = micro::recipe("planned", 5, FULL, 4, "")
        .replace("  budget_seconds: 5\n", "  budget_seconds: 2\n  plan: plans/p.json\n");
    let recipe = node.recipe("planned", &text);
    std::fs::create_dir_all(node.path("plans")).unwrap();
    let plan = node.path("plans/p.json");
    let first = ok_json(&node.run(&["train", s(&recipe), "--out", s(&node.path("a")), "--eval-prompts", "0"]));
    assert!(plan.is_file(), "{first}");
    let bytes = std::fs::read(&plan).unwrap();
    assert_eq!(node.events("plan.emitted").len(), 1);
    let second = ok_json(&node.run(&["train", s(&recipe), "--out", s(&node.path("b")), "--eval-prompts", "0"]));
    assert_eq!(std::fs::read(&plan).unwrap(), bytes, "read, not measured again");
    assert_eq!(node.events("plan.emitted").len(), 1, "{second}");
    assert_eq!(std::fs::read(node.path("b/plan.json")).unwrap(), bytes);
    assert_eq!(second["plan"]["how"]["source"], "given");
}
