//! Lists that keep printing (`task list --watch`, `host list --watch`, as `kubectl get -w`) and
//! `mpsfleet events`, both read from the server's event stream (`GET /v1/events`).

use super::*;
use mpsfleet_client::StreamItem;
use mpsfleet_types::event::{Event, EventType};
use std::collections::BTreeMap;

/// After the list is printed: each time an event of `types` arrives, the list is read again
/// and every object whose row changed (or that is new) is printed again, as one more row (a
/// JSON line with `-o json`). Runs until the stream ends (the server stopped) or Ctrl-C.
pub(super) async fn watch<T, F, Fut>(
    c: &Client,
    f: Format,
    types: &[EventType],
    headers: &[&str],
    rows_of: fn(&[T]) -> Vec<Vec<String>>,
    fetch: F,
) -> Result<()>
where
    T: serde::Serialize,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>>>,
{
    let mut stream = c.events(&types.iter().map(|t| t.as_str().to_string()).collect::<Vec<_>>()).await?;
    let first = fetch().await?;
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let rows = rows_of(&first);
    for row in &rows {
        seen.insert(row[0].clone(), row.clone());
    }
    output::print(f, &first, headers, rows);
    loop {
        match stream.next().await? {
            None => anyhow::bail!(
                "the event stream ended (the server stopped or stepped down): run the command again"
            ),
            Some(StreamItem::Lagged(n)) => {
                eprintln!("warning: {n} events were dropped; the list is read again")
            }
            Some(StreamItem::Event(_)) => {}
        }
        let now = fetch().await?;
        let rows = rows_of(&now);
        for (item, row) in now.iter().zip(rows) {
            if seen.get(&row[0]) == Some(&row) {
                continue;
            }
            seen.insert(row[0].clone(), row.clone());
            if f.is_data() {
                println!("{}", serde_json::to_string(item).unwrap_or_default());
            } else {
                let one = output::table(headers, &[row]);
                print!("{}", one.split_once('\n').map_or("", |(_, r)| r));
            }
        }
    }
}

/// `mpsfleet events`: what happened in the cluster, a line per event (a JSON line with
/// `-o json`): the kept events `since` ago (all that are kept when `None`, none of them with
/// `follow` and no `since`), then with `follow` the new ones until `limit` events or Ctrl-C.
pub(super) async fn events(
    c: &Client,
    f: Format,
    kinds: &[String],
    limit: Option<u64>,
    follow: bool,
    since: Option<std::time::Duration>,
) -> Result<()> {
    check_kinds(kinds)?;
    let since_ms = match (since, follow) {
        (Some(age), _) => Some(ago_ms(age)),
        (None, false) => Some(0),
        (None, true) => None,
    };
    let query = mpsfleet_client::EventQuery { types: kinds.to_vec(), since_ms, no_follow: !follow };
    let mut stream = c.events_from(&query).await?;
    if !f.is_data() {
        println!("TIME                      TYPE              SUBJECT               WHAT");
    }
    let mut printed = 0;
    while limit.is_none_or(|l| printed < l) {
        let ev = match stream.next().await? {
            None if !follow => break,
            None => anyhow::bail!("the event stream ended (the server stopped or stepped down)"),
            Some(StreamItem::Lagged(n)) => {
                eprintln!("warning: {n} events were dropped: this reader was too slow");
                continue;
            }
            Some(StreamItem::Event(ev)) => ev,
        };
        if f.is_data() {
            let mut v = serde_json::to_value(&*ev)?;
            output::annotate_times(&mut v);
            println!("{}", serde_json::to_string(&v)?);
        } else {
            let (subject, what) = summary(&ev);
            println!(
                "{:<25} {:<17} {:<21} {}",
                output::utc_time(ev.at_ms),
                ev.kind.as_str(),
                sanitize(&subject),
                sanitize(&what)
            );
        }
        printed += 1;
    }
    Ok(())
}

/// An age as `--since` takes it: a number and a unit (s, m, h, d), one or more (`1h30m`).
pub(super) fn parse_age(s: &str) -> Result<std::time::Duration> {
    let bad = |why: &str| anyhow::anyhow!("--since {s:?}: {why}; write an age such as 30s, 10m, 2h or 1h30m");
    let mut total: u64 = 0;
    let mut digits = String::new();
    for ch in s.trim().chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad(&format!("{ch:?} is not a unit"))),
        };
        let n: u64 = digits.parse().map_err(|_| bad("a unit needs a number before it"))?;
        total = n.checked_mul(unit).and_then(|v| total.checked_add(v)).ok_or_else(|| bad("too long"))?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(bad("the last number has no unit"));
    }
    if total == 0 {
        return Err(bad("it is empty or zero"));
    }
    Ok(std::time::Duration::from_secs(total))
}

