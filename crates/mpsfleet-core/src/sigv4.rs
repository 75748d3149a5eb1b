//! AWS Signature Version 4 (`AWS4-HMAC-SHA256`): parsing the `Authorization` header, verifying a
//! request signed by botocore (the AWS CLI, boto3) and signing one, over the canonical request
//! AWS describes. HMAC-SHA256 is built here on `sha2`; the date conversion is written out, so
//! nothing here reads the time: the caller passes it in [`Expect::now_ms`].

use sha2::{Digest, Sha256};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const MAX_AUTHORIZATION_LEN: usize = 4096;
const MAX_SIGNED_HEADERS: usize = 64;
const MAX_HEADER_NAME_LEN: usize = 128;
const MS_PER_DAY: u64 = 86_400_000;

/// What the verifier and signer need of a request. Header names compare case-insensitively; a
/// header given several times is joined with ',' as SigV4 says.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The HTTP method, e.g. `POST`.
    pub method: &'a str,
    /// The path as sent, e.g. `/`, still percent-encoded as received.
    pub path: &'a str,
    /// The raw query string without the `?`; may be empty.
    pub query: &'a str,
    /// The headers as (name, value bytes), in the order received.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The body as received.
    pub body: &'a [u8],
}

/// The parsed `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization {
    /// The access key id, first part of the credential.
    pub access_key_id: String,
    /// The scope's date, `YYYYMMDD`.
    pub date: String,
    /// The scope's region.
    pub region: String,
    /// The scope's service.
    pub service: String,
    /// The signed header names, lowercase, in the order listed (which is sorted).
    pub signed_headers: Vec<String>,
    /// The signature, 64 lowercase hex digits.
    pub signature: String,
}

/// What [`verify`] expects of a request. What is checked: algorithm AWS4-HMAC-SHA256;
/// Credential=KEY/DATE/REGION/SERVICE/aws4_request; SignedHeaders non-empty, sorted lowercase,
/// containing `host` and every name in `required_headers`; Signature 64 hex.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    /// The service the credential must be scoped to, e.g. `ecs`.
    pub service: &'a str,
    /// The region the credential must be scoped to; `None` accepts any.
    pub region: Option<&'a str>,
    /// Headers that must be signed besides `host`, any case.
    pub required_headers: &'a [&'a str],
    /// The server's time, Unix milliseconds.
    pub now_ms: u64,
    /// How far X-Amz-Date may be from `now_ms`, either way (AWS allows 15 minutes).
    pub max_skew_ms: u64,
}

/// Why a request's signature is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigError {
    /// No Authorization header, or not AWS4-HMAC-SHA256 (the caller maps it to
    /// MissingAuthenticationToken or IncompleteSignature).
    #[error("no AWS4-HMAC-SHA256 Authorization header")]
    Missing,
    /// The header does not parse: which part (Credential, SignedHeaders, Signature) and why.
    #[error("{0}")]
    Incomplete(String),
    /// X-Amz-Date missing or malformed.
    #[error("{0}")]
    BadDate(String),
    /// X-Amz-Date outside the skew window; the message carries both times, as AWS's does.
    #[error("{0}")]
    Expired(String),
    /// The credential scope's date, region or service is not the one expected.
    #[error("{0}")]
    Scope(String),
    /// A signed header absent from the request, or a required header not signed.
    #[error("{0}")]
    Headers(String),
    /// The signature does not match.
    #[error(
        "The request signature we calculated does not match the signature you provided. \
         Check your AWS Secret Access Key and signing method."
    )]
    Mismatch,
}

fn incomplete(msg: impl Into<String>) -> SigError {
    SigError::Incomplete(msg.into())
}

