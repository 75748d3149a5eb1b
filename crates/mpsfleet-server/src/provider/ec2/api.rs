//! EC2's Query API as the provider calls it: the endpoint, a request's form, signing with
//! SigV4 and sending it, and which errors may pass.

use super::*;

/// A checked endpoint: the URL requests go to and the `Host` they are signed for.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    pub(super) url: String,
    pub(super) host: String,
    pub(super) loopback: bool,
}

impl Endpoint {
    pub(super) fn parse(text: &str) -> Result<Endpoint, String> {
        let url = reqwest::Url::parse(text).map_err(|e| format!("not a URL ({e}): {text:?}"))?;
        let host = url.host_str().unwrap_or_default().to_string();
        let loopback = matches!(host.as_str(), "127.0.0.1" | "localhost" | "[::1]");
        match url.scheme() {
            "https" => {}
            "http" if loopback => {}
            _ => {
                return Err(format!(
                    "must be https://…, or http:// to 127.0.0.1 or localhost (for tests), got {text:?}"
                ))
            }
        }
        if host.is_empty() || !url.username().is_empty() || url.password().is_some() {
            return Err(format!("must name a host and no credentials, got {text:?}"));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(format!("must have no path, query or fragment, got {text:?}"));
        }
        let host = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host,
        };
        Ok(Endpoint { url: url.to_string(), host, loopback })
    }
}

/// Whether EC2's error `code` (with HTTP `status`) may pass: throttling, the service's own
/// failures, capacity that may come back. Authentication and validation errors do not.
pub(super) fn transient_error(status: u16, code: &str) -> bool {
    status >= 500
        || status == 429
        || matches!(
            code,
            "RequestLimitExceeded"
                | "Throttling"
                | "ThrottlingException"
                | "RequestThrottled"
                | "RequestThrottledException"
                | "TooManyRequestsException"
                | "InternalError"
                | "InternalFailure"
                | "ServiceUnavailable"
                | "Unavailable"
                | "RequestTimeout"
                | "RequestTimeoutException"
                | "InsufficientInstanceCapacity"
                | "InsufficientHostCapacity"
                | "InsufficientCapacity"
        )
}

/// A Query API request's parameters, in order.
pub(super) struct Query {
    pub(super) params: Vec<(String, String)>,
}

impl Query {
    pub(super) fn new(action: &str) -> Query {
        let mut q = Query { params: Vec::new() };
        q.add("Action", action);
        q.add("Version", API_VERSION);
        q
    }

    pub(super) fn add(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.params.push((key.into(), value.into()));
    }

    /// `Filter.N.Name` and `Filter.N.Value.M`.
    pub(super) fn filters(&mut self, filters: &[(&str, &[&str])]) {
        for (i, (name, values)) in filters.iter().enumerate() {
            self.add(format!("Filter.{}.Name", i + 1), *name);
            for (j, value) in values.iter().enumerate() {
                self.add(format!("Filter.{}.Value.{}", i + 1, j + 1), *value);
            }
        }
    }

    pub(super) fn action(&self) -> &str {
        &self.params[0].1
    }

