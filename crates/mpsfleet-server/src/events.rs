//! Events for operators: what changed in incidents, hosts and tasks, published after the
//! change is committed, to `GET /v1/events` (server-sent events) and to an optional webhook.
//!
//! `Cluster` calls [`Events`] from the few places that write incidents, hosts and tasks. Each
//! event is kept in the bounded [`history::History`] (the recent past a reader can ask for)
//! and handed on without blocking: the stream is a `tokio::sync::broadcast` channel (a
//! subscriber that falls behind its buffer is told how many events it missed), and the webhook
//! is a bounded queue drained by one task (when full, the oldest event is dropped and logged).

pub mod history;

use history::{Cursor, History};
use mpsfleet_core::changes::{self, TaskChange};
use mpsfleet_types::event::{Event, EventType, HostEvent, Subject};
use mpsfleet_types::{
    GpuUuid, HealthStatus, Host, HostId, HostStatus, Incident, IncidentState, IncidentView, ObjectEvent,
    PoolName, Task, TaskId,
};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch, Notify};

/// Events kept for each stream subscriber before it is told it lagged.
pub const STREAM_BUFFER: usize = 1024;

/// Events waiting for the webhook before the oldest is dropped.
pub const WEBHOOK_QUEUE: usize = 1024;

/// How often an idle stream gets a keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Webhook delivery: this many attempts, waiting `WEBHOOK_BACKOFF[n]` after failed attempt n.
pub const WEBHOOK_ATTEMPTS: usize = 3;
pub const WEBHOOK_BACKOFF: [Duration; 3] =
    [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// Longest one webhook request may take.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a webhook could not be set up or an event not delivered.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("invalid webhook url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot reach the webhook {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the webhook {url} answered http {status}")]
    Refused { url: String, status: u16 },
}

/// Where events go: the history, the stream's channel and, when configured, the webhook's queue.
#[derive(Clone)]
pub struct Events {
    tx: broadcast::Sender<Event>,
    history: Arc<History>,
    /// The leadership events are recorded under (its fence; 0 for a lone server).
    term: u64,
    webhook: Option<Arc<Webhook>>,
    /// Set once when the server stops, so that open streams end and shutdown can finish.
    stopping: watch::Sender<bool>,
}

impl Default for Events {
    fn default() -> Self {
        Events::new(None, Arc::default(), 0)
    }
}

impl Events {
    /// Events kept in `history` under `term`, and sent to `webhook` when there is one.
    pub fn new(webhook: Option<Arc<Webhook>>, history: Arc<History>, term: u64) -> Self {
        Events {
            tx: broadcast::channel(STREAM_BUFFER).0,
            history,
            term,
            webhook,
            stopping: watch::Sender::new(false),
        }
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// Turns true when every open stream is to end (the server is stopping).
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// Ends every open stream (the server is stopping).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    pub fn publish(&self, ev: Event) {
        self.keep(Kept::Built(Box::new(ev)));
    }

    /// Keeps `kept` in the history and hands it, in full, to whoever listens now: nothing is
    /// built when nobody does (a compact entry is put in words when the history is read).
    fn keep(&self, kept: Kept) {
        let kind = kept.kind();
        let webhook = self.webhook.as_ref().filter(|_| kind.is_incident() || kind == EventType::HostHealth);
        if !self.history.keeps() && webhook.is_none() && self.tx.receiver_count() == 0 {
            return;
        }
        self.history.record(self.term, kept, |id, kept| {
            let live = self.tx.receiver_count() > 0;
            if webhook.is_none() && !live {
                return;
            }
            let ev = kept.event(id);
            if let Some(w) = webhook {
                w.push(ev.clone());
            }
            if live {
                let _ = self.tx.send(ev);
            }
        });
    }

    /// Whether an event published now would go anywhere (the history, a stream, the
    /// webhook): a caller may skip finding what it would say when not.
    pub fn wanted(&self) -> bool {
        self.history.keeps() || self.webhook.is_some() || self.tx.receiver_count() > 0
    }

    /// After an incident write: `before` is the stored incident's state and its timeline's
    /// [`History::pushed`](mpsfleet_types::History::pushed) count.
    pub fn incident(&self, before: Option<(&IncidentState, u64)>, after: &Incident, at_ms: u64) {
        incident_events(before, after, at_ms).into_iter().for_each(|e| self.publish(e));
    }

    /// After a host write: `before` is the stored host's status and health.
    pub fn host(&self, before: (HostStatus, HealthStatus), after: &Host, at_ms: u64) {
        host_events(before, after, at_ms).into_iter().for_each(|e| self.publish(e));
    }

