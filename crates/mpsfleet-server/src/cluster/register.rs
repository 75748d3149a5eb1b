//! Registration without slow work under the cluster lock.
//! The operations are `Cluster`'s, in `hosts.rs` and `workloads.rs`; what they share is here.
//!
//! A task definition is parsed, validated and encoded before the lock is taken
//! ([`ValidTaskDef`]); under it only the revision is chosen and the record committed. A host
//! registration is checked on its own and given its id and secrets before the lock too
//! ([`HostRequest`]); concurrent registrations then share one store commit (one fsync): the
//! [`RegistrationQueue`] collects them while a commit is in progress and
//! [`Cluster::register_hosts`] checks each against the state and the earlier members of its
//! group, commits the ones that pass as one batch and answers each only after that commit.

use super::Error;
use super::{Change, HOST};
use crate::auth::{self};
use mpsfleet_core::taskdef::{parse_task_definition, ParsedTaskDefinition};
use mpsfleet_store::{Op, Precondition};
use mpsfleet_types::api::{FieldError, RegisterHostResponse};
use mpsfleet_types::{Family, GpuUuid, Host, HostId, HostRegistration, Incident};
use std::collections::HashSet;

/// The most GPUs one host may register.
pub const MAX_HOST_GPUS: usize = 64;
/// The most volume or log drivers a host may list, and the longest name of one.
pub const MAX_PLUGINS: usize = 64;
pub const MAX_PLUGIN_NAME_BYTES: usize = 255;
/// The most bytes of a host's name.
pub const MAX_HOSTNAME_BYTES: usize = 255;
/// The most bytes of the container runtime version a host reports.
pub const MAX_RUNTIME_VERSION_BYTES: usize = 128;
/// The most bytes of a GPU's `model` and `computeCapability`.
pub const MAX_GPU_TEXT_BYTES: usize = 255;
/// The most MiB a GPU may report.
pub const MAX_GPU_MEMORY_MIB: u64 = 16_777_216;
/// The most MPS clients a GPU may accept.
pub const MAX_GPU_MPS_CLIENTS: u32 = 1024;
/// The most registrations one group commit takes; the rest wait for the next.
pub const MAX_GROUP: usize = 1024;

// ---- task definitions -------------------------------------------------------------------

/// A task definition that passed validation, with everything but its family, revision and
/// registration time already encoded as JSON.
pub struct ValidTaskDef {
    pub(super) parsed: ParsedTaskDefinition,
    /// The definition's other fields as a JSON object's members, without its braces.
    pub(super) rest_json: Vec<u8>,
}

impl ValidTaskDef {
    /// Parses, validates and encodes `body`: the work proportional to its size, done before
    /// the cluster lock is taken.
    pub fn parse(body: &[u8]) -> Result<ValidTaskDef, Error> {
        let parsed = parse_task_definition(body).map_err(|all| {
            let first = all.first();
            Error::InvalidTaskDefinition {
                field: first.field.clone(),
                message: first.message.clone(),
                errors: all
                    .errors()
                    .iter()
                    .map(|e| FieldError { field: e.field.clone(), message: e.message.clone() })
                    .collect(),
                left_out: all.left_out(),
            }
        })?;
        Self::encoded(parsed)
    }

    /// Encodes an already parsed definition.
    pub fn encoded(parsed: ParsedTaskDefinition) -> Result<ValidTaskDef, Error> {
        let encoding = |e: serde_json::Error| Error::Internal(format!("encoding a task definition: {e}"));
        let mut fields = match serde_json::to_value(&parsed.definition).map_err(encoding)? {
            serde_json::Value::Object(m) => m,
            _ => return Err(Error::Internal("a task definition did not encode as an object".into())),
        };
        for set_at_registration in ["family", "revision", "registeredAtMs"] {
            fields.remove(set_at_registration);
        }
        let object = serde_json::to_vec(&fields).map_err(encoding)?;
        let rest_json = object[1..object.len() - 1].to_vec();
        Ok(ValidTaskDef { parsed, rest_json })
    }

    /// The definition being registered.
    pub fn definition(&self) -> &mpsfleet_types::TaskDefinition {
        &self.parsed.definition
    }

