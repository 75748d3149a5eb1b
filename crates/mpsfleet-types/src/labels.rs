//! What a task run attaches to its tasks, as ECS takes it: `overrides`, `startedBy`, `group`
//! and tags.

pub use crate::tags::{check_tags, merge_tags, Tag, MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE};
use crate::taskdef::{KeyValuePair, TaskDefinition};
use serde::{Deserialize, Serialize};

/// The longest `startedBy` and `group` of a task run.
pub const MAX_STARTED_BY: usize = 128;
pub const MAX_GROUP: usize = 255;

/// What a task's run and later calls attached to it: ECS's `overrides`, `startedBy`, `group`
/// and tags. Rarely set, so a task holds one pointer for all of them ([`crate::Task::labels`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskLabels {
    /// What the run changed of its definition's containers; the host runs the definition with
    /// them applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<TaskOverride>,
    /// The label and group its run was given (ECS's `startedBy` and `group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<Tag>,
    /// Scale-in protection (ECS's task protection) until this time: its service neither
    /// scales it in nor replaces it in a deployment before then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected_until_ms: Option<u64>,
}

/// The longest scale-in protection one call gives, in minutes (ECS's: 48 hours).
pub const MAX_PROTECTION_MINUTES: u32 = 2_880;
/// Scale-in protection when a call gives no time, in minutes (ECS's: 2 hours).
pub const DEFAULT_PROTECTION_MINUTES: u32 = 120;

impl TaskLabels {
    pub fn is_empty(&self) -> bool {
        self == &TaskLabels::default()
    }
}

/// What a task run changes of its definition's containers (ECS's `overrides`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskOverride {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_overrides: Vec<ContainerOverride>,
}

/// One container's override (ECS's `ContainerOverride`): what is given replaces the
/// definition's; `environment` adds to it, a name given replacing the definition's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerOverride {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<KeyValuePair>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reservation: Option<u64>,
}

/// The most container overrides, command words and environment entries one run may give.
pub const MAX_OVERRIDE_ITEMS: usize = 1000;
/// The most bytes of an override's command and environment together.
pub const MAX_OVERRIDE_BYTES: usize = 8192;

impl TaskOverride {
    /// Checks the overrides against `td`: every name is one of its containers, once; the sizes
    /// stay within ECS's 8 KiB. The error is `(field, message)`.
    pub fn check(&self, td: &TaskDefinition) -> Result<(), (String, String)> {
        let mut bytes = 0;
        for (i, o) in self.container_overrides.iter().enumerate() {
            let at = format!("overrides.containerOverrides[{i}]");
            if !td.container_definitions.iter().any(|c| c.name == o.name) {
                return Err((
                    format!("{at}.name"),
                    format!("{} has no container {:?}", td.reference(), o.name),
                ));
            }
            if self.container_overrides[..i].iter().any(|p| p.name == o.name) {
                return Err((format!("{at}.name"), format!("container {:?} is given twice", o.name)));
            }
            let items = o.command.as_ref().map_or(0, Vec::len) + o.environment.len();
            if items > MAX_OVERRIDE_ITEMS {
                return Err((at, format!("at most {MAX_OVERRIDE_ITEMS} command words and variables")));
            }
            bytes += o.command.iter().flatten().map(String::len).sum::<usize>();
            bytes += o.environment.iter().map(|e| e.name.len() + e.value.len()).sum::<usize>();
            if let Some(e) = o.environment.iter().find(|e| e.name.is_empty() || e.name.contains(['=', '\0']))
            {
                return Err((format!("{at}.environment"), format!("{:?} is not a variable name", e.name)));
            }
        }
        if self.container_overrides.len() > MAX_OVERRIDE_ITEMS || bytes > MAX_OVERRIDE_BYTES {
            return Err((
                "overrides".into(),
                format!("at most {MAX_OVERRIDE_BYTES} bytes of commands and variables, got {bytes}"),
            ));
        }
        Ok(())
    }

    /// `td` with these overrides applied: what the task's host runs.
    pub fn apply(&self, td: &TaskDefinition) -> TaskDefinition {
        let mut out = td.clone();
        for o in &self.container_overrides {
            let Some(c) = out.container_definitions.iter_mut().find(|c| c.name == o.name) else { continue };
            if let Some(cmd) = &o.command {
                c.command = cmd.clone();
            }
            for e in &o.environment {
                match c.environment.iter_mut().find(|x| x.name == e.name) {
                    Some(x) => x.value = e.value.clone(),
                    None => c.environment.push(e.clone()),
                }
            }
            c.cpu = o.cpu.or(c.cpu);
            c.memory = o.memory.or(c.memory);
            c.memory_reservation = o.memory_reservation.or(c.memory_reservation);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(k: &str, v: &str) -> Tag {
        Tag { key: k.into(), value: v.into() }
    }

    #[test]
    fn tags_are_checked_as_ecs_checks_them() {
        assert!(check_tags("tags", &[tag("team", "ml"), tag("env", "")]).is_ok());
        assert_eq!(check_tags("tags", &[tag("", "x")]).unwrap_err().0, "tags[0].key");
        assert_eq!(check_tags("tags", &[tag("a", "1"), tag("a", "2")]).unwrap_err().0, "tags[1].key");
        assert!(check_tags("tags", &[tag("aws:x", "1")]).unwrap_err().1.contains("reserved"));
        assert!(check_tags("tags", &[tag(&"k".repeat(129), "1")]).is_err());
        assert!(check_tags("tags", &[tag("k", &"v".repeat(257))]).is_err());
        let many: Vec<Tag> = (0..51).map(|i| tag(&i.to_string(), "")).collect();
        assert!(check_tags("tags", &many).unwrap_err().1.contains("at most 50"));
        let mut t = vec![tag("a", "1")];
        merge_tags(&mut t, &[tag("a", "2"), tag("b", "3")]);
        assert_eq!(t, vec![tag("a", "2"), tag("b", "3")]);
        let mut t = vec![tag("x", "1"), tag("a", "1")];
        merge_tags(&mut t, &[tag("a", "2")]);
        assert_eq!(t, vec![tag("a", "2"), tag("x", "1")]);
    }

    #[test]
    fn overrides_replace_commands_and_add_variables_of_named_containers_only() {
        let td: TaskDefinition = serde_json::from_value(serde_json::json!({
            "family": "f", "revision": 1,
            "containerDefinitions": [
                {"name": "a", "command": ["x"], "environment": [{"name": "K", "value": "1"}], "essential": true},
                {"name": "b", "command": ["y"], "essential": true}
            ]
        }))
        .unwrap();
        let o = TaskOverride {
            container_overrides: vec![ContainerOverride {
                name: "a".into(),
                command: Some(vec!["z".into()]),
                environment: vec![
                    KeyValuePair { name: "K".into(), value: "2".into() },
                    KeyValuePair { name: "N".into(), value: "3".into() },
                ],
                memory: Some(64),
                ..Default::default()
            }],
        };
        o.check(&td).unwrap();
        let run = o.apply(&td);
        let a = &run.container_definitions[0];
        assert_eq!(a.command, vec!["z"]);
        assert_eq!(
            a.environment.iter().map(|e| (&*e.name, &*e.value)).collect::<Vec<_>>(),
            [("K", "2"), ("N", "3")]
        );
        assert_eq!(a.memory, Some(64));
        assert_eq!(run.container_definitions[1], td.container_definitions[1]);
        let wrong = TaskOverride {
            container_overrides: vec![ContainerOverride { name: "c".into(), ..Default::default() }],
        };
        assert_eq!(wrong.check(&td).unwrap_err().0, "overrides.containerOverrides[0].name");
    }
}
