//! Human tables and `-o json` for the CLI.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Prints `value` as JSON, or as a table made by `rows` with the given headers.
pub fn print<T: Serialize>(format: Format, value: &T, headers: &[&str], rows: Vec<Vec<String>>) {
    match format {
        Format::Json => match serde_json::to_string_pretty(value) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: cannot encode the answer as JSON: {e}"),
        },
        Format::Table => print!("{}", table(headers, &rows)),
    }
}

/// Left-aligned columns separated by two spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
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
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

pub fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_line_up() {
        let t = super::table(
            &["ID", "STATUS"],
            &[vec!["t-1".into(), "RUNNING".into()], vec!["t-22222".into(), "PENDING".into()]],
        );
        assert_eq!(t, "ID       STATUS\nt-1      RUNNING\nt-22222  PENDING\n");
    }
}
