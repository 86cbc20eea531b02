//! `airlock microvm-host` (hidden): the host side of one guest. Started by
//! the backend in the run's cgroups, it listens on the channel's socket,
//! starts the VMM (which connects to it), and then serves the guest: the
//! header and the runtime's secrets in, after the guest says it booted;
//! each relay stream to the sidecar's socket it names; the runtime's output
//! to its own stdout and stderr. It exits with the runtime's exit code, as
//! the guest's nonce'd end frame says, or 125 with the reason on stderr.
//! It dies with the platform, and the VMM with it.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use airlock_platform_api::channel::{ChannelError, Decoder, Frame, GuestStreams, NONCE_LEN, Relay};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::config::{
    HostConfig, HostLine, HostRun, MAX_CONFIG_BYTES, POOLED_READY, PooledConfig, VmmPlan,
};
use super::mux::{self, FrameTx, Inbound};
use crate::{PROXY_SOCKET, SIDECAR_SOCKET};

/// The hidden subcommand.
pub const HOST_SUBCOMMAND: &str = "microvm-host";

/// Why the guest's run did not end with its runtime's exit code.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read the microVM's configuration: {0}")]
    Config(String),
    #[error("cannot draw the run's nonce: {0}")]
    Nonce(std::io::Error),
    #[error("cannot listen on the microVM's channel: {0}")]
    Listen(std::io::Error),
    #[error("cannot start the VMM {program}: {source}")]
    Vmm {
        program: String,
        source: std::io::Error,
    },
    #[error("the VMM exited ({0}) before it connected its channel")]
    VmmGone(std::process::ExitStatus),
    #[error("the microVM stopped ({0}) before its runtime ended")]
    Stopped(String),
    #[error("the microVM's channel: {0}")]
    Channel(#[from] ChannelError),
    #[error("the microVM's channel: {0}")]
    Io(std::io::Error),
    #[error("firecracker: {0}")]
    Firecracker(#[from] super::firecracker::FirecrackerError),
    #[error("a pooled guest's first frame was {0}, not ready")]
    NotReady(&'static str),
    #[error("the pooled guest was let go before any run claimed it")]
    Unclaimed,
    #[error("the firecracker driver keeps no pooled guests")]
    PooledFirecracker,
}

/// The helper's whole life; its exit code.
/// (It dies with the platform: the death signal was set before its exec.)
pub fn main() -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox setup failed: microvm host: {e}");
            return 125;
        }
    };
    let code = match rt.block_on(serve()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandbox setup failed: {e}");
            125
        }
    };
    // A read of stdin may still be pending (secrets never released, a
    // pooled guest never claimed): the helper's end does not wait for it.
    rt.shutdown_background();
    code
}

/// Reads the first line (the rest of stdin is the run's part of a pooled
/// guest, then the secrets).
fn read_config() -> Result<HostLine, HostError> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let mut stdin = std::io::stdin().lock();
    while line.len() as u64 <= MAX_CONFIG_BYTES {
        match stdin.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) => return Err(HostError::Config(e.to_string())),
        }
    }
    serde_json::from_slice(&line).map_err(|e| HostError::Config(e.to_string()))
}

/// A pooled guest's run: the line that follows on stdin at its claim, and
/// what was read after it (the start of the guest's stdin).
async fn read_claim(stdin: &mut tokio::io::Stdin) -> Result<(HostRun, Vec<u8>), HostError> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let end = loop {
        if let Some(i) = got.iter().position(|b| *b == b'\n') {
            break i;
        }
        if got.len() as u64 > MAX_CONFIG_BYTES {
            return Err(HostError::Config("the run's line is too long".into()));
        }
        match stdin.read(&mut buf).await {
            // Closed before a claim: the pool let this guest go.
            Ok(0) => return Err(HostError::Unclaimed),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return Err(HostError::Config(e.to_string())),
        }
    };
    let rest = got.split_off(end + 1);
    let run = serde_json::from_slice(&got[..end]).map_err(|e| HostError::Config(e.to_string()))?;
    Ok((run, rest))
}

