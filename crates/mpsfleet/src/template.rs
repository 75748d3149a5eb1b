//! `-o jsonpath=TEMPLATE`, `-o custom-columns=SPEC`, `-o name` and `--sort-by`: kubectl's
//! template syntax over the API's JSON.
//!
//! A template is literal text with `{…}` actions: `{.path}` prints what the path selects
//! (several results separated by spaces; strings as they are, anything else as JSON),
//! `{range .path}…{end}` repeats its body for each result with that result as `.`, and
//! `{"text"}` prints text with `\n`, `\t` and `\\` escapes. Paths are RFC 9535 JSONPath
//! (`serde_json_path`) written from `.`, or from `$` for the root. A list is given to
//! templates as kubectl gives one, `{"items": [...]}`, so `{.items[*].id}` lists ids.

use serde_json::Value;
use serde_json_path::JsonPath;

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template(Vec<Part>);

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Path(Path),
    Range(Path, Vec<Part>),
}

/// A path, and whether it starts at the root (`$`) rather than the current item (`.`).
#[derive(Debug, Clone)]
struct Path {
    path: JsonPath,
    from_root: bool,
}

/// The most a template or a column spec may be, so that a typo cannot make a huge parse.
const MAX_TEMPLATE: usize = 4096;

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        if text.len() > MAX_TEMPLATE {
            return Err(format!("the template is {} bytes; at most {MAX_TEMPLATE}", text.len()));
        }
        let mut rest = text;
        let (parts, end) = parse_parts(&mut rest)?;
        if end {
            return Err("{end} without a {range}".into());
        }
        Ok(Template(parts))
    }

    /// The text the template makes of `root`.
    pub fn render(&self, root: &Value) -> String {
        let mut out = String::new();
        render(&self.0, root, root, &mut out);
        out
    }
}

/// Parses parts up to the end of the text or an `{end}` (true when it stopped at one).
fn parse_parts(rest: &mut &str) -> Result<(Vec<Part>, bool), String> {
    let mut parts = Vec::new();
    while !rest.is_empty() {
        let Some(open) = rest.find('{') else {
            parts.push(Part::Text(rest.to_string()));
            *rest = "";
            break;
        };
        if open > 0 {
            parts.push(Part::Text(rest[..open].to_string()));
        }
        let close = action_end(&rest[open..]).ok_or_else(|| format!("unclosed {{ in {:?}", &rest[open..]))?;
        let action = rest[open + 1..open + close].trim();
        *rest = &rest[open + close + 1..];
        if action == "end" {
            return Ok((parts, true));
        }
        if let Some(path) = action.strip_prefix("range ") {
            let path = parse_path(path.trim())?;
            let (body, ended) = parse_parts(rest)?;
            if !ended {
                return Err(format!("{{range {}}} without its {{end}}", action.trim_start_matches("range ")));
            }
            parts.push(Part::Range(path, body));
        } else if let Some(quoted) = action.strip_prefix('"').and_then(|a| a.strip_suffix('"')) {
            parts.push(Part::Text(unescape(quoted)));
        } else {
            parts.push(Part::Path(parse_path(action)?));
        }
    }
    Ok((parts, false))
}

/// Where the action that starts `s` (at its `{`) ends: its `}`, skipping quoted text.
fn action_end(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// `.a.b[*]` (from the current item), `$.a` (from the root), or `.` (the item itself).
fn parse_path(text: &str) -> Result<Path, String> {
    let (body, from_root) = match text {
        "." | "@" => ("$".to_string(), false),
        t if t.starts_with('$') => (t.to_string(), true),
        t if t.starts_with('.') || t.starts_with('[') => (format!("${t}"), false),
        t => return Err(format!("{t:?} is not a path: write .field, .items[*].field or $.field")),
    };
    let path = JsonPath::parse(&body).map_err(|e| format!("{text:?}: {e}"))?;
    Ok(Path { path, from_root })
}

fn select<'a>(p: &Path, root: &'a Value, here: &'a Value) -> Vec<&'a Value> {
    p.path.query(if p.from_root { root } else { here }).all()
}

fn render(parts: &[Part], root: &Value, here: &Value, out: &mut String) {
    for part in parts {
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Path(p) => {
                let texts: Vec<String> = select(p, root, here).into_iter().map(scalar).collect();
                out.push_str(&texts.join(" "));
            }
            Part::Range(p, body) => {
                for item in select(p, root, here) {
                    render(body, root, item, out);
                }
            }
        }
    }
}

