//! Reading `/proc/PID/stat`: is a pid still the process we started, and is it a zombie.

use std::fs;

/// The parts of `/proc/PID/stat` the runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Field 3: R, S, D, Z, T, ...
    pub state: char,
    /// Field 22: start time in clock ticks since boot; with the pid it names one process.
    pub start_time: u64,
}

/// Reads `/proc/PID/stat`; None when there is no such process (or it cannot be parsed).
pub(crate) fn stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
    // so the fields are counted from after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), field 22 is the 19th.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

/// What became of a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Running (or stopped), and the start time matches.
    Alive,
    /// Exited, but its parent has not collected the status yet.
    Zombie,
    /// No such process.
    Gone,
    /// The pid now belongs to another process.
    Reused { start_time: u64 },
}

pub(crate) fn liveness(pid: u32, start_time: u64) -> Liveness {
    match stat(pid) {
        None => Liveness::Gone,
        Some(s) if s.start_time != start_time => Liveness::Reused { start_time: s.start_time },
        Some(s) if s.state == 'Z' || s.state == 'X' => Liveness::Zombie,
        Some(_) => Liveness::Alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line = "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(ProcStat { state: 'S', start_time: 987654 }));
        assert_eq!(parse_stat("1 (x) Z 0"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_is_alive() {
        let me = std::process::id();
        let s = stat(me).expect("own stat");
        assert_eq!(liveness(me, s.start_time), Liveness::Alive);
        assert_eq!(liveness(me, s.start_time + 1), Liveness::Reused { start_time: s.start_time });
    }
}
