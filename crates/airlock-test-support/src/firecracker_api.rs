//! A scripted Firecracker on a unix socket, for the firecracker driver's
//! tests (no Firecracker binary runs here, and this machine's KVM boots no
//! stock guest).
//!
//! [`ApiServer`] answers Firecracker's API as its published definition
//! (`src/firecracker/swagger/firecracker.yaml`) says, written from that
//! definition and not from the driver's types: each request's method and
//! path, its body's fields (required ones present, no unknown one, each of
//! its documented JSON type and range) and its place in the sequence
//! (pre-boot configuration only before `InstanceStart`, which needs a boot
//! source; `SendCtrlAltDel` only after it). A request that breaks any of
//! this is answered `400 {"fault_message": …}`, as Firecracker does, and
//! kept as a violation. Everything else is `204`, except what the
//! [`Script`] says: one step refused with a given status and message, or
//! one step never answered.
//!
//! [`FakeJailer`] stands in for the jailer: a script that says its command
//! line on a FIFO and then waits to be killed, so a test learns the jail's
//! path when the driver started it, with no polling.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// What the server does besides answering as documented.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// Refuse this request (`PUT /machine-config`, `PUT /actions
    /// InstanceStart`, …) with this status and `fault_message`.
    pub refuse: Option<(String, u16, String)>,
    /// Never answer this request (the connection stays open).
    pub hang: Option<String>,
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `PUT /drives/root`, `PUT /actions InstanceStart`, …
    pub request: String,
    pub body: Value,
    pub status: u16,
}

#[derive(Debug, Default)]
struct State {
    seen: Vec<Seen>,
    violations: Vec<String>,
    boot_source: bool,
    started: bool,
}

/// The server; stops when dropped.
pub struct ApiServer {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiServer {
    /// Serves `listener` as `script` says.
    pub fn start(listener: tokio::net::UnixListener, script: Script) -> ApiServer {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        answer(req, state.clone(), script.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        ApiServer { state, task }
    }

    /// The requests received, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state
            .lock()
            .map(|s| s.seen.clone())
            .unwrap_or_default()
    }

    /// Just the requests' names, in order.
    pub fn requests(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.request).collect()
    }

    /// What broke the definition.
    pub fn violations(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.violations.clone())
            .unwrap_or_default()
    }
}

type Answer = hyper::Response<Full<Bytes>>;

fn reply(status: u16, fault: Option<&str>) -> Answer {
    let body = fault.map_or_else(Bytes::new, |m| {
        Bytes::from(json!({ "fault_message": m }).to_string())
    });
    let mut r = hyper::Response::new(Full::new(body));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_REQUEST);
    if fault.is_some() {
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
    }
    r
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
    script: Script,
) -> Result<Answer, std::convert::Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let json_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut request = format!("{method} {path}");
    if path == "/actions"
        && let Some(a) = body.get("action_type").and_then(Value::as_str)
    {
        request = format!("{request} {a}");
    }
    if script.hang.as_deref() == Some(request.as_str()) {
        std::future::pending::<()>().await;
    }
    let judged = {
        let Ok(mut s) = state.lock() else {
            return Ok(reply(500, Some("the scripted server's state is poisoned")));
        };
        let judged = if !json_type {
            Err(format!("{request}: Content-Type is not application/json"))
        } else {
            judge(&mut s, &method, &path, &body).map_err(|e| format!("{request}: {e}"))
        };
        if let Err(v) = &judged {
            s.violations.push(v.clone());
        } else if let Some((at, status, message)) = &script.refuse
            && *at == request
        {
            let status = *status;
            s.seen.push(Seen {
                request: request.clone(),
                body: body.clone(),
                status,
            });
            return Ok(reply(status, Some(message)));
        }
        let status = if judged.is_ok() { 204 } else { 400 };
        s.seen.push(Seen {
            request,
            body,
            status,
        });
        judged
    };
    Ok(match judged {
        Ok(()) => reply(204, None),
        Err(v) => reply(400, Some(&v)),
    })
}

