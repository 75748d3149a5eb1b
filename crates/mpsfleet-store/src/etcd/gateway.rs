//! A small client for etcd v3's JSON gateway (`/v3/kv/range`, `/v3/kv/txn`, `/v3/lease/*`, ...),
//! the HTTP face every etcd member serves on its client URL next to gRPC.
//!
//! Only what the store and the election use is here. Keys and values travel base64-encoded and
//! 64-bit numbers as strings, as the gateway's JSON mapping of the protobuf messages has it.
//!
//! Errors say whether the request can have taken effect: [`GatewayError::NotSent`] when no member
//! could be reached (nothing was applied, retrying is safe), [`GatewayError::Refused`] when etcd
//! answered with an error (nothing was applied), [`GatewayError::Unknown`] when the request was
//! sent and no answer came (it may or may not have been applied).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

/// How to reach etcd.
#[derive(Debug, Clone, Default)]
pub struct EtcdConfig {
    /// Client URLs of the members, `http://HOST:PORT` or `https://HOST:PORT`.
    pub endpoints: Vec<String>,
    /// Every key this cluster writes starts with this prefix (default `/mpsfleet`).
    pub prefix: String,
    /// The CA (PEM) that etcd's server certificates are verified against, for `https://` endpoints.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate and key (PEM, concatenated) for etcd's `--client-cert-auth`.
    pub identity_pem: Option<Vec<u8>>,
    /// How long one request may take before its outcome counts as unknown.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// Endpoints from a comma-separated list, with the default prefix and timeout.
    pub fn new(endpoints: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints
                .split(',')
                .map(|e| e.trim().trim_end_matches('/').to_owned())
                .filter(|e| !e.is_empty())
                .collect(),
            prefix: "/mpsfleet".to_owned(),
            ca_pem: None,
            identity_pem: None,
            request_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    #[error("no etcd member could be reached: {0}")]
    NotSent(String),
    #[error("etcd refused the request: {0}")]
    Refused(String),
    #[error("etcd did not answer (the request may or may not have been applied): {0}")]
    Unknown(String),
}

/// One key-value pair as etcd returns it.
#[derive(Debug, Clone)]
pub(crate) struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub lease: i64,
}

/// A range read's answer.
pub(crate) struct RangeAnswer {
    pub kvs: Vec<Kv>,
    pub more: bool,
}

/// A transaction's answer.
pub(crate) struct TxnAnswer {
    pub succeeded: bool,
    /// The etcd revision after the transaction.
    pub revision: i64,
    /// The key-values of each range op of the branch that ran, in order.
    pub ranges: Vec<Vec<Kv>>,
}

/// A condition of a transaction.
#[derive(Clone, Copy)]
pub(crate) enum Compare<'a> {
    /// The key's create revision equals this (0: the key does not exist).
    CreateRevision(&'a str, i64),
    /// The key exists with exactly this value.
    Value(&'a str, &'a [u8]),
}

/// One operation of a transaction branch.
pub(crate) enum TxnOp<'a> {
    Put {
        key: &'a str,
        value: &'a [u8],
        lease: i64,
    },
    /// Deletes `[key, range_end)`; `range_end` `None` deletes the one key.
    Delete {
        key: &'a str,
        range_end: Option<&'a str>,
    },
    Get {
        key: &'a str,
    },
    /// Reads `[key, range_end)`, at most `limit` keys.
    Range {
        key: &'a str,
        range_end: &'a str,
        limit: i64,
    },
}

pub(crate) struct Gateway {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// The endpoint that answered last; requests start there.
    current: AtomicUsize,
}

