//! The host lifecycle, `REGISTERING -> ONBOARDING -> ACTIVE -> DRAINING -> DEREGISTERED`, as a
//! pure [`step`] over named events, and the guards ([`can_place`], [`is_live`], [`runs_tasks`],
//! [`is_terminal`]) that callers use instead of comparing statuses.
//!
//! What it promises:
//! - a host becomes ACTIVE once its agent says it is onboarded (every check has answered);
//! - DRAINING is the way out, and the only way back in is [`Event::Activate`]: an operator
//!   returns a repaired host to service;
//! - a DEREGISTERED host never returns: a machine that comes back registers as a new host.
//!
//! Cordoning and health are not statuses: [`can_place`] combines them with the status.
//!
//! [`apply`] and [`set_health`] are the only writers of a host record's `status` and
//! `health_status` (the architecture test holds every other file to it).

use mpsfleet_types::{HealthStatus, Host, HostStatus};

/// What happened to a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The server stored the agent's registration.
    Registered,
    /// The agent reports every check has answered (sent with every heartbeat).
    Onboarded,
    /// The host is on its way out: nothing new is placed there (a bad host, `host drain`).
    Drain,
    /// An operator returns a drained, repaired host to service.
    Activate,
    /// The host left the fleet (terminated, replaced, deregistered).
    Deregister,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Registered => "register",
            Event::Onboarded => "onboard",
            Event::Drain => "drain",
            Event::Activate => "activate",
            Event::Deregister => "deregister",
        }
    }
}

/// Why an event does not apply to a host's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("host is {}: cannot {} it{}", from.as_str(), event.as_str(), hint(*from, *event))]
pub struct TransitionError {
    pub from: HostStatus,
    pub event: Event,
}

fn hint(from: HostStatus, event: Event) -> &'static str {
    match (from, event) {
        (HostStatus::Deregistered, _) => {
            " (a deregistered host never returns; register it again as a new host)"
        }
        (HostStatus::Registering | HostStatus::Onboarding, Event::Activate) => {
            " (it becomes ACTIVE once its agent has onboarded)"
        }
        _ => "",
    }
}

/// The next status of a host after `event`. Events that change nothing (the onboarded flag of
/// every heartbeat, a second drain) return the status unchanged; events that would break the
/// lifecycle return why.
pub fn step(from: HostStatus, event: Event) -> Result<HostStatus, TransitionError> {
    use HostStatus::*;
    let refuse = Err(TransitionError { from, event });
    match (from, event) {
        (Deregistered, Event::Deregister) => Ok(Deregistered),
        (Deregistered, _) => refuse,
        (_, Event::Deregister) => Ok(Deregistered),

        (Registering, Event::Registered) => Ok(Onboarding),
        (_, Event::Registered) => refuse,

        (Registering, Event::Onboarded) => refuse,
        (Onboarding, Event::Onboarded) => Ok(Active),
        // Every heartbeat says it; a draining host stays draining.
        (Active | Draining, Event::Onboarded) => Ok(from),

        (Onboarding | Active | Draining, Event::Drain) => Ok(Draining),
        (Registering, Event::Drain) => refuse,

        (Draining | Active, Event::Activate) => Ok(Active),
        (Registering | Onboarding, Event::Activate) => refuse,
    }
}

/// Moves the host `h` by `event`: [`step`] decides, and `h.status` becomes the next status.
/// An onboarded host starts healthy (its checks have all answered). Gives the status it left;
/// on an error `h` is unchanged.
pub fn apply(h: &mut Host, event: Event) -> Result<HostStatus, TransitionError> {
    let from = h.status;
    h.status = step(from, event)?;
    if from == HostStatus::Onboarding && h.status == HostStatus::Active {
        h.health_status = HealthStatus::Ok;
    }
    Ok(from)
}

/// The health the server's evaluation of the host's checks and heartbeats gives it.
pub fn set_health(h: &mut Host, health: HealthStatus) {
    h.health_status = health;
}

/// DEREGISTERED: the host is gone for good.
pub fn is_terminal(status: HostStatus) -> bool {
    status == HostStatus::Deregistered
}

