//! `GET /v1/events`: the cluster's events as a server-sent event stream, filtered by type.

use super::{viewer, AppState, Q};
use crate::cluster::Touch;
use crate::error::ApiError;
use crate::events::KEEP_ALIVE;
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
    SseEvent::default()
        .event(ev.kind.as_str())
        .json_data(ev)
        .unwrap_or_else(|e| SseEvent::default().comment(format!("cannot encode an event: {e}")))
}

/// `GET /v1/events[?types=a,b]`: a server-sent event stream of [`Event`]s, for any role.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    summary = "Server-sent events: incidents, host health and status, stopped tasks, and every entry of a task's, host's or service's events.",
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
    st.call(&headers, viewer, Touch::Cluster, |_, _| Ok(())).await?;
    let rx = st.events.subscribe();
    let stopping = st.events.stopping();
    let events = futures_util::stream::unfold((rx, stopping), move |(mut rx, mut stopping)| async move {
        loop {
            let got = tokio::select! {
                got = rx.recv() => got,
                _ = stopping.wait_for(|s| *s) => return None,
            };
            let out = match got {
                Ok(ev) if filter.wants(ev.kind) => sse(&ev),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    SseEvent::default().event("lagged").data(serde_json::json!({ "dropped": n }).to_string())
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            return Some((Ok(out), (rx, stopping)));
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
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