/// Whether a request follows the definition, and the sequence it is in;
/// one that does moves the state along.
fn judge(s: &mut State, method: &str, path: &str, body: &Value) -> Result<(), String> {
    if method != "PUT" {
        return Err(format!(
            "{method} is not an operation the driver needs on {path}"
        ));
    }
    shape(path, body)?;
    if path == "/actions" {
        return match body["action_type"].as_str() {
            Some("InstanceStart") if s.started => Err("the microVM is already running".into()),
            Some("InstanceStart") if !s.boot_source => {
                Err("Cannot start microvm without kernel configuration.".into())
            }
            Some("InstanceStart") => {
                s.started = true;
                Ok(())
            }
            Some("SendCtrlAltDel") if !s.started => {
                Err("The requested operation is not supported before starting the microVM.".into())
            }
            _ => Ok(()),
        };
    }
    // Every other operation the driver uses is pre-boot only.
    if s.started {
        return Err("The requested operation is not supported after starting the microVM.".into());
    }
    if path == "/boot-source" {
        s.boot_source = true;
    }
    Ok(())
}

/// Whether `body` is the definition's for `path` (`BootSource`,
/// `MachineConfiguration`, `Vsock`, `InstanceActionInfo`, `Drive`).
fn shape(path: &str, body: &Value) -> Result<(), String> {
    match path {
        "/boot-source" => fields(
            body,
            &[("kernel_image_path", Ty::Str)],
            &[("boot_args", Ty::Str), ("initrd_path", Ty::Str)],
        ),
        "/machine-config" => {
            fields(
                body,
                &[("mem_size_mib", Ty::Int), ("vcpu_count", Ty::Int)],
                &[
                    ("smt", Ty::Bool),
                    ("track_dirty_pages", Ty::Bool),
                    ("cpu_template", Ty::Str),
                    ("huge_pages", Ty::OneOf(&["None", "Transparent", "2M"])),
                ],
            )?;
            let vcpus = body["vcpu_count"].as_u64().unwrap_or(0);
            if !(1..=32).contains(&vcpus) {
                return Err(format!("vcpu_count {vcpus} is not in [1, 32]"));
            }
            if body["smt"] == Value::Bool(true) && vcpus != 1 && vcpus % 2 == 1 {
                return Err("with SMT, vcpu_count is 1 or even".into());
            }
            if body["mem_size_mib"].as_u64().unwrap_or(0) == 0 {
                return Err("mem_size_mib is 0".into());
            }
            Ok(())
        }
        "/vsock" => {
            fields(
                body,
                &[("guest_cid", Ty::Int), ("uds_path", Ty::Str)],
                &[("vsock_id", Ty::Str)],
            )?;
            if body["guest_cid"].as_u64().unwrap_or(0) < 3 {
                return Err("guest_cid is under 3".into());
            }
            Ok(())
        }
        "/actions" => fields(
            body,
            &[(
                "action_type",
                Ty::OneOf(&["FlushMetrics", "InstanceStart", "SendCtrlAltDel"]),
            )],
            &[],
        ),
        p if p.starts_with("/drives/") => {
            let id = &p["/drives/".len()..];
            // A virtio-block drive: path_on_host and is_read_only required.
            fields(
                body,
                &[
                    ("drive_id", Ty::Str),
                    ("is_root_device", Ty::Bool),
                    ("path_on_host", Ty::Str),
                    ("is_read_only", Ty::Bool),
                ],
                &[
                    ("partuuid", Ty::Str),
                    ("cache_type", Ty::OneOf(&["Unsafe", "Writeback"])),
                    ("rate_limiter", Ty::Object),
                    ("io_engine", Ty::OneOf(&["Sync", "Async"])),
                ],
            )?;
            if id.is_empty() || body["drive_id"].as_str() != Some(id) {
                return Err(format!(
                    "drive_id {} is not the path's {id:?}",
                    body["drive_id"]
                ));
            }
            Ok(())
        }
        other => Err(format!("Invalid request method and/or path: PUT {other}")),
    }
}

/// A field's documented type.
#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Object,
    OneOf(&'static [&'static str]),
}

/// `body` is an object with every `required` field, no field outside
/// `required` and `optional`, each of its type.
fn fields(body: &Value, required: &[(&str, Ty)], optional: &[(&str, Ty)]) -> Result<(), String> {
    let Some(obj) = body.as_object() else {
        return Err(format!("the body is not a JSON object: {body}"));
    };
    for (name, _) in required {
        if !obj.contains_key(*name) {
            return Err(format!("missing field `{name}`"));
        }
    }
    for (name, value) in obj {
        let Some((_, ty)) = required.iter().chain(optional).find(|(n, _)| n == name) else {
            return Err(format!("unknown field `{name}`"));
        };
        let ok = match ty {
            Ty::Str => value.is_string(),
            Ty::Int => value.is_u64(),
            Ty::Bool => value.is_boolean(),
            Ty::Object => value.is_object(),
            Ty::OneOf(names) => value.as_str().is_some_and(|v| names.contains(&v)),
        };
        if !ok {
            return Err(format!(
                "field `{name}` has the wrong type or value: {value}"
            ));
        }
    }
    Ok(())
}

