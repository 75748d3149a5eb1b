//! API tokens with roles (`token create|list|revoke`): made by an admin for people and tools,
//! stored as their SHA-256 digest only, optionally expiring. The bootstrap admin token of the
//! data dir stays an admin token.

use super::*;
use mpsfleet_types::access::{CreateToken, CreatedToken, Role, TokenView};

/// Store kind of API tokens, keyed by token id.
pub(super) const API_TOKEN: &str = "token";
/// The most API tokens a cluster keeps.
pub const MAX_API_TOKENS: usize = 1000;
/// The longest a token's description may be.
pub const MAX_TOKEN_DESCRIPTION: usize = 256;
/// The longest lifetime a token may be given: ten years.
pub const MAX_TOKEN_LIFETIME_S: u64 = 10 * 365 * 86_400;

/// A stored API token: its record and the digest it is recognised by.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TokenRecord {
    #[serde(flatten)]
    pub view: TokenView,
    pub sha256: String,
}

impl Cluster {
    pub(super) fn load_api_tokens(&mut self) -> Result<(), ApiError> {
        for r in self.store.list(API_TOKEN)? {
            let rec: TokenRecord = decode(&r)?;
            self.api_tokens.insert(rec.sha256.clone(), rec);
        }
        Ok(())
    }

    /// The principal of an API token's digest: `Ok(None)` when it is none of them.
    pub(super) fn api_token(&self, digest: &str) -> Result<Option<Principal>, ApiError> {
        let Some(rec) = self.api_tokens.get(digest) else { return Ok(None) };
        if rec.view.expires_at_ms.is_some_and(|at| self.now() >= at) {
            return Err(ApiError::Unauthorized("this token has expired"));
        }
        Ok(Some(Principal::Token { id: rec.view.id.clone(), role: rec.view.role }))
    }

    /// `token create`: a new token with `req.role`, shown once.
    pub fn create_api_token(&mut self, req: CreateToken, by: &str) -> Result<CreatedToken, ApiError> {
        if req.description.chars().count() > MAX_TOKEN_DESCRIPTION
            || req.description.chars().any(char::is_control)
        {
            return Err(ApiError::invalid(
                "description",
                format!("must be at most {MAX_TOKEN_DESCRIPTION} printable characters"),
            ));
        }
        if let Some(s) = req.expires_in_s {
            if s == 0 || s > MAX_TOKEN_LIFETIME_S {
                return Err(ApiError::invalid(
                    "expiresInS",
                    format!("must be from 1 to {MAX_TOKEN_LIFETIME_S} seconds, got {s}"),
                ));
            }
        }
        if self.api_tokens.len() >= MAX_API_TOKENS {
            return Err(ApiError::Conflict(format!(
                "the cluster holds {MAX_API_TOKENS} tokens, the most it keeps: revoke some first"
            )));
        }
        let token = auth::new_token(match req.role {
            Role::Viewer => "mpsf_view_",
            Role::Operator => "mpsf_op_",
            Role::Admin => "mpsf_adm_",
        })?;
        let now = self.now();
        let id = format!("tok-{:012x}", auth::random_u64()? >> 16);
        let view = TokenView {
            id: id.clone(),
            role: req.role,
            description: req.description,
            created_at_ms: now,
            expires_at_ms: req.expires_in_s.map(|s| now.saturating_add(s.saturating_mul(1000))),
            created_by: by.to_string(),
        };
        let rec = TokenRecord { view: view.clone(), sha256: auth::digest(&token) };
        self.commit(&[Op::put_json(API_TOKEN, &id, &rec, Precondition::Absent)?])?;
        tracing::info!(token.id = %id, role = req.role.as_str(), by, "API token created");
        self.api_tokens.insert(rec.sha256.clone(), rec);
        Ok(CreatedToken { token, view })
    }

    /// `token list`: every API token's record, oldest first.
    pub fn api_tokens(&self) -> Vec<TokenView> {
        let mut all: Vec<TokenView> = self.api_tokens.values().map(|r| r.view.clone()).collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        all
    }

    /// `token revoke`: the token stops working at once.
    pub fn revoke_api_token(&mut self, id: &str, by: &str) -> Result<TokenView, ApiError> {
        let digest = self
            .api_tokens
            .iter()
            .find(|(_, r)| r.view.id == id)
            .map(|(d, _)| d.clone())
            .ok_or_else(|| ApiError::not_found("token", id))?;
        self.commit(&[Op::delete(API_TOKEN, id, Precondition::Any)])?;
        let rec = self.api_tokens.remove(&digest).expect("found above");
        tracing::info!(token.id = %id, by, "API token revoked");
        Ok(rec.view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_core::clock::ManualClock;

    #[test]
    fn tokens_carry_their_role_expire_and_are_revoked() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store: Arc<dyn mpsfleet_store::Store> = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store.clone(), clock.clone(), |_| Ok(())).unwrap();
        let req = |role, expires_in_s| CreateToken { role, expires_in_s, description: "ci".into() };
        let viewer = c.create_api_token(req(Role::Viewer, Some(60)), "admin").unwrap();
        assert!(viewer.token.starts_with("mpsf_view_"));
        assert_eq!(
            c.authenticate(&viewer.token).unwrap(),
            Principal::Token { id: viewer.view.id.clone(), role: Role::Viewer }
        );
        let op = c.create_api_token(req(Role::Operator, None), "admin").unwrap();
        assert_eq!(c.api_tokens().len(), 2);
        // The store holds digests only, and a restarted server knows the tokens again.
        let stored = format!("{:?}", store.list(API_TOKEN).unwrap());
        assert!(!stored.contains(&op.token) && !stored.contains(&viewer.token));
        let mut c = Cluster::load(store, clock.clone(), |_| Ok(())).unwrap();
        assert_eq!(
            c.authenticate(&op.token).unwrap(),
            Principal::Token { id: op.view.id.clone(), role: Role::Operator }
        );
        clock.advance(std::time::Duration::from_secs(61));
        assert_eq!(c.authenticate(&viewer.token).unwrap_err().to_string(), "this token has expired");
        c.revoke_api_token(&op.view.id, "admin").unwrap();
        assert_eq!(c.authenticate(&op.token).unwrap_err().to_string(), "unknown token");
        assert!(c.revoke_api_token(&op.view.id, "admin").is_err());
        let e = c.create_api_token(req(Role::Admin, Some(0)), "admin").unwrap_err().to_string();
        assert!(e.contains("expiresInS: must be from 1"), "{e}");
    }
}
