//! Which checks a heartbeat carries. The agent numbers its checks (`checksRev`, one more each
//! time they change) and sends them in full until the server answers that it holds that
//! number; from then on its heartbeats leave them out (`checksUnchanged`) until they change.
//! A server that does not hold them (it restarted, or a new leader answers) says so by
//! answering without the number, and the agent sends them in full at once.
//!
//! A check of a failure going on carries ages (how long ago it began, when each local repair
//! was made), which grow with every heartbeat: checks whose ages only grew by the time that
//! passed are the same checks. The server counts the ages back from the report that carried
//! them, so the times it places them at stay those of that report.

use mpsfleet_types::api::{HostStatusAnswer, HostStatusReport};
use mpsfleet_types::{check_key, HostCheck};

/// How far an age may stray from the one last sent plus the time that passed and still be
/// the same: ages and the time are read from the same clock, so only rounding and the
/// moment each check was read separate them.
pub const AGE_SLACK_MS: u64 = 1_000;

/// The agent's checks as last sent and as last read, their number, and whether the server
/// holds them.
#[derive(Debug, Default)]
pub struct ReportedChecks {
    sent: Vec<HostCheck>,
    sent_at_ms: u64,
    latest: Vec<HostCheck>,
    /// 0 before the first report: the first checks are number 1.
    rev: u64,
    held: bool,
}

impl ReportedChecks {
    /// Puts `checks` (the agent's checks, read at `now_ms`) into `report`: left out when the
    /// server holds them already.
    pub fn fill(&mut self, report: &mut HostStatusReport, checks: Vec<HostCheck>, now_ms: u64) {
        if self.rev == 0 || !same_checks(&self.sent, self.sent_at_ms, &checks, now_ms) {
            self.rev += 1;
            self.held = false;
        }
        self.latest = checks;
        self.put(report, now_ms);
    }

    /// Puts the checks last read into `report` in full: the server asked for them.
    pub fn refill(&mut self, report: &mut HostStatusReport, now_ms: u64) {
        self.held = false;
        self.put(report, now_ms);
    }

    fn put(&mut self, report: &mut HostStatusReport, now_ms: u64) {
        report.checks_rev = Some(self.rev);
        report.checks_unchanged = self.held;
        if self.held {
            report.checks = Vec::new();
        } else {
            report.checks = self.latest.clone();
            self.sent.clone_from(&self.latest);
            self.sent_at_ms = now_ms;
        }
    }

    /// Takes the server's answer to `sent` (a report [`ReportedChecks::fill`] made). True when
    /// `sent` left the checks out and the server does not hold them: send them again, in full
    /// ([`ReportedChecks::refill`]).
    pub fn answered(&mut self, sent: &HostStatusReport, answer: &HostStatusAnswer) -> bool {
        self.held = sent.checks_rev == Some(self.rev) && answer.checks_rev == sent.checks_rev;
        sent.checks_unchanged && !self.held
    }
}

