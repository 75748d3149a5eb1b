//! A drill's faults, injected on this host only when the agent was started with
//! `--allow-fault-injection` (as AWS FIS acts only on targets that allow it). The server lists
//! the faults its running drills want in every heartbeat answer; [`Injector::apply`] brings the
//! host to that list: a daemon fault goes to the GPU's supervisor (which kills or stops the
//! daemon, and each one started in its place while the fault is persistent), a GPU fault to
//! the GPU watch (its check reads IMPAIRED, as a host-fatal Xid would make it), and
//! `agent-stop` silences the heartbeats for the drill's time. A fault no longer listed is
//! taken back.

use crate::gpu_health::GpuWatch;
use crate::mps::supervisor::{DaemonFault, Supervisors};
use mpsfleet_core::clock::Clock;
use mpsfleet_types::drill::{DrillFault, InjectedFault};
use mpsfleet_types::GpuUuid;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest an `agent-stop` fault silences the agent, whatever the server asks.
pub const MAX_SILENCE: Duration = Duration::from_secs(3600);

/// What the agent has injected, and whether it may.
pub struct Injector {
    allowed: bool,
    clock: Arc<dyn Clock>,
    state: Mutex<Applied>,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector").field("allowed", &self.allowed).finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Applied {
    /// Daemon and GPU faults in force, by GPU.
    daemons: BTreeMap<GpuUuid, (String, DrillFault, bool)>,
    gpus: BTreeSet<GpuUuid>,
    /// `agent-stop` drills already obeyed (each silences once).
    silenced_for: BTreeSet<String>,
    /// The end of an `agent-stop` silence, on the clock's milliseconds.
    silent_until: Option<u64>,
    refused_logged: bool,
}

impl Injector {
    pub fn new(allowed: bool, clock: Arc<dyn Clock>) -> Injector {
        Injector { allowed, clock, state: Mutex::new(Applied::default()) }
    }

    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the heartbeats are silenced now (an `agent-stop` fault).
    pub fn silent(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.silent_until {
            Some(t) if self.clock.now_ms() < t => true,
            Some(_) => {
                s.silent_until = None;
                tracing::warn!("drill: heartbeats resume after the agent-stop fault");
                false
            }
            None => false,
        }
    }

    /// Brings the host to the faults `wanted`: new ones injected, gone ones taken back.
    pub fn apply(&self, wanted: &[InjectedFault], supervisors: &Supervisors, gpu_watch: &GpuWatch) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !self.allowed {
            if !wanted.is_empty() && !s.refused_logged {
                tracing::warn!(
                    drills = ?wanted.iter().map(|f| &f.drill).collect::<Vec<_>>(),
                    "a drill asked for a fault; ignored: this agent was not started with --allow-fault-injection"
                );
                s.refused_logged = true;
            }
            return;
        }
        let mut daemons = BTreeMap::new();
        let mut gpus = BTreeSet::new();
        for f in wanted {
            match (f.fault, &f.gpu_id) {
                (DrillFault::DaemonExit | DrillFault::DaemonHang, Some(g)) => {
                    daemons.insert(g.clone(), (f.drill.clone(), f.fault, f.persistent));
                }
                (DrillFault::GpuCheckFail, Some(g)) => {
                    gpus.insert(g.clone());
                    let why = format!("Xid 79: GPU has fallen off the bus (injected by drill {})", f.drill);
                    gpu_watch.inject(g, Some(&why));
                }
                (DrillFault::AgentStop, _) => {
                    if s.silenced_for.insert(f.drill.clone()) {
                        let d = Duration::from_millis(f.for_ms.unwrap_or(0)).min(MAX_SILENCE);
                        tracing::warn!(drill = %f.drill, for_ms = d.as_millis() as u64, "drill: the agent stops heartbeating");
                        s.silent_until = Some(self.clock.now_ms() + d.as_millis() as u64);
                    }
                }
                (_, None) => {
                    tracing::warn!(drill = %f.drill, fault = f.fault.as_str(), "drill fault without a GPU; ignored")
                }
            }
        }
        for (gpu, (drill, fault, persistent)) in &daemons {
            if s.daemons.get(gpu) != Some(&(drill.clone(), *fault, *persistent)) {
                match supervisors.get(gpu) {
                    Some(sup) => {
                        tracing::warn!(drill = %drill, gpu = %gpu, fault = fault.as_str(), persistent, "drill: fault injected");
                        sup.set_fault(Some(DaemonFault::new(*fault == DrillFault::DaemonHang, *persistent)));
                    }
                    None => {
                        tracing::warn!(drill = %drill, gpu = %gpu, "drill fault on a GPU without an MPS daemon; ignored")
                    }
                }
            }
        }
        for gpu in s.daemons.keys().filter(|g| !daemons.contains_key(*g)) {
            if let Some(sup) = supervisors.get(gpu) {
                sup.set_fault(None);
            }
        }
        for gpu in s.gpus.iter().filter(|g| !gpus.contains(*g)) {
            gpu_watch.inject(gpu, None);
        }
        // A drill no longer running silences nothing more.
        let running: BTreeSet<&String> = wanted.iter().map(|f| &f.drill).collect();
        s.silenced_for.retain(|d| running.contains(d));
        s.daemons = daemons;
        s.gpus = gpus;
    }
}
