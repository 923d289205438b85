//! Our PyTorch reference of AMD's Instella (tests/python/instella/: transformers has none, and the
//! hub's own modeling file is out of reach here) checked independently, so the Instella interop
//! tests compare against something known right: tests/python/instella_check.py runs each check
//! once for all the tests below (one interpreter: torch imports cost seconds on 2 cores), and each
//! test asserts its check.
//!
//! Needs the CPU torch venv of `scripts/setup-torch`. Without it the tests skip, unless
//! MINDXTRAIN_REQUIRE_TORCH is set (CI sets it): then they install it, and fail if they cannot.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// The checks' results ({name: {ok, detail}}), or `None` without the venv.
fn results() -> Option<&'static Value> {
    static RESULTS: OnceLock<Option<Value>> = OnceLock::new();
    RESULTS
        .get_or_init(|| {
            let python = mindxtrain_tests::torch_python()?;
            let work = tempfile::tempdir().unwrap();
            let out = work.path().join("results.json");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/instella_check.py");
            let run = Command::new(python).arg(script).arg("--out").arg(&out).output().expect("run python");
            assert!(run.status.success(), "instella_check.py failed:\n{}", String::from_utf8_lossy(&run.stderr));
            Some(serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap())
        })
        .as_ref()
}

fn assert_check(name: &str) {
    let Some(results) = results() else { return };
    let check = &results[name];
    let detail = check["detail"].as_str().unwrap_or("(missing)");
    assert_eq!(check["ok"], Value::Bool(true), "{name}: {detail}");
    eprintln!("{name}: {detail}");
}

/// MHA with q/k norms over the whole projections, untied head, RoPE theta 500; and GQA with a tied
/// head: eager and SDPA logits equal a float64 numpy forward written from the architecture.
#[test]
fn instella_reference_forward_equals_a_float64_forward_written_from_the_architecture() {
    assert_check("forward_f64");
}

#[test]
fn instella_reference_loss_is_next_token_cross_entropy_with_minus_100_ignored() {
    assert_check("loss");
}

/// A prefill then one-token steps through the KV cache reproduce the full forward's logits, and
/// batched greedy `generate` (one row left-padded) gives each row's argmax loop without a cache.
#[test]
fn instella_reference_cached_generate_equals_the_uncached_argmax_loop() {
    assert_check("cached_decode");
}

#[test]
fn instella_reference_keeps_packed_documents_apart_by_their_position_ids() {
    assert_check("packed_rows");
}

/// Saved with its code files and `auto_map`, as the hub repos are, a model loads back through
/// `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` with the same logits.
#[test]
fn instella_reference_saves_in_the_hub_layout_and_loads_through_auto_classes() {
    assert_check("hub_layout");
}

/// amd/Instella-3B-Instruct's published config.json reads with its values, and the model it
/// describes has the size of the published bf16 checkpoint.
#[test]
fn instella_reference_reads_the_published_3b_instruct_config() {
    assert_check("published_config");
}