    /// The stored record, as `TaskDefinition` encodes it, from the encoded fields.
    pub(super) fn record(
        &self,
        family: &Family,
        revision: u32,
        registered_at_ms: u64,
    ) -> Result<Vec<u8>, Error> {
        let family = serde_json::to_string(family)
            .map_err(|e| Error::Internal(format!("encoding a task definition: {e}")))?;
        let mut out = Vec::with_capacity(self.rest_json.len() + family.len() + 96);
        out.extend_from_slice(b"{\"family\":");
        out.extend_from_slice(family.as_bytes());
        out.extend_from_slice(
            format!(",\"revision\":{revision},\"registeredAtMs\":{registered_at_ms}").as_bytes(),
        );
        if !self.rest_json.is_empty() {
            out.push(b',');
            out.extend_from_slice(&self.rest_json);
        }
        out.push(b'}');
        Ok(out)
    }
}

// ---- hosts ------------------------------------------------------------------------------

/// A host registration that passed the checks that need no state, with its id and secrets.
pub struct HostRequest {
    pub(super) reg: HostRegistration,
    pub(super) id: HostId,
    pub(super) credential: String,
    pub(super) credential_sha256: String,
}

impl HostRequest {
    /// Checks `reg` on its own (names, GPU counts and figures, a GPU listed twice) and mints
    /// the host's id, credential and agent token: done before the cluster lock is taken.
    pub fn new(reg: HostRegistration) -> Result<HostRequest, Error> {
        if reg.hostname.is_empty() || reg.hostname.len() > MAX_HOSTNAME_BYTES {
            return Err(Error::invalid(
                "hostname",
                format!("must be 1 to {MAX_HOSTNAME_BYTES} characters, got {}", reg.hostname.len()),
            ));
        }
        if let Some(v) = &reg.runtime_version {
            if v.is_empty() || v.len() > MAX_RUNTIME_VERSION_BYTES || v.chars().any(|c| c.is_control()) {
                return Err(Error::invalid(
                    "runtimeVersion",
                    format!(
                        "must be 1 to {MAX_RUNTIME_VERSION_BYTES} printable characters, got {} bytes",
                        v.len()
                    ),
                ));
            }
        }
        let p = &reg.platform;
        for (field, name) in [
            ("platform.cpuArchitecture", &p.cpu_architecture),
            ("platform.availabilityZone", &p.availability_zone),
        ] {
            if !name.is_empty() && !mpsfleet_types::HostPlatform::valid_name(name) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "must be 1 to {} lowercase letters, digits, '-' or '_'",
                        mpsfleet_types::HostPlatform::MAX_NAME_BYTES
                    ),
                ));
            }
        }
        for (kind, names) in [("volume", &reg.plugins.volume), ("log", &reg.plugins.log)] {
            if names.len() > MAX_PLUGINS {
                return Err(Error::invalid(
                    format!("plugins.{kind}"),
                    format!("at most {MAX_PLUGINS} drivers, got {}", names.len()),
                ));
            }
            for (i, n) in names.iter().enumerate() {
                if n.is_empty() || n.len() > MAX_PLUGIN_NAME_BYTES || n.chars().any(|c| c.is_control()) {
                    return Err(Error::invalid(
                        format!("plugins.{kind}[{i}]"),
                        format!(
                            "must be 1 to {MAX_PLUGIN_NAME_BYTES} printable characters, got {} bytes",
                            n.len()
                        ),
                    ));
                }
            }
        }
        if reg.gpus.len() > MAX_HOST_GPUS {
            return Err(Error::invalid(
                "gpus",
                format!("at most {MAX_HOST_GPUS} GPUs per host, got {}", reg.gpus.len()),
            ));
        }
        let mut seen = HashSet::with_capacity(reg.gpus.len());
        for (i, g) in reg.gpus.iter().enumerate() {
            if !seen.insert(&g.uuid) {
                return Err(Error::invalid(format!("gpus[{i}].uuid"), format!("duplicate GPU {}", g.uuid)));
            }
            if g.memory_mib == 0 || g.memory_mib > MAX_GPU_MEMORY_MIB {
                return Err(Error::invalid(
                    format!("gpus[{i}].memoryMib"),
                    format!("must be from 1 to {MAX_GPU_MEMORY_MIB} MiB, got {}", g.memory_mib),
                ));
            }
            if g.max_mps_clients > MAX_GPU_MPS_CLIENTS {
                return Err(Error::invalid(
                    format!("gpus[{i}].maxMpsClients"),
                    format!("must be at most {MAX_GPU_MPS_CLIENTS}, got {}", g.max_mps_clients),
                ));
            }
            for (field, text) in [("model", &g.model), ("computeCapability", &g.compute_capability)] {
                if text.len() > MAX_GPU_TEXT_BYTES {
                    return Err(Error::invalid(
                        format!("gpus[{i}].{field}"),
                        format!("must be at most {MAX_GPU_TEXT_BYTES} bytes, got {} bytes", text.len()),
                    ));
                }
            }
        }
        let id = HostId::new(format!("h-{:012x}", auth::random_u64()? >> 16))
            .map_err(|e| Error::Internal(e.to_string()))?;
        let credential = auth::new_token("mpsf_host_")?;
        let credential_sha256 = auth::digest(&credential);
        Ok(HostRequest { reg, id, credential, credential_sha256 })
    }
}

