//! `GET /v1/events`: the cluster's events as a server-sent event stream, filtered by type: the
//! recent past the history keeps (when asked for), then what happens from now on (unless
//! `follow=false`). `GET /v1/events/replica`: the same for a follower copying the history.

use super::{viewer, AppState, Q};
use crate::cluster::Touch;
use crate::error::ApiError;
use crate::events::history::{Cursor, From};
use crate::events::{Events, KEEP_ALIVE};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::Stream;
use mpsfleet_types::event::{Event, EventType};
use serde::Deserialize;
use std::convert::Infallible;
use tokio::sync::broadcast;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct EventsQuery {
    /// Comma-separated event types; all when absent.
    types: Option<String>,
    /// Replay the kept events at or after this time (ms since the Unix epoch) first.
    since_ms: Option<u64>,
    /// Replay the kept events after the one with this id (`TERM-N`) first.
    after: Option<String>,
    /// Go on with new events as they happen (the default); `false` ends the stream after the
    /// replayed ones.
    follow: Option<bool>,
}

impl EventsQuery {
    /// What to replay first; `None` when the reader wants only what happens from now on.
    fn from(&self) -> Result<Option<From>, ApiError> {
        let after = match &self.after {
            Some(a) => Some(Cursor::parse(a).ok_or_else(|| {
                ApiError::invalid(
                    "after",
                    format!("{a:?} is not an event id (TERM-N, as an event's id shows)"),
                )
            })?),
            None => None,
        };
        if after.is_none() && self.since_ms.is_none() {
            return Ok(None);
        }
        Ok(Some(From { after, since_ms: self.since_ms }))
    }
}

/// The event types a stream wants, as a bit set over [`EventType::ALL`].
#[derive(Clone, Copy)]
struct Filter(u32);

impl Filter {
    fn parse(types: Option<&str>) -> Result<Filter, ApiError> {
        let Some(types) = types else { return Ok(Filter(u32::MAX)) };
        let mut bits = 0;
        for name in types.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let t = EventType::parse(name).ok_or_else(|| {
                let known: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
                ApiError::invalid(
                    "types",
                    format!("unknown event type {name:?}; known: {}", known.join(", ")),
                )
            })?;
            bits |= Filter::bit(t);
        }
        if bits == 0 {
            return Err(ApiError::invalid("types", "names no event type"));
        }
        Ok(Filter(bits))
    }

    fn bit(t: EventType) -> u32 {
        1 << EventType::ALL.iter().position(|x| *x == t).unwrap_or(0)
    }

    fn wants(self, t: EventType) -> bool {
        self.0 & Filter::bit(t) != 0
    }
}

fn sse(ev: &Event) -> SseEvent {
    let mut out = SseEvent::default();
    if let Some(id) = &ev.id {
        out = out.id(id);
    }
    out.event(ev.kind.as_str())
        .json_data(ev)
        .unwrap_or_else(|e| SseEvent::default().comment(format!("cannot encode an event: {e}")))
}

/// `GET /v1/events[?types=a,b][&since_ms=T|&after=ID][&follow=false]`: a server-sent event
/// stream of [`Event`]s, for any role.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    summary = "Server-sent events: incidents, host health and status, stopped tasks, and every entry of a task's, host's, service's or pool's events. With since_ms or after, the kept past first (the last hour, at most 10,000 events); follow=false ends after it.",
    params(EventsQuery),
    responses(
        (status = 200, description = "A stream of server-sent events (`event:` the type, `data:` the JSON event).", body = String, content_type = "text/event-stream"),
        crate::openapi::Errors
    )
)]
pub(super) async fn stream(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let filter = Filter::parse(q.types.as_deref())?;
    let from = q.from()?;
    let follow = q.follow.unwrap_or(true);
    if !follow && from.is_none() {
        return Err(ApiError::invalid(
            "follow",
            "follow=false needs since_ms or after: there is nothing to replay",
        ));
    }
    st.call(&headers, viewer, Touch::Cluster, |_, _| Ok(())).await?;
    Ok(replay_then_follow(&st.events, filter, from, follow))
}

/// `GET /v1/events/replica?after=ID`: every event after `after`, then the new ones, for a
/// follower keeping its copy of the history. Only another server of the cluster may ask (a
/// header signed with the cluster's key, see [`crate::forward::verify_replica`]).
#[utoipa::path(
    get,
    path = "/v1/events/replica",
    tag = "events",
    summary = "For the servers of an HA cluster: a follower's copy of the leader's event history (every kept event after `after`, then the new ones). Needs the x-mpsfleet-replica header signed with the cluster's key; no token.",
    params(EventsQuery),
    responses(
        (status = 200, description = "A stream of server-sent events.", body = String, content_type = "text/event-stream"),
        crate::openapi::Errors
    )
)]
pub(super) async fn replica(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    from_a_peer(&st, &headers, "only another server of this cluster may copy the event history").await?;
    let from = From { after: q.from()?.and_then(|f| f.after).or(Some(Cursor::default())), since_ms: None };
    Ok(replay_then_follow(&st.events, Filter(u32::MAX), Some(from), true))
}