/// Whether `now` (read at `now_ms`) are the checks `then` (sent at `then_ms`): equal, but for
/// ages that grew by the time that passed (within [`AGE_SLACK_MS`]).
pub fn same_checks(then: &[HostCheck], then_ms: u64, now: &[HostCheck], now_ms: u64) -> bool {
    check_key::same_but_aged(then, now, now_ms.saturating_sub(then_ms), AGE_SLACK_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpsfleet_types::HealthStatus;

    fn check(status: HealthStatus) -> HostCheck {
        HostCheck {
            name: "MPS_DAEMON".into(),
            gpu_id: None,
            status,
            reason: String::new(),
            since_ms: 0,
            restarts: 0,
            first_failure_age_ms: None,
            repair_ages_ms: Vec::new(),
        }
    }

    fn failing(age: u64, repairs: &[u64]) -> HostCheck {
        HostCheck {
            first_failure_age_ms: Some(age),
            repair_ages_ms: repairs.to_vec(),
            ..check(HealthStatus::Impaired)
        }
    }

    fn answer(rev: Option<u64>) -> HostStatusAnswer {
        HostStatusAnswer { checks_rev: rev, ..HostStatusAnswer::default() }
    }

    #[test]
    fn checks_are_left_out_only_while_the_server_holds_them() {
        let mut r = ReportedChecks::default();
        let mut report = HostStatusReport::default();
        r.fill(&mut report, vec![check(HealthStatus::Ok)], 0);
        assert_eq!((report.checks.len(), report.checks_rev, report.checks_unchanged), (1, Some(1), false));
        // A server that does not number checks (an older one) never lets them be left out.
        assert!(!r.answered(&report, &answer(None)));
        r.fill(&mut report, vec![check(HealthStatus::Ok)], 1_000);
        assert_eq!((report.checks.len(), report.checks_rev, report.checks_unchanged), (1, Some(1), false));
        // Held: the same checks are left out.
        assert!(!r.answered(&report, &answer(Some(1))));
        r.fill(&mut report, vec![check(HealthStatus::Ok)], 2_000);
        assert_eq!((report.checks.len(), report.checks_rev, report.checks_unchanged), (0, Some(1), true));
        assert!(!r.answered(&report, &answer(Some(1))));
        // Changed: sent in full under the next number.
        r.fill(&mut report, vec![check(HealthStatus::Impaired)], 3_000);
        assert_eq!((report.checks.len(), report.checks_rev, report.checks_unchanged), (1, Some(2), false));
        assert!(!r.answered(&report, &answer(Some(2))));
        r.fill(&mut report, vec![check(HealthStatus::Impaired)], 4_000);
        assert!(report.checks_unchanged);
        // A restarted server holds nothing: it asks, and the same checks go again in full.
        assert!(r.answered(&report, &answer(None)));
        r.refill(&mut report, 4_000);
        assert_eq!(report.checks, vec![check(HealthStatus::Impaired)]);
        assert_eq!((report.checks_rev, report.checks_unchanged), (Some(2), false));
        assert!(!r.answered(&report, &answer(Some(2))));
    }

    #[test]
    fn an_answer_about_other_checks_is_no_acknowledgement() {
        let mut r = ReportedChecks::default();
        let mut report = HostStatusReport::default();
        r.fill(&mut report, vec![check(HealthStatus::Ok)], 0);
        // The server holds number 7 (of an earlier run of this agent): not these checks.
        r.answered(&report, &answer(Some(7)));
        r.fill(&mut report, vec![check(HealthStatus::Ok)], 1_000);
        assert!(!report.checks_unchanged);
        assert_eq!(report.checks.len(), 1);
    }

    #[test]
    fn ages_that_grew_with_the_time_are_the_same_failure() {
        let mut r = ReportedChecks::default();
        let mut report = HostStatusReport::default();
        r.fill(&mut report, vec![failing(500, &[400])], 10_000);
        assert!(!r.answered(&report, &answer(Some(1))));
        // Three seconds on, every age three seconds older (within the slack): left out.
        r.fill(&mut report, vec![failing(3_500, &[3_450])], 13_000);
        assert!(report.checks_unchanged);
        assert!(!r.answered(&report, &answer(Some(1))));
        // A new local repair: a change.
        r.fill(&mut report, vec![failing(4_500, &[4_400, 10])], 14_000);
        assert_eq!((report.checks_rev, report.checks_unchanged), (Some(2), false));
        assert_eq!(report.checks[0].repair_ages_ms, vec![4_400, 10]);
        assert!(!r.answered(&report, &answer(Some(2))));
        // A new failure began (its age is young again): a change.
        r.fill(&mut report, vec![failing(200, &[4_400, 10])], 15_000);
        assert_eq!((report.checks_rev, report.checks_unchanged), (Some(3), false));
        // Resent in full, the ages are those of the moment they are sent.
        assert!(!r.answered(&report, &answer(Some(3))));
        r.fill(&mut report, vec![failing(1_200, &[5_400, 1_010])], 16_000);
        assert!(report.checks_unchanged);
        assert!(r.answered(&report, &answer(None)));
        r.refill(&mut report, 16_000);
        assert_eq!(report.checks, vec![failing(1_200, &[5_400, 1_010])]);
    }

    #[test]
    fn an_age_beyond_the_slack_is_another_failure() {
        let then = [failing(500, &[])];
        assert!(same_checks(&then, 0, &[failing(500 + 2_000 + AGE_SLACK_MS, &[])], 2_000));
        assert!(!same_checks(&then, 0, &[failing(500 + 2_000 + AGE_SLACK_MS + 1, &[])], 2_000));
        assert!(!same_checks(&then, 0, &[check(HealthStatus::Impaired)], 2_000));
        assert!(!same_checks(&then, 0, &[failing(2_500, &[0])], 2_000));
    }
}