/// The hosts of one group commit, in order, and what they claim.
#[derive(Default)]
pub(super) struct HostBatch {
    pub(super) members: Vec<Member>,
    pub(super) gpus: HashSet<GpuUuid>,
    pub(super) ids: HashSet<HostId>,
    pub(super) gpu_count: usize,
}

pub(super) struct Member {
    pub(super) host: Host,
    pub(super) op: Op,
    pub(super) answer: RegisterHostResponse,
    /// Where the answer goes in the caller's list.
    pub(super) slot: usize,
}

impl HostBatch {
    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// GPUs of the hosts in the batch.
    pub(super) fn gpu_count(&self) -> usize {
        self.gpu_count
    }

    pub(super) fn claims_gpu(&self, uuid: &GpuUuid) -> bool {
        self.gpus.contains(uuid)
    }

    pub(super) fn claims_id(&self, id: &HostId) -> bool {
        self.ids.contains(id)
    }

    pub(super) fn claims_hostname(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.host.hostname == name)
    }

    /// Adds a host that passed its checks: its record is encoded here, and it claims its id and
    /// GPUs for the later members.
    pub(super) fn add(&mut self, host: Host, answer: RegisterHostResponse, slot: usize) -> Result<(), Error> {
        let op = Op::put_json(HOST, host.id.as_str(), &host, Precondition::Absent)?;
        self.gpus.extend(host.gpus.iter().map(|g| g.uuid.clone()));
        self.ids.insert(host.id.clone());
        self.gpu_count += host.gpus.len();
        self.members.push(Member { host, op, answer, slot });
        Ok(())
    }
}

// ---- group commit -----------------------------------------------------------------------

/// One registration waiting for its group commit.
pub struct Waiting {
    /// SHA-256 of the caller's bearer token: it is authenticated under the lock.
    pub token_sha256: String,
    pub request: HostRequest,
    pub answer: tokio::sync::oneshot::Sender<Result<RegisterHostResponse, Error>>,
}

/// Registrations collected while a group commit is in progress. The first to arrive when none
/// is in progress is told to start one ([`RegistrationQueue::push`] returns true); that commit
/// takes whatever waits when it starts, so registrations arriving during one commit share the
/// next.
#[derive(Default)]
pub struct RegistrationQueue {
    pub(super) state: std::sync::Mutex<QueueState>,
}

#[derive(Default)]
pub(super) struct QueueState {
    pub(super) waiting: Vec<Waiting>,
    pub(super) committing: bool,
}

impl RegistrationQueue {
    /// Queues `w`; true when the caller is to run the commits ([`RegistrationQueue::take`]
    /// until it returns nothing).
    pub fn push(&self, w: Waiting) -> bool {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.waiting.push(w);
        !std::mem::replace(&mut s.committing, true)
    }

    /// The next group (at most [`MAX_GROUP`]), or nothing, and then the commits have stopped:
    /// the next push starts them again.
    pub fn take(&self) -> Vec<Waiting> {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.waiting.is_empty() {
            s.committing = false;
            return Vec::new();
        }
        let n = s.waiting.len().min(MAX_GROUP);
        s.waiting.drain(..n).collect()
    }
}

