//! Images: whether one is present, pulling it by ECS's pull behaviours (with registry
//! credentials, and a record of when each was pulled and last used), and removing the unused
//! ones the agent pulled.

use super::*;

impl DockerRuntime {
    pub(super) fn image_present(&self, reference: &str) -> Result<bool, DockerError> {
        match self.block("inspect image", INSPECT_TIMEOUT, self.inner.docker.inspect_image(reference)) {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Pulls `reference` (with the registry credentials of `repositoryCredentials`, when
    /// given); Err carries the registry's message.
    pub(super) fn pull(&self, reference: &str, auth: Option<&RegistryAuth>) -> Result<(), DockerError> {
        let docker = self.inner.docker.clone();
        let options = CreateImageOptions { from_image: Some(reference.to_string()), ..Default::default() };
        let credentials = auth.map(|a| bollard::auth::DockerCredentials {
            username: Some(a.username.clone()),
            password: Some(a.password.clone()),
            serveraddress: Some(registry_of(reference)),
            ..Default::default()
        });
        let limit = self.inner.cfg.pull_timeout;
        let socket = self.inner.cfg.socket.clone();
        self.run(async move {
            let pull = async {
                let mut stream = docker.create_image(Some(options), None, credentials);
                while let Some(item) = stream.next().await {
                    let info = item.map_err(|e| map_err(&socket, "pull", e))?;
                    if let Some(detail) = info.error_detail {
                        let message = detail.message.unwrap_or_else(|| "pull failed".into());
                        return Err(DockerError::Other { what: "pull".into(), message });
                    }
                }
                Ok(())
            };
            match tokio::time::timeout(limit, pull).await {
                Ok(r) => r,
                Err(_) => Err(DockerError::Timeout { what: format!("pull of {reference}"), after: limit }),
            }
        })
    }

    pub(super) fn update_records(&self, f: impl FnOnce(&mut ImageRecords)) {
        let _lock = self.inner.records.lock().unwrap_or_else(|p| p.into_inner());
        let dir = &self.inner.cfg.data_dir;
        let mut r = ImageRecords::load(dir);
        f(&mut r);
        if let Err(e) = r.save(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write the docker image records");
        }
    }

    /// Makes sure the image is there per the pull behaviour; notes what was done differently.
    /// Returns how long a pull took (ms), when it pulled (or tried to, and used the cache).
    pub(super) fn ensure_image(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        notes: &mut Vec<String>,
    ) -> Result<Option<u64>, (StopCode, String)> {
        let cannot_pull = |e: DockerError| {
            (StopCode::CannotPullContainerError, format!("CannotPullContainerError: {}", e.message()))
        };
        let pulled_before =
            ImageRecords::load(&self.inner.cfg.data_dir).images.get(reference).is_some_and(|r| r.pulled);
        let need_pull = match self.inner.cfg.pull {
            PullBehavior::Default | PullBehavior::Always => true,
            PullBehavior::Once => !pulled_before || !self.image_present(reference).unwrap_or(false),
            PullBehavior::PreferCached => !self.image_present(reference).unwrap_or(false),
        };
        if !need_pull {
            return Ok(None);
        }
        let watch = mpsfleet_core::clock::Stopwatch::start();
        match self.pull(reference, auth) {
            Ok(()) => {
                self.update_records(|r| r.images.entry(reference.to_string()).or_default().pulled = true);
                Ok(Some(watch.elapsed_ms()))
            }
            Err(e) if self.inner.cfg.pull == PullBehavior::Default => match self.image_present(reference) {
                Ok(true) => {
                    notes.push(format!(
                        "pull of {reference} failed, the cached image was used: {}",
                        e.message()
                    ));
                    Ok(Some(watch.elapsed_ms()))
                }
                _ => Err(cannot_pull(e)),
            },
            Err(e) => Err(cannot_pull(e)),
        }
    }

    /// Removes up to `policy.max_per_cycle` images this runtime launched that no container
    /// uses and no launch used for `policy.min_age` (see [`ImagePolicy`]); returns their
    /// references.
    pub fn remove_unused_images(
        &self,
        policy: &ImagePolicy,
        now_ms: u64,
    ) -> Result<Vec<String>, DockerError> {
        let records = {
            let _lock = self.inner.records.lock().unwrap_or_else(|p| p.into_inner());
            ImageRecords::load(&self.inner.cfg.data_dir)
        };
        let containers = self.block(
            "list containers",
            LIST_TIMEOUT,
            self.inner
                .docker
                .list_containers(Some(ListContainersOptions { all: true, ..Default::default() })),
        )?;
        let mut used_ids: HashSet<String> = HashSet::new();
        let mut used_refs: HashSet<String> = HashSet::new();
        for c in containers {
            used_ids.extend(c.image_id);
            used_refs.extend(c.image.map(|i| normalize_reference(&i)));
        }
        let images = self.block(
            "list images",
            LIST_TIMEOUT,
            self.inner.docker.list_images(Some(ListImagesOptions { all: false, ..Default::default() })),
        )?;
        let id_of: HashMap<String, String> =
            images.iter().flat_map(|i| i.repo_tags.iter().map(move |t| (t.clone(), i.id.clone()))).collect();
        let min_age = policy.min_age.as_millis() as u64;
        let mut candidates: Vec<(u64, String)> = records
            .images
            .iter()
            .filter(|(reference, rec)| {
                now_ms.saturating_sub(rec.last_used_ms) > min_age
                    && !used_refs.contains(*reference)
                    && id_of.get(*reference).is_some_and(|id| !used_ids.contains(id))
            })
            .map(|(reference, rec)| (rec.last_used_ms, reference.clone()))
            .collect();
        candidates.sort();
        let mut removed = Vec::new();
        for (_, reference) in candidates.into_iter().take(policy.max_per_cycle) {
            match self.block(
                "remove image",
                REMOVE_TIMEOUT,
                self.inner.docker.remove_image(&reference, None::<RemoveImageOptions>, None),
            ) {
                Ok(_) => removed.push(reference),
                Err(e) if e.status() == Some(404) => removed.push(reference),
                // In use after all (a container created since the listing), or shared: next cycle.
                Err(e) => tracing::info!(image = %reference, error = %e, "image not removed"),
            }
        }
        if !removed.is_empty() {
            self.update_records(|r| {
                for reference in &removed {
                    r.images.remove(reference);
                }
            });
        }
        Ok(removed)
    }
}

/// The registry host of an image reference, as Docker names it for credentials.
pub(super) fn registry_of(reference: &str) -> String {
    match reference.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first.to_string(),
        _ => "https://index.docker.io/v1/".to_string(),
    }
}

/// `repository[:tag]` with `:latest` added when there is neither a tag nor a digest.
pub fn normalize_reference(image: &str) -> String {
    if image.contains('@') {
        return image.to_string();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}

/// What the runtime's records in `data_dir` say of `reference`: (a pull of it succeeded,
/// last used by a launch, ms since the epoch).
pub fn image_record(data_dir: &std::path::Path, reference: &str) -> Option<(bool, u64)> {
    ImageRecords::load(data_dir).images.get(reference).map(|r: &ImageRecord| (r.pulled, r.last_used_ms))
}
