//! Human tables and `-o json` for the CLI.
//!
//! Every string the CLI prints may come from outside (a hostname an agent registered, a
//! container's output, a check's reason), so what reaches the terminal is stripped of control
//! characters first: [`sanitize`] for one-line text (table cells, values in a line),
//! [`sanitize_text`] for multi-line text that keeps newlines and tabs. `-o json` stays exact:
//! the JSON escapes every control character, and decoding it gives the text as sent.

use serde::Serialize;
use std::borrow::Cow;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Columns fitted to the terminal's width (cells cut with `…`); not cut when the output
    /// is not a terminal and `COLUMNS` is not set.
    Table,
    /// Every column, never cut; lists show more of them.
    Wide,
    /// The API's JSON, with an RFC 3339 UTC time next to each epoch-milliseconds field.
    Json,
    /// As `json`, in YAML.
    Yaml,
    /// `KIND/NAME` per object (`task/t-…`), as kubectl's `-o name`.
    Name,
    /// `jsonpath=TEMPLATE`: the template of [`crate::template`] over the API's JSON.
    Jsonpath,
    /// `custom-columns=HEADER:PATH,…`: a table of those columns.
    CustomColumns,
}

/// What `-o jsonpath=` and `-o custom-columns=` carry, set once when the flag is parsed.
enum Spec {
    Template(crate::template::Template),
    Columns(crate::template::Columns),
}

static SPEC: std::sync::OnceLock<Spec> = std::sync::OnceLock::new();
static NO_HEADERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static SORT_BY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static SELECTOR: std::sync::OnceLock<crate::template::Selector> = std::sync::OnceLock::new();

/// The formats `-o` takes, for its help and errors.
pub const FORMATS: &str =
    "table, wide, json, yaml, name, jsonpath=TEMPLATE, custom-columns=HEADER:PATH[,...]";

/// Parses `-o`'s value (clap's value parser).
pub fn parse_format(s: &str) -> Result<Format, String> {
    Ok(match s {
        "table" => Format::Table,
        "wide" => Format::Wide,
        "json" => Format::Json,
        "yaml" => Format::Yaml,
        "name" => Format::Name,
        _ => {
            if let Some(t) = s.strip_prefix("jsonpath=") {
                let _ = SPEC.set(Spec::Template(crate::template::Template::parse(t)?));
                Format::Jsonpath
            } else if let Some(c) = s.strip_prefix("custom-columns=") {
                let _ = SPEC.set(Spec::Columns(crate::template::Columns::parse(c)?));
                Format::CustomColumns
            } else {
                return Err(format!("{s:?} is not an output format: one of {FORMATS}"));
            }
        }
    })
}

/// `--no-headers`, `--sort-by` and `-l`, for every list printed from now on.
pub fn set_listing(no_headers: bool, sort_by: Option<String>, selector: Option<&str>) -> Result<(), String> {
    NO_HEADERS.store(no_headers, std::sync::atomic::Ordering::Relaxed);
    if let Some(text) = selector {
        let _ = SELECTOR.set(crate::template::Selector::parse(text).map_err(|e| format!("-l: {e}"))?);
    }
    if let Some(path) = sort_by {
        crate::template::sort_order(&[], &path).map_err(|e| format!("--sort-by: {e}"))?;
        let _ = SORT_BY.set(path);
    }
    Ok(())
}

impl Format {
    /// Anything but a human table: the whole record, for programs.
    pub fn is_data(self) -> bool {
        !matches!(self, Format::Table | Format::Wide)
    }
}

