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

pub(super) async fn token(c: &Client, f: Format, cmd: TokenCommand) -> Result<()> {
    use mpsfleet_types::access::TokenView;
    let row = |t: &TokenView| {
        vec![
            t.id.clone(),
            t.role.as_str().into(),
            sanitize(t.pool.as_deref().unwrap_or("*")).into_owned(),
            t.expires_at_ms.map_or_else(|| "never".into(), output::utc_time),
            sanitize(&t.created_by).into_owned(),
            sanitize(&t.description).into_owned(),
        ]
    };
    const HEADERS: &[&str] = &["ID", "ROLE", "POOL", "EXPIRES", "CREATED BY", "DESCRIPTION"];
    match cmd {
        TokenCommand::Create { role, expires_in, description, pool, aws } => {
            let req = mpsfleet_types::access::CreateToken {
                role,
                expires_in_s: expires_in,
                description,
                pool,
                aws,
            };
            let t = c.create_token(&req).await?;
            match (f, &t.view.access_key_id) {
                (Format::Json | Format::Yaml, _) => output::print(f, &t, &[], vec![]),
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
        }
        TokenCommand::RotateAdmin => {
            let t = c.rotate_admin_token().await?;
            match f {
                Format::Json | Format::Yaml => output::print(f, &t, &[], vec![]),
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
                Format::Json | Format::Yaml => output::print(f, &t, &[], vec![]),
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