/// A stand-in jailer: says its arguments (after its own path), space
/// separated, as one line on a FIFO, then sleeps until it is killed.
pub struct FakeJailer {
    pub script: PathBuf,
    fifo: PathBuf,
}

impl FakeJailer {
    /// Written in `dir`.
    pub fn new(dir: &Path) -> std::io::Result<FakeJailer> {
        let fifo = dir.join("jailer.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
        if !made.success() {
            return Err(std::io::Error::other("mkfifo failed"));
        }
        let script = dir.join("jailer");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$*\" > '{}'\nexec sleep 600\n",
                fifo.display()
            ),
        )?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(FakeJailer { script, fifo })
    }

    /// Opens the FIFO's reading end: before the driver starts the jailer.
    pub fn listen(&self) -> std::io::Result<tokio::net::unix::pipe::Receiver> {
        tokio::net::unix::pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(&self.fifo)
    }
}

/// The jailer's arguments, once it started.
pub async fn started(rx: &mut tokio::net::unix::pipe::Receiver) -> std::io::Result<Vec<String>> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while rx.read_exact(&mut b).await.is_ok() && b[0] != b'\n' {
        line.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&line)
        .split_whitespace()
        .map(String::from)
        .collect())
}

/// The jail's root a jailer command line makes (`--chroot-base-dir`,
/// the `--exec-file`'s name, `--id`).
pub fn jail_root(argv: &[String]) -> Option<PathBuf> {
    let arg = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
    };
    let exec = Path::new(arg("--exec-file")?).file_name()?.to_os_string();
    Some(
        Path::new(arg("--chroot-base-dir")?)
            .join(exec)
            .join(arg("--id")?)
            .join("root"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server is as strict as the definition: what a driver could get
    /// wrong is refused (and would be a violation), not waved through.
    #[test]
    fn the_server_refuses_what_the_definition_does_not_allow() {
        let mut s = State::default();
        let boot = json!({"kernel_image_path": "/k", "boot_args": "x"});
        // Not before a boot source.
        let start = json!({"action_type": "InstanceStart"});
        assert!(judge(&mut s, "PUT", "/actions", &start).is_err());
        assert!(
            judge(
                &mut s,
                "PUT",
                "/actions",
                &json!({"action_type": "SendCtrlAltDel"})
            )
            .is_err()
        );
        assert!(judge(&mut s, "GET", "/boot-source", &boot).is_err());
        for (path, bad) in [
            ("/boot-source", json!({"boot_args": "x"})),
            (
                "/boot-source",
                json!({"kernel_image_path": "/k", "kernel": "/k"}),
            ),
            (
                "/machine-config",
                json!({"vcpu_count": "2", "mem_size_mib": 512}),
            ),
            (
                "/machine-config",
                json!({"vcpu_count": 33, "mem_size_mib": 512}),
            ),
            (
                "/machine-config",
                json!({"vcpu_count": 3, "mem_size_mib": 512, "smt": true}),
            ),
            ("/vsock", json!({"guest_cid": 2, "uds_path": "/v.sock"})),
            (
                "/drives/root",
                json!({"drive_id": "other", "is_root_device": false, "path_on_host": "/r", "is_read_only": true}),
            ),
            (
                "/drives/root",
                json!({"drive_id": "root", "is_root_device": false, "path_on_host": "/r"}),
            ),
            (
                "/network-interfaces/eth0",
                json!({"iface_id": "eth0", "host_dev_name": "tap0"}),
            ),
            ("/actions", json!({"action_type": "Reboot"})),
        ] {
            assert!(judge(&mut s, "PUT", path, &bad).is_err(), "{path} {bad}");
        }
        assert_eq!(judge(&mut s, "PUT", "/boot-source", &boot), Ok(()));
        assert_eq!(judge(&mut s, "PUT", "/actions", &start), Ok(()));
        // Pre-boot only, and once.
        assert!(judge(&mut s, "PUT", "/boot-source", &boot).is_err());
        assert!(judge(&mut s, "PUT", "/actions", &start).is_err());
        assert_eq!(
            judge(
                &mut s,
                "PUT",
                "/actions",
                &json!({"action_type": "SendCtrlAltDel"})
            ),
            Ok(())
        );
    }
}
