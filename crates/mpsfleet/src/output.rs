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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Prints `value` as JSON, or as a table made by `rows` with the given headers.
pub fn print<T: Serialize>(format: Format, value: &T, headers: &[&str], rows: Vec<Vec<String>>) {
    match format {
        Format::Json => match serde_json::to_string_pretty(value) {
            Ok(s) => println!("{}", escape_json_controls(&s)),
            Err(e) => eprintln!("error: cannot encode the answer as JSON: {e}"),
        },
        Format::Table => print!("{}", table(headers, &rows)),
    }
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
    let rows: Vec<Vec<Cow<'_, str>>> = rows.iter().map(|r| r.iter().map(|c| sanitize(c)).collect()).collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for r in &rows {
        out.push_str(&line(r.iter().map(|c| c.as_ref()).collect()));
    }
    out
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
    let (days, rem) = (ms / 86_400_000, ms % 86_400_000);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::{sanitize, sanitize_text};
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
    fn utc_times() {
        assert_eq!(super::utc_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc_time(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(super::utc_time(1_796_104_260_500), "2026-12-01T05:51:00.500Z");
    }
}