    /// `application/x-www-form-urlencoded`, every byte but the unreserved ones escaped.
    pub(super) fn body(&self) -> String {
        self.params
            .iter()
            .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

pub(super) fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Ec2Provider {
    /// Runs `fut` to completion on the current runtime, or on the provider's own.
    pub(super) fn block_on<F: std::future::Future>(&self, fut: F) -> Result<F::Output, Failure> {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            return Ok(handle.block_on(fut));
        }
        let runtime = self.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
        });
        match runtime {
            Ok(rt) => Ok(rt.block_on(fut)),
            Err(e) => {
                Err(Failure::cloud("a Tokio runtime", "runtime", format!("cannot start one: {e}"), false))
            }
        }
    }

    pub(super) fn client(&self) -> Result<reqwest::Client, Failure> {
        let built = self.client.get_or_init(|| {
            let mut builder =
                reqwest::Client::builder().timeout(REQUEST_TIMEOUT).connect_timeout(CONNECT_TIMEOUT);
            if self.endpoint.loopback {
                builder = builder.no_proxy();
            }
            if let Some(path) = self.env.var("AWS_CA_BUNDLE") {
                let pem =
                    std::fs::read(&path).map_err(|e| format!("cannot read AWS_CA_BUNDLE {path}: {e}"))?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("AWS_CA_BUNDLE {path} is not a PEM bundle: {e}"))?;
                for cert in certs {
                    builder = builder.add_root_certificate(cert);
                }
            }
            builder.build().map_err(|e| format!("cannot build the HTTP client: {}", error_chain(&e)))
        });
        built.clone().map_err(|e| Failure::cloud("EC2", "client", e, false))
    }

    pub(super) fn imds_client(&self) -> Result<reqwest::Client, String> {
        self.imds_client
            .get_or_init(|| {
                reqwest::Client::builder()
                    .timeout(IMDS_TIMEOUT)
                    .connect_timeout(IMDS_CONNECT_TIMEOUT)
                    .no_proxy()
                    .build()
                    .map_err(|e| format!("cannot build the HTTP client: {}", error_chain(&e)))
            })
            .clone()
    }

    /// One signed call; the answer's root element when EC2 answered 200.
    pub(super) fn call(&self, q: &Query) -> Result<XmlElement, Failure> {
        let call = format!("EC2 {}", q.action());
        let creds = self.credentials()?;
        let client = self.client()?;
        let body = q.body();
        let date = sigv4::amz_date(self.now_ms());
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let mut headers: Vec<(&str, &[u8])> = vec![
            ("content-type", content_type.as_bytes()),
            ("host", self.endpoint.host.as_bytes()),
            ("x-amz-date", date.as_bytes()),
        ];
        if let Some(token) = &creds.session_token {
            headers.push(("x-amz-security-token", token.as_bytes()));
        }
        let names: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
        let req =
            sigv4::Request { method: "POST", path: "/", query: "", headers: &headers, body: body.as_bytes() };
        let auth = sigv4::sign(
            &req,
            &creds.access_key_id,
            &creds.secret_access_key,
            &self.config.region,
            "ec2",
            &date,
            &names,
        );
        let mut request = client
            .post(&self.endpoint.url)
            .header("content-type", content_type)
            .header("host", &self.endpoint.host)
            .header("x-amz-date", &date)
            .header("authorization", auth);
        if let Some(token) = &creds.session_token {
            request = request.header("x-amz-security-token", token);
        }
        let request = request.body(body);
        let (status, text) = self
            .block_on(async move {
                let mut resp = request.send().await?;
                let status = resp.status().as_u16();
                let mut bytes = Vec::new();
                while let Some(chunk) = resp.chunk().await? {
                    if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                        return Ok((status, None));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok::<_, reqwest::Error>((status, Some(bytes)))
            })?
            .map_err(|e| {
                let code = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connection"
                } else {
                    "request"
                };
                let chain = error_chain(&e);
                let message = if chain.contains(&self.endpoint.url) {
                    chain
                } else {
                    format!("{chain} ({})", self.endpoint.url)
                };
                Failure::cloud(&call, code, message, true)
            })?;
        let Some(bytes) = text else {
            return Err(Failure::cloud(
                &call,
                "bad answer",
                format!("more than {MAX_ANSWER_BYTES} bytes"),
                true,
            ));
        };
        let text = String::from_utf8_lossy(&bytes);
        let parsed = parse_xml(&text);
        if status == 200 {
            return parsed.map_err(|e| {
                Failure::cloud(
                    &call,
                    "bad answer",
                    format!("not the expected XML ({e}): {}", head(&text, 200)),
                    true,
                )
            });
        }
        match parsed.ok().as_ref().and_then(parse_error) {
            Some((code, message, request_id)) => {
                let transient = transient_error(status, &code);
                let id =
                    if request_id.is_empty() { String::new() } else { format!(", request id {request_id}") };
                Err(Failure::cloud(&call, &code, format!("{message} (HTTP {status}{id})"), transient))
            }
            None => Err(Failure::cloud(
                &call,
                &format!("HTTP {status}"),
                head(&text, 200),
                transient_error(status, ""),
            )),
        }
    }
}
