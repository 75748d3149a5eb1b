//! How the agent names and labels what it creates in Docker: a container's name is derived
//! from its host, task and container, so it is found again by name after a restart, and its
//! labels say whose it is (mpsfleet's own keys, and ECS's for tools that read them).

/// Label keys mpsfleet sets on every container it creates; they win over `dockerLabels`.
pub const LABEL_HOST: &str = "io.mpsfleet.host";
pub const LABEL_TASK: &str = "io.mpsfleet.task";
pub const LABEL_CONTAINER: &str = "io.mpsfleet.container";
pub const LABEL_FAMILY: &str = "io.mpsfleet.family";
pub const LABEL_REVISION: &str = "io.mpsfleet.revision";
/// ECS's own labels, for tools that read them.
pub const ECS_LABEL_CONTAINER: &str = "com.amazonaws.ecs.container-name";
pub const ECS_LABEL_FAMILY: &str = "com.amazonaws.ecs.task-definition-family";
pub const ECS_LABEL_REVISION: &str = "com.amazonaws.ecs.task-definition-version";

/// `mpsfleet-<host>-<task>-<container>`, with every character Docker does not allow in a
/// name (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`) replaced by `-`. Deterministic, so that a container is
/// found again by name after a restart, even one created just before a crash.
pub fn container_name(host_id: &str, task_id: &str, container: &str) -> String {
    let raw = format!("mpsfleet-{host_id}-{task_id}-{container}");
    raw.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '-' })
        .collect()
}
