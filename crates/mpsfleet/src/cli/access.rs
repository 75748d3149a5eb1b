//! The CLI's access and cluster commands: API tokens, join tokens, secrets, `cluster status`
//! and the cluster's CAs.

use super::*;

/// `mpsfleet cluster status`.
pub(super) async fn cluster_status(c: &Client, output: Format) -> Result<()> {
    let st = c.cluster_status().await?;
    let l = &st.leader;
    let mut rows = vec![vec![
        "leader".to_string(),
        sanitize(&l.id).into_owned(),
        sanitize(l.url.as_deref().unwrap_or("-")).into_owned(),
        l.lease
            .as_ref()
            .map_or_else(|| "-".into(), |x| format!("lease {x} ttl {}s", l.lease_ttl_seconds.unwrap_or(0))),
    ]];
    for m in &st.members {
        let state = if m.raft_leader {
            "healthy, raft leader"
        } else if m.healthy {
            "healthy"
        } else {
            "unreachable"
        };
        let detail = match (&m.version, m.db_size_bytes, &m.error) {
            (_, _, Some(e)) => sanitize(e).into_owned(),
            (Some(v), Some(db), None) => format!("etcd {v}, db {db} bytes"),
            _ => String::new(),
        };
        rows.push(vec![
            "etcd member".to_string(),
            sanitize(m.name.as_deref().unwrap_or("?")).into_owned(),
            sanitize(&m.endpoint).into_owned(),
            format!("{state}; {detail}"),
        ]);
    }
    crate::output::print(output, &st, &["ROLE", "NAME", "ADDRESS", "STATE"], rows);
    if !output.is_data() {
        println!("store: {}, revision {}", st.store, st.revision);
    }
    Ok(())
}

/// `mpsfleet cluster ca ...`.
pub(super) async fn ca_command(c: &Client, cmd: CaCommand, output: Format) -> Result<()> {
    let rotation = match cmd {
        CaCommand::Status => c.ca_rotation().await?,
        CaCommand::Rotate { ca_cert, ca_key } => {
            let read = |p: Option<PathBuf>| {
                p.map(|p| std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display())))
                    .transpose()
            };
            let req = mpsfleet_types::access::BeginCaRotation {
                ca_cert_pem: read(ca_cert)?,
                ca_key_pem: read(ca_key)?,
            };
            c.begin_ca_rotation(&req).await?
        }
        CaCommand::Activate { force } => c.activate_ca(force).await?,
        CaCommand::Cancel => c.cancel_ca_rotation().await?,
    };
    let row = |state: &str, ca: &mpsfleet_types::access::CaInfo| {
        vec![
            state.to_string(),
            ca.sha256.clone(),
            sanitize(&ca.subject).into_owned(),
            crate::output::utc_time(ca.not_after_ms),
            if ca.given { "operator" } else { "cluster" }.to_string(),
        ]
    };
    let mut rows = vec![row("active", &rotation.active)];
    if let Some(next) = &rotation.next {
        rows.push(row("next", next));
    }
    crate::output::print(output, &rotation, &["STATE", "SHA256", "SUBJECT", "NOT AFTER", "MADE BY"], rows);
    if !output.is_data() && rotation.next.is_some() {
        let behind = &rotation.hosts_not_trusting_next;
        if behind.is_empty() {
            println!("every host trusts the next CA: `mpsfleet cluster ca activate` finishes the rotation");
        } else {
            println!("hosts not trusting the next CA yet: {}", sanitize(&behind.join(", ")));
        }
    }
    Ok(())
}

