//! The web console in a real browser: Debian's headless Chromium, driven over the DevTools
//! protocol on pipes (`--remote-debugging-pipe`, through two FIFOs), against the real server and
//! an agent with the real MPS daemon. It refuses a bad token, signs in with a viewer token,
//! lists a host whose hostname carries markup (shown as text, nothing of it run), opens the
//! host, and sees an incident appear, with no reload, when the host's MPS daemon is killed.

mod common;

use common::*;
use mpsfleet_types::access::{CreateToken, Role};
use mpsfleet_types::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

// The DevTools client `mpsfleet bench console` uses too.
#[path = "../src/bench/browser.rs"]
mod browser;
use browser::Browser;

const WAIT: Duration = Duration::from_secs(60);
/// What the test's host calls itself: markup that would run if the console put it in as HTML.
const HOSTNAME: &str = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>gpu-1";

/// With `MPSFLEET_CONSOLE_SCREENSHOTS=DIR` (scripts/console-screenshots.sh), the page as it is
/// now, to `DIR/NAME.png`, for docs/console.md.
fn shot(b: &mut Browser, name: &str) {
    if let Some(dir) = std::env::var_os("MPSFLEET_CONSOLE_SCREENSHOTS") {
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        b.screenshot(&dir.join(format!("{name}.png")));
    }
}

