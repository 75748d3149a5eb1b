//! `mpsfleet`: the one binary. Parses the command line and calls into the library crates.

mod agent;
mod bench;
mod cli;
#[cfg(test)]
mod clidoc;
mod describe;
mod endpoints;
mod output;
mod server;
mod sim;
mod template;
mod up;
mod wait;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event, for people.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, and `span` with
    /// the API request's `id`, `method` and `path`), for log collectors.
    Json,
}

/// Logs to standard error, at `MPSFLEET_LOG`'s level (`default` without it). Text is coloured
/// only when standard error is a terminal and `NO_COLOR` is not set, so that a log file (the
/// agent's `agent.log`, a service's journal) never carries escape codes; JSON never is.
pub(crate) fn init_logging(default: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let filter = tracing_subscriber::EnvFilter::try_from_env("MPSFLEET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour).init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).init(),
    }
}

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
    /// Drills: a real fault on chosen hosts of a live pool, handled as a real failure and
    /// measured against the pool's recovery bounds.
    Drill(cli::Global<cli::DrillCommand>),
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
    /// What happened in the cluster, a line per event: incidents, hosts, tasks, services, pools
    /// and drills, from the last hour the server keeps (--since to narrow it); --follow goes on
    /// as they happen, until Ctrl-C (or --limit).
    Events(cli::EventsArgs),
    /// Open the web console signed in with this CLI's identity: a one-time, short-lived
    /// sign-in link (never the token itself in a URL), opened in $BROWSER or xdg-open when
    /// there is a display, and printed in any case.
    Console(cli::ConsoleArgs),
    /// Benchmarks that print their figures as a final JSON line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Simulate a fleet against the real control-plane logic, with faults, in virtual time.
    Sim(sim::SimArgs),
    /// Print a shell completion script: `source <(mpsfleet completion bash)` (or zsh; fish:
    /// `mpsfleet completion fish | source`). The script asks mpsfleet on each TAB, and ids and
    /// names come live from the server (with the command line's credentials, 1.5 s at most;
    /// flags alone when it does not answer). --static prints a script of flags and subcommands
    /// only, which never runs mpsfleet.
    Completion {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
        /// Flags and subcommands only, without calling mpsfleet back.
        #[arg(long = "static")]
        fixed: bool,
    },
}

/// The script that registers dynamic completion for `shell`: it completes `mpsfleet` (and the
/// path this binary was run by, when that is another) by calling this binary back.
fn completion_script(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let completer = me.to_string_lossy();
    let shells = clap_complete::env::Shells::builtins();
    let Some(writer) = shells.completer(&shell.to_string()) else {
        anyhow::bail!("no dynamic completion for {shell}: use --static");
    };
    let mut out = std::io::stdout().lock();
    let mut names = vec!["mpsfleet".to_string()];
    let run_as = std::env::args().next().unwrap_or_default();
    if run_as.contains('/') && !names.contains(&run_as) {
        names.push(run_as);
    }
    for bin in names {
        writer.write_registration(cli::complete::VAR, "mpsfleet", &bin, &completer, &mut out)?;
    }
    Ok(())
}

/// The client's global flags, and whether each takes a value.
const GLOBAL_FLAGS: [(&str, bool); 9] = [
    ("--server", true),
    ("--token", true),
    ("--ca-file", true),
    ("--output", true),
    ("-o", true),
    ("--no-headers", false),
    ("--sort-by", true),
    ("-l", true),
    ("--selector", true),
];

/// The client's global flags may come anywhere, as kubectl's do: given before the resource
/// command (`mpsfleet --token T host list`), they are moved after its name, where clap takes
/// them. Everything from the first other word on is left as it is.
fn hoist_global_flags(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut flags = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        let takes_value = GLOBAL_FLAGS.iter().find_map(|(f, v)| {
            if a == *f {
                Some(*v)
            } else if a.starts_with(&format!("{f}=")) || (*f == "-o" && a.len() > 2 && a.starts_with("-o")) {
                Some(false)
            } else {
                None
            }
        });
        match takes_value {
            Some(true) if i + 1 < args.len() => {
                flags.extend_from_slice(&args[i..i + 2]);
                i += 2;
            }
            Some(_) => {
                flags.push(args[i].clone());
                i += 1;
            }
            None => break,
        }
    }
    if flags.is_empty() || i >= args.len() {
        return args;
    }
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend(flags);
    out.extend_from_slice(&args[i + 1..]);
    out
}

