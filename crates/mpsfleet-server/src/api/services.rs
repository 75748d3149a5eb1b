//! Services: create, list, describe, their endpoints and deployments, update, delete.

use super::*;

#[utoipa::path(
    post,
    path = "/v1/services",
    tag = "services",
    summary = "Create a service.",
    request_body = CreateService,
    responses((status = 201, description = "OK.", body = ServiceView), crate::openapi::Errors)
)]
pub(super) async fn create_service(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CreateService = parse(&body)?;
    Ok(created(
        st.call(&headers, operator, Touch::NewIn(req.pool.to_string()), move |c, p| {
            c.create_service_as(req, &actor(&p))
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/services",
    tag = "services",
    summary = "Services.",
    responses((status = 200, description = "OK.", body = Vec<ServiceView>), crate::openapi::Errors)
)]
pub(super) async fn list_services(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<ServiceView>>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::List, |c, who| {
            Ok(c.read().services().into_iter().filter(|s| who.sees_pool(s.service.pool.as_str())).collect())
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/services/{name}",
    tag = "services",
    summary = "One service.",
    params(("name" = String, Path, description = "A service name.")),
    responses((status = 200, description = "OK.", body = ServiceView), crate::openapi::Errors)
)]
pub(super) async fn describe_service(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<ServiceView>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Service, name.clone()), move |c, _| {
            c.read().service(&name)
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/services/{name}/endpoints",
    tag = "services",
    summary = "Every network binding of the service's running replicas.",
    params(("name" = String, Path, description = "A service name.")),
    responses((status = 200, description = "OK.", body = Vec<ServiceEndpoint>), crate::openapi::Errors)
)]
pub(super) async fn service_endpoints(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Vec<ServiceEndpoint>>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Service, name.clone()), move |c, _| {
            c.read().service_endpoints(&name)
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/services/{name}/deployments",
    tag = "services",
    summary = "The service's deployments, newest (PRIMARY) first, with their task counts.",
    params(("name" = String, Path, description = "A service name.")),
    responses((status = 200, description = "OK.", body = Vec<DeploymentView>), crate::openapi::Errors)
)]
pub(super) async fn service_deployments(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Vec<DeploymentView>>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Service, name.clone()), move |c, _| {
            c.read().service_deployments(&name)
        })
        .await?,
    ))
}

#[utoipa::path(
    patch,
    path = "/v1/services/{name}",
    tag = "services",
    summary = "Change a service.",
    request_body = UpdateService,
    params(("name" = String, Path, description = "A service name.")),
    responses((status = 200, description = "OK.", body = ServiceView), crate::openapi::Errors)
)]
pub(super) async fn update_service(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<ServiceView>, ApiError> {
    let req: UpdateService = parse(&body)?;
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Service, name.clone()), move |c, p| {
            c.update_service_as(&name, req, &actor(&p))
        })
        .await?,
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/services/{name}",
    tag = "services",
    summary = "Delete a service (its tasks stop).",
    params(("name" = String, Path, description = "A service name.")),
    responses((status = 200, description = "OK.", body = ServiceView), crate::openapi::Errors)
)]
pub(super) async fn delete_service(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<ServiceView>, ApiError> {
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Service, name.clone()), move |c, _| {
            c.delete_service(&name)
        })
        .await?,
    ))
}

// ---- secrets ----------------------------------------------------------------------------
