//! `mpsfleet`: the one binary. Parses the command line and calls into the library crates.

mod agent;
mod bench;
mod cli;
mod output;
mod server;
mod sim;
mod up;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mpsfleet", version, about = "Run GPU workloads that share NVIDIA GPUs through MPS")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a server and local hosts on this machine; Ctrl-C stops everything.
    Up(up::UpArgs),
    /// Run the control plane.
    Server(server::ServerArgs),
    /// Run the node agent on a GPU host.
    Agent(agent::AgentArgs),
    /// Register, list and describe task definitions.
    Taskdef(cli::Global<cli::TaskdefCommand>),
    /// Run, list, describe and stop tasks.
    Task(cli::Global<cli::TaskCommand>),
    /// List, describe and cordon hosts.
    Host(cli::Global<cli::HostCommand>),
    /// Create, list and describe pools.
    Pool(cli::Global<cli::PoolCommand>),
    /// Keep N tasks of a task definition running.
    Service(cli::Global<cli::ServiceCommand>),
    /// Incidents: hosts declared bad, and what was done about them.
    Incident(cli::Global<cli::IncidentCommand>),
    /// Secrets for task definitions' `secrets`, `repositoryCredentials` and log options,
    /// stored encrypted; values are never shown.
    Secret(cli::Global<cli::SecretCommand>),
    /// API tokens with roles (viewer, operator, admin) for people and tools.
    Token(cli::Global<cli::TokenCommand>),
    /// Join tokens, which register hosts: they expire (a day by default) and rotate.
    JoinToken(cli::Global<cli::JoinTokenCommand>),
    /// The audit log: every change made through the API, by whom.
    Audit(cli::Global<cli::AuditCommand>),
    /// The server's TLS certificate under the cluster CA.
    Cluster(cli::Global<cli::ClusterCommand>),
    /// Benchmarks that print their figures as a final JSON line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Simulate a fleet against the real control-plane logic, with faults, in virtual time.
    Sim(sim::SimArgs),
}

fn main() -> std::process::ExitCode {
    // `mpsfleet shim …` runs one task container under the agent; not a user command.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == "shim") {
        let code = mpsfleet_agent::runtime::shim_main_from_args(args);
        return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => up::run(args),
        Command::Server(args) => server::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Sim(args) => sim::run(args),
        Command::Taskdef(g) => cli::run(g.opts, cli::Resource::Taskdef(g.command)),
        Command::Task(g) => cli::run(g.opts, cli::Resource::Task(g.command)),
        Command::Host(g) => cli::run(g.opts, cli::Resource::Host(g.command)),
        Command::Pool(g) => cli::run(g.opts, cli::Resource::Pool(g.command)),
        Command::Service(g) => cli::run(g.opts, cli::Resource::Service(g.command)),
        Command::Incident(g) => cli::run(g.opts, cli::Resource::Incident(g.command)),
        Command::Secret(g) => cli::run(g.opts, cli::Resource::Secret(g.command)),
        Command::Token(g) => cli::run(g.opts, cli::Resource::Token(g.command)),
        Command::Audit(g) => cli::run(g.opts, cli::Resource::Audit(g.command)),
        Command::JoinToken(g) => cli::run(g.opts, cli::Resource::JoinToken(g.command)),
        Command::Cluster(g) => cli::run(g.opts, cli::Resource::Cluster(g.command)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
