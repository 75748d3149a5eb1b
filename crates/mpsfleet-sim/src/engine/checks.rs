//! After every step: the change feed read into the world's mirror of the server, and the
//! invariants checked on what the step changed; at the end, the final checks and the
//! accounting of the report.

use super::{Sim, FAMILIES, GPU_MEMORY_MIB, MAX_MPS_CLIENTS};
use crate::config::{fmt_time, WARMUP_MS};
use crate::invariants::{self, GpuLoad, Violation};
use mpsfleet_store::Store;
use mpsfleet_types::*;
use std::collections::BTreeSet;

impl Sim {
    // ---- after every step: the change feed and the invariants ---------------------------------

    pub(super) fn after_step(&mut self) {
        let Some(c) = self.cluster.as_ref() else { return };
        let rev = c.read().revision();
        let mut changed_hosts = BTreeSet::new();
        if rev != self.feed_rev {
            let changes = match self.store.changes_since(self.feed_rev, usize::MAX) {
                Ok(c) => c,
                Err(e) => {
                    self.fail("store-feed", format!("cannot read the change feed: {e}"));
                    return;
                }
            };
            self.feed_rev = rev;
            let mut incidents = Vec::new();
            for ch in changes {
                let Some(value) = ch.value else { continue };
                match ch.kind.as_str() {
                    "task" => {
                        if let Ok(t) = serde_json::from_slice::<Task>(&value) {
                            self.mirror_task(&t);
                            self.observe_preemption(&t);
                            if let Some(h) = t.host_id.as_ref().and_then(|id| self.world.by_id(id)) {
                                changed_hosts.insert(h);
                            }
                        }
                    }
                    "incident" => {
                        if let Ok(i) = serde_json::from_slice::<Incident>(&value) {
                            incidents.push(i);
                        }
                    }
                    "host" => self.all_dirty = true,
                    _ => {}
                }
            }
            for &h in &changed_hosts {
                self.queue_fetch(h);
                self.check_server_gpus(h);
            }
            for i in incidents {
                self.incident_changed(i);
            }
        }
        self.classify_dirty();
        // The world: what the hosts really run, on the hosts this step may have touched.
        if self.violation.is_none() {
            self.check_world();
        }
    }

