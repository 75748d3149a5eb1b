//! Who a container's processes run as, and with what environment.
//!
//! Environment policy: a task process (and its exec probes) gets exactly the environment the
//! agent passes in [`ExecContext::env`] on top of three basics, never the rest of the agent's
//! environment: `PATH` (the agent's, or [`DEFAULT_PATH`] when it has none), `HOME` (the home
//! directory of the user the container runs as; otherwise the agent's `HOME` if set) and `LANG`
//! (the agent's, if set). A variable given by the task overrides a basic one.

use nix::unistd::{Group, Uid, User};
use std::path::PathBuf;

/// `PATH` for task processes when the agent itself has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A resolved `user` of a container definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    /// The `user` string as the task definition gave it.
    pub spec: String,
    pub uid: u32,
    pub gid: u32,
    /// Home directory from the password database, when the uid is in it.
    pub home: Option<PathBuf>,
}

/// How to run a process of a container: environment and identity. Used for the container's
/// process and for its exec probes alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecContext {
    /// The complete environment (basics already merged in).
    pub env: Vec<(String, String)>,
    pub user: Option<ResolvedUser>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UserError {
    #[error(
        "container asks to run as user {user:?}, but the agent is not running as root and will \
         not run it as its own user instead"
    )]
    NeedsRoot { user: String },
    #[error("no such user {user:?} on this host")]
    UnknownUser { user: String },
    #[error("no such group {group:?} on this host (user {user:?})")]
    UnknownGroup { user: String, group: String },
    #[error("invalid user {user:?}: expected name, uid, name:group or uid:gid")]
    Invalid { user: String },
    #[error("cannot look up user {user:?}: {reason}")]
    Lookup { user: String, reason: String },
}

impl ExecContext {
    /// Builds the context for a container: resolves `user` (refusing one unless the agent runs
    /// as root) and merges the environment basics under `env`.
    pub fn new(env: &[(String, String)], user: Option<&str>) -> Result<ExecContext, UserError> {
        let user = match user {
            None => None,
            Some(spec) => {
                check_may_switch(Uid::current().is_root(), spec)?;
                Some(resolve_user(spec)?)
            }
        };
        Ok(ExecContext { env: merged_env(env, user.as_ref()), user })
    }
}

/// Only root may run a process as another user; anyone else asking must be refused rather than
/// silently run as the agent's user.
pub(crate) fn check_may_switch(is_root: bool, user: &str) -> Result<(), UserError> {
    if is_root {
        Ok(())
    } else {
        Err(UserError::NeedsRoot { user: user.to_string() })
    }
}

/// Resolves ECS's `user`: `name`, `uid`, `name:group`, `uid:gid` (and mixes). A numeric uid
/// need not exist in the password database; then its gid defaults to the uid.
pub fn resolve_user(spec: &str) -> Result<ResolvedUser, UserError> {
    let (user_part, group_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user_part.is_empty() || group_part.is_some_and(str::is_empty) {
        return Err(UserError::Invalid { user: spec.to_string() });
    }
    let lookup = |e: nix::Error| UserError::Lookup { user: spec.to_string(), reason: e.desc().to_string() };
    let (uid, default_gid, home) = match user_part.parse::<u32>() {
        Ok(uid) => match User::from_uid(Uid::from_raw(uid)).map_err(lookup)? {
            Some(u) => (uid, u.gid.as_raw(), Some(u.dir)),
            None => (uid, uid, None),
        },
        Err(_) => match User::from_name(user_part).map_err(lookup)? {
            Some(u) => (u.uid.as_raw(), u.gid.as_raw(), Some(u.dir)),
            None => return Err(UserError::UnknownUser { user: spec.to_string() }),
        },
    };
    let gid = match group_part {
        None => default_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => match Group::from_name(g).map_err(lookup)? {
                Some(group) => group.gid.as_raw(),
                None => return Err(UserError::UnknownGroup { user: spec.to_string(), group: g.to_string() }),
            },
        },
    };
    Ok(ResolvedUser { spec: spec.to_string(), uid, gid, home })
}

/// The basics (see the module docs) with `env` on top; later entries win over earlier ones.
pub(crate) fn merged_env(env: &[(String, String)], user: Option<&ResolvedUser>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let agent = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    out.push(("PATH".into(), agent("PATH").unwrap_or_else(|| DEFAULT_PATH.to_string())));
    let home = match user {
        Some(u) => {
            Some(u.home.as_ref().map_or_else(|| "/".to_string(), |h| h.to_string_lossy().into_owned()))
        }
        None => agent("HOME"),
    };
    if let Some(home) = home {
        out.push(("HOME".into(), home));
    }
    if let Some(lang) = agent("LANG") {
        out.push(("LANG".into(), lang));
    }
    for (k, v) in env {
        match out.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_may_switch_user() {
        assert_eq!(check_may_switch(true, "nobody"), Ok(()));
        assert_eq!(check_may_switch(false, "nobody"), Err(UserError::NeedsRoot { user: "nobody".into() }));
    }

    #[test]
    fn resolves_user_forms() {
        let root = resolve_user("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        let numeric = resolve_user("4321:99").expect("numeric");
        assert_eq!((numeric.uid, numeric.gid), (4321, 99));
        let unknown_uid = resolve_user("4321").expect("numeric uid needs no passwd entry");
        assert_eq!(unknown_uid.gid, 4321);
        let with_group = resolve_user("0:root").expect("root group");
        assert_eq!(with_group.gid, 0);
        assert_eq!(
            resolve_user("no-such-user-xyz"),
            Err(UserError::UnknownUser { user: "no-such-user-xyz".into() })
        );
        assert_eq!(
            resolve_user("root:no-such-group-xyz"),
            Err(UserError::UnknownGroup {
                user: "root:no-such-group-xyz".into(),
                group: "no-such-group-xyz".into()
            })
        );
        assert_eq!(resolve_user(""), Err(UserError::Invalid { user: "".into() }));
        assert_eq!(resolve_user("root:"), Err(UserError::Invalid { user: "root:".into() }));
    }

    #[test]
    fn task_env_overrides_basics() {
        let env = merged_env(&[("PATH".into(), "/opt/bin".into()), ("A".into(), "1".into())], None);
        assert_eq!(env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()), Some("/opt/bin"));
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").count(), 1);
        assert!(env.iter().any(|(k, v)| k == "A" && v == "1"));
        let user = ResolvedUser { spec: "x".into(), uid: 1, gid: 1, home: None };
        let env = merged_env(&[], Some(&user));
        assert!(env.iter().any(|(k, v)| k == "HOME" && v == "/"));
    }
}
