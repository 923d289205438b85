//! Argument definitions and dispatch.

mod anchor_cmd;
mod chain_cmd;
mod demo;
mod export_cmd;
mod fetch_cmd;
mod interrupt;
mod log_cmd;
mod manifest_cmd;
mod market_demo;
mod output;
mod progress;
mod quantize_cmd;
mod rank_cmd;
mod receipt_cmd;
mod recipe_cmd;
mod rent_cmd;
mod serve_cmd;
mod train_cmd;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit codes, documented in docs/cli.md.
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_VERIFY_FAILED: u8 = 3;
pub const EXIT_INVALID_INPUT: u8 = 4;
pub const EXIT_CHAIN_UNREACHABLE: u8 = 5;

#[derive(Parser, Debug)]
#[command(
    name = "mindxtrain",
    version,
    about = "Train, prove and rent models: a node with a signed, hash-chained event log",
    after_help = "Examples:\n  mindxtrain demo\n  mindxtrain init --node-dir ./node\n  mindxtrain --node-dir ./node log verify"
)]
pub struct Cli {
    /// Node directory (key, log, index).
    #[arg(long, global = true, env = "MINDXTRAIN_NODE_DIR", default_value_os_t = default_node_dir())]
    pub node_dir: PathBuf,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
    /// More log output on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Accept node.key and api.token files that group or others can read (refused by
    /// default, as ssh refuses loose keys): for secret stores that cannot mount them 0600.
    #[arg(long, global = true)]
    pub allow_readable_secrets: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a node directory: ed25519 key (0600) and a log with its genesis event.
    #[command(after_help = "Example:\n  mindxtrain init --node-dir ./node")]
    Init,
    /// Read, audit and prove the event log.
    #[command(
        subcommand,
        after_help = "Examples:\n  mindxtrain log verify\n  mindxtrain log tail -n 20 --follow\n  mindxtrain log proof 3 --json"
    )]
    Log(log_cmd::LogCommand),
    /// Validate, inspect and register YAML recipes.
    #[command(
        subcommand,
        after_help = "Examples:\n  mindxtrain recipe check recipes/*.yaml\n  mindxtrain recipe show recipes/tiny_cpu_lora.yaml --json"
    )]
    Recipe(recipe_cmd::RecipeCommand),
    /// Deploy the registry and check the chain (embedded anvil by default, or --rpc-url / --network).
    #[command(
        subcommand,
        after_help = "Examples:\n  mindxtrain chain up\n  mindxtrain chain deploy --test-usdc\n  mindxtrain chain deploy --network base-sepolia --key-file anchor.key\n  mindxtrain chain status --json"
    )]
    Chain(chain_cmd::ChainCommand),
    /// Anchor pending items (a fresh log checkpoint, requested digests) on chain; `anchor verify` proves one.
    #[command(
        after_help = "Examples:\n  mindxtrain anchor\n  mindxtrain anchor --batch --confirmations 2\n  mindxtrain anchor --digest <64 hex> --label manifest --batch\n  mindxtrain anchor verify <64 hex digest>"
    )]
    Anchor(anchor_cmd::AnchorArgs),
    /// List anchored roots (with their items), pending items and failures, from the log.
    #[command(after_help = "Example:\n  mindxtrain anchors --json")]
    Anchors,
    /// Seal a run into a signed in-toto/SLSA manifest; show one; hash files (sha256 + blake3, one pass).
    #[command(
        subcommand,
        after_help = "`train` seals every run itself; `manifest seal` is for a run trained elsewhere, whose events\n(subject RUN) are in this log, or whose range --first-seq/--last-seq gives.\n\nExamples:\n  mindxtrain log append --kind run.finished --subject my-run --data '{\"run_id\":\"my-run\"}'\n  mindxtrain manifest seal my-run --recipe run.yaml --output-dir ./out\n  mindxtrain manifest show ~/.mindxtrain/manifests/<blake3>.json\n  mindxtrain manifest hash runs/tiny_cpu_lora/final/adapter_model.safetensors"
    )]
    Manifest(manifest_cmd::ManifestCommand),
    /// Export a run's receipt bundle, or verify one (or a bare manifest) without the node.
    Receipt(receipt_cmd::ReceiptArgs),
    /// Measure the AOT autotune plan for a recipe on this machine (within autotune.budget_seconds).
    #[command(
        after_help = "The plan is written once and never overwritten; `train` replays it verbatim.\n\nExample:\n  mindxtrain bench recipes/tiny_cpu_lora.yaml --out plan.json"
    )]
    Bench(train_cmd::BenchArgs),
    /// Train a recipe with its plan; every step of the run is an event in the log.
    #[command(
        after_help = "Without --plan the plan is measured first; the run directory keeps it (plan.json), its base\n(run.json) and, on Ctrl-C, a checkpoint that --resume continues from.\n\nExamples:\n  mindxtrain train recipes/tiny_cpu_pretrain.yaml --out runs/pre\n  mindxtrain train recipes/tiny_cpu_lora.yaml --init-from runs/pre/final --out runs/lora\n  mindxtrain train recipes/tiny_cpu_lora.yaml --out runs/lora --resume\n  mindxtrain train recipes/tiny_cpu_pretrain.yaml --plan plan.json --out runs/pre2 --tensorboard"
    )]
    Train(train_cmd::TrainArgs),
    /// Held-out loss, perplexity and exact-match accuracy of a checkpoint (eval.json format).
    #[command(
        after_help = "An adapter is evaluated over the base recorded beside it (base_model.json).\n\nExample:\n  mindxtrain eval recipes/tiny_cpu_lora.yaml --checkpoint runs/lora/final --out lora-eval.json"
    )]
    Eval(train_cmd::EvalArgs),
    /// Serve a trained model: OpenAI-compatible chat completions, sold per call over x402, and rentals.
    #[command(
        after_help = "Examples:\n  mindxtrain serve recipes/tiny_cpu_lora.yaml --checkpoint runs/lora/final --free\n  mindxtrain serve recipes/tiny_cpu_lora.yaml --checkpoint runs/lora/final \\\n    --rpc-url http://127.0.0.1:8545 --settler-key settler.key   (TestUSDC from `chain deploy --test-usdc`)"
    )]
    Serve(serve_cmd::ServeArgs),
    /// Rent calls (or time) of a model from another node, paying over x402; prints the rental token.
    #[command(
        after_help = "Example:\n  mindxtrain rent --from http://127.0.0.1:8080 --model mindxtrain/tiny-qwen3 --calls 10 --key payer.key --max-price 0.05"
    )]
    Rent(rent_cmd::RentArgs),
    /// Write a run's result as a Hugging Face model directory (an adapter merged into its base).
    #[command(
        after_help = "Example:\n  mindxtrain export recipes/tiny_cpu_lora.yaml --checkpoint runs/lora/final --merge --out hf-model"
    )]
    Export(export_cmd::ExportArgs),
    /// Quantize a run's final model (or an HF model directory) to FP8 E4M3, in the compressed-tensors format.
    #[command(
        after_help = "Weights of the decoder's Linear layers become FP8 with one scale per output channel (--per-tensor:\none per tensor); lm_head, embeddings, norms and MoE routers are kept; activations are quantized\nper token at run time by the reader (transformers with compressed-tensors, vLLM). The result is\nrecorded in the node's log as model.quantized with its files' digests. A LoRA run's final/ is an\nadapter: merge it first (`mindxtrain export --merge`), or set quantize.enabled in the recipe.\n\nExamples:\n  mindxtrain quantize runs/pre                 (writes runs/pre/quantized)\n  mindxtrain quantize hf-model --out hf-model-fp8 --json"
    )]
    Quantize(quantize_cmd::QuantizeArgs),
    /// Download a model or dataset of the Hugging Face hub into the local hub cache, where runs find it.
    #[command(
        after_help = "Runs never download: a recipe's model.name (owner/name, no model.path or model.config) and\ndata.hf_id are read from the cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)\nat model.revision / data.revision. HF_TOKEN (or the token `hf auth login` saved) is sent, never printed.\n\nExamples:\n  mindxtrain fetch Qwen/Qwen3-8B\n  mindxtrain fetch HuggingFaceH4/ultrachat_200k --dataset\n  mindxtrain fetch Qwen/Qwen3-8B --revision <commit id> --json"
    )]
    Fetch(fetch_cmd::FetchArgs),
    /// Run the whole flow on embedded defaults in a temporary node.
    #[command(after_help = "Example:\n  mindxtrain demo\n  mindxtrain demo --keep ./demo-node")]
    Demo(demo::DemoArgs),
    /// One rank of a run on several ranks; `train` starts these itself.
    #[command(
        hide = true,
        after_help = "Started by `mindxtrain train` for each rank, never by hand. Example (what a launcher runs):\n  mindxtrain rank run.yaml --rdzv 127.0.0.1:29500 --node-rank 0 --local-rank 1 --nnodes 1 \\\n    --nproc-per-node 2 --collective tcp --device cpu"
    )]
    Rank(rank_cmd::RankCmd),
}