/// A value as a template prints it: a string as it is, anything else as JSON.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `custom-columns=HEADER:PATH[,HEADER:PATH...]`.
#[derive(Debug, Clone)]
pub struct Columns(Vec<(String, Path)>);

impl Columns {
    pub fn parse(spec: &str) -> Result<Columns, String> {
        if spec.len() > MAX_TEMPLATE {
            return Err(format!("the column spec is {} bytes; at most {MAX_TEMPLATE}", spec.len()));
        }
        let mut cols = Vec::new();
        for col in spec.split(',') {
            let (header, path) = col
                .split_once(':')
                .ok_or_else(|| format!("column {col:?} is not HEADER:PATH (for example ID:.id)"))?;
            if header.is_empty() {
                return Err(format!("column {col:?} has no header"));
            }
            cols.push((header.to_string(), parse_path(path.trim())?));
        }
        Ok(Columns(cols))
    }

    pub fn headers(&self) -> Vec<&str> {
        self.0.iter().map(|(h, _)| h.as_str()).collect()
    }

    /// One row per item: each column's results joined with commas, `<none>` for none.
    pub fn rows(&self, items: &[&Value], root: &Value) -> Vec<Vec<String>> {
        items
            .iter()
            .map(|item| {
                self.0
                    .iter()
                    .map(|(_, p)| {
                        let found: Vec<String> = select(p, root, item).into_iter().map(scalar).collect();
                        if found.is_empty() {
                            "<none>".to_string()
                        } else {
                            found.join(",")
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

/// The order `--sort-by PATH` puts `items` in (stable; missing values first, then numbers,
/// then strings, each ascending), as indexes.
pub fn sort_order(items: &[&Value], path: &str) -> Result<Vec<usize>, String> {
    let p = parse_path(path)?;
    let keys: Vec<Option<Value>> =
        items.iter().map(|it| select(&p, it, it).first().map(|v| (*v).clone())).collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| compare(keys[a].as_ref(), keys[b].as_ref()));
    Ok(order)
}

fn compare(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, _) => Ordering::Less,
        (_, None) => Ordering::Greater,
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            x.as_f64().unwrap_or(0.0).total_cmp(&y.as_f64().unwrap_or(0.0))
        }
        (Some(Value::Number(_)), Some(_)) => Ordering::Less,
        (Some(_), Some(Value::Number(_))) => Ordering::Greater,
        (Some(x), Some(y)) => scalar(x).cmp(&scalar(y)),
    }
}

/// `-l key=value,key!=value,key`: which objects of a list to keep, by their tags (a task's
/// are its run's, `labels.tags`).
#[derive(Debug, Clone, Default)]
pub struct Selector(Vec<(String, Want)>);

#[derive(Debug, Clone, PartialEq)]
enum Want {
    Is(String),
    IsNot(String),
    Exists,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, String> {
        if text.len() > MAX_TEMPLATE {
            return Err(format!("the selector is {} bytes; at most {MAX_TEMPLATE}", text.len()));
        }
        let mut out = Vec::new();
        for term in text.split(',').map(str::trim) {
            let (key, want) = if let Some((k, v)) = term.split_once("!=") {
                (k, Want::IsNot(v.to_string()))
            } else if let Some((k, v)) = term.split_once('=') {
                (k, Want::Is(v.trim_start_matches('=').to_string()))
            } else {
                (term, Want::Exists)
            };
            if key.is_empty() {
                return Err(format!("{term:?} names no tag key: write key=value, key!=value or key"));
            }
            out.push((key.to_string(), want));
        }
        Ok(Selector(out))
    }

    /// Whether an object's tags satisfy every term.
    pub fn matches(&self, v: &Value) -> bool {
        let tags = v.get("tags").or_else(|| v.get("labels").and_then(|l| l.get("tags")));
        let tag = |key: &str| -> Option<&str> {
            tags?.as_array()?.iter().find(|t| t["key"] == key).map(|t| t["value"].as_str().unwrap_or(""))
        };
        self.0.iter().all(|(key, want)| match (want, tag(key)) {
            (Want::Is(v), Some(have)) => have == v,
            (Want::IsNot(v), have) => have != Some(v.as_str()),
            (Want::Exists, have) => have.is_some(),
            (Want::Is(_), None) => false,
        })
    }
}

/// kubectl's `-o name`: `KIND/NAME` of an API object, told by the fields its kind has.
pub fn name_of(v: &Value) -> Option<String> {
    let s = |k: &str| v.get(k).and_then(Value::as_str);
    let kind = if v.get("lastStatus").is_some() && v.get("taskDefinition").is_some() {
        "task"
    } else if v.get("hostname").is_some() && v.get("gpus").is_some() {
        "host"
    } else if v.get("desiredCount").is_some() {
        "service"
    } else if v.get("trigger").is_some() && v.get("hostId").is_some() {
        "incident"
    } else if v.get("family").is_some() && v.get("revision").is_some() {
        let revision = v.get("revision").and_then(Value::as_u64)?;
        return Some(format!("taskdef/{}:{revision}", s("family")?));
    } else if v.get("healthPolicy").is_some() {
        "pool"
    } else if v.get("fault").is_some() && v.get("pool").is_some() {
        "drill"
    } else if v.get("role").is_some() {
        "token"
    } else {
        return None;
    };
    Some(format!("{kind}/{}", s("id").or(s("name"))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"items": [{"id": "t-2", "hostId": "h-1", "n": 10, "gpuIds": ["g0", "g1"]}, {"id": "t-1", "n": 9, "gpuIds": []}]})
    }

    #[test]
    fn templates_print_paths_ranges_and_text() {
        let t = |s: &str| Template::parse(s).expect("parses").render(&list());
        assert_eq!(t("{.items[*].id}"), "t-2 t-1");
        assert_eq!(t(r#"{range .items[*]}{.id}{"\t"}{.n}{"\n"}{end}"#), "t-2\t10\nt-1\t9\n");
        assert_eq!(t("ids: {$.items[0].id}!"), "ids: t-2!");
        assert_eq!(t("{.items[0].gpuIds}"), r#"["g0","g1"]"#);
        assert_eq!(t("{.items[5].id}"), "");
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (bad, says) in [
            ("{.items", "unclosed"),
            ("{range .items[*]}{.id}", "without its {end}"),
            ("{end}", "without a {range}"),
            ("{items}", "not a path"),
            ("{.items[}", ".items["),
        ] {
            let e = Template::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(Template::parse(&"{.a}".repeat(2000)).is_err());
    }

    #[test]
    fn custom_columns_make_rows_and_sort_by_orders_them() {
        let root = list();
        let items: Vec<&Value> = root["items"].as_array().unwrap().iter().collect();
        let c = Columns::parse("ID:.id,HOST:.hostId,GPUS:.gpuIds[*]").expect("spec");
        assert_eq!(c.headers(), ["ID", "HOST", "GPUS"]);
        assert_eq!(c.rows(&items, &root), [["t-2", "h-1", "g0,g1"], ["t-1", "<none>", "<none>"]]);
        assert_eq!(sort_order(&items, ".id").unwrap(), [1, 0]);
        assert_eq!(sort_order(&items, ".n").unwrap(), [1, 0]);
        assert_eq!(sort_order(&items, ".hostId").unwrap(), [1, 0], "missing first");
        assert!(Columns::parse("ID").unwrap_err().contains("HEADER:PATH"));
    }

    #[test]
    fn selectors_keep_what_the_tags_say() {
        let task = json!({"id": "t-1", "labels": {"tags": [{"key": "team", "value": "ml"}, {"key": "tier", "value": ""}]}});
        let service = json!({"name": "web", "tags": [{"key": "team", "value": "web"}]});
        let bare = json!({"id": "t-2"});
        let keep = |sel: &str, v: &Value| Selector::parse(sel).expect(sel).matches(v);
        assert!(keep("team=ml", &task) && !keep("team=ml", &service) && !keep("team=ml", &bare));
        assert!(keep("team!=ml", &service) && keep("team!=ml", &bare) && !keep("team!=ml", &task));
        assert!(keep("tier", &task) && !keep("tier", &service));
        assert!(keep("team=ml,tier", &task) && !keep("team=ml,tier=x", &task));
        assert!(keep("team==web", &service));
        assert!(Selector::parse("=x").unwrap_err().contains("no tag key"));
    }

    #[test]
    fn names_are_kind_and_id() {
        assert_eq!(
            name_of(&json!({"id": "t-1", "lastStatus": "RUNNING", "taskDefinition": "a:1"})).unwrap(),
            "task/t-1"
        );
        assert_eq!(name_of(&json!({"id": "h-1", "hostname": "x", "gpus": []})).unwrap(), "host/h-1");
        assert_eq!(name_of(&json!({"family": "web", "revision": 3})).unwrap(), "taskdef/web:3");
        assert_eq!(name_of(&json!({"name": "web", "desiredCount": 2})).unwrap(), "service/web");
        assert_eq!(name_of(&json!({"x": 1})), None);
    }
}
