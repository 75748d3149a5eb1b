//! The access room: who may call the API and what they may see. API tokens and their
//! descendants (`tokens.rs`), join tokens, the admin token, secrets (`secrets.rs`), the
//! audit log (`audit.rs`), console sign-in links (`console_links.rs`) and a principal's pool
//! scope (`scope.rs`). Authentication itself is `Cluster::authenticate` (`mod.rs`).

use super::audit::*;
use super::console_links::*;
use super::scope::*;
use super::sealed::{open, seal};
use super::secrets::*;
use super::tokens::*;
use super::*;
use crate::auth::Principal;
use mpsfleet_store::{decode, Op, Precondition};
use mpsfleet_types::access::{AuditEntry, AuditEvent};
use mpsfleet_types::access::{ConsoleLink, ConsoleSession};
use mpsfleet_types::access::{
    CreateJoinToken, CreateToken, CreatedJoinToken, CreatedToken, JoinTokenView, Role, TokenView,
};
use mpsfleet_types::secret::{check_secret_name, check_secret_value, CreateSecret, SecretInfo, TaskSecrets};
use mpsfleet_types::{HostId, TaskDefinition, TaskId, TaskStatus};
use std::collections::BTreeMap;
use std::collections::HashSet;

impl Cluster {
    /// `token revoke`: the token stops working at once, and so does every token made from it
    /// (console sign-ins), transitively, in the same commit.
    pub fn revoke_api_token(&mut self, id: &str, by: &str) -> Result<TokenView, Error> {
        let all = with_descendants(&self.state, id);
        let view = all
            .iter()
            .find(|r| r.view.id == id)
            .map(|r| r.view.clone())
            .ok_or_else(|| Error::not_found("token", id))?;
        self.writing(|w| revoke_records(w, all, by))?;
        Ok(view)
    }

    /// Revokes the tokens made from `parent` (a token id, or `admin`), transitively, in one
    /// commit.
    pub(super) fn revoke_made_from(&mut self, parent: &str, by: &str) -> Result<(), Error> {
        let gone: Vec<TokenRecord> = self
            .state
            .api_tokens()
            .values()
            .filter(|r| r.view.parent.as_deref() == Some(parent))
            .flat_map(|r| with_descendants(&self.state, &r.view.id))
            .collect();
        self.writing(|w| revoke_records(w, gone, by))
    }

    /// [`Cluster::create_api_token`] for a token made from another (`parent`: its id, and
    /// when it expires): the new one expires no later, and is revoked with it.
    pub(super) fn create_token_from(
        &mut self,
        req: CreateToken,
        by: &str,
        parent: Option<(String, Option<u64>)>,
    ) -> Result<CreatedToken, Error> {
        check_token_request(&req.description, req.expires_in_s)?;
        if let Some(pool) = &req.pool {
            if req.role == Role::Admin {
                return Err(Error::invalid(
                    "pool",
                    "an admin token acts on the whole cluster (pools, tokens, secrets): scope viewer or \
                     operator tokens only",
                ));
            }
            if !self.state.pools().keys().any(|k| k.as_str() == pool) {
                return Err(Error::invalid("pool", format!("no pool named {pool:?}")));
            }
        }
        if self.state.api_tokens().len() >= MAX_API_TOKENS {
            return Err(Error::Conflict(format!(
                "the cluster holds {MAX_API_TOKENS} tokens, the most it keeps: revoke some first"
            )));
        }
        let token = auth::new_token(match req.role {
            Role::Viewer => "mpsf_view_",
            Role::Operator => "mpsf_op_",
            Role::Admin => "mpsf_adm_",
        })?;
        let now = self.now();
        let id = token_id("tok-")?;
        let view = TokenView {
            id: id.clone(),
            role: req.role,
            description: req.description,
            created_at_ms: now,
            expires_at_ms: {
                let asked = req.expires_in_s.map(|s| now.saturating_add(s.saturating_mul(1000)));
                let parent_ends = parent.as_ref().and_then(|(_, at)| *at);
                asked.into_iter().chain(parent_ends).min()
            },
            created_by: by.to_string(),
            pool: req.pool,
            access_key_id: if req.aws { Some(access_key_id()?) } else { None },
            parent: parent.map(|(id, _)| id),
        };
        self.store_api_token(view.clone(), &token)?;
        tracing::info!(token.id = %id, role = req.role.as_str(), by, "API token created");
        Ok(CreatedToken { token, view })
    }

