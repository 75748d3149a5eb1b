//! `service endpoints`: each endpoint with the address its port is really bound on, read from
//! the bindings the task's agent reported (what Docker bound, inspected after the start).

use mpsfleet_types::{ServiceEndpoint, Task};
use serde::Serialize;

/// The table's columns.
pub const HEADERS: [&str; 8] =
    ["ADDRESS", "SCOPE", "PROTOCOL", "CONTAINER PORT", "TASK", "CONTAINER", "HOST", "READY"];

/// Where a published port can be reached from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Bound on every address of the host (`0.0.0.0`, `::`): reachable from its networks.
    AllInterfaces,
    /// Bound on a loopback address: reachable from the host itself only.
    Loopback,
    /// Bound on one address of the host.
    OneAddress,
    /// An awsvpc task's port, at the task's own address: nothing is published on the host.
    TaskNetwork,
    /// The task no longer reports the binding (it stopped since the endpoints were read).
    Unknown,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::AllInterfaces => "all interfaces",
            Scope::Loopback => "loopback",
            Scope::OneAddress => "one address",
            Scope::TaskNetwork => "task network",
            Scope::Unknown => "-",
        }
    }
}

/// One endpoint as `service endpoints` shows it: the server's fields as they are, and the
/// address the port is bound on.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    #[serde(flatten)]
    pub endpoint: ServiceEndpoint,
    /// `ADDRESS:PORT` as the kernel lists the socket (`ss -ltn`): `0.0.0.0:32768` for a port
    /// on every address, `127.0.0.1:32768`, `[::1]:32768`; absent when none is reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_address: Option<String>,
    pub scope: Scope,
}

impl EndpointView {
    /// The bound address, else the server's address (an awsvpc task's, or one whose binding
    /// is gone).
    pub fn shown_address(&self) -> &str {
        self.bound_address.as_deref().unwrap_or(&self.endpoint.address)
    }
}

/// Each endpoint with the binding its task reports for it (same container, host port,
/// container port and protocol).
pub fn views(list: &[ServiceEndpoint], tasks: &[Task]) -> Vec<EndpointView> {
    list.iter()
        .map(|e| {
            let container = tasks
                .iter()
                .find(|t| t.id == e.task_id)
                .and_then(|t| t.containers.iter().find(|c| c.name == e.container));
            let binding = container.and_then(|c| {
                c.network_bindings.iter().find(|b| {
                    (b.host_port, b.container_port, b.protocol) == (e.host_port, e.container_port, e.protocol)
                })
            });
            let (bound_address, scope) = match (binding, container) {
                (Some(b), _) => (Some(b.address()), scope_of(&b.bind_ip, b.on_every_address())),
                (None, Some(c)) if !c.network_interfaces.is_empty() => (None, Scope::TaskNetwork),
                (None, _) => (None, Scope::Unknown),
            };
            EndpointView { endpoint: e.clone(), bound_address, scope }
        })
        .collect()
}

fn scope_of(bind_ip: &str, every: bool) -> Scope {
    match bind_ip.parse::<std::net::IpAddr>() {
        _ if every => Scope::AllInterfaces,
        Ok(ip) if ip.is_loopback() => Scope::Loopback,
        _ => Scope::OneAddress,
    }
}

/// The table's rows, in [`HEADERS`]' order.
pub fn rows(views: &[EndpointView]) -> Vec<Vec<String>> {
    views
        .iter()
        .map(|v| {
            let e = &v.endpoint;
            vec![
                v.shown_address().to_string(),
                v.scope.as_str().into(),
                e.protocol.as_str().into(),
                e.container_port.to_string(),
                e.task_id.to_string(),
                e.container.clone(),
                e.host_id.to_string(),
                if e.ready { "yes".into() } else { "no".into() },
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(task: &str, address: &str, host_port: u16) -> ServiceEndpoint {
        serde_json::from_value(serde_json::json!({
            "taskId": task, "hostId": "h1", "container": "web", "address": address,
            "hostPort": host_port, "containerPort": 8080, "protocol": "tcp",
            "ready": true, "healthStatus": "HEALTHY",
        }))
        .expect("endpoint json")
    }

    fn task(id: &str, container: serde_json::Value) -> Task {
        serde_json::from_value(serde_json::json!({
            "id": id, "taskDefinition": "web:1", "pool": "p",
            "lastStatus": "RUNNING", "desiredStatus": "RUNNING", "healthStatus": "HEALTHY",
            "startedBy": "run:x", "createdAtMs": 1, "containers": [container],
        }))
        .expect("task json")
    }

    fn bound(ip: &str, host_port: u16) -> serde_json::Value {
        serde_json::json!({"name": "web", "networkBindings": [
            {"bindIp": ip, "containerPort": 8080, "hostPort": host_port, "protocol": "tcp"}
        ]})
    }

    #[test]
    fn each_endpoint_shows_the_address_its_port_is_bound_on() {
        let ids = ["t-0000000000000001", "t-0000000000000002", "t-0000000000000003", "t-0000000000000004"];
        let list = vec![
            // The server shows the host's address for a port on every address.
            endpoint(ids[0], "10.0.0.5:32768", 32768),
            endpoint(ids[1], "127.0.0.1:32769", 32769),
            endpoint(ids[2], "[::1]:32770", 32770),
            endpoint(ids[3], "172.18.0.2:8080", 8080),
            // A task the list no longer has.
            endpoint("t-0000000000000009", "10.0.0.5:32771", 32771),
        ];
        let awsvpc = serde_json::json!({"name": "web", "networkInterfaces": [
            {"attachmentId": "a", "privateIpv4Address": "172.18.0.2"}
        ]});
        let tasks = vec![
            task(ids[0], bound("0.0.0.0", 32768)),
            task(ids[1], bound("127.0.0.1", 32769)),
            task(ids[2], bound("::1", 32770)),
            task(ids[3], awsvpc),
        ];
        let v = views(&list, &tasks);
        let got: Vec<(&str, Scope)> = v.iter().map(|v| (v.shown_address(), v.scope)).collect();
        assert_eq!(
            got,
            vec![
                ("0.0.0.0:32768", Scope::AllInterfaces),
                ("127.0.0.1:32769", Scope::Loopback),
                ("[::1]:32770", Scope::Loopback),
                ("172.18.0.2:8080", Scope::TaskNetwork),
                ("10.0.0.5:32771", Scope::Unknown),
            ]
        );
        let r = rows(&v);
        assert_eq!(r[0][..2], ["0.0.0.0:32768".to_string(), "all interfaces".to_string()]);
        assert_eq!(r[0].len(), HEADERS.len());
        // JSON: the server's fields as they are, plus the bound address and the scope.
        let json = serde_json::to_value(&v[0]).expect("json");
        assert_eq!(json["address"], "10.0.0.5:32768");
        assert_eq!(json["hostPort"], 32768);
        assert_eq!(json["boundAddress"], "0.0.0.0:32768");
        assert_eq!(json["scope"], "all-interfaces");
        assert!(serde_json::to_value(&v[3]).expect("json").get("boundAddress").is_none());
    }

    #[test]
    fn a_binding_of_another_port_is_not_taken() {
        let list = vec![endpoint("t-0000000000000001", "10.0.0.5:32768", 32768)];
        let tasks = vec![task("t-0000000000000001", bound("127.0.0.1", 40000))];
        let v = views(&list, &tasks);
        assert_eq!((v[0].shown_address(), v[0].scope), ("10.0.0.5:32768", Scope::Unknown));
    }
}
