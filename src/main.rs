//! The `ralpc` command line: parse, dispatch, map the result to an exit code.

mod cli;
mod commands;
mod printable;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    ralpc::keep_freed_memory();
    let cli = cli::Cli::parse_from(cli::expand_shorthand(std::env::args_os().collect()));
    let json = cli.command.json();
    let result = match cli.command {
        cli::Command::Inspect(args) => commands::inspect::run(&args),
        cli::Command::Plan(args) => commands::plan::run(&args),
        cli::Command::Cluster(args) => commands::cluster::run(&args),
        cli::Command::Sweep(args) => commands::sweep::run(&args),
        cli::Command::Run(args) => commands::run::run(&args),
        cli::Command::Launch(args) => commands::launch::run(&args),
        cli::Command::Doctor(args) => commands::doctor::run(&args),
        cli::Command::Profile(args) => commands::profile::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            cli::report_error(&e, json);
            ExitCode::from(e.exit_code())
        }
    }
}