fn nonce() -> Result<[u8; NONCE_LEN], HostError> {
    let mut n = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut n))
        .map_err(HostError::Nonce)?;
    Ok(n)
}

/// A descriptor the VMM inherits (this process's copy is closed once it started).
fn inheritable(fd: &impl std::os::fd::AsFd) -> Result<i32, HostError> {
    use std::os::fd::AsRawFd;
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())
        .map_err(|e| HostError::Listen(e.into()))?;
    Ok(fd.as_fd().as_raw_fd())
}

async fn serve() -> Result<i32, HostError> {
    let (pooled, plan) = match read_config()? {
        HostLine::Cold(mut cfg) => {
            cfg.guest.nonce = nonce()?;
            let plan = match &cfg.plan {
                VmmPlan::Qemu(plan) => plan.clone(),
                VmmPlan::Firecracker(plan) => return serve_firecracker(&cfg, plan).await,
            };
            (Err(cfg), plan)
        }
        HostLine::Pooled(p) => match &p.plan {
            VmmPlan::Qemu(plan) => {
                let plan = plan.clone();
                (Ok(p), plan)
            }
            VmmPlan::Firecracker(_) => return Err(HostError::PooledFirecracker),
        },
    };
    // The channel is a socket pair, the disks open files: the VMM gets
    // descriptors, no path, so nothing of the run's directory need be open
    // to its uid, and no socket is left on disk.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(HostError::Listen)?;
    let disks = plan
        .disks
        .iter()
        .map(std::fs::File::open)
        .collect::<Result<Vec<_>, _>>()
        .map_err(HostError::Listen)?;
    let disk_fds = disks
        .iter()
        .map(inheritable)
        .collect::<Result<Vec<_>, _>>()?;
    let fds = super::qemu::Fds {
        channel: inheritable(&theirs)?,
        disks: &disk_fds,
    };
    let argv = plan.argv(fds);
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| HostError::Config("no VMM command".into()))?;
    let (switch, uid, gid) = match &pooled {
        Ok(p) => (p.vmm_switch, p.vmm_uid, p.vmm_gid),
        Err(c) => (c.vmm_switch, c.vmm_uid, c.vmm_gid),
    };
    let mut vmm = super::vmm_command(program, args, switch, uid, gid);
    let mut vmm = vmm.spawn().map_err(|source| HostError::Vmm {
        program: program.clone(),
        source,
    })?;
    drop((theirs, disks));
    ours.set_nonblocking(true).map_err(HostError::Listen)?;
    let chan = tokio::net::UnixStream::from_std(ours).map_err(HostError::Listen)?;
    let ended = tokio::select! {
        r = guest(chan, pooled) => r,
        s = vmm.wait() => Err(HostError::Stopped(match s {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        })),
    };
    // The guest powers itself off after its end: a moment for it.
    if ended.is_ok() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), vmm.wait()).await;
    }
    let _ = vmm.start_kill();
    let _ = vmm.wait().await;
    ended
}

/// Serves a cold start's guest (`Err`: its whole configuration) or a pooled
/// one (`Ok`): booted, it says so on stdout and waits for its run's line
/// on stdin, which holds nothing before; the run's nonce is drawn then.
async fn guest(
    mut chan: tokio::net::UnixStream,
    cfg: Result<PooledConfig, HostConfig>,
) -> Result<i32, HostError> {
    let p = match cfg {
        Err(cfg) => return demux(chan, &cfg, Decoder::default(), None).await,
        Ok(p) => p,
    };
    let mut decoder = Decoder::default();
    let mut buf = vec![0u8; 4096];
    let first = loop {
        if let Some(f) = decoder.next_frame()? {
            break f;
        }
        let n = chan.read(&mut buf).await.map_err(HostError::Io)?;
        if n == 0 {
            return Err(HostError::Stopped("its channel closed".into()));
        }
        decoder.push(&buf[..n]);
    };
    if first != Frame::Ready {
        return Err(HostError::NotReady(first.name()));
    }
    let mut out = tokio::io::stdout();
    out.write_all(POOLED_READY).await.map_err(HostError::Io)?;
    out.flush().await.map_err(HostError::Io)?;
    let mut stdin = tokio::io::stdin();
    let (run, rest) = read_claim(&mut stdin).await?;
    let cfg = HostConfig {
        plan: p.plan,
        vmm_uid: p.vmm_uid,
        vmm_gid: p.vmm_gid,
        vmm_switch: p.vmm_switch,
        sockets_dir: run.sockets_dir,
        guest: super::config::GuestHeader {
            nonce: nonce()?,
            ..run.guest
        },
    };
    demux(chan, &cfg, decoder, Some((stdin, rest))).await
}

