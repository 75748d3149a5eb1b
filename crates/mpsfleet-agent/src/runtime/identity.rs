//! Who a container's processes run as, and with what environment.
//!
//! Environment policy: a task process (and its exec probes) gets exactly the environment the
//! agent passes in [`ExecContext::env`] on top of three basics, never the rest of the agent's
//! environment: `PATH` (the agent's, or [`DEFAULT_PATH`] when it has none), `HOME` (the home
//! directory of the user the container runs as: the task's own directory for a task uid;
//! otherwise the agent's `HOME` if set) and `LANG` (the agent's, if set). A variable given by
//! the task overrides a basic one.
//!
//! Identity policy: a container whose definition names a `user` runs as that user (when the
//! agent runs as root; the pool decides whether it may, see [`crate::tasks`]). One that names
//! none runs, when the agent runs as root, as the task's own uid ([`TaskUser`], one per running
//! task, allocated from a [`UidRange`]; an MPS task the uid its GPU's MPS tasks share, one of
//! the last uids of the range), gid the same, no supplementary groups, `HOME` and the working
//! directory its own directory; when the agent is not root, as the agent's user.

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

/// The unprivileged identity of one running task (when the agent runs as root and the
/// container names no `user`): uid and gid `uid`, no supplementary groups, `home` its own
/// directory (owned by `uid`, mode 0700), also its working directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskUser {
    pub uid: u32,
    pub home: PathBuf,
}

/// The uids tasks get (`--task-uid-range FIRST-LAST`), both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

/// The default `--task-uid-range`: above the uids distributions hand out (and below 2^31, which
/// some tools take as negative).
pub const DEFAULT_TASK_UIDS: UidRange = UidRange { first: 200_000, last: 299_999 };

impl UidRange {
    /// Parses `FIRST-LAST` and checks it for an agent running as `agent_uid`: it may not hold 0
    /// nor the agent's own uid, nor `nobody` (65534), nor reach 2^31 - 1; the message names the
    /// flag and the limit.
    pub fn parse(value: &str, agent_uid: u32) -> Result<UidRange, String> {
        let flag = "--task-uid-range";
        let Some((a, b)) = value.split_once('-') else {
            return Err(format!("{flag} must be FIRST-LAST (e.g. 200000-299999), got {value:?}"));
        };
        let num = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("{flag}: {s:?} is not a uid (a whole number), in {value:?}"))
        };
        let range = UidRange { first: num(a)?, last: num(b)? };
        range.validate(agent_uid)?;
        Ok(range)
    }

    pub fn validate(&self, agent_uid: u32) -> Result<(), String> {
        let flag = "--task-uid-range";
        let (first, last) = (self.first, self.last);
        if first > last {
            return Err(format!("{flag}: the first uid {first} is above the last {last}"));
        }
        if first == 0 {
            return Err(format!("{flag} {first}-{last} holds uid 0 (root): tasks would run as root"));
        }
        if (first..=last).contains(&agent_uid) {
            return Err(format!(
                "{flag} {first}-{last} holds the agent's own uid {agent_uid}: tasks could reach the agent's files"
            ));
        }
        if (first..=last).contains(&65534) {
            return Err(format!("{flag} {first}-{last} holds 65534 (nobody), which other programs share"));
        }
        if last >= i32::MAX as u32 {
            return Err(format!("{flag}: the last uid must be below {}, got {last}", i32::MAX));
        }
        Ok(())
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }

    /// How many uids the range holds.
    pub fn size(&self) -> u32 {
        self.last - self.first + 1
    }

    /// The range less its last `kept` uids (those the MPS tasks share, one per MPS daemon): the
    /// uids a task may hold alone. Err, naming the flag and the size needed, when that would
    /// leave none.
    pub fn without_last(&self, kept: u32) -> Result<UidRange, String> {
        let (first, last) = (self.first, self.last);
        if self.size() <= kept {
            return Err(format!(
                "--task-uid-range {first}-{last} holds {} uids: the last {kept} are kept for MPS tasks \
                 (one per MPS daemon of this host) and tasks need at least one more; give it at least {} uids",
                self.size(),
                u64::from(kept) + 1
            ));
        }
        Ok(UidRange { first, last: last - kept })
    }

    /// The first uid of the range from `after` on (wrapping around) that is not in `in_use`
    /// and for which `taken` says no; None when every one is.
    pub fn allocate(
        &self,
        after: Option<u32>,
        in_use: &std::collections::BTreeSet<u32>,
        taken: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        let start = match after {
            Some(a) if self.contains(a) && a < self.last => a + 1,
            _ => self.first,
        };
        (start..=self.last).chain(self.first..start).find(|uid| !in_use.contains(uid) && !taken(*uid))
    }
}

/// The agent's own (real) uid.
pub fn agent_uid() -> u32 {
    Uid::current().as_raw()
}

/// Whether anything on this host has `uid` already: an entry in the password database, or a
/// process (its `/proc/PID` is owned by its effective uid). A task uid is never handed out
/// while a process left over from an earlier task still runs as it.
pub fn uid_taken_on_host(uid: u32) -> bool {
    in_passwd(uid) || process_uids().contains(&uid)
}

