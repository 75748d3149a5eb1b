//! `task exec` in a container on Docker Engine: Docker's exec API, attached, with the
//! container's own user, environment and working directory (see `crate::exec`).

use super::names::container_name;
use super::DockerRuntime;
use crate::exec::{Input, Running, OUTPUT_QUEUE};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::InspectContainerOptions;
use futures_util::StreamExt;
use mpsfleet_types::exec::{ExecSpec, Frame, MAX_FRAME};
use mpsfleet_types::TaskId;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

impl DockerRuntime {
    /// Starts `spec`'s command in the container `container` of task `id`: None when Docker has
    /// no such container (the task's container is a process, or gone), Err when it cannot run
    /// there (the container is not running, Engine refused).
    pub(crate) async fn exec_session(
        &self,
        id: &TaskId,
        container: &str,
        spec: &ExecSpec,
    ) -> Result<Option<Running>, String> {
        let name = container_name(&self.inner.cfg.host_id, &id.to_string(), container);
        let docker = self.inner.docker.clone();
        let who = format!("container {container:?} of task {id}");
        let inspected = match docker.inspect_container(&name, None::<InspectContainerOptions>).await {
            Ok(i) => i,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(format!("{who}: Docker Engine: {e}")),
        };
        if !inspected.state.as_ref().and_then(|s| s.running).unwrap_or(false) {
            return Err(format!("{who} is not running"));
        }
        let created = docker
            .create_exec(
                &name,
                CreateExecOptions {
                    attach_stdin: Some(spec.interactive),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(spec.tty),
                    cmd: Some(spec.command.clone()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("{who}: Docker Engine refused the exec: {e}"))?;
        let exec_id = created.id;
        let started = docker
            .start_exec(
                &exec_id,
                Some(StartExecOptions { detach: false, tty: spec.tty, output_capacity: None }),
            )
            .await
            .map_err(|e| format!("{who}: Docker Engine did not start the exec: {e}"))?;
        let StartExecResults::Attached { mut output, input: mut stdin } = started else {
            return Err(format!("{who}: Docker Engine started the exec detached"));
        };
        if let (true, Some(cols), Some(rows)) = (spec.tty, spec.cols, spec.rows) {
            let _ = docker.resize_exec(&exec_id, ResizeExecOptions { width: cols, height: rows }).await;
        }
        let (tx, out_rx) = mpsc::channel(OUTPUT_QUEUE);
        let (input, mut in_rx) = mpsc::channel::<Input>(OUTPUT_QUEUE);
        let (d, e) = (docker.clone(), exec_id.clone());
        let handle = self.inner.handle.clone();
        handle.spawn(async move {
            while let Some(chunk) = output.next().await {
                let (bytes, err) = match chunk {
                    Ok(LogOutput::StdErr { message }) => (message, true),
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => (message, false),
                    Ok(LogOutput::StdIn { .. }) => continue,
                    Err(_) => break,
                };
                for part in bytes.chunks(MAX_FRAME) {
                    let f = if err { Frame::Stderr(part.to_vec()) } else { Frame::Stdout(part.to_vec()) };
                    if tx.send(f).await.is_err() {
                        return;
                    }
                }
            }
            // The stream ends as the command does; Engine records the code a moment later.
            for _ in 0..50 {
                match d.inspect_exec(&e).await {
                    Ok(i) if i.running != Some(true) => {
                        let code = i.exit_code.map_or(255, |c| i32::try_from(c).unwrap_or(255));
                        let _ = tx.send(Frame::Exit(code)).await;
                        return;
                    }
                    Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                    Err(err) => {
                        let _ = tx.send(Frame::Ended(format!("Docker Engine lost the exec: {err}"))).await;
                        return;
                    }
                }
            }
            let _ = tx.send(Frame::Ended("the command's output ended, but it did not exit".into())).await;
        });
        let (d, e, tty) = (docker.clone(), exec_id.clone(), spec.tty);
        handle.spawn(async move {
            while let Some(i) = in_rx.recv().await {
                match i {
                    Input::Stdin(b) => {
                        if stdin.write_all(&b).await.and(stdin.flush().await).is_err() {
                            break;
                        }
                    }
                    // A terminal has no end of input but the EOF character.
                    Input::StdinEnd if tty => {
                        let _ = stdin.write_all(&[4]).await;
                        let _ = stdin.flush().await;
                    }
                    Input::StdinEnd => {
                        let _ = stdin.shutdown().await;
                    }
                    Input::Resize { cols, rows } => {
                        let _ = d.resize_exec(&e, ResizeExecOptions { width: cols, height: rows }).await;
                    }
                }
            }
        });
        let kill = Box::new(move || {
            handle.spawn(async move {
                // Engine has no way to stop an exec: its process is killed by pid, while Engine
                // says it still runs (an ended exec's pid may be another process's by now).
                let running = docker.inspect_exec(&exec_id).await.ok().filter(|i| i.running == Some(true));
                if let Some(pid) = running.and_then(|i| i.pid) {
                    if let Ok(pid) = i32::try_from(pid) {
                        if pid > 1 {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                    }
                }
            });
        });
        Ok(Some(Running { input, output: out_rx, kill }))
    }
}
