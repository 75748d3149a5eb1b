//! Tasks: run, list, describe, their events, stop.

use super::*;

#[utoipa::path(
    post,
    path = "/v1/tasks",
    tag = "tasks",
    summary = "Start tasks of a task definition in a pool.",
    request_body = RunTask,
    responses((status = 201, description = "OK.", body = mpsfleet_types::api::RunTaskResponse), crate::openapi::Errors)
)]
pub(super) async fn run_tasks(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: RunTask = parse(&body)?;
    let out = st
        .call(&headers, operator, Touch::NewIn(req.pool.to_string()), move |c, p| {
            c.run_tasks_as(req, &actor(&p))
        })
        .await?;
    Ok(created(RunTaskResponse { tasks: out.tasks, placed: out.placed, pending: out.pending }))
}

#[utoipa::path(
    get,
    path = "/v1/tasks",
    tag = "tasks",
    summary = "Tasks, in creation order or newest first.",
    params(("pool" = Option<String>, Query, description = "Only tasks of this pool."), ("service" = Option<String>, Query, description = "Only tasks of this service."), ("host" = Option<String>, Query, description = "Only tasks placed on this host."), ("status" = Option<String>, Query, description = "Only tasks whose lastStatus is this (RUNNING, PENDING, STOPPED, ...)."), ("limit" = Option<usize>, Query, minimum = 1, maximum = 1000000, description = "At most this many (default 1000)."), ("skip" = Option<usize>, Query, description = "Leave out this many first (paging; default 0)."), ("order" = Option<String>, Query, description = "`oldest` (creation order, the default) or `newest` first."), ("live" = Option<bool>, Query, description = "`true`: leave out STOPPED tasks.")),
    responses((status = 200, description = "OK.", body = Vec<Task>), crate::openapi::Errors)
)]
pub(super) async fn list_tasks(
    State(st): State<AppState>,
    headers: HeaderMap,
    Q(q): Q<HashMap<String, String>>,
) -> Result<Json<Vec<Task>>, ApiError> {
    let status = match q.get("status") {
        None => None,
        Some(s) => Some(
            serde_json::from_value::<TaskStatus>(serde_json::Value::String(s.to_uppercase()))
                .map_err(|_| ApiError::invalid("status", format!("unknown task status {s:?}")))?,
        ),
    };
    let (limit, skip) = paging(q.get("limit"), q.get("skip"), 1000)?;
    let newest_first = match q.get("order").map(String::as_str) {
        None | Some("oldest") => false,
        Some("newest") => true,
        Some(o) => return Err(ApiError::invalid("order", format!("must be oldest or newest, got {o:?}"))),
    };
    let live = match q.get("live").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(l) => return Err(ApiError::invalid("live", format!("must be true or false, got {l:?}"))),
    };
    let filter = TaskFilter {
        pool: q.get("pool").cloned(),
        service: q.get("service").cloned(),
        host: q.get("host").cloned(),
        status,
        limit,
        skip,
        newest_first,
        live,
    };
    Ok(Json(
        st.call(&headers, viewer, Touch::List, move |c, who| {
            let mut filter = filter;
            filter.pool = scoped_pool(&who, filter.pool)?;
            Ok(c.tasks(&filter))
        })
        .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    tag = "tasks",
    summary = "One task.",
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits).")),
    responses((status = 200, description = "OK.", body = Task), crate::openapi::Errors)
)]
pub(super) async fn describe_task(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Task, id.clone()), move |c, _| c.read().task(&id))
            .await?,
    ))
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/events",
    tag = "tasks",
    summary = "A task's events (placed, pulled, started, probe failed, unable to place, stopped), oldest first; kept in memory by the server that saw them.",
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits).")),
    responses((status = 200, description = "OK.", body = mpsfleet_types::History<mpsfleet_types::ObjectEvent>), crate::openapi::Errors)
)]
pub(super) async fn task_events(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<mpsfleet_types::History<mpsfleet_types::ObjectEvent>>, ApiError> {
    Ok(Json(
        st.call(&headers, viewer, Touch::Object(Kind::Task, id.clone()), move |c, _| {
            c.read().task_events(&id)
        })
        .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/protection",
    tag = "tasks",
    summary = "Protect a task from its service's scale-in and deployments, or end that.",
    request_body = ProtectTask,
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits).")),
    responses((status = 200, description = "OK.", body = Task), crate::openapi::Errors)
)]
pub(super) async fn protect_task(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Task>, ApiError> {
    let req: ProtectTask = parse(&body)?;
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Task, id.clone()), move |c, _| {
            let mut done = c.protect_tasks(&[id], req.protection_enabled, req.expires_in_minutes)?;
            Ok(done.remove(0))
        })
        .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/stop",
    tag = "tasks",
    summary = "Stop a task.",
    request_body(content = Option<StopTask>, description = "May be empty."),
    params(("id" = String, Path, description = "A task id (t- and 16 hex digits).")),
    responses((status = 200, description = "OK.", body = Task), crate::openapi::Errors)
)]
pub(super) async fn stop_task(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Task>, ApiError> {
    let req: StopTask = if body.is_empty() { StopTask::default() } else { parse(&body)? };
    Ok(Json(
        st.call(&headers, operator, Touch::Object(Kind::Task, id.clone()), move |c, _| {
            c.stop_task(&id, req.reason)
        })
        .await?,
    ))
}
