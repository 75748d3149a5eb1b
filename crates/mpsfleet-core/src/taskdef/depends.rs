//! A container's `dependsOn` and `startTimeout`, and the checks across containers that ECS makes
//! of the dependency graph at registration: every dependency names another container of the
//! definition, `HEALTHY` only on a container with a `healthCheck`, `COMPLETE` and `SUCCESS` never
//! on an essential container, and no cycle.

use super::Result;
use super::{as_array, as_object, as_str, check_keys, describe, err, int_in, join, quote, require, to_u32};
use crate::lifecycle::dependencies::find_cycle;
use mpsfleet_types::{ContainerDefinition, ContainerDependency, DependencyCondition};
use serde_json::{Map, Value};

/// The most `dependsOn` entries of one container (there are at most 10 containers).
pub const MAX_DEPENDS_ON: usize = 10;
/// The longest `startTimeout`, in seconds (ECS sets none outside Fargate, whose limit is 120).
pub const MAX_START_TIMEOUT_SECS: u64 = 3600;

const DEPENDENCY_KEYS: &[&str] = &["containerName", "condition"];
const CONDITIONS: &[&str] = &["START", "COMPLETE", "SUCCESS", "HEALTHY"];

/// `dependsOn` and `startTimeout` of the container at `path`.
pub(super) fn parse(obj: &Map<String, Value>, path: &str) -> Result<(Vec<ContainerDependency>, Option<u32>)> {
    let depends_on = match obj.get("dependsOn") {
        Some(v) => parse_depends_on(v, &join(path, "dependsOn"))?,
        None => Vec::new(),
    };
    let start_timeout = match obj.get("startTimeout") {
        Some(v) => Some(to_u32(int_in(
            v,
            &join(path, "startTimeout"),
            0,
            MAX_START_TIMEOUT_SECS,
            " seconds (0: no limit)",
        )?)),
        None => None,
    };
    Ok((depends_on, start_timeout))
}

fn parse_depends_on(value: &Value, path: &str) -> Result<Vec<ContainerDependency>> {
    let list = as_array(value, path)?;
    if list.len() > MAX_DEPENDS_ON {
        return Err(err(path, format!("must have at most {MAX_DEPENDS_ON} entries, got {}", list.len())));
    }
    let mut out: Vec<ContainerDependency> = Vec::with_capacity(list.len());
    for (j, item) in list.iter().enumerate() {
        let item_path = format!("{path}[{j}]");
        let obj = as_object(item, &item_path)?;
        let mut unknown = Vec::new();
        check_keys(obj, &item_path, DEPENDENCY_KEYS, &[], &mut unknown)?;
        let name_path = join(&item_path, "containerName");
        let name = as_str(require(obj, &item_path, "containerName")?, &name_path)?;
        if name.is_empty() || name.len() > 255 {
            return Err(err(
                name_path,
                format!("must be a container name of 1 to 255 bytes, got {} bytes", name.len()),
            ));
        }
        let cond_path = join(&item_path, "condition");
        let cond_value = require(obj, &item_path, "condition")?;
        let condition = match cond_value.as_str() {
            Some("START") => DependencyCondition::Start,
            Some("COMPLETE") => DependencyCondition::Complete,
            Some("SUCCESS") => DependencyCondition::Success,
            Some("HEALTHY") => DependencyCondition::Healthy,
            _ => {
                return Err(err(
                    cond_path,
                    format!("must be one of {}, got {}", CONDITIONS.join(", "), describe(cond_value)),
                ))
            }
        };
        if let Some(k) = out.iter().position(|d| d.container_name == name) {
            return Err(err(name_path, format!("{} is already named by {path}[{k}]", quote(name))));
        }
        out.push(ContainerDependency { container_name: name.to_string(), condition });
    }
    Ok(out)
}

