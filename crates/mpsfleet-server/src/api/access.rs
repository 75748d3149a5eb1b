//! The cluster's CAs and certificates, API and join tokens, and the audit log.

use super::*;
use crate::cluster::Error;

/// The cluster CAs' certificates, to anyone: the active CA, then the next one while a CA
/// rotation is under way. A new agent trusts only the one whose hash its join token names
/// (`mpsfleet_client::tls::fetch_pinned_ca`); a joined one fetches them again over its
/// verified connection when a heartbeat answer names others.
#[utoipa::path(
    get,
    path = "/v1/cluster/ca",
    tag = "server",
    summary = "The cluster CAs' certificates (PEM): the active one, then the next one during a CA rotation.",
    responses((status = 200, description = "The CA certificates, PEM.", body = String, content_type = "application/x-pem-file"), crate::openapi::Errors),
    security(())
)]
pub(super) async fn cluster_ca(State(st): State<AppState>) -> Result<Response, ApiError> {
    let tls = serving_tls(&st)?;
    let pem = tls.cas().bundle_pem();
    Ok(([(axum::http::header::CONTENT_TYPE, "application/x-pem-file")], pem).into_response())
}

/// Where a CA rotation stands, with `cas` the CAs now.
pub(super) fn ca_rotation(c: &Cluster, cas: &crate::tls::CaSet) -> mpsfleet_types::access::CaRotation {
    mpsfleet_types::access::CaRotation {
        active: cas.active.info(),
        next: cas.next.as_ref().map(|n| n.info()),
        hosts_not_trusting_next: cas
            .next
            .as_ref()
            .map(|n| c.read().hosts_not_trusting(&n.hash()))
            .unwrap_or_default(),
    }
}

/// Runs one step of a CA rotation (admin) on the cluster, which commits it with its audit
/// entry and from then on hands out the CAs it leaves; answers where the rotation stands.
pub(super) async fn ca_step(
    st: &AppState,
    headers: &HeaderMap,
    step: impl FnOnce(&crate::tls::ServerTls, &mut Cluster) -> Result<crate::tls::CaSet, Error> + Send + 'static,
) -> Result<mpsfleet_types::access::CaRotation, ApiError> {
    let tls = serving_tls(st)?;
    st.call(headers, admin, Touch::Cluster, move |c, _| {
        let cas = step(&tls, c)?;
        Ok(ca_rotation(c, &cas))
    })
    .await
}

#[utoipa::path(
    get,
    path = "/v1/cluster/status",
    tag = "server",
    summary = "Where the state lives (SQLite or etcd), the store's revision, the leader and the etcd members.",
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::ClusterStatus), crate::openapi::Errors)
)]
pub(super) async fn cluster_status(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::ClusterStatus>, ApiError> {
    let revision = st.call(&headers, viewer, Touch::Cluster, |c, _| Ok(c.read().revision())).await?;
    let Some(ha) = st.ha.clone() else {
        return Ok(Json(mpsfleet_types::access::ClusterStatus {
            store: "sqlite".into(),
            revision,
            server_id: "server".into(),
            leader: mpsfleet_types::access::LeaderView {
                id: "server".into(),
                url: None,
                lease: None,
                lease_ttl_seconds: None,
                fence_revision: None,
            },
            members: Vec::new(),
        }));
    };
    // Each member is asked in turn, on a blocking thread: a dead member costs its timeout.
    let status = tokio::task::spawn_blocking(move || ha.status(revision))
        .await
        .map_err(|e| ApiError::from(Error::Internal(format!("cluster status: {e}"))))?;
    Ok(Json(status))
}

#[utoipa::path(
    get,
    path = "/v1/cluster/ca/rotation",
    tag = "server",
    summary = "The cluster's CAs, and which hosts do not trust the next one yet during a rotation.",
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::CaRotation), crate::openapi::Errors)
)]
pub(super) async fn get_ca_rotation(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::CaRotation>, ApiError> {
    let tls = serving_tls(&st)?;
    Ok(Json(st.call(&headers, viewer, Touch::Cluster, move |c, _| Ok(ca_rotation(c, &tls.cas()))).await?))
}

/// Stages the next CA: given in the body, or made by the cluster. Clients are told to trust it
/// alongside the active one, which keeps signing until it is activated.
#[utoipa::path(
    post,
    path = "/v1/cluster/ca/rotation",
    tag = "server",
    summary = "Begin a CA rotation: stage the next CA (given, or made), trusted from now on, not signing yet.",
    request_body(content = Option<mpsfleet_types::access::BeginCaRotation>, description = "May be empty: the cluster makes the CA."),
    responses((status = 201, description = "OK.", body = mpsfleet_types::access::CaRotation), crate::openapi::Errors)
)]
pub(super) async fn begin_ca_rotation(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<mpsfleet_types::access::CaRotation>), ApiError> {
    let req: mpsfleet_types::access::BeginCaRotation =
        if body.is_empty() { Default::default() } else { parse(&body)? };
    let given = match (req.ca_cert_pem, req.ca_key_pem) {
        (None, None) => None,
        (Some(cert_pem), Some(key_pem)) => Some(crate::tls::GivenCa { cert_pem, key_pem }),
        (Some(_), None) => return Err(ApiError::invalid("caKeyPem", "is required with caCertPem")),
        (None, Some(_)) => return Err(ApiError::invalid("caCertPem", "is required with caKeyPem")),
    };
    let out = ca_step(&st, &headers, move |tls, c| {
        let key = c.server_key().clone();
        tls.begin_ca_rotation(given.as_ref(), &key, c.read().now_ms(), &mut |ops, cas| c.write_cas(ops, cas))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(out)))
}

