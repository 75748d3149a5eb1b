//! Events the server publishes on `GET /v1/events` and to the webhook: incidents opening,
//! moving and closing, hosts changing health or status, tasks stopping, and every entry
//! recorded in a task's, host's or service's events.

use crate::host::{HealthStatus, HostStatus};
use crate::ids::{HostId, PoolName};
use crate::incident::{IncidentView, TimelineEntry};
use crate::service::ObjectEvent;
use crate::task::Task;
use serde::{Deserialize, Serialize};

/// What happened; the SSE `event:` name and the `type` field of the JSON body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventType {
    #[serde(rename = "incident.opened")]
    IncidentOpened,
    /// A step was recorded (or the state moved) without resolving or blocking.
    #[serde(rename = "incident.updated")]
    IncidentUpdated,
    #[serde(rename = "incident.resolved")]
    IncidentResolved,
    #[serde(rename = "incident.blocked")]
    IncidentBlocked,
    /// A host's `healthStatus` changed.
    #[serde(rename = "host.health")]
    HostHealth,
    /// A host's lifecycle `status` changed.
    #[serde(rename = "host.status")]
    HostStatus,
    /// A task reached `STOPPED`.
    #[serde(rename = "task.stopped")]
    TaskStopped,
    /// An entry of a task's events (placed, started, probe failed, unable to place, ...).
    #[serde(rename = "task.event")]
    TaskEvent,
    /// An entry of a host's events (registered, daemon restarted locally, drained, ...).
    #[serde(rename = "host.event")]
    HostEvent,
    /// An entry of a service's events (deployment steps, replacements, ...).
    #[serde(rename = "service.event")]
    ServiceEvent,
    /// An entry of a pool's events (bounds changed, a recovery bound breached, drills).
    #[serde(rename = "pool.event")]
    PoolEvent,
}

impl EventType {
    pub const ALL: [EventType; 11] = [
        EventType::IncidentOpened,
        EventType::IncidentUpdated,
        EventType::IncidentResolved,
        EventType::IncidentBlocked,
        EventType::HostHealth,
        EventType::HostStatus,
        EventType::TaskStopped,
        EventType::TaskEvent,
        EventType::HostEvent,
        EventType::ServiceEvent,
        EventType::PoolEvent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::IncidentOpened => "incident.opened",
            EventType::IncidentUpdated => "incident.updated",
            EventType::IncidentResolved => "incident.resolved",
            EventType::IncidentBlocked => "incident.blocked",
            EventType::HostHealth => "host.health",
            EventType::HostStatus => "host.status",
            EventType::TaskStopped => "task.stopped",
            EventType::TaskEvent => "task.event",
            EventType::HostEvent => "host.event",
            EventType::ServiceEvent => "service.event",
            EventType::PoolEvent => "pool.event",
        }
    }

    /// The type named `s`, if there is one.
    pub fn parse(s: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Whether this is one of the `incident.*` types.
    pub fn is_incident(self) -> bool {
        matches!(
            self,
            EventType::IncidentOpened
                | EventType::IncidentUpdated
                | EventType::IncidentResolved
                | EventType::IncidentBlocked
        )
    }
}

/// A host as events show it: identity, lifecycle and health, and what changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostEvent {
    pub id: HostId,
    pub pool: PoolName,
    pub hostname: String,
    pub status: HostStatus,
    pub health_status: HealthStatus,
    pub cordoned: bool,
    /// The status before this event (`host.status` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_status: Option<HostStatus>,
    /// The health before this event (`host.health` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_health_status: Option<HealthStatus>,
}

/// The object an entry of its events belongs to (`task.event`, `host.event`, `service.event`,
/// `pool.event`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    /// The task's, host's or service's id (a service's or pool's name).
    pub id: String,
    pub pool: PoolName,
}

/// One event: `{"id", "type", "at_ms", "incident"?, "step"?, "host"?, "task"?, "subject"?, "event"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Where the event stands in the cluster's history, `TERM-N` (the leadership's fence and
    /// a count within it): later events have greater ids. Set when the server records the
    /// event; a reader resumes after it with `GET /v1/events?after=ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// Server time of the change, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The incident after the change (`incident.*`). Boxed, as `task` is: an event without
    /// them stays small in the server's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<Box<IncidentView>>,
    /// The timeline entry the change recorded, if it recorded one (`incident.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<TimelineEntry>,
    /// `host.*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostEvent>,
    /// The task after it stopped (`task.stopped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Box<Task>>,
    /// Whose event it is (`*.event`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Subject>,
    /// The entry recorded in the subject's events (`*.event`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<ObjectEvent>,
}

impl Event {
    /// An event of `kind` at `at_ms` with no subject yet.
    pub fn new(kind: EventType, at_ms: u64) -> Event {
        Event {
            id: None,
            kind,
            at_ms,
            incident: None,
            step: None,
            host: None,
            task: None,
            subject: None,
            event: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_round_trip() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), serde_json::json!(t.as_str()));
        }
        assert_eq!(EventType::parse("incident.closed"), None);
    }

    #[test]
    fn body_names_its_type_and_time() {
        let v = serde_json::to_value(Event::new(EventType::TaskStopped, 5)).unwrap();
        assert_eq!(v, serde_json::json!({"type": "task.stopped", "at_ms": 5}));
    }
}
