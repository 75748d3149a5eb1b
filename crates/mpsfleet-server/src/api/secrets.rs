//! Secrets: create, list, delete, and the values a task's agent fetches for it.

use super::*;

#[utoipa::path(
    post,
    path = "/v1/secrets",
    tag = "secrets",
    summary = "Store a secret (encrypted; never shown again).",
    request_body = mpsfleet_types::secret::CreateSecret,
    responses((status = 201, description = "OK.", body = mpsfleet_types::secret::SecretInfo), crate::openapi::Errors)
)]
pub(super) async fn create_secret(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: mpsfleet_types::secret::CreateSecret = parse(&body)?;
    Ok(created(st.call(&headers, admin, Touch::Cluster, move |c, _| c.create_secret(req)).await?))
}

#[utoipa::path(
    get,
    path = "/v1/secrets",
    tag = "secrets",
    summary = "Secrets (never their values).",
    responses((status = 200, description = "OK.", body = Vec<mpsfleet_types::secret::SecretInfo>), crate::openapi::Errors)
)]
pub(super) async fn list_secrets(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<mpsfleet_types::secret::SecretInfo>>, ApiError> {
    Ok(Json(st.call(&headers, admin, Touch::Cluster, |c, _| c.secrets()).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    summary = "Delete a secret.",
    params(("name" = String, Path, description = "A secret name (an ARN or a plain name; may contain '/').")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::secret::SecretInfo), crate::openapi::Errors)
)]
pub(super) async fn delete_secret(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<mpsfleet_types::secret::SecretInfo>, ApiError> {
    Ok(Json(st.call(&headers, admin, Touch::Cluster, move |c, _| c.delete_secret(&name)).await?))
}

/// The secret values of a task, for the agent of the host it is placed on only.
#[utoipa::path(
    get,
    path = "/v1/agent/tasks/{id}/secrets",
    tag = "agent",
    summary = "The secret values a task's definition names (host credential).",
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits).")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::secret::TaskSecrets), crate::openapi::Errors),
    security(("bearer" = []))
)]
pub(super) async fn task_secrets(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<mpsfleet_types::secret::TaskSecrets>, ApiError> {
    Ok(Json(
        st.call(&headers, host, Touch::Cluster, move |c, who| c.task_secrets(&host_id(who)?, &id)).await?,
    ))
}

// ---- agents -----------------------------------------------------------------------------
