//! Pools: create, list, describe, update, explain (who owns recovery, and what that means now).

use super::*;

#[utoipa::path(
    post,
    path = "/v1/pools",
    tag = "pools",
    summary = "Create a pool.",
    request_body = CreatePool,
    responses((status = 201, description = "OK.", body = Pool), crate::openapi::Errors)
)]
pub(super) async fn create_pool(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CreatePool = parse(&body)?;
    Ok(created(st.call(&headers, admin, Touch::Cluster, move |c, _| c.create_pool(req)).await?))
}

#[utoipa::path(
    get,
    path = "/v1/pools",
    tag = "pools",
    summary = "Every pool.",
    responses((status = 200, description = "OK.", body = Vec<Pool>), crate::openapi::Errors)
)]
pub(super) async fn list_pools(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<Pool>>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::List, |c, who| {
            Ok(c.read().pools().into_iter().filter(|p| who.sees_pool(p.name.as_str())).collect())
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/pools/{name}",
    tag = "pools",
    summary = "One pool.",
    params(("name" = String, Path, description = "A pool name.")),
    responses((status = 200, description = "OK.", body = Pool), crate::openapi::Errors)
)]
pub(super) async fn describe_pool(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Pool>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Pool, name.clone()), move |c, _| c.read().pool(&name))
            .await?,
    ))
}

#[utoipa::path(
    patch,
    path = "/v1/pools/{name}",
    tag = "pools",
    summary = "Change a pool's policies.",
    request_body = UpdatePool,
    params(("name" = String, Path, description = "A pool name.")),
    responses((status = 200, description = "OK.", body = Pool), crate::openapi::Errors)
)]
pub(super) async fn update_pool(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Pool>, ApiError> {
    let req: UpdatePool = parse(&body)?;
    Ok(Json(
        st.call(&headers, admin, Touch::Object(Kind::Pool, name.clone()), move |c, _| {
            c.update_pool(&name, req)
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/pools/{name}/explain",
    tag = "pools",
    summary = "Why the pool's pending tasks wait.",
    params(("name" = String, Path, description = "A pool name.")),
    responses((status = 200, description = "OK.", body = mpsfleet_core::explain::Explanation), crate::openapi::Errors)
)]
pub(super) async fn explain_pool(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<mpsfleet_core::explain::Explanation>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Pool, name.clone()), move |c, _| c.explain_pool(&name))
            .await?,
    ))
}

// ---- hosts ------------------------------------------------------------------------------