    /// `token create`: a new token with `req.role`, shown once.
    pub fn create_api_token(&mut self, req: CreateToken, by: &str) -> Result<CreatedToken, Error> {
        self.create_token_from(req, by, None)
    }

    /// Stores token `token` with its record `view`: its digest, and for an AWS access key the
    /// token sealed under the server's key.
    pub(super) fn store_api_token(&mut self, view: TokenView, token: &str) -> Result<(), Error> {
        let sealed_secret = match &view.access_key_id {
            Some(key) => Some(seal(&self.creds.key, AWS_KEY_PURPOSE, key, token.as_bytes())?),
            None => None,
        };
        let id = view.id.clone();
        let rec = TokenRecord { view, sha256: auth::digest(token), sealed_secret };
        self.write(&[Op::put_json(API_TOKEN, &id, &rec, Precondition::Absent)?], [Change::ApiToken(rec)])?;
        Ok(())
    }

    /// Sets the fixed admin access key the moto conformance suite signs with
    /// (`--ecs-conformance` only: a key anyone knows is no credential). It is kept in memory
    /// alone, so it works exactly while the flag is on; a key an older server stored for the
    /// flag is removed here, whether or not the flag is on now.
    pub fn set_conformance_key(&mut self, key: Option<(&str, &str)>) -> Result<(), Error> {
        let stored: Vec<String> = self
            .state
            .api_tokens()
            .values()
            .filter(|r| r.view.created_by == CONFORMANCE_CREATOR)
            .map(|r| r.view.id.clone())
            .collect();
        for id in stored {
            self.revoke_api_token(&id, "server start")?;
        }
        // Copies of the old key taken earlier no longer hold.
        self.state.credentials.fetch_add(1, std::sync::atomic::Ordering::Release);
        self.creds.conformance = key.map(|(id, secret)| ConformanceKey {
            access_key_id: id.to_string(),
            secret: secret.to_string(),
            digest: auth::digest(secret),
        });
        Ok(())
    }

    /// The caller an AWS access key id names, with its secret access key: `Ok(None)` when it is
    /// none of them; refused when its token has expired.
    pub fn aws_key(&self, access_key_id: &str) -> Result<Option<AwsKey>, Error> {
        if let Some(k) = self.creds.conformance.as_ref().filter(|k| k.access_key_id == access_key_id) {
            let who = (self.creds)
                .conformance_principal(&k.digest)
                .ok_or_else(|| Error::Internal("conformance key".into()))?;
            let (secret, digest) = (k.secret.clone(), k.digest.clone());
            let valid = KeyValidity::new(&self.state.credentials, None, self.clock.clone());
            return Ok(Some(AwsKey { who, secret, digest, now_ms: self.now(), valid }));
        }
        let Some(rec) = self.state.access_key(access_key_id) else { return Ok(None) };
        let corrupt = |why: &str| Error::StoreCorrupt(format!("access key {access_key_id}: {why}"));
        let who = api_token(&self.read(), &rec.sha256)?.ok_or_else(|| corrupt("no token"))?;
        let sealed = rec.sealed_secret.as_ref().ok_or_else(|| corrupt("no sealed secret"))?;
        let secret = open(&self.creds.key, AWS_KEY_PURPOSE, access_key_id, sealed).map_err(corrupt)?;
        let secret = String::from_utf8(secret).map_err(|_| corrupt("not UTF-8"))?;
        let valid = KeyValidity::new(&self.state.credentials, rec.view.expires_at_ms, self.clock.clone());
        Ok(Some(AwsKey { who, secret, digest: rec.sha256.clone(), now_ms: self.now(), valid }))
    }

    /// `join-token revoke`: the join token stops working at once (hosts it registered keep
    /// their own credentials).
    pub fn revoke_join_token(&mut self, id: &str, by: &str) -> Result<JoinTokenView, Error> {
        let rec = self
            .state
            .join_tokens()
            .map()
            .values()
            .find(|r| r.view.id == id)
            .cloned()
            .ok_or_else(|| Error::not_found("join token", id))?;
        self.write(
            &[Op::delete(JOIN_TOKEN, id, Precondition::Any)],
            [Change::JoinTokenRevoked(rec.sha256.clone())],
        )?;
        tracing::info!(token.id = %id, by, "join token revoked");
        Ok(rec.view)
    }

