//! Who a task runs as: the host's task uids (`--task-uid-range`), the uid the MPS tasks of a
//! GPU share, and the choice of a free uid for each task, with its home directory.

use super::*;

/// Who tasks run as on this host.
#[derive(Debug, Clone, Default)]
pub struct TaskUsers {
    /// The uids tasks get (all of `--task-uid-range`); None when the agent does not run as
    /// root (tasks then run as the agent's user).
    pub range: Option<UidRange>,
    /// The uid the MPS tasks of each GPU share, by GPU: `last - index` of the range for one
    /// daemon per GPU, `last` for every GPU with one daemon per host.
    pub mps: BTreeMap<GpuUuid, MpsUid>,
    /// How many of the range's last uids are kept for MPS tasks (and never a task's own).
    pub mps_kept: u32,
    /// Where each task's own directory goes (`<home_root>/<task id>`); made mode 0711, root's.
    pub home_root: PathBuf,
}

/// The uid the MPS tasks of one MPS daemon share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsUid {
    pub uid: u32,
    /// The daemon: its GPU's index, or `all` (one daemon per host).
    pub daemon: String,
}

impl TaskUsers {
    /// Who tasks run as on a host with `gpus`: with `home_root` (the agent runs as root), uids
    /// of `range`, its last ones kept for the MPS tasks of each daemon (one daemon per GPU, or
    /// one for all with `daemon_per_host`); without, the agent's own user. Err (naming the flag)
    /// when the range cannot hold one uid per daemon and one more.
    pub fn new(
        range: UidRange,
        home_root: Option<PathBuf>,
        gpus: &[GpuInventory],
        daemon_per_host: bool,
    ) -> Result<TaskUsers, String> {
        let kept = match gpus.iter().map(|g| g.index).max() {
            None => 0,
            Some(_) if daemon_per_host => 1,
            Some(max) => max.saturating_add(1),
        };
        range.without_last(kept)?;
        let Some(home_root) = home_root else { return Ok(TaskUsers::default()) };
        let mps = gpus
            .iter()
            .map(|g| {
                let (uid, daemon) = if daemon_per_host {
                    (range.last, "all".to_string())
                } else {
                    (range.last - g.index, g.index.to_string())
                };
                (g.uuid.clone(), MpsUid { uid, daemon })
            })
            .collect();
        Ok(TaskUsers { range: Some(range), mps, mps_kept: kept, home_root })
    }

    /// The uids a task may hold alone: the range less the uids kept for MPS tasks.
    pub(super) fn own_uids(&self) -> Option<UidRange> {
        let range = self.range?;
        Some(UidRange { first: range.first, last: range.last - self.mps_kept.min(range.size() - 1) })
    }
}

/// Who a task runs as, as [`pick_user`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick {
    /// As its definition's users, or the agent's user: no task uid.
    NoTaskUid,
    /// A uid of its own.
    Own(u32),
    /// The uid the MPS tasks of its GPU share.
    SharedMps(u32),
}

/// What the host says of a uid, for [`pick_user`] (a seam for tests).
pub(super) struct HostUids<'a> {
    pub(super) in_passwd: &'a dyn Fn(u32) -> bool,
    /// The uids processes run as now (read once per uid handed out).
    pub(super) processes: &'a dyn Fn() -> BTreeSet<u32>,
}