    /// Entries just recorded in a task's, host's or service's events (`kind` is one of the
    /// `*.event` types).
    pub fn recorded(&self, kind: EventType, subject: &Subject, entries: &[ObjectEvent], at_ms: u64) {
        for e in entries {
            self.publish(Event {
                subject: Some(subject.clone()),
                event: Some(e.clone()),
                ..Event::new(kind, at_ms)
            });
        }
    }

    /// Changes just recorded in `task`'s events, in words (`task.event`). A `Placed` is kept
    /// compact, its host and GPUs only: its words are built when it is read.
    pub fn task_changes(&self, task: &Task, news: &[TaskChange], at_ms: u64) {
        for c in news {
            match c {
                TaskChange::Placed => self.keep(Kept::Placed(Placed {
                    at_ms,
                    task: task.id,
                    pool: task.pool.clone(),
                    host: task.host_id.clone(),
                    gpu: task.gpu_ids.first().cloned(),
                    more_gpus: task.gpu_ids.get(1..).unwrap_or_default().into(),
                })),
                c => self.publish(task_event(task.id, &task.pool, changes::render(c, task), at_ms)),
            }
        }
    }

    /// After a task update that stopped the task.
    pub fn task_stopped(&self, task: &Task, at_ms: u64) {
        self.publish(Event {
            task: Some(Box::new(task.clone())),
            ..Event::new(EventType::TaskStopped, at_ms)
        });
    }
}

/// An event as the history keeps it: built as it happened, or a task's `Placed` kept
/// compact and built in words when it is read (one per task on the submit path).
pub enum Kept {
    Built(Box<Event>),
    Placed(Placed),
}

/// What a task's `Placed` event says: where it was placed.
pub struct Placed {
    at_ms: u64,
    task: TaskId,
    pool: PoolName,
    host: Option<HostId>,
    /// Its first GPU, and the others (none allocates nothing: a task has one GPU or few).
    gpu: Option<GpuUuid>,
    more_gpus: Box<[GpuUuid]>,
}

impl Kept {
    pub fn kind(&self) -> EventType {
        match self {
            Kept::Built(e) => e.kind,
            Kept::Placed(_) => EventType::TaskEvent,
        }
    }

    pub fn at_ms(&self) -> u64 {
        match self {
            Kept::Built(e) => e.at_ms,
            Kept::Placed(p) => p.at_ms,
        }
    }

    /// The event in full, with its id.
    pub fn event(&self, id: Cursor) -> Event {
        let ev = match self {
            Kept::Built(e) => Event::clone(e),
            Kept::Placed(p) => {
                let gpus: Vec<GpuUuid> = p.gpu.iter().chain(p.more_gpus.iter()).cloned().collect();
                task_event(p.task, &p.pool, changes::placed(p.host.as_ref(), &gpus), p.at_ms)
            }
        };
        Event { id: Some(id.to_string()), ..ev }
    }
}

/// A `task.event`: `entry` of task `id`'s events.
fn task_event(id: TaskId, pool: &PoolName, entry: ObjectEvent, at_ms: u64) -> Event {
    Event {
        subject: Some(Subject { id: id.to_string(), pool: pool.clone() }),
        event: Some(entry),
        ..Event::new(EventType::TaskEvent, at_ms)
    }
}

/// The events of one incident write: opened; or resolved / blocked when it just became so;
/// otherwise one `incident.updated` per step recorded (or one without a step when only the
/// state moved).
pub fn incident_events(before: Option<(&IncidentState, u64)>, after: &Incident, at_ms: u64) -> Vec<Event> {
    let view = || Some(Box::new(IncidentView::of(after.clone())));
    let last = || after.timeline.last().cloned();
    let Some((state, len)) = before else {
        return vec![Event {
            incident: view(),
            step: last(),
            ..Event::new(EventType::IncidentOpened, at_ms)
        }];
    };
    let kind = match (&after.state, state) {
        (IncidentState::Resolved, IncidentState::Resolved) => None,
        (IncidentState::Resolved, _) => Some(EventType::IncidentResolved),
        (IncidentState::Blocked { reason }, IncidentState::Blocked { reason: old }) if reason == old => None,
        (IncidentState::Blocked { .. }, _) => Some(EventType::IncidentBlocked),
        _ => None,
    };
    if let Some(kind) = kind {
        return vec![Event { incident: view(), step: last(), ..Event::new(kind, at_ms) }];
    }
    let steps = after.timeline.since(len);
    if steps.is_empty() {
        if &after.state == state {
            return Vec::new();
        }
        return vec![Event { incident: view(), ..Event::new(EventType::IncidentUpdated, at_ms) }];
    }
    steps
        .iter()
        .map(|s| Event {
            incident: view(),
            step: Some(s.clone()),
            ..Event::new(EventType::IncidentUpdated, at_ms)
        })
        .collect()
}