    /// `join-token create`: a new join token, shown once, with the cluster CA's hash after it
    /// when the server serves HTTPS.
    pub fn create_join_token(&mut self, req: CreateJoinToken, by: &str) -> Result<CreatedJoinToken, Error> {
        if self.state.join_tokens().map().len() >= MAX_JOIN_TOKENS {
            return Err(Error::Conflict(format!(
                "the cluster holds {MAX_JOIN_TOKENS} join tokens, the most it keeps: revoke some first"
            )));
        }
        let secret = auth::new_token("mpsf_join_")?;
        let rec = join_token_record(self.now(), auth::digest(&secret), &req, by)?;
        let view = rec.view.clone();
        self.write(
            &[Op::put_json(JOIN_TOKEN, &view.id, &rec, Precondition::Absent)?],
            [Change::JoinToken(rec)],
        )?;
        tracing::info!(token.id = %view.id, by, expires_at_ms = view.expires_at_ms, "join token created");
        Ok(CreatedJoinToken { token: self.join_string(&secret), view })
    }

    /// Replaces the bootstrap admin token with `token` (a new one, [`auth::new_token`]): the
    /// old one is refused from now on.
    pub fn rotate_admin_token(
        &mut self,
        token: String,
    ) -> Result<mpsfleet_types::access::RotatedAdminToken, Error> {
        let digest = auth::digest(&token);
        // Console sign-ins made from the old admin token go with it.
        self.revoke_made_from(ADMIN_PARENT, "admin token rotation")?;
        self.write(
            &[Op::put_json(
                super::AUTH,
                "admin",
                &super::AuthRecord { sha256: digest.clone() },
                Precondition::Any,
            )?],
            [Change::AdminToken(digest)],
        )?;
        Ok(mpsfleet_types::access::RotatedAdminToken { token, rotated_at_ms: self.now() })
    }
}

impl Cluster {
    /// The values task `id`'s definition names, for the agent of the host it is placed on.
    pub fn task_secrets(&self, host: &HostId, id: &str) -> Result<TaskSecrets, Error> {
        let task = TaskId::parse(id)
            .ok()
            .and_then(|id| self.state.tasks().get(&id))
            .map(|e| &e.task)
            .ok_or_else(|| Error::not_found("task", id))?;
        if task.host_id.as_ref() != Some(host) || task.last_status == TaskStatus::Stopped {
            return Err(Error::Forbidden(format!("task {id} is not running on host {host}")));
        }
        let r = &task.task_definition;
        let td = self
            .state
            .taskdefs()
            .get(&(r.family.clone(), r.revision))
            .ok_or_else(|| Error::not_found("task definition", r.to_string()))?;
        let mut values = BTreeMap::new();
        for u in secret_uses(&td.value) {
            match self.resolve_secret(&u.name)? {
                Ok(v) => {
                    values.insert(u.name, v);
                }
                Err(why) => return Err(Error::invalid(u.path, why)),
            }
        }
        tracing::debug!(task = %id, host = %host, secrets = values.len(), "task secrets handed out");
        Ok(TaskSecrets { values })
    }

    /// Refuses a definition that names a secret that is not stored (at task run and service
    /// create: such a task could never start).
    pub(super) fn check_task_secrets(&self, td: &TaskDefinition) -> Result<(), Error> {
        for u in secret_uses(td) {
            if let Err(why) = self.resolve_secret(&u.name)? {
                return Err(Error::invalid(u.path, why));
            }
        }
        Ok(())
    }