/// Prints `value` as the format asks: JSON, YAML, names, a template or custom columns of its
/// JSON, or a table made by `rows` with the given headers. A list (a JSON array) is first
/// narrowed by `-l` and sorted by `--sort-by` when they were given, its rows with it when there
/// is one row per item.
pub fn print<T: Serialize>(format: Format, value: &T, headers: &[&str], rows: Vec<Vec<String>>) {
    // A table as built needs no JSON of the answer unless a list is narrowed or sorted.
    if !format.is_data() && SELECTOR.get().is_none() && SORT_BY.get().is_none() {
        return print_table(format, headers, &rows);
    }
    let mut v = match serde_json::to_value(value) {
        Ok(v) => v,
        Err(e) => return eprintln!("error: cannot encode the answer as JSON: {e}"),
    };
    let mut rows = rows;
    if let (Some(sel), serde_json::Value::Array(items)) = (SELECTOR.get(), &mut v) {
        let keep: Vec<bool> = items.iter().map(|it| sel.matches(it)).collect();
        if rows.len() == items.len() {
            rows = rows.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(r, _)| r).collect();
        }
        let mut k = keep.iter();
        items.retain(|_| *k.next().unwrap_or(&false));
    }
    if let (Some(path), serde_json::Value::Array(items)) = (SORT_BY.get(), &mut v) {
        let refs: Vec<&serde_json::Value> = items.iter().collect();
        if let Ok(order) = crate::template::sort_order(&refs, path) {
            if rows.len() == items.len() {
                rows = order.iter().map(|&i| rows[i].clone()).collect();
            }
            *items = order.iter().map(|&i| items[i].clone()).collect();
        }
    }
    match format {
        Format::Json | Format::Yaml => {
            annotate_times(&mut v);
            if format == Format::Yaml {
                print!("{}", yaml(&v));
            } else {
                let s = serde_json::to_string_pretty(&v).unwrap_or_default();
                println!("{}", escape_json_controls(&s));
            }
        }
        Format::Table | Format::Wide => print_table(format, headers, &rows),
        Format::Name => {
            let items: Vec<&serde_json::Value> = match &v {
                serde_json::Value::Array(items) => items.iter().collect(),
                one => vec![one],
            };
            for item in items {
                // An answer that holds objects (`task run`'s tasks) names them.
                let held = || {
                    item.as_object()?.values().find_map(|v| {
                        let names: Option<Vec<String>> =
                            v.as_array()?.iter().map(crate::template::name_of).collect();
                        names.filter(|n| !n.is_empty())
                    })
                };
                match crate::template::name_of(item).map(|n| vec![n]).or_else(held) {
                    Some(names) => names.iter().for_each(|n| println!("{}", sanitize(n))),
                    None => eprintln!("error: -o name: this answer is not an object with a name"),
                }
            }
        }
        Format::Jsonpath | Format::CustomColumns => {
            // kubectl gives a template a list as {"items": [...]}.
            let root = match v {
                serde_json::Value::Array(_) => serde_json::json!({ "items": v }),
                one => one,
            };
            match SPEC.get() {
                Some(Spec::Template(t)) => {
                    let text = t.render(&root);
                    print!("{}", sanitize_text(&text));
                    if !text.is_empty() && !text.ends_with('\n') {
                        println!();
                    }
                }
                Some(Spec::Columns(c)) => {
                    let items: Vec<&serde_json::Value> = match root.get("items").and_then(|i| i.as_array()) {
                        Some(items) => items.iter().collect(),
                        None => vec![&root],
                    };
                    print!("{}", headed(table(&c.headers(), &c.rows(&items, &root))));
                }
                None => eprintln!("error: the output format's template is missing"),
            }
        }
    }
}

/// How long ago `at_ms` was, as kubectl's AGE: `45s`, `12m`, `3h`, `2d`; `-` for no time.
pub fn age(now_ms: u64, at_ms: u64) -> String {
    if at_ms == 0 {
        return "-".into();
    }
    let s = now_ms.saturating_sub(at_ms) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7_199 => format!("{}m", s / 60),
        7_200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `-o table` (fitted to the terminal) or `-o wide`, with or without its header line.
fn print_table(format: Format, headers: &[&str], rows: &[Vec<String>]) {
    let t = if format == Format::Table { fit(headers, rows, terminal_width()) } else { table(headers, rows) };
    print!("{}", headed(t));
}

/// A table without its header line when `--no-headers` was given.
fn headed(table: String) -> String {
    if NO_HEADERS.load(std::sync::atomic::Ordering::Relaxed) {
        table.split_once('\n').map_or(String::new(), |(_, rest)| rest.to_string())
    } else {
        table
    }
}

/// Epoch milliseconds between 2001 and 5138: what a `…Ms`/`…_ms` field holding a time looks
/// like (durations such as `tolerationMs` are far smaller).
const TIMES_MS: std::ops::Range<u64> = 1_000_000_000_000..100_000_000_000_000;

/// Adds, next to every field named `…Ms` or `…_ms` that holds a time, the same time in RFC
/// 3339 UTC under the name without the suffix (`createdAtMs` -> `createdAt`, `at_ms` -> `at`),
/// unless that name is taken.
pub fn annotate_times(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            let mut add = Vec::new();
            for (k, val) in map.iter() {
                let base = k.strip_suffix("Ms").or_else(|| k.strip_suffix("_ms"));
                if let (Some(base), Some(ms)) = (base, val.as_u64()) {
                    if !base.is_empty() && TIMES_MS.contains(&ms) && !map.contains_key(base) {
                        add.push((base.to_string(), utc_time(ms)));
                    }
                }
            }
            for (k, t) in add {
                map.insert(k, serde_json::Value::String(t));
            }
            map.values_mut().for_each(annotate_times);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(annotate_times),
        _ => {}
    }
}