/// Makes the staged CA the active one, once every host trusts it (or with `force`).
#[utoipa::path(
    post,
    path = "/v1/cluster/ca/rotation/activate",
    tag = "server",
    summary = "Finish a CA rotation: certificates are issued under the next CA, and the old one is trusted no more.",
    request_body(content = Option<mpsfleet_types::access::ActivateCa>, description = "May be empty."),
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::CaRotation), crate::openapi::Errors)
)]
pub(super) async fn activate_ca(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<mpsfleet_types::access::CaRotation>, ApiError> {
    let req: mpsfleet_types::access::ActivateCa =
        if body.is_empty() { Default::default() } else { parse(&body)? };
    let out = ca_step(&st, &headers, move |tls, c| {
        if let (Some(next), false) = (&tls.cas().next, req.force) {
            let behind = c.read().hosts_not_trusting(&next.hash());
            if !behind.is_empty() {
                return Err(Error::Conflict(format!(
                    "{} host(s) have not reported trusting the next CA yet ({}): their agents could \
                     not reach the server once it is active. Wait for their heartbeats (an agent \
                     fetches the CAs within a heartbeat), or give force to activate anyway",
                    behind.len(),
                    behind.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        tls.activate_ca(c.read().now_ms(), &mut |ops, cas| c.write_cas(ops, cas))
    })
    .await?;
    Ok(Json(out))
}

#[utoipa::path(
    delete,
    path = "/v1/cluster/ca/rotation",
    tag = "server",
    summary = "Cancel a CA rotation: the staged CA is dropped and trusted no more.",
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::CaRotation), crate::openapi::Errors)
)]
pub(super) async fn cancel_ca_rotation(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::CaRotation>, ApiError> {
    let out = ca_step(&st, &headers, |tls, c| tls.cancel_ca_rotation(&mut |ops, cas| c.write_cas(ops, cas)))
        .await?;
    Ok(Json(out))
}

#[utoipa::path(
    get,
    path = "/v1/cluster/certificate",
    tag = "server",
    summary = "The certificate this server serves.",
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::ServerCertificate), crate::openapi::Errors)
)]
pub(super) async fn server_certificate(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::ServerCertificate>, ApiError> {
    let tls = serving_tls(&st)?;
    Ok(Json(st.call(&headers, viewer, Touch::NoPool, move |_, _| Ok(tls.certificate())).await?))
}

/// Issues this server a new certificate (and key) under the cluster CA; connections made
/// from now on get it.
#[utoipa::path(
    post,
    path = "/v1/cluster/certificate/rotate",
    tag = "server",
    summary = "Issue this server a new certificate under the cluster CA.",
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::ServerCertificate), crate::openapi::Errors)
)]
pub(super) async fn rotate_certificate(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::ServerCertificate>, ApiError> {
    let tls = serving_tls(&st)?;
    Ok(Json(st.call(&headers, admin, Touch::Cluster, move |c, _| tls.rotate(c.read().now_ms())).await?))
}

// ---- tokens -----------------------------------------------------------------------------

/// Replaces the bootstrap admin token. Under the cluster lock, so that rotations go one at a
/// time: the new one is written to `admin.token.new` in the data dir, committed, then renamed
/// to `admin.token`; a failed commit removes it. A crash in between leaves `admin.token.new`,
/// which the next start moves into place if it is the committed token and removes if not
/// (`settle_admin_token` in lib.rs).
#[utoipa::path(
    post,
    path = "/v1/admin-token/rotate",
    tag = "access",
    summary = "Replace the bootstrap admin token; the old one is refused at once; the new one is in this answer (and the server's admin.token).",
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::RotatedAdminToken), crate::openapi::Errors)
)]
pub(super) async fn rotate_admin_token(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::RotatedAdminToken>, ApiError> {
    let file = st.admin_token_file.clone();
    let rotated = st
        .call(&headers, admin, Touch::Cluster, move |c, _| {
            let token = auth::new_token("mpsf_adm_")?;
            let Some(file) = &file else { return c.rotate_admin_token(token) };
            let staged = crate::staged_admin_token(file);
            crate::files::write_secret(&staged, &token)
                .map_err(|e| Error::StoreUnavailable(format!("cannot write {}: {e}", staged.display())))?;
            let rotated = c.rotate_admin_token(token);
            match &rotated {
                Ok(_) => {
                    if let Err(e) = std::fs::rename(&staged, file) {
                        tracing::error!(path = %staged.display(), error = %e, "the new admin token is committed but cannot be renamed to admin.token: it is in this file");
                    }
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&staged);
                }
            }
            rotated
        })
        .await?;
    Ok(Json(rotated))
}