/// Parses an `Authorization` header value:
/// `AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders=a;b, Signature=HEX`.
pub fn parse_authorization(value: &str) -> Result<Authorization, SigError> {
    let rest = value.strip_prefix(ALGORITHM).filter(|r| r.starts_with(' ')).ok_or(SigError::Missing)?;
    if value.len() > MAX_AUTHORIZATION_LEN {
        return Err(incomplete(format!("Authorization header longer than {MAX_AUTHORIZATION_LEN} bytes")));
    }
    let mut fields: [Option<&str>; 3] = [None; 3];
    for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, val) = part.split_once('=').unwrap_or((part, ""));
        let Some(i) = ["Credential", "SignedHeaders", "Signature"].iter().position(|k| *k == key) else {
            return Err(incomplete(format!("unknown Authorization component '{key}'")));
        };
        if fields[i].replace(val).is_some() {
            return Err(incomplete(format!("{key} given twice")));
        }
    }
    let [Some(credential), Some(signed), Some(signature)] = fields else {
        let absent = ["Credential", "SignedHeaders", "Signature"]
            [fields.iter().position(Option::is_none).unwrap_or(0)];
        return Err(incomplete(format!("Authorization header requires {absent}")));
    };

    let parts: Vec<&str> = credential.split('/').collect();
    let [key, date, region, service, "aws4_request"] = parts[..] else {
        return Err(incomplete("Credential must be KEY/DATE/REGION/SERVICE/aws4_request"));
    };
    if [key, region, service].contains(&"") || date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return Err(incomplete("Credential must be KEY/YYYYMMDD/REGION/SERVICE/aws4_request"));
    }

    let names: Vec<&str> = signed.split(';').collect();
    if names.len() > MAX_SIGNED_HEADERS {
        return Err(incomplete(format!("SignedHeaders lists more than {MAX_SIGNED_HEADERS} headers")));
    }
    if names.iter().any(|n| n.len() > MAX_HEADER_NAME_LEN) {
        return Err(incomplete(format!("SignedHeaders has a name longer than {MAX_HEADER_NAME_LEN} bytes")));
    }
    let bad = |n: &&str| n.is_empty() || !n.bytes().all(|b| b.is_ascii_graphic() && !b.is_ascii_uppercase());
    if names.iter().any(bad) || names.windows(2).any(|w| w[0] >= w[1]) {
        return Err(incomplete("SignedHeaders must be lowercase names, sorted, without repeats"));
    }
    if signature.len() != 64 || !signature.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(incomplete("Signature must be 64 lowercase hex digits"));
    }
    Ok(Authorization {
        access_key_id: key.to_string(),
        date: date.to_string(),
        region: region.to_string(),
        service: service.to_string(),
        signed_headers: names.into_iter().map(str::to_string).collect(),
        signature: signature.to_string(),
    })
}

