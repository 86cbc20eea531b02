//! The carrier: each synthetic address the responder issues gets, before
//! the answer leaves, a listener on each carried port at that address (and
//! no other: every other address and port of the sandbox's loopback stays
//! as it was). A connection to one goes to the sidecar's forward proxy as
//! the plane's `CONNECT name:port`, the client's bytes following at once
//! (the sidecar reads the name they present before it answers).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use airlock_platform_api::transparent::{PLANE_HEADER, PLANE_TRANSPARENT};
use secrecy::{ExposeSecret, SecretString};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::names::{NameError, Names};
use crate::relay::Dial;

/// Largest answer head read from the sidecar.
const MAX_ANSWER_HEAD: usize = 16 * 1024;
/// Most listeners the carrier holds (names × ports): the runtime's share of
/// the sandbox's open files (1024 a process).
const MAX_LISTENERS: usize = 384;

/// The synthetic address book and what each address carries to.
pub struct Carrier {
    names: Names,
    ports: Vec<u16>,
    proxy: Dial,
    token: SecretString,
}

impl Carrier {
    pub fn new(ports: Vec<u16>, proxy: Dial, token: SecretString) -> Carrier {
        Carrier {
            names: Names::default(),
            ports,
            proxy,
            token,
        }
    }

    /// The address of `name`, its listeners started when it is new (a port
    /// that cannot be listened on is left refused, with a warning).
    pub fn address_of(&self, name: &str) -> Result<Ipv4Addr, NameError> {
        let limit = MAX_LISTENERS / self.ports.len().max(1);
        let (ip, new) = self.names.issue(name, limit)?;
        if let Some(name) = new {
            for &port in &self.ports {
                match listen(SocketAddr::from((ip, port))) {
                    Ok(l) => serve_on(l, name.clone(), self.proxy.clone(), self.token.clone()),
                    Err(e) => eprintln!(
                        "airlock runtime warning: the transparent plane cannot carry {name}:{port}: {e}"
                    ),
                }
            }
        }
        Ok(ip)
    }
}

/// A listener at `at`, bound now (the answer that names it leaves after).
fn listen(at: SocketAddr) -> std::io::Result<TcpListener> {
    let l = std::net::TcpListener::bind(at)?;
    l.set_nonblocking(true)?;
    TcpListener::from_std(l)
}

/// Carries what comes on `listener` (its port is the port carried) as
/// `name`'s, until the runtime ends.
pub fn serve_on(listener: TcpListener, name: String, proxy: Dial, token: SecretString) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                // Out of descriptors, say: a short pause, never a stop.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let (name, proxy, token) = (name.clone(), proxy.clone(), token.clone());
            tokio::spawn(async move {
                let _ = carry(client, &name, port, &proxy, &token).await;
            });
        }
    });
}

/// The plane's CONNECT for `name:port`.
pub fn connect_head(name: &str, port: u16, token: &SecretString) -> String {
    format!(
        "CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\nProxy-Authorization: Bearer {}\r\n{PLANE_HEADER}: {PLANE_TRANSPARENT}\r\n\r\n",
        token.expose_secret()
    )
}

/// Carries one connection: the client's bytes go to the sidecar from the
/// start; its answer's head is read, and only a `200` lets bytes back.
async fn carry(
    client: TcpStream,
    name: &str,
    port: u16,
    proxy: &Dial,
    token: &SecretString,
) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut upstream = proxy.connect().await?;
    upstream
        .write_all(connect_head(name, port, token).as_bytes())
        .await?;
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let up = async {
        tokio::io::copy(&mut cr, &mut uw).await?;
        uw.shutdown().await
    };
    let down = async {
        let rest = answer_head(&mut ur).await?;
        cw.write_all(&rest).await?;
        tokio::io::copy(&mut ur, &mut cw).await?;
        cw.shutdown().await
    };
    // A refusal ends both directions at once (the client sees its
    // connection closed).
    tokio::try_join!(up, down).map(|_| ())
}

/// Reads the sidecar's answer head; `Ok` with the bytes behind it when it
/// is `200`, an error otherwise.
async fn answer_head<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(256);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                return match resp.code {
                    Some(200) => Ok(buf.split_off(n)),
                    code => Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("the sidecar answered {code:?}"),
                    )),
                };
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_ANSWER_HEAD => {}
            _ => return Err(std::io::Error::other("the sidecar's answer is not a head")),
        }
        if r.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_200_lets_bytes_back_and_a_refusal_does_not() {
        let mut ok: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\nhello";
        assert_eq!(answer_head(&mut ok).await.unwrap(), b"hello");
        let mut no: &[u8] = b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\n{}";
        assert!(answer_head(&mut no).await.is_err());
        let mut cut: &[u8] = b"HTTP/1.1 200 Conn";
        assert!(answer_head(&mut cut).await.is_err());
    }

    #[test]
    fn the_head_names_the_plane_and_carries_the_token() {
        let h = connect_head("api.example.com", 8443, &SecretString::from("tok"));
        assert!(h.starts_with("CONNECT api.example.com:8443 HTTP/1.1\r\n"));
        assert!(h.contains("Proxy-Authorization: Bearer tok\r\n"));
        assert!(h.contains("airlock-plane: transparent\r\n"));
    }
}
