//! The controllers' loops, outside any request: the health tick every [`HEALTH_INTERVAL`]
//! (and at once when a request or a report woke it, `Cluster::take_wake`), the resync every
//! [`RESYNC_INTERVAL`], and the provider calls their passes decide
//! ([`run_provider_jobs`]): launches and terminations, with their retries, on blocking
//! threads, each reporting its outcome back to the cluster. No request runs a provider call
//! or waits for one: a request that left a provider job wakes the loop, which runs it.

use crate::api::AppState;
use crate::cluster::{Cluster, Error, ProviderJob, ProviderOutcome};
use crate::provider;
use std::time::Duration;

/// How often services are reconciled and pending tasks retried as a safety net.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(5);

impl AppState {
    /// Runs `f` on the cluster outside any request (the controllers' ticks).
    pub async fn tick(
        &self,
        f: impl FnOnce(&mut Cluster) -> Result<Vec<ProviderJob>, Error> + Send + 'static,
    ) -> Result<(), Error> {
        let cluster = self.cluster.clone();
        let changed = self.changed.clone();
        let wake = self.wake.clone();
        let jobs = tokio::task::spawn_blocking(move || {
            let mut c = cluster.lock().map_err(|_| Error::Internal("state lock poisoned".into()))?;
            let before = c.read().revision();
            let jobs = f(&mut c);
            if c.read().revision() != before {
                changed.send_replace(c.read().revision());
            }
            if c.take_wake() {
                wake.notify_one();
            }
            let mut jobs = jobs?;
            jobs.extend(c.take_jobs());
            Ok::<_, Error>(jobs)
        })
        .await
        .map_err(|e| Error::Internal(format!("controller failed: {e}")))??;
        run_provider_jobs(self.clone(), jobs);
        Ok(())
    }
}

/// How often host health is evaluated (heartbeat grace) and incidents are driven.
pub const HEALTH_INTERVAL: Duration = Duration::from_millis(250);

/// Completes once `stopping` is set (or its sender is gone).
async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

pub(crate) async fn health_loop(state: AppState, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wake = state.wake.clone();
    loop {
        let passes = state.passes.clone();
        // A tick that has started runs to its end: it commits or it does not.
        let result = tokio::select! {
            _ = tick.tick() => state.tick(move |c| {
                let jobs = c.health_tick();
                passes.send_modify(|n| *n += 1);
                jobs
            }).await,
            // An incident asked for by a call: the controllers' pass runs now.
            () = wake.notified() => state.tick(move |c| {
                c.run_work();
                passes.send_modify(|n| *n += 1);
                Ok(Vec::new())
            }).await,
            () = stopped(&mut stopping) => return,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "health evaluation failed; retrying at the next tick");
        }
    }
}

pub(crate) async fn resync_loop(state: AppState, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(RESYNC_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stopping) => return,
        }
        if let Some(tls) = &state.tls {
            let now = state.cluster.lock().map(|c| c.read().now_ms()).unwrap_or_default();
            if let Err(e) = tls.renew_if_due(now) {
                tracing::error!(error = %e, "cannot renew the server certificate; retrying at the next interval");
            }
        }
        let st = state.clone();
        let res = tokio::task::spawn_blocking(move || {
            let mut c = st.cluster.lock().map_err(|_| Error::Internal("state lock poisoned".into()))?;
            let before = c.read().revision();
            // Retention is a key of the work queue (`Work::Retention`), run by `resync` too.
            let r = c.resync();
            if c.read().revision() != before {
                st.changed.send_replace(c.read().revision());
            }
            r
        })
        .await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "resync failed; retrying at the next interval"),
            Err(e) => tracing::error!(error = %e, "resync task failed"),
        }
    }
}

/// Runs provider calls (slow: processes, cloud CLIs) on blocking threads, each with retries,
/// and feeds the outcome back to the cluster, which may ask for more.
pub fn run_provider_jobs(state: AppState, jobs: Vec<ProviderJob>) {
    if *state.stopping.borrow() && !jobs.is_empty() {
        // The next server plans them again (remediation repeats nothing it recorded).
        tracing::info!(jobs = jobs.len(), "shutting down: provider calls left to the next start");
        return;
    }
    for job in jobs {
        let st = state.clone();
        tokio::spawn(async move {
            let st2 = st.clone();
            let job2 = job.clone();
            let outcome = tokio::task::spawn_blocking(move || {
                let job = job2;
                let (provider, req) = {
                    let Ok(mut c) = st2.cluster.lock() else {
                        return ProviderOutcome::Failed("state lock poisoned".into());
                    };
                    let (pool, name) = match &job {
                        ProviderJob::Launch { pool, name, .. }
                        | ProviderJob::Terminate { pool, name, .. } => (pool, name),
                    };
                    let mut req = c.launch_request(pool, name);
                    // A new host joins with a token for it alone (its incident's replacement
                    // token, or its launch token), never with the join token.
                    if let ProviderJob::Launch { token, incident, .. } = &job {
                        if let Some(t) = token {
                            req.join_token = c.join_string(&t.0);
                        }
                        req.incident = incident.clone();
                    }
                    (c.provider_for(pool), req)
                };
                let Some(p) = provider else {
                    return ProviderOutcome::Failed("the pool has no capacity provider".into());
                };
                let sleep = |failed: &provider::AttemptRecord, backoff| {
                    if let Ok(mut c) = st2.cluster.lock() {
                        if let Err(e) = c.provider_attempt_failed(&job, failed) {
                            tracing::error!(error = %e, "recording a provider retry failed");
                        }
                    }
                    std::thread::sleep(backoff)
                };
                let result = match &job {
                    ProviderJob::Launch { .. } => {
                        provider::launch_with_retries(p.as_ref(), &req, &provider::Retry::default(), sleep)
                            .result
                            .map(|_| ())
                    }
                    ProviderJob::Terminate { name, .. } => {
                        let (policy, confirm) = (provider::Retry::default(), provider::Retry::boot());
                        provider::terminate_confirmed(p.as_ref(), name, &policy, &confirm, sleep)
                            .result
                            .map(|_| ())
                    }
                };
                match result {
                    Ok(()) => ProviderOutcome::Done,
                    Err(e) => ProviderOutcome::Failed(e.to_string()),
                }
            })
            .await
            .unwrap_or_else(|e| ProviderOutcome::Failed(e.to_string()));
            let res = st.tick(move |c| c.provider_done(&job, outcome)).await;
            if let Err(e) = res {
                tracing::error!(error = %e, "recording a provider outcome failed");
            }
        });
    }
}