pub(super) async fn token(c: &Client, f: Format, cmd: TokenCommand, at: &Endpoint) -> Result<()> {
    use mpsfleet_types::access::TokenView;
    let row = |t: &TokenView| {
        vec![
            t.id.clone(),
            t.role.as_str().into(),
            sanitize(t.pool.as_deref().unwrap_or("*")).into_owned(),
            t.expires_at_ms.map_or_else(|| "never".into(), output::utc_time),
            sanitize(&t.created_by).into_owned(),
            sanitize(&t.description).into_owned(),
            // A console sign-in is listed under the token it was made from, and names it.
            sanitize(t.parent.as_deref().unwrap_or("-")).into_owned(),
        ]
    };
    const HEADERS: &[&str] = &["ID", "ROLE", "POOL", "EXPIRES", "CREATED BY", "DESCRIPTION", "FROM"];
    match cmd {
        TokenCommand::Create { role, expires_in, description, pool, aws, aws_profile } => {
            if let Some(name) = &aws_profile {
                check_profile_name(name)?;
            }
            let req = mpsfleet_types::access::CreateToken {
                role,
                expires_in_s: expires_in,
                description,
                pool,
                aws,
            };
            let t = c.create_token(&req).await?;
            match (f, &t.view.access_key_id) {
                (
                    Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns,
                    _,
                ) => output::print(f, &t, &[], vec![]),
                (Format::Table | Format::Wide, None) => {
                    print!("{}", output::table(HEADERS, &[row(&t.view)]));
                    println!("\ntoken (shown this once): {}", t.token);
                }
                (Format::Table | Format::Wide, Some(key)) => {
                    print!("{}", output::table(HEADERS, &[row(&t.view)]));
                    println!(
                        "\nAWS credentials (the secret is shown this once; it is also the token):\n\
                         aws_access_key_id = {key}\naws_secret_access_key = {}",
                        t.token
                    );
                }
            }
            if let (Some(name), Some(key)) = (&aws_profile, &t.view.access_key_id) {
                let (credentials, config) = write_aws_profile(name, key, &t.token, at)?;
                eprintln!(
                    "wrote AWS profile {name} to {} and {}: aws --profile {name} ecs list-clusters",
                    credentials.display(),
                    config.display()
                );
                if std::env::var_os("AWS_CA_BUNDLE").is_some() {
                    eprintln!(
                        "note: AWS_CA_BUNDLE is set in this shell; the AWS CLI and boto3 take it over the \
                         profile's ca_bundle: unset it, or pass --ca-bundle"
                    );
                }
            }
        }
        TokenCommand::RotateAdmin => {
            let t = c.rotate_admin_token().await?;
            match f {
                Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
                    output::print(f, &t, &[], vec![])
                }
                Format::Table | Format::Wide => println!(
                    "the old admin token is refused from now on; the server's admin.token holds the new one\n\
                     admin token (shown this once): {}",
                    t.token
                ),
            }
        }
        TokenCommand::List => {
            let list = c.list_tokens().await?;
            let rows = list.iter().map(row).collect();
            output::print(f, &list, HEADERS, rows);
        }
        TokenCommand::Revoke { id } => {
            let t = c.revoke_token(&id).await?;
            output::print(f, &t, HEADERS, vec![row(&t)]);
        }
    }
    Ok(())
}

pub(super) async fn join_token(c: &Client, f: Format, cmd: JoinTokenCommand) -> Result<()> {
    use mpsfleet_types::access::JoinTokenView;
    let now = mpsfleet_core::clock::Clock::now_ms(&mpsfleet_core::clock::SystemClock);
    let row = |t: &JoinTokenView| {
        let expires = output::utc_time(t.expires_at_ms);
        vec![
            t.id.clone(),
            if t.expires_at_ms <= now { format!("{expires} (expired)") } else { expires },
            sanitize(&t.created_by).into_owned(),
            sanitize(&t.description).into_owned(),
        ]
    };
    const HEADERS: &[&str] = &["ID", "EXPIRES", "CREATED BY", "DESCRIPTION"];
    match cmd {
        JoinTokenCommand::Create { expires_in, description } => {
            let req = mpsfleet_types::access::CreateJoinToken { expires_in_s: expires_in, description };
            let t = c.create_join_token(&req).await?;
            match f {
                Format::Json | Format::Yaml | Format::Name | Format::Jsonpath | Format::CustomColumns => {
                    output::print(f, &t, &[], vec![])
                }
                Format::Table | Format::Wide => {
                    print!("{}", output::table(HEADERS, &[row(&t.view)]));
                    println!("\njoin token (shown this once): {}", t.token);
                }
            }
        }
        JoinTokenCommand::List => {
            let list = c.list_join_tokens().await?;
            let rows = list.iter().map(row).collect();
            output::print(f, &list, HEADERS, rows);
        }
        JoinTokenCommand::Revoke { id } => {
            let t = c.revoke_join_token(&id).await?;
            output::print(f, &t, HEADERS, vec![row(&t)]);
        }
    }
    Ok(())
}

pub(super) async fn secret(c: &Client, f: Format, cmd: SecretCommand) -> Result<()> {
    let row = |s: &secret::SecretInfo| {
        vec![sanitize(&s.name).into_owned(), s.size.to_string(), output::utc_time(s.updated_at_ms)]
    };
    const HEADERS: &[&str] = &["NAME", "BYTES", "UPDATED"];
    match cmd {
        SecretCommand::Create { name, from_file } => {
            let value = read_secret_value(&from_file)?;
            let s = c.create_secret(&name, value).await?;
            output::print(f, &s, HEADERS, vec![row(&s)]);
        }
        SecretCommand::List => {
            let list = c.list_secrets().await?;
            let rows = list.iter().map(row).collect();
            output::print(f, &list, HEADERS, rows);
        }
        SecretCommand::Delete { name } => {
            let s = c.delete_secret(&name).await?;
            output::print(f, &s, HEADERS, vec![row(&s)]);
        }
    }
    Ok(())
}