/// A new viewer token, for `what`.
async fn viewer_token(admin: &mpsfleet_client::Client, what: &str) -> String {
    let req = CreateToken {
        role: Role::Viewer,
        description: what.into(),
        expires_in_s: None,
        pool: None,
        aws: false,
    };
    admin.create_token(&req).await.unwrap().token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_signs_in_opens_a_host_and_sees_an_incident_arrive_live() {
    let Some(mps) = mps_control() else { return };
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        // Self-managed, without local repair: a killed daemon is an incident the operator owns.
        let health = HealthPolicy {
            agent_heartbeat_grace_ms: 3_000,
            mps_probe_interval_ms: 1_000,
            mps_probe_timeout_ms: 200,
            mps_failure_threshold: 2,
            local_daemon_restarts: 0,
            toleration_ms: 500,
        };
        admin
            .create_pool(&CreatePool {
                name: "gpu".into(),
                mode: Some(OwnershipMode::SelfManaged),
                health_policy: Some(health),
                ..Default::default()
            })
            .await
            .unwrap();
        let agent_dir = dir.path().join("a");
        let agent = Agent::start(&server, &agent_dir, 1, &mps, &["--hostname", HOSTNAME]);
        let host = eventually(WAIT, "the host to be ACTIVE", || async {
            admin.list_hosts(None).await.ok()?.into_iter().find(|h| h.status == HostStatus::Active)
        })
        .await;
        assert_eq!(host.hostname, HOSTNAME);
        admin.register_taskdef(mps_taskdef("infer", 4096)).await.unwrap();
        let run = RunTask { task_definition: "infer".into(), count: 1, pool: "gpu".into(), client_token: None, ..Default::default() };
        let id = admin.run_task(&run).await.unwrap().tasks[0].id;
        eventually(WAIT, "the task to run", || async {
            let t = admin.describe_task(&id.to_string()).await.ok()?;
            (t.last_status == TaskStatus::Running).then_some(())
        })
        .await;
        let viewer = viewer_token(&admin, "console").await;

        // The page and its assets are served with the policy that keeps injected text inert.
        let resp = server.http().get(format!("{}/", server.url)).send().await.unwrap();
        assert!(resp.status().is_success());
        let csp = resp.headers()["content-security-policy"].to_str().unwrap().to_string();
        assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");

        let browser_dir = dir.path().join("browser");
        std::fs::create_dir_all(&browser_dir).unwrap();
        let mut b = Browser::start(&browser_dir);
        b.viewport(1280, 800);
        b.navigate(&format!("{}/", server.url));
        b.until(WAIT, "document.body.dataset.ready === 'yes'", "the sign-in form").await;

        // A token the server does not know is refused, in words.
        b.eval("document.getElementById('token').value = 'mpsf_not_a_token'; document.getElementById('signin-button').click(); true");
        b.until(WAIT, "document.getElementById('signin-error').textContent.includes('not known')", "the refusal").await;

        // A viewer signs in and sees the host list.
        let sign_in = format!(
            "document.getElementById('token').value = {}; document.getElementById('signin-button').click(); true",
            serde_json::to_string(&viewer).unwrap()
        );
        b.eval(&sign_in);
        b.until(WAIT, "document.body.dataset.rendered === '#/hosts'", "the host list").await;
        // The hostname is there as text, verbatim; none of its markup became elements or ran.
        let names = b.eval("[...document.querySelectorAll('[data-host-name]')].map((a) => a.textContent)");
        assert_eq!(names, serde_json::json!([HOSTNAME]));
        assert_eq!(b.eval("document.querySelectorAll('main img, main script').length"), 0);
        assert_eq!(b.eval("window.pwned === undefined"), true);
        shot(&mut b, "hosts");
        // The policy holds even against a script the page itself would add inline.
        b.eval("const s = document.createElement('script'); s.textContent = 'window.inline = 1'; document.body.append(s); true");
        assert_eq!(b.eval("window.inline === undefined"), true, "an inline script ran");

        // Open the host: its GPU, the MPS memory the task declared, its checks.
        b.eval("document.querySelector('[data-host-name]').click(); true");
        b.until(WAIT, "(document.body.dataset.rendered || '').startsWith('#/host/')", "the host view").await;
        let title = format!(
            "document.getElementById('host-title').textContent === {}",
            serde_json::to_string(HOSTNAME).unwrap()
        );
        b.until(WAIT, &title, "the host's title").await;
        let text = b.eval("document.getElementById('main').innerText").as_str().unwrap().to_string();
        assert!(text.contains("NVIDIA_MPS") && text.contains("4096 MiB / 143771 MiB"), "{text}");
        assert!(text.contains("MPS_DAEMON") && text.contains(host.id.as_str()), "{text}");
        assert_eq!(b.eval("document.querySelectorAll('meter').length >= 2"), true);
        shot(&mut b, "host");

        // The incidents view, empty; then the daemon dies, and the incident arrives live.
        b.eval("location.hash = '#/incidents'; true");
        b.until(WAIT, "document.body.dataset.rendered === '#/incidents'", "the incidents view").await;
        assert_eq!(b.eval("document.querySelectorAll('.incident').length"), 0);
        let pid = daemon_pid(&agent_dir, 0);
        assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
        b.until(WAIT, "document.querySelectorAll('.incident').length === 1", "the incident to appear").await;
        let text = b.eval("document.querySelector('.incident').innerText").as_str().unwrap().to_string();
        assert!(text.contains("OPEN") && text.contains(host.id.as_str()) && text.contains("DETECTED"), "{text}");
        let events = b.eval("document.getElementById('event-list').innerText").as_str().unwrap().to_string();
        assert!(events.contains("incident.opened"), "{events}");
        assert!(text.contains("First failure") && text.contains("Down for"), "{text}");
        shot(&mut b, "incident");

        // Where the work is: the task on the impaired host says so, naming the incident.
        let incident = admin.list_incidents().await.unwrap()[0].incident.id.clone();
        b.eval("location.hash = '#/tasks'; true");
        b.until(WAIT, "document.body.dataset.rendered === '#/tasks'", "the tasks view").await;
        let marked = b.eval("[...document.querySelectorAll('[data-impaired]')].map((e) => e.dataset.impaired)");
        assert_eq!(marked, serde_json::json!([incident]), "the task's host cell names the incident");

        // A service whose definition has no health check is never called healthy.
        let service = CreateService {
            name: "web".into(),
            pool: "gpu".into(),
            task_definition: "infer".into(),
            desired_count: 1,
            ..Default::default()
        };
        admin.create_service(&service).await.unwrap();
        b.eval("location.hash = '#/services'; true");
        b.until(WAIT, "document.body.dataset.rendered === '#/services'", "the services view").await;
        let text = b.eval("document.querySelector('[data-service=web]').innerText").as_str().unwrap().to_string();
        assert!(text.contains("no health check") && !text.contains("Healthy"), "{text}");
        // Its replica's place in traffic is the one the API says, with its reason.
        let shown = admin.describe_service("web").await.unwrap().traffic;
        assert_eq!(shown.len(), 1, "{shown:?}");
        let row = b.eval("document.querySelector('[data-traffic=web] tbody tr').innerText");
        let row = row.as_str().unwrap_or_default().to_string();
        let state = serde_json::to_value(shown[0].state).unwrap();
        assert!(row.contains(&shown[0].task_id.to_string()) && row.contains(state.as_str().unwrap()), "{row}");
        assert!(shown[0].state != mpsfleet_types::discovery::TrafficState::In, "the host is impaired: {shown:?}");
        drop(agent);
    })
    .await;
}

