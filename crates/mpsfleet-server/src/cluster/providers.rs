//! The pools' capacity providers: a pool's provider is built from its configuration (and the
//! server's, for `exec` and `aws-ec2` providers) the first time it is needed, or set by the
//! caller (tests, the simulator). Providers are processes, commands and API clients, not
//! records: nothing here is stored.
//! The operations are `Cluster`'s, in `pools.rs`; what they share is here.

use super::*;
use crate::provider::Ec2Config;

/// The capacity provider of each pool that has one, and what building them needs.
#[derive(Default)]
pub(super) struct Providers {
    /// Built from the pool's configuration the first time it is needed (and again after the
    /// configuration changes), or set.
    pub(super) built: HashMap<PoolName, Arc<dyn CapacityProvider>>,
    /// Pools whose provider was set with [`Cluster::set_provider`], not built from config.
    pub(super) fixed: BTreeSet<PoolName>,
    pub(super) ctx: Option<ProviderContext>,
}

/// What the server knows that providers need: its own address and join token, and how to
/// start a local agent.
#[derive(Debug, Clone)]
pub struct ProviderContext {
    pub server_url: String,
    /// The exec providers of the server's configuration file, by name.
    pub exec_providers: BTreeMap<String, ExecConfig>,
    /// The EC2 providers of the server's configuration file (`ec2Providers`), by name.
    pub ec2_providers: BTreeMap<String, Ec2Config>,
    /// The `mpsfleet` binary, for `local` providers.
    pub exe: std::path::PathBuf,
    /// Where `local` hosts keep their data dirs.
    pub hosts_dir: std::path::PathBuf,
    /// Extra `mpsfleet agent` arguments for `local` hosts.
    pub local_agent_args: Vec<String>,
}

/// Whether a `local` provider's agents run containers (they do unless started with
/// `--runtime process`).
pub(super) fn local_runs_images(ctx: Option<&ProviderContext>) -> bool {
    ctx.is_none_or(|ctx| !ctx.local_agent_args.windows(2).any(|w| w[0] == "--runtime" && w[1] == "process"))
}

impl Providers {
    /// An exec or aws-ec2 provider a pool names is one of the server's configuration.
    pub(in crate::cluster) fn check_provider_configured(&self, pool: &Pool) -> Result<(), Error> {
        let Some(provider) = pool.provider.as_ref() else { return Ok(()) };
        let Some(name) = provider.name.as_ref() else { return Ok(()) };
        let ctx = self.ctx.as_ref();
        let (what, known): (&str, Vec<&str>) = match provider.kind {
            ProviderKind::AwsEc2 => (
                "aws-ec2 provider",
                ctx.map(|c| c.ec2_providers.keys().map(String::as_str).collect()).unwrap_or_default(),
            ),
            // A name with `local` is refused by the pool's own validation.
            ProviderKind::Exec | ProviderKind::Local => (
                "exec provider",
                ctx.map(|c| c.exec_providers.keys().map(String::as_str).collect()).unwrap_or_default(),
            ),
        };
        if known.contains(&name.as_str()) {
            return Ok(());
        }
        let configured = match (known.is_empty(), provider.kind) {
            (true, ProviderKind::AwsEc2) => {
                "it has none (define ec2Providers in the file of --config FILE, see docs/providers.md)"
                    .to_string()
            }
            (true, _) => "it has none (start it with --config FILE, see docs/providers.md)".to_string(),
            (false, _) => format!("it has {}", known.join(", ")),
        };
        Err(Error::invalid(
            "provider.name",
            format!("the server's configuration has no {what} {name:?}: {configured}"),
        ))
    }
}