/// Refuses, with `refusal`, a caller that is not another server of this cluster (a header
/// signed with the cluster's key, [`crate::forward::verify_replica`]).
pub(super) async fn from_a_peer(
    st: &AppState,
    headers: &HeaderMap,
    refusal: &'static str,
) -> Result<(), ApiError> {
    // The cluster lock may be held a while (a large commit): taken off the async workers.
    let cluster = st.cluster.clone();
    let key = tokio::task::spawn_blocking(move || {
        cluster.lock().map(|c| crate::forward::forwarding_key(c.server_key())).ok()
    })
    .await
    .ok()
    .flatten()
    .ok_or_else(|| ApiError::from(crate::cluster::Error::Internal("the cluster lock is poisoned".into())))?;
    let signed = headers.get(crate::forward::REPLICA).and_then(|v| v.to_str().ok());
    let now_ms = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    if !signed.is_some_and(|v| crate::forward::verify_replica(&key, v, now_ms)) {
        return Err(ApiError::from(crate::cluster::Error::Unauthorized(refusal)));
    }
    Ok(())
}

/// `GET /v1/discovery/replica`: what this leader publishes in DNS, every pool, with the
/// revision it was read at, for a follower answering DNS from a copy (`dns::serve_copy`).
/// Only another server of the cluster may ask.
#[utoipa::path(
    get,
    path = "/v1/discovery/replica",
    tag = "events",
    summary = "For the servers of an HA cluster: what the leader publishes in DNS (every pool), for a follower's copy. Needs the x-mpsfleet-replica header signed with the cluster's key; no token.",
    responses((status = 200, description = "The published services and the revision.", body = Object), crate::openapi::Errors)
)]
pub(super) async fn discovery_replica(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<axum::Json<crate::dns::DiscoveryCopy>, ApiError> {
    from_a_peer(&st, &headers, "only another server of this cluster may copy what it publishes").await?;
    let cluster = st.cluster.clone();
    let copy = tokio::task::spawn_blocking(move || {
        let c = cluster.lock().ok()?;
        let r = c.read();
        Some(crate::dns::DiscoveryCopy { revision: r.revision(), services: r.discovery(None) })
    })
    .await
    .ok()
    .flatten()
    .ok_or_else(|| ApiError::from(crate::cluster::Error::Internal("the cluster lock is poisoned".into())))?;
    Ok(axum::Json(copy))
}

/// The stream: the history's events `from` asks for, then (when `follow`) the live ones after
/// them. The live channel is subscribed to before the history is read, and what it carries
/// up to the history's last id is skipped: nothing is missed or sent twice.
fn replay_then_follow(
    events: &Events,
    filter: Filter,
    from: Option<From>,
    follow: bool,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let rx = follow.then(|| events.subscribe());
    let stopping = events.stopping();
    let (past, upto) = match from {
        Some(from) => events.history().read(from, |kind| filter.wants(kind)),
        None => (Vec::new(), events.history().last()),
    };
    let past = futures_util::stream::iter(past.into_iter().map(|e| Ok(sse(&e))));
    let live = futures_util::stream::unfold((rx, stopping), move |(rx, mut stopping)| async move {
        let mut rx = rx?;
        loop {
            let got = tokio::select! {
                got = rx.recv() => got,
                _ = stopping.wait_for(|s| *s) => return None,
            };
            let out = match got {
                Ok(ev) if filter.wants(ev.kind) && Cursor::of(&ev).is_none_or(|c| c > upto) => sse(&ev),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    SseEvent::default().event("lagged").data(serde_json::json!({ "dropped": n }).to_string())
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            return Some((Ok(out), (Some(rx), stopping)));
        }
    });
    Sse::new(futures_util::StreamExt::chain(past, live)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_name_known_types() {
        let f = Filter::parse(Some("incident.opened, host.health")).unwrap();
        assert!(f.wants(EventType::HostHealth) && !f.wants(EventType::TaskStopped));
        assert!(Filter::parse(None).unwrap().wants(EventType::TaskStopped));
        assert!(Filter::parse(Some("incident.nope")).is_err());
        assert!(Filter::parse(Some(",")).is_err());
    }
}
