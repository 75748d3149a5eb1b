//! What a token scoped to one pool may reach (`token create --pool P`), decided for each route
//! before its handler runs, and closed unless a route is named here.
//!
//! - Routes about one object (a pool, host, task, service or incident named in the path): open
//!   when the object is in the token's pool; one of another pool is answered 404, as one that
//!   does not exist is (by its handler), so that the token learns nothing of other pools.
//! - `POST /v1/tasks` and `POST /v1/services`: open when the body's `pool` is the token's.
//! - The lists (`GET /v1/pools`, `/v1/hosts`, `/v1/tasks`, `/v1/services`, `/v1/incidents`):
//!   open; their handlers keep only the token's pool ([`Principal::sees_pool`]).
//! - Reading task definitions, the public routes and the server's certificate: open, as they
//!   belong to no pool. Registering a task definition is not: a new revision of a family is
//!   what every pool's services of that family may run next.
//! - Everything else (the event stream, and whatever a later route adds): closed.
//!
//! The object a path names is checked twice: when the request is admitted (before its body
//! is read), and again by `AppState::call` under the cluster lock the operation itself runs
//! under, so an object deleted and made again in another pool in between is not acted on.
//!
//! The role is checked as for any token: a scoped operator still cannot do what an operator
//! cannot. Admin tokens are never scoped.

use crate::auth::Principal;
use crate::cluster::Cluster;
use crate::cluster::Error;
use crate::error::ApiError;

/// What a route touches, for a scoped token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Nothing of any pool.
    NoPool,
    /// The object its path names: of this kind, by this path parameter.
    Object(Kind, &'static str),
    /// What the body's `pool` says.
    BodyPool,
    /// A list its handler filters.
    List,
    /// Not open to scoped tokens.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Pool,
    Host,
    Task,
    Service,
    Incident,
}

/// What `method route` reaches.
pub(crate) fn reach(method: &axum::http::Method, route: &str) -> Reach {
    use axum::http::Method;
    let under = |prefix: &str| route == prefix || route.starts_with(&format!("{prefix}/"));
    match route {
        "/v1/taskdefs" | "/v1/taskdefs/{reference}" if method == Method::GET => Reach::NoPool,
        "/v1/healthz" | "/v1/openapi.json" | "/v1/cluster/ca" | "/v1/cluster/certificate" => Reach::NoPool,
        "/v1/tasks" | "/v1/services" if method == Method::POST => Reach::BodyPool,
        "/v1/pools" | "/v1/hosts" | "/v1/tasks" | "/v1/services" | "/v1/incidents"
            if method == Method::GET =>
        {
            Reach::List
        }
        _ if under("/v1/pools/{name}") => Reach::Object(Kind::Pool, "name"),
        _ if under("/v1/hosts/{id}") => Reach::Object(Kind::Host, "id"),
        _ if under("/v1/tasks/{id}") => Reach::Object(Kind::Task, "id"),
        _ if under("/v1/services/{name}") => Reach::Object(Kind::Service, "name"),
        _ if under("/v1/incidents/{id}") => Reach::Object(Kind::Incident, "id"),
        _ => Reach::Closed,
    }
}

impl Kind {
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Kind::Pool => "pool",
            Kind::Host => "host",
            Kind::Task => "task",
            Kind::Service => "service",
            Kind::Incident => "incident",
        }
    }
}

impl Cluster {
    /// The pool of the object of `kind` named `id`; None when there is none.
    pub(crate) fn pool_of(&self, kind: Kind, id: &str) -> Option<String> {
        match kind {
            Kind::Pool => self.pool(id).ok().map(|p| p.name.to_string()),
            Kind::Host => self.host(id).ok().map(|h| h.pool.to_string()),
            Kind::Task => self.task(id).ok().map(|t| t.pool.to_string()),
            Kind::Service => self.service(id).ok().map(|s| s.service.pool.to_string()),
            Kind::Incident => self.incident(id).ok().map(|i| i.pool.to_string()),
        }
    }
}

/// The refusal of a scoped token's call outside its pool.
pub(crate) fn outside(who: &Principal, what: &str) -> Error {
    Error::Forbidden(format!("{what} is outside the pool of {}", who.describe()))
}

/// Whether a scoped token may make a call with this body: its `pool` must be the token's.
pub(crate) fn check_body(who: &Principal, body: &[u8]) -> Result<(), ApiError> {
    let Some(scope) = who.scope() else { return Ok(()) };
    let pool = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("pool").and_then(|p| p.as_str()).map(str::to_string));
    match pool {
        Some(p) if p == scope => Ok(()),
        Some(p) => Err(outside(who, &format!("pool {p:?}")).into()),
        None => Err(ApiError::from(Error::Forbidden(format!(
            "{} names its pool in the body (\"pool\": \"{scope}\")",
            who.describe()
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn routes_reach_what_their_paths_and_bodies_say_and_anything_else_is_closed() {
        assert_eq!(reach(&Method::GET, "/v1/hosts/{id}"), Reach::Object(Kind::Host, "id"));
        assert_eq!(reach(&Method::POST, "/v1/hosts/{id}/drain"), Reach::Object(Kind::Host, "id"));
        assert_eq!(reach(&Method::GET, "/v1/tasks/{id}/logs"), Reach::Object(Kind::Task, "id"));
        assert_eq!(reach(&Method::PATCH, "/v1/services/{name}"), Reach::Object(Kind::Service, "name"));
        assert_eq!(reach(&Method::GET, "/v1/pools/{name}/explain"), Reach::Object(Kind::Pool, "name"));
        assert_eq!(reach(&Method::POST, "/v1/tasks"), Reach::BodyPool);
        assert_eq!(reach(&Method::GET, "/v1/tasks"), Reach::List);
        assert_eq!(reach(&Method::GET, "/v1/taskdefs/{reference}"), Reach::NoPool);
        for closed in
            ["/v1/events", "/v1/secrets", "/v1/tokens", "/v1/audit", "/v1/cluster/ca/rotation", "/v1/new"]
        {
            assert_eq!(reach(&Method::GET, closed), Reach::Closed, "{closed}");
        }
        assert_eq!(reach(&Method::POST, "/v1/pools"), Reach::Closed);
        assert_eq!(reach(&Method::POST, "/v1/taskdefs"), Reach::Closed, "a revision reaches every pool");
    }

    #[test]
    fn a_body_names_the_tokens_pool_or_is_refused() {
        let who = Principal::Token {
            id: "t".into(),
            role: mpsfleet_types::access::Role::Operator,
            pool: Some("a".into()),
        };
        assert!(check_body(&who, br#"{"pool": "a", "count": 1}"#).is_ok());
        assert!(check_body(&who, br#"{"pool": "b"}"#).is_err());
        assert!(check_body(&who, br#"{"count": 1}"#).is_err());
        assert!(check_body(&who, b"not json").is_err());
        assert!(check_body(&Principal::Admin, br#"{"pool": "b"}"#).is_ok());
    }
}
