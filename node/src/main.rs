//! `mindxtrain`: the node's command line. Each verb lives in its own module under
//! `cli/`; this file only parses arguments and maps outcomes to exit codes.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    mindxtrain_node::training::keep_freed_memory();
    let args = cli::Cli::parse();
    cli::init_tracing(args.verbose);
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}
