//! Each role is refused exactly what it may not do: every route of the API, called by a token
//! of each role (and by a host credential and the join token), against the real server. The
//! table must name every route the server's router has.

mod common;

use common::*;
use mpsfleet_types::access::{CreateToken, Role};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Public,
    Role(Role),
    /// The agent routes: a host credential (the register route: the join token).
    Agent,
    Join,
    /// Another server of the cluster only (a header signed with the cluster's key): no token.
    Servers,
}

/// Every route, with the least that may call it. Ids in paths name nothing: an allowed call
/// answers 404 or 400, never 401 or 403, and changes nothing.
const ROUTES: &[(&str, &str, Open)] = &[
    ("GET", "/v1/healthz", Open::Public),
    ("GET", "/v1/openapi.json", Open::Public),
    ("GET", "/metrics", Open::Role(Role::Viewer)),
    ("POST", "/v1/taskdefs", Open::Role(Role::Operator)),
    ("GET", "/v1/taskdefs", Open::Role(Role::Viewer)),
    ("GET", "/v1/taskdefs/{reference}", Open::Role(Role::Viewer)),
    ("POST", "/v1/pools", Open::Role(Role::Admin)),
    ("GET", "/v1/pools", Open::Role(Role::Viewer)),
    ("GET", "/v1/pools/{name}", Open::Role(Role::Viewer)),
    ("PATCH", "/v1/pools/{name}", Open::Role(Role::Admin)),
    ("GET", "/v1/pools/{name}/explain", Open::Role(Role::Viewer)),
    ("GET", "/v1/hosts", Open::Role(Role::Viewer)),
    ("GET", "/v1/hosts/{id}", Open::Role(Role::Viewer)),
    ("GET", "/v1/hosts/{id}/metrics", Open::Role(Role::Viewer)),
    ("GET", "/v1/metrics/targets", Open::Role(Role::Viewer)),
    ("POST", "/v1/hosts/{id}/cordon", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/uncordon", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/drain", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/replace", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/activate", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/recheck", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/forget", Open::Role(Role::Operator)),
    ("POST", "/v1/hosts/{id}/revoke-credential", Open::Role(Role::Admin)),
    ("GET", "/v1/incidents", Open::Role(Role::Viewer)),
    ("GET", "/v1/incidents/{id}", Open::Role(Role::Viewer)),
    ("POST", "/v1/incidents/{id}/acknowledge", Open::Role(Role::Operator)),
    ("POST", "/v1/incidents/{id}/resolve", Open::Role(Role::Operator)),
    ("POST", "/v1/drills", Open::Role(Role::Operator)),
    ("GET", "/v1/drills", Open::Role(Role::Viewer)),
    ("GET", "/v1/drills/switch", Open::Role(Role::Viewer)),
    ("PUT", "/v1/drills/switch", Open::Role(Role::Operator)),
    ("GET", "/v1/drills/{id}", Open::Role(Role::Viewer)),
    ("POST", "/v1/drills/{id}/abort", Open::Role(Role::Operator)),
    ("GET", "/v1/events", Open::Role(Role::Viewer)),
    ("GET", "/v1/events/replica", Open::Servers),
    ("GET", "/v1/discovery/replica", Open::Servers),
    ("POST", "/v1/console/links", Open::Role(Role::Viewer)),
    // No token: a one-time code in a header (without one, 400 to anyone).
    ("POST", "/v1/console/session", Open::Public),
    ("POST", "/v1/tasks", Open::Role(Role::Operator)),
    ("GET", "/v1/tasks", Open::Role(Role::Viewer)),
    ("GET", "/v1/tasks/{id}", Open::Role(Role::Viewer)),
    ("POST", "/v1/tasks/{id}/stop", Open::Role(Role::Operator)),
    ("POST", "/v1/tasks/{id}/protection", Open::Role(Role::Operator)),
    ("GET", "/v1/tasks/{id}/logs", Open::Role(Role::Viewer)),
    ("POST", "/v1/tasks/{id}/exec", Open::Role(Role::Operator)),
    ("GET", "/v1/tasks/{id}/events", Open::Role(Role::Viewer)),
    ("POST", "/v1/services", Open::Role(Role::Operator)),
    ("GET", "/v1/services", Open::Role(Role::Viewer)),
    ("GET", "/v1/services/{name}/endpoints", Open::Role(Role::Viewer)),
    ("GET", "/v1/services/{name}/deployments", Open::Role(Role::Viewer)),
    ("GET", "/v1/services/{name}", Open::Role(Role::Viewer)),
    ("PATCH", "/v1/services/{name}", Open::Role(Role::Operator)),
    ("DELETE", "/v1/services/{name}", Open::Role(Role::Operator)),
    ("POST", "/v1/agent/register", Open::Join),
    ("POST", "/v1/agent/status", Open::Agent),
    ("GET", "/v1/agent/assignments", Open::Agent),
    ("POST", "/v1/agent/tasks/{id}/status", Open::Agent),
    ("GET", "/v1/agent/tasks/{id}/secrets", Open::Agent),
    ("POST", "/v1/secrets", Open::Role(Role::Admin)),
    ("GET", "/v1/secrets", Open::Role(Role::Admin)),
    ("DELETE", "/v1/secrets/{*name}", Open::Role(Role::Admin)),
    ("POST", "/v1/tokens", Open::Role(Role::Admin)),
    ("GET", "/v1/tokens", Open::Role(Role::Admin)),
    ("DELETE", "/v1/tokens/{id}", Open::Role(Role::Admin)),
    ("POST", "/v1/join-tokens", Open::Role(Role::Admin)),
    ("GET", "/v1/join-tokens", Open::Role(Role::Admin)),
    ("DELETE", "/v1/join-tokens/{id}", Open::Role(Role::Admin)),
    ("GET", "/v1/audit", Open::Role(Role::Admin)),
    ("GET", "/v1/cluster/ca", Open::Public),
    ("GET", "/v1/cluster/certificate", Open::Role(Role::Viewer)),
    ("POST", "/v1/cluster/certificate/rotate", Open::Role(Role::Admin)),
    ("POST", "/v1/admin-token/rotate", Open::Role(Role::Admin)),
    ("GET", "/v1/cluster/ca/rotation", Open::Role(Role::Viewer)),
    ("GET", "/v1/cluster/status", Open::Role(Role::Viewer)),
    ("POST", "/v1/cluster/ca/rotation", Open::Role(Role::Admin)),
    ("DELETE", "/v1/cluster/ca/rotation", Open::Role(Role::Admin)),
    ("POST", "/v1/cluster/ca/rotation/activate", Open::Role(Role::Admin)),
];

