//! Drills: run (or plan), list, describe, abort, and the cluster-wide switch.

use super::*;
use crate::cluster::drills::DrillStarted;
use mpsfleet_types::drill::{CreateDrill, Drill, DrillPlan, DrillSwitch};

#[utoipa::path(
    post,
    path = "/v1/drills",
    tag = "drills",
    summary = "Run a drill: inject a fault on chosen hosts of a pool and measure the recovery against the pool's bounds (or, with dryRun, plan it).",
    request_body = CreateDrill,
    responses(
        (status = 201, description = "Started.", body = Drill),
        (status = 200, description = "A dry run: the targets and the expected timeline.", body = DrillPlan),
        crate::openapi::Errors
    )
)]
pub(super) async fn run_drill(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CreateDrill = parse(&body)?;
    let touch = Touch::NewIn(req.pool.clone());
    let started = st.call(&headers, operator, touch, move |c, p| c.start_drill(req, &actor(&p))).await?;
    Ok(match started {
        DrillStarted::Plan(plan) => Json(plan).into_response(),
        DrillStarted::Started(d) => created(*d),
    })
}

#[utoipa::path(
    get,
    path = "/v1/drills",
    tag = "drills",
    summary = "Drills, newest first (the latest 100 are kept).",
    responses((status = 200, description = "OK.", body = Vec<Drill>), crate::openapi::Errors)
)]
pub(super) async fn list_drills(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Vec<Drill>>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::List, |c, who| {
            Ok(c.read().drills().into_iter().filter(|d| who.sees_pool(d.pool.as_str())).collect())
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/drills/{id}",
    tag = "drills",
    summary = "One drill: its targets, the bounds it is measured against, each phase measured and its verdict.",
    params(("id" = String, Path, description = "A drill id.")),
    responses((status = 200, description = "OK.", body = Drill), crate::openapi::Errors)
)]
pub(super) async fn describe_drill(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Drill>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Drill, id.clone()), move |c, _| c.read().drill(&id))
            .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/drills/{id}/abort",
    tag = "drills",
    summary = "Abort a running drill: its fault is taken back and what it broke restored.",
    params(("id" = String, Path, description = "A drill id.")),
    responses((status = 200, description = "OK.", body = Drill), crate::openapi::Errors)
)]
pub(super) async fn abort_drill(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Drill>, ApiError> {
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Drill, id.clone()), move |c, p| {
            c.abort_drill(&id, &actor(&p))
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/drills/switch",
    tag = "drills",
    summary = "Whether drills may run cluster-wide.",
    responses((status = 200, description = "OK.", body = DrillSwitch), crate::openapi::Errors)
)]
pub(super) async fn drill_switch(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<DrillSwitch>, ApiError> {
    Ok(Json(st.call(&headers, viewer, Touch::NoPool, |c, _| Ok(c.read().drill_switch())).await?))
}

#[utoipa::path(
    put,
    path = "/v1/drills/switch",
    tag = "drills",
    summary = "Allow drills cluster-wide, or switch them off: off blocks new drills and aborts the running ones.",
    request_body = DrillSwitch,
    responses((status = 200, description = "OK.", body = DrillSwitch), crate::openapi::Errors)
)]
pub(super) async fn set_drill_switch(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<DrillSwitch>, ApiError> {
    let req: DrillSwitch = parse(&body)?;
    Ok(Json(
        st.call(&headers, operator, Touch::Cluster, move |c, p| c.set_drill_switch(req.enabled, &actor(&p)))
            .await?,
    ))
}
