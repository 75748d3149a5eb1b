//! Clusters are pools: `CreateCluster` makes a pool with the default policy (an admin's call,
//! as `pool create` is), `DeleteCluster` deletes an empty one, `DescribeClusters` and
//! `ListClusters` read them, with the pools deleted lately as INACTIVE clusters (as ECS lists
//! its deleted clusters for a while).

use super::page::page;
use super::shapes;
use super::*;
use crate::cluster::catalog::PoolContents;
use mpsfleet_types::labels::Tag;
use mpsfleet_types::{CreatePool, Pool};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Create {
    cluster_name: Option<String>,
    #[serde(default)]
    tags: Vec<Tag>,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// The cluster fields ECS takes that mpsfleet keeps as given and shows back without acting on
/// them (Container Insights, ECS Exec, Service Connect are AWS's).
const KEPT: &[&str] = &["settings", "configuration", "serviceConnectDefaults"];

fn kept(rest: &serde_json::Map<String, Value>) -> std::collections::BTreeMap<String, Value> {
    KEPT.iter()
        .filter_map(|k| Some((k.to_string(), rest.get(*k).filter(|v| !v.is_null())?.clone())))
        .collect()
}

pub(super) async fn create(call: &Call, req: Create) -> Result<Value, EcsError> {
    let name = req.cluster_name.filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
    let arns = call.arns.clone();
    call.run(api::admin, Touch::Cluster, move |c, _| {
        // As ECS does, a cluster that exists is answered as it is.
        let pool = match c.read().pool(&name) {
            Ok(p) => p,
            Err(_) => c.create_pool(CreatePool {
                name,
                tags: req.tags,
                kept_fields: kept(&req.rest),
                ..Default::default()
            })?,
        };
        let n = c.read().pool_contents(pool.name.as_str())?;
        Ok(json!({ "cluster": shapes::cluster(&arns, &pool, &n, true) }))
    })
    .await
}

#[derive(Deserialize)]
pub(super) struct Delete {
    cluster: String,
}

pub(super) async fn delete(call: &Call, req: Delete) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let out = call
        .run(api::admin, Touch::List, move |c, who| {
            let name = pool_in(c, &who, &arns, Some(&req.cluster))?;
            // ECS names what is left in its refusal; the domain refuses the same (delete_pool).
            let n = c.read().pool_contents(&name)?;
            let refuse = |code: &'static str, what: &str| -> Result<Result<Value, EcsError>, Error> {
                Ok(Err(EcsError {
                    code,
                    ..EcsError::client(format!("The cluster {name} still has {what}."))
                }))
            };
            if n.hosts > 0 {
                return refuse("ClusterContainsContainerInstancesException", "container instances");
            }
            if n.services > 0 {
                return refuse("ClusterContainsServicesException", "services");
            }
            if n.live_tasks() > 0 {
                return refuse("ClusterContainsTasksException", "tasks that are not stopped");
            }
            let pool = c.delete_pool(&name)?;
            Ok(Ok(json!({ "cluster": inactive(&arns, &pool) })))
        })
        .await?;
    out
}

/// A deleted pool as ECS's INACTIVE cluster: nothing left in it.
fn inactive(arns: &arn::Arns, pool: &Pool) -> Value {
    let mut v = shapes::cluster(arns, pool, &PoolContents::default(), false);
    v["status"] = json!("INACTIVE");
    v
}

/// The pool deleted lately that `given` names, if the caller may see it.
fn deleted<'c>(c: &'c Cluster, who: &Principal, arns: &arn::Arns, given: &str) -> Option<&'c Pool> {
    let name = arns.short("cluster", given)?;
    c.read().deleted_pools().filter(|p| p.name.as_str() == name && who.sees_pool(name)).last()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Describe {
    #[serde(default)]
    clusters: Vec<String>,
    #[serde(default)]
    include: Vec<String>,
}

/// The most clusters one `DescribeClusters` names.
const MAX_DESCRIBE: usize = 100;

pub(super) async fn describe(call: &Call, req: Describe) -> Result<Value, EcsError> {
    if req.clusters.len() > MAX_DESCRIBE {
        return Err(EcsError::invalid(format!("clusters can name at most {MAX_DESCRIBE}")));
    }
    let arns = call.arns.clone();
    call.read(move |c, who| {
        let tags = with_tags(&req.include);
        let asked: Vec<Option<String>> =
            if req.clusters.is_empty() { vec![None] } else { req.clusters.into_iter().map(Some).collect() };
        let (mut found, mut failures) = (Vec::new(), Vec::new());
        for given in asked {
            match pool_in(c, &who, &arns, given.as_deref()) {
                Ok(name) => {
                    let pool = c.read().pool(&name)?;
                    found.push(shapes::cluster(&arns, &pool, &c.read().pool_contents(&name)?, tags));
                }
                Err(Error::NotFound { .. }) => {
                    let given = given.unwrap_or_else(|| "default".into());
                    if let Some(pool) = deleted(c, &who, &arns, &given) {
                        found.push(inactive(&arns, pool));
                        continue;
                    }
                    let arn = if given.starts_with("arn:") { given } else { arns.cluster(&given) };
                    failures.push(failure(&arn, "MISSING", None));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(json!({ "clusters": found, "failures": failures }))
    })
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct List {
    next_token: Option<String>,
    max_results: Option<i64>,
}

pub(super) async fn list(call: &Call, req: List) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    let names: Vec<String> = call
        .read(move |c, who| {
            let active = c.read().pools().into_iter().map(|p| p.name.to_string());
            let inactive = c.read().deleted_pools().map(|p| p.name.to_string());
            let mut names: Vec<String> = active.chain(inactive).filter(|p| who.sees_pool(p)).collect();
            names.sort();
            Ok(names)
        })
        .await?;
    let (names, next) = page(names, Clone::clone, req.next_token.as_deref(), req.max_results)?;
    let arns: Vec<String> = names.iter().map(|n| arns.cluster(n)).collect();
    Ok(json!({ "clusterArns": arns, "nextToken": next }))
}

#[derive(Deserialize)]
pub(super) struct Update {
    cluster: String,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// `UpdateCluster`: replaces the kept `settings` and `configuration` given.
pub(super) async fn update(call: &Call, req: Update) -> Result<Value, EcsError> {
    let arns = call.arns.clone();
    call.run(api::admin, Touch::List, move |c, who| {
        let name = pool_in(c, &who, &arns, Some(&req.cluster))?;
        let pool = c.keep_pool_fields(&name, kept(&req.rest))?;
        Ok(json!({ "cluster": shapes::cluster(&arns, &pool, &c.read().pool_contents(&name)?, false) }))
    })
    .await
}