#[utoipa::path(
    post,
    path = "/v1/tokens",
    tag = "access",
    summary = "Make an API token with a role; the token is in this answer only.",
    request_body = CreateToken,
    responses((status = 201, description = "OK.", body = CreatedToken), crate::openapi::Errors)
)]
pub(super) async fn create_token(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    let req: CreateToken = parse(&body)?;
    let t = st.call(&headers, admin, Touch::Cluster, move |c, p| c.create_api_token(req, &actor(&p))).await?;
    Ok((StatusCode::CREATED, Json(t)))
}

#[utoipa::path(
    get,
    path = "/v1/tokens",
    tag = "access",
    summary = "Every API token (never the tokens themselves).",
    responses((status = 200, description = "OK.", body = Vec<TokenView>), crate::openapi::Errors)
)]
pub(super) async fn list_tokens(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<TokenView>>, ApiError> {
    Ok(Json(st.call(&headers, admin, Touch::Cluster, |c, _| Ok(c.read().api_tokens())).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/tokens/{id}",
    tag = "access",
    summary = "Revoke an API token at once.",
    params(("id" = String, Path, description = "A token id.")),
    responses((status = 200, description = "OK.", body = TokenView), crate::openapi::Errors)
)]
pub(super) async fn revoke_token(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    Ok(Json(st.call(&headers, admin, Touch::Cluster, move |c, p| c.revoke_api_token(&id, &actor(&p))).await?))
}

#[utoipa::path(
    post,
    path = "/v1/join-tokens",
    tag = "access",
    summary = "Make a join token (it expires; a day by default); the token is in this answer only.",
    request_body = mpsfleet_types::access::CreateJoinToken,
    responses((status = 201, description = "OK.", body = mpsfleet_types::access::CreatedJoinToken), crate::openapi::Errors)
)]
pub(super) async fn create_join_token(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<mpsfleet_types::access::CreatedJoinToken>), ApiError> {
    let req: mpsfleet_types::access::CreateJoinToken = parse(&body)?;
    let t =
        st.call(&headers, admin, Touch::Cluster, move |c, p| c.create_join_token(req, &actor(&p))).await?;
    Ok((StatusCode::CREATED, Json(t)))
}

