//! What `mpsfleet up` does to its own fleet between two runs, while no controller runs: its
//! hosts stop with it and start again with it, so a clean stop and start is a non-event.
//! The operations are `Cluster`'s, in `hosts.rs`; what they share is here.
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

#[cfg(test)]
mod tests {
    use super::super::recovery_tests::World;
    use crate::cluster::*;

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
            let t = w.c.read().task(&t.id.to_string()).unwrap();
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
        let h = w.c.read().host(a.as_str()).unwrap();
        assert_eq!(h.status, HostStatus::Deregistered);
        assert!(
            h.events.iter().any(|e| e.reason == "Retired" && e.message.contains("hosts/a is gone")),
            "{:#?}",
            h.events
        );
        assert!(w.c.read().incidents().is_empty(), "{:#?}", w.c.read().incidents());
    }
}