/// The routes that reach beyond one pool, closed to a token scoped to one (403) whatever its
/// role; every other route is open to it as far as its role goes (what it names is checked
/// against its pool by the operation, and the ids here name nothing).
const BEYOND_ONE_POOL: &[(&str, &str)] = &[
    ("GET", "/metrics"),
    ("POST", "/v1/taskdefs"),
    ("POST", "/v1/pools"),
    ("GET", "/v1/metrics/targets"),
    ("GET", "/v1/events"),
    ("PUT", "/v1/drills/switch"),
    ("POST", "/v1/secrets"),
    ("GET", "/v1/secrets"),
    ("DELETE", "/v1/secrets/{*name}"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/tokens"),
    ("DELETE", "/v1/tokens/{id}"),
    ("POST", "/v1/join-tokens"),
    ("GET", "/v1/join-tokens"),
    ("DELETE", "/v1/join-tokens/{id}"),
    ("GET", "/v1/audit"),
    ("POST", "/v1/cluster/certificate/rotate"),
    ("POST", "/v1/admin-token/rotate"),
    ("GET", "/v1/cluster/ca/rotation"),
    ("GET", "/v1/cluster/status"),
    ("POST", "/v1/cluster/ca/rotation"),
    ("DELETE", "/v1/cluster/ca/rotation"),
    ("POST", "/v1/cluster/ca/rotation/activate"),
];

/// The paths the router serves, read from its source: a route added without a row here fails.
#[test]
fn the_table_names_every_route_of_the_router() {
    let source = include_str!("../../mpsfleet-server/src/api.rs");
    let router = &source[source.find("pub fn router").unwrap()..];
    let router = &router[..router.find(".fallback(").unwrap()];
    let mut missing = Vec::new();
    for part in router.split(".route(\"").skip(1) {
        let path = &part[..part.find('"').unwrap()];
        if !ROUTES.iter().any(|(_, p, _)| *p == path) {
            missing.push(path.to_string());
        }
    }
    assert!(missing.is_empty(), "routes without a row in ROUTES: {missing:?}");
}

fn concrete(path: &str) -> String {
    path.replace("{reference}", "nope:1")
        .replace("{name}", "nope")
        .replace("{id}", "nope")
        .replace("{*name}", "nope")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_is_refused_exactly_what_it_may_not_do() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let admin = server.admin();
    create_pool(&admin, "gpu").await;
    let mut tokens = Vec::new();
    for role in [Role::Viewer, Role::Operator, Role::Admin] {
        let req = CreateToken {
            role,
            expires_in_s: Some(3600),
            description: format!("{} test", role.as_str()),
            pool: None,
            aws: false,
        };
        tokens.push((Some(role), admin.create_token(&req).await.expect("create token").token));
    }
    let scoped_req = CreateToken {
        role: Role::Operator,
        expires_in_s: Some(3600),
        description: "scoped test".into(),
        pool: Some("gpu".into()),
        aws: false,
    };
    let scoped = admin.create_token(&scoped_req).await.expect("create token").token;
    let join = server.join_token();
    let joiner = server.client(Some(join.clone()));
    let credential = joiner.register_host(&registration("gpu", "n1", "n1", 1)).await.unwrap().credential;

    let http = server.http();
    let mut wrong = Vec::new();
    for (method, path, open) in ROUTES {
        let url = format!("{}{}", server.url, concrete(path));
        let mut callers: Vec<(String, Option<String>, bool)> = tokens
            .iter()
            .map(|(role, token)| {
                let r = role.unwrap();
                let allowed = match open {
                    Open::Public => true,
                    Open::Role(needed) => r.allows(*needed),
                    Open::Agent | Open::Join | Open::Servers => false,
                };
                (format!("{} token", r.as_str()), Some(token.clone()), allowed)
            })
            .collect();
        let beyond = BEYOND_ONE_POOL.contains(&(*method, *path));
        let scoped_allowed = match open {
            Open::Public => true,
            Open::Role(needed) => Role::Operator.allows(*needed) && !beyond,
            Open::Agent | Open::Join | Open::Servers => false,
        };
        callers.push(("operator token scoped to gpu".into(), Some(scoped.clone()), scoped_allowed));
        callers.push((
            "host credential".into(),
            Some(credential.clone()),
            matches!(open, Open::Public | Open::Agent),
        ));
        callers.push(("join token".into(), Some(join.clone()), matches!(open, Open::Public | Open::Join)));
        for (who, token, allowed) in callers {
            let mut req = http.request(method.parse().unwrap(), &url);
            if let Some(t) = &token {
                req = req.bearer_auth(t);
            }
            if *method != "GET" && *method != "DELETE" {
                req = req.header("content-type", "application/json").body("{}");
            }
            let status =
                req.send().await.unwrap_or_else(|e| panic!("{method} {path} as {who}: {e}")).status();
            // A scoped token's call is admitted by its operation, after its body is read: the
            // empty `{}` body of a closed route may be refused as malformed first (400), never
            // served. (A valid one is 403: `a_token_scoped_to_one_pool_reaches_that_pool_only`.)
            let malformed = who.contains("scoped") && status == 400;
            let refused = status == 401 || status == 403 || (malformed && !allowed);
            if refused == allowed {
                wrong.push(format!("{method} {path} as {who}: {status} (allowed: {allowed})"));
            }
            assert!(status.as_u16() < 500, "{method} {path} as {who}: {status}");
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The admin-role token rotated the bootstrap admin token on its way: the server's
    // admin.token holds the new one.
    let admin = server.admin();

    // Tokens are listed without their value; a revoked one stops at once.
    let list = admin.list_tokens().await.unwrap();
    assert_eq!(list.len(), 4);
    let listed = serde_json::to_string(&list).unwrap();
    assert!(tokens.iter().all(|(_, t)| !listed.contains(t.as_str())), "token list shows a token");
    let viewer = server.client(Some(tokens[0].1.clone()));
    viewer.list_pools().await.expect("a viewer reads pools");
    // Tokens made in the same millisecond list in id order: find each by what it was made as.
    let made_as = |description: &str| {
        let view = list.iter().find(|t| t.description == description);
        view.unwrap_or_else(|| panic!("no token {description:?} in {list:#?}")).id.clone()
    };
    admin.revoke_token(&made_as("viewer test")).await.unwrap();
    let e = viewer.list_pools().await.unwrap_err();
    assert_eq!(e.code(), Some("Unauthorized"), "{e}");

    // Every change above is in the audit log, with who made it; reads and agents' calls are not.
    let operator = server.client(Some(tokens[1].1.clone()));
    operator.cordon_host("nope", true).await.unwrap_err();
    let log = admin.audit(10_000).await.unwrap();
    let op_id = made_as("operator test");
    let entry = log
        .iter()
        .rev()
        .find(|e| e.actor == format!("token:{op_id}") && e.target == "/v1/hosts/nope/cordon")
        .unwrap_or_else(|| panic!("no entry for the operator's cordon: {log:#?}"));
    assert_eq!(entry.role, Role::Operator);
    assert_eq!(entry.action, "POST /v1/hosts/{id}/cordon");
    assert_eq!(entry.from, "127.0.0.1");
    assert!(entry.result.starts_with("NotFound: host nope not found"), "{entry:?}");
    let revoke = log
        .iter()
        .rev()
        .find(|e| e.action == "DELETE /v1/tokens/{id}" && e.actor == "admin")
        .expect("the revoke");
    assert_eq!((revoke.actor.as_str(), revoke.result.as_str()), ("admin", "ok"));
    assert!(revoke.revision.is_some());
    assert!(
        log.iter().all(|e| !e.action.starts_with("GET ") && !e.target.starts_with("/v1/agent/")),
        "{log:#?}"
    );
    // A call its role may not make is refused before it reaches the cluster: no entry. The one
    // change a viewer may make, asking for a console sign-in link, is recorded.
    assert!(log.iter().all(|e| e.role != Role::Viewer || e.action == "POST /v1/console/links"), "{log:#?}");
    assert!(log.iter().any(|e| e.role == Role::Viewer && e.action == "POST /v1/console/links"), "{log:#?}");
}

/// A token scoped to one pool sees and changes that pool's hosts, tasks, services and
/// incidents only; what reaches beyond one pool is closed to it; admin tokens are never scoped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_scoped_to_one_pool_reaches_that_pool_only() {
    use mpsfleet_client::TaskQuery;
    use mpsfleet_types::{CreateService, RunTask};
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(dir.path());
        let admin = server.admin();
        admin.register_taskdef(mps_taskdef("infer", 1000)).await.unwrap();
        let mut hosts = Vec::new();
        let mut tasks = Vec::new();
        for pool in ["a", "b"] {
            create_pool(&admin, pool).await;
            hosts.push(add_host(&server, pool, &format!("{pool}-1"), 2).await.0.to_string());
            let run = RunTask {
                task_definition: "infer".into(),
                count: 1,
                pool: pool.into(),
                client_token: None,
                ..Default::default()
            };
            tasks.push(admin.run_task(&run).await.unwrap().tasks[0].id.to_string());
            let svc = CreateService {
                name: format!("svc-{pool}"),
                pool: pool.into(),
                task_definition: "infer".into(),
                desired_count: 0,
                resumption: None,
                deployment_configuration: None,
                client_token: None,
                ..Default::default()
            };
            admin.create_service(&svc).await.unwrap();
        }
        let scoped = |role| CreateToken {
            role,
            expires_in_s: None,
            description: "pool a".into(),
            pool: Some("a".into()),
            aws: false,
        };
        let e = admin.create_token(&scoped(Role::Admin)).await.unwrap_err();
        assert!(e.to_string().contains("pool"), "{e}");
        let e = admin
            .create_token(&CreateToken { pool: Some("nope".into()), ..scoped(Role::Viewer) })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no pool named"), "{e}");
        let made = admin.create_token(&scoped(Role::Operator)).await.unwrap();
        assert_eq!(made.view.pool.as_deref(), Some("a"));
        assert_eq!(admin.list_tokens().await.unwrap()[0].pool.as_deref(), Some("a"));
        let op = server.client(Some(made.token));

        // Lists hold pool a only; asking for b is refused.
        let pools: Vec<String> =
            op.list_pools().await.unwrap().into_iter().map(|p| p.name.to_string()).collect();
        assert_eq!(pools, vec!["a"]);
        let seen: Vec<String> =
            op.list_hosts(None).await.unwrap().into_iter().map(|h| h.id.to_string()).collect();
        assert_eq!(seen, vec![hosts[0].clone()]);
        forbidden(op.list_hosts(Some("b")).await, "hosts of b");
        let seen: Vec<String> = op
            .list_tasks(&TaskQuery::default())
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id.to_string())
            .collect();
        assert_eq!(seen, vec![tasks[0].clone()]);
        let q = TaskQuery { pool: Some("b".into()), ..Default::default() };
        forbidden(op.list_tasks(&q).await, "tasks of b");
        let seen: Vec<String> =
            op.list_services().await.unwrap().into_iter().map(|s| s.service.name.to_string()).collect();
        assert_eq!(seen, vec!["svc-a"]);

        // One object: its pool's, or refused.
        op.describe_host(&hosts[0]).await.unwrap();
        hidden(op.describe_host(&hosts[1]).await, "host of b");
        op.cordon_host(&hosts[0], true).await.unwrap();
        hidden(op.cordon_host(&hosts[1], true).await, "cordon in b");
        assert!(!admin.describe_host(&hosts[1]).await.unwrap().cordoned, "refused, yet changed");
        hidden(op.stop_task(&tasks[1], None).await, "stop in b");
        hidden(op.describe_pool("b").await, "pool b");
        let missing = op.describe_host("h-nope").await.unwrap_err();
        assert_eq!(missing.code(), Some("NotFound"), "{missing}");

        // A body names its pool.
        let run = |pool: &str| RunTask {
            task_definition: "infer".into(),
            count: 1,
            pool: pool.into(),
            client_token: None,
            ..Default::default()
        };
        op.run_task(&run("a")).await.unwrap();
        forbidden(op.run_task(&run("b")).await, "run in b");
        assert_eq!(
            admin
                .list_tasks(&TaskQuery { pool: Some("b".into()), ..Default::default() })
                .await
                .unwrap()
                .len(),
            1
        );

        // What belongs to no pool is open; what reaches beyond one pool is not.
        op.list_taskdefs(None).await.unwrap();
        forbidden(
            op.register_taskdef(mps_taskdef("infer", 500)).await,
            "a new revision of a family every pool runs",
        );
        let http = server.http();
        let events = http
            .get(format!("{}/v1/events", server.url))
            .bearer_auth(op_token(&admin).await)
            .send()
            .await
            .unwrap();
        assert_eq!(events.status(), 403);
    })
    .await
}

/// Asserts `r` was refused for its token's scope.
fn forbidden<T>(r: Result<T, mpsfleet_client::ClientError>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.code(), Some("Forbidden"), "{what}: {e}"),
        Ok(_) => panic!("{what}: allowed"),
    }
}

/// Asserts `r` was answered as if its object did not exist: it is another pool's.
fn hidden<T>(r: Result<T, mpsfleet_client::ClientError>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.code(), Some("NotFound"), "{what}: {e}"),
        Ok(_) => panic!("{what}: allowed"),
    }
}

/// A fresh operator token of pool a, for a raw request.
async fn op_token(admin: &mpsfleet_client::Client) -> String {
    let req = CreateToken {
        role: Role::Operator,
        expires_in_s: Some(60),
        description: "raw".into(),
        pool: Some("a".into()),
        aws: false,
    };
    admin.create_token(&req).await.unwrap().token
}