    /// The value `name` stands for: a stored secret of that name, or one key of a stored JSON
    /// secret in ECS's `…:secret:NAME:JSON-KEY::` form. `Err(message)` says why there is none.
    pub(super) fn resolve_secret(&self, name: &str) -> Result<Result<String, String>, Error> {
        if let Some((rec, _)) = self.secret_record(name)? {
            return Ok(Ok(self.creds.decrypt(&rec)?));
        }
        let Some((base, key, versioned)) = json_key_form(name) else {
            return Ok(Err(format!("no secret named {name:?} is stored (mpsfleet secret create)")));
        };
        if versioned {
            return Ok(Err(format!(
                "names a version stage or id of {base:?}, and stored secrets have no versions: \
                 leave the last two fields empty ({base}:{key}::)"
            )));
        }
        let Some((rec, _)) = self.secret_record(&base)? else {
            return Ok(Err(format!(
                "no secret named {name:?} or {base:?} is stored (mpsfleet secret create)"
            )));
        };
        if key.is_empty() {
            return Ok(Ok(self.creds.decrypt(&rec)?));
        }
        let value = self.creds.decrypt(&rec)?;
        let Ok(serde_json::Value::Object(obj)) = serde_json::from_str::<serde_json::Value>(&value) else {
            return Ok(Err(format!("names the key {key:?} of {base:?}, whose value is not a JSON object")));
        };
        Ok(match obj.get(key) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(v) => Ok(v.to_string()),
            None => Err(format!("names the key {key:?} of {base:?}, which has no such key")),
        })
    }

    pub fn delete_secret(&mut self, name: &str) -> Result<SecretInfo, Error> {
        let (rec, version) = self.secret_record(name)?.ok_or_else(|| Error::not_found("secret", name))?;
        self.write(&[Op::delete(SECRET, name, Precondition::Version(version))], [])?;
        tracing::info!(secret = %name, "secret deleted");
        Ok(rec.info())
    }

    /// The stored secrets' names and times, by name; never their values.
    pub fn secrets(&self) -> Result<Vec<SecretInfo>, Error> {
        let mut out = Vec::new();
        for r in self.store.list(SECRET)? {
            out.push(decode::<SecretRecord>(&r)?.info());
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Stores a new secret. A name already stored is refused (delete it first).
    pub fn create_secret(&mut self, req: CreateSecret) -> Result<SecretInfo, Error> {
        check_secret_name(&req.name).map_err(|m| Error::invalid("name", m))?;
        check_secret_value(&req.value).map_err(|m| Error::invalid("value", m))?;
        if self.secret_record(&req.name)?.is_some() {
            return Err(Error::AlreadyExists { kind: "secret", id: req.name });
        }
        let count = self.store.list(SECRET)?.len();
        if count >= MAX_SECRETS {
            return Err(Error::invalid(
                "name",
                format!("the server keeps at most {MAX_SECRETS} secrets, and has {count}: delete some first"),
            ));
        }
        let sealed = seal(&self.creds.key, KEY_PURPOSE, &req.name, req.value.as_bytes())?;
        let now = self.now();
        let rec = SecretRecord {
            name: req.name.clone(),
            nonce: sealed.nonce,
            ciphertext: sealed.ciphertext,
            size: req.value.len(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.write(&[Op::put_json(SECRET, req.name.as_str(), &rec, Precondition::Absent)?], [])?;
        tracing::info!(secret = %rec.name, bytes = rec.size, "secret stored");
        Ok(rec.info())
    }

    pub(super) fn secret_record(
        &self,
        name: &str,
    ) -> Result<Option<(SecretRecord, mpsfleet_store::Revision)>, Error> {
        match self.store.get(SECRET, name)? {
            Some(r) => Ok(Some((decode(&r)?, r.version))),
            None => Ok(None),
        }
    }
}

impl Cluster {
    /// `audit list`: the newest `limit` entries, oldest first.
    pub fn audit_entries(&self, limit: usize) -> Result<Vec<AuditEntry>, Error> {
        let limit = limit.min(MAX_AUDIT_LIST);
        let start = self.state.audit_log().keys.len().saturating_sub(limit);
        let mut out = Vec::with_capacity(limit);
        for k in self.state.audit_log().keys.iter().skip(start) {
            if let Some(r) = self.store.get(AUDIT, k)? {
                out.push(decode(&r)?);
            }
        }
        Ok(out)
    }

    /// Ends the call: one that committed nothing gets an entry of its own, with its result
    /// (`failure`: the error, as the caller was answered; `None`: it succeeded).
    pub fn end_audit(&mut self, failure: Option<String>) {
        let Some(call) = self.call.audit.take() else { return };
        if call.written {
            return;
        }
        let result = failure.unwrap_or_else(|| "ok (no change)".to_string());
        let ops = match audit_ops(&self.read(), &call.ctx, result, None) {
            Ok(ops) => ops,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode an audit entry");
                return;
            }
        };
        let written = Change::AuditWritten { dropped: ops.len() - 1 };
        if let Err(e) = self.writer().write(&ops, [written]) {
            tracing::error!(error = %e, action = %call.ctx.action, "cannot write an audit entry");
        }
    }

    /// From now until [`Cluster::end_audit`], the first commit carries an entry for `ctx`.
    pub fn begin_audit(&mut self, ctx: Option<AuditContext>) {
        self.call.audit = ctx.map(|ctx| AuditCall { ctx, written: false });
    }
}

impl Cluster {
    /// Trades a link's `code` for a console token: once, before it expires.
    pub fn open_console_session(&mut self, code: &str) -> Result<ConsoleSession, Error> {
        let refused = || {
            Error::Unauthorized(
                "this sign-in link was used already or has expired: run mpsfleet console again",
            )
        };
        let link = self.console_links.remove(&crate::auth::digest(code)).ok_or_else(refused)?;
        let now = self.now();
        if now >= link.expires_at_ms {
            return Err(refused());
        }
        // The token that asked for the link must still work: expired or revoked, its link is
        // dead too.
        let parent = match self.authenticate_digest(&link.parent_digest) {
            Ok(Principal::Admin) => (tokens::ADMIN_PARENT.to_string(), None),
            Ok(Principal::Token { id, .. }) => {
                let ends =
                    self.state.api_tokens().get(&link.parent_digest).and_then(|r| r.view.expires_at_ms);
                (id, ends)
            }
            _ => return Err(refused()),
        };
        // Console tokens that expired go first (with what was made from them): they would
        // pile up, one per sign-in.
        let expired: Vec<_> = self
            .state
            .api_tokens()
            .values()
            .filter(|r| r.view.description.starts_with(SESSION_DESCRIPTION))
            .filter(|r| r.view.expires_at_ms.is_some_and(|at| at <= now))
            .flat_map(|r| with_descendants(&self.state, &r.view.id))
            .collect();
        self.writing(|w| revoke_records(w, expired, "console sign-in"))?;
        let req = CreateToken {
            role: link.role,
            expires_in_s: Some(CONSOLE_SESSION_S),
            description: format!("{SESSION_DESCRIPTION} for {}", link.by),
            pool: link.pool,
            aws: false,
        };
        let made = self.create_token_from(req, &link.by, Some(parent))?;
        Ok(ConsoleSession {
            token: made.token,
            role: made.view.role,
            pool: made.view.pool,
            expires_at_ms: made.view.expires_at_ms.unwrap_or(now),
        })
    }

    /// A one-time link for `who` (named `by` in the audit and on the token it makes), working
    /// for `ttl_s` seconds (default [`LINK_TTL_S`]).
    pub fn create_console_link(
        &mut self,
        who: &Principal,
        by: String,
        ttl_s: Option<u64>,
    ) -> Result<ConsoleLink, Error> {
        let ttl_s = ttl_s.unwrap_or(LINK_TTL_S);
        if !(1..=MAX_LINK_TTL_S).contains(&ttl_s) {
            return Err(Error::invalid(
                "expiresInSeconds",
                format!("must be 1 to {MAX_LINK_TTL_S} (seconds), got {ttl_s}"),
            ));
        }
        let (role, pool) = match who {
            Principal::Admin => (Role::Admin, None),
            Principal::Token { role, pool, .. } => (*role, pool.clone()),
            _ => return Err(Error::Forbidden("only a person's token may open the console".into())),
        };
        let parent_digest = match who {
            Principal::Token { id, .. } => {
                let rec = self.state.api_tokens().values().find(|r| r.view.id == *id);
                rec.map(|r| r.sha256.clone())
                    .ok_or_else(|| Error::Forbidden("only a stored token may open the console".into()))?
            }
            _ => self.state.admin().digest(),
        };
        let now = self.now();
        self.console_links.retain(|_, l| l.expires_at_ms > now);
        while self.console_links.len() >= MAX_PENDING_LINKS {
            let oldest =
                self.console_links.iter().min_by_key(|(_, l)| l.expires_at_ms).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.console_links.remove(&k),
                None => break,
            };
        }
        let code = crate::auth::new_token("mpsf_link_")?;
        let expires_at_ms = now.saturating_add(ttl_s * 1000);
        let link = PendingLink { role, pool, by, expires_at_ms, parent_digest };
        self.console_links.insert(crate::auth::digest(&code), link);
        Ok(ConsoleLink { code, role, expires_at_ms })
    }
}

impl<'a> Reader<'a> {
    /// The join tokens' digests, for authentication without the cluster lock.
    pub fn join_digests(&self) -> JoinDigests {
        self.state.join_tokens().clone()
    }

    pub fn admin_digest(&self) -> AdminDigest {
        self.state.admin().clone()
    }

    /// `join-token list`: every join token's record (expired ones too, until revoked), oldest
    /// first.
    pub fn join_tokens(&self) -> Vec<JoinTokenView> {
        let mut all: Vec<JoinTokenView> =
            self.state.join_tokens().map().values().map(|r| r.view.clone()).collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        all
    }

    /// `token list`: every API token's record, oldest first, each followed by the tokens made
    /// from it (console sign-ins), depth first.
    pub fn api_tokens(&self) -> Vec<TokenView> {
        let mut all: Vec<&TokenView> = self.state.api_tokens().values().map(|r| &r.view).collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        let ids: HashSet<&str> = all.iter().map(|t| t.id.as_str()).collect();
        let mut children: HashMap<&str, Vec<&TokenView>> = HashMap::new();
        let mut roots = Vec::new();
        for t in &all {
            match t.parent.as_deref().filter(|p| ids.contains(p)) {
                Some(p) => children.entry(p).or_default().push(t),
                None => roots.push(*t),
            }
        }
        let mut out = Vec::with_capacity(all.len());
        let mut stack: Vec<&TokenView> = roots.into_iter().rev().collect();
        while let Some(t) = stack.pop() {
            out.push(t.clone());
            if let Some(kids) = children.get(t.id.as_str()) {
                stack.extend(kids.iter().rev());
            }
        }
        out
    }

    /// Whether `who` may make an operation that touches `touch`, on the state as it is now.
    pub fn admit(&self, who: &Principal, touch: &Touch) -> Result<(), Error> {
        if who.scope().is_none() {
            return Ok(());
        }
        match touch {
            Touch::NoPool | Touch::List => Ok(()),
            Touch::Object(kind, id) => match self.pool_of(*kind, id) {
                Some(p) if !who.sees_pool(p) => Err(Error::not_found(kind.noun(), id.clone())),
                _ => Ok(()),
            },
            Touch::NewIn(pool) if who.sees_pool(pool) => Ok(()),
            Touch::NewIn(pool) => Err(outside(who, &format!("pool {pool:?}"))),
            Touch::Cluster => Err(Error::Forbidden(format!(
                "this endpoint is not open to {}: it reaches beyond one pool",
                who.describe()
            ))),
        }
    }

    /// The pool of the object of `kind` named `id`, read from its record; None when there is
    /// none.
    pub(super) fn pool_of(&self, kind: Kind, id: &str) -> Option<&str> {
        let state = &self.state;
        match kind {
            Kind::Pool => {
                let name = mpsfleet_types::PoolName::new(id).ok()?;
                state.pools().get_key_value(&name).map(|(p, _)| p.as_str())
            }
            Kind::Host => self.host_ix(id).ok().map(|ix| state.hosts()[ix as usize].host().pool.as_str()),
            Kind::Task => {
                let id = mpsfleet_types::TaskId::parse(id).ok()?;
                state.tasks().get(&id).map(|e| e.task.pool.as_str())
            }
            Kind::Service => {
                let name = mpsfleet_types::ServiceName::new(id).ok()?;
                state.services().get(&name).map(|s| s.value.pool.as_str())
            }
            Kind::Incident => state.incidents().get(id).map(|i| i.value.pool.as_str()),
            Kind::Drill => state.drills().get(id).map(|d| d.value.pool.as_str()),
        }
    }
}

pub(super) fn load_join_tokens(store: &dyn Store, state: &mut State) -> Result<(), Error> {
    for r in store.list(JOIN_TOKEN)? {
        state.apply(r.version, Change::JoinToken(decode(&r)?));
    }
    Ok(())
}

/// Whether `digest` is a join token's: `Ok(false)` when it is none; refused when it
/// has expired.
pub(super) fn join_token(state: &State, digest: &str) -> Result<bool, Error> {
    state.join_tokens().check(digest).map(|valid| valid.map(|()| true)).unwrap_or(Ok(false))
}

pub(super) fn load_api_tokens(store: &dyn Store, state: &mut State) -> Result<(), Error> {
    for r in store.list(API_TOKEN)? {
        let rec: TokenRecord = decode(&r)?;
        state.apply(r.version, Change::ApiToken(rec));
    }
    Ok(())
}

/// The principal of an API token's digest: `Ok(None)` when it is none of them.
pub(super) fn api_token(r: &Reader<'_>, digest: &str) -> Result<Option<Principal>, Error> {
    let Some(rec) = r.state.api_tokens().get(digest) else { return Ok(None) };
    if rec.view.expires_at_ms.is_some_and(|at| r.now_ms >= at) {
        return Err(Error::Unauthorized("this token has expired"));
    }
    Ok(Some(Principal::Token { id: rec.view.id.clone(), role: rec.view.role, pool: rec.view.pool.clone() }))
}

/// Token `id` and every token made from it, transitively (console sign-ins): the records.
pub(super) fn with_descendants(state: &State, id: &str) -> Vec<TokenRecord> {
    let mut out: Vec<TokenRecord> = Vec::new();
    let mut next = vec![id.to_string()];
    while let Some(parent) = next.pop() {
        for r in state.api_tokens().values() {
            let made_from = r.view.parent.as_deref() == Some(parent.as_str());
            if (r.view.id == parent || made_from) && !out.iter().any(|o| o.view.id == r.view.id) {
                if r.view.id != parent {
                    next.push(r.view.id.clone());
                }
                out.push(r.clone());
            }
        }
    }
    out
}

pub(super) fn revoke_records(w: &mut Writer<'_>, mut gone: Vec<TokenRecord>, by: &str) -> Result<(), Error> {
    gone.sort_by(|a, b| a.view.id.cmp(&b.view.id));
    gone.dedup_by(|a, b| a.view.id == b.view.id);
    if gone.is_empty() {
        return Ok(());
    }
    let ops: Vec<Op> = gone.iter().map(|r| Op::delete(API_TOKEN, &r.view.id, Precondition::Any)).collect();
    let ids: Vec<String> = gone.iter().map(|r| r.view.id.clone()).collect();
    w.write(&ops, gone.into_iter().map(|r| Change::ApiTokenRevoked(r.sha256)))?;
    for id in ids {
        tracing::info!(token.id = %id, by, "API token revoked");
    }
    Ok(())
}

pub(super) fn load_audit(store: &dyn Store, state: &mut State) -> Result<(), Error> {
    let keys: Vec<String> = store.list(AUDIT)?.into_iter().map(|r| r.key).collect();
    state.apply(0, Change::AuditLoaded(keys));
    Ok(())
}

/// An entry for `ctx` under the next key, and deletes of the oldest entries past the bound.
pub(super) fn audit_ops(
    r: &Reader<'_>,
    ctx: &AuditContext,
    result: String,
    revision: Option<u64>,
) -> Result<Vec<Op>, Error> {
    let event = AuditEvent {
        actor: ctx.actor.clone(),
        role: ctx.role,
        action: ctx.action.clone(),
        target: ctx.target.clone(),
        from: ctx.from.clone(),
        result,
        revision,
    };
    let entry = AuditEntry::new(r.now_ms, event);
    let mut ops = vec![Op::put_json(AUDIT, key(r.state.audit_log().next_seq), &entry, Precondition::Absent)?];
    let over = (r.state.audit_log().keys.len() + 1).saturating_sub(MAX_AUDIT_ENTRIES);
    ops.extend(
        r.state.audit_log().keys.iter().take(over).map(|k| Op::delete(AUDIT, k.clone(), Precondition::Any)),
    );
    Ok(ops)
}