#[utoipa::path(
    get,
    path = "/v1/join-tokens",
    tag = "access",
    summary = "Every join token (never the tokens themselves).",
    responses((status = 200, description = "OK.", body = Vec<mpsfleet_types::access::JoinTokenView>), crate::openapi::Errors)
)]
pub(super) async fn list_join_tokens(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<mpsfleet_types::access::JoinTokenView>>, ApiError> {
    Ok(Json(st.call(&headers, admin, Touch::Cluster, |c, _| Ok(c.read().join_tokens())).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/join-tokens/{id}",
    tag = "access",
    summary = "Revoke a join token at once (the hosts it registered keep their credentials).",
    params(("id" = String, Path, description = "A join token id.")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::JoinTokenView), crate::openapi::Errors)
)]
pub(super) async fn revoke_join_token(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<mpsfleet_types::access::JoinTokenView>, ApiError> {
    Ok(Json(
        st.call(&headers, admin, Touch::Cluster, move |c, p| c.revoke_join_token(&id, &actor(&p))).await?,
    ))
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AuditQuery {
    /// How many of the newest entries (1 to 10,000; default 100).
    #[serde(default = "default_audit_limit")]
    limit: usize,
}

pub(super) fn default_audit_limit() -> usize {
    100
}

#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "access",
    summary = "The newest audit entries, oldest first.",
    params(AuditQuery),
    responses((status = 200, description = "OK.", body = Vec<mpsfleet_types::access::AuditEntry>), crate::openapi::Errors)
)]
pub(super) async fn list_audit(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<AuditQuery>,
) -> Result<Json<Vec<mpsfleet_types::access::AuditEntry>>, ApiError> {
    let max = crate::cluster::MAX_AUDIT_LIST;
    if q.limit == 0 || q.limit > max {
        return Err(ApiError::invalid("limit", format!("must be from 1 to {max}, got {}", q.limit)));
    }
    Ok(Json(st.call(&headers, admin, Touch::Cluster, move |c, _| c.audit_entries(q.limit)).await?))
}

// ---- task definitions -------------------------------------------------------------------

/// The header the console sends a sign-in link's code in (never in a URL the server sees).
pub const CONSOLE_CODE_HEADER: &str = "x-mpsfleet-console-code";

#[utoipa::path(
    post,
    path = "/v1/console/links",
    tag = "access",
    summary = "A one-time sign-in link for the web console, carrying the caller's role and pool (mpsfleet console). The code works once, for expiresInSeconds (default 60).",
    request_body = Option<mpsfleet_types::access::CreateConsoleLink>,
    responses((status = 201, description = "OK.", body = mpsfleet_types::access::ConsoleLink), crate::openapi::Errors)
)]
pub(super) async fn create_console_link(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<mpsfleet_types::access::ConsoleLink>), ApiError> {
    let req: mpsfleet_types::access::CreateConsoleLink =
        if body.is_empty() { Default::default() } else { parse(&body)? };
    let link = st
        // Nothing of any pool: the link carries the caller's own scope, no more.
        .call(&headers, viewer, Touch::NoPool, move |c, p| {
            c.create_console_link(&p, actor(&p), req.expires_in_seconds)
        })
        .await?;
    Ok((StatusCode::CREATED, Json(link)))
}

#[utoipa::path(
    post,
    path = "/v1/console/session",
    tag = "access",
    summary = "The console trades a sign-in link's code (header x-mpsfleet-console-code; no token) for a token of its own with the link's role, valid 12 hours or until the token that asked for the link expires, and revoked with it. A code works once; a used or expired one, or one whose token is gone, is 401.",
    params(("x-mpsfleet-console-code" = String, Header, description = "The code of a link from POST /v1/console/links.")),
    security(()),
    responses((status = 200, description = "OK.", body = mpsfleet_types::access::ConsoleSession), crate::openapi::Errors)
)]
pub(super) async fn open_console_session(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<mpsfleet_types::access::ConsoleSession>, ApiError> {
    let code = headers
        .get(CONSOLE_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.len() <= 128)
        .ok_or_else(|| {
            ApiError::invalid(CONSOLE_CODE_HEADER, "names no sign-in code (at most 128 characters)")
        })?
        .to_string();
    let cluster = st.cluster.clone();
    let changed = st.changed.clone();
    let session = tokio::task::spawn_blocking(move || {
        let mut c = cluster
            .lock()
            .map_err(|_| ApiError::from(Error::Internal("state lock poisoned; restart the server".into())))?;
        let out = c.open_console_session(&code).map_err(ApiError::from);
        changed.send_replace(c.read().revision());
        out
    })
    .await
    .map_err(|e| ApiError::from(Error::Internal(format!("console sign-in: {e}"))))??;
    Ok(Json(session))
}