/// Verifies `auth` over `req` with `secret`: X-Amz-Date present (basic ISO 8601
/// `YYYYMMDDTHHMMSSZ`), within `max_skew_ms` of `now_ms`, its date equal to the scope's date,
/// service equal, region equal when given, every signed header present; then re-signs and
/// compares the signatures in constant time.
pub fn verify(req: &Request, auth: &Authorization, secret: &str, expect: &Expect) -> Result<(), SigError> {
    let raw = header_value(req, "x-amz-date")
        .ok_or_else(|| SigError::BadDate("X-Amz-Date header missing".into()))?;
    let amz = String::from_utf8_lossy(&raw);
    let t = parse_amz_date(&amz)
        .ok_or_else(|| SigError::BadDate(format!("X-Amz-Date '{amz}' is not YYYYMMDDTHHMMSSZ")))?;
    let (now, skew) = (expect.now_ms, expect.max_skew_ms);
    let (earliest, latest) = (now.saturating_sub(skew), now.saturating_add(skew));
    if t < earliest || t > latest {
        let (state, rel, bound, op) = match t < earliest {
            true => ("expired", "now earlier", earliest, '-'),
            false => ("not yet current", "still later", latest, '+'),
        };
        let (bound, now, min) = (amz_date(bound), amz_date(now), skew / 60_000);
        let msg = format!("Signature {state}: {amz} is {rel} than {bound} ({now} {op} {min} min.)");
        return Err(SigError::Expired(msg));
    }
    if auth.date != amz[..8] {
        return Err(SigError::Scope(format!(
            "Date in Credential scope does not match YYYYMMDD from X-Amz-Date: '{}' != '{}'",
            auth.date,
            &amz[..8]
        )));
    }
    for (what, got, want) in
        [("service", &auth.service, Some(expect.service)), ("region", &auth.region, expect.region)]
    {
        if let Some(want) = want.filter(|w| w != got) {
            return Err(SigError::Scope(format!(
                "Credential should be scoped to {what} '{want}', not '{got}'"
            )));
        }
    }
    for required in std::iter::once(&"host").chain(expect.required_headers) {
        if !auth.signed_headers.iter().any(|s| s.eq_ignore_ascii_case(required)) {
            let name = required.to_ascii_lowercase();
            return Err(SigError::Headers(format!("header '{name}' must be signed")));
        }
    }
    if let Some(absent) = auth.signed_headers.iter().find(|n| header_value(req, n).is_none()) {
        return Err(SigError::Headers(format!("signed header '{absent}' is not in the request")));
    }
    let names: Vec<&str> = auth.signed_headers.iter().map(String::as_str).collect();
    let computed = signature(req, secret, &amz, &auth.region, &auth.service, &names);
    match constant_time_eq(computed.as_bytes(), auth.signature.as_bytes()) {
        true => Ok(()),
        false => Err(SigError::Mismatch),
    }
}

/// Signs `req`, which must already carry `host`, `x-amz-date` (equal to `amz_date`) and the
/// headers to sign, and returns the `Authorization` header value. `signed` lists the headers to
/// sign, any case; `amz_date` is `YYYYMMDDTHHMMSSZ`.
pub fn sign(
    req: &Request,
    access_key_id: &str,
    secret: &str,
    region: &str,
    service: &str,
    amz_date: &str,
    signed: &[&str],
) -> String {
    let mut names: Vec<String> = signed.iter().map(|n| n.to_ascii_lowercase()).collect();
    names.sort();
    names.dedup();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let sig = signature(req, secret, amz_date, region, service, &refs);
    let date = amz_date.get(..8).unwrap_or(amz_date);
    let names = names.join(";");
    format!(
        "{ALGORITHM} Credential={access_key_id}/{date}/{region}/{service}/aws4_request, \
         SignedHeaders={names}, Signature={sig}"
    )
}