/// The guest under Firecracker: booted, its channel served until its end
/// (or the VMM's), then stopped and its jail removed, whatever the outcome.
pub async fn serve_firecracker(
    cfg: &HostConfig,
    plan: &super::firecracker::FirecrackerPlan,
) -> Result<i32, HostError> {
    let mut vm = super::firecracker::vm::Vm::boot(plan).await?;
    let ended: Result<i32, HostError> = async {
        let chan = vm.channel().await?;
        tokio::select! {
            r = demux(chan, cfg, Decoder::default(), None) => r,
            s = vm.exited() => Err(HostError::Stopped(s)),
        }
    }
    .await;
    vm.stop().await;
    ended
}

/// Serves the guest's frames until its end (or the first refusal), from
/// what `decoder` holds on. `claimed`: a pooled guest's, whose ready frame
/// was read already (its header and stdin go at once: what was read of the
/// stdin already, then the rest of it).
async fn demux(
    chan: tokio::net::UnixStream,
    cfg: &HostConfig,
    mut decoder: Decoder,
    claimed: Option<(tokio::io::Stdin, Vec<u8>)>,
) -> Result<i32, HostError> {
    let (mut r, w) = chan.into_split();
    let (tx, writer) = mux::writer(w);
    let mut judge = GuestStreams::new(cfg.guest.nonce);
    let mut streams: HashMap<u32, mpsc::Sender<Inbound>> = HashMap::new();
    let mut stdin = claimed;
    if stdin.is_some() {
        judge.accept(Frame::Ready)?;
        hand_over(&tx, cfg, stdin.take())?;
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    // The platform's stop (SIGTERM) is passed on to the guest, once; its
    // end frame follows as at any end (the platform kills this helper, and
    // with it the VMM, at the end of its grace).
    let mut stop = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    loop {
        let frame = match decoder.next_frame()? {
            Some(f) => f,
            None => {
                let stop_asked = async {
                    match stop.as_mut() {
                        Some(term) => term.recv().await,
                        None => std::future::pending().await,
                    }
                };
                let n = tokio::select! {
                    n = r.read(&mut buf) => n.map_err(HostError::Io)?,
                    Some(()) = stop_asked => {
                        stop = None;
                        let _ = tx.send(Frame::Stop).await;
                        continue;
                    }
                };
                if n == 0 {
                    return Err(if decoder.partial() {
                        ChannelError::Truncated.into()
                    } else {
                        HostError::Stopped("its channel closed".into())
                    });
                }
                decoder.push(&buf[..n]);
                continue;
            }
        };
        let Some(frame) = judge.accept(frame)? else {
            continue;
        };
        match frame {
            Frame::Ready => hand_over(&tx, cfg, stdin.take())?,
            Frame::Stdout(b) => {
                let _ = stdout.write_all(&b).await;
                let _ = stdout.flush().await;
            }
            Frame::Stderr(b) => {
                let _ = stderr.write_all(&b).await;
            }
            // Its nonce checked: the guest's init sent it.
            Frame::Exit { code, .. } => {
                // Closing the channel tells the guest it may power off.
                writer.abort();
                return Ok(code);
            }
            Frame::Open { stream, relay } => {
                let (in_tx, in_rx) = mpsc::channel(mux::STREAM_QUEUE);
                streams.insert(stream, in_tx);
                tokio::spawn(dial(
                    stream,
                    relay,
                    cfg.sockets_dir.clone(),
                    tx.clone(),
                    in_rx,
                ));
            }
            Frame::Data { stream, data } => {
                deliver(&mut streams, &mut judge, stream, Inbound::Data(data)).await;
            }
            Frame::Eof { stream } => {
                deliver(&mut streams, &mut judge, stream, Inbound::Eof).await;
            }
            Frame::Reset { stream } => {
                streams.remove(&stream);
            }
            // The host's own kinds: refused by the judge.
            Frame::Header(_) | Frame::Stdin(_) | Frame::StdinEnd | Frame::Stop => {}
        }
    }
}

/// Hands a stream what the guest sent on it; a stream whose carrier is
/// gone is closed (what comes after is late).
async fn deliver(
    streams: &mut HashMap<u32, mpsc::Sender<Inbound>>,
    judge: &mut GuestStreams,
    stream: u32,
    m: Inbound,
) {
    let gone = match streams.get(&stream) {
        Some(s) => s.send(m).await.is_err(),
        None => true,
    };
    if gone {
        streams.remove(&stream);
        judge.close(stream);
    }
}

/// The header, then the runtime's secrets (this process's stdin, to its
/// end: the platform releases them once the sidecar is ready).
fn hand_over(
    tx: &FrameTx,
    cfg: &HostConfig,
    stdin: Option<(tokio::io::Stdin, Vec<u8>)>,
) -> Result<(), HostError> {
    let header = serde_json::to_vec(&cfg.guest).map_err(|e| HostError::Config(e.to_string()))?;
    let tx = tx.clone();
    tokio::spawn(async move {
        if tx.send(Frame::Header(Bytes::from(header))).await.is_err() {
            return;
        }
        let (mut stdin, read) = stdin.unwrap_or_else(|| (tokio::io::stdin(), Vec::new()));
        if !read.is_empty() && !mux::send_chunked(&tx, Bytes::from(read), Frame::Stdin).await {
            return;
        }
        let mut buf = vec![0u8; airlock_platform_api::channel::MAX_PAYLOAD];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let piece = Bytes::copy_from_slice(&buf[..n]);
                    if tx.send(Frame::Stdin(piece)).await.is_err() {
                        return;
                    }
                }
            }
        }
        buf.iter_mut().for_each(|b| *b = 0);
        let _ = tx.send(Frame::StdinEnd).await;
    });
    Ok(())
}