impl Gateway {
    pub(crate) fn new(config: &EtcdConfig) -> Result<Gateway, String> {
        if config.endpoints.is_empty() {
            return Err("no etcd endpoint given (--etcd-endpoints URL[,URL...])".to_owned());
        }
        for e in &config.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(format!("etcd endpoint {e:?} must start with http:// or https://"));
            }
        }
        let mut b = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(Duration::from_secs(1))
            .pool_max_idle_per_host(16)
            .tcp_nodelay(true);
        if let Some(ca) = &config.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(ca).map_err(|e| format!("etcd CA: {e}"))? {
                b = b.add_root_certificate(cert);
            }
        }
        if let Some(id) = &config.identity_pem {
            b = b.identity(
                reqwest::Identity::from_pem(id).map_err(|e| format!("etcd client certificate: {e}"))?,
            );
        }
        let http = b.build().map_err(|e| format!("etcd client: {e}"))?;
        Ok(Gateway { http, endpoints: config.endpoints.clone(), current: AtomicUsize::new(0) })
    }

    pub(crate) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// POSTs `body` to `path` on the current endpoint, moving on to the next one when a member
    /// cannot be reached (so the request was not sent), or, for a read, when one did not answer
    /// (a member restarting and not serving yet: asking another changes nothing).
    pub(crate) async fn call(&self, path: &str, body: &Value) -> Result<Value, GatewayError> {
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        let read = is_read(path, body);
        let mut unreachable = Vec::new();
        for i in 0..n {
            let at = (start + i) % n;
            match self.call_at(at, path, body).await {
                Err(GatewayError::NotSent(why)) => unreachable.push(format!("{}: {why}", self.endpoints[at])),
                Err(GatewayError::Unknown(why)) if read && i + 1 < n => {
                    unreachable.push(format!("{}: {why}", self.endpoints[at]))
                }
                other => {
                    self.current.store(at, Ordering::Relaxed);
                    return other;
                }
            }
        }
        Err(GatewayError::NotSent(unreachable.join("; ")))
    }

    /// [`Gateway::call`] on one endpoint only.
    pub(crate) async fn call_at(&self, at: usize, path: &str, body: &Value) -> Result<Value, GatewayError> {
        let url = format!("{}{path}", self.endpoints[at]);
        let resp = match self.http.post(&url).json(body).send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Err(GatewayError::NotSent(e.to_string())),
            Err(e) => return Err(GatewayError::Unknown(e.to_string())),
        };
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| GatewayError::Unknown(e.to_string()))?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| GatewayError::Unknown(format!("{path}: unreadable answer ({status}): {e}")))?;
        if !status.is_success() || v.get("error").is_some() {
            let msg =
                v.get("error").and_then(Value::as_str).or_else(|| v.get("message").and_then(Value::as_str));
            let msg = msg.unwrap_or("no message").to_owned();
            // etcd answers a request it could not finish in time (no quorum, leader change)
            // with an error, but the proposal may still be applied later.
            if msg.contains("timed out") || msg.contains("leader changed") || msg.contains("no leader") {
                return Err(GatewayError::Unknown(msg));
            }
            return Err(GatewayError::Refused(msg));
        }
        Ok(v)
    }

    /// Reads `[key, range_end)` (just `key` without an end), at most `limit` keys (0: all), as
    /// of etcd revision `revision` (0: the latest).
    pub(crate) async fn range(
        &self,
        key: String,
        range_end: Option<String>,
        limit: i64,
        revision: i64,
    ) -> Result<RangeAnswer, GatewayError> {
        let mut body = json!({ "key": b64(key.as_bytes()), "limit": limit.to_string() });
        if let Some(end) = range_end {
            body["range_end"] = json!(b64(end.as_bytes()));
        }
        if revision > 0 {
            body["revision"] = json!(revision.to_string());
        }
        let v = self.call("/v3/kv/range", &body).await?;
        Ok(RangeAnswer { kvs: kvs(&v)?, more: v.get("more").and_then(Value::as_bool).unwrap_or(false) })
    }

    /// Sends a transaction built by [`txn_body`].
    pub(crate) async fn txn(&self, body: Value) -> Result<TxnAnswer, GatewayError> {
        let v = self.call("/v3/kv/txn", &body).await?;
        let succeeded = v.get("succeeded").and_then(Value::as_bool).unwrap_or(false);
        let mut ranges = Vec::new();
        for r in v.get("responses").and_then(Value::as_array).into_iter().flatten() {
            if let Some(rr) = r.get("response_range") {
                ranges.push(kvs(rr)?);
            }
        }
        Ok(TxnAnswer { succeeded, revision: header_revision(&v), ranges })
    }

    pub(crate) async fn lease_grant(&self, ttl_s: i64) -> Result<(i64, i64), GatewayError> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl_s.to_string() })).await?;
        Ok((num(v.get("ID")), num(v.get("TTL"))))
    }

    /// Renews a lease; the TTL left, 0 when the lease is gone.
    pub(crate) async fn lease_keepalive(&self, id: i64) -> Result<i64, GatewayError> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() })).await?;
        Ok(num(v.get("result").and_then(|r| r.get("TTL"))))
    }

    pub(crate) async fn lease_revoke(&self, id: i64) -> Result<(), GatewayError> {
        self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() })).await.map(|_| ())
    }

    /// Drops etcd's history of key versions before `revision` (MVCC compaction).
    pub(crate) async fn compact_history(&self, revision: i64) -> Result<(), GatewayError> {
        match self.call("/v3/kv/compaction", &json!({ "revision": revision.to_string() })).await {
            Err(GatewayError::Refused(m)) if m.contains("compacted") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    pub(crate) async fn member_list(&self) -> Result<Value, GatewayError> {
        self.call("/v3/cluster/member/list", &json!({})).await
    }

    /// The status of the member at endpoint `at`: its version, database size, raft leader.
    pub(crate) async fn status_at(&self, at: usize) -> Result<Value, GatewayError> {
        self.call_at(at, "/v3/maintenance/status", &json!({})).await
    }
}

/// A transaction: if every `compare` holds, `success` runs, else `failure`.
pub(crate) fn txn_body(compare: &[Compare<'_>], success: &[TxnOp<'_>], failure: &[TxnOp<'_>]) -> Value {
    let compare: Vec<Value> = compare
        .iter()
        .map(|c| match c {
            Compare::CreateRevision(k, r) => {
                json!({ "key": b64(k.as_bytes()), "target": "CREATE", "create_revision": r.to_string() })
            }
            Compare::Value(k, v) => json!({ "key": b64(k.as_bytes()), "target": "VALUE", "value": b64(v) }),
        })
        .collect();
    json!({ "compare": compare, "success": ops(success), "failure": ops(failure) })
}

/// Whether a request only reads: a range, the member list, or a transaction whose branches
/// only read.
fn is_read(path: &str, body: &Value) -> bool {
    match path {
        "/v3/kv/range" | "/v3/cluster/member/list" | "/v3/maintenance/status" => true,
        "/v3/kv/txn" => ["success", "failure"].iter().all(|branch| {
            body.get(*branch)
                .and_then(Value::as_array)
                .is_none_or(|ops| ops.iter().all(|op| op.get("request_range").is_some()))
        }),
        _ => false,
    }
}

fn ops(list: &[TxnOp<'_>]) -> Vec<Value> {
    list.iter()
        .map(|op| match op {
            TxnOp::Put { key, value, lease } => {
                let mut put = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
                if *lease != 0 {
                    put["lease"] = json!(lease.to_string());
                }
                json!({ "request_put": put })
            }
            TxnOp::Delete { key, range_end } => {
                let mut del = json!({ "key": b64(key.as_bytes()) });
                if let Some(end) = range_end {
                    del["range_end"] = json!(b64(end.as_bytes()));
                }
                json!({ "request_delete_range": del })
            }
            TxnOp::Get { key } => json!({ "request_range": { "key": b64(key.as_bytes()) } }),
            TxnOp::Range { key, range_end, limit } => json!({ "request_range": {
                "key": b64(key.as_bytes()), "range_end": b64(range_end.as_bytes()), "limit": limit.to_string()
            } }),
        })
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// A 64-bit number the gateway sent as a string (or, rarely, a number); 0 when absent.
pub(crate) fn num(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn header_revision(v: &Value) -> i64 {
    num(v.get("header").and_then(|h| h.get("revision")))
}

fn kvs(v: &Value) -> Result<Vec<Kv>, GatewayError> {
    let mut out = Vec::new();
    for kv in v.get("kvs").and_then(Value::as_array).into_iter().flatten() {
        let field = |name: &str| -> Result<Vec<u8>, GatewayError> {
            match kv.get(name).and_then(Value::as_str) {
                None => Ok(Vec::new()),
                Some(s) => {
                    B64.decode(s).map_err(|e| GatewayError::Unknown(format!("etcd sent a bad {name}: {e}")))
                }
            }
        };
        let key = String::from_utf8(field("key")?)
            .map_err(|_| GatewayError::Unknown("etcd sent a key that is not UTF-8".to_owned()))?;
        out.push(Kv {
            key,
            value: field("value")?,
            create_revision: num(kv.get("create_revision")),
            lease: num(kv.get("lease")),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_that_write_nothing_count_as_reads() {
        let get = [TxnOp::Get { key: "k" }];
        let put = [TxnOp::Put { key: "k", value: b"v", lease: 0 }];
        assert!(is_read("/v3/kv/range", &json!({})));
        assert!(is_read("/v3/kv/txn", &txn_body(&[], &get, &get)));
        assert!(!is_read("/v3/kv/txn", &txn_body(&[], &get, &put)), "a write in either branch");
        assert!(!is_read("/v3/kv/txn", &txn_body(&[], &put, &[])));
        assert!(!is_read("/v3/lease/grant", &json!({})));
    }
}
