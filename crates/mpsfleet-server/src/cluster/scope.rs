//! What a token scoped to one pool may reach (`token create --pool P`), checked for each
//! operation against the objects it touches, on the state the operation acts on.
//! The operations are `Cluster`'s, in `access.rs`; what they share is here.
//!
//! Every call into the cluster names what it touches ([`Touch`]), and [`Cluster::admit`]
//! checks it under the same lock the operation then runs under, so an object deleted and made
//! again in another pool in between is never acted on. Nothing depends on a route: an API
//! that puts every operation on one route (as ECS's does) names its operations' objects
//! the same way.
//!
//! - One object (a pool, host, task, service, incident or drill): open when it is in the token's
//!   pool. One of another pool is answered as not found, as one that does not exist is, so
//!   that the token learns nothing of other pools.
//! - A new object in a pool (a task run, a service): open when that pool is the token's.
//! - A list: open; the operation keeps only the token's pool ([`Principal::sees_pool`]).
//! - Nothing of any pool (reading task definitions, the server's certificate): open.
//! - Beyond one pool (tokens, secrets, the audit log, the event stream, new pools, a task
//!   definition's next revision, which every pool's services of its family may run): closed.
//!
//! The role is checked as for any token: a scoped operator still cannot do what an operator
//! cannot. Admin tokens are never scoped.

use super::Error;
use crate::auth::Principal;

/// What one operation touches, for a scoped token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touch {
    /// Nothing of any pool.
    NoPool,
    /// One object, by its kind and id (or name).
    Object(Kind, String),
    /// A new object in this pool.
    NewIn(String),
    /// A list the operation filters to the caller's pool.
    List,
    /// More than one pool: closed to scoped tokens.
    Cluster,
}

/// The kinds of object that belong to a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pool,
    Host,
    Task,
    Service,
    Incident,
    Drill,
}

impl Kind {
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Pool => "pool",
            Kind::Host => "host",
            Kind::Task => "task",
            Kind::Service => "service",
            Kind::Incident => "incident",
            Kind::Drill => "drill",
        }
    }
}

/// The refusal of a scoped token's call outside its pool.
pub fn outside(who: &Principal, what: &str) -> Error {
    Error::Forbidden(format!("{what} is outside the pool of {}", who.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::recovery_tests::World;
    use mpsfleet_types::access::Role;
    use mpsfleet_types::{CreatePool, OwnershipMode};

    fn scoped(pool: &str) -> Principal {
        Principal::Token { id: "t".into(), role: Role::Operator, pool: Some(pool.into()) }
    }

    /// The check reads the state it is made on: a pool deleted and made again elsewhere, or a
    /// host of another pool, is refused as absent; new objects go only into the token's pool;
    /// what reaches beyond one pool is closed; an unscoped caller passes everywhere.
    #[test]
    fn each_operation_is_checked_against_the_objects_it_touches() {
        let mut w = World::new(OwnershipMode::SelfManaged);
        w.c.create_pool(CreatePool { name: "q".into(), ..Default::default() }).unwrap();
        let join = w.join_token.clone();
        let host = w.join("h", &join).unwrap().to_string();
        let (a, b) = (scoped("p"), scoped("q"));
        let on_host = Touch::Object(Kind::Host, host.clone());
        assert!(w.c.read().admit(&a, &on_host).is_ok());
        let e = w.c.read().admit(&b, &on_host).unwrap_err();
        assert!(matches!(e, Error::NotFound { kind: "host", .. }), "{e:?}");
        // An object that does not exist is left to the operation, which says so.
        assert!(w.c.read().admit(&b, &Touch::Object(Kind::Task, "t-0000000000000001".into())).is_ok());
        assert!(w.c.read().admit(&a, &Touch::NewIn("p".into())).is_ok());
        assert!(matches!(w.c.read().admit(&a, &Touch::NewIn("q".into())), Err(Error::Forbidden(_))));
        assert!(matches!(w.c.read().admit(&a, &Touch::Cluster), Err(Error::Forbidden(_))));
        assert!(w.c.read().admit(&a, &Touch::List).is_ok() && w.c.read().admit(&a, &Touch::NoPool).is_ok());
        for t in [on_host, Touch::NewIn("q".into()), Touch::Cluster] {
            assert!(w.c.read().admit(&Principal::Admin, &t).is_ok());
        }
    }
}