/// `v` as YAML in block style. Strings are written as JSON strings, which YAML reads as
/// double-quoted scalars with the same escapes, so nothing in a value can change the
/// document's structure and every control character stays escaped.
pub fn yaml(v: &serde_json::Value) -> String {
    let mut out = String::new();
    yaml_node(v, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn yaml_scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => {
            escape_json_controls(&serde_json::to_string(s).unwrap_or_default()).into_owned()
        }
        serde_json::Value::Array(a) if a.is_empty() => "[]".into(),
        serde_json::Value::Object(o) if o.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

fn is_nested(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::Object(o) => !o.is_empty(),
        _ => false,
    }
}

fn yaml_node(v: &serde_json::Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (k, val) in map {
                let key = yaml_scalar(&serde_json::Value::String(k.clone()));
                if is_nested(val) {
                    out.push_str(&format!("{pad}{key}:\n"));
                    yaml_node(val, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}{key}: {}\n", yaml_scalar(val)));
                }
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            for item in items {
                if is_nested(item) {
                    // The item's first line goes after the dash, the rest under it.
                    let mut inner = String::new();
                    yaml_node(item, indent + 2, &mut inner);
                    let inner = inner.strip_prefix(&" ".repeat(indent + 2)).unwrap_or(&inner).to_string();
                    out.push_str(&format!("{pad}- {inner}"));
                } else {
                    out.push_str(&format!("{pad}- {}\n", yaml_scalar(item)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", yaml_scalar(other))),
    }
}

/// The width to fit tables to: `COLUMNS` when set, else the terminal's when standard output
/// is one; None (no fitting) otherwise.
pub fn terminal_width() -> Option<usize> {
    if let Some(n) = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<usize>().ok()) {
        return Some(n).filter(|n| *n > 0);
    }
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let ws = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// The narrowest a cut column gets.
const MIN_COLUMN: usize = 6;

/// [`table`], with its widest columns cut (cells ending in `…`) until a row fits in `width`
/// when one is given.
pub fn fit(headers: &[&str], rows: &[Vec<String>], width: Option<usize>) -> String {
    let rows: Vec<Vec<Cow<'_, str>>> = rows.iter().map(|r| r.iter().map(|c| sanitize(c)).collect()).collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    if let Some(width) = width {
        let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * w.len().saturating_sub(1);
        while total(&widths) > width {
            let (i, w) =
                widths.iter().enumerate().max_by_key(|(_, w)| **w).map(|(i, w)| (i, *w)).unwrap_or((0, 0));
            if w <= MIN_COLUMN {
                break;
            }
            widths[i] = (w - (total(&widths) - width)).max(MIN_COLUMN);
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (c, w) in cells.zip(&widths) {
            let n = c.chars().count();
            if n > *w {
                s.extend(c.chars().take(w.saturating_sub(1)));
                s.push('…');
            } else {
                s.push_str(c);
                s.extend(std::iter::repeat_n(' ', w - n));
            }
            s.push_str("  ");
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut headers.iter().copied());
    for r in &rows {
        out.push_str(&line(&mut r.iter().map(|c| c.as_ref())));
    }
    out
}

/// `s` with every control character (Unicode Cc: C0, DEL and C1, newline and tab included)
/// written as a visible escape, `\x1b` or `\u{9b}`: a cell or a value stays on one line and
/// cannot move the cursor, set the title or clear the screen. Borrowed when `s` has none.
pub fn sanitize(s: &str) -> Cow<'_, str> {
    escape_controls(s, false)
}

/// As [`sanitize`], but newlines and tabs are kept: for multi-line text such as task output.
pub fn sanitize_text(s: &str) -> Cow<'_, str> {
    escape_controls(s, true)
}

fn escape_controls(s: &str, keep_lines: bool) -> Cow<'_, str> {
    let bad = |c: char| c.is_control() && !(keep_lines && (c == '\n' || c == '\t'));
    let Some(first) = s.find(bad) else { return Cow::Borrowed(s) };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if !bad(c) {
            out.push(c);
        } else if c.is_ascii() {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// JSON text with DEL and the C1 controls (which serde_json writes raw) as `\u00XX` escapes.
/// Outside strings JSON text is ASCII without them, so the value it encodes is unchanged.
fn escape_json_controls(json: &str) -> Cow<'_, str> {
    let Some(first) = json.find(raw_in_json) else { return Cow::Borrowed(json) };
    let mut out = String::with_capacity(json.len() + 8);
    out.push_str(&json[..first]);
    for c in json[first..].chars() {
        if raw_in_json(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The control characters serde_json leaves unescaped inside strings.
fn raw_in_json(c: char) -> bool {
    c.is_control() && u32::from(c) >= 0x7f
}

/// Left-aligned columns separated by two spaces. Every cell goes through [`sanitize`], so no
/// table can carry a control character to the terminal or break a row in two.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    fit(headers, rows, None)
}

/// A describe view's fields, as `Name:  value` lines with the values aligned (kubectl's
/// describe). Values go through [`sanitize`].
pub fn fields(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let key = format!("{k}:");
        out.push_str(&format!("{key:<width$}  {}\n", sanitize(v)));
    }
    out
}

/// A titled, indented table under a describe view's fields; `<none>` when it has no rows.
pub fn section(title: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("\n{title}:\n");
    if rows.is_empty() {
        out.push_str("  <none>\n");
        return out;
    }
    for line in table(headers, rows).lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// An object's events, oldest first, as a describe view shows them: when (UTC; the last time
/// for a repeated one), the reason, how often, the message.
pub fn events_section(history: &mpsfleet_types::History<mpsfleet_types::ObjectEvent>) -> String {
    let mut rows: Vec<Vec<String>> = history
        .iter()
        .map(|e| {
            let count = if e.count > 1 { format!("x{}", e.count) } else { String::new() };
            vec![utc_time(e.latest_ms()), e.reason.clone(), count, e.message.clone()]
        })
        .collect();
    if history.elided() > 0 {
        rows.insert(
            rows.len().min(16),
            vec!["...".into(), String::new(), String::new(), format!("{} events left out", history.elided())],
        );
    }
    section("Events", &["TIME", "REASON", "COUNT", "MESSAGE"], &rows)
}

pub fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), ToString::to_string)
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn utc_time(ms: u64) -> String {
    mpsfleet_types::utc(ms)
}

#[cfg(test)]
mod tests {
    use super::{age, sanitize, sanitize_text};
    use std::borrow::Cow;

    #[track_caller]
    fn check(input: &str, one_line: &str, text: &str) {
        assert_eq!(sanitize(input), one_line, "sanitize({input:?})");
        assert_eq!(sanitize_text(input), text, "sanitize_text({input:?})");
        for out in [sanitize(input), sanitize_text(input)] {
            assert!(!out.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{out:?}");
        }
    }

    #[test]
    fn control_characters_become_visible_escapes() {
        // A title change and a screen clear.
        check("\u{1b}]0;pwned\u{7}\u{1b}[2J", r"\x1b]0;pwned\x07\x1b[2J", r"\x1b]0;pwned\x07\x1b[2J");
        // C1: CSI and OSC as single code points, and the end of the C1 range.
        check("a\u{9b}2Jb\u{9d}c\u{9f}", r"a\u{9b}2Jb\u{9d}c\u{9f}", r"a\u{9b}2Jb\u{9d}c\u{9f}");
        check("x\u{80}", r"x\u{80}", r"x\u{80}");
        check("del\u{7f}", r"del\x7f", r"del\x7f");
        check("ok\rFAILED", r"ok\x0dFAILED", r"ok\x0dFAILED");
        check("\0\u{8}", r"\x00\x08", r"\x00\x08");
        // Not controls: U+00A0 and other printable text is kept.
        check("\u{a0}é→ GPU", "\u{a0}é→ GPU", "\u{a0}é→ GPU");
    }

    #[test]
    fn only_multi_line_text_keeps_newlines_and_tabs() {
        check("line 1\n\tline 2\n", r"line 1\x0a\x09line 2\x0a", "line 1\n\tline 2\n");
        check("a\r\n\u{1b}[31mred\n", r"a\x0d\x0a\x1b[31mred\x0a", "a\\x0d\n\\x1b[31mred\n");
    }

    #[test]
    fn clean_text_is_borrowed_unchanged() {
        for s in ["", "n1.example.com", "exit 137: OOM killed", "multi\nline\ttext", "\u{a0}é"] {
            let text = sanitize_text(s);
            assert!(matches!(text, Cow::Borrowed(b) if std::ptr::eq(b, s)), "{s:?}");
            if !s.contains(['\n', '\t']) {
                assert!(matches!(sanitize(s), Cow::Borrowed(b) if std::ptr::eq(b, s)), "{s:?}");
            }
        }
    }

    #[test]
    fn a_table_cell_is_one_line_without_controls() {
        let t = super::table(
            &["HOSTNAME", "STATUS"],
            &[
                vec!["\u{1b}]0;pwned\u{7}\u{1b}[2J".into(), "ACTIVE".into()],
                vec!["two\nlines".into(), "x".into()],
            ],
        );
        assert_eq!(
            t,
            "HOSTNAME                 STATUS\n\\x1b]0;pwned\\x07\\x1b[2J  ACTIVE\ntwo\\x0alines             x\n"
        );
        assert!(!t.bytes().any(|b| b == 0x1b || b == 0x07));
    }

    #[test]
    fn json_escapes_every_control_and_decodes_to_the_exact_text() {
        let text = "\u{1b}]0;pwned\u{7}\u{1b}[2J\r\n\t\u{7f}\u{9b}\u{85}é";
        let value = serde_json::json!({ "hostname": text, "plain": "n1" });
        let json = serde_json::to_string_pretty(&value).unwrap();
        let out = super::escape_json_controls(&json);
        // serde_json escapes the C0 controls; DEL and C1 are escaped here.
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out}");
        assert!(out.contains(r"\u001b]0;pwned\u0007\u001b[2J\r\n\t\u007f\u009b\u0085é"), "{out}");
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back, value);
        assert!(matches!(super::escape_json_controls("{\"a\": \"b\"}"), Cow::Borrowed(_)));
    }

    #[test]
    fn columns_line_up() {
        let t = super::table(
            &["ID", "STATUS"],
            &[vec!["t-1".into(), "RUNNING".into()], vec!["t-22222".into(), "PENDING".into()]],
        );
        assert_eq!(t, "ID       STATUS\nt-1      RUNNING\nt-22222  PENDING\n");
    }

    #[test]
    fn tables_fit_the_width_given() {
        let rows =
            vec![vec!["t-1".to_string(), "no GPU of the pool has 200000 MiB of memory free".to_string()]];
        let t = super::fit(&["ID", "REASON"], &rows, Some(30));
        assert!(t.lines().all(|l| l.chars().count() <= 30), "{t}");
        assert!(t.contains("t-1  no GPU of the pool has 2…"), "{t}");
        // Without a width nothing is cut.
        assert!(super::fit(&["ID", "REASON"], &rows, None).contains("200000 MiB of memory free"));
    }

    #[test]
    fn json_gets_rfc3339_next_to_epoch_times() {
        let mut v = serde_json::json!({"createdAtMs": 1_796_104_260_500u64, "tolerationMs": 2000,
            "timeline": [{"at_ms": 1_796_104_260_500u64}]});
        super::annotate_times(&mut v);
        assert_eq!(v["createdAt"], "2026-12-01T05:51:00.500Z");
        assert_eq!(v["timeline"][0]["at"], "2026-12-01T05:51:00.500Z");
        assert!(v.get("toleration").is_none(), "a duration is not a time: {v}");
    }

    #[test]
    fn ages_read_as_kubectls() {
        let now = 1_800_000_000_000;
        assert_eq!(age(now, now - 45_000), "45s");
        assert_eq!(age(now, now - 12 * 60_000), "12m");
        assert_eq!(age(now, now - 3 * 3_600_000), "3h");
        assert_eq!(age(now, now - 2 * 86_400_000), "2d");
        assert_eq!(age(now, now + 5_000), "0s");
        assert_eq!(age(now, 0), "-");
    }

    #[test]
    fn yaml_is_block_style_with_quoted_strings() {
        let v = serde_json::json!({"name": "web", "n": 3, "tags": ["a", "b"], "empty": [],
            "hosts": [{"id": "h-1", "hostname": "x: y\n- z"}]});
        assert_eq!(
            super::yaml(&v),
            "\"empty\": []\n\"hosts\":\n  - \"hostname\": \"x: y\\n- z\"\n    \"id\": \"h-1\"\n\"n\": 3\n\"name\": \"web\"\n\"tags\":\n  - \"a\"\n  - \"b\"\n"
        );
    }
}
