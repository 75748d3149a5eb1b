//! `mpsfleet bench console`: the web console's first render of the host list at fleet scale,
//! in Debian's headless Chromium. Registers and onboards the hosts on a real server, signs in,
//! then reloads the page again and again; each time it reads, in the page, the time from the
//! start of the navigation to the host table drawn (`window.mpsfleetFirstRenderAt`): the page,
//! its script, the API call for the first page of hosts (500) and their table, under the
//! fleet's size.

use super::browser::Browser;
use super::{quantile, ServerProcess};
use anyhow::{bail, Result};
use clap::Args;
use std::time::Duration;

#[derive(Args)]
pub struct ConsoleBench {
    /// Emulated hosts registered and onboarded.
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    /// GPUs per emulated host.
    #[arg(long, default_value_t = 8)]
    gpus_per_host: u32,
    /// Page loads timed.
    #[arg(long, default_value_t = 10)]
    runs: u32,
}

const LIMIT: Duration = Duration::from_secs(120);

pub fn console(b: ConsoleBench) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let server = ServerProcess::start("console", false)?;
    rt.block_on(async {
        println!("registering {} hosts of {} GPUs", b.hosts, b.gpus_per_host);
        super::metrics::populate(&server, b.hosts, b.gpus_per_host, 0).await?;
        let dir = tempfile_dir("console")?;
        let mut browser = Browser::start(&dir);
        browser.viewport(1400, 900);
        browser.navigate(&format!("{}/", server.url));
        browser.until(LIMIT, "document.body.dataset.ready === 'yes'", "the sign-in form").await;
        let token = serde_json::to_string(&server.admin_token)?;
        browser.eval(&format!(
            "document.getElementById('token').value = {token}; document.getElementById('signin-button').click(); true"
        ));
        let drawn = "window.mpsfleetFirstRenderAt !== undefined && document.body.dataset.rendered === '#/hosts'";
        browser.until(LIMIT, drawn, "the host list").await;
        let mut times = Vec::new();
        for _ in 0..b.runs {
            browser.reload();
            browser.until(LIMIT, drawn, "the host list after a reload").await;
            // The first page of the list, and the fleet's size, are drawn.
            let rows = browser.eval("document.querySelectorAll('[data-host-name]').length");
            let title = browser.eval("document.querySelector('h1').textContent");
            if rows != b.hosts.min(500) || title != format!("Hosts ({})", b.hosts).as_str() {
                bail!("the host list shows {rows} rows under {title}, for {} hosts", b.hosts);
            }
            let ms = browser.eval("window.mpsfleetFirstRenderAt").as_f64().unwrap_or(f64::NAN);
            let fetch = browser.eval("window.mpsfleetFetchMs").as_f64().unwrap_or(f64::NAN);
            println!("first render {ms:.0} ms (the host list's API call and JSON: {fetch:.0} ms)");
            times.push((ms * 1000.0) as u32);
        }
        times.sort_unstable();
        let ms = |us: u32| (us as f64 / 10.0).round() / 100.0;
        let report = serde_json::json!({
            "bench": "console",
            "hosts": b.hosts,
            "gpus": u64::from(b.hosts) * u64::from(b.gpus_per_host),
            "runs": b.runs,
            "first_render_p50_ms": ms(quantile(&times, 0.5)),
            "first_render_min_ms": ms(times.first().copied().unwrap_or(0)),
            "first_render_max_ms": ms(times.last().copied().unwrap_or(0)),
        });
        println!("{report}");
        drop(browser);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    })
}

/// A fresh directory for the browser's profile and pipes.
fn tempfile_dir(name: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("mpsf-bench-{name}-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
