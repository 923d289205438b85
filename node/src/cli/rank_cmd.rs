//! `mindxtrain rank`: one rank of a run, started by `mindxtrain train` (never by hand).

use clap::Args;
use mindxtrain_node::training::launch::{RankArgs, run_rank};
use mindxtrain_trainer::collective::Backend;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RankCmd {
    /// The recipe file (the same bytes on every node).
    pub recipe: PathBuf,
    /// Where the recipe's relative paths start.
    #[arg(long)]
    pub recipe_dir: Option<PathBuf>,
    /// The launcher's rendezvous.
    #[arg(long)]
    pub rdzv: SocketAddr,
    #[arg(long)]
    pub node_rank: usize,
    #[arg(long)]
    pub local_rank: usize,
    #[arg(long)]
    pub nnodes: usize,
    #[arg(long)]
    pub nproc_per_node: usize,
    #[arg(long)]
    pub collective: Backend,
    /// `cpu` or `cuda:N`.
    #[arg(long)]
    pub device: String,
}

pub fn run(cmd: RankCmd) -> ExitCode {
    let args = RankArgs {
        recipe: cmd.recipe,
        recipe_dir: cmd.recipe_dir,
        rdzv: cmd.rdzv,
        node_rank: cmd.node_rank,
        local_rank: cmd.local_rank,
        nnodes: cmd.nnodes,
        nproc_per_node: cmd.nproc_per_node,
        collective: cmd.collective,
        device: cmd.device,
    };
    match run_rank(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(super::EXIT_FAILURE),
    }
}