/// The events of one host write: `host.status` and/or `host.health` for what changed.
pub fn host_events(before: (HostStatus, HealthStatus), after: &Host, at_ms: u64) -> Vec<Event> {
    let (status, health) = before;
    let host = |previous_status, previous_health_status| HostEvent {
        id: after.id.clone(),
        pool: after.pool.clone(),
        hostname: after.hostname.clone(),
        status: after.status,
        health_status: after.health_status,
        cordoned: after.cordoned,
        previous_status,
        previous_health_status,
    };
    let mut out = Vec::new();
    if after.status != status {
        out.push(Event { host: Some(host(Some(status), None)), ..Event::new(EventType::HostStatus, at_ms) });
    }
    if after.health_status != health {
        out.push(Event { host: Some(host(None, Some(health))), ..Event::new(EventType::HostHealth, at_ms) });
    }
    out
}

// ---- webhook ----------------------------------------------------------------------------

/// A bounded queue of events for one webhook URL, drained by [`Webhook::run`].
pub struct Webhook {
    url: String,
    /// Every delivery is signed with it (`X-Mpsfleet-Signature`).
    secret: [u8; 32],
    /// For an `https://` URL: a CA (PEM) to trust besides the system's roots.
    ca: Option<Vec<u8>>,
    queue: Mutex<VecDeque<Event>>,
    wake: Notify,
}

