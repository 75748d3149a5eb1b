//! A service's lifecycle (`ACTIVE -> DRAINING`, its record removed once no task is left) and
//! each deployment's (`PRIMARY -> ACTIVE -> INACTIVE`; its rollout `IN_PROGRESS -> COMPLETED
//! | FAILED`), as pure steps over named events, and a stopped task's network attachments.
//!
//! What it promises:
//! - a service that was deleted never becomes ACTIVE again (its name may be taken anew by a
//!   new record);
//! - one deployment is PRIMARY, the newest: a new one supersedes it, which makes it ACTIVE
//!   while its tasks are replaced; INACTIVE is final;
//! - a rollout ends once, COMPLETED or FAILED, and an ended rollout stays as it ended.
//!
//! [`apply_service`], [`apply_deployment`] and [`detach`] are the only writers of a service's
//! `status`, a deployment's `status` and `rolloutState`, and an attachment's `status`.

use mpsfleet_types::service::{Deployment, DeploymentStatus, RolloutState, Service, ServiceStatus};
use mpsfleet_types::Task;

/// What happened to a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceEvent {
    /// DeleteService: its tasks are stopped, then the record goes.
    Delete,
}

/// The next status, or why `event` does not apply.
pub fn service_step(status: ServiceStatus, event: ServiceEvent) -> Result<ServiceStatus, String> {
    match (status, event) {
        (ServiceStatus::Active | ServiceStatus::Draining, ServiceEvent::Delete) => {
            Ok(ServiceStatus::Draining)
        }
    }
}

/// Moves `svc` by `event`.
pub fn apply_service(svc: &mut Service, event: ServiceEvent) -> Result<(), String> {
    svc.status = service_step(svc.status, event)?;
    Ok(())
}

/// What happened to a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeploymentEvent {
    /// A newer deployment started: this one's tasks are replaced by the new one's.
    Superseded,
    /// None of its tasks is left (or its definition is the PRIMARY one's again).
    Drained,
    /// Every desired task runs its definition and is healthy; no older task is left.
    Completed { reason: String },
    /// Its circuit breaker tripped.
    Failed { reason: String },
}

/// The next status and rollout state, or why `event` does not apply.
pub fn deployment_step(
    at: (DeploymentStatus, RolloutState),
    event: &DeploymentEvent,
) -> Result<(DeploymentStatus, RolloutState), String> {
    use DeploymentStatus::*;
    use RolloutState::*;
    match (at, event) {
        ((Primary, r), DeploymentEvent::Superseded) => Ok((Active, r)),
        ((Active, r), DeploymentEvent::Drained) => Ok((Inactive, r)),
        ((s @ (Primary | Active), InProgress), DeploymentEvent::Completed { .. }) => Ok((s, Completed)),
        ((s @ (Primary | Active), InProgress), DeploymentEvent::Failed { .. }) => Ok((s, Failed)),
        ((s, r), e) => Err(format!("a {} deployment ({}) cannot take {e:?}", s.as_str(), r.as_str())),
    }
}

/// Moves `d` by `event` at `now_ms`: its status, rollout state and reason.
pub fn apply_deployment(d: &mut Deployment, event: DeploymentEvent, now_ms: u64) -> Result<(), String> {
    let (status, rollout) = deployment_step((d.status, d.rollout_state), &event)?;
    match event {
        DeploymentEvent::Superseded if rollout == RolloutState::InProgress => {
            d.rollout_state_reason = "superseded by a newer deployment".into();
        }
        DeploymentEvent::Completed { reason } | DeploymentEvent::Failed { reason } => {
            d.rollout_state_reason = reason
        }
        _ => {}
    }
    d.status = status;
    d.rollout_state = rollout;
    d.updated_at_ms = now_ms;
    Ok(())
}

/// A stopped task's network attachments are gone (ECS's `DELETED`).
pub fn detach(t: &mut Task) {
    for a in &mut t.attachments {
        a.status = "DELETED".into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeploymentStatus::*;
    use RolloutState::*;

    #[test]
    fn a_deployment_moves_only_forward() {
        let done = DeploymentEvent::Completed { reason: "r".into() };
        let failed = DeploymentEvent::Failed { reason: "r".into() };
        assert_eq!(deployment_step((Primary, InProgress), &done), Ok((Primary, Completed)));
        assert_eq!(deployment_step((Primary, InProgress), &failed), Ok((Primary, Failed)));
        assert_eq!(
            deployment_step((Primary, Completed), &DeploymentEvent::Superseded),
            Ok((Active, Completed))
        );
        assert_eq!(
            deployment_step((Active, InProgress), &DeploymentEvent::Drained),
            Ok((Inactive, InProgress))
        );
        // INACTIVE is final; an ended rollout stays ended; only an ACTIVE deployment drains.
        assert!(deployment_step((Inactive, Completed), &DeploymentEvent::Superseded).is_err());
        assert!(deployment_step((Primary, Completed), &failed).is_err());
        assert!(deployment_step((Primary, Failed), &done).is_err());
        assert!(deployment_step((Primary, InProgress), &DeploymentEvent::Drained).is_err());
    }

    #[test]
    fn a_deleted_service_stays_deleted() {
        assert_eq!(service_step(ServiceStatus::Active, ServiceEvent::Delete), Ok(ServiceStatus::Draining));
        assert_eq!(service_step(ServiceStatus::Draining, ServiceEvent::Delete), Ok(ServiceStatus::Draining));
    }
}
