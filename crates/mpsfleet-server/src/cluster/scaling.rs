//! Managed scaling's memory as the API shows it: how long each pool's launches took to join
//! (`launch_times`) and its last decision (`last_scaling_decision`), for `pool explain`. The
//! scaling step itself is the capacity controller's (`controllers/scaling.rs`).

use super::*;

/// Launch times kept per pool, and launches followed at once (a bound on memory).
const LAUNCH_TIMES_KEPT: usize = 32;

impl Cluster {
    /// A host registered: its launch is no longer in flight, and if it was asked for, how
    /// long it took is kept (the latest [`LAUNCH_TIMES_KEPT`] per pool).
    pub(super) fn host_joined(&mut self, pool: &PoolName, name: &str) {
        if let Some(l) = self.work.capacity_launches.get_mut(pool) {
            l.remove(name);
        }
        let Some(asked) = self.work.launches_asked.remove(&(pool.clone(), name.to_string())) else { return };
        let took = self.now().saturating_sub(asked);
        let times = self.work.launch_times.entry(pool.clone()).or_default();
        if times.len() == LAUNCH_TIMES_KEPT {
            times.pop_front();
        }
        times.push_back(took);
    }

    /// The pool's measured launches, from the ask to the host joining, in words beside the
    /// provider's `launchTimeoutSeconds` (`pool explain`); None before the first.
    pub fn launch_times(&self, pool: &PoolName) -> Option<String> {
        let times = self.work.launch_times.get(pool).filter(|t| !t.is_empty())?;
        let mut sorted: Vec<u64> = times.iter().copied().collect();
        sorted.sort_unstable();
        let timeout = self.state.pools().get(pool).and_then(|p| p.value.provider.as_ref()).map(|p| {
            p.launch_timeout_seconds.unwrap_or(match p.kind {
                mpsfleet_types::policy::ProviderKind::Local => 60,
                _ => 600,
            })
        });
        Some(format!(
            "the latest {} launch(es) took {} to join (median), {} at most{}",
            sorted.len(),
            mpsfleet_types::time::secs(sorted[sorted.len() / 2]),
            mpsfleet_types::time::secs(sorted[sorted.len() - 1]),
            timeout.map(|t| format!(", against launchTimeoutSeconds {t}")).unwrap_or_default()
        ))
    }

    /// The last scaling decision of `pool` in words, and when (`pool explain`).
    pub fn last_scaling_decision(&self, pool: &PoolName) -> Option<(u64, String)> {
        self.work.scaling.get(pool).and_then(|m| m.last.clone())
    }
}
