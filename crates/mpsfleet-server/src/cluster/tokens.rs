//! API tokens with roles (`token create|list|revoke`): made by an admin for people and tools,
//! stored as their SHA-256 digest only, optionally expiring. The bootstrap admin token of the
//! data dir stays an admin token.
//! The operations are `Cluster`'s, in `access.rs`; what they share is here.
//!
//! Join tokens (`join-token create|list|revoke`) register hosts. They always expire (a day
//! unless told otherwise, the first start's one too) and rotate by making a new one and
//! revoking the old; stored as digests, like API tokens.

use super::sealed::Sealed;
use super::*;
use mpsfleet_types::access::{CreateJoinToken, JoinTokenView, TokenView, DEFAULT_JOIN_TOKEN_LIFETIME_S};

/// Store kind of API tokens, keyed by token id.
pub(super) const API_TOKEN: &str = "token";
/// The most API tokens a cluster keeps.
pub const MAX_API_TOKENS: usize = 1000;
/// The longest a token's description may be.
pub const MAX_TOKEN_DESCRIPTION: usize = 256;
/// The longest lifetime a token may be given: ten years.
pub const MAX_TOKEN_LIFETIME_S: u64 = 10 * 365 * 86_400;

/// Store kind of join tokens, keyed by token id.
pub(super) const JOIN_TOKEN: &str = "join-token";
/// The most join tokens a cluster keeps.
pub const MAX_JOIN_TOKENS: usize = 100;

/// A stored join token: its record and the digest it is recognised by.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JoinTokenRecord {
    #[serde(flatten)]
    pub view: JoinTokenView,
    pub sha256: String,
}

/// The bootstrap admin token's digest: the one copy of it, readable without the cluster lock,
/// replaced by [`Cluster::rotate_admin_token`].
#[derive(Clone, Default)]
pub struct AdminDigest(Arc<std::sync::RwLock<String>>);

impl AdminDigest {
    pub(super) fn new(digest: String) -> Self {
        AdminDigest(Arc::new(std::sync::RwLock::new(digest)))
    }

    /// Whether `digest` is the admin token's.
    pub fn is(&self, digest: &str) -> bool {
        let admin = self.0.read().unwrap_or_else(|p| p.into_inner());
        !admin.is_empty() && *admin == digest
    }

    pub(super) fn digest(&self) -> String {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set(&self, digest: String) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = digest;
    }
}

/// The join tokens by digest: the one copy of them, readable without the cluster lock
/// (registrations are authenticated while a group commit holds it through its fsync).
#[derive(Clone)]
pub struct JoinDigests {
    pub(super) by_digest: Arc<std::sync::RwLock<HashMap<String, JoinTokenRecord>>>,
    pub(super) clock: Arc<dyn Clock>,
}

impl JoinDigests {
    pub(super) fn new(clock: Arc<dyn Clock>) -> Self {
        JoinDigests { by_digest: Arc::default(), clock }
    }

    pub(super) fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, JoinTokenRecord>> {
        self.by_digest.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn insert(&self, rec: JoinTokenRecord) {
        self.by_digest.write().unwrap_or_else(|p| p.into_inner()).insert(rec.sha256.clone(), rec);
    }

    pub(super) fn remove(&self, digest: &str) -> Option<JoinTokenRecord> {
        self.by_digest.write().unwrap_or_else(|p| p.into_inner()).remove(digest)
    }

    /// `None` when `digest` is no join token's; else whether it is valid now, or why not.
    pub fn check(&self, digest: &str) -> Option<Result<(), Error>> {
        let at = self.map().get(digest)?.view.expires_at_ms;
        Some(if self.clock.now_ms() >= at {
            Err(Error::Unauthorized(
                "this join token has expired: make a new one with `mpsfleet join-token create`",
            ))
        } else {
            Ok(())
        })
    }
}

/// Checks a token's description and lifetime as `token create` and `join-token create` take
/// them.
pub(super) fn check_token_request(description: &str, expires_in_s: Option<u64>) -> Result<(), Error> {
    if description.chars().count() > MAX_TOKEN_DESCRIPTION || description.chars().any(char::is_control) {
        return Err(Error::invalid(
            "description",
            format!("must be at most {MAX_TOKEN_DESCRIPTION} printable characters"),
        ));
    }
    match expires_in_s {
        Some(s) if s == 0 || s > MAX_TOKEN_LIFETIME_S => Err(Error::invalid(
            "expiresInS",
            format!("must be from 1 to {MAX_TOKEN_LIFETIME_S} seconds, got {s}"),
        )),
        _ => Ok(()),
    }
}

/// A new token id with `prefix`.
pub(super) fn token_id(prefix: &str) -> Result<String, Error> {
    Ok(format!("{prefix}{:012x}", auth::random_u64()? >> 16))
}

/// A stored API token: its record and the digest it is recognised by.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TokenRecord {
    #[serde(flatten)]
    pub view: TokenView,
    pub sha256: String,
    /// The token sealed under the server's key, for an AWS access key (`token create --aws`):
    /// SigV4 needs the secret itself to check a signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_secret: Option<Sealed>,
}