/// The time `age` ago, in ms since the epoch (what `--since AGE` asks for).
pub(super) fn ago_ms(age: std::time::Duration) -> u64 {
    let now_ms = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
}

/// Every `--kind` names an event type.
pub(super) fn check_kinds(kinds: &[String]) -> Result<()> {
    for k in kinds {
        if EventType::parse(k).is_none() {
            let known: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
            anyhow::bail!("--kind {k:?} is not an event type; one of {}", known.join(", "));
        }
    }
    Ok(())
}

/// Whose event it is and what happened, in a few words.
fn summary(ev: &Event) -> (String, String) {
    if let Some(i) = &ev.incident {
        let inc = &i.incident;
        // The step the event is about, when it has one: an incident update is one step, and
        // several in one write are several events that say different things.
        let what = match &ev.step {
            Some(s) if !s.event.detail.is_empty() => {
                format!(
                    "{} on host {}: {}: {}",
                    inc.state.as_str(),
                    inc.host_id,
                    s.event.step.as_str(),
                    s.event.detail
                )
            }
            Some(s) => format!("{} on host {}: {}", inc.state.as_str(), inc.host_id, s.event.step.as_str()),
            None => format!(
                "{} on host {} ({}: {})",
                inc.state.as_str(),
                inc.host_id,
                inc.trigger.check,
                inc.trigger.reason
            ),
        };
        return (format!("incident/{}", inc.id), what);
    }
    if let Some(h) = &ev.host {
        let what = match ev.kind {
            EventType::HostHealth => format!("health {}", h.health_status.as_str()),
            _ => format!("status {}", h.status.as_str()),
        };
        return (format!("host/{}", h.id), what);
    }
    if let Some(t) = &ev.task {
        return (
            format!("task/{}", t.id),
            format!("STOPPED: {}", t.stopped_reason.clone().unwrap_or_default()),
        );
    }
    let subject = ev.subject.as_ref().map_or_else(String::new, |s| {
        let kind = ev.kind.as_str().split('.').next().unwrap_or("");
        format!("{kind}/{}", s.id)
    });
    let what = ev.event.as_ref().map_or_else(String::new, |e| format!("{}: {}", e.reason, e.message));
    (subject, what)
}

#[cfg(test)]
mod tests {
    use super::parse_age;

    /// Two steps of one incident written at once are two events that read differently.
    #[test]
    fn an_incident_update_names_its_step() {
        use mpsfleet_types::event::{Event, EventType};
        use mpsfleet_types::*;
        let trigger = Trigger {
            check: "MPS_DAEMON".into(),
            gpu_id: None,
            reason: "daemon exited".into(),
            evidence: "e".into(),
            first_failure_at_ms: None,
            local_repairs_at_ms: Vec::new(),
            earlier_repairs_at_ms: Vec::new(),
        };
        let host = HostId::new("h-1").unwrap();
        let pool = PoolName::new("p").unwrap();
        let mut inc = Incident::open("inc-1".into(), host, pool, IncidentOwner::Mpsfleet, trigger, 5, 5);
        inc.timeline
            .push(6, TimelineEvent { step: Step::Decided, detail: "replace the host".into(), by: None });
        inc.timeline
            .push(6, TimelineEvent { step: Step::ReplacementRequested, detail: String::new(), by: None });
        let lines: Vec<String> = inc
            .timeline
            .since(1)
            .iter()
            .map(|s| {
                let ev = Event {
                    incident: Some(Box::new(IncidentView::of(inc.clone()))),
                    step: Some(s.clone()),
                    ..Event::new(EventType::IncidentUpdated, 6)
                };
                super::summary(&ev).1
            })
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_ne!(lines[0], lines[1], "{lines:?}");
        assert!(lines[0].ends_with("DECIDED: replace the host"), "{lines:?}");
    }

    #[test]
    fn ages_read_as_kubectl_writes_them() {
        assert_eq!(parse_age("30s").unwrap().as_secs(), 30);
        assert_eq!(parse_age("10m").unwrap().as_secs(), 600);
        assert_eq!(parse_age("1h30m").unwrap().as_secs(), 5400);
        assert_eq!(parse_age("2d").unwrap().as_secs(), 172_800);
        for bad in ["", "10", "m", "5x", "0s", "99999999999999999999d"] {
            let e = parse_age(bad).unwrap_err().to_string();
            assert!(e.contains("--since"), "{bad:?}: {e}");
        }
    }
}