/// Connects a new stream to the sidecar's socket for `relay`, then carries
/// it; a socket that cannot be reached resets the stream.
async fn dial(
    stream: u32,
    relay: Relay,
    sockets: std::path::PathBuf,
    tx: FrameTx,
    inbound: mpsc::Receiver<Inbound>,
) {
    let name = match relay {
        Relay::Api => SIDECAR_SOCKET,
        Relay::Proxy => PROXY_SOCKET,
    };
    match tokio::net::UnixStream::connect(Path::new(&sockets).join(name)).await {
        Ok(sock) => mux::carry(stream, sock, tx, inbound).await,
        Err(_) => {
            let _ = tx.send(Frame::Reset { stream }).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::namespace::sys::{VmmConfinement, confine_vmm_on_spawn};

    fn confined(parent: i32) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "grep -E '^NoNewPrivs:' /proc/self/status"])
            .stdout(std::process::Stdio::piped());
        confine_vmm_on_spawn(
            &mut cmd,
            VmmConfinement {
                switch: false,
                uid: 0,
                gid: 0,
                parent,
            },
        );
        cmd
    }

    /// A VMM whose spawning process is not its parent any more (it died
    /// between the fork and the death signal) never starts; one whose
    /// parent is there starts with no new privileges.
    #[tokio::test]
    async fn a_vmm_starts_only_under_the_parent_it_dies_with() {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let err = confined(me + 1_000_000).spawn().err();
        assert!(
            err.is_some_and(|e| e.raw_os_error() == Some(libc::ESRCH)),
            "a VMM started without the parent it dies with"
        );
        let out = confined(me).output().await.unwrap();
        let status = String::from_utf8_lossy(&out.stdout);
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    }
}
