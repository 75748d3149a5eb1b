//! A corpus of task definitions in the shapes ECS users write and `describe-task-definition`
//! prints: services with sidecars, FireLens, EFS, bind mounts, private registries, Windows,
//! GPUs. Every one registers unchanged, and every field it uses is either honoured or reported
//! in `ignoredFields` (never silently dropped): the described definition registers again to the
//! same definition, and each top-level and container key of the document is either kept in
//! the definition or listed.

use mpsfleet_core::taskdef::parse_task_definition;
use serde_json::Value;
use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("corpus");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

/// The keys of a JSON object that hold something (ECS's describe output has empty lists).
fn present_keys(v: &Value) -> Vec<String> {
    let empty = |v: &Value| match v {
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Null => true,
        _ => false,
    };
    v.as_object()
        .map(|o| o.iter().filter(|(_, v)| !empty(v)).map(|(k, _)| k.clone()).collect())
        .unwrap_or_default()
}

#[test]
fn every_corpus_definition_registers_and_uses_or_reports_each_field() {
    let files = corpus();
    assert!(files.len() >= 14, "{}", files.len());
    for (name, bytes) in files {
        let parsed = parse_task_definition(&bytes).unwrap_or_else(|e| panic!("{name} refused: {e}"));
        let described = serde_json::to_value(&parsed.definition).unwrap();
        let again = parse_task_definition(&serde_json::to_vec(&described).unwrap())
            .unwrap_or_else(|e| panic!("{name}: the described form is refused: {e}"));
        assert_eq!(again.definition, parsed.definition, "{name} changed on a second registration");

        let doc: Value = serde_json::from_slice(&bytes).unwrap();
        let reported = |path: &str| parsed.ignored_fields.iter().any(|f| f == path);
        // Fields mpsfleet keeps under another form or derives (registration metadata).
        let metadata = ["revision", "taskDefinitionArn", "status", "registeredAt", "registeredBy"];
        for key in present_keys(&doc) {
            let kept = present_keys(&described).contains(&key);
            assert!(
                kept || reported(&key) || metadata.contains(&key.as_str()),
                "{name}: top-level {key} is neither used nor reported ({:?})",
                parsed.ignored_fields
            );
        }
        let containers = doc["containerDefinitions"].as_array().unwrap();
        for (i, c) in containers.iter().enumerate() {
            let kept_container = &described["containerDefinitions"][i];
            for key in present_keys(c) {
                let path = format!("containerDefinitions[{i}].{key}");
                let kept = present_keys(kept_container).contains(&key);
                assert!(
                    kept || reported(&path),
                    "{name}: {path} is neither used nor reported ({:?})",
                    parsed.ignored_fields
                );
            }
        }
    }
}