fn default_node_dir() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")).join(".mindxtrain")
}

pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MINDXTRAIN_LOG").unwrap_or_else(|_| default.into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let out = output::Output { json: cli.json };
    if cli.allow_readable_secrets {
        mindxtrain_node::identity::allow_readable_secrets();
    }
    match cli.command {
        Command::Init => log_cmd::init(&cli.node_dir, &out),
        Command::Log(cmd) => log_cmd::run(cmd, &cli.node_dir, &out),
        Command::Recipe(cmd) => recipe_cmd::run(cmd, &cli.node_dir, &out),
        Command::Chain(cmd) => chain_cmd::run(cmd, &cli.node_dir, &out),
        Command::Anchor(args) => anchor_cmd::run(args, &cli.node_dir, &out),
        Command::Anchors => anchor_cmd::list(&cli.node_dir, &out),
        Command::Manifest(cmd) => manifest_cmd::run(cmd, &cli.node_dir, &out),
        Command::Receipt(args) => receipt_cmd::run(args, &cli.node_dir, &out),
        Command::Bench(args) => train_cmd::bench(args, &cli.node_dir, &out),
        Command::Train(args) => train_cmd::train(args, &cli.node_dir, &out),
        Command::Eval(args) => train_cmd::eval(args, &out),
        Command::Export(args) => export_cmd::run(args, &out),
        Command::Quantize(args) => quantize_cmd::run(args, &cli.node_dir, &out),
        Command::Fetch(args) => fetch_cmd::run(args, &out),
        Command::Serve(args) => serve_cmd::serve(args, &cli.node_dir, &out),
        Command::Rent(args) => rent_cmd::rent(args, &cli.node_dir, &out),
        Command::Demo(args) => demo::run(args, &out),
        Command::Rank(cmd) => Ok(rank_cmd::run(cmd)),
    }
}