impl Webhook {
    /// A webhook posting to `url`, each delivery signed with `secret`. An `https://` receiver
    /// is verified against the system's roots and `ca` (PEM), when given.
    pub fn new(url: &str, secret: [u8; 32], ca: Option<Vec<u8>>) -> Result<Arc<Webhook>, WebhookError> {
        let invalid = |reason: &str| WebhookError::InvalidUrl { url: url.into(), reason: reason.into() };
        let parsed = reqwest::Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("must be an https:// (or http://) url"));
        }
        if parsed.host_str().is_none() {
            return Err(invalid("has no host"));
        }
        if let Some(pem) = &ca {
            mpsfleet_client::tls::certificates(pem).map_err(|e| invalid(&format!("its CA: {e}")))?;
        }
        Ok(Arc::new(Webhook {
            url: url.into(),
            secret,
            ca,
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
        }))
    }

    /// The client deliveries go out with: no redirects, a timeout, the system's roots and the
    /// webhook's own CA.
    fn client(&self) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(WEBHOOK_TIMEOUT);
        for der in self
            .ca
            .as_deref()
            .map(mpsfleet_client::tls::certificates)
            .and_then(Result::ok)
            .unwrap_or_default()
        {
            if let Ok(cert) = reqwest::Certificate::from_der(&der) {
                builder = builder.add_root_certificate(cert);
            }
        }
        builder.build().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot build the webhook client; deliveries go without a timeout");
            reqwest::Client::default()
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Queues `ev`; never blocks on delivery. When the queue is full the oldest event goes.
    fn push(&self, ev: Event) {
        let Ok(mut q) = self.queue.lock() else { return };
        if q.len() >= WEBHOOK_QUEUE {
            if let Some(old) = q.pop_front() {
                tracing::warn!(
                    url = %self.url, dropped = old.kind.as_str(), at_ms = old.at_ms,
                    "webhook queue full; dropped the oldest event"
                );
            }
        }
        q.push_back(ev);
        drop(q);
        self.wake.notify_one();
    }

    async fn next(&self) -> Event {
        loop {
            if let Some(ev) = self.queue.lock().ok().and_then(|mut q| q.pop_front()) {
                return ev;
            }
            self.wake.notified().await;
        }
    }

    /// Delivers queued events one at a time, in order, until the task is aborted.
    pub async fn run(self: Arc<Self>) {
        let http = self.client();
        loop {
            let ev = self.next().await;
            if let Err(e) = self.deliver(&http, &ev).await {
                tracing::warn!(error = %e, event = ev.kind.as_str(), "webhook delivery failed; event dropped");
            }
        }
    }

    async fn deliver(&self, http: &reqwest::Client, ev: &Event) -> Result<(), WebhookError> {
        let body = serde_json::to_vec(ev).map_err(|e| WebhookError::Unreachable {
            url: self.url.clone(),
            reason: format!("cannot encode the event: {e}"),
        })?;
        let mut last = None;
        for attempt in 0..WEBHOOK_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(WEBHOOK_BACKOFF[attempt - 1]).await;
            }
            // Signed anew at each attempt: a receiver refuses old timestamps (replays).
            let timestamp = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock) / 1000;
            let request = http
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("X-Mpsfleet-Timestamp", timestamp.to_string())
                .header(
                    "X-Mpsfleet-Signature",
                    crate::auth::webhook_signature(&self.secret, timestamp, &body),
                )
                .body(body.clone());
            let e = match request.send().await {
                Err(e) => WebhookError::Unreachable { url: self.url.clone(), reason: e.to_string() },
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => WebhookError::Refused { url: self.url.clone(), status: r.status().as_u16() },
            };
            tracing::debug!(error = %e, attempt = attempt + 1, "webhook attempt failed");
            last = Some(e);
        }
        Err(last.unwrap_or(WebhookError::Unreachable { url: self.url.clone(), reason: "no attempt".into() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::{IncidentOwner, Step, Trigger};

    fn incident(state: IncidentState, steps: &[Step]) -> Incident {
        let trigger = Trigger {
            check: "AGENT".into(),
            gpu_id: None,
            reason: "silent".into(),
            evidence: String::new(),
            first_failure_at_ms: None,
            local_repairs_at_ms: Vec::new(),
            earlier_repairs_at_ms: Vec::new(),
        };
        let mut i = Incident::open(
            "i-1".into(),
            HostId::new("h-1").unwrap(),
            PoolName::new("gpu").unwrap(),
            IncidentOwner::Operator,
            trigger,
            1,
            1,
        );
        for (n, s) in steps.iter().enumerate().skip(1) {
            i.push(1, *s, format!("step {n}"), None);
        }
        i.state = state;
        i
    }

    fn kinds(v: &[Event]) -> Vec<EventType> {
        v.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn incident_writes_become_events() {
        let open = incident(IncidentState::Open, &[Step::Detected]);
        assert_eq!(kinds(&incident_events(None, &open, 5)), [EventType::IncidentOpened]);
        let more = incident(IncidentState::Remediating, &[Step::Detected, Step::Decided, Step::Cordoned]);
        let ev = incident_events(Some((&IncidentState::Open, 1)), &more, 5);
        assert_eq!(kinds(&ev), [EventType::IncidentUpdated, EventType::IncidentUpdated]);
        assert_eq!(ev[1].step.as_ref().map(|s| s.step), Some(Step::Cordoned));
        assert!(incident_events(Some((&IncidentState::Open, 1)), &open, 5).is_empty());
        let blocked = IncidentState::Blocked { reason: "storm".into() };
        let b = incident(blocked.clone(), &[Step::Detected, Step::Blocked]);
        assert_eq!(
            kinds(&incident_events(Some((&IncidentState::Open, 1)), &b, 5)),
            [EventType::IncidentBlocked]
        );
        assert!(incident_events(Some((&blocked, 2)), &b, 5).is_empty());
        let r = incident(IncidentState::Resolved, &[Step::Detected, Step::Resolved]);
        assert_eq!(kinds(&incident_events(Some((&blocked, 2)), &r, 5)), [EventType::IncidentResolved]);
    }

    #[test]
    fn host_writes_become_events() {
        let host: Host = serde_json::from_value(serde_json::json!({
            "id": "h-1", "pool": "gpu", "hostname": "n1", "status": "DRAINING", "healthStatus": "IMPAIRED",
            "cordoned": true, "emulated": true, "mpsAvailable": true, "gpus": [], "seq": 0,
            "registeredAtMs": 1, "credentialSha256": ""
        }))
        .unwrap();
        let ev = host_events((HostStatus::Active, HealthStatus::Ok), &host, 9);
        assert_eq!(kinds(&ev), [EventType::HostStatus, EventType::HostHealth]);
        assert_eq!(ev[0].host.as_ref().unwrap().id, HostId::new("h-1").unwrap());
        assert_eq!(ev[1].host.as_ref().unwrap().previous_health_status, Some(HealthStatus::Ok));
        assert!(host_events((HostStatus::Draining, HealthStatus::Impaired), &host, 9).is_empty());
    }

    fn placed_task(n: u64, gpus: &[&str]) -> Task {
        let mut t = Task::new(
            TaskId(n),
            mpsfleet_types::TaskDefRef::parse("bench:1").unwrap(),
            PoolName::new("gpu").unwrap(),
            None,
            "admin".into(),
            1_000 + n,
        );
        t.host_id = Some(HostId::new("h-1").unwrap());
        t.gpu_ids = gpus.iter().map(|g| GpuUuid::new(*g).unwrap()).collect();
        t
    }

    /// The event a task's change made when every entry was built as it happened.
    fn eager(t: &Task, c: &TaskChange, at_ms: u64, id: &str) -> Event {
        Event {
            id: Some(id.into()),
            subject: Some(Subject { id: t.id.to_string(), pool: t.pool.clone() }),
            event: Some(changes::render(c, t)),
            ..Event::new(EventType::TaskEvent, at_ms)
        }
    }

    #[tokio::test]
    async fn a_placed_entry_built_when_read_is_the_one_built_as_it_happened() {
        let events = Events::default();
        let mut live = events.subscribe();
        let (a, b, mut stopped) =
            (placed_task(1, &["GPU-a", "GPU-b"]), placed_task(2, &[]), placed_task(3, &["GPU-c"]));
        stopped.last_status = mpsfleet_types::TaskStatus::Stopped;
        stopped.stopped_reason = Some("done".into());
        events.task_changes(&a, &[TaskChange::Placed], 10);
        events.publish(Event::new(EventType::HostHealth, 11));
        events.task_changes(&b, &[TaskChange::Placed], 12);
        events.task_changes(&stopped, &[TaskChange::Placed, TaskChange::Stopped], 13);
        let want = [
            eager(&a, &TaskChange::Placed, 10, "0-1"),
            Event { id: Some("0-2".into()), ..Event::new(EventType::HostHealth, 11) },
            eager(&b, &TaskChange::Placed, 12, "0-3"),
            eager(&stopped, &TaskChange::Placed, 13, "0-4"),
            eager(&stopped, &TaskChange::Stopped, 13, "0-5"),
        ];
        let (read, last) = events.history().read(history::From::default(), |_| true);
        assert_eq!(read, want, "read from the history: words, times, ids and order");
        assert_eq!(last, Cursor { term: 0, n: 5 });
        for w in &want {
            assert_eq!(&live.recv().await.unwrap(), w, "as a live stream got it");
        }
        // Byte for byte as the API writes them.
        let json = |v: &[Event]| v.iter().map(|e| serde_json::to_string(e).unwrap()).collect::<Vec<_>>();
        assert_eq!(json(&read), json(&want));
        assert_eq!(
            read[0].event.as_ref().map(|e| e.message.as_str()),
            Some("placed on host h-1, GPU GPU-a, GPU-b")
        );
        assert_eq!(read[2].event.as_ref().map(|e| e.message.as_str()), Some("placed on host h-1, no GPU"));
        // Only of the types asked for.
        let (health, _) = events.history().read(history::From::default(), |k| k == EventType::HostHealth);
        assert_eq!(health, want[1..2]);
    }

    #[test]
    fn with_the_history_off_nothing_is_kept_but_streams_still_get_events() {
        let events = Events::new(None, Arc::new(History::with_limit(0)), 0);
        assert!(!events.wanted(), "nobody would get an event");
        events.task_changes(&placed_task(1, &["GPU-a"]), &[TaskChange::Placed], 10);
        let mut live = events.subscribe();
        assert!(events.wanted());
        events.task_changes(&placed_task(2, &["GPU-a"]), &[TaskChange::Placed], 11);
        assert!(events.history().read(history::From::default(), |_| true).0.is_empty());
        let got = live.try_recv().unwrap();
        assert_eq!(got.event.map(|e| e.message), Some("placed on host h-1, GPU GPU-a".to_string()));
        assert!(got.id.is_some());
    }

    #[tokio::test]
    async fn a_full_webhook_queue_drops_the_oldest() {
        let w = Webhook::new("http://127.0.0.1:9/hook", [1; 32], None).unwrap();
        for i in 0..WEBHOOK_QUEUE as u64 + 3 {
            w.push(Event::new(EventType::HostHealth, i));
        }
        assert_eq!(w.queue.lock().unwrap().len(), WEBHOOK_QUEUE);
        assert_eq!(w.next().await.at_ms, 3);
        assert!(Webhook::new("https://example.com/hook", [1; 32], None).is_ok());
        assert!(Webhook::new("ftp://example.com/hook", [1; 32], None).is_err());
        assert!(Webhook::new("https://example.com/hook", [1; 32], Some(b"no".to_vec())).is_err());
        assert!(Webhook::new("not a url", [1; 32], None).is_err());
    }
}
