//! One-time sign-in links for the web console (`mpsfleet console`, as `nomad ui
//! -authenticate`): a caller asks for a link (`POST /v1/console/links`) and gets a random code
//! that works once, for a short time; the console trades it (`POST /v1/console/session`, the
//! code in a header) for a token of its own with the caller's role and pool, and no more. The
//! caller's token never goes into a URL; the code does (in the fragment, which browsers do not
//! send), and is useless once used or expired. Links are kept in memory by the server that
//! made them (a failover forgets them: ask again); console tokens expire after
//! [`CONSOLE_SESSION_S`] and the expired ones are removed when the next one is made.
//! The operations are `Cluster`'s, in `access.rs`; what they share is here.

use mpsfleet_types::access::Role;

/// How long a link works when the caller does not say (seconds), and the most it may.
pub const LINK_TTL_S: u64 = 60;
pub const MAX_LINK_TTL_S: u64 = 600;

/// Links not yet used; past this many the oldest go.
pub const MAX_PENDING_LINKS: usize = 100;

/// How long the console's own token works.
pub const CONSOLE_SESSION_S: u64 = 12 * 3600;

/// The description console tokens carry (`token list` shows it); expired ones are removed.
pub(super) const SESSION_DESCRIPTION: &str = "console sign-in";

/// A link not yet used: whose role it carries, and until when.
#[derive(Debug, Clone)]
pub struct PendingLink {
    pub(super) role: Role,
    pub(super) pool: Option<String>,
    pub(super) by: String,
    pub(super) expires_at_ms: u64,
    /// The digest of the token that asked for it: it must still work when the link is used.
    pub(super) parent_digest: String,
}
