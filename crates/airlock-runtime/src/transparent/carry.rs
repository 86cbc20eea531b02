//! The carrier: a listener per carried port; each connection to an issued
//! synthetic address goes to the sidecar's forward proxy as the plane's
//! `CONNECT name:port`, the client's bytes following at once (the sidecar
//! reads the name they present before it answers).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use airlock_platform_api::transparent::{PLANE_HEADER, PLANE_TRANSPARENT, is_synthetic};
use secrecy::{ExposeSecret, SecretString};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::names::Names;
use crate::relay::Dial;

/// Largest answer head read from the sidecar.
const MAX_ANSWER_HEAD: usize = 16 * 1024;

/// Listens on every address of the sandbox at `port` and carries what
/// comes to an issued synthetic address.
pub async fn serve(
    port: u16,
    names: Arc<Names>,
    proxy: Dial,
    token: SecretString,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))).await?;
    serve_on(listener, names, proxy, token);
    Ok(())
}

/// Carries what comes on `listener` (its port is the port carried) to an
/// issued synthetic address, until the runtime ends.
pub fn serve_on(listener: TcpListener, names: Arc<Names>, proxy: Dial, token: SecretString) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                // Out of descriptors, say: a short pause, never a stop.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Some(name) = issued_name(&client, &names) else {
                continue; // dropped: closed
            };
            let (proxy, token) = (proxy.clone(), token.clone());
            tokio::spawn(async move {
                let _ = carry(client, &name, port, &proxy, &token).await;
            });
        }
    });
}

/// The name the address `client` dialled was issued for; `None` for any
/// other local address (a literal one, or loopback's own).
fn issued_name(client: &TcpStream, names: &Names) -> Option<String> {
    match client.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if is_synthetic(ip) => names.name_of(ip),
        _ => None,
    }
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