/// An AWS access key as the ECS-compatible API checks a signature with it.
#[derive(Clone)]
pub struct AwsKey {
    pub who: Principal,
    /// The secret access key: the token itself.
    pub secret: String,
    /// The token's digest, which the call then runs as.
    pub digest: String,
    /// The server's clock, for the signature's age.
    pub now_ms: u64,
    /// Whether this copy still holds later, without the cluster lock.
    pub valid: KeyValidity,
}

/// Whether a copy of an [`AwsKey`] taken earlier still holds: no API token changed since, and
/// its token has not expired. The call it signs is authenticated again under the lock.
#[derive(Clone)]
pub struct KeyValidity {
    credentials: std::sync::Arc<std::sync::atomic::AtomicU64>,
    generation: u64,
    expires_at_ms: Option<u64>,
    clock: std::sync::Arc<dyn mpsfleet_core::clock::Clock>,
}

impl KeyValidity {
    pub(super) fn new(
        credentials: &std::sync::Arc<std::sync::atomic::AtomicU64>,
        expires_at_ms: Option<u64>,
        clock: std::sync::Arc<dyn mpsfleet_core::clock::Clock>,
    ) -> Self {
        let generation = credentials.load(std::sync::atomic::Ordering::Acquire);
        KeyValidity { credentials: credentials.clone(), generation, expires_at_ms, clock }
    }

    /// The server's clock now, when the copy still holds.
    pub fn now_ms(&self) -> Option<u64> {
        let now = self.clock.now_ms();
        let same = self.credentials.load(std::sync::atomic::Ordering::Acquire) == self.generation;
        (same && self.expires_at_ms.is_none_or(|at| now < at)).then_some(now)
    }
}

/// What the secret access keys of AWS access keys are sealed for.
pub(super) const AWS_KEY_PURPOSE: &str = "aws-access-keys";

/// A new AWS access key id: `AKMF` and 16 letters or digits, 20 characters as AWS's are.
pub(super) fn access_key_id() -> Result<String, Error> {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::StoreUnavailable(format!("no randomness for a key: {e}")))?;
    Ok(format!("AKMF{}", bytes.iter().map(|b| ALPHABET[usize::from(b & 31)] as char).collect::<String>()))
}

/// The credentials that are not records: the key agent and launch tokens are derived under,
/// and the launch tokens of the hosts being launched for capacity. The stored ones (the
/// bootstrap admin token's digest, join and API tokens, each host's credential, the
/// replacement tokens of incidents) are `State`'s.
pub(super) struct Credentials {
    /// Agent and launch tokens are derived under it.
    pub(super) key: auth::ServerKey,
    /// Digests of the launch tokens of the hosts being launched for capacity.
    pub(super) launch_tokens: HashMap<String, (PoolName, String)>,
    /// The conformance suite's public key, while `--ecs-conformance` is on; never stored.
    pub(super) conformance: Option<ConformanceKey>,
}

/// The `parent` of a token made from the bootstrap admin token.
pub(super) const ADMIN_PARENT: &str = "admin";

/// What a stored token made for `--ecs-conformance` by an older server says made it.
pub(super) const CONFORMANCE_CREATOR: &str = "--ecs-conformance";

/// The conformance suite's fixed access key (`--ecs-conformance`), held in memory only.
pub(super) struct ConformanceKey {
    pub(super) access_key_id: String,
    pub(super) secret: String,
    pub(super) digest: String,
}

pub(super) fn new_join_index(clock: Arc<dyn Clock>) -> JoinDigests {
    JoinDigests::new(clock)
}