    fn check_server_gpus(&mut self, h: usize) {
        let host = &self.world[h];
        let Some(id) = host.id() else { return };
        let Some(c) = self.cluster.as_ref() else { return };
        // The records as the agent's long-poll gets them, without copying the definitions.
        let Ok(a) = c.read().shared_assignments(id) else { return };
        let mut load: Vec<GpuLoad> = vec![GpuLoad::default(); host.gpu_uuids.len()];
        for t in a.tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped) {
            let demand = self.demands.get(&t.task_definition).copied().unwrap_or(FAMILIES[0].1);
            for u in &t.gpu_ids {
                if let Some(g) = host.gpu_index(u) {
                    load[g].add(demand, t.id);
                }
            }
        }
        self.checker.checks += 1;
        if let Some(why) = invariants::gpu_limits(&load, GPU_MEMORY_MIB, MAX_MPS_CLIENTS) {
            let label = self.world[h].label.clone();
            // The live records, to read the failure by.
            let records: Vec<String> = (a.tasks.iter().filter(|t| t.last_status != TaskStatus::Stopped))
                .map(|t| {
                    let gpus: Vec<String> =
                        t.gpu_ids.iter().filter_map(|u| host.gpu_index(u)).map(|g| g.to_string()).collect();
                    format!(
                        "{} {} gpu {} {}/{}{}",
                        t.id,
                        t.group.as_ref().map_or("-", |g| g.as_str()),
                        gpus.join(","),
                        t.last_status.as_str(),
                        t.desired_status.as_str(),
                        t.stop_code.map(|c| format!(" {}", c.as_str())).unwrap_or_default()
                    )
                })
                .collect();
            self.fail(
                "gpu-limits",
                format!("server placement on {label}: {why} (live: {})", records.join("; ")),
            );
        }
    }

    fn check_world(&mut self) {
        // Only hosts with tasks can break a GPU limit; checking all of them after every step
        // would cost O(hosts) per event, so each host is checked when its tasks change.
        let dirty: Vec<usize> = std::mem::take(&mut self.checker.dirty_hosts).into_iter().collect();
        for h in dirty {
            let host = &self.world[h];
            let mut load: Vec<GpuLoad> = vec![GpuLoad::default(); host.gpu_uuids.len()];
            for (t, l) in host.tasks() {
                for &g in &l.gpus {
                    load[g].add(l.demand, *t);
                }
            }
            self.checker.checks += 1;
            if let Some(why) = invariants::gpu_limits(&load, GPU_MEMORY_MIB, MAX_MPS_CLIENTS) {
                let label = host.label.clone();
                self.fail("gpu-limits", format!("world on {label}: {why}"));
                return;
            }
        }
    }

    fn incident_changed(&mut self, i: Incident) {
        let h = self.world.by_id(&i.host_id);
        let label = h.map(|h| self.world[h].label.clone()).unwrap_or_else(|| "?".into());
        let prev_len = self.incidents.get(&i.id).map(|p| p.timeline.len());
        self.all_dirty = true;
        if i.state == IncidentState::Resolved {
            if self.open_incidents.get(&i.host_id) == Some(&i.id) {
                self.open_incidents.remove(&i.host_id);
            }
            if self.incidents.get(&i.id).is_none_or(|p| p.state != IncidentState::Resolved) {
                self.spread.resolved(i.pool.as_str(), self.now);
            }
        } else {
            self.open_incidents.insert(i.host_id.clone(), i.id.clone());
        }
        if prev_len.is_none() {
            let (onset, cause) = h
                .and_then(|h| self.world[h].fault)
                .map_or((None, "no injected fault"), |(t, c)| (Some(t), c));
            let tie = self.incidents.values().any(|x| x.pool == i.pool && x.opened_at_ms == i.opened_at_ms);
            if tie {
                // The server ranks incidents opened in the same millisecond by their hosts'
                // registration order; counted, because the storm breaker lets the first through.
                self.stats.incident_ties += 1;
                self.log(format!(
                    "incident on {label} opened in the same millisecond as another in its pool"
                ));
            }
            self.stats.incident_opened(&i.id, cause, onset, i.opened_at_ms, label.clone());
            self.log(format!(
                "incident on {label}: {} IMPAIRED ({cause}), owner {}",
                i.trigger.check,
                i.owner.as_str()
            ));
        }
        for e in i.timeline.iter().skip(prev_len.unwrap_or(0)) {
            let line = match e.step {
                Step::Blocked => Some(format!("incident on {label}: BLOCKED: {}", e.detail)),
                Step::ReplacementRequested => Some(format!("incident on {label}: replacement requested")),
                Step::OldHostTerminated => Some(format!("incident on {label}: old host terminated")),
                Step::TasksRunningAgain => Some(format!("incident on {label}: tasks running again")),
                Step::Resolved => Some(format!("incident on {label}: resolved: {}", e.detail)),
                _ => None,
            };
            if let Some(l) = line {
                self.log(l);
            }
        }
        let pool_mode = self
            .cluster
            .as_ref()
            .and_then(|c| c.read().pool(i.pool.as_str()).ok())
            .map(|p| (p.mode, p.remediation_policy));
        let seen_breaches = self.incidents.get(&i.id).map_or(0, |p| p.breaches.len());
        self.incidents.insert(i.id.clone(), i.clone());
        let Some((mode, policy)) = pool_mode else { return };
        self.checker.checks += 1;
        if let Some(why) = invariants::incident_record(&i, mode) {
            self.fail("incident-record", format!("incident on {label}: {why}"));
            return;
        }
        for b in i.breaches.iter().skip(seen_breaches) {
            self.stats.breach(b.phase.as_str(), b.cause.map_or("unexplained", |c| c.as_str()));
            self.log(format!("incident on {label}: recovery bound breached: {}", b.words()));
        }
        // A breach the server recorded without a cause breaks the run at once; one it did
        // not record (it records on its next pass) is looked for at the end.
        self.checker.checks += 1;
        if let Some(b) = i.breaches.iter().find(|b| b.cause.is_none()) {
            let why = format!("recovery bound breached with no cause: {}", b.words());
            self.fail("recovery-bound", format!("incident on {label}: {why}"));
            return;
        }
        let pool: Vec<&Incident> = self.incidents.values().filter(|x| x.pool == i.pool).collect();
        self.checker.checks += 1;
        if let Some(why) = invariants::replacement_limits(&pool, &policy, self.now) {
            self.fail("storm-breaker", format!("pool {}: {why}", i.pool));
        }
    }

    /// At every resync: a service below its count while its pool has room recovers within
    /// [`invariants::recovery_bound_ms`]. A `fenced` replica waiting for its old host's
    /// termination is not counted missing here: its incident's bound for fenced services
    /// judges that wait (`recovery-bound`), from the failure's first signal.
    pub(super) fn check_recovery(&mut self) {
        if self.now < WARMUP_MS {
            return;
        }
        let Some(c) = self.cluster.as_ref() else { return };
        // The server's running counts from the mirror of its tasks (the resync stops no
        // running task and starts none), not from its service views, which count every task
        // of every service at each resync.
        let mut short = Vec::new();
        for (name, w) in &self.svcs {
            if self.mirror.server_running(name) + self.awaiting_fence(name) < w.desired {
                short.push((name.clone(), w.pool.clone(), w.demand.mps));
            }
        }
        if cfg!(debug_assertions) {
            let views: Vec<(ServiceName, u32, u32)> = c
                .read()
                .services()
                .into_iter()
                .map(|v| (v.service.name, v.running_count, v.service.desired_count))
                .collect();
            let mirrored: Vec<(ServiceName, u32, u32)> = self
                .svcs
                .iter()
                .map(|(n, w)| (n.clone(), self.mirror.server_running(n), w.desired))
                .collect();
            assert_eq!(
                mirrored,
                views,
                "the mirrored running counts differ from the server's at {}",
                fmt_time(self.now)
            );
        }
        let mut below = Vec::new();
        for (name, pool, mps) in short {
            let fits = self.spare_capacity(&pool);
            if (mps && fits.0) || (!mps && fits.1) {
                below.push(name);
            }
        }
        let bound = invariants::recovery_bound_ms(&HealthPolicy::default(), self.cfg.heartbeat_ms);
        let now = self.now;
        self.below_since.retain(|k, _| below.contains(k));
        for s in below {
            let since = *self.below_since.entry(s.clone()).or_insert(now);
            self.checker.checks += 1;
            if now - since > bound {
                let detail = format!(
                    "service {s} below its desired count for {} with spare capacity in its pool (bound {})",
                    fmt_time(now - since),
                    fmt_time(bound)
                );
                self.fail("service-recovery", detail);
                return;
            }
        }
    }

    pub(super) fn fail(&mut self, invariant: &'static str, detail: String) {
        if self.violation.is_some() {
            return;
        }
        self.log(format!("INVARIANT BROKEN {invariant}: {detail}"));
        self.violation = Some(Violation { invariant, at_ms: self.now, detail });
    }

    pub(super) fn final_checks(&mut self) {
        let mut all: Vec<Incident> = self.incidents.values().cloned().collect();
        all.sort_by(|a, b| (a.opened_at_ms, &a.host_id).cmp(&(b.opened_at_ms, &b.host_id)));
        for i in all {
            let mode =
                self.cluster.as_ref().and_then(|c| c.read().pool(i.pool.as_str()).ok()).map(|p| p.mode);
            let Some(mode) = mode else { continue };
            self.checker.checks += 1;
            if let Some(why) = invariants::incident_record(&i, mode) {
                self.fail("incident-record", why);
                return;
            }
            self.checker.checks += 1;
            if let Some(why) = invariants::bounds_held(&i) {
                self.fail("recovery-bound", format!("incident {}: {why}", i.id));
                return;
            }
        }
    }

    pub(super) fn finish_accounting(&mut self) {
        self.finish_preemption();
        let names: Vec<ServiceName> = self.svcs.keys().cloned().collect();
        for s in names {
            self.svc_change(&s, 0);
        }
        let mut opened: Vec<&Incident> = self.incidents.values().collect();
        opened.sort_by(|a, b| (a.opened_at_ms, &a.host_id).cmp(&(b.opened_at_ms, &b.host_id)));
        for i in opened {
            self.stats.incident_final(&i.id, i);
        }
        let (running, desired): (u32, u32) =
            self.svcs.values().fold((0, 0), |(r, d), w| (r + w.running.min(w.desired), d + w.desired));
        self.stats.replicas_running_at_end = running;
        self.stats.spread = self.spread.stats();
        self.stats.replicas_desired = desired;
        if let Some(c) = self.cluster.as_ref() {
            for v in c.read().services() {
                self.stats.services_at_end.push((
                    v.service.name.to_string(),
                    v.running_count,
                    v.service.desired_count,
                ));
            }
            for p in &self.pool_names {
                let hosts = c.read().hosts(Some(p.as_str()));
                let blocked = self
                    .incidents
                    .values()
                    .filter(|i| &i.pool == p && matches!(i.state, IncidentState::Blocked { .. }))
                    .count();
                let active = hosts.iter().filter(|h| h.status == HostStatus::Active).count();
                // The pool's hosts now: a replaced (DEREGISTERED) one is not one of them.
                let members = hosts.iter().filter(|h| h.status != HostStatus::Deregistered).count();
                self.stats.pools_at_end.push((p.to_string(), active, members, blocked));
            }
        }
    }

    /// Called by the world code whenever a host's processes change.
    pub(crate) fn mark(&mut self, h: usize) {
        self.checker.dirty_hosts.insert(h);
    }
}