/// A secret's value from `path` (`-`: standard input), at most 64 KiB and UTF-8, without one
/// trailing newline (what `echo` and editors add).
fn read_secret_value(path: &std::path::Path) -> Result<String> {
    use std::io::Read as _;
    let limit = secret::MAX_SECRET_VALUE_BYTES as u64;
    let mut bytes = Vec::new();
    let what = if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(limit + 2)
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
        "standard input".to_string()
    } else {
        let file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        file.take(limit + 2)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {}", path.display()))?;
        path.display().to_string()
    };
    if bytes.ends_with(b"\r\n") {
        bytes.truncate(bytes.len() - 2);
    } else if bytes.ends_with(b"\n") {
        bytes.pop();
    }
    if bytes.len() as u64 > limit {
        anyhow::bail!("the secret's value ({what}) must be at most {limit} bytes");
    }
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("the secret's value ({what}) must be UTF-8 text"))
}

/// An AWS profile name: letters, digits, `-`, `_`, `.`, at most 64.
fn check_profile_name(name: &str) -> Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')),
        "--aws-profile: {name:?} is not a profile name (1 to 64 letters, digits, '-', '_', '.')"
    );
    Ok(())
}

/// Writes the key as AWS profile `name`: its credentials into `~/.aws/credentials` (0600), and
/// this server as its endpoint, with its CA and a region, into `~/.aws/config` (the AWS CLI
/// and boto3 honour `endpoint_url` and `ca_bundle` there). Returns both paths.
fn write_aws_profile(name: &str, key: &str, secret: &str, at: &Endpoint) -> Result<(PathBuf, PathBuf)> {
    let home =
        std::env::var_os("HOME").map(PathBuf::from).context("HOME is not set: no ~/.aws to write to")?;
    let dir = home.join(".aws");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let credentials = dir.join("credentials");
    let secret_lines =
        [("aws_access_key_id", key.to_string()), ("aws_secret_access_key", secret.to_string())];
    replace_ini_section(&credentials, &format!("[{name}]"), &secret_lines, 0o600)?;
    let mut settings = vec![("region", "us-east-1".to_string()), ("endpoint_url", at.server.clone())];
    if let Some(ca) = &at.ca_file {
        let ca =
            std::fs::canonicalize(ca).with_context(|| format!("cannot find the CA file {}", ca.display()))?;
        settings.push(("ca_bundle", ca.display().to_string()));
    }
    let config = dir.join("config");
    replace_ini_section(&config, &format!("[profile {name}]"), &settings, 0o600)?;
    Ok((credentials, config))
}

/// Rewrites the INI file at `path` with section `header` holding `lines` (the section's old
/// lines go; every other section stays as it was), mode `mode`.
fn replace_ini_section(
    path: &std::path::Path,
    header: &str,
    lines: &[(&str, String)],
    mode: u32,
) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let old = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut out = String::new();
    let mut skipping = false;
    for line in old.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            skipping = trimmed == header;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !out.is_empty() && !out.ends_with("\n\n") {
        out.push('\n');
    }
    out.push_str(header);
    out.push('\n');
    for (k, v) in lines {
        out.push_str(&format!("{k} = {v}\n"));
    }
    let tmp = path.with_extension("mpsfleet-tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::io::Write::write_all(&mut file, out.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_replaces_its_own_section_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "[default]\naws_access_key_id = A\n\n[mpsfleet]\naws_access_key_id = OLD\nx = y\n\n[other]\nk = v\n")
            .unwrap();
        replace_ini_section(&path, "[mpsfleet]", &[("aws_access_key_id", "NEW".into())], 0o600).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("[default]\naws_access_key_id = A") && text.contains("[other]\nk = v"),
            "{text}"
        );
        assert!(
            text.contains("[mpsfleet]\naws_access_key_id = NEW\n")
                && !text.contains("OLD")
                && !text.contains("x = y")
        );
        assert_eq!(text.matches("[mpsfleet]").count(), 1);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(check_profile_name("mpsfleet").is_ok() && check_profile_name("a b").is_err());
    }
}
