//! ECS's ARNs for what mpsfleet keeps, and the names or ARNs callers give:
//!
//! | object | ARN |
//! |---|---|
//! | cluster (pool) | `arn:aws:ecs:REGION:ACCOUNT:cluster/NAME` |
//! | task definition | `arn:aws:ecs:REGION:ACCOUNT:task-definition/FAMILY:REVISION` |
//! | task | `arn:aws:ecs:REGION:ACCOUNT:task/CLUSTER/ID` |
//! | service | `arn:aws:ecs:REGION:ACCOUNT:service/CLUSTER/NAME` |
//! | container instance (host) | `arn:aws:ecs:REGION:ACCOUNT:container-instance/CLUSTER/ID` |
//! | service deployment, revision | `arn:aws:ecs:REGION:ACCOUNT:service-deployment/CLUSTER/SERVICE/ID` (`deployments.rs`) |
//!
//! Wherever ECS takes an ARN or a short name, both are taken; an ARN of another account, or
//! of another kind, names nothing here.

/// How this call's answer names things: the region its request was signed for, and the
/// cluster's account id.
#[derive(Debug, Clone)]
pub struct Arns {
    pub region: String,
    pub account: String,
}

impl Arns {
    fn arn(&self, resource: std::fmt::Arguments<'_>) -> String {
        format!("arn:aws:ecs:{}:{}:{resource}", self.region, self.account)
    }

    /// The ARN of `resource` (`service-deployment/gpu/web/ID`) in this account and region.
    pub fn resource_arn(&self, resource: &str) -> String {
        self.arn(format_args!("{resource}"))
    }

    pub fn cluster(&self, pool: &str) -> String {
        self.arn(format_args!("cluster/{pool}"))
    }

    pub fn capacity_provider(&self, name: &str) -> String {
        self.arn(format_args!("capacity-provider/{name}"))
    }

    /// A missing capacity provider as ECS names it in a failure: `capacity_provider/NAME`.
    pub fn missing_capacity_provider(&self, name: &str) -> String {
        self.arn(format_args!("capacity_provider/{name}"))
    }

    pub fn task_definition(&self, family: &str, revision: u32) -> String {
        self.arn(format_args!("task-definition/{family}:{revision}"))
    }

    pub fn task(&self, pool: &str, id: &str) -> String {
        self.arn(format_args!("task/{pool}/{id}"))
    }

    pub fn service(&self, pool: &str, name: &str) -> String {
        self.arn(format_args!("service/{pool}/{name}"))
    }

    /// A service's ARN in ECS's older form, without its cluster.
    pub fn service_short(&self, name: &str) -> String {
        self.arn(format_args!("service/{name}"))
    }

    pub fn container_instance(&self, pool: &str, host: &str) -> String {
        self.arn(format_args!("container-instance/{pool}/{host}"))
    }

    /// The resource part of an ARN of this account (`cluster/gpu`), or `None` when `text` is
    /// not an ECS ARN of this account.
    pub fn resource<'a>(&self, text: &'a str) -> Option<&'a str> {
        let rest = text.strip_prefix("arn:")?;
        let mut parts = rest.splitn(5, ':');
        let (_partition, service, _region, account, resource) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        (service == "ecs" && account == self.account).then_some(resource)
    }

    /// What a caller names an object of `kind` (`cluster`, `task`, `service`,
    /// `container-instance`, `task-definition`) by: its short name or id, from either that or
    /// an ARN (whose `CLUSTER/` part, when there is one, is dropped). `None` for an ARN of another
    /// kind or account.
    pub fn short<'a>(&self, kind: &str, text: &'a str) -> Option<&'a str> {
        if !text.starts_with("arn:") {
            return Some(text);
        }
        let resource = self.resource(text)?;
        let rest = resource.strip_prefix(kind)?.strip_prefix('/')?;
        Some(rest.rsplit('/').next().unwrap_or(rest))
    }

    /// The cluster an ARN of a task, service or container instance names (`task/CLUSTER/ID`).
    pub fn cluster_of<'a>(&self, text: &'a str) -> Option<&'a str> {
        let resource = self.resource(text)?;
        let mut parts = resource.split('/');
        let (_kind, cluster, _id) = (parts.next()?, parts.next()?, parts.next()?);
        Some(cluster)
    }
}

/// Whether `r` looks like an AWS region name (`us-east-1`, `eu-central-2`, `local`).
pub fn valid_region(r: &str) -> bool {
    (1..=32).contains(&r.len())
        && r.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arns_and_short_names_name_the_same_objects() {
        let a = Arns { region: "us-east-2".into(), account: "123456789012".into() };
        assert_eq!(a.cluster("gpu"), "arn:aws:ecs:us-east-2:123456789012:cluster/gpu");
        assert_eq!(a.short("cluster", &a.cluster("gpu")), Some("gpu"));
        assert_eq!(a.short("cluster", "gpu"), Some("gpu"));
        let task = a.task("gpu", "t-1");
        assert_eq!(a.short("task", &task), Some("t-1"));
        assert_eq!(a.cluster_of(&task), Some("gpu"));
        assert_eq!(a.short("service", &task), None, "an ARN of another kind");
        assert_eq!(a.short("task-definition", &a.task_definition("web", 3)), Some("web:3"));
        let other = "arn:aws:ecs:us-east-2:999999999999:cluster/gpu";
        assert_eq!(a.short("cluster", other), None, "an ARN of another account");
        assert!(valid_region("us-east-1") && !valid_region("US") && !valid_region(""));
    }
}