/// Part of the fleet: anything but DEREGISTERED.
pub fn is_live(status: HostStatus) -> bool {
    !is_terminal(status)
}

/// Onboarded and not gone: ACTIVE or DRAINING, its tasks run and its health counts.
pub fn runs_tasks(status: HostStatus) -> bool {
    matches!(status, HostStatus::Active | HostStatus::Draining)
}

/// Whether a host may receive new placements: ACTIVE, not cordoned, and healthy (an impaired
/// host, or one whose agent has gone quiet, gets nothing new).
pub fn can_place(h: &Host) -> bool {
    h.status == HostStatus::Active && !h.cordoned && h.health_status == HealthStatus::Ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use HostStatus::*;

    /// One transition: `want` is the next status, or a piece of the error's message.
    fn check(from: HostStatus, event: Event, want: Result<HostStatus, &str>) {
        let got = step(from, event);
        match (&got, want) {
            (Ok(next), Ok(w)) => assert_eq!(*next, w, "{from:?} + {event:?}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{from:?} + {event:?}: {e} lacks {w:?}"),
            _ => panic!("{from:?} + {event:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn transitions() {
        use Event::*;
        // The way in.
        check(Registering, Registered, Ok(Onboarding));
        check(Onboarding, Onboarded, Ok(Active));
        check(Active, Onboarded, Ok(Active));
        check(Registering, Onboarded, Err("host is REGISTERING: cannot onboard it"));
        check(Onboarding, Registered, Err("host is ONBOARDING: cannot register it"));
        check(Active, Registered, Err("cannot register"));
        // Draining, and back with an operator's activate.
        check(Active, Drain, Ok(Draining));
        check(Onboarding, Drain, Ok(Draining));
        check(Draining, Drain, Ok(Draining));
        check(Draining, Onboarded, Ok(Draining));
        check(Draining, Activate, Ok(Active));
        check(Active, Activate, Ok(Active));
        check(Onboarding, Activate, Err("once its agent has onboarded"));
        check(Registering, Activate, Err("host is REGISTERING: cannot activate it"));
        check(Registering, Drain, Err("cannot drain"));
        // The way out, for good.
        for from in [Registering, Onboarding, Active, Draining, Deregistered] {
            check(from, Deregister, Ok(Deregistered));
        }
        for event in [Registered, Onboarded, Drain, Activate] {
            check(Deregistered, event, Err("a deregistered host never returns"));
        }
        check(Deregistered, Activate, Err("host is DEREGISTERED: cannot activate it"));
    }

    #[test]
    fn guards() {
        for (s, live, runs) in [
            (Registering, true, false),
            (Onboarding, true, false),
            (Active, true, true),
            (Draining, true, true),
            (Deregistered, false, false),
        ] {
            assert_eq!((is_live(s), runs_tasks(s), is_terminal(s)), (live, runs, !live), "{s:?}");
        }
    }

    #[test]
    fn placement_needs_active_uncordoned_and_healthy() {
        let host = |status, cordoned, health_status| Host {
            id: mpsfleet_types::HostId::new("h-1").unwrap(),
            pool: mpsfleet_types::PoolName::new("p").unwrap(),
            hostname: "h".into(),
            status,
            health_status,
            cordoned,
            emulated: true,
            mps_available: true,
            gpus: Vec::new(),
            runtime: Default::default(),
            runtime_version: None,
            plugins: Default::default(),
            platform: Default::default(),
            seq: 0,
            registered_at_ms: 0,
            credential_sha256: String::new(),
            credential_revoked_at_ms: None,
            legacy_agent_token: String::new(),
            events: Default::default(),
            rechecks: 0,
        };
        assert!(can_place(&host(Active, false, HealthStatus::Ok)));
        assert!(!can_place(&host(Active, true, HealthStatus::Ok)));
        assert!(!can_place(&host(Active, false, HealthStatus::Impaired)));
        assert!(!can_place(&host(Active, false, HealthStatus::InsufficientData)));
        assert!(!can_place(&host(Draining, false, HealthStatus::Ok)));
        assert!(!can_place(&host(Onboarding, false, HealthStatus::Ok)));
    }
}
