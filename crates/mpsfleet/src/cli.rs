//! The resource commands of the CLI: `taskdef`, `task`, `host`, `pool`, `service`, `secret`.

use crate::describe::{deployment_rows, task_policy_cell, DEPLOYMENT_HEADERS};
use crate::output::{self, opt, sanitize, sanitize_text, Format};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use mpsfleet_client::{Client, TaskQuery};
use mpsfleet_types::api::OperatorCommandResponse;
use mpsfleet_types::event::EventType;
use mpsfleet_types::*;
use std::path::PathBuf;

mod access;
pub mod complete;
mod drill;
pub mod exec;
mod incident;
mod logs;
mod pool;
mod task;
mod watch;
use access::{ca_command, cluster_status, join_token, secret, token};
pub use drill::DrillCommand;
pub use incident::IncidentCommand;
use incident::{incident, print_incident, print_operator_command, warn_unplaced_moves};
use task::{now_ms, task};

/// Options every resource command takes, then the command.
#[derive(Args)]
pub struct Global<C: Subcommand> {
    #[command(flatten)]
    pub opts: Opts,
    #[command(subcommand)]
    pub command: C,
}

#[derive(Args)]
pub struct Opts {
    /// The server's address [default: from the client config `mpsfleet up` writes, else
    /// https://127.0.0.1:7070].
    #[arg(long, global = true, env = "MPSFLEET_SERVER", help_heading = "Global options")]
    server: Option<String>,
    /// The cluster CA to verify an https:// server with [default: from the client config, else
    /// ./.mpsfleet/ca.pem].
    #[arg(long, global = true, env = "MPSFLEET_CA_FILE", help_heading = "Global options")]
    ca_file: Option<PathBuf>,
    /// Bearer token [default: from the client config, else ./.mpsfleet/admin.token].
    #[arg(
        long,
        global = true,
        env = "MPSFLEET_TOKEN",
        hide_env_values = true,
        help_heading = "Global options"
    )]
    token: Option<String>,
    /// Output format: table, wide, json, yaml, name (KIND/NAME per object),
    /// jsonpath=TEMPLATE (kubectl's template syntax: `{.items[*].id}`, `{range}…{end}`), or
    /// custom-columns=HEADER:PATH[,HEADER:PATH...] (`ID:.id,HOST:.hostId`).
    #[arg(short = 'o', long, global = true, value_parser = output::parse_format, default_value = "table", help_heading = "Global options")]
    output: Format,
    /// Tables without their header line.
    #[arg(long, global = true, help_heading = "Global options")]
    no_headers: bool,
    /// Sort lists by the value at this JSONPath of each item (`.createdAtMs`, `.hostId`).
    #[arg(long, global = true, value_name = "PATH", help_heading = "Global options")]
    sort_by: Option<String>,
    /// Lists: only objects whose tags match (key=value, key!=value or key; comma-separated,
    /// all must hold). A task's tags are its run's.
    #[arg(short = 'l', long, global = true, value_name = "SELECTOR", help_heading = "Global options")]
    selector: Option<String>,
}

#[derive(Subcommand)]
pub enum TaskdefCommand {
    /// Register a task definition from ECS-shaped JSON; prints family:revision.
    Register {
        /// The task definition: a JSON file in ECS's RegisterTaskDefinition shape.
        #[arg(long)]
        file: PathBuf,
    },
    /// Task definitions, newest revision first.
    List {
        /// Only this family.
        #[arg(long)]
        family: Option<String>,
    },
    /// Describe `family` (latest revision) or `family:revision`.
    Describe {
        /// `family` (latest revision) or `family:revision`.
        #[arg(add = complete::taskdefs())]
        reference: String,
    },
}