/// The change that applies an incident whose replacement host commits with it: its token is
/// spent. The digest stays indexed while the incident is kept, so that a reuse is refused as
/// such ("already used") rather than as an unknown token.
pub(super) fn spend_replacement_token(incident: &Incident) -> Change {
    if let Some(b) = &incident.replacement {
        tracing::info!(incident.id = %incident.id, host.id = ?b.host_id, "replacement host registered with its token");
    }
    Change::Incident(Box::new(incident.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::*;
    use mpsfleet_types::TaskDefinition;
    use std::sync::Arc;

    /// The stored record is the whole definition: its network mode, volumes, task size, tags and
    /// kept ECS fields come back after a restart, not only its containers.
    #[test]
    fn task_definition_record_decodes_as_the_definition() {
        let body = br#"{"family": "web", "networkMode": "awsvpc", "cpu": "1024", "memory": "2048",
            "volumes": [{"name": "scratch"}], "tags": [{"key": "team", "value": "ml"}],
            "taskRoleArn": "arn:aws:iam::123456789012:role/r",
            "containerDefinitions": [{"name": "main", "command": ["run", "\"q\""],
            "environment": [{"name": "A", "value": "\u00e9"}],
            "mountPoints": [{"sourceVolume": "scratch", "containerPath": "/scratch"}],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 512}}}]}]}"#;
        let v = ValidTaskDef::parse(body).unwrap();
        let mut want = v.parsed.definition.clone();
        want.revision = 7;
        want.registered_at_ms = 1_700_000_000_123;
        let record = v.record(&want.family, 7, 1_700_000_000_123).unwrap();
        let got: TaskDefinition = serde_json::from_slice(&record).unwrap();
        assert_eq!(got, want, "the record decodes as the definition");
        assert_eq!(got.network_mode, Some(mpsfleet_types::NetworkMode::Awsvpc));
        assert_eq!((got.cpu.as_deref(), got.memory.as_deref()), (Some("1024"), Some("2048")));
        assert_eq!(got.volumes.len(), 1);
        assert_eq!(got.tags[0].key, "team");
        assert!(got.kept_fields.contains_key("taskRoleArn"));
    }

    fn registration(pool: &str, name: &str, gpus: &[&str]) -> HostRegistration {
        let gpus: Vec<_> = gpus
            .iter()
            .enumerate()
            .map(|(i, u)| serde_json::json!({"uuid": u, "index": i, "model": "H200", "memoryMib": 143_771}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "pool": pool, "hostname": name, "gpus": gpus, "mpsAvailable": true, "emulated": true
        }))
        .unwrap()
    }

    fn cluster() -> (Cluster, Arc<mpsfleet_store::MemoryStore>) {
        let clock = Arc::new(mpsfleet_core::clock::ManualClock::new(1_000_000));
        let store = Arc::new(mpsfleet_store::MemoryStore::new());
        let mut c = Cluster::load(store.clone(), clock, |_| Ok(())).unwrap();
        c.create_pool(mpsfleet_types::CreatePool { name: "p".into(), ..Default::default() }).unwrap();
        (c, store)
    }

    /// One commit for the group; a member that fails its checks (a GPU an earlier member or a
    /// registered host has, an unknown pool) gets its error and the others are registered.
    #[test]
    fn a_group_commits_once_and_refuses_only_its_bad_members() {
        use mpsfleet_store::Store;
        let (mut c, store) = cluster();
        c.register_host(registration("p", "old", &["GPU-old"])).unwrap();
        let before = store.revision().unwrap();
        let requests = [
            registration("p", "a", &["GPU-a0", "GPU-a1"]),
            registration("p", "b", &["GPU-b0", "GPU-a1"]),
            registration("nope", "c", &["GPU-c0"]),
            registration("p", "d", &["GPU-old"]),
            registration("p", "e", &["GPU-b0"]),
        ];
        let requests =
            requests.into_iter().map(|r| (Principal::Joiner, HostRequest::new(r).unwrap())).collect();
        let out = c.register_hosts(requests);
        assert_eq!(store.revision().unwrap(), before + 1, "one commit for the whole group");
        let code = |r: &Result<RegisterHostResponse, Error>| match r {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        let codes: Vec<_> = out.iter().map(code).collect();
        assert_eq!(codes, ["ok", "AlreadyExists", "InvalidParameter", "AlreadyExists", "ok"]);
        assert!(out[1].as_ref().unwrap_err().to_string().contains("GPU-a1"), "{:?}", out[1]);
        assert!(out[3].as_ref().unwrap_err().to_string().contains("GPU-old"), "{:?}", out[3]);
        // "e" may have GPU-b0: "b", which listed it, was refused.
        let names: Vec<_> = c.read().hosts(None).into_iter().map(|h| h.hostname).collect();
        assert_eq!(names, ["old", "a", "e"]);
        // Committed and indexed: the records are in the store, and the credentials work.
        assert_eq!(store.list(HOST).unwrap().len(), 3);
        for r in [&out[0], &out[4]] {
            let r = r.as_ref().unwrap();
            assert_eq!(c.authenticate(&r.credential).unwrap(), Principal::Host(r.host_id.clone()));
        }
        // Registration order is kept across a restart.
        let reloaded =
            Cluster::load(store.clone(), Arc::new(mpsfleet_core::clock::ManualClock::new(2)), |_| Ok(()))
                .unwrap();
        let names: Vec<_> = reloaded.read().hosts(None).into_iter().map(|h| h.hostname).collect();
        assert_eq!(names, ["old", "a", "e"]);
        // And the GPU index is rebuilt with it.
        let mut reloaded = reloaded;
        let again = reloaded.register_host(registration("p", "f", &["GPU-a0"])).unwrap_err();
        assert_eq!(again.code(), "AlreadyExists");
    }

    /// The checks made before the lock, each naming its field and limit.
    #[test]
    fn a_registration_is_checked_before_the_lock_with_field_and_limit() {
        let check = |patch: serde_json::Value, field: &str, message: &str| {
            let mut v = serde_json::to_value(registration("p", "h", &["GPU-0", "GPU-1"])).unwrap();
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            let reg: HostRegistration = serde_json::from_value(v).unwrap();
            match HostRequest::new(reg) {
                Err(Error::InvalidParameter { field: f, message: m }) => {
                    assert_eq!(f, field);
                    assert!(m.contains(message), "{m:?} lacks {message:?}");
                }
                Err(other) => panic!("{field}: unexpected {other}"),
                Ok(_) => panic!("{field}: accepted"),
            }
        };
        let gpu = |patch: serde_json::Value| {
            let mut g = serde_json::json!({"uuid": "GPU-0", "index": 0, "model": "H200", "memoryMib": 1});
            for (k, x) in patch.as_object().unwrap() {
                g[k] = x.clone();
            }
            serde_json::json!({"gpus": [g]})
        };
        check(serde_json::json!({"hostname": ""}), "hostname", "must be 1 to 255 characters, got 0");
        check(serde_json::json!({"hostname": "h".repeat(256)}), "hostname", "got 256");
        let many: Vec<_> = (0..65)
            .map(
                |i| serde_json::json!({"uuid": format!("GPU-{i}"), "index": i, "model": "m", "memoryMib": 1}),
            )
            .collect();
        check(serde_json::json!({"gpus": many}), "gpus", "at most 64 GPUs per host, got 65");
        let same = serde_json::json!({"uuid": "GPU-0", "index": 0, "model": "m", "memoryMib": 1});
        check(serde_json::json!({"gpus": [same.clone(), same]}), "gpus[1].uuid", "duplicate GPU GPU-0");
        check(gpu(serde_json::json!({"memoryMib": 0})), "gpus[0].memoryMib", "from 1 to 16777216 MiB, got 0");
        check(
            gpu(serde_json::json!({"maxMpsClients": 1025})),
            "gpus[0].maxMpsClients",
            "at most 1024, got 1025",
        );
        check(
            gpu(serde_json::json!({"model": "m".repeat(256)})),
            "gpus[0].model",
            "at most 255 bytes, got 256",
        );
        check(
            gpu(serde_json::json!({"computeCapability": "9".repeat(256)})),
            "gpus[0].computeCapability",
            "at most 255 bytes, got 256",
        );
        // At the limits it passes, with a fresh id and credential each time.
        let at = || {
            let mut v = serde_json::to_value(registration("p", &"h".repeat(255), &[])).unwrap();
            v["gpus"] = serde_json::json!([{"uuid": "GPU-0", "index": 0, "model": "m".repeat(255),
                "memoryMib": 16_777_216, "maxMpsClients": 1024}]);
            HostRequest::new(serde_json::from_value(v).unwrap()).unwrap()
        };
        let (a, b) = (at(), at());
        assert_ne!(a.id, b.id);
        assert_ne!(a.credential, b.credential);
        assert_eq!(a.credential_sha256, auth::digest(&a.credential));
    }

    #[test]
    fn queue_starts_one_committer_and_stops_when_empty() {
        let q = RegistrationQueue::default();
        let w = || {
            let reg: HostRegistration = serde_json::from_value(serde_json::json!({
                "pool": "p", "hostname": "h", "gpus": [], "mpsAvailable": false, "emulated": true
            }))
            .unwrap();
            let (tx, _rx) = tokio::sync::oneshot::channel();
            Waiting { token_sha256: String::new(), request: HostRequest::new(reg).unwrap(), answer: tx }
        };
        assert!(q.push(w()), "the first starts the commits");
        assert!(!q.push(w()), "one is running");
        assert_eq!(q.take().len(), 2);
        assert!(!q.push(w()), "still running until a take finds nothing");
        assert_eq!(q.take().len(), 1);
        assert!(q.take().is_empty());
        assert!(q.push(w()), "stopped: the next push starts them again");
    }
}
