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

/// `mpsfleet events`: what happens in the cluster as it happens, a line per event (a JSON
/// line with `-o json`), until `limit` events or Ctrl-C.
pub(super) async fn events(c: &Client, f: Format, kinds: &[String], limit: Option<u64>) -> Result<()> {
    check_kinds(kinds)?;
    let mut stream = c.events(kinds).await?;
    if !f.is_data() {
        println!("TIME                      TYPE              SUBJECT               WHAT");
    }
    let mut printed = 0;
    while limit.is_none_or(|l| printed < l) {
        let ev = match stream.next().await? {
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
        let what = format!(
            "{} on host {} ({}: {})",
            inc.state.as_str(),
            inc.host_id,
            inc.trigger.check,
            inc.trigger.reason
        );
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