/// The last component of a path, for naming a file in a manifest or message.
pub(crate) fn file_name(p: &std::path::Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// `1 event`, `2 events`.
pub(crate) fn plural(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// `argv` as one line a POSIX shell reads back into the same words.
pub(crate) fn shell_words(argv: &[String]) -> String {
    let word = |w: &String| {
        let plain = !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./:=@%+,".contains(&b));
        if plain { w.clone() } else { format!("'{}'", w.replace('\'', "'\\''")) }
    };
    argv.iter().map(word).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{Cli, shell_words};

    #[test]
    fn shell_words_quote_only_what_needs_it() {
        let argv = ["mindxtrain", "--out", "runs/a b", "it's", ""].map(String::from);
        assert_eq!(shell_words(&argv), "mindxtrain --out 'runs/a b' 'it'\\''s' ''");
    }
    use clap::CommandFactory;

    /// Every verb, nested ones included, shows an example in its `--help`.
    #[test]
    fn every_command_has_an_example_in_its_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                let name = format!("{path} {}", sub.get_name());
                let help = sub.get_after_help().map(|h| h.to_string()).unwrap_or_default();
                if !help.contains("Example") {
                    missing.push(name.clone());
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "mindxtrain", &mut missing);
        assert!(missing.is_empty(), "no example in --help: {missing:#?}");
    }
}