/// `YYYYMMDDTHHMMSSZ` (UTC) for a Unix time in milliseconds.
pub fn amz_date(unix_ms: u64) -> String {
    let secs = (unix_ms % MS_PER_DAY) / 1000;
    let (y, m, d) = civil_from_days((unix_ms / MS_PER_DAY) as i64);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Unix milliseconds of a `YYYYMMDDTHHMMSSZ` date from 1970 on, or `None` if malformed.
fn parse_amz_date(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| {
        b[r].iter().try_fold(0u64, |n, &c| c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0')))
    };
    let (y, m, d, hh, mm, ss) = (num(0..4)?, num(4..6)?, num(6..8)?, num(9..11)?, num(11..13)?, num(13..15)?);
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = [31, 28 + u64::from(leap), 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let day_ok = (1..=12).contains(&m) && (1..=month_days[m as usize - 1]).contains(&d);
    if y < 1970 || !day_ok || hh > 23 || mm > 59 || ss > 59 {
        return None;
    }
    let days = days_from_civil(y as i64, m as u32, d as u32) as u64;
    Some(days * MS_PER_DAY + (hh * 3600 + mm * 60 + ss) * 1000)
}

/// (year, month, day) of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days since 1970-01-01 of a civil date; the inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let (era, yoe) = (y.div_euclid(400), y.rem_euclid(400));
    let doy = (153 * i64::from((m + 9) % 12) + 2) / 5 + i64::from(d) - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

/// The hex signature of `req` for the sorted lowercase header names `signed`.
fn signature(req: &Request, secret: &str, amz: &str, region: &str, service: &str, signed: &[&str]) -> String {
    let date = amz.get(..8).unwrap_or(amz);
    let hashed = hex(&Sha256::digest(canonical_request(req, signed)));
    let string_to_sign = format!("{ALGORITHM}\n{amz}\n{date}/{region}/{service}/aws4_request\n{hashed}");
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    hex(&hmac(&key, string_to_sign.as_bytes()))
}

/// Method, URI, query, headers, signed header list and body hash, each on its own line.
fn canonical_request(req: &Request, signed: &[&str]) -> Vec<u8> {
    let uri = if req.path.is_empty() { "/".to_string() } else { uri_encode(req.path.as_bytes(), true) };
    let mut out = format!("{}\n{uri}\n{}\n", req.method, canonical_query(req.query)).into_bytes();
    for name in signed {
        out.extend_from_slice(format!("{name}:").as_bytes());
        out.extend_from_slice(&header_value(req, name).unwrap_or_default());
        out.push(b'\n');
    }
    out.extend_from_slice(format!("\n{}\n{}", signed.join(";"), hex(&Sha256::digest(req.body))).as_bytes());
    out
}

/// Each name and value decoded then encoded again, sorted by name, then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .map(|(n, v)| {
            (
                uri_encode(&percent_decode(n.as_bytes()), false),
                uri_encode(&percent_decode(v.as_bytes()), false),
            )
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join("&")
}

/// `%XX` decoded where XX is two hex digits; anything else kept as it is.
fn percent_decode(s: &[u8]) -> Vec<u8> {
    let (mut out, mut i) = (Vec::with_capacity(s.len()), 0);
    while i < s.len() {
        let escaped = s
            .get(i + 1..i + 3)
            .filter(|h| s[i] == b'%' && h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        out.push(escaped.unwrap_or(s[i]));
        i += if escaped.is_some() { 3 } else { 1 };
    }
    out
}

/// Every byte outside AWS's unreserved set (and '/' when `keep_slash`) as `%XX`, upper-case hex.
fn uri_encode(bytes: &[u8], keep_slash: bool) -> String {
    let keep = |b: u8| b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/');
    bytes.iter().map(|&b| if keep(b) { char::from(b).to_string() } else { format!("%{b:02X}") }).collect()
}

/// The canonical value of header `name`: every occurrence trimmed, runs of spaces and tabs
/// collapsed to one space, joined with ','. `None` if the request lacks it.
fn header_value(req: &Request, name: &str) -> Option<Vec<u8>> {
    let values: Vec<Vec<u8>> = req
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| {
            v.split(|b| matches!(b, b' ' | b'\t')).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(&b' ')
        })
        .collect();
    (!values.is_empty()).then(|| values.join(&b','))
}

/// HMAC-SHA256 (RFC 2104): a key longer than the 64-byte block is hashed first.
fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new().chain_update(block.map(|b| b ^ 0x36)).chain_update(msg).finalize();
    Sha256::new().chain_update(block.map(|b| b ^ 0x5c)).chain_update(inner).finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `a == b`, looking at every byte whatever the differences (lengths are public).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The headers of a signed AWS JSON 1.1 call to `host` (`X-Amz-Target: target`, body `body`),
/// signed with SigV4 at `unix_ms`: `(x-amz-date, authorization)`. What a client of an AWS
/// JSON service sends besides `content-type` and `x-amz-target`.
pub fn sign_json_call(
    host: &str,
    target: &str,
    body: &[u8],
    key: (&str, &str),
    region: &str,
    service: &str,
    unix_ms: u64,
) -> (String, String) {
    let date = amz_date(unix_ms);
    let headers: [(&str, &[u8]); 4] = [
        ("content-type", b"application/x-amz-json-1.1"),
        ("host", host.as_bytes()),
        ("x-amz-date", date.as_bytes()),
        ("x-amz-target", target.as_bytes()),
    ];
    let req = Request { method: "POST", path: "/", query: "", headers: &headers, body };
    let signed = ["content-type", "host", "x-amz-date", "x-amz-target"];
    let auth = sign(&req, key.0, key.1, region, service, &date, &signed);
    (date, auth)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AKIDEXAMPLE";
    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    const AT: &str = "20261205T013000Z";
    const SIGNED: &[&str] = &["content-type", "host", "x-amz-date", "x-amz-target"];
    const REQUIRED: &[&str] = &["X-Amz-Date", "x-amz-target"];
    /// Made by botocore 1.43's SigV4Auth for ECS ListClusters with body `{}` at [`AT`].
    const ECS_AUTH: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261205/us-east-1/ecs/aws4_request, \
        SignedHeaders=content-type;host;x-amz-date;x-amz-target, \
        Signature=5d40a6dd1070b1f66c510be145fcf3bce7f8e8c17845071806baa22c0e08d3ef";

    fn ecs_headers(date: &'static str) -> Vec<(&'static str, &'static [u8])> {
        let target: &[u8] = b"AmazonEC2ContainerServiceV20141113.ListClusters";
        vec![
            ("Content-Type", b"application/x-amz-json-1.1"),
            ("Host", b"ecs.us-east-1.amazonaws.com"),
            ("X-Amz-Date", date.as_bytes()),
            ("X-Amz-Target", target),
        ]
    }

    fn post<'a>(headers: &'a [(&'a str, &'a [u8])], body: &'a [u8]) -> Request<'a> {
        Request { method: "POST", path: "/", query: "", headers, body }
    }

    fn expect(now: &str) -> Expect<'static> {
        let (service, region, now_ms) = ("ecs", Some("us-east-1"), parse_amz_date(now).unwrap());
        Expect { service, region, required_headers: REQUIRED, now_ms, max_skew_ms: 15 * 60_000 }
    }

    fn check(req: &Request, auth: &str, secret: &str, exp: &Expect) -> Result<(), SigError> {
        verify(req, &parse_authorization(auth)?, secret, exp)
    }

    /// The "get-vanilla" and "get-vanilla-query-order-key-case" vectors of AWS's SigV4 test suite.
    #[test]
    fn aws_test_suite_vectors() {
        let headers: &[(&str, &[u8])] =
            &[("Host", b"example.amazonaws.com"), ("X-Amz-Date", b"20150830T123600Z")];
        for (query, sig) in [
            ("", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
            (
                "Param2=value2&Param1=value1",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
            ),
        ] {
            let req = Request { method: "GET", path: "/", query, headers, body: b"" };
            let auth =
                sign(&req, KEY, SECRET, "us-east-1", "service", "20150830T123600Z", &["Host", "X-Amz-Date"]);
            let scope = "AKIDEXAMPLE/20150830/us-east-1/service/aws4_request";
            let want = format!(
                "AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders=host;x-amz-date, Signature={sig}"
            );
            assert_eq!(auth, want);
            let exp = Expect { service: "service", required_headers: &[], ..expect("20150830T123600Z") };
            check(&req, &auth, SECRET, &exp).unwrap();
        }
    }

    /// Vectors made by botocore 1.43's SigV4Auth: ECS with and without a session token, and a
    /// request with a query, a header with runs of whitespace, and a leap-day date.
    #[test]
    fn botocore_vectors() {
        let headers = ecs_headers(AT);
        assert_eq!(sign(&post(&headers, b"{}"), KEY, SECRET, "us-east-1", "ecs", AT, SIGNED), ECS_AUTH);
        check(&post(&headers, b"{}"), ECS_AUTH, SECRET, &expect(AT)).unwrap();

        let mut headers = ecs_headers(AT);
        headers.push(("X-Amz-Security-Token", b"FQoGZXIvYXdzEXAMPLETOKEN"));
        let auth = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261205/us-east-1/ecs/aws4_request, \
            SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target, \
            Signature=f5dc84505899b58a49ad73bfc45226e13aee1834ab35b8faab1520ecd29dfd72";
        check(&post(&headers, b"{}"), auth, SECRET, &expect(AT)).unwrap();

        let headers: &[(&str, &[u8])] = &[
            ("Content-Type", b"application/x-amz-json-1.1"),
            ("My-Header", b"  a   b\t c  "),
            ("host", b"ecs.us-east-1.amazonaws.com"),
            ("X-Amz-Date", b"20240229T235959Z"),
        ];
        let req = Request { query: "b=x%20y&a=2&a=1&c", ..post(headers, br#"{"cluster":"default"}"#) };
        let signed = ["content-type", "host", "my-header", "x-amz-date"];
        let auth = sign(&req, KEY, SECRET, "eu-west-1", "ecs", "20240229T235959Z", &signed);
        assert!(auth.ends_with("Signature=ca8a7b7c51c303d381f045d39e96caa193348b7ec268ce6029cfddf376eafe5c"));
        let exp = Expect { region: None, required_headers: &[], ..expect("20240229T235959Z") };
        check(&req, &auth, SECRET, &exp).unwrap();
    }

    #[test]
    fn canonical_forms_and_hmac() {
        let headers: &[(&str, &[u8])] = &[("X-A", b" 1  2 "), ("x-a", b"3"), ("X-B", b"")];
        let req =
            Request { method: "GET", path: "/a b/c%2F", query: "z=%7e&y&z=+&w=%+1", headers, body: b"" };
        let canonical = String::from_utf8(canonical_request(&req, &["x-a", "x-b"])).unwrap();
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let want = format!("GET\n/a%20b/c%252F\nw=%25%2B1&y=&z=%2B&z=~\nx-a:1 2,3\nx-b:\n\nx-a;x-b\n{empty}");
        assert_eq!(canonical, want);
        // RFC 4231 cases 1 and 6 (a key longer than the block).
        let mac = hex(&hmac(&[0x0b; 20], b"Hi There"));
        assert_eq!(mac, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
        let mac = hex(&hmac(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First"));
        assert_eq!(mac, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    }

    #[test]
    fn refuses_what_does_not_verify() {
        let headers = ecs_headers(AT);
        let mut changed = headers.clone();
        changed[3].1 = b"AmazonEC2ContainerServiceV20141113.DeleteCluster";
        for (req, secret) in
            [(post(&headers, b"{ }"), SECRET), (post(&changed, b"{}"), SECRET), (post(&headers, b"{}"), "x")]
        {
            assert_eq!(check(&req, ECS_AUTH, secret, &expect(AT)), Err(SigError::Mismatch));
        }
        assert!(SigError::Mismatch.to_string().starts_with("The request signature we calculated does not"));

        let token: &[&str] = &["host", "x-amz-date", "x-amz-security-token", "x-amz-target"];
        let cases = [
            ("us-east-1", "ecs", "20261204T013000Z", SIGNED, "Scope(\"Date in Credential scope does not"),
            (
                "us-east-1",
                "ec2",
                AT,
                SIGNED,
                "Scope(\"Credential should be scoped to service 'ecs', not 'ec2'",
            ),
            (
                "eu-west-1",
                "ecs",
                AT,
                SIGNED,
                "Scope(\"Credential should be scoped to region 'us-east-1', not",
            ),
            ("us-east-1", "ecs", AT, &SIGNED[..3], "Headers(\"header 'x-amz-target' must be signed"),
            ("us-east-1", "ecs", AT, &SIGNED[2..], "Headers(\"header 'host' must be signed"),
            ("us-east-1", "ecs", AT, token, "Headers(\"signed header 'x-amz-security-token' is not in"),
        ];
        let mut with_token = headers.clone();
        with_token.push(("X-Amz-Security-Token", b"t"));
        for (region, service, date, signed, want) in cases {
            let auth = sign(&post(&with_token, b"{}"), KEY, SECRET, region, service, date, signed);
            let err = check(&post(&headers, b"{}"), &auth, SECRET, &expect(AT)).unwrap_err();
            assert!(format!("{err:?}").contains(want), "{auth}: {err:?}");
        }
        let other_region = sign(&post(&headers, b"{}"), KEY, SECRET, "eu-west-1", "ecs", AT, SIGNED);
        check(&post(&headers, b"{}"), &other_region, SECRET, &Expect { region: None, ..expect(AT) }).unwrap();
    }

    #[test]
    fn refuses_dates_outside_the_window_or_malformed() {
        let headers = ecs_headers("20261205T010000Z");
        let auth = sign(&post(&headers, b"{}"), KEY, SECRET, "us-east-1", "ecs", "20261205T010000Z", SIGNED);
        check(&post(&headers, b"{}"), &auth, SECRET, &expect("20261205T011500Z")).unwrap();
        check(&post(&headers, b"{}"), &auth, SECRET, &expect("20261205T004500Z")).unwrap();
        let late = "Signature expired: 20261205T010000Z is now earlier than 20261205T011500Z \
                    (20261205T013000Z - 15 min.)";
        let early = "Signature not yet current: 20261205T010000Z is still later than 20261205T005959Z \
                     (20261205T004459Z + 15 min.)";
        for (now, msg) in [("20261205T013000Z", late), ("20261205T004459Z", early)] {
            let err = check(&post(&headers, b"{}"), &auth, SECRET, &expect(now));
            assert_eq!(err, Err(SigError::Expired(msg.to_string())));
        }
        for bad in ["", "20261205T01000Z", "2026-12-05T01:00:00Z", "20261305T010000Z", "20230229T010000Z"] {
            let mut headers = headers.clone();
            headers[2].1 = bad.as_bytes();
            let err = check(&post(&headers, b"{}"), &auth, SECRET, &expect("20261205T010000Z"));
            assert!(matches!(err, Err(SigError::BadDate(_))), "{bad}: {err:?}");
        }
        let no_date: Vec<_> = headers.iter().filter(|h| h.0 != "X-Amz-Date").copied().collect();
        let err = check(&post(&no_date, b"{}"), &auth, SECRET, &expect("20261205T010000Z"));
        assert_eq!(err, Err(SigError::BadDate("X-Amz-Date header missing".into())));
    }

    #[test]
    fn parses_and_refuses_malformed_headers() {
        let auth = parse_authorization(ECS_AUTH).unwrap();
        assert_eq!(
            [&auth.access_key_id, &auth.date, &auth.region, &auth.service],
            [KEY, "20261205", "us-east-1", "ecs"]
        );
        assert_eq!(auth.signed_headers, SIGNED);
        assert_eq!(parse_authorization(&ECS_AUTH.replace(", ", ",")), Ok(auth));
        for missing in
            ["", "AWS4-HMAC-SHA1 Credential=x", "AWS4-HMAC-SHA256", "AWS4-HMAC-SHA256X a", "Bearer abc"]
        {
            assert_eq!(parse_authorization(missing), Err(SigError::Missing), "{missing}");
        }
        let sig = "Signature=5d40a6dd1070b1f66c510be145fcf3bce7f8e8c17845071806baa22c0e08d3ef";
        let many: Vec<String> = (0..65).map(|i| format!("h{i:02}")).collect();
        let fill = |t: &str| {
            t.replace("{c}", "Credential=AKIDEXAMPLE/20261205/us-east-1/ecs/aws4_request")
                .replace("{s}", sig)
                .replace("{S}", &sig.to_uppercase().replace("SIGNATURE", "Signature"))
                .replace("{many}", &many.join(";"))
                .replace("{long}", &"h".repeat(129))
                .replace("{huge}", &"x".repeat(4096))
        };
        let cases = [
            ("{c}, {s}", "requires SignedHeaders"),
            ("SignedHeaders=host, {s}", "requires Credential"),
            ("{c}, SignedHeaders=host", "requires Signature"),
            ("{c}, SignedHeaders=host, Signature=abc", "Signature must be"),
            ("{c}, SignedHeaders=host, {S}", "Signature must be"),
            ("Credential=K/20261205/us-east-1/ecs, SignedHeaders=host, {s}", "Credential must be"),
            (
                "Credential=K/2026125/us-east-1/ecs/aws4_request, SignedHeaders=host, {s}",
                "Credential must be",
            ),
            (
                "Credential=/20261205/us-east-1/ecs/aws4_request, SignedHeaders=host, {s}",
                "Credential must be",
            ),
            ("{c}, SignedHeaders=x-amz-date;host, {s}", "SignedHeaders must be"),
            ("{c}, SignedHeaders=host;host, {s}", "SignedHeaders must be"),
            ("{c}, SignedHeaders=Host, {s}", "SignedHeaders must be"),
            ("{c}, SignedHeaders=host;;x, {s}", "SignedHeaders must be"),
            ("{c}, SignedHeaders={many}, {s}", "more than 64 headers"),
            ("{c}, SignedHeaders={long}, {s}", "longer than 128 bytes"),
            ("{c}, SignedHeaders=host, {s}, x={huge}", "longer than 4096 bytes"),
            ("{c}, {c}, SignedHeaders=host, {s}", "Credential given twice"),
            ("{c}, SignedHeaders=host, {s}, Extra=1", "unknown Authorization component 'Extra'"),
        ];
        for (rest, want) in cases {
            match parse_authorization(&format!("AWS4-HMAC-SHA256 {}", fill(rest))) {
                Err(SigError::Incomplete(m)) => assert!(m.contains(want), "{rest}: {m}"),
                other => panic!("{rest}: {other:?}"),
            }
        }
    }

    #[test]
    fn amz_dates_of_known_instants() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(1_700_000_000_000), "20231114T221320Z");
        assert_eq!(amz_date(951_782_400_000), "20000229T000000Z");
        assert_eq!(amz_date(1_709_251_199_999), "20240229T235959Z");
        assert_eq!(amz_date(4_107_542_400_000), "21000301T000000Z");
        for unix_ms in (0..400u64).map(|i| i * 31_622_400_123 + i * 7) {
            assert_eq!(parse_amz_date(&amz_date(unix_ms)), Some(unix_ms - unix_ms % 1000), "{unix_ms}");
        }
        assert_eq!(parse_amz_date("19691231T235959Z"), None);
    }

    #[test]
    fn a_signed_json_call_verifies() {
        let body = br#"{"count":1}"#;
        let (date, auth) =
            sign_json_call("h:1", "Svc.Op", body, ("AKID", "s3cret"), "us-east-1", "ecs", 1_700_000_000_000);
        let headers: [(&str, &[u8]); 4] = [
            ("content-type", b"application/x-amz-json-1.1"),
            ("host", b"h:1"),
            ("x-amz-date", date.as_bytes()),
            ("x-amz-target", b"Svc.Op"),
        ];
        let req = Request { method: "POST", path: "/", query: "", headers: &headers, body };
        let expect = Expect {
            service: "ecs",
            region: Some("us-east-1"),
            required_headers: &["host", "x-amz-target"],
            now_ms: 1_700_000_000_000,
            max_skew_ms: 900_000,
        };
        let parsed = parse_authorization(&auth).unwrap();
        assert_eq!(verify(&req, &parsed, "s3cret", &expect), Ok(()));
        assert_eq!(verify(&req, &parsed, "other", &expect), Err(SigError::Mismatch));
    }
}
