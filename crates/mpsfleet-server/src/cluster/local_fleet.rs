//! What `mpsfleet up` does to its own fleet between two runs, while no controller runs: its
//! hosts stop with it and start again with it, so a clean stop and start is a non-event.
//!
//! - **Stop.** `up` stops the server, then its hosts (each agent stops its tasks as it exits),
//!   then records what that did: every task that ran on the pool's hosts is STOPPED with the
//!   reason "stopped with up" ([`Cluster::record_stopped_with_hosts`]). Nothing else changes:
//!   the hosts stay as they were, and no incident is opened.
//! - **Start.** `up` starts each host of the pool again under the name and directory it had
//!   (the agent keeps its identity there, so it is the same host id), before the server
//!   counts any heartbeat grace. A host whose directory is gone cannot come back: it retires
//!   quietly, DEREGISTERED with the reason ([`Cluster::retire_host`]), never an incident and
//!   never a replacement; the pool's provider keeps the pool at its size as usual.
//! - **Runtime.** A host registered while Docker Engine did not answer runs tasks as processes,
//!   and one registered with Docker runs containers; when `up` finds the machine's engine
//!   started (or gone) since, it brings the host back with the runtime it found
//!   ([`Cluster::change_local_host_runtime`]): same id and name, its tasks recorded as stopped,
//!   a `RuntimeChanged` event, placement by the new runtime from then on.

use super::*;

impl Cluster {
    /// Records every task that ran on the pool's hosts (placed there and not STOPPED) as
    /// STOPPED by the user with `reason`, now. For after the hosts were stopped with their
    /// tasks while the server was down; a task still waiting for a host is left waiting.
    /// Returns how many were recorded.
    pub fn record_stopped_with_hosts(&mut self, pool: &str, reason: &str) -> Result<usize, Error> {
        let pool = self.pool(pool)?.name;
        let now = self.now();
        let stopped: Vec<Task> = (self.state.tasks().values())
            .map(|e| &e.task)
            .filter(|t| t.pool == pool && t.host_id.is_some() && t.last_status != TaskStatus::Stopped)
            .map(|t| {
                let mut t = self.reader().stopped_record(t, StopCode::UserInitiated, reason);
                force_stop(&mut t);
                t.stopped_at_ms.get_or_insert(now);
                t
            })
            .collect();
        let n = stopped.len();
        self.writing(|w| w.write_tasks(stopped))?;
        Ok(n)
    }

    /// Brings one of `up`'s hosts back with another runtime (see the module's documentation):
    /// the caller has not started the host yet and vouches that nothing of it runs, so its
    /// tasks are recorded as STOPPED with `reason` (their services start them again, where
    /// the new runtime fits).
    pub fn change_local_host_runtime(
        &mut self,
        id: &HostId,
        runtime: RuntimeKind,
        version: Option<String>,
        plugins: RuntimePlugins,
        reason: &str,
    ) -> Result<(), Error> {
        let ix = self.host_ix(id.as_str())?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        if h.runtime == runtime || h.status == HostStatus::Deregistered {
            return Ok(());
        }
        let now = self.now();
        let stopped: Vec<Task> = (self.state.tasks().values())
            .map(|e| &e.task)
            .filter(|t| t.host_id.as_ref() == Some(id) && t.last_status != TaskStatus::Stopped)
            .map(|t| {
                let mut t = self.reader().stopped_record(t, StopCode::UserInitiated, reason);
                force_stop(&mut t);
                t.stopped_at_ms.get_or_insert(now);
                t
            })
            .collect();
        self.writing(|w| w.write_tasks(stopped))?;
        let what = format!("{} runtime, was {}: {reason}", runtime.as_str(), h.runtime.as_str());
        h.events.push(now, ObjectEvent::new("RuntimeChanged", what));
        h.runtime = runtime;
        h.runtime_version = version;
        h.plugins = plugins;
        self.write_host(ix, h)?;
        self.sched.set_runs_images(ix, runtime.runs_images());
        self.ask(Work::Placement(self.state.hosts()[ix as usize].host().pool.clone()));
        Ok(())
    }

    /// A host whose machine is gone for good, known by its owner (`up`, whose hosts' directories
    /// are gone), leaves the fleet quietly: DEREGISTERED with `reason` in its events, its tasks
    /// recorded as stopped. No incident is opened; unlike `host forget`, the caller vouches that
    /// nothing runs it.
    pub fn retire_host(&mut self, id: &HostId, reason: &str) -> Result<(), Error> {
        let ix = self.host_ix(id.as_str())?;
        if self.state.hosts()[ix as usize].host().status == HostStatus::Deregistered {
            return Ok(());
        }
        self.writing(|w| w.deregister(ix, reason))?;
        let mut h = self.state.hosts()[ix as usize].host().clone();
        h.events.push(self.now(), ObjectEvent::new("Retired", reason));
        self.write_host(ix, h)
    }
}

#[cfg(test)]
mod tests {
    use super::super::recovery_tests::World;
    use super::*;

    #[test]
    fn up_records_its_stopped_tasks_and_retires_a_gone_host_without_an_incident() {
        let mut w = World::new(OwnershipMode::SelfManaged);
        let join = w.join_token.clone();
        let (a, b) = (w.join("a", &join).unwrap(), w.join("b", &join).unwrap());
        w.c.register_taskdef(
            br#"{"family": "s", "containerDefinitions": [{"name": "c", "command": ["sleep", "9"]}]}"#,
        )
        .unwrap();
        let run = RunTask {
            task_definition: "s".into(),
            count: 2,
            pool: "p".into(),
            client_token: None,
            ..Default::default()
        };
        let placed = w.c.run_tasks(run).unwrap().tasks;
        assert!(placed.iter().all(|t| t.host_id.is_some()), "{placed:#?}");

        assert_eq!(w.c.record_stopped_with_hosts("p", "stopped with up").unwrap(), 2);
        for t in &placed {
            let t = w.c.task(&t.id.to_string()).unwrap();
            assert_eq!(t.last_status, TaskStatus::Stopped);
            assert_eq!(
                (t.stop_code, t.stopped_reason.as_deref()),
                (Some(StopCode::UserInitiated), Some("stopped with up"))
            );
        }
        assert_eq!(
            w.c.record_stopped_with_hosts("p", "stopped with up").unwrap(),
            0,
            "nothing left to record"
        );

        w.c.retire_host(&a, "stopped with up: its directory hosts/a is gone").unwrap();
        // Long past every grace: b heartbeats, a is gone for good and says why, quietly.
        for _ in 0..120 {
            w.advance(1000);
            w.heartbeat(&b, HealthStatus::Ok);
            w.c.health_tick().unwrap();
        }
        let h = w.c.host(a.as_str()).unwrap();
        assert_eq!(h.status, HostStatus::Deregistered);
        assert!(
            h.events.iter().any(|e| e.reason == "Retired" && e.message.contains("hosts/a is gone")),
            "{:#?}",
            h.events
        );
        assert!(w.c.incidents().is_empty(), "{:#?}", w.c.incidents());
    }
}
