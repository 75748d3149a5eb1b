//! The bounds of what an agent's report about a task may store (its containers, bindings and
//! notes), and which MPS daemon failures a heartbeat confirms (`confirmed_failures`). The
//! reports themselves, and heartbeats, are `Cluster`'s, in `hosts.rs`.

use super::*;

/// The most containers, notes and network bindings one report may carry, and the longest text
/// of any of their fields: a task has at most 10 containers, each of which publishes at most
/// 100 ports.
pub(super) const MAX_REPORTED_CONTAINERS: usize = 10;
pub(super) const MAX_REPORTED_BINDINGS: usize = 200;
pub(super) const MAX_REPORTED_INTERFACES: usize = 4;
pub(super) const MAX_REPORTED_NOTES: usize = 16;
pub(super) const MAX_REPORTED_TEXT: usize = 4096;

/// Bounds what an agent may store in a task's `containers` (the server keeps it).
pub(super) fn check_container_reports(containers: &[ContainerReport]) -> Result<(), Error> {
    if containers.len() > MAX_REPORTED_CONTAINERS {
        return Err(Error::invalid(
            "containers",
            format!("at most {MAX_REPORTED_CONTAINERS} containers, got {}", containers.len()),
        ));
    }
    for (i, c) in containers.iter().enumerate() {
        let texts = [
            Some(&c.name),
            c.image.as_ref(),
            c.image_digest.as_ref(),
            c.runtime_id.as_ref(),
            c.reason.as_ref(),
        ];
        let long = texts.into_iter().flatten().chain(&c.notes).find(|t| t.len() > MAX_REPORTED_TEXT);
        if let Some(t) = long {
            return Err(Error::invalid(
                format!("containers[{i}]"),
                format!("each text is at most {MAX_REPORTED_TEXT} bytes, got {}", t.len()),
            ));
        }
        if c.notes.len() > MAX_REPORTED_NOTES {
            return Err(Error::invalid(
                format!("containers[{i}].notes"),
                format!("at most {MAX_REPORTED_NOTES} notes, got {}", c.notes.len()),
            ));
        }
        if c.network_bindings.len() > MAX_REPORTED_BINDINGS {
            return Err(Error::invalid(
                format!("containers[{i}].networkBindings"),
                format!("at most {MAX_REPORTED_BINDINGS} bindings, got {}", c.network_bindings.len()),
            ));
        }
        if let Some(b) = c.network_bindings.iter().find(|b| b.bind_ip.len() > 64) {
            return Err(Error::invalid(
                format!("containers[{i}].networkBindings"),
                format!("bindIp is at most 64 bytes, got {}", b.bind_ip.len()),
            ));
        }
        if c.network_interfaces.len() > MAX_REPORTED_INTERFACES {
            return Err(Error::invalid(
                format!("containers[{i}].networkInterfaces"),
                format!("at most {MAX_REPORTED_INTERFACES} interfaces, got {}", c.network_interfaces.len()),
            ));
        }
        let long = c
            .network_interfaces
            .iter()
            .find(|n| n.attachment_id.len() > 128 || n.private_ipv4_address.len() > 64);
        if let Some(n) = long {
            return Err(Error::invalid(
                format!("containers[{i}].networkInterfaces"),
                format!(
                    "attachmentId is at most 128 bytes and privateIpv4Address at most 64, got {} and {}",
                    n.attachment_id.len(),
                    n.private_ipv4_address.len()
                ),
            ));
        }
    }
    Ok(())
}

/// The GPUs whose MPS daemon has failed, after `checks`, as the pool's `restartCopies` counts
/// it: reported IMPAIRED (`mpsFailureThreshold` failures in a row, or local repair given up);
/// with `first_exit`, also a failure that local repair has restarted the daemon for (it
/// exited, or failed to start: the agent restarts a daemon that only fails its probes once
/// they reach the threshold, when it is IMPAIRED anyway); or failed before (`before`) and
/// still failing in the agent's count (a daemon restarted and killed again flips between OK
/// and IMPAIRED; it is over once it has answered `mpsFailureThreshold` probes in a row, when
/// the agent drops the failure's first signal).
pub(super) fn failed_daemons(
    checks: &[HostCheck],
    before: &BTreeSet<GpuUuid>,
    first_exit: bool,
) -> BTreeSet<GpuUuid> {
    checks
        .iter()
        .filter(|c| c.name == mpsfleet_core::health::MPS_DAEMON)
        .filter(|c| {
            let failing = c.first_failure_age_ms.is_some();
            c.status == HealthStatus::Impaired
                || (first_exit && c.restarted_for_failure())
                || (failing && c.gpu_id.as_ref().is_some_and(|g| before.contains(g)))
        })
        .filter_map(|c| c.gpu_id.clone())
        .collect()
}
