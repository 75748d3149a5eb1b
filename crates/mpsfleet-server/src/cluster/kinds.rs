//! The kinds records are stored under (`Store` keys are kind and name), in one place for
//! every room that writes one.

pub(super) const POOL: &str = "pool";
pub(super) const HOST: &str = "host";
pub(super) const TASKDEF: &str = "taskdef";
pub(super) const TASK: &str = "task";
pub(super) const SERVICE: &str = "service";
pub(super) const AUTH: &str = "auth";
pub(super) const INCIDENT: &str = "incident";
pub(super) const DELETED: &str = "deleted";
pub(super) const DRILL: &str = "drill";
pub(super) const DRILL_SWITCH: &str = "drill-switch";
