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
