//! `GET /v1/events` as the client reads it: a server-sent event stream, one [`Event`] at a time.

use crate::{chain, Client, ClientError, Result};
use mpsfleet_types::event::Event;
use std::time::Duration;

/// The live stream of the cluster's events from one server.
pub struct EventStream {
    url: String,
    resp: reqwest::Response,
    buf: Vec<u8>,
}

/// One message of the stream.
#[derive(Debug)]
pub enum StreamItem {
    Event(Box<Event>),
    /// The server dropped this many events this reader was too slow for.
    Lagged(u64),
}

/// The most one message may be before the stream is refused as broken.
const MAX_MESSAGE: usize = 16 << 20;

/// Which events a reader asks for besides the live ones.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Only these types (every type when empty).
    pub types: Vec<String>,
    /// Replay the kept events at or after this time (ms since the Unix epoch) first.
    pub since_ms: Option<u64>,
    /// Stop after the replayed events (needs `since_ms`).
    pub no_follow: bool,
}

impl Client {
    /// Opens `GET /v1/events?types=…` (every type when `types` is empty): only the events
    /// from now on. The stream has no overall timeout: it lasts as long as the server keeps it.
    pub async fn events(&self, types: &[String]) -> Result<EventStream> {
        self.events_from(&EventQuery { types: types.to_vec(), ..EventQuery::default() }).await
    }

    /// Opens `GET /v1/events` as `q` asks: the kept past first when `since_ms` is given, then
    /// (unless `no_follow`) the events from now on.
    pub async fn events_from(&self, q: &EventQuery) -> Result<EventStream> {
        let http = self.http.read().unwrap_or_else(|p| p.into_inner()).clone();
        let url = format!("{}/v1/events", self.base());
        let mut req = http.get(&url).timeout(Duration::from_secs(u32::MAX.into()));
        if !q.types.is_empty() {
            req = req.query(&[("types", q.types.join(","))]);
        }
        if let Some(since) = q.since_ms {
            req = req.query(&[("since_ms", since)]);
        }
        if q.no_follow {
            req = req.query(&[("follow", "false")]);
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp =
            req.send().await.map_err(|e| ClientError::Transport { url: url.clone(), message: chain(&e) })?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.unwrap_or_default();
            return Err(crate::api_error(status, &bytes));
        }
        Ok(EventStream { url, resp, buf: Vec::new() })
    }
}

impl EventStream {
    /// Reads the server-sent events of `resp`, an answer from `url`.
    pub fn new(url: String, resp: reqwest::Response) -> EventStream {
        EventStream { url, resp, buf: Vec::new() }
    }

    /// The next event (keep-alive comments skipped); None when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<StreamItem>> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let message: Vec<u8> = self.buf.drain(..end + 2).collect();
                if let Some(item) = self.parse(&message)? {
                    return Ok(Some(item));
                }
                continue;
            }
            if self.buf.len() > MAX_MESSAGE {
                return Err(self.decode("a message of the stream is over 16 MiB"));
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => return Ok(None),
                Err(e) => return Err(ClientError::Transport { url: self.url.clone(), message: chain(&e) }),
            }
        }
    }

    fn parse(&self, message: &[u8]) -> Result<Option<StreamItem>> {
        let text = String::from_utf8_lossy(message);
        let (mut kind, mut data) = ("", String::new());
        for line in text.lines() {
            if let Some(k) = line.strip_prefix("event:") {
                kind = k.trim();
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        if data.is_empty() {
            return Ok(None); // a keep-alive comment
        }
        if kind == "lagged" {
            let v: serde_json::Value =
                serde_json::from_str(&data).map_err(|e| self.decode(&e.to_string()))?;
            return Ok(Some(StreamItem::Lagged(v["dropped"].as_u64().unwrap_or(0))));
        }
        let ev: Event = serde_json::from_str(&data).map_err(|e| self.decode(&e.to_string()))?;
        Ok(Some(StreamItem::Event(Box::new(ev))))
    }

    fn decode(&self, message: &str) -> ClientError {
        ClientError::Decode { url: self.url.clone(), message: message.to_string() }
    }
}
