//! Tags of pools, task definitions, services and tasks, as ECS takes them.

use serde::{Deserialize, Serialize};

/// One tag of a pool, task definition, service or task (ECS's `Tag`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tag {
    pub key: String,
    #[serde(default)]
    pub value: String,
}

/// The most tags one object keeps (ECS's limit).
pub const MAX_TAGS: usize = 50;
/// The longest tag key and value, in characters (ECS's limits).
pub const MAX_TAG_KEY: usize = 128;
pub const MAX_TAG_VALUE: usize = 256;

/// Checks tags as ECS does: at most [`MAX_TAGS`], keys 1 to 128 characters, values at most 256,
/// no key twice, no `aws:` prefix (reserved). The error is `(field, message)`.
pub fn check_tags(field: &str, tags: &[Tag]) -> Result<(), (String, String)> {
    if tags.len() > MAX_TAGS {
        return Err((field.into(), format!("at most {MAX_TAGS} tags, got {}", tags.len())));
    }
    for (i, t) in tags.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let (k, v) = (t.key.chars().count(), t.value.chars().count());
        if k == 0 || k > MAX_TAG_KEY {
            return Err((format!("{at}.key"), format!("must be 1 to {MAX_TAG_KEY} characters, got {k}")));
        }
        if v > MAX_TAG_VALUE {
            return Err((
                format!("{at}.value"),
                format!("must be at most {MAX_TAG_VALUE} characters, got {v}"),
            ));
        }
        if t.key.chars().chain(t.value.chars()).any(char::is_control) {
            return Err((at, "keys and values may not hold control characters".into()));
        }
        if t.key.to_ascii_lowercase().starts_with("aws:") {
            return Err((format!("{at}.key"), "the aws: prefix is reserved".into()));
        }
        if tags[..i].iter().any(|o| o.key == t.key) {
            return Err((format!("{at}.key"), format!("{:?} is given twice", t.key)));
        }
    }
    Ok(())
}

/// Merges `new` into `tags`: the new tags first, in their order, then the old ones whose key is
/// not among them.
pub fn merge_tags(tags: &mut Vec<Tag>, new: &[Tag]) {
    let old = std::mem::take(tags);
    tags.extend(new.iter().cloned());
    tags.extend(old.into_iter().filter(|o| !new.iter().any(|t| t.key == o.key)));
}
