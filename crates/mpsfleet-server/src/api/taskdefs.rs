//! Task definitions: register (validated as ECS does), list, describe.

use super::*;

#[utoipa::path(
    post,
    path = "/v1/taskdefs",
    tag = "taskdefs",
    summary = "Register an ECS task definition.",
    request_body(content = Object, description = "An ECS task definition (JSON); fields mpsfleet does not use are named in ignoredFields."),
    responses((status = 201, description = "OK.", body = mpsfleet_types::api::RegisterTaskDefResponse), crate::openapi::Errors)
)]
pub(super) async fn register_taskdef(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    // Parsing, validation and encoding are linear in the body, which may be large: done here,
    // before the cluster lock, which is then held for the commit only.
    let valid = tokio::task::spawn_blocking(move || ValidTaskDef::parse(&body))
        .await
        .map_err(|e| ApiError::from(Error::Internal(format!("request handler failed: {e}"))))??;
    let r = st.call(&headers, operator, Touch::Cluster, move |c, _| c.register_valid_taskdef(valid)).await?;
    Ok(created(r))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct FamilyQuery {
    /// Only this family's revisions.
    family: Option<String>,
}

#[utoipa::path(
    get,
    path = "/v1/taskdefs",
    tag = "taskdefs",
    summary = "Registered task definitions.",
    params(FamilyQuery),
    responses((status = 200, description = "OK.", body = Vec<TaskDefinition>), crate::openapi::Errors)
)]
pub(super) async fn list_taskdefs(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<FamilyQuery>,
) -> Result<Response, ApiError> {
    // Shared records out of the lock, encoded here.
    let list = st
        .call(&headers, viewer, Touch::NoPool, move |c, _| Ok(c.read().taskdefs(q.family.as_deref())))
        .await?;
    let list: Vec<&TaskDefinition> = list.iter().map(AsRef::as_ref).collect();
    Ok(Json(list).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/taskdefs/{reference}",
    tag = "taskdefs",
    summary = "One task definition.",
    params(("reference" = String, Path, description = "family (its latest revision) or family:revision.")),
    responses((status = 200, description = "OK.", body = TaskDefinition), crate::openapi::Errors)
)]
pub(super) async fn describe_taskdef(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(reference): Path<String>,
) -> Result<Json<TaskDefinition>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::NoPool, move |c, _| {
            c.read().taskdef("taskDefinition", &reference).cloned()
        })
        .await?,
    ))
}

// ---- pools ------------------------------------------------------------------------------
