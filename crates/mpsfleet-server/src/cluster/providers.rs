//! The pools' capacity providers: a pool's provider is built from its configuration (and the
//! server's, for `exec` and `aws-ec2` providers) the first time it is needed, or set by the
//! caller (tests, the simulator). Providers are processes, commands and API clients, not
//! records: nothing here is stored.

use super::*;
use crate::provider::{Ec2Config, Ec2Provider};

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

impl Cluster {
    /// Sets the capacity provider of a pool (providers are processes and commands, not records).
    pub fn set_provider(&mut self, pool: PoolName, provider: Arc<dyn CapacityProvider>) {
        self.providers.fixed.insert(pool.clone());
        self.providers.built.insert(pool.clone(), provider);
        self.ask_capacity(&pool);
    }

    /// What the server needs to build the providers its pools name.
    pub fn set_provider_context(&mut self, ctx: ProviderContext) {
        self.providers.ctx = Some(ctx);
        self.ask_capacity_everywhere();
    }

    pub(super) fn has_provider(&self, pool: &PoolName) -> bool {
        self.providers.built.contains_key(pool)
            || self.state.pools().get(pool).is_some_and(|p| p.value.provider.is_some())
    }

    /// The pool's capacity provider, built from its configuration the first time.
    pub fn provider_for(&mut self, pool: &PoolName) -> Option<Arc<dyn CapacityProvider>> {
        if let Some(p) = self.providers.built.get(pool) {
            return Some(p.clone());
        }
        let cfg = self.state.pools().get(pool)?.value.provider.clone()?;
        let ctx = self.providers.ctx.as_ref()?;
        let provider: Arc<dyn CapacityProvider> = match (cfg.kind, &cfg.exec) {
            (ProviderKind::Local, _) => Arc::new(LocalProvider::new(
                ctx.exe.clone(),
                ctx.hosts_dir.clone(),
                ctx.local_agent_args.clone(),
                std::time::Duration::from_secs(40),
            )),
            (ProviderKind::Exec, _) => {
                let Some(name) = cfg.name.as_ref() else {
                    // Commands an older server took through the API are never run.
                    tracing::error!(
                        pool = %pool,
                        "the pool's exec provider has commands of its own, which this server does not run: \
                         define them in the server's configuration and set the pool's provider.name"
                    );
                    return None;
                };
                let Some(config) = ctx.exec_providers.get(name) else {
                    tracing::error!(pool = %pool, provider = %name, "the server's configuration has no such exec provider");
                    return None;
                };
                match ExecProvider::new(config.clone()) {
                    Ok(p) => Arc::new(p),
                    Err(err) => {
                        tracing::error!(pool = %pool, error = %err, "exec provider not usable");
                        return None;
                    }
                }
            }
            (ProviderKind::AwsEc2, _) => {
                let Some(name) = cfg.name.as_ref() else {
                    tracing::error!(pool = %pool, "the pool's aws-ec2 provider has no provider.name");
                    return None;
                };
                let Some(config) = ctx.ec2_providers.get(name) else {
                    tracing::error!(pool = %pool, provider = %name, "the server's configuration has no such aws-ec2 provider");
                    return None;
                };
                // Builds no connection: the first call does (on a blocking thread).
                match Ec2Provider::new(config.clone(), pool.as_str()) {
                    Ok(p) => Arc::new(p),
                    Err(err) => {
                        tracing::error!(pool = %pool, error = %err, "aws-ec2 provider not usable");
                        return None;
                    }
                }
            }
        };
        self.providers.built.insert(pool.clone(), provider.clone());
        Some(provider)
    }

    /// The launch request for a new host of `pool`, without its token: the caller adds the
    /// launch or replacement token of the job (the join token never goes to a provider).
    pub fn launch_request(&self, pool: &PoolName, name: &str) -> LaunchRequest {
        let ctx = self.providers.ctx.as_ref();
        LaunchRequest {
            name: name.to_string(),
            pool: pool.to_string(),
            server: ctx.map(|c| c.server_url.clone()).unwrap_or_default(),
            join_token: String::new(),
            agent_args: Vec::new(),
            incident: String::new(),
        }
    }
}

/// Whether a `local` provider's agents run containers (they do unless started with
/// `--runtime process`).
pub(super) fn local_runs_images(ctx: Option<&ProviderContext>) -> bool {
    ctx.is_none_or(|ctx| !ctx.local_agent_args.windows(2).any(|w| w[0] == "--runtime" && w[1] == "process"))
}