/// The record of a new join token (its digest `sha256`), for `join-token create` and the
/// first start.
pub(super) fn join_token_record(
    now: u64,
    sha256: String,
    req: &CreateJoinToken,
    by: &str,
) -> Result<JoinTokenRecord, Error> {
    check_token_request(&req.description, req.expires_in_s)?;
    let lifetime_ms = req.expires_in_s.unwrap_or(DEFAULT_JOIN_TOKEN_LIFETIME_S).saturating_mul(1000);
    let view = JoinTokenView {
        id: token_id("join-")?,
        description: req.description.clone(),
        created_at_ms: now,
        expires_at_ms: now.saturating_add(lifetime_ms),
        created_by: by.to_string(),
    };
    Ok(JoinTokenRecord { view, sha256 })
}

impl Credentials {
    /// The conformance key's principal, if `digest` is its secret's.
    pub(in crate::cluster) fn conformance_principal(&self, digest: &str) -> Option<Principal> {
        let key = self.conformance.as_ref().filter(|k| k.digest == digest)?;
        Some(Principal::Token {
            id: key.access_key_id.clone(),
            role: mpsfleet_types::access::Role::Admin,
            pool: None,
        })
    }
}

impl Credentials {
    pub(in crate::cluster) fn mint_launch_token(&mut self, pool: &PoolName, name: &str) -> RegistrationToken {
        let token = self.key.derive("mpsf_launch_", "launch", &[pool.as_str(), name]);
        self.launch_tokens.insert(auth::digest(&token), (pool.clone(), name.to_string()));
        RegistrationToken(token)
    }

