//! Incidents: list, describe, acknowledge, resolve.

use super::*;

#[utoipa::path(
    post,
    path = "/v1/incidents/{id}/acknowledge",
    tag = "incidents",
    summary = "Acknowledge an incident.",
    params(("id" = String, Path, description = "An incident id.")),
    responses((status = 200, description = "OK.", body = IncidentView), crate::openapi::Errors)
)]
pub(super) async fn acknowledge_incident(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<IncidentView>, ApiError> {
    let i = st
        .call(&headers, operator, Touch::Object(Kind::Incident, id.clone()), move |c, p| {
            c.acknowledge_incident(&id, &actor(&p))
        })
        .await?;
    Ok(Json(IncidentView::of(i)))
}

#[utoipa::path(
    post,
    path = "/v1/incidents/{id}/resolve",
    tag = "incidents",
    summary = "Resolve an incident.",
    request_body = mpsfleet_types::api::ResolveIncident,
    params(("id" = String, Path, description = "An incident id.")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::api::OperatorCommandResponse), crate::openapi::Errors)
)]
pub(super) async fn resolve_incident(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<OperatorCommandResponse>, ApiError> {
    let req: ResolveIncident = parse(&body)?;
    let o = st
        .call(&headers, operator, Touch::Object(Kind::Incident, id.clone()), move |c, p| {
            c.resolve_incident(&id, &req.reason, &actor(&p))
        })
        .await?;
    Ok(Json(OperatorCommandResponse {
        host: None,
        replacement: o.replacement,
        incident: Some(IncidentView::of(o.incident)),
    }))
}

#[utoipa::path(
    get,
    path = "/v1/incidents",
    tag = "incidents",
    summary = "Incidents.",
    responses((status = 200, description = "OK.", body = Vec<IncidentView>), crate::openapi::Errors)
)]
pub(super) async fn list_incidents(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<IncidentView>>, ApiError> {
    let list = st
        .call(&headers, viewer, Touch::List, |c, who| {
            Ok(c.read()
                .incidents()
                .into_iter()
                .filter(|i| who.sees_pool(i.pool.as_str()))
                .collect::<Vec<_>>())
        })
        .await?;
    Ok(Json(list.into_iter().map(IncidentView::of).collect()))
}

#[utoipa::path(
    get,
    path = "/v1/incidents/{id}",
    tag = "incidents",
    summary = "One incident.",
    params(("id" = String, Path, description = "An incident id.")),
    responses((status = 200, description = "OK.", body = IncidentView), crate::openapi::Errors)
)]
pub(super) async fn describe_incident(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<IncidentView>, ApiError> {
    Ok(Json(IncidentView::of(
        st.call(&headers, viewer, Touch::Object(Kind::Incident, id.clone()), move |c, _| {
            c.read().incident(&id)
        })
        .await?,
    )))
}

// ---- tasks ------------------------------------------------------------------------------
