//! Firecracker's API, the part the driver uses: typed request bodies for the
//! pre-boot configuration and the two actions, and a client that sends each
//! as one HTTP/1.1 `PUT` over the API's unix socket, bounded by a timeout.
//!
//! The shapes follow Firecracker's published definition
//! (`src/firecracker/swagger/firecracker.yaml`): `BootSource`, `Drive`,
//! `MachineConfiguration`, `Vsock`, `InstanceActionInfo`, and `Error`, the
//! body of every refusal (`{"fault_message": "…"}`). Every success of these
//! operations is `204 No Content`; anything else is the step's failure.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

/// `PUT /boot-source` (`BootSource`). Paths are the VMM's own, inside its
/// jail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootSource {
    pub kernel_image_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    pub boot_args: String,
}

/// `PUT /drives/{drive_id}` (`Drive`, a virtio-block drive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drive {
    pub drive_id: String,
    pub path_on_host: String,
    pub is_root_device: bool,
    pub is_read_only: bool,
}

/// `PUT /machine-config` (`MachineConfiguration`): `vcpu_count` in 1..=32.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineConfig {
    pub vcpu_count: u64,
    pub mem_size_mib: u64,
    pub smt: bool,
}

/// `PUT /vsock` (`Vsock`): the guest's context id (at least 3) and the
/// unix socket behind the device; a guest's connection to the host's
/// port `P` reaches `<uds_path>_P`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vsock {
    pub guest_cid: u32,
    pub uds_path: String,
}

/// `PUT /actions` (`InstanceActionInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub action_type: ActionType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActionType {
    InstanceStart,
    SendCtrlAltDel,
}

/// The body of a refusal (`Error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    #[serde(default)]
    pub fault_message: String,
}

/// One request of the driver's sequence, named as its error says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    BootSource,
    Drive(String),
    MachineConfig,
    Vsock,
    InstanceStart,
    SendCtrlAltDel,
}

impl Step {
    /// The request's path.
    pub fn path(&self) -> String {
        match self {
            Step::BootSource => "/boot-source".into(),
            Step::Drive(id) => format!("/drives/{id}"),
            Step::MachineConfig => "/machine-config".into(),
            Step::Vsock => "/vsock".into(),
            Step::InstanceStart | Step::SendCtrlAltDel => "/actions".into(),
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::InstanceStart => f.write_str("PUT /actions InstanceStart"),
            Step::SendCtrlAltDel => f.write_str("PUT /actions SendCtrlAltDel"),
            other => write!(f, "PUT {}", other.path()),
        }
    }
}

/// Why one request did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot connect to the API socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("cannot encode the request: {0}")]
    Encode(serde_json::Error),
    #[error("cannot build the request: {0}")]
    Request(#[from] http::Error),
    #[error("its answer's body: {0}")]
    Body(String),
    /// The documented refusal: a status other than 204, with the
    /// `Error` body's message (empty when the body was not one).
    #[error("refused ({status}): {fault_message}")]
    Refused { status: u16, fault_message: String },
}

/// Largest answer body read (a fault message).
const MAX_ANSWER: usize = 64 * 1024;

/// A client of one Firecracker's API socket.
#[derive(Debug, Clone)]
pub struct Api {
    /// The socket, as this process reaches it.
    pub socket: PathBuf,
    /// Bound on each request, from connecting to the answer's end.
    pub timeout: Duration,
}

impl Api {
    /// Sends `body` to `step`'s path; `Ok` on 204.
    pub async fn put<T: Serialize>(&self, step: &Step, body: &T) -> Result<(), ApiError> {
        let body = serde_json::to_vec(body).map_err(ApiError::Encode)?;
        tokio::time::timeout(self.timeout, self.send(step.path(), body))
            .await
            .map_err(|_| ApiError::Timeout(self.timeout))?
    }

    async fn send(&self, path: String, body: Vec<u8>) -> Result<(), ApiError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ApiError::Connect {
                path: self.socket.clone(),
                source,
            })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await?;
        let conn = tokio::spawn(conn);
        let req = http::Request::put(path)
            .header(http::header::HOST, "localhost")
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let answer = sender.send_request(req).await;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                conn.abort();
                return Err(e.into());
            }
        };
        let status = answer.status();
        let bytes = Limited::new(answer.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| ApiError::Body(e.to_string()))?
            .to_bytes();
        conn.abort();
        if status == http::StatusCode::NO_CONTENT {
            return Ok(());
        }
        let fault_message = serde_json::from_slice::<Fault>(&bytes)
            .map(|f| f.fault_message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).chars().take(512).collect());
        Err(ApiError::Refused {
            status: status.as_u16(),
            fault_message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v<T: Serialize>(x: &T) -> serde_json::Value {
        serde_json::to_value(x).unwrap()
    }

    /// Each body has the definition's field names and JSON types, and no
    /// field the definition does not have.
    #[test]
    fn bodies_have_the_definitions_shape() {
        assert_eq!(
            v(&BootSource {
                kernel_image_path: "/kernel".into(),
                initrd_path: Some("/initrd".into()),
                boot_args: "console=ttyS0".into(),
            }),
            json!({"kernel_image_path": "/kernel", "initrd_path": "/initrd", "boot_args": "console=ttyS0"})
        );
        assert_eq!(
            v(&BootSource {
                kernel_image_path: "/k".into(),
                initrd_path: None,
                boot_args: String::new(),
            }),
            json!({"kernel_image_path": "/k", "boot_args": ""})
        );
        assert_eq!(
            v(&Drive {
                drive_id: "root".into(),
                path_on_host: "/root.ext4".into(),
                is_root_device: false,
                is_read_only: true,
            }),
            json!({"drive_id": "root", "path_on_host": "/root.ext4", "is_root_device": false, "is_read_only": true})
        );
        assert_eq!(
            v(&MachineConfig {
                vcpu_count: 2,
                mem_size_mib: 512,
                smt: false,
            }),
            json!({"vcpu_count": 2, "mem_size_mib": 512, "smt": false})
        );
        assert_eq!(
            v(&Vsock {
                guest_cid: 3,
                uds_path: "/v.sock".into(),
            }),
            json!({"guest_cid": 3, "uds_path": "/v.sock"})
        );
        assert_eq!(
            v(&Action {
                action_type: ActionType::InstanceStart,
            }),
            json!({"action_type": "InstanceStart"})
        );
        assert_eq!(
            v(&Action {
                action_type: ActionType::SendCtrlAltDel,
            }),
            json!({"action_type": "SendCtrlAltDel"})
        );
        let f: Fault = serde_json::from_str(r#"{"fault_message": "bad"}"#).unwrap();
        assert_eq!(f.fault_message, "bad");
    }

    /// A step names its request in its error.
    #[test]
    fn steps_name_their_requests() {
        assert_eq!(
            Step::Drive("agent0".into()).to_string(),
            "PUT /drives/agent0"
        );
        assert_eq!(Step::MachineConfig.to_string(), "PUT /machine-config");
        assert_eq!(
            Step::InstanceStart.to_string(),
            "PUT /actions InstanceStart"
        );
        assert_eq!(Step::SendCtrlAltDel.path(), "/actions");
    }
}