    /// The bearer the server presents to a host's agent: derived from the host id under the
    /// server's key, so that it is stored nowhere on the server. A host registered by an older
    /// server keeps the token that server stored (`legacy`).
    pub(in crate::cluster) fn agent_token(&self, host: &HostId, legacy: &str) -> String {
        if legacy.is_empty() {
            self.key.derive("mpsf_agent_", "agent", &[host.as_str()])
        } else {
            legacy.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_core::clock::ManualClock;
    use mpsfleet_types::access::*;

    #[test]
    fn tokens_carry_their_role_expire_and_are_revoked() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        let req = |role, expires_in_s| CreateToken {
            role,
            expires_in_s,
            description: "ci".into(),
            pool: None,
            aws: false,
        };
        let viewer = c.create_api_token(req(Role::Viewer, Some(60)), "admin").unwrap();
        assert!(viewer.token.starts_with("mpsf_view_"));
        assert_eq!(
            c.authenticate(&viewer.token).unwrap(),
            Principal::Token { id: viewer.view.id.clone(), role: Role::Viewer, pool: None }
        );
        let op = c.create_api_token(req(Role::Operator, None), "admin").unwrap();
        assert_eq!(c.read().api_tokens().len(), 2);
        // The store holds digests only, and a restarted server knows the tokens again.
        let stored = format!("{:?}", store.list(API_TOKEN).unwrap());
        assert!(!stored.contains(&op.token) && !stored.contains(&viewer.token));
        let mut c = Cluster::load(store, clock.clone(), |_| Ok(())).unwrap();
        assert_eq!(
            c.authenticate(&op.token).unwrap(),
            Principal::Token { id: op.view.id.clone(), role: Role::Operator, pool: None }
        );
        clock.advance(std::time::Duration::from_secs(61));
        assert_eq!(c.authenticate(&viewer.token).unwrap_err().to_string(), "this token has expired");
        c.revoke_api_token(&op.view.id, "admin").unwrap();
        assert_eq!(c.authenticate(&op.token).unwrap_err().to_string(), "unknown token");
        assert!(c.revoke_api_token(&op.view.id, "admin").is_err());
        let e = c.create_api_token(req(Role::Admin, Some(0)), "admin").unwrap_err().to_string();
        assert!(e.contains("expiresInS: must be from 1"), "{e}");
    }

    #[test]
    fn join_tokens_expire_after_a_day_unless_told_and_are_revoked() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut first = None;
        let mut c = Cluster::load(store.clone(), clock.clone(), |t| {
            first = Some(t.join_token.clone());
            Ok(())
        })
        .unwrap();
        let first = first.unwrap();
        assert_eq!(c.authenticate(&first).unwrap(), Principal::Joiner);
        let listed = c.read().join_tokens();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].expires_at_ms, 1_000_000 + DEFAULT_JOIN_TOKEN_LIFETIME_S * 1000);
        assert_eq!(listed[0].created_by, "first start");
        let hour = c
            .create_join_token(
                CreateJoinToken { expires_in_s: Some(3600), description: "rack 7".into() },
                "admin",
            )
            .unwrap();
        assert!(hour.token.starts_with("mpsf_join_"));
        let stored = format!("{:?}", store.list(JOIN_TOKEN).unwrap());
        assert!(!stored.contains(&hour.token) && !stored.contains(&first));
        // A restarted server knows both; an hour on, the new one has expired and says how to
        // get another; a day on, the first one too.
        let mut c = Cluster::load(store, clock.clone(), |_| Ok(())).unwrap();
        assert_eq!(c.authenticate(&hour.token).unwrap(), Principal::Joiner);
        clock.advance(std::time::Duration::from_secs(3600));
        let e = c.authenticate(&hour.token).unwrap_err().to_string();
        assert!(e.contains("expired") && e.contains("mpsfleet join-token create"), "{e}");
        assert_eq!(c.authenticate(&first).unwrap(), Principal::Joiner);
        clock.advance(std::time::Duration::from_secs(DEFAULT_JOIN_TOKEN_LIFETIME_S));
        assert!(c.authenticate(&first).is_err());
        // Rotation: a new one, and the old ones revoked.
        let next = c.create_join_token(CreateJoinToken::default(), "admin").unwrap();
        for old in c.read().join_tokens().into_iter().filter(|t| t.id != next.view.id) {
            c.revoke_join_token(&old.id, "admin").unwrap();
        }
        assert_eq!(c.read().join_tokens().len(), 1);
        assert_eq!(c.authenticate(&next.token).unwrap(), Principal::Joiner);
        assert_eq!(c.authenticate(&first).unwrap_err().to_string(), "unknown token");
        let e = c
            .create_join_token(CreateJoinToken { expires_in_s: Some(0), ..Default::default() }, "admin")
            .unwrap_err();
        assert!(e.to_string().contains("expiresInS"), "{e}");
    }

    fn token(c: &mut Cluster, role: Role, expires_in_s: Option<u64>) -> CreatedToken {
        let req = CreateToken { role, expires_in_s, description: "t".into(), pool: None, aws: false };
        c.create_api_token(req, "admin").unwrap()
    }

    /// A console session made from `parent`'s principal through a one-time link.
    fn session(c: &mut Cluster, parent: &str) -> Result<String, Error> {
        let who = c.authenticate(parent)?;
        let link = c.create_console_link(&who, "t".into(), None)?;
        Ok(c.open_console_session(&link.code)?.token)
    }

    #[test]
    fn a_console_session_expires_and_is_revoked_with_the_token_it_came_from() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store, clock.clone(), |_| Ok(())).unwrap();
        // From a 4-second token: the session and the session made from it end with it.
        let short = token(&mut c, Role::Viewer, Some(4));
        let s1 = session(&mut c, &short.token).unwrap();
        let s2 = session(&mut c, &s1).unwrap();
        let listed = c.read().api_tokens();
        let ids: Vec<(&str, Option<&str>)> =
            listed.iter().map(|t| (t.id.as_str(), t.parent.as_deref())).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[0], (short.view.id.as_str(), None), "{ids:?}");
        assert_eq!(ids[1].1, Some(short.view.id.as_str()), "listed under its origin: {ids:?}");
        assert_eq!(ids[2].1, Some(ids[1].0), "{ids:?}");
        assert!(listed[1..].iter().all(|t| t.expires_at_ms == short.view.expires_at_ms));
        assert!(c.authenticate(&s2).is_ok());
        clock.advance(std::time::Duration::from_secs(4));
        for t in [&s1, &s2] {
            assert!(c.authenticate(t).is_err(), "a session outlived its 4-second origin");
        }
        // From a token then revoked: every session made from it goes in the same commit.
        let long = token(&mut c, Role::Operator, None);
        let s1 = session(&mut c, &long.token).unwrap();
        let s2 = session(&mut c, &s1).unwrap();
        let pending = c.create_console_link(&c.authenticate(&long.token).unwrap(), "t".into(), None).unwrap();
        c.revoke_api_token(&long.view.id, "admin").unwrap();
        for t in [&s1, &s2] {
            assert_eq!(c.authenticate(t).unwrap_err().to_string(), "unknown token");
        }
        assert!(c.open_console_session(&pending.code).is_err(), "a link outlived its token");
        // Revoking a session revokes what was made from it, and not its origin.
        let other = token(&mut c, Role::Viewer, None);
        let s1 = session(&mut c, &other.token).unwrap();
        let s2 = session(&mut c, &s1).unwrap();
        let s1_id = c
            .read()
            .api_tokens()
            .into_iter()
            .find(|t| t.parent.as_deref() == Some(other.view.id.as_str()))
            .unwrap();
        c.revoke_api_token(&s1_id.id, "admin").unwrap();
        assert!(c.authenticate(&s2).is_err());
        assert!(c.authenticate(&other.token).is_ok());
        // Sessions made from the bootstrap admin token go when it is rotated.
        let admin = auth::new_token("mpsf_adm_").unwrap();
        let old_admin_session = {
            let link = c.create_console_link(&Principal::Admin, "admin".into(), None).unwrap();
            c.open_console_session(&link.code).unwrap().token
        };
        assert!(c.authenticate(&old_admin_session).is_ok());
        c.rotate_admin_token(admin).unwrap();
        assert!(c.authenticate(&old_admin_session).is_err());
    }

    #[test]
    fn the_conformance_key_works_only_while_set_and_an_older_stored_one_is_removed() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        // What an older server stored for the flag.
        let view = TokenView {
            id: "tok-conformance".into(),
            role: Role::Admin,
            description: "the conformance suite's fixed key (--ecs-conformance)".into(),
            created_at_ms: 1,
            expires_at_ms: None,
            created_by: CONFORMANCE_CREATOR.into(),
            pool: None,
            access_key_id: Some("FOOBARKEY".into()),
            parent: None,
        };
        c.store_api_token(view, "FOOBARSECRET").unwrap();
        assert!(c.aws_key("FOOBARKEY").unwrap().is_some());
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        c.set_conformance_key(None).unwrap();
        assert!(c.aws_key("FOOBARKEY").unwrap().is_none());
        assert!(c.authenticate("FOOBARSECRET").is_err());
        assert!(c.read().api_tokens().is_empty() && store.list(API_TOKEN).unwrap().is_empty());
        c.set_conformance_key(Some(("FOOBARKEY", "FOOBARSECRET"))).unwrap();
        let key = c.aws_key("FOOBARKEY").unwrap().expect("the key while the flag is on");
        assert_eq!(key.secret, "FOOBARSECRET");
        assert!(matches!(
            c.authenticate("FOOBARSECRET").unwrap(),
            Principal::Token { role: Role::Admin, .. }
        ));
        assert!(store.list(API_TOKEN).unwrap().is_empty(), "never written to the store");
    }

    #[test]
    fn a_copy_of_an_access_key_holds_until_a_token_changes_or_it_expires() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store, clock.clone(), |_| Ok(())).unwrap();
        let req = |expires_in_s| CreateToken {
            role: Role::Operator,
            expires_in_s,
            description: "ci".into(),
            pool: None,
            aws: true,
        };
        let made = c.create_api_token(req(Some(60)), "admin").unwrap();
        let id = made.view.access_key_id.clone().unwrap();
        let key = c.aws_key(&id).unwrap().unwrap();
        assert_eq!(key.valid.now_ms(), Some(1_000_000));
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(key.valid.now_ms(), Some(1_001_000), "the clock's time now");
        // Any token made or revoked: copies taken before no longer hold.
        let other = c.create_api_token(req(None), "admin").unwrap();
        assert_eq!(key.valid.now_ms(), None);
        let again = c.aws_key(&id).unwrap().unwrap();
        assert!(again.valid.now_ms().is_some());
        c.revoke_api_token(&other.view.id, "admin").unwrap();
        assert_eq!(again.valid.now_ms(), None, "a revocation");
        let last = c.aws_key(&id).unwrap().unwrap();
        clock.advance(std::time::Duration::from_secs(60));
        assert_eq!(last.valid.now_ms(), None, "its token expired");
        assert!(c.aws_key(&id).is_err(), "and the lookup refuses it");
        c.set_conformance_key(Some(("FOOBARKEY", "FOOBARSECRET"))).unwrap();
        let conformance = c.aws_key("FOOBARKEY").unwrap().unwrap();
        assert!(conformance.valid.now_ms().is_some());
        c.set_conformance_key(None).unwrap();
        assert_eq!(conformance.valid.now_ms(), None, "the conformance key gone");
    }
}