fn main() -> std::process::ExitCode {
    // `mpsfleet shim …` runs one task container under the agent; not a user command.
    // `mpsfleet exec-tty …` starts a `task exec` command on its terminal; not one either.
    let mut args = std::env::args_os().skip(1);
    match args.next() {
        Some(a) if a == "shim" => {
            let code = mpsfleet_agent::runtime::shim_main_from_args(args);
            return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Some(a) if a == "exec-tty" => {
            let code = mpsfleet_agent::exec::tty_main(args);
            return std::process::ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        _ => {}
    }
    // A shell asking for completions (`COMPLETE=bash mpsfleet -- WORDS…`, or
    // MPSFLEET_COMPLETE) is answered here, and the process ends.
    for var in [cli::complete::VAR, cli::complete::OWN_VAR] {
        clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command).var(var).complete();
    }
    let cli = Cli::parse_from(hoist_global_flags(std::env::args_os().collect()));
    let result = match cli.command {
        Command::Up(args) => up::run(args),
        Command::Server(args) => server::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Sim(args) => sim::run(args),
        Command::Completion { shell, fixed: true } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "mpsfleet",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Completion { shell, fixed: false } => completion_script(shell),
        Command::Taskdef(g) => cli::run(g.opts, cli::Resource::Taskdef(g.command)),
        Command::Task(g) => cli::run(g.opts, cli::Resource::Task(g.command)),
        Command::Host(g) => cli::run(g.opts, cli::Resource::Host(g.command)),
        Command::Pool(g) => cli::run(g.opts, cli::Resource::Pool(g.command)),
        Command::Service(g) => cli::run(g.opts, cli::Resource::Service(g.command)),
        Command::Incident(g) => cli::run(g.opts, cli::Resource::Incident(g.command)),
        Command::Drill(g) => cli::run(g.opts, cli::Resource::Drill(g.command)),
        Command::Secret(g) => cli::run(g.opts, cli::Resource::Secret(g.command)),
        Command::Token(g) => cli::run(g.opts, cli::Resource::Token(g.command)),
        Command::Audit(g) => cli::run(g.opts, cli::Resource::Audit(g.command)),
        Command::Events(a) => cli::run(
            a.opts,
            cli::Resource::Events { kinds: a.kinds, limit: a.limit, follow: a.follow, since: a.since },
        ),
        Command::JoinToken(g) => cli::run(g.opts, cli::Resource::JoinToken(g.command)),
        Command::Console(a) => {
            cli::run(a.opts, cli::Resource::Console { no_browser: a.no_browser, link_ttl: a.link_ttl })
        }
        Command::Cluster(g) => cli::run(g.opts, cli::Resource::Cluster(g.command)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `task exec` ends with its command's code.
        Err(e) if e.downcast_ref::<cli::exec::ExitWith>().is_some() => {
            std::process::ExitCode::from(e.downcast_ref::<cli::exec::ExitWith>().map_or(1, |x| x.0))
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<wait::TimedOut>().is_some() {
                return std::process::ExitCode::from(wait::TIMED_OUT);
            }
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn args(s: &str) -> Vec<std::ffi::OsString> {
        s.split(' ').map(Into::into).collect()
    }

    #[test]
    fn global_flags_before_the_command_move_after_it() {
        assert_eq!(hoist_global_flags(args("m --token x host list")), args("m host --token x list"));
        assert_eq!(
            hoist_global_flags(args("m -o json --server=a:1 task list --all")),
            args("m task -o json --server=a:1 list --all")
        );
        assert_eq!(hoist_global_flags(args("m -ojson pool list")), args("m pool -ojson list"));
        assert_eq!(hoist_global_flags(args("m host list --token x")), args("m host list --token x"));
        assert_eq!(hoist_global_flags(args("m --token")), args("m --token"));
        // Parsed as clap parses them.
        let cli = Cli::try_parse_from(hoist_global_flags(args("m --token x -o json host list"))).unwrap();
        assert!(matches!(cli.command, Command::Host(_)));
    }

    #[test]
    fn a_service_takes_a_count_or_daemon_not_both() {
        assert!(Cli::try_parse_from(args("m service create a --taskdef t --daemon")).is_ok());
        assert!(Cli::try_parse_from(args("m service create a --taskdef t --desired 2")).is_ok());
        for bad in ["m service create a --taskdef t", "m service create a --taskdef t --desired 2 --daemon"] {
            assert!(Cli::try_parse_from(args(bad)).is_err(), "{bad}");
        }
    }

    /// Every command and every option says what it is for in `--help`.
    #[test]
    fn every_command_and_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && path != "mpsfleet" {
                missing.push(format!("{path}: no about"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}: no help"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() != "help" {
                    walk(sub, &path, missing);
                }
            }
        }
        let mut missing = Vec::new();
        let cmd = Cli::command();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "{} without help:\n{}", missing.len(), missing.join("\n"));
    }

    #[test]
    fn completion_scripts_name_the_commands() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "mpsfleet", &mut out);
            let text = String::from_utf8(out).unwrap();
            for word in ["service", "deployments", "taskdef"] {
                assert!(text.contains(word), "{shell:?} completion lacks {word}");
            }
        }
    }
}
