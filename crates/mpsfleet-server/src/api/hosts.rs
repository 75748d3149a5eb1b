//! Hosts: list, describe, and the operator commands on one (cordon, drain, replace, activate,
//! recheck, forget, revoke its credential).

use super::*;

#[utoipa::path(
    get,
    path = "/v1/hosts",
    tag = "hosts",
    summary = "Hosts with their GPUs.",
    params(PoolQuery),
    responses((status = 200, description = "OK.", body = Vec<HostView>,
        headers(("x-total-count" = usize, description = "How many hosts there are in all (of the pool)."))), crate::openapi::Errors)
)]
pub(super) async fn list_hosts(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<PoolQuery>,
) -> Result<Response, ApiError> {
    let (limit, skip) = paging(q.limit.as_ref(), q.skip.as_ref(), usize::MAX)?;
    let (page, total) = st
        .call(&headers, viewer, Touch::List, move |c, who| {
            Ok(c.read().hosts_page(
                scoped_pool(&who, q.pool)?.as_deref(),
                q.live.unwrap_or(false),
                skip,
                limit,
            ))
        })
        .await?;
    Ok(([("x-total-count", total.to_string())], Json(page)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/hosts/{id}",
    tag = "hosts",
    summary = "One host.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = HostView), crate::openapi::Errors)
)]
pub(super) async fn describe_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<HostView>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Host, id.clone()), move |c, _| c.read().host(&id))
            .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/cordon",
    tag = "hosts",
    summary = "No new tasks on the host.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = HostView), crate::openapi::Errors)
)]
pub(super) async fn cordon_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<HostView>, ApiError> {
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, _| {
            c.set_cordoned(&id, true)
        })
        .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/uncordon",
    tag = "hosts",
    summary = "Tasks may be placed on the host again.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = HostView), crate::openapi::Errors)
)]
pub(super) async fn uncordon_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<HostView>, ApiError> {
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, _| {
            c.set_cordoned(&id, false)
        })
        .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/drain",
    tag = "hosts",
    summary = "Drain the host through an incident.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = IncidentView), crate::openapi::Errors)
)]
pub(super) async fn drain_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<IncidentView>, ApiError> {
    let i = st
        .call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, p| {
            c.operator_action(&id, OperatorAction::Drain, &actor(&p))
        })
        .await?;
    Ok(Json(IncidentView::of(carried_out(&st, i).await?)))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/replace",
    tag = "hosts",
    summary = "Replace the host through an incident.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = IncidentView), crate::openapi::Errors)
)]
pub(super) async fn replace_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<IncidentView>, ApiError> {
    let i = st
        .call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, p| {
            c.operator_action(&id, OperatorAction::Replace, &actor(&p))
        })
        .await?;
    Ok(Json(IncidentView::of(carried_out(&st, i).await?)))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/activate",
    tag = "hosts",
    summary = "Return a repaired host to service.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::api::OperatorCommandResponse), crate::openapi::Errors)
)]
pub(super) async fn activate_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<OperatorCommandResponse>, ApiError> {
    let (host, outcome) = st
        .call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, p| {
            c.activate_host(&id, &actor(&p))
        })
        .await?;
    Ok(Json(OperatorCommandResponse {
        host: Some(host),
        replacement: outcome.as_ref().and_then(|o| o.replacement.clone()),
        incident: outcome.map(|o| IncidentView::of(o.incident)),
    }))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/recheck",
    tag = "hosts",
    summary = "Re-arm the agent's exhausted local repair after the operator fixed the host.",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::api::OperatorCommandResponse), crate::openapi::Errors)
)]
pub(super) async fn recheck_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<OperatorCommandResponse>, ApiError> {
    let (host, incident) = st
        .call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, p| {
            c.recheck_host(&id, &actor(&p))
        })
        .await?;
    Ok(Json(OperatorCommandResponse {
        host: Some(host),
        replacement: None,
        incident: incident.map(IncidentView::of),
    }))
}

/// Query of `POST /v1/hosts/{id}/forget`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ForgetQuery {
    /// Forget it even though it heartbeats.
    #[serde(default)]
    force: bool,
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/revoke-credential",
    tag = "hosts",
    summary = "Refuse the host's credential from now on (admin).",
    params(("id" = String, Path, description = "A host id.")),
    responses((status = 200, description = "OK.", body = HostView), crate::openapi::Errors)
)]
pub(super) async fn revoke_host_credential(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<HostView>, ApiError> {
    Ok(Json(
        st.call(&headers, admin, Touch::Object(Kind::Host, id.clone()), move |c, p| {
            c.revoke_host_credential(&id, &actor(&p))
        })
        .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/hosts/{id}/forget",
    tag = "hosts",
    summary = "Deregister a host that does not exist.",
    params(("id" = String, Path, description = "A host id."), ForgetQuery),
    responses((status = 200, description = "OK.", body = HostView), crate::openapi::Errors)
)]
pub(super) async fn forget_host(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Q(q): Q<ForgetQuery>,
) -> Result<Json<HostView>, ApiError> {
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Host, id.clone()), move |c, p| {
            c.forget_host(&id, q.force, &actor(&p))
        })
        .await?,
    ))
}

/// The incident an operator's command was recorded on, once the controllers carried the
/// command out (they run it outside the request, at once).
async fn carried_out(st: &AppState, i: Incident) -> Result<Incident, ApiError> {
    st.settled().await;
    st.read(move |c| c.read().incident(&i.id)).await
}
