//! One-time sign-in links for the web console (`mpsfleet console`, as `nomad ui
//! -authenticate`): a caller asks for a link (`POST /v1/console/links`) and gets a random code
//! that works once, for a short time; the console trades it (`POST /v1/console/session`, the
//! code in a header) for a token of its own with the caller's role and pool, and no more. The
//! caller's token never goes into a URL; the code does (in the fragment, which browsers do not
//! send), and is useless once used or expired. Links are kept in memory by the server that
//! made them (a failover forgets them: ask again); console tokens expire after
//! [`CONSOLE_SESSION_S`] and the expired ones are removed when the next one is made.

use super::*;
use crate::auth::Principal;
use mpsfleet_types::access::{ConsoleLink, ConsoleSession, CreateToken, Role};

/// How long a link works when the caller does not say (seconds), and the most it may.
pub const LINK_TTL_S: u64 = 60;
pub const MAX_LINK_TTL_S: u64 = 600;

/// Links not yet used; past this many the oldest go.
pub const MAX_PENDING_LINKS: usize = 100;

/// How long the console's own token works.
pub const CONSOLE_SESSION_S: u64 = 12 * 3600;

/// The description console tokens carry (`token list` shows it); expired ones are removed.
const SESSION_DESCRIPTION: &str = "console sign-in";

/// A link not yet used: whose role it carries, and until when.
#[derive(Debug, Clone)]
pub struct PendingLink {
    role: Role,
    pool: Option<String>,
    by: String,
    expires_at_ms: u64,
    /// The digest of the token that asked for it: it must still work when the link is used.
    parent_digest: String,
}

impl Cluster {
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
            .flat_map(|r| self.with_descendants(&r.view.id))
            .collect();
        self.revoke_records(expired, "console sign-in")?;
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
}