/// `mpsfleet console --no-browser` as the holder of `token`: the sign-in address it prints.
fn console_link(server: &Server, token: &str, ttl_s: u32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mpsfleet"))
        .args(["console", "--no-browser", "--link-ttl", &ttl_s.to_string()])
        .args(["--server", &server.url, "--token", token, "--ca-file", &server.ca_file()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains(token), "the CLI's token is never in the link: {text}");
    text.lines().map(str::trim).find(|l| l.starts_with("https://")).expect("the address").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_link_signs_in_once_with_the_clis_role_and_hides_what_the_cli_hides() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(&dir.path().join("server"));
        let admin = server.admin();
        create_pool(&admin, "gpu").await;
        create_pool(&admin, "idle").await;
        let (_live, _agent) = add_host(&server, "gpu", "node-live", 1).await;
        let (gone, _gone_agent) = add_host(&server, "gpu", "node-gone", 1).await;
        admin.forget_host(gone.as_str(), true).await.unwrap();
        admin.register_taskdef(mps_taskdef("infer", 1024)).await.unwrap();
        // A task that waits in a pool without hosts, stopped: STOPPED at once.
        let run = RunTask { task_definition: "infer".into(), count: 1, pool: "idle".into(), ..Default::default() };
        let stopped = admin.run_task(&run).await.unwrap().tasks[0].id;
        admin.stop_task(&stopped.to_string(), None).await.unwrap();
        admin.run_task(&run).await.unwrap();
        let viewer = viewer_token(&admin, "cli").await;

        let browser_dir = dir.path().join("browser");
        std::fs::create_dir_all(&browser_dir).unwrap();
        let mut b = Browser::start(&browser_dir);
        let link = console_link(&server, &viewer, 30);
        b.navigate(&link);
        b.until(WAIT, "document.body.dataset.rendered === '#/hosts'", "signed in by the link").await;
        // The code left the address; the console holds a token of its own, a viewer's.
        assert_eq!(b.eval("location.hash"), "#/hosts");
        assert_eq!(b.eval("sessionStorage.getItem('mpsfleet.role')"), "viewer");
        assert_eq!(b.eval("sessionStorage.getItem('mpsfleet.token') !== null"), true);
        let own = b.eval("sessionStorage.getItem('mpsfleet.token')").as_str().unwrap().to_string();
        assert_ne!(own, viewer, "the console's token is its own");
        let status = b.eval(
            "fetch('/v1/tokens', { headers: { Authorization: 'Bearer ' + sessionStorage.getItem('mpsfleet.token') } }).then((r) => r.status)",
        );
        assert_eq!(status, 403, "a viewer's console may not list tokens");
        let made = admin.list_tokens().await.unwrap();
        assert!(made.iter().any(|t| t.role == Role::Viewer && t.description.starts_with("console sign-in")), "{made:?}");

        // As the CLI: DEREGISTERED hosts and STOPPED tasks only with the toggle (--all), and a
        // host that left the fleet has no health.
        let rows = "document.querySelectorAll('main tbody tr').length";
        assert_eq!(b.eval(rows), 1, "DEREGISTERED hidden");
        b.eval("document.getElementById('show-all').click(); true");
        b.until(WAIT, &format!("{rows} === 2"), "every host with the toggle").await;
        let text = b.eval("document.getElementById('main').innerText").as_str().unwrap().to_string();
        let gone_row = text.lines().find(|l| l.contains("node-gone")).unwrap_or_default().to_string();
        assert!(gone_row.contains("DEREGISTERED") && !gone_row.contains("IMPAIRED"), "{gone_row}");
        assert!(gone_row.contains(" ago)"), "times are UTC and relative: {gone_row}");
        b.eval("location.hash = '#/tasks'; true");
        b.until(WAIT, "document.body.dataset.rendered === '#/tasks'", "the tasks view").await;
        assert_eq!(b.eval(rows), 2, "STOPPED shown with the toggle on");
        b.eval("document.getElementById('show-all').click(); true");
        b.until(WAIT, &format!("{rows} === 1"), "STOPPED hidden with the toggle off").await;

        // The same link again: refused. A link past its time: refused.
        b.navigate("about:blank");
        b.navigate(&link);
        let refused = "document.getElementById('signin-error').textContent.includes('used already or has expired')";
        b.until(WAIT, refused, "a second use refused").await;
        let short = console_link(&server, &viewer, 1);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        b.navigate("about:blank");
        b.navigate(&short);
        b.until(WAIT, refused, "an expired link refused").await;
        // Refused in the API's words too, and a link cannot make a session of a role above it.
        let resp = server
            .http()
            .post(format!("{}/v1/console/session", server.url))
            .header("x-mpsfleet-console-code", "mpsf_link_not_a_code")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
    })
    .await;
}