/// Who a task's process containers run as: a `user` of their definition only when the pool
/// allows it (Err otherwise); else, when the agent runs as root and a process container names
/// no `user`, a task uid. That is the uid its GPU's MPS tasks share when such a container is
/// given an MPS share (so that they all reach the daemon's one server at the same time), and
/// otherwise a uid of its own: the next one after `last_uid` of the range less the uids kept
/// for MPS tasks, held by no task that has not stopped, in no password database entry and run
/// by no process. Err is the reason the task does not start.
pub(super) fn pick_user(
    users: &TaskUsers,
    engine: &Engine,
    tasks: &BTreeMap<TaskId, Local>,
    last_uid: Option<u32>,
    rec: &Record,
    allow_task_users: bool,
    host: &HostUids,
) -> Result<Pick, String> {
    let process: Vec<(usize, &ContainerDefinition)> = rec
        .definition
        .container_definitions
        .iter()
        .enumerate()
        .filter(|(_, c)| runs_as_process(engine, c))
        .collect();
    if !allow_task_users {
        if let Some((i, _)) = process.iter().find(|(_, c)| c.user.is_some()) {
            let pool = &rec.task.pool;
            return Err(format!(
                "containerDefinitions[{i}].user: pool {pool} does not let process tasks choose their \
                 user (pool update {pool} --allow-task-users true)"
            ));
        }
    }
    let (Some(range), Some(own)) = (users.range, users.own_uids()) else { return Ok(Pick::NoTaskUid) };
    let unnamed: Vec<&ContainerDefinition> =
        process.iter().filter(|(_, c)| c.user.is_none()).map(|(_, c)| *c).collect();
    if unnamed.is_empty() {
        return Ok(Pick::NoTaskUid);
    }
    let live = || tasks.values().filter(|l| l.rec.status != TaskStatus::Stopped);
    let mps_share = unnamed.iter().any(|c| matches!(c.gpu(), Some(GpuRequirement::Mps { .. })));
    // An MPS task on a GPU without a daemon here gets a uid of its own: it does not start (its
    // launch fails closed), and it never runs as root.
    if let Some((gpu, mps)) =
        rec.task.gpu_ids.first().filter(|_| mps_share).and_then(|g| users.mps.get(g).map(|m| (g, m)))
    {
        let uid = mps.uid;
        let kept = format!(
            "uid {uid}, kept in --task-uid-range {}-{} for the MPS tasks of GPU {gpu}",
            range.first, range.last
        );
        if (host.in_passwd)(uid) {
            return Err(format!(
                "{kept}, is in the password database: MPS tasks would share it with that user \
                 (choose a --task-uid-range without it)"
            ));
        }
        // Only the MPS tasks of this daemon may hold it: after a change of the range or of the
        // GPUs, a task adopted with it as its own (or for another daemon) keeps it until it stops.
        let foreign = live().find(|l| {
            let held = l.rec.task_user.as_ref().is_some_and(|u| u.uid == uid);
            let same_daemon = l.rec.shared_uid
                && l.rec.task.gpu_ids.first().and_then(|g| users.mps.get(g)).is_some_and(|m| m.uid == uid);
            held && !same_daemon
        });
        if let Some(other) = foreign {
            return Err(format!(
                "{kept} (daemon {}), is still held by task {}, which is not one of them; it is free once \
                 that task has stopped",
                mps.daemon, other.rec.task.id
            ));
        }
        return Ok(Pick::SharedMps(uid));
    }
    let in_use: BTreeSet<u32> = live().filter_map(|l| l.rec.task_user.as_ref().map(|u| u.uid)).collect();
    let procs = (host.processes)();
    let taken = |uid: u32| procs.contains(&uid) || (host.in_passwd)(uid);
    let uid = own.allocate(last_uid, &in_use, taken).ok_or_else(|| {
        let kept = match users.mps_kept {
            0 => String::new(),
            n => format!("; the last {n} are kept for MPS tasks"),
        };
        format!(
            "no free uid in --task-uid-range {}-{} ({} tasks hold one; the others are in the \
             password database or run processes{kept})",
            range.first,
            range.last,
            in_use.iter().filter(|u| own.contains(**u)).count()
        )
    })?;
    Ok(Pick::Own(uid))
}

/// Makes a task's own directory: empty, mode 0700, owned by its uid and gid, in a directory only
/// root may change. Whatever was there before (from an earlier run) is removed first, without
/// following links.
pub(super) fn make_home(home: &Path, uid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    crate::safe_fs::remove_tree(home)?;
    std::fs::DirBuilder::new().mode(0o700).create(home)?;
    std::os::unix::fs::lchown(home, Some(uid), Some(uid))?;
    crate::safe_fs::set_dir_mode(home, 0o700)
}

/// A stopped task gives its uid back and its directory is removed (no link followed), so that
/// the next task with that uid finds nothing of it.
pub(super) fn release_user(rec: &mut Record) {
    let Some(user) = rec.task_user.take() else { return };
    if let Err(e) = crate::safe_fs::remove_tree(&user.home) {
        tracing::warn!(task.id = %rec.task.id, home = %user.home.display(), error = %e, "cannot remove the task's directory");
    }
}
