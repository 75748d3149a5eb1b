//! A headless Chromium (Debian's `chromium`) driven over the DevTools protocol on pipes
//! (`--remote-debugging-pipe`, through two FIFOs: no WebSocket client needed): one page, its
//! navigation, script evaluation and screenshots. Used by `mpsfleet bench console` and by the
//! console's test (`tests/console.rs`, which includes this file).

#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // waits measure wall time, as a benchmark does

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn chromium() -> PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("chromium is not installed: apt-get install chromium (scripts/test.sh installs it)")
        })
}

/// A headless Chromium and one page of it, over the DevTools protocol.
pub struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: mpsc::Receiver<serde_json::Value>,
    next: u64,
    session: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    pub fn start(dir: &Path) -> Browser {
        let (tx, rx) = (dir.join("to-chromium"), dir.join("from-chromium"));
        for f in [&tx, &rx] {
            assert!(Command::new("mkfifo").arg(f).status().unwrap().success());
        }
        // Chromium reads commands on fd 3 and writes answers on fd 4.
        let script = format!(
            "exec \"$0\" --headless=new --no-sandbox --disable-gpu --no-first-run --ignore-certificate-errors \
             --user-data-dir={} --remote-debugging-pipe about:blank 3<{} 4>{}",
            dir.join("profile").display(),
            tx.display(),
            rx.display()
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .arg(chromium())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("chromium.log")).unwrap())
            .spawn()
            .unwrap();
        let to = std::fs::OpenOptions::new().write(true).open(&tx).unwrap();
        let from = std::fs::File::open(&rx).unwrap();
        let (send, recv) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(from);
            let mut buf = Vec::new();
            while r.read_until(0, &mut buf).map(|n| n > 0).unwrap_or(false) {
                buf.pop();
                if let Ok(v) = serde_json::from_slice(&buf) {
                    if send.send(v).is_err() {
                        return;
                    }
                }
                buf.clear();
            }
        });
        let mut b = Browser { child, to, from: recv, next: 0, session: String::new() };
        let target = b.call("Target.createTarget", serde_json::json!({"url": "about:blank"}), false);
        let attached = b.call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target["targetId"], "flatten": true}),
            false,
        );
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b
    }

    /// One command's result (on the page's session, or the browser's).
    pub fn call(&mut self, method: &str, params: serde_json::Value, on_page: bool) -> serde_json::Value {
        self.send(method, params, on_page).unwrap_or_else(|e| panic!("{e}"))
    }

    /// One command's result, or the browser's error.
    fn send(
        &mut self,
        method: &str,
        params: serde_json::Value,
        on_page: bool,
    ) -> Result<serde_json::Value, String> {
        self.next += 1;
        let mut msg = serde_json::json!({"id": self.next, "method": method, "params": params});
        if on_page {
            msg["sessionId"] = self.session.clone().into();
        }
        let mut bytes = serde_json::to_vec(&msg).map_err(|e| e.to_string())?;
        bytes.push(0);
        self.to.write_all(&bytes).map_err(|e| format!("cannot write to chromium: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.from.recv_timeout(left).map_err(|_| format!("chromium did not answer {method}"))?;
            if v["id"] == self.next {
                if let Some(e) = v.get("error") {
                    return Err(format!("{method}: {e}"));
                }
                return Ok(v["result"].clone());
            }
        }
    }

    /// The value of `expr`, or why there is none (an exception; the page between documents).
    fn try_eval(&mut self, expr: &str) -> Result<serde_json::Value, String> {
        let params = serde_json::json!({"expression": expr, "returnByValue": true, "awaitPromise": true});
        let r = self.send("Runtime.evaluate", params, true)?;
        match r.get("exceptionDetails") {
            Some(e) => Err(format!("{expr}: {e}")),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    pub fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({"url": url}), true);
    }

    /// The value of `expr` in the page (a promise is awaited).
    pub fn eval(&mut self, expr: &str) -> serde_json::Value {
        self.try_eval(expr).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Reloads the page.
    pub fn reload(&mut self) {
        self.call("Page.reload", serde_json::json!({}), true);
    }

    /// Waits until `expr` is true in the page (an evaluation that fails while the page loads is
    /// tried again); fails with the page's text.
    pub async fn until(&mut self, limit: Duration, expr: &str, what: &str) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.try_eval(expr) == Ok(serde_json::Value::Bool(true)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let text = self.try_eval("document.body.innerText").unwrap_or_else(|e| e.into());
        panic!("timed out waiting for {what} ({expr}); the page says:\n{text}");
    }
}

impl Browser {
    /// A PNG of the page as it is now, written to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", serde_json::json!({"format": "png"}), true);
        let png = base64_decode(shot["data"].as_str().unwrap_or_default());
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// The page's viewport, in CSS pixels.
    pub fn viewport(&mut self, width: u32, height: u32) {
        let size =
            serde_json::json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        self.call("Emulation.setDeviceMetricsOverride", size, true);
    }
}

/// Standard base64 (the DevTools protocol's binary data).
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes() {
        assert_eq!(super::base64_decode("aGVsbG8="), b"hello");
        assert_eq!(super::base64_decode("iVBORw0K"), [0x89, b'P', b'N', b'G', 0x0d, 0x0a]);
    }
}