#[derive(Subcommand)]
pub enum TaskCommand {
    /// Start tasks of a task definition in a pool.
    Run {
        /// `family` (latest revision) or `family:revision`.
        #[arg(long, add = complete::taskdefs())]
        taskdef: String,
        /// How many tasks to start.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// The pool to place them in [default: the only pool, or MPSFLEET_POOL].
        #[arg(long, env = "MPSFLEET_POOL", add = complete::pools())]
        pool: Option<String>,
        /// Makes the call idempotent, as ECS's clientToken: sent again with the same token, it
        /// answers what the first call did instead of changing anything again (kept 24 h).
        #[arg(long)]
        client_token: Option<String>,
        /// A tag of the run, KEY=VALUE (repeatable; ECS RunTask's tags): `task list -l KEY=VALUE`
        /// selects by it.
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// The tasks' priority, 1 to 100: where the pool's preemption allows, a task that finds
        /// no room may stop tasks at least 10 below it [default: the `mpsfleet:priority` tag of
        /// the run, else of the task definition, else 50].
        #[arg(long, value_name = "N")]
        priority: Option<u32>,
        /// Whether `task exec` may run commands in its tasks (ECS's enableExecuteCommand):
        /// `--enable-execute-command=false` turns it off [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        enable_execute_command: Option<bool>,
        #[command(flatten)]
        wait: crate::wait::WaitFlags,
    },
    /// Tasks, newest first; STOPPED ones only with --all or --status STOPPED.
    List {
        /// Only tasks of this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Only tasks of this service.
        #[arg(long)]
        service: Option<String>,
        /// Only tasks placed on this host.
        #[arg(long)]
        host: Option<String>,
        /// Only tasks whose lastStatus is this (RUNNING, PENDING, STOPPED, ...).
        #[arg(long)]
        status: Option<String>,
        /// At most this many (newest first).
        #[arg(long)]
        limit: Option<usize>,
        /// Leave out this many of the newest first (paging, with --limit).
        #[arg(long)]
        skip: Option<usize>,
        /// Show STOPPED tasks too.
        #[arg(long)]
        all: bool,
        /// After the list, print each task again as it changes (kubectl get -w), until Ctrl-C.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// One task: containers, exit codes, stop code and reason, times, health, GPUs, network bindings.
    Describe {
        /// The task's id.
        #[arg(add = complete::tasks())]
        id: String,
    },
    /// Protect a task from its service's scale-in and deployments for a while (ECS's task
    /// scale-in protection), or end that with --off.
    Protect {
        /// The task's id.
        #[arg(add = complete::tasks())]
        id: String,
        /// For how many minutes, 1 to 2880.
        #[arg(long, default_value_t = 120)]
        minutes: u32,
        /// End the task's protection now.
        #[arg(long, conflicts_with = "minutes")]
        off: bool,
    },
    /// Run a command inside a running task's container, as kubectl exec and docker exec do:
    /// in its Docker container, or for a process task as its uid with its environment and
    /// working directory (its MPS variables included). Exits with the command's exit code;
    /// 255 when the session ends without one (the task stopped, the session was idle too long).
    Exec {
        /// The task's id.
        #[arg(add = complete::tasks())]
        id: String,
        /// The container to run in [default: the task definition's first].
        #[arg(long, short = 'c')]
        container: Option<String>,
        /// Pass this terminal's stdin to the command.
        #[arg(long, short = 'i')]
        interactive: bool,
        /// Run the command on a terminal (with its size, which follows this one's).
        #[arg(long, short = 't')]
        tty: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Stop a task (its containers get SIGTERM, then SIGKILL after their stopTimeout).
    Stop {
        /// The task's id.
        #[arg(add = complete::tasks())]
        id: String,
        /// Why (kept as the task's stoppedReason).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        wait: crate::wait::WaitFlags,
    },
    /// Print the end of a task container's output (fetched from its host's agent).
    ///
    /// Control characters other than newline and tab (escape sequences, carriage returns) are
    /// shown as visible escapes such as \x1b; `-o json` gives the exact text.
    Logs {
        /// The task's id.
        #[arg(add = complete::tasks())]
        id: String,
        #[command(flatten)]
        opts: logs::LogOptions,
    },
}

#[derive(Subcommand)]
pub enum HostCommand {
    /// Hosts with their status and health; DEREGISTERED ones only with --all.
    List {
        /// Only hosts of this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Show DEREGISTERED hosts too.
        #[arg(long)]
        all: bool,
        /// After the list, print each host again as it changes (kubectl get -w), until Ctrl-C.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// One host: GPUs with sharing mode, MPS memory and clients, checks with reasons, tasks.
    Describe {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
    /// Stop placing new tasks on the host; what runs there keeps running.
    Cordon {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
    /// Place new tasks on the host again.
    Uncordon {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
    /// Cordon and drain the host: its service tasks move, its other tasks stop.
    Drain {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
        /// Wait until no task is left on the host, with progress on stderr (exit 0; 124 if
        /// --timeout passed first).
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, in seconds.
        #[arg(long, default_value_t = 300, value_name = "SECONDS")]
        timeout: u64,
    },
    /// Drain the host, launch a replacement through the pool's provider, terminate the old one.
    Replace {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
    /// Return a repaired host to ACTIVE (refused while any check is not OK); its incident resolves.
    Activate {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
    /// After fixing a host whose agent gave up restarting an MPS daemon: re-arm its local
    /// repair, so the daemon is started again and its check can turn OK (recorded on the
    /// host's open incident).
    Recheck {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
    /// Remove a host that does not exist (a machine that is gone, or a registration someone
    /// else made): DEREGISTERED, its tasks stopped, its credential revoked, its GPU UUIDs free
    /// for the machine that has them. Refused while it heartbeats, unless --force.
    Forget {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
        /// Even though something heartbeats as the host (it is not the machine it claims).
        #[arg(long)]
        force: bool,
    },
    /// Refuse the host's credential from now on (admin): for a leaked one. The host then
    /// stops reporting and its pool's health policy takes over; the machine joins again as
    /// a new host.
    RevokeCredential {
        /// The host's id.
        #[arg(add = complete::hosts())]
        id: String,
    },
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool of GPU hosts with its recovery mode and placement settings.
    Create {
        /// The pool's name.
        name: String,
        /// Who owns host recovery: mpsfleet (managed) or the operator (self-managed).
        #[arg(long, value_parser = ["managed", "self-managed"])]
        mode: Option<String>,
        /// How tasks are placed: binpack (fill GPUs first) or spread (even them out) [default: binpack].
        #[arg(long, value_parser = ["binpack", "spread"])]
        strategy: Option<String>,
        /// Bound on the sum of maxComputePercent of the MPS clients of one GPU.
        #[arg(long)]
        compute_overcommit_percent: Option<u32>,
        /// Let process tasks run as the `user` their definition names (root included); off by
        /// default: they run as an unprivileged user of their own (docs/security.md).
        #[arg(long, value_name = "BOOL")]
        allow_task_users: Option<bool>,
        /// The longest accepted from a failure's first signal to its tasks running again: a
        /// policy whose stated bound is longer is refused (docs/pools.md "Recovery bounds").
        #[arg(long)]
        max_resume_seconds: Option<u32>,
        /// Which placements may stop tasks at least 10 priority below them when nothing fits:
        /// none (off), replicas replacing ones lost to a failure (recovery), or any (all)
        /// [default: recovery].
        #[arg(long, value_parser = ["off", "recovery", "all"])]
        preemption: Option<String>,
        /// When a restart service's replicas on a failed MPS daemon get copies elsewhere: at
        /// the daemon's first exit, or once its failure is confirmed [default: first-exit].
        #[arg(long, value_parser = ["first-exit", "confirmed"])]
        restart_copies: Option<String>,
        /// JSON with any of healthPolicy, remediationPolicy, provider, taskPolicy,
        /// maxResumeSeconds, preemption and restartCopies (see docs/pools.md).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Change a pool's policies or placement settings (JSON as for create); nothing restarts.
    Update {
        /// The pool's name.
        #[arg(add = complete::pools())]
        name: String,
        /// How tasks are placed: binpack or spread.
        #[arg(long, value_parser = ["binpack", "spread"])]
        strategy: Option<String>,
        /// Bound on the sum of maxComputePercent of the MPS clients of one GPU.
        #[arg(long)]
        compute_overcommit_percent: Option<u32>,
        /// Let process tasks run as the `user` their definition names.
        #[arg(long, value_name = "BOOL")]
        allow_task_users: Option<bool>,
        /// The longest accepted from a failure's first signal to its tasks running again; 0
        /// removes the limit.
        #[arg(long)]
        max_resume_seconds: Option<u32>,
        /// Which placements may stop tasks at least 10 priority below them when nothing fits:
        /// off, recovery or all.
        #[arg(long, value_parser = ["off", "recovery", "all"])]
        preemption: Option<String>,
        /// When a restart service's replicas on a failed MPS daemon get copies elsewhere:
        /// first-exit or confirmed.
        #[arg(long, value_parser = ["first-exit", "confirmed"])]
        restart_copies: Option<String>,
        /// JSON with any of healthPolicy, remediationPolicy, provider, taskPolicy,
        /// maxResumeSeconds, preemption and restartCopies (docs/pools.md).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Every pool.
    List,
    /// One pool: its settings and policies.
    Describe {
        /// The pool's name.
        #[arg(add = complete::pools())]
        name: String,
    },
    /// Who notices, decides, repairs and replaces in this pool, from its configuration.
    Explain {
        /// The pool's name.
        #[arg(add = complete::pools())]
        name: String,
    },
}

#[derive(Subcommand)]
pub enum ServiceCommand {
    /// Create a service: keep --desired tasks of a task definition running, or with --daemon
    /// one on each ACTIVE host of the pool.
    Create {
        /// The service's name.
        name: String,
        /// `family` (latest revision) or `family:revision`.
        #[arg(long, add = complete::taskdefs())]
        taskdef: String,
        /// The number of tasks to keep running.
        #[arg(long, required_unless_present = "daemon")]
        desired: Option<u32>,
        /// One task on each ACTIVE host of the pool (ECS's DAEMON scheduling strategy): a host
        /// that joins gets one, a host that drains or leaves has its task stopped, and a
        /// deployment replaces each host's task in place.
        #[arg(long, conflicts_with = "desired")]
        daemon: bool,
        /// The pool to run them in [default: the only pool, or MPSFLEET_POOL].
        #[arg(long, env = "MPSFLEET_POOL", add = complete::pools())]
        pool: Option<String>,
        /// When tasks on a bad host start elsewhere: at once (restart) or only after the old
        /// host is confirmed terminated (fenced).
        #[arg(long, value_parser = ["restart", "fenced"], default_value = "restart")]
        resumption: String,
        /// Seconds a replica stopped by a deployment or a scale-in stays out of service
        /// discovery (DNS weight 0) before it gets SIGTERM, for the requests in flight
        /// (docs/traffic.md) [default: 2 on create].
        #[arg(long, value_name = "SECONDS")]
        deregistration_delay: Option<u32>,
        /// Its tasks' priority, 1 to 100: where the pool's preemption allows, a task that finds no
        /// room may stop tasks at least 10 below it [default: the `mpsfleet:priority` tag of the
        /// task definition, else 50].
        #[arg(long, value_name = "N")]
        priority: Option<u32>,
        /// Whether `task exec` may run commands in its tasks (ECS's enableExecuteCommand):
        /// `--enable-execute-command=false` turns it off [default: true].
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        enable_execute_command: Option<bool>,
        #[command(flatten)]
        deployment: DeploymentFlags,
        /// Makes the call idempotent, as ECS's clientToken: sent again with the same token, it
        /// answers what the first call did instead of changing anything again (kept 24 h).
        #[arg(long)]
        client_token: Option<String>,
        #[command(flatten)]
        wait: crate::wait::WaitFlags,
    },
    /// Change a service's definition (a new deployment rolls its tasks over within the
    /// deployment bounds), desired count or deployment configuration.
    Update {
        /// The service's name.
        #[arg(add = complete::services())]
        name: String,
        /// The task definition to roll over to: `family` (latest revision) or `family:revision`.
        #[arg(long)]
        taskdef: Option<String>,
        /// The number of tasks to keep running.
        #[arg(long)]
        desired: Option<u32>,
        /// Seconds a replica stopped by a deployment or a scale-in stays out of service
        /// discovery (DNS weight 0) before it gets SIGTERM, for the requests in flight
        /// (docs/traffic.md) [default: 2 on create].
        #[arg(long, value_name = "SECONDS")]
        deregistration_delay: Option<u32>,
        /// Its priority, 1 to 100; its running tasks take the new one at once.
        #[arg(long, value_name = "N")]
        priority: Option<u32>,
        /// Whether `task exec` may run commands in its tasks (ECS's enableExecuteCommand):
        /// `--enable-execute-command=false` turns it off (for the tasks it starts from now on).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        enable_execute_command: Option<bool>,
        #[command(flatten)]
        deployment: DeploymentFlags,
        /// Makes the call idempotent, as ECS's clientToken: sent again with the same token, it
        /// answers what the first call did instead of changing anything again (kept 24 h).
        #[arg(long)]
        client_token: Option<String>,
        #[command(flatten)]
        wait: crate::wait::WaitFlags,
    },
    /// Every service with its counts.
    List,
    /// One service: its configuration, deployments, replicas by host and GPU, and events.
    Describe {
        /// The service's name.
        #[arg(add = complete::services())]
        name: String,
    },
    /// The output of every task the service runs, interleaved by time, each line prefixed
    /// `[task/ID/CONTAINER]` (`-o json`: a JSON line each, with its taskId).
    Logs {
        /// The service's name.
        #[arg(add = complete::services())]
        name: String,
        #[command(flatten)]
        opts: logs::LogOptions,
    },
    /// The service's deployments, newest first: state, definition and task counts.
    Deployments {
        /// The service's name.
        #[arg(add = complete::services())]
        name: String,
    },
    /// Where every running replica can be reached: the address and port each binding is bound
    /// on (0.0.0.0: all interfaces), and its scope.
    Endpoints {
        /// The service's name.
        #[arg(add = complete::services())]
        name: String,
    },
    /// Stop the service's tasks and remove it.
    Delete {
        /// The service's name.
        #[arg(add = complete::services())]
        name: String,
    },
}

/// ECS's `deploymentConfiguration` as flags; on `update`, the ones given change and the
/// others keep their values.
#[derive(Args)]
pub struct DeploymentFlags {
    /// The fewest healthy tasks during a deployment, in percent of the desired count (rounded
    /// up) [default: 100].
    #[arg(long, value_name = "PERCENT")]
    min_healthy_percent: Option<u32>,
    /// The most tasks during a deployment, in percent of the desired count (rounded down)
    /// [default: 200].
    #[arg(long, value_name = "PERCENT")]
    max_percent: Option<u32>,
    /// Fail a deployment whose new tasks keep failing (half the desired count, at least 3, at
    /// most 200) [default: false].
    #[arg(long, value_name = "BOOL")]
    circuit_breaker: Option<bool>,
    /// With the circuit breaker: go back to the last deployment that completed [default: false].
    #[arg(long, value_name = "BOOL")]
    rollback: Option<bool>,
}

impl DeploymentFlags {
    /// `base` with the flags given applied; None when no flag was given.
    fn apply(&self, base: DeploymentConfiguration) -> Option<DeploymentConfiguration> {
        if self.min_healthy_percent.is_none()
            && self.max_percent.is_none()
            && self.circuit_breaker.is_none()
            && self.rollback.is_none()
        {
            return None;
        }
        let mut c = base;
        if let Some(v) = self.min_healthy_percent {
            c.minimum_healthy_percent = v;
        }
        if let Some(v) = self.max_percent {
            c.maximum_percent = v;
        }
        if let Some(v) = self.circuit_breaker {
            c.deployment_circuit_breaker.enable = v;
        }
        if let Some(v) = self.rollback {
            c.deployment_circuit_breaker.rollback = v;
            c.deployment_circuit_breaker.enable |= v;
        }
        Some(c)
    }
}

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Store a secret. NAME is what task definitions' `valueFrom` (or
    /// `credentialsParameter`) says: an ARN string or a plain name. The value is read from a
    /// file, never from the command line.
    Create {
        /// The secret's name.
        name: String,
        /// File holding the value (at most 64 KiB); `-` reads standard input. A single
        /// trailing newline is dropped.
        #[arg(long)]
        from_file: PathBuf,
    },
    /// Names, sizes and times of the stored secrets (never their values).
    List,
    /// Delete a secret; tasks already started keep the value they got.
    Delete {
        /// The secret's name.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Make a token for a person or tool; it is printed this once. Roles: viewer (read),
    /// operator (task definitions, tasks, services, hosts, incidents), admin (everything).
    Create {
        /// What it may do: viewer, operator or admin.
        #[arg(long)]
        role: mpsfleet_types::access::Role,
        /// How long it works: seconds, or with a unit (`90m`, `24h`, `30d`); none: until revoked.
        #[arg(long, value_parser = parse_lifetime)]
        expires_in: Option<u64>,
        /// Who or what it is for.
        #[arg(long, default_value = "")]
        description: String,
        /// Scope it to one pool (viewer and operator tokens): it sees and changes that pool's
        /// hosts, tasks, services and incidents only.
        #[arg(long)]
        pool: Option<String>,
        /// Also an AWS access key for the ECS-compatible API (`aws ecs ...`, boto3): prints an
        /// access key id, and the token is its secret access key.
        #[arg(long)]
        aws: bool,
        /// With --aws: write the key as this AWS profile (~/.aws/credentials, and ~/.aws/config
        /// with this server as its endpoint_url, its CA as ca_bundle, region us-east-1), so
        /// that `aws --profile NAME ecs ...` and boto3's `Session(profile_name=NAME)` reach it.
        /// A profile of that name is replaced; nothing else in the files changes.
        #[arg(long, requires = "aws", value_name = "NAME")]
        aws_profile: Option<String>,
    },
    /// Every token's id, role and expiry (never the tokens themselves); a console sign-in
    /// follows the token it was made from, which its FROM column names.
    List,
    /// The token stops working at once, and so does every console sign-in made from it.
    Revoke {
        /// The token's id (from `token list`).
        id: String,
    },
    /// Replace the bootstrap admin token (admin.token): the old one stops working at once; the
    /// new one is printed and written to the server's admin.token. Clients that held the old
    /// one need the new (MPSFLEET_TOKEN; `mpsfleet up` rewrites its client config when it
    /// starts).
    RotateAdmin,
}

#[derive(Subcommand)]
pub enum JoinTokenCommand {
    /// Make a join token; it is printed this once, with the cluster CA's hash after it (what
    /// an agent's --join-token takes). To rotate: make a new one, hand it out, revoke the old.
    Create {
        /// How long it works: seconds, or with a unit (`90m`, `24h`, `30d`) [default: 24h].
        #[arg(long, value_parser = parse_lifetime)]
        expires_in: Option<u64>,
        /// Who or what it is for.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Every join token's id and expiry (never the tokens themselves).
    List,
    /// The join token stops working at once; hosts it registered keep theirs.
    Revoke {
        /// The join token's id (from `join-token list`).
        id: String,
    },
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Where the state lives, the store's revision, which server leads (and its lease), and
    /// with etcd every member and how it answered (docs/ha.md).
    Status,
    /// The certificate the server serves: its names, validity and the CA it chains to.
    Certificate,
    /// The server issues itself a new certificate (and key) under the cluster CA and serves
    /// it from the next connection on; clients that trust the CA notice nothing.
    RotateCertificate,
    /// The cluster's CA and its rotation (docs/security.md, "Rotating the CA").
    #[command(subcommand)]
    Ca(CaCommand),
}

#[derive(Subcommand)]
pub enum CaCommand {
    /// The active CA, the next one during a rotation, and the hosts that do not trust it yet.
    Status,
    /// Stage the next CA (given, or made by the cluster): agents fetch it and trust it
    /// alongside the active one, which keeps signing until `activate`.
    Rotate {
        /// The next CA's certificate (PEM), instead of one the cluster makes.
        #[arg(long, value_name = "FILE", requires = "ca_key")]
        ca_cert: Option<PathBuf>,
        /// Its private key (PKCS#8 PEM).
        #[arg(long, value_name = "FILE", requires = "ca_cert")]
        ca_key: Option<PathBuf>,
    },
    /// Certificates are issued under the next CA from now on, and the old one is trusted no
    /// more; refused while a host has not reported trusting the next one, unless --force.
    Activate {
        /// Even though some hosts have not reported trusting the next CA.
        #[arg(long)]
        force: bool,
    },
    /// Drop the staged CA.
    Cancel,
}

/// `90`, `90s`, `15m`, `24h`, `30d` in seconds.
fn parse_lifetime(s: &str) -> Result<u64, String> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits.parse().map_err(|_| format!("{s:?}: expected a number with s, m, h or d"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{s:?} is too long"))
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// The newest changes made through the API: who (token and role), what, when, from where,
    /// and the result.
    List {
        /// At most this many entries.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

pub enum Resource {
    Audit(AuditCommand),
    JoinToken(JoinTokenCommand),
    Cluster(ClusterCommand),
    Token(TokenCommand),
    Secret(SecretCommand),
    Taskdef(TaskdefCommand),
    Task(TaskCommand),
    Host(HostCommand),
    Pool(PoolCommand),
    Service(ServiceCommand),
    Incident(IncidentCommand),
    Drill(DrillCommand),
    Events { kinds: Vec<String>, limit: Option<u64>, follow: bool, since: Option<String> },
    Console { no_browser: bool, link_ttl: u64 },
}

/// `mpsfleet console`: the options every client command takes, and how to open it.
#[derive(Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub opts: Opts,
    /// Print the address only; do not start a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// How long the sign-in link works, in seconds (1 to 600); it works once.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub link_ttl: u64,
}

/// `mpsfleet events`: the options every client command takes, and which events.
#[derive(Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub opts: Opts,
    /// Only events of this type (repeatable): incident.opened, incident.updated,
    /// incident.resolved, incident.blocked, host.health, host.status, task.stopped, task.event,
    /// host.event, service.event or pool.event (drills are their pool's).
    #[arg(long = "kind", value_name = "TYPE")]
    pub kinds: Vec<String>,
    /// Stop after this many events.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Keep printing new events as they happen, after the past ones, until Ctrl-C (or --limit).
    #[arg(short, long)]
    pub follow: bool,
    /// Only events this recent: 30s, 10m, 2h, 1h30m [default: all the server keeps, the last
    /// hour and at most 10,000 events; with --follow, none of the past].
    #[arg(long, value_name = "AGE")]
    pub since: Option<String>,
}

/// `mpsfleet console`: a one-time sign-in link for the console with this CLI's role, opened in
/// a browser when one can be started, and printed in any case.
async fn console(c: &Client, no_browser: bool, link_ttl: u64) -> Result<()> {
    let req = mpsfleet_types::access::CreateConsoleLink { expires_in_seconds: Some(link_ttl) };
    let link = c.create_console_link(&req).await?;
    // The code rides in the fragment: browsers never send it to the server or a proxy.
    let url = format!("{}/#login={}", c.base().trim_end_matches('/'), link.code);
    println!(
        "Open the console, signed in as {} (the link works once, until {}):\n  {url}",
        link.role.as_str(),
        output::utc_time(link.expires_at_ms)
    );
    if !no_browser {
        let graphical =
            std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
        let opener = std::env::var("BROWSER")
            .ok()
            .filter(|b| !b.trim().is_empty())
            .or_else(|| graphical.then(|| "xdg-open".to_string()));
        if let Some(opener) = opener {
            let started = std::process::Command::new(&opener)
                .arg(&url)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
            match started {
                Ok(_) => println!("opened with {opener}"),
                Err(e) => eprintln!("could not start {opener} ({e}): open the address above"),
            }
        }
    }
    Ok(())
}

/// The pool a command names, else MPSFLEET_POOL (clap reads it), else the server's only pool.
async fn resolve_pool(c: &Client, given: Option<String>) -> Result<String> {
    if let Some(p) = given {
        return Ok(p);
    }
    let pools = c.list_pools().await?;
    match pools.as_slice() {
        [one] => Ok(one.name.to_string()),
        [] => anyhow::bail!(
            "--pool is needed, and the server has no pool yet: create one with `mpsfleet pool create NAME`"
        ),
        many => {
            let names: Vec<String> = many.iter().map(|p| p.name.to_string()).collect();
            anyhow::bail!(
                "--pool is needed: the server has {} pools ({}); give --pool or set MPSFLEET_POOL",
                names.len(),
                sanitize(&names.join(", "))
            )
        }
    }
}

/// A server address as given, with `https://` before each one that names no scheme
/// (`127.0.0.1:7070`); comma-separated lists stay lists.
fn with_scheme(server: &str) -> String {
    server
        .split(',')
        .map(|s| {
            let s = s.trim();
            if s.contains("://") {
                s.to_string()
            } else {
                format!("https://{s}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The server the CLI talks to and the CA it trusts there.
pub(crate) struct Endpoint {
    pub server: String,
    pub ca_file: Option<PathBuf>,
}

/// [`Endpoint`]: flags or variables first, then the client config `mpsfleet up` writes, then
/// a server started from this directory with the default data dir.
fn endpoint(opts: &Opts) -> Endpoint {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        server: String,
        #[serde(default)]
        ca_file: Option<PathBuf>,
    }
    let config: Option<Config> = crate::up::client_config_path()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<Config>(&b).ok());
    let server = opts
        .server
        .clone()
        .or_else(|| config.as_ref().map(|c| c.server.clone()))
        .unwrap_or_else(|| "https://127.0.0.1:7070".to_string());
    let ca_file = opts
        .ca_file
        .clone()
        .or_else(|| config.as_ref().and_then(|c| c.ca_file.clone()))
        .or_else(|| Some(PathBuf::from(".mpsfleet/ca.pem")).filter(|p| p.is_file()));
    Endpoint { server: with_scheme(&server), ca_file }
}

/// Server and token: flags or variables first, then the client config `mpsfleet up`
/// writes, then a server started from this directory with the default data dir.
fn client(opts: &Opts) -> Result<Client> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        token: String,
    }
    let config: Option<Config> = crate::up::client_config_path()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<Config>(&b).ok());
    let Endpoint { server, ca_file } = endpoint(opts);
    let token = opts
        .token
        .clone()
        .or_else(|| config.map(|c| c.token))
        .or_else(|| std::fs::read_to_string(".mpsfleet/admin.token").ok().map(|t| t.trim().to_string()));
    let trust = match ca_file {
        Some(path) if server.starts_with("https://") => mpsfleet_client::tls::Trust::Ca(
            std::fs::read(&path).with_context(|| format!("cannot read the CA file {}", path.display()))?,
        ),
        _ => mpsfleet_client::tls::Trust::PlainHttp,
    };
    Ok(Client::with_trust(&server, token, &trust)?)
}

pub fn run(opts: Opts, cmd: Resource) -> Result<()> {
    output::set_listing(opts.no_headers, opts.sort_by.clone(), opts.selector.as_deref())
        .map_err(|e| anyhow::anyhow!(e))?;
    if let Resource::Events { kinds, since, .. } = &cmd {
        watch::check_kinds(kinds)?;
        since.as_deref().map(watch::parse_age).transpose()?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let c = client(&opts)?;
    let result = runtime.block_on(async {
        match cmd {
            Resource::Taskdef(cmd) => taskdef(&c, opts.output, cmd).await,
            Resource::Task(cmd) => task(&c, opts.output, cmd).await,
            Resource::Host(cmd) => host(&c, opts.output, cmd).await,
            Resource::Pool(cmd) => pool(&c, opts.output, cmd).await,
            Resource::Service(cmd) => service(&c, opts.output, cmd).await,
            Resource::Incident(cmd) => incident(&c, opts.output, cmd).await,
            Resource::Drill(cmd) => drill::drill(&c, opts.output, cmd).await,
            Resource::Console { no_browser, link_ttl } => console(&c, no_browser, link_ttl).await,
            Resource::Events { kinds, limit, follow, since } => {
                let since = since.as_deref().map(watch::parse_age).transpose()?;
                watch::events(&c, opts.output, &kinds, limit, follow, since).await
            }
            Resource::Secret(cmd) => secret(&c, opts.output, cmd).await,
            Resource::Token(cmd) => token(&c, opts.output, cmd, &endpoint(&opts)).await,
            Resource::JoinToken(cmd) => join_token(&c, opts.output, cmd).await,
            Resource::Cluster(cmd) => {
                let cert = match cmd {
                    ClusterCommand::Status => return cluster_status(&c, opts.output).await,
                    ClusterCommand::Certificate => c.server_certificate().await?,
                    ClusterCommand::RotateCertificate => c.rotate_certificate().await?,
                    ClusterCommand::Ca(cmd) => return ca_command(&c, cmd, opts.output).await,
                };
                let row = vec![
                    cert.sha256.clone(),
                    sanitize(&cert.names.join(",")).into_owned(),
                    output::utc_time(cert.not_after_ms),
                    cert.ca_hash.clone(),
                ];
                output::print(opts.output, &cert, &["SHA256", "NAMES", "NOT AFTER", "CA"], vec![row]);
                Ok(())
            }
            Resource::Audit(AuditCommand::List { limit }) => {
                let list = c.audit(limit).await?;
                let rows = list
                    .iter()
                    .map(|e| {
                        vec![
                            output::utc_time(e.at_ms),
                            sanitize(&e.actor).into_owned(),
                            e.role.as_str().into(),
                            sanitize(&e.action).into_owned(),
                            sanitize(&e.target).into_owned(),
                            sanitize(&e.from).into_owned(),
                            sanitize(&e.result).into_owned(),
                        ]
                    })
                    .collect();
                output::print(
                    opts.output,
                    &list,
                    &["TIME", "WHO", "ROLE", "ACTION", "TARGET", "FROM", "RESULT"],
                    rows,
                );
                Ok(())
            }
        }
    });
    // An error may quote the server or what it was sent; it is printed to the terminal too.
    // Its lines are kept (a refused task definition has one per error), other controls escaped.
    result.map_err(|e| {
        let text = format!("{e:#}");
        match sanitize_text(&text) {
            std::borrow::Cow::Borrowed(_) => e,
            std::borrow::Cow::Owned(clean) => anyhow::anyhow!(clean),
        }
    })
}

async fn taskdef(c: &Client, f: Format, cmd: TaskdefCommand) -> Result<()> {
    match cmd {
        TaskdefCommand::Register { file } => {
            let json = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let r = c.register_taskdef(json).await?;
            match f {
                Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
                    output::print(f, &r, &[], vec![])
                }
                Format::Table | Format::Wide => {
                    println!("{}", sanitize(&r.task_definition.to_string()));
                    if !r.ignored_fields.is_empty() {
                        eprintln!(
                            "ignored (accepted, not used by mpsfleet): {}",
                            sanitize(&r.ignored_fields.join(", "))
                        );
                    }
                }
            }
        }
        TaskdefCommand::List { family } => {
            let list = c.list_taskdefs(family.as_deref()).await?;
            let rows = list
                .iter()
                .map(|t| {
                    vec![t.reference().to_string(), t.container_definitions.len().to_string(), demand(t)]
                })
                .collect();
            output::print(f, &list, &["TASK DEFINITION", "CONTAINERS", "GPU"], rows);
        }
        TaskdefCommand::Describe { reference } => {
            let t = c.describe_taskdef(&reference).await?;
            // A task definition is a document: JSON is the readable form either way.
            output::print(if f == Format::Yaml { f } else { Format::Json }, &t, &[], vec![]);
        }
    }
    Ok(())
}

fn demand(t: &TaskDefinition) -> String {
    match t.gpu_demand() {
        GpuDemand::None => "-".into(),
        GpuDemand::Whole { count } => format!("{count} whole"),
        GpuDemand::Mps { memory_mib, clients, .. } => format!("MPS {memory_mib} MiB, {clients} client(s)"),
    }
}

fn host_rows(hosts: &[HostView]) -> Vec<Vec<String>> {
    let now = now_ms();
    hosts
        .iter()
        .map(|h| {
            let free: u64 = h.gpus.iter().map(|g| g.remaining_memory_mib).sum();
            let total: u64 = h.gpus.iter().map(|g| g.total_memory_mib).sum();
            vec![
                h.id.to_string(),
                h.pool.to_string(),
                h.hostname.clone(),
                h.status.as_str().into(),
                // A host that left the fleet has no health to show.
                if h.status == HostStatus::Deregistered {
                    "-".into()
                } else {
                    h.health_status.as_str().into()
                },
                if h.cordoned { "yes".into() } else { "no".into() },
                if h.emulated { "emulated".into() } else { "real".into() },
                match &h.runtime_version {
                    Some(v) => format!("{} {v}", h.runtime.as_str()),
                    None => h.runtime.as_str().into(),
                },
                h.gpus.len().to_string(),
                format!("{free}/{total}"),
                h.task_count.to_string(),
                output::age(now, h.registered_at_ms),
            ]
        })
        .collect()
}

async fn host(c: &Client, f: Format, cmd: HostCommand) -> Result<()> {
    const HEADERS: [&str; 12] = [
        "ID",
        "POOL",
        "HOSTNAME",
        "STATUS",
        "HEALTH",
        "CORDONED",
        "GPUS ARE",
        "RUNTIME",
        "GPUS",
        "FREE/TOTAL MiB",
        "TASKS",
        "AGE",
    ];
    let one = match cmd {
        HostCommand::List { pool, all, watch } => {
            let fetch = || async {
                let mut hosts = c.list_hosts(pool.as_deref()).await?;
                if !all {
                    hosts.retain(|h| h.status != HostStatus::Deregistered);
                }
                Ok(hosts)
            };
            if watch {
                let types = [EventType::HostStatus, EventType::HostHealth, EventType::HostEvent];
                return watch::watch(c, f, &types, &HEADERS, host_rows, fetch).await;
            }
            let hosts = fetch().await?;
            if f == Format::Wide {
                let headers = [&HEADERS[..], &["REGISTERED", "LAST HEARTBEAT"]].concat();
                let rows = host_rows(&hosts)
                    .into_iter()
                    .zip(&hosts)
                    .map(|(mut r, h)| {
                        let beat = h.last_heartbeat_ms.map_or("-".into(), output::utc_time);
                        r.extend([output::utc_time(h.registered_at_ms), beat]);
                        r
                    })
                    .collect();
                output::print(f, &hosts, &headers, rows);
            } else {
                output::print(f, &hosts, &HEADERS, host_rows(&hosts));
            }
            return Ok(());
        }
        HostCommand::Describe { id } => {
            let h = c.describe_host(&id).await?;
            if f.is_data() {
                output::print(f, &h, &[], Vec::new());
                return Ok(());
            }
            let query = TaskQuery { host: Some(h.id.to_string()), live: true, ..Default::default() };
            let tasks = c.list_tasks(&query).await?;
            print!("{}", crate::describe::host(&h, &tasks));
            return Ok(());
        }
        HostCommand::Cordon { id } => c.cordon_host(&id, true).await?,
        HostCommand::Uncordon { id } => c.cordon_host(&id, false).await?,
        HostCommand::Drain { id, wait, timeout } => {
            let v = c.host_action(&id, "drain").await?;
            let incident = v.incident.id.clone();
            print_incident(f, v)?;
            if wait {
                crate::wait::host_drained(c, crate::wait::WaitFlags { wait, timeout }, &id).await?;
            }
            warn_unplaced_moves(c, &incident).await;
            return Ok(());
        }
        HostCommand::Replace { id } => return print_incident(f, c.host_action(&id, "replace").await?),
        HostCommand::Activate { id } => return print_operator_command(f, c.activate_host(&id).await?),
        HostCommand::Recheck { id } => return print_operator_command(f, c.recheck_host(&id).await?),
        HostCommand::Forget { id, force } => c.forget_host(&id, force).await?,
        HostCommand::RevokeCredential { id } => c.revoke_host_credential(&id).await?,
    };
    match f {
        Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
            output::print(f, &one, &[], vec![])
        }
        Format::Table | Format::Wide => {
            print!("{}", output::table(&HEADERS, &host_rows(std::slice::from_ref(&one))));
            println!();
            let rows: Vec<Vec<String>> = one
                .gpus
                .iter()
                .map(|g| {
                    vec![
                        g.index.to_string(),
                        g.gpu_id.to_string(),
                        g.model.clone(),
                        g.sharing_mode.as_str().into(),
                        g.total_memory_mib.to_string(),
                        g.remaining_memory_mib.to_string(),
                        format!("{}/{}", g.client_count, g.max_clients),
                        g.compute_percent_sum.to_string(),
                    ]
                })
                .collect();
            let headers =
                ["INDEX", "GPU", "MODEL", "SHARING", "TOTAL MiB", "FREE MiB", "CLIENTS", "COMPUTE %"];
            print!("{}", output::table(&headers, &rows));
            if !one.checks.is_empty() {
                println!();
                let rows: Vec<Vec<String>> = one
                    .checks
                    .iter()
                    .map(|c| vec![c.name.clone(), opt(&c.gpu_id), c.status.as_str().into(), c.reason.clone()])
                    .collect();
                print!("{}", output::table(&["CHECK", "GPU", "STATUS", "REASON"], &rows));
            }
        }
    }
    Ok(())
}

/// A JSON body from a file, or the type's defaults without one.
fn read_json<T: serde::de::DeserializeOwned + Default>(file: Option<&PathBuf>) -> Result<T> {
    let Some(path) = file else { return Ok(T::default()) };
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a valid pool settings document", path.display()))
}

fn strategy_of(s: &str) -> PlacementStrategy {
    if s == "spread" {
        PlacementStrategy::Spread
    } else {
        PlacementStrategy::Binpack
    }
}

/// `--preemption`'s value (clap allows only the policy names).
fn preemption_of(s: &str) -> Preemption {
    Preemption::parse(s).unwrap_or_default()
}

fn pool_rows(pools: &[Pool]) -> Vec<Vec<String>> {
    pools
        .iter()
        .map(|p| {
            vec![
                p.name.to_string(),
                p.mode.as_str().into(),
                p.strategy.as_str().into(),
                p.compute_overcommit_percent.map_or_else(|| "none".into(), |c| format!("{c}%")),
                p.provider.as_ref().map_or_else(
                    || "-".into(),
                    |p| format!("{} ({} hosts)", p.kind.as_str(), p.desired_hosts),
                ),
                if p.allow_task_users { "definition's" } else { "own unprivileged" }.into(),
                task_policy_cell(&p.task_policy),
                p.preemption.as_str().into(),
            ]
        })
        .collect()
}

async fn pool(c: &Client, f: Format, cmd: PoolCommand) -> Result<()> {
    const HEADERS: [&str; 8] = [
        "NAME",
        "MODE",
        "STRATEGY",
        "COMPUTE BOUND",
        "PROVIDER",
        "PROCESS TASK USER",
        "TASK POLICY ALLOWS",
        "PREEMPTION",
    ];
    let one = match cmd {
        PoolCommand::Create {
            name,
            mode,
            strategy,
            compute_overcommit_percent,
            allow_task_users,
            max_resume_seconds,
            preemption,
            restart_copies,
            file,
        } => {
            let mut req: CreatePool = read_json(file.as_ref())?;
            req.name = name;
            req.mode =
                mode.map(
                    |m| if m == "managed" { OwnershipMode::Managed } else { OwnershipMode::SelfManaged },
                );
            req.strategy = strategy.as_deref().map(strategy_of).or(req.strategy);
            req.compute_overcommit_percent = compute_overcommit_percent.or(req.compute_overcommit_percent);
            req.allow_task_users = allow_task_users.or(req.allow_task_users);
            req.max_resume_seconds = max_resume_seconds.or(req.max_resume_seconds);
            req.preemption = preemption.as_deref().map(preemption_of).or(req.preemption);
            req.restart_copies =
                restart_copies.as_deref().and_then(|r| r.parse().ok()).or(req.restart_copies);
            c.create_pool(&req).await?
        }
        PoolCommand::Update {
            name,
            strategy,
            compute_overcommit_percent,
            allow_task_users,
            max_resume_seconds,
            preemption,
            restart_copies,
            file,
        } => {
            let mut req: UpdatePool = read_json(file.as_ref())?;
            req.strategy = strategy.as_deref().map(strategy_of).or(req.strategy);
            req.compute_overcommit_percent = compute_overcommit_percent.or(req.compute_overcommit_percent);
            req.allow_task_users = allow_task_users.or(req.allow_task_users);
            req.max_resume_seconds = max_resume_seconds.or(req.max_resume_seconds);
            req.preemption = preemption.as_deref().map(preemption_of).or(req.preemption);
            req.restart_copies =
                restart_copies.as_deref().and_then(|r| r.parse().ok()).or(req.restart_copies);
            c.update_pool(&name, &req).await?
        }
        PoolCommand::Explain { name } => {
            pool::print_explain(f, &c.explain_pool(&name).await?);
            return Ok(());
        }
        PoolCommand::List => {
            let pools = c.list_pools().await?;
            output::print(f, &pools, &HEADERS, pool_rows(&pools));
            return Ok(());
        }
        PoolCommand::Describe { name } => {
            let p = c.describe_pool(&name).await?;
            match f {
                Format::Table | Format::Wide => print!("{}", crate::describe::pool(&p)),
                _ => output::print(f, &p, &[], Vec::new()),
            }
            return Ok(());
        }
    };
    output::print(f, &one, &HEADERS, pool_rows(std::slice::from_ref(&one)));
    Ok(())
}

fn service_rows(list: &[ServiceView]) -> Vec<Vec<String>> {
    let now = now_ms();
    list.iter()
        .map(|s| {
            vec![
                s.service.name.to_string(),
                s.service.pool.to_string(),
                s.service.task_definition.to_string(),
                format!("{:?}", s.service.status).to_uppercase(),
                s.service.desired_count.to_string(),
                s.running_count.to_string(),
                s.pending_count.to_string(),
                s.service.priority.to_string(),
                output::age(now, s.service.created_at_ms),
            ]
        })
        .collect()
}

async fn service(c: &Client, f: Format, cmd: ServiceCommand) -> Result<()> {
    const HEADERS: [&str; 9] =
        ["NAME", "POOL", "TASK DEFINITION", "STATUS", "DESIRED", "RUNNING", "PENDING", "PRIORITY", "AGE"];
    let one = match cmd {
        ServiceCommand::Create {
            name,
            taskdef,
            desired,
            daemon,
            pool,
            resumption,
            deregistration_delay,
            priority,
            enable_execute_command,
            deployment,
            client_token,
            wait,
        } => {
            let pool = resolve_pool(c, pool).await?;
            let resumption = Some(if resumption == "fenced" {
                mpsfleet_types::policy::ResumptionBoundary::Fenced
            } else {
                mpsfleet_types::policy::ResumptionBoundary::Restart
            });
            let req = CreateService {
                name: name.clone(),
                pool,
                task_definition: taskdef,
                desired_count: desired.unwrap_or(0),
                scheduling_strategy: daemon.then_some(SchedulingStrategy::Daemon),
                resumption,
                deployment_configuration: deployment.apply(if daemon {
                    DeploymentConfiguration::daemon()
                } else {
                    DeploymentConfiguration::default()
                }),
                deregistration_delay_seconds: deregistration_delay,
                enable_execute_command,
                client_token,
                priority,
                ..Default::default()
            };
            let one = c.create_service(&req).await?;
            output::print(f, &one, &HEADERS, service_rows(std::slice::from_ref(&one)));
            if wait.wait {
                crate::wait::deployment_done(c, wait, &name).await?;
            }
            return Ok(());
        }
        ServiceCommand::Update {
            name,
            taskdef,
            desired,
            deregistration_delay,
            priority,
            enable_execute_command,
            deployment,
            client_token,
            wait,
        } => {
            let deployment_configuration = match deployment.apply(DeploymentConfiguration::default()) {
                None => None,
                Some(_) => {
                    deployment.apply(c.describe_service(&name).await?.service.deployment_configuration)
                }
            };
            let req = UpdateService {
                task_definition: taskdef,
                desired_count: desired,
                deployment_configuration,
                deregistration_delay_seconds: deregistration_delay,
                enable_execute_command,
                client_token,
                priority,
                ..Default::default()
            };
            let one = c.update_service(&name, &req).await?;
            output::print(f, &one, &HEADERS, service_rows(std::slice::from_ref(&one)));
            if wait.wait {
                crate::wait::deployment_done(c, wait, &name).await?;
            }
            return Ok(());
        }
        ServiceCommand::Deployments { name } => {
            let list = c.service_deployments(&name).await?;
            output::print(f, &list, &DEPLOYMENT_HEADERS, deployment_rows(&list));
            return Ok(());
        }
        ServiceCommand::List => {
            let list = c.list_services().await?;
            output::print(f, &list, &HEADERS, service_rows(&list));
            return Ok(());
        }
        ServiceCommand::Logs { name, opts } => return logs::service_logs(c, f, &name, &opts).await,
        ServiceCommand::Describe { name } => {
            let one = c.describe_service(&name).await?;
            if f.is_data() {
                output::print(f, &one, &[], vec![]);
                return Ok(());
            }
            let deployments = c.service_deployments(&name).await?;
            let query = TaskQuery { service: Some(name.clone()), ..Default::default() };
            let tasks = c.list_tasks(&query).await?;
            let hosts = c.list_hosts(Some(one.service.pool.as_str())).await.unwrap_or_default();
            let incidents = c.list_incidents().await.unwrap_or_default();
            print!("{}", crate::describe::service(&one, &deployments, &tasks, &hosts, &incidents));
            return Ok(());
        }
        ServiceCommand::Endpoints { name } => {
            let list = c.service_endpoints(&name).await?;
            // The bindings as the agents reported them: the address each port is bound on.
            let mut tasks = Vec::new();
            loop {
                let query = TaskQuery {
                    service: Some(name.clone()),
                    live: true,
                    skip: Some(tasks.len()),
                    limit: Some(1000),
                    ..Default::default()
                };
                let page = c.list_tasks(&query).await?;
                let last = page.len() < 1000;
                tasks.extend(page);
                if last {
                    break;
                }
            }
            let views = crate::endpoints::views(&list, &tasks);
            output::print(f, &views, &crate::endpoints::HEADERS, crate::endpoints::rows(&views));
            return Ok(());
        }
        ServiceCommand::Delete { name } => c.delete_service(&name).await?,
    };
    output::print(f, &one, &HEADERS, service_rows(std::slice::from_ref(&one)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::task::run_request;
    use super::*;
    use clap::Parser;

    fn parse(line: &str) -> Result<crate::Command, clap::Error> {
        crate::Cli::try_parse_from(line.split(' ')).map(|c| c.command)
    }

    fn task_run(line: &str) -> RunTask {
        let Ok(crate::Command::Task(g)) = parse(line) else { panic!("{line} does not parse") };
        let TaskCommand::Run { taskdef, count, pool, client_token, tags, priority, .. } = g.command else {
            panic!("{line}: not task run")
        };
        run_request(taskdef, count, pool.unwrap_or_default(), client_token, &tags, priority)
    }

    /// `--priority` goes into the body as given (the server checks 1 to 100); without it the
    /// body names none, and the server takes the `mpsfleet:priority` tag or 50.
    #[test]
    fn a_runs_priority_reaches_its_body() {
        let body = serde_json::to_value(task_run(
            "mpsfleet task run --taskdef infer --pool gpu --priority 90 --tag team=ml",
        ))
        .unwrap();
        assert_eq!(body["priority"], 90, "{body}");
        assert_eq!(body["tags"][0]["key"], "team", "{body}");
        let body = serde_json::to_value(task_run("mpsfleet task run --taskdef infer --pool gpu")).unwrap();
        assert!(body.get("priority").is_none(), "{body}");
        assert_eq!(task_run("mpsfleet task run --taskdef infer --pool gpu --priority 0").priority, Some(0));
        let err = parse("mpsfleet task run --taskdef infer --priority high").err().unwrap().to_string();
        assert!(err.contains("--priority"), "{err}");
    }

    #[test]
    fn services_take_a_priority_on_create_and_update() {
        let Ok(crate::Command::Service(g)) =
            parse("mpsfleet service create api --taskdef web:1 --desired 2 --priority 90")
        else {
            panic!("service create does not parse")
        };
        assert!(matches!(g.command, ServiceCommand::Create { priority: Some(90), .. }));
        let Ok(crate::Command::Service(g)) = parse("mpsfleet service update api --priority 10") else {
            panic!("service update does not parse")
        };
        assert!(matches!(g.command, ServiceCommand::Update { priority: Some(10), desired: None, .. }));
    }

    #[test]
    fn a_pools_preemption_is_one_of_the_policies() {
        for (line, want) in [
            ("mpsfleet pool create batch --preemption all", Preemption::All),
            ("mpsfleet pool create batch --preemption off", Preemption::Off),
            ("mpsfleet pool update batch --preemption recovery", Preemption::Recovery),
        ] {
            let given = match parse(line) {
                Ok(crate::Command::Pool(g)) => match g.command {
                    PoolCommand::Create { preemption, .. } | PoolCommand::Update { preemption, .. } => {
                        preemption
                    }
                    _ => None,
                },
                _ => panic!("{line} does not parse"),
            };
            assert_eq!(given.as_deref().map(preemption_of), Some(want), "{line}");
        }
        let req = CreatePool { preemption: Some(preemption_of("all")), ..Default::default() };
        assert_eq!(serde_json::to_value(&req).unwrap()["preemption"], "all");
        let err = parse("mpsfleet pool create batch --preemption sometimes").err().unwrap().to_string();
        assert!(err.contains("--preemption") && err.contains("off, recovery, all"), "{err}");
    }
}