/// Whether the password database has an entry for `uid`.
pub fn in_passwd(uid: u32) -> bool {
    matches!(User::from_uid(Uid::from_raw(uid)), Ok(Some(_)))
}

/// The effective uids of every process on the host now.
pub fn process_uids() -> std::collections::BTreeSet<u32> {
    mpsfleet_proc::process_uids()
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
    /// as root), or takes the task's own `task_user` when there is no `user`, and merges the
    /// environment basics under `env`.
    pub fn new(
        env: &[(String, String)],
        user: Option<&str>,
        task_user: Option<&TaskUser>,
    ) -> Result<ExecContext, UserError> {
        let user = match (user, task_user) {
            (Some(spec), _) => {
                check_may_switch(Uid::current().is_root(), spec)?;
                Some(resolve_user(spec)?)
            }
            (None, Some(t)) => {
                check_may_switch(Uid::current().is_root(), &t.uid.to_string())?;
                Some(ResolvedUser {
                    spec: t.uid.to_string(),
                    uid: t.uid,
                    gid: t.uid,
                    home: Some(t.home.clone()),
                })
            }
            (None, None) => None,
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
    fn uid_ranges_are_checked() {
        assert_eq!(UidRange::parse("200000-299999", 0), Ok(UidRange { first: 200_000, last: 299_999 }));
        assert_eq!(UidRange::parse("5-5", 0), Ok(UidRange { first: 5, last: 5 }));
        let err = |v: &str, agent: u32| UidRange::parse(v, agent).unwrap_err();
        assert!(err("0-10", 1000).contains("holds uid 0 (root)"), "{}", err("0-10", 1000));
        assert!(err("900-1100", 1000).contains("the agent's own uid 1000"));
        assert!(err("60000-70000", 0).contains("65534"));
        assert!(err("20-10", 0).contains("above the last"));
        assert!(err("10", 0).contains("FIRST-LAST"));
        assert!(err("a-10", 0).contains("not a uid"));
        assert!(err("-1-10", 0).contains("not a uid"));
        assert!(err("70000-4294967295", 0).contains("below"));
        assert!(DEFAULT_TASK_UIDS.validate(0).is_ok());
    }

    #[test]
    fn the_last_uids_are_kept_and_one_must_be_left() {
        let r = UidRange { first: 10, last: 13 };
        assert_eq!(r.size(), 4);
        assert_eq!(r.without_last(0), Ok(r));
        assert_eq!(r.without_last(3), Ok(UidRange { first: 10, last: 10 }));
        let err = r.without_last(4).unwrap_err();
        assert!(err.starts_with("--task-uid-range 10-13 holds 4 uids: the last 4 are kept"), "{err}");
        assert!(err.ends_with("give it at least 5 uids"), "{err}");
        assert!(r.without_last(u32::MAX).is_err());
        assert_eq!(UidRange { first: 7, last: 7 }.without_last(0), Ok(UidRange { first: 7, last: 7 }));
    }

    #[test]
    fn allocation_skips_what_is_in_use_and_wraps() {
        let r = UidRange { first: 10, last: 13 };
        let none = std::collections::BTreeSet::new();
        assert_eq!(r.allocate(None, &none, |_| false), Some(10));
        assert_eq!(r.allocate(Some(10), &none, |_| false), Some(11));
        assert_eq!(r.allocate(Some(13), &none, |_| false), Some(10), "wraps after the last");
        assert_eq!(r.allocate(Some(500), &none, |_| false), Some(10));
        let used: std::collections::BTreeSet<u32> = [11, 12].into();
        assert_eq!(r.allocate(Some(10), &used, |_| false), Some(13));
        assert_eq!(r.allocate(Some(10), &used, |u| u == 13), Some(10));
        let all: std::collections::BTreeSet<u32> = [10, 11, 12, 13].into();
        assert_eq!(r.allocate(None, &all, |_| false), None);
        // Root's uid is taken on every host (it is in the password database), and so is the
        // uid this test runs as (a process runs as it).
        assert!(uid_taken_on_host(0));
        assert!(process_uids().contains(&agent_uid()));
    }

    #[test]
    fn a_task_user_runs_as_its_uid_with_its_home() {
        let t = TaskUser { uid: 200_123, home: "/run/x/home/t-1".into() };
        match ExecContext::new(&[], None, Some(&t)) {
            Ok(ctx) => {
                let u = ctx.user.expect("a user");
                assert_eq!((u.uid, u.gid), (200_123, 200_123));
                assert!(ctx.env.iter().any(|(k, v)| k == "HOME" && v == "/run/x/home/t-1"));
            }
            Err(e) => assert!(!Uid::current().is_root(), "{e}"),
        }
        // A named user wins over the task's uid.
        if Uid::current().is_root() {
            let ctx = ExecContext::new(&[], Some("root"), Some(&t)).unwrap();
            assert_eq!(ctx.user.unwrap().uid, 0);
        }
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
