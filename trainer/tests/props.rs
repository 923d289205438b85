//! Property tests: no input panics the loader, every error points inside the file, and any
//! valid recipe survives `recipe show --json` and back unchanged.

mod common;

use common::BASE;
use mindxtrain_trainer::recipe::Recipe;
use proptest::prelude::*;

/// Lines as YAML counts them: `\n`, `\r\n` and a lone `\r` each end one.
fn yaml_lines(src: &str) -> usize {
    src.replace("\r\n", "\n").chars().filter(|c| matches!(c, '\n' | '\r')).count() + 1
}

/// Loads `src`; on failure every error must carry a location inside the text.
fn check_located(src: &str) {
    let lines = yaml_lines(src);
    if let Err(errors) = Recipe::check_str(src, "fuzz.yaml") {
        for e in errors.iter() {
            let loc = e.location().expect("text errors are located");
            assert!(loc.line >= 1 && loc.line <= lines, "{e} (text has {lines} lines)");
            assert!(loc.column >= 1, "{e}");
            assert_eq!(e.to_string(), format!("fuzz.yaml:{loc} {}: {}", e.path(), e.message()));
        }
    }
}

/// Words the schema knows, so random documents reach deep into the deserializer.
const WORDS: &[&str] = &[
    "meta",
    "hardware",
    "model",
    "data",
    "train",
    "method",
    "kind",
    "lora",
    "r",
    "gpus",
    "name",
    "mi300x",
    "cpu",
    "env",
    "publish",
    "billing",
    "x402",
    "network",
    "pricing",
    "per_call",
    "seq_len",
    "betas",
    "source",
    "generated",
    "generator",
    "tasks",
    "1",
    "0.5",
    "-3",
    "true",
    "null",
    "\"x\"",
    "",
];

fn word() -> impl Strategy<Value = String> {
    prop::sample::select(WORDS).prop_map(str::to_owned)
}

#[derive(Debug, Clone)]
enum Tree {
    Leaf(String),
    List(Vec<Tree>),
    Map(Vec<(String, Tree)>),
}

fn tree() -> impl Strategy<Value = Tree> {
    word().prop_map(Tree::Leaf).prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Tree::List),
            prop::collection::vec((word(), inner), 0..6).prop_map(Tree::Map),
        ]
    })
}

fn render(t: &Tree, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match t {
        Tree::Leaf(w) => {
            out.push(' ');
            out.push_str(w);
            out.push('\n');
        }
        Tree::List(items) if items.is_empty() => out.push_str(" []\n"),
        Tree::Map(entries) if entries.is_empty() => out.push_str(" {}\n"),
        Tree::List(items) => {
            out.push('\n');
            for item in items {
                out.push_str(&format!("{pad}-"));
                render(item, indent + 2, out);
            }
        }
        Tree::Map(entries) => {
            out.push('\n');
            for (k, v) in entries {
                out.push_str(&format!("{pad}{k}:"));
                render(v, indent + 2, out);
            }
        }
    }
}

/// A recipe text valid by construction, from independently drawn parameters.
fn valid_recipe() -> impl Strategy<Value = String> {
    let hardware = prop_oneof![
        Just(("cpu", 0u32)),
        prop::sample::select(vec![0u32, 1, 2, 4, 8]).prop_map(|g| ("h100", g)),
        // AMD GPUs have no launch path: their recipes train on the CPU.
        Just(("mi300x", 0u32)),
        Just(("mi355x", 0u32)),
    ];
    let method = prop_oneof![
        (1u32..=512, 1u32..=1024, 0.0f64..=1.0)
            .prop_map(|(r, a, d)| format!("{{kind: lora, r: {r}, alpha: {a}, dropout: {d:?}}}")),
        (1u32..=512).prop_map(|r| format!("{{kind: qlora, r: {r}, bits: 4}}")),
        Just("{kind: full}".to_owned()),
        (0.001f64..10.0).prop_map(|b| format!("{{kind: orpo, beta: {b:?}}}")),
    ];
    (hardware, method, 1e-7f64..=1.0, 16u32..=65_536, any::<u64>(), 0.0f64..1.0, 1u32..=3_000_000).prop_map(
        |((hw, gpus), method, lr, seq_len, seed, beta2, cents)| {
            let format = if method.contains("orpo") { "preference" } else { "chat" };
            let env = if hw.starts_with("mi") {
                let arch = if hw == "mi355x" { "gfx950" } else { "gfx942" };
                let keys: String = mindxtrain_trainer::recipe::mandatory_rocm_env_keys()
                    .iter()
                    .map(|k| format!("    {k}: \"{}\"\n", if *k == "PYTORCH_ROCM_ARCH" { arch } else { "1" }))
                    .collect();
                format!("  env:\n{keys}")
            } else {
                String::new()
            };
            // ZeRO-3 does not cover ORPO's reference passes or a QLoRA NF4 base: ZeRO-2 for those.
            let fsdp = match (gpus >= 2, method.contains("orpo") || method.contains("qlora")) {
                (false, _) => "",
                (true, false) => "  fsdp: true\n",
                (true, true) => "  distributed: {sharding: zero2}\n",
            };
            let price = format!("{}.{:02}", cents / 100, cents % 100);
            format!(
                "meta: {{project: p, run_name: run-{seed}, seed: {seed}}}\n\
                 hardware: {{name: {hw}, gpus: {gpus}}}\n\
                 model: {{name: Qwen/Qwen3-8B}}\n\
                 data: {{source: hf, hf_id: a/b, format: {format}, seq_len: {seq_len}}}\n\
                 train:\n  method: {method}\n  optimizer: {{lr: {lr:?}, betas: [0.9, {beta2:?}]}}\n{fsdp}{env}\
                 publish:\n  billing:\n    x402: {{network: base, pricing: {{per_call: \"{price}\"}}}}\n"
            )
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check_located(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn yaml_like_text_never_panics(src in "[a-z_:\\-\\[\\]{},&*!|>#'\" \t\n0-9.~?%@]{0,300}") {
        check_located(&src);
    }

    #[test]
    fn random_documents_never_panic(t in tree()) {
        let mut src = String::new();
        render(&t, 0, &mut src);
        check_located(&src);
    }

    #[test]
    fn edited_base_never_panics(line in 0usize..30, at in 0usize..40, insert in "[a-z0-9:\\-\\[\\]{}\" .#&*]{0,12}") {
        let mut lines: Vec<String> = BASE.lines().map(str::to_owned).collect();
        let i = line % lines.len();
        let cut = lines[i].char_indices().map(|(n, _)| n).nth(at).unwrap_or(lines[i].len());
        lines[i].insert_str(cut, &insert);
        check_located(&(lines.join("\n") + "\n"));
    }

    #[test]
    fn valid_recipes_round_trip_through_show(src in valid_recipe()) {
        let loaded = Recipe::from_str(&src, "gen.yaml").map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
        let shown = serde_json::to_string_pretty(&loaded.recipe).expect("serializes");
        let again = Recipe::from_str(&shown, "show.json").map_err(|e| TestCaseError::fail(format!("{e}\n{shown}")))?;
        prop_assert_eq!(&again.recipe, &loaded.recipe);
        prop_assert_eq!(serde_json::to_string_pretty(&again.recipe).expect("serializes"), shown);
    }
}