/// The checks across containers, once all are parsed (`list_path` is `containerDefinitions`).
pub(super) fn check_graph(containers: &[ContainerDefinition], list_path: &str) -> Result<()> {
    for (i, c) in containers.iter().enumerate() {
        for (j, d) in c.depends_on.iter().enumerate() {
            let at = format!("{list_path}[{i}].dependsOn[{j}]");
            let name = &d.container_name;
            if *name == c.name {
                return Err(err(
                    format!("{at}.containerName"),
                    format!("container {} cannot depend on itself", quote(name)),
                ));
            }
            let Some((k, target)) = containers.iter().enumerate().find(|(_, t)| t.name == *name) else {
                return Err(err(
                    format!("{at}.containerName"),
                    format!("must name another container of the task definition, got {}", quote(name)),
                ));
            };
            let cond = d.condition.as_str();
            match d.condition {
                DependencyCondition::Healthy if target.health_check.is_none() => {
                    return Err(err(
                        format!("{at}.condition"),
                        format!(
                            "HEALTHY needs {list_path}[{k}] ({}) to have a healthCheck, and it has none",
                            quote(name)
                        ),
                    ));
                }
                DependencyCondition::Complete | DependencyCondition::Success if target.essential => {
                    return Err(err(
                        format!("{at}.condition"),
                        format!(
                            "{cond} cannot name an essential container, as in ECS: {list_path}[{k}] ({}) is \
                             essential (set its essential to false, or use START or HEALTHY)",
                            quote(name)
                        ),
                    ));
                }
                _ => {}
            }
        }
    }
    if let Some(cycle) = find_cycle(containers) {
        let first = cycle[0];
        let names: Vec<&str> = cycle.iter().map(|&i| containers[i].name.as_str()).collect();
        let next = &containers[cycle[1]].name;
        let c = &containers[first];
        let field = match c.depends_on.iter().position(|d| d.container_name == *next) {
            Some(j) => format!("{list_path}[{first}].dependsOn[{j}].containerName"),
            None => {
                let k = c.volumes_from.iter().position(|v| v.source_container == *next).unwrap_or(0);
                format!("{list_path}[{first}].volumesFrom[{k}].sourceContainer")
            }
        };
        return Err(err(
            field,
            format!(
                "the containers' dependsOn (and volumesFrom) form a cycle: {}; none could start",
                names.join(" -> ")
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::parse_task_definition;
    use mpsfleet_types::{ContainerDependency, DependencyCondition as C};
    use serde_json::{json, Value};

    /// A task of containers `(name, essential, extra fields)`; each runs `sleep 1`.
    fn task(containers: &[(&str, bool, Value)]) -> String {
        let list: Vec<Value> = containers
            .iter()
            .map(|(name, essential, extra)| {
                let mut c = json!({"name": name, "essential": essential, "command": ["sleep", "1"]});
                if let (Some(o), Some(x)) = (c.as_object_mut(), extra.as_object()) {
                    o.extend(x.clone());
                }
                c
            })
            .collect();
        json!({"family": "f", "containerDefinitions": list}).to_string()
    }

    fn hc() -> Value {
        json!({"command": ["CMD", "true"]})
    }

    #[test]
    fn depends_on_and_start_timeout_table() {
        let dep = |name: &str, cond: &str| json!({"dependsOn": [{"containerName": name, "condition": cond}]});
        let p0 = "containerDefinitions[0]";
        let p1 = "containerDefinitions[1]";
        // (definition, Ok(()) or Err((field, words)))
        type Case = (String, Result<(), (String, Vec<&'static str>)>);
        let refused = |field: String, words: &[&'static str]| Err((field, words.to_vec()));
        let cases: Vec<Case> = vec![
            (task(&[("app", true, dep("db", "START")), ("db", true, json!({}))]), Ok(())),
            (task(&[("app", true, dep("db", "HEALTHY")), ("db", true, json!({"healthCheck": hc()}))]), Ok(())),
            (task(&[("app", true, dep("init", "SUCCESS")), ("init", false, json!({}))]), Ok(())),
            (task(&[("app", true, dep("init", "COMPLETE")), ("init", false, json!({}))]), Ok(())),
            (task(&[("app", true, json!({"startTimeout": 0}))]), Ok(())),
            (task(&[("app", true, json!({"startTimeout": 3600}))]), Ok(())),
            (
                task(&[("app", true, json!({"startTimeout": 3601}))]),
                refused(format!("{p0}.startTimeout"), &["from 0 to 3600 seconds", "3601"]),
            ),
            (
                task(&[("app", true, json!({"startTimeout": "60"}))]),
                refused(format!("{p0}.startTimeout"), &["integer from 0 to 3600"]),
            ),
            (
                task(&[("app", true, dep("app", "START"))]),
                refused(format!("{p0}.dependsOn[0].containerName"), &["cannot depend on itself"]),
            ),
            (
                task(&[("app", true, dep("nobody", "START"))]),
                refused(format!("{p0}.dependsOn[0].containerName"), &["another container", "\"nobody\""]),
            ),
            (
                task(&[("app", true, dep("db", "READY")), ("db", true, json!({}))]),
                refused(format!("{p0}.dependsOn[0].condition"), &["START, COMPLETE, SUCCESS, HEALTHY", "READY"]),
            ),
            (
                task(&[("app", true, json!({"dependsOn": [{"containerName": "db"}]})), ("db", true, json!({}))]),
                refused(format!("{p0}.dependsOn[0].condition"), &["is required"]),
            ),
            (
                task(&[("app", true, json!({"dependsOn": [{"condition": "START"}]}))]),
                refused(format!("{p0}.dependsOn[0].containerName"), &["is required"]),
            ),
            (
                task(&[
                    ("app", true, json!({"dependsOn": [{"containerName": "db", "condition": "START", "x": 1}]})),
                    ("db", true, json!({})),
                ]),
                refused(format!("{p0}.dependsOn[0].x"), &["unknown field"]),
            ),
            (
                task(&[("app", true, json!({"dependsOn": {"containerName": "db"}}))]),
                refused(format!("{p0}.dependsOn"), &["must be an array"]),
            ),
            (
                task(&[
                    (
                        "app",
                        true,
                        json!({"dependsOn": [
                            {"containerName": "db", "condition": "START"},
                            {"containerName": "db", "condition": "HEALTHY"}
                        ]}),
                    ),
                    ("db", true, json!({"healthCheck": hc()})),
                ]),
                refused(format!("{p0}.dependsOn[1].containerName"), &["already named by", "dependsOn[0]"]),
            ),
            (
                task(&[("app", true, dep("db", "HEALTHY")), ("db", true, json!({}))]),
                refused(format!("{p0}.dependsOn[0].condition"), &["HEALTHY needs", p1, "healthCheck"]),
            ),
            (
                task(&[("app", true, dep("db", "SUCCESS")), ("db", true, json!({}))]),
                refused(format!("{p0}.dependsOn[0].condition"), &["SUCCESS cannot name an essential", p1]),
            ),
            (
                // essential is true when omitted
                json!({"family": "f", "containerDefinitions": [
                    {"name": "app", "command": ["x"], "dependsOn": [{"containerName": "db", "condition": "COMPLETE"}]},
                    {"name": "db", "command": ["x"]}
                ]})
                .to_string(),
                refused(format!("{p0}.dependsOn[0].condition"), &["COMPLETE cannot name an essential"]),
            ),
            (
                task(&[("a", true, dep("b", "START")), ("b", true, dep("c", "START")), ("c", true, dep("a", "START"))]),
                refused(format!("{p0}.dependsOn[0].containerName"), &["form a cycle: a -> b -> c -> a"]),
            ),
            (
                task(&[
                    ("a", true, json!({"volumesFrom": [{"sourceContainer": "b"}]})),
                    ("b", true, dep("a", "START")),
                ]),
                refused(format!("{p0}.volumesFrom[0].sourceContainer"), &["form a cycle: a -> b -> a"]),
            ),
            (
                task(&[("x", true, dep("a", "START")), ("a", true, dep("b", "START")), ("b", true, dep("a", "START"))]),
                refused(format!("{p1}.dependsOn[0].containerName"), &["form a cycle: a -> b -> a"]),
            ),
        ];
        for (doc, want) in cases {
            let got = parse_task_definition(doc.as_bytes());
            match (got, want) {
                (Ok(_), Ok(())) => {}
                (Err(all), Err((field, words))) => {
                    let e = all.first();
                    assert_eq!(e.field, field, "{doc}: {e}");
                    for w in words {
                        assert!(e.message.contains(w), "{doc}: {:?} lacks {w:?}", e.message);
                    }
                }
                (got, want) => panic!("{doc}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn at_most_ten_entries() {
        let many: Vec<Value> =
            (0..11).map(|i| json!({"containerName": format!("c{i}"), "condition": "START"})).collect();
        let e =
            parse_task_definition(task(&[("app", true, json!({"dependsOn": many}))]).as_bytes()).unwrap_err();
        let e = e.first();
        assert_eq!(e.field, "containerDefinitions[0].dependsOn");
        assert!(e.message.contains("at most 10 entries, got 11"), "{e}");
    }

    #[test]
    fn parsed_dependencies_are_used_not_ignored_and_round_trip() {
        let doc = task(&[
            (
                "app",
                true,
                json!({"dependsOn": [{"containerName": "db", "condition": "HEALTHY"},
                                               {"containerName": "init", "condition": "SUCCESS"}]}),
            ),
            ("db", true, json!({"healthCheck": hc(), "startTimeout": 60})),
            ("init", false, json!({})),
        ]);
        let p = parse_task_definition(doc.as_bytes()).unwrap();
        assert!(p.ignored_fields.is_empty(), "{:?}", p.ignored_fields);
        let c = &p.definition.container_definitions;
        assert_eq!(
            c[0].depends_on,
            [
                ContainerDependency { container_name: "db".into(), condition: C::Healthy },
                ContainerDependency { container_name: "init".into(), condition: C::Success },
            ]
        );
        assert_eq!(c[1].start_timeout, Some(60));
        // As described, it registers again to the same definition.
        let described = serde_json::to_vec(&p.definition).unwrap();
        let again = parse_task_definition(&described).unwrap();
        assert_eq!(again.definition.container_definitions, p.definition.container_definitions);
    }
}
