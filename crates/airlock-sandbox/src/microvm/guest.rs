//! `airlock vm-init` (hidden): PID 1 of a guest, started by the
//! initramfs's stage 1 on the read-only root. It opens the channel's port,
//! says it booted, and waits for the run's header; then builds the agent's
//! view (a small read-only tmpfs root binding the image's directories
//! read-only and nosuid, the workspace a capped tmpfs, the agent's disks at
//! their paths, or, on a pooled guest, the agent's directory unpacked from
//! the archive that leads its stdin onto a read-only tmpfs at its path:
//! [`super::config::GuestView`]), listens where the runtime reaches the sidecar
//! ([`SOCKETS_IN_GUEST`]: each connection becomes a stream), starts the
//! runtime as an unprivileged uid with the secrets as its stdin, and at its
//! exit sends the one end frame, carrying the run's nonce. Only this
//! process holds the port (virtio-serial ports open once, the device is
//! root's), so the agent cannot speak on the channel at all.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use airlock_platform_api::channel::{Decoder, Frame, PORT_NAME, Relay};
use bytes::Bytes;
use rustix::mount::{MountFlags, UnmountFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::config::{GuestHeader, GuestView, SOCKETS_IN_GUEST};
use super::mux::{self, FrameTx, Inbound};
use crate::{PROXY_SOCKET, SIDECAR_SOCKET};

/// The guest's init; never returns normally (it powers the guest off).
pub fn main() -> i32 {
    let code = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(serve()),
        Err(e) => {
            eprintln!("vm-init: {e}");
            125
        }
    };
    // `reboot=t` and QEMU's -no-reboot make a restart the VM's end.
    rustix::fs::sync();
    let _ = rustix::system::reboot(rustix::system::RebootCommand::Restart);
    code
}

fn io_err(what: &str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{what}: {e}"))
}

/// The port named [`PORT_NAME`] (`/dev/vportNpM`).
fn find_port() -> std::io::Result<PathBuf> {
    for e in std::fs::read_dir("/sys/class/virtio-ports")?.flatten() {
        let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Ok(Path::new("/dev").join(e.file_name()));
        }
    }
    Err(io_err("no virtio port", PORT_NAME))
}

async fn serve() -> i32 {
    let _ = mount("proc", "/proc", "proc", MountFlags::empty(), "");
    let _ = mount("sysfs", "/sys", "sysfs", MountFlags::empty(), "");
    let port = match find_port()
        .and_then(|p| std::fs::OpenOptions::new().read(true).write(true).open(p))
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vm-init: the channel: {e}");
            return 125;
        }
    };
    let Ok(writer_file) = port.try_clone() else {
        eprintln!("vm-init: the channel cannot be shared");
        return 125;
    };
    let (tx, writer) = mux::writer(tokio::fs::File::from_std(writer_file));
    let mut reader = Reader {
        file: tokio::fs::File::from_std(port),
        decoder: Decoder::default(),
    };
    if tx.send(Frame::Ready).await.is_err() {
        return 125;
    }
    let code = match run(&tx, &mut reader).await {
        Ok(()) => 0,
        Err(e) => {
            let _ =
                mux::send_chunked(&tx, Bytes::from(format!("vm-init: {e}\n")), Frame::Stderr).await;
            // The host, seeing no end, says the guest stopped before it.
            125
        }
    };
    // After a failure, what is queued (its reason) reaches the host before
    // the guest goes, within a bound: the writer ends when the last sender
    // does, and the relays' listeners hold theirs until the guest goes. After
    // the run's end nothing is waited for: the host closed the channel once
    // it had the end frame, the last one written (waiting for the writer
    // there took the bound's two seconds at every run's end).
    if code != 0 {
        drop(tx);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), writer).await;
    }
    code
}

struct Reader {
    file: tokio::fs::File,
    decoder: Decoder,
}

impl Reader {
    /// The next frame from the host; `None` once the host has closed the channel.
    async fn next(&mut self) -> std::io::Result<Option<Frame>> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(f) = self
                .decoder
                .next_frame()
                .map_err(|e| io_err("channel", e))?
            {
                return Ok(Some(f));
            }
            let n = self.file.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            self.decoder.push(&buf[..n]);
        }
    }
}

async fn run(tx: &FrameTx, reader: &mut Reader) -> std::io::Result<()> {
    let header: GuestHeader = match reader.next().await? {
        Some(Frame::Header(h)) => serde_json::from_slice(&h).map_err(|e| io_err("header", e))?,
        other => return Err(io_err("expected the header", format!("{other:?}"))),
    };
    // A pooled guest's agent directory leads its stdin: what follows it
    // is the runtime's, kept for it.
    let mut early = Vec::new();
    let view = match &header.view {
        Some(v) => Some(read_view(reader, v, &mut early).await?),
        None => None,
    };
    build_root(&header, view.as_deref())?;
    drop(view);
    // The guest has no network device: loopback alone, for the runtime's
    // local relays.
    crate::namespace::sys::loopback_up().map_err(|e| io_err("loopback", e))?;
    let streams = Streams::default();
    listen(Relay::Api, SIDECAR_SOCKET, tx, &streams)?;
    listen(Relay::Proxy, PROXY_SOCKET, tx, &streams)?;
    let (program, args) = header
        .command
        .split_first()
        .ok_or_else(|| io_err("header", "empty command"))?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(header.env.iter().cloned())
        .uid(header.uid)
        .gid(header.uid)
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| io_err(&format!("cannot start {program}"), e))?;
    let mut stdin = child.stdin.take();
    if let Some(w) = stdin.as_mut() {
        for b in early {
            let _ = w.write_all(&b).await;
        }
    }
    let pumps = [
        child
            .stdout
            .take()
            .map(|s| pump(s, tx.clone(), Frame::Stdout)),
        child
            .stderr
            .take()
            .map(|s| pump(s, tx.clone(), Frame::Stderr)),
    ];
    let status = loop {
        tokio::select! {
            s = child.wait() => break s?,
            f = reader.next() => match f? {
                Some(Frame::Stdin(b)) => {
                    if let Some(w) = stdin.as_mut() {
                        let _ = w.write_all(&b).await;
                    }
                }
                Some(Frame::StdinEnd) => stdin = None,
                // The platform stops the run: the runtime ends its agent
                // and reports what it holds, then exits (its end follows).
                Some(Frame::Stop) => {
                    if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(i32::try_from(p).ok()?)) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                    }
                }
                Some(Frame::Data { stream, data }) => streams.route(stream, Inbound::Data(data)).await,
                Some(Frame::Eof { stream }) => streams.route(stream, Inbound::Eof).await,
                Some(Frame::Reset { stream }) => streams.remove(stream),
                Some(_) => {}
                None => return Err(io_err("channel", "the host closed it")),
            },
        }
    };
    for p in pumps.into_iter().flatten() {
        let _ = p.await;
    }
    let code = status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    });
    let _ = tx
        .send(Frame::Exit {
            nonce: header.nonce,
            code,
        })
        .await;
    // The host closes the channel once it has the end: then the guest may go.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Ok(Some(_)) = reader.next().await {}
    })
    .await;
    Ok(())
}

/// The open relay streams by id. A stream is entered by the task that
/// accepted its connection BEFORE its `Open` frame is queued, so whatever
/// the host answers on it finds it (the reader never races the acceptor).
#[derive(Clone, Default)]
struct Streams(Arc<Mutex<HashMap<u32, mpsc::Sender<Inbound>>>>);

impl Streams {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, mpsc::Sender<Inbound>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Enters a new stream; those whose carrier ended are forgotten.
    fn open(&self, stream: u32, inbound: mpsc::Sender<Inbound>) {
        let mut map = self.map();
        map.retain(|_, s| !s.is_closed());
        map.insert(stream, inbound);
    }

    fn remove(&self, stream: u32) {
        self.map().remove(&stream);
    }

    /// Hands the stream what the host sent on it (backpressure: waits while
    /// its queue is full); a stream whose carrier is gone is forgotten.
    async fn route(&self, stream: u32, m: Inbound) {
        let Some(s) = self.map().get(&stream).cloned() else {
            return;
        };
        if s.send(m).await.is_err() {
            self.remove(stream);
        }
    }
}

/// One of the runtime's output streams, as frames made by `frame`.
fn pump(
    mut s: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    tx: FrameTx,
    frame: fn(Bytes) -> Frame,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0
                || tx
                    .send(frame(Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
            {
                break;
            }
        }
    })
}

/// Listens at `SOCKETS_IN_GUEST/name`; each connection opens a stream to `relay`.
fn listen(relay: Relay, name: &str, tx: &FrameTx, streams: &Streams) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let path = Path::new(SOCKETS_IN_GUEST).join(name);
    let l = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
    let (tx, streams) = (tx.clone(), streams.clone());
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            // Ids only grow: the one counter for both listeners.
            let stream = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (in_tx, in_rx) = mpsc::channel(mux::STREAM_QUEUE);
            streams.open(stream, in_tx);
            if tx.send(Frame::Open { stream, relay }).await.is_err() {
                return;
            }
            tokio::spawn(mux::carry(stream, sock, tx.clone(), in_rx));
        }
    });
    Ok(())
}

/// The longest archive of an agent directory within the bounds of
/// [`crate::warm`]: its files, a header (and a long name's) per entry,
/// each file's padding, the end.
fn max_view_archive() -> u64 {
    crate::warm::MAX_VIEW_BYTES + crate::warm::MAX_VIEW_ENTRIES as u64 * 2048 + (1 << 20)
}

/// Reads a pooled guest's agent directory (a tar archive of `v.bytes`
/// bytes) from the first stdin frames; the rest of the last frame goes to
/// `early`, ahead of the stdin frames that follow (read by the run's loop).
async fn read_view(
    reader: &mut Reader,
    v: &GuestView,
    early: &mut Vec<Bytes>,
) -> std::io::Result<Vec<u8>> {
    if v.bytes > max_view_archive()
        || v.file_bytes > crate::warm::MAX_VIEW_BYTES
        || v.entries > crate::warm::MAX_VIEW_ENTRIES as u64
    {
        return Err(io_err("agent directory", "beyond the warm start's bounds"));
    }
    let want = usize::try_from(v.bytes).map_err(|e| io_err("agent directory", e))?;
    let mut archive = Vec::with_capacity(want);
    while archive.len() < want {
        match reader.next().await? {
            Some(Frame::Stdin(b)) => {
                let take = (want - archive.len()).min(b.len());
                archive.extend_from_slice(&b[..take]);
                if take < b.len() {
                    early.push(b.slice(take..));
                }
            }
            Some(Frame::StdinEnd) | None => {
                return Err(io_err("agent directory", "its archive was cut short"));
            }
            Some(other) => {
                return Err(io_err(
                    "agent directory",
                    format!("{other:?} in its archive"),
                ));
            }
        }
    }
    Ok(archive)
}

/// The agent's directory of a pooled guest at the mount point `at`: a
/// tmpfs sized for it, the archive unpacked in it (its entries kept inside
/// it, their owners and modes as on the host, as a cold start's disk keeps
/// them), then read-only.
fn mount_view(at: &Path, v: &GuestView, archive: &[u8]) -> std::io::Result<()> {
    let nosuid = MountFlags::NOSUID | MountFlags::NODEV;
    let size = v.file_bytes + v.entries * 4096 + (1 << 20);
    let opts = format!("size={size},nr_inodes={},mode=0755", v.entries + 16);
    mount("tmpfs", at, "tmpfs", nosuid, opts.as_str()).map_err(|e| io_err("agent view", e))?;
    let mut a = tar::Archive::new(archive);
    a.set_preserve_ownerships(true);
    a.set_overwrite(false);
    a.unpack(at).map_err(|e| io_err("agent view", e))?;
    rustix::mount::mount_remount(at, MountFlags::RDONLY | nosuid, c"")
        .map_err(|e| io_err("agent view read-only", e))
}

/// What is mounted at one of the run's own paths.
enum Point<'a> {
    Workspace,
    /// The agent disk of this index (serial `agent<i>`).
    Disk(usize),
    /// A pooled guest's agent directory, with its archive.
    View(&'a GuestView, &'a [u8]),
}

/// The agent's view, made the root: see the module's comment.
///
/// The run's own paths (the workspace, the agent's directory) are mounted
/// at the paths the host gave, as the other backends show them, wherever
/// they lie: one under a directory the image has (`/var/tmp/…`, `/opt/…`,
/// `/usr/local/…`), read-only in the view, gets its mount point on a
/// [`mirror_dir`] of that directory, which shows the image's entries as
/// before.
fn build_root(h: &GuestHeader, view: Option<&[u8]>) -> std::io::Result<()> {
    let m = |what: &str, r: rustix::io::Result<()>| r.map_err(|e| io_err(what, e));
    let nosuid = MountFlags::NOSUID | MountFlags::NODEV;
    m(
        "/run",
        mount("tmpfs", "/run", "tmpfs", nosuid, "size=1m,mode=0755"),
    )?;
    let new = Path::new("/run/root");
    std::fs::create_dir(new)?;
    m(
        "root",
        mount("tmpfs", new, "tmpfs", nosuid, "size=4m,mode=0755"),
    )?;
    mirror_entries(
        Path::new("/"),
        new,
        &["dev", "proc", "sys", "run", "tmp", "lost+found"],
    )?;
    for d in ["dev", "proc", "tmp", "run", "workspace"] {
        std::fs::create_dir_all(new.join(d))?;
    }
    m("proc", mount("proc", new.join("proc"), "proc", nosuid, ""))?;
    m(
        "tmp",
        mount(
            "tmpfs",
            new.join("tmp"),
            "tmpfs",
            nosuid,
            "size=64m,mode=1777",
        ),
    )?;
    m(
        "run",
        mount(
            "tmpfs",
            new.join("run"),
            "tmpfs",
            nosuid,
            "size=1m,mode=0755",
        ),
    )?;
    std::fs::create_dir_all(new.join(SOCKETS_IN_GUEST.trim_start_matches('/')))?;
    // The run's own paths, parents first (one may lie inside another).
    let mut points: Vec<(&Path, Point<'_>)> = vec![(h.workspace.as_path(), Point::Workspace)];
    points.extend(
        h.disks
            .iter()
            .enumerate()
            .map(|(i, p)| (p.as_path(), Point::Disk(i))),
    );
    if let (Some(v), Some(archive)) = (&h.view, view) {
        points.push((v.path.as_path(), Point::View(v, archive)));
    }
    points.sort_by_key(|(p, _)| p.components().count());
    // The image's directories that lack a point they must hold, mirrored
    // outermost first (an inner one is then a bind inside the outer's
    // mirror, and its own mirror hides nothing made before).
    let mut mirrored: Vec<PathBuf> = Vec::new();
    for (path, _) in &points {
        let (at, missing) = resolve(new, path)?;
        if !missing.is_empty() && !mirrored.contains(&at) && read_only(&under(new, &at))? {
            mirrored.push(at);
        }
    }
    mirrored.sort_by_key(|p| p.components().count());
    for at in &mirrored {
        mirror_dir(new, at)?;
    }
    for (path, what) in points {
        let at = make_point(new, path)?;
        match what {
            Point::Workspace => {
                let opts = format!(
                    "size={}m,mode=0700,uid={},gid={}",
                    h.workspace_mb.max(1),
                    h.uid,
                    h.uid
                );
                m(
                    "workspace",
                    mount("tmpfs", &at, "tmpfs", nosuid, opts.as_str()),
                )?;
            }
            Point::Disk(i) => {
                let dev = disk_with_serial(&format!("agent{i}"))?;
                m(
                    "agent disk",
                    mount(&dev, &at, "ext4", MountFlags::RDONLY | nosuid, "noload"),
                )?;
            }
            Point::View(v, archive) => mount_view(&at, v, archive)?,
        }
    }
    // Each mirror read-only again, as the image's directory it shows.
    for at in &mirrored {
        m(
            "mirror read-only",
            rustix::mount::mount_remount(under(new, at), MountFlags::RDONLY | nosuid, c""),
        )?;
    }
    m("dev", rustix::mount::mount_move("/dev", new.join("dev")))?;
    std::env::set_current_dir(new)?;
    std::fs::create_dir(".old")?;
    m("pivot_root", rustix::process::pivot_root(".", ".old"))?;
    m(
        "old root",
        rustix::mount::unmount("/.old", UnmountFlags::DETACH),
    )?;
    let _ = std::fs::remove_dir("/.old");
    std::env::set_current_dir("/")?;
    m(
        "ro root",
        rustix::mount::mount_remount("/", MountFlags::RDONLY | nosuid, c""),
    )
}

/// The view's path `p` (absolute, as the agent names it) under `new`, the
/// view's root while it is built.
fn under(new: &Path, p: &Path) -> PathBuf {
    new.join(p.strip_prefix("/").unwrap_or(p))
}

/// Whether the directory `dir` lies on a read-only mount.
fn read_only(dir: &Path) -> std::io::Result<bool> {
    let s = rustix::fs::statvfs(dir).map_err(|e| io_err(&dir.display().to_string(), e))?;
    Ok(s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// `dst`, an empty directory on a writable tmpfs, given the entries of the
/// image's directory `src` but those named in `skip`: each directory and
/// regular file bound at its name, read-only, nosuid and nodev; each
/// symbolic link copied. (Nothing else is in an image's directories.)
fn mirror_entries(src: &Path, dst: &Path, skip: &[&str]) -> std::io::Result<()> {
    let nosuid = MountFlags::NOSUID | MountFlags::NODEV;
    for e in std::fs::read_dir(src)?.flatten() {
        let name = e.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let to = dst.join(&name);
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &to)?;
            continue;
        }
        if t.is_dir() {
            std::fs::create_dir(&to)?;
        } else if t.is_file() {
            std::fs::File::create(&to)?;
        } else {
            continue;
        }
        rustix::mount::mount_bind_recursive(e.path(), &to).map_err(|e| io_err("bind", e))?;
        rustix::mount::mount_remount(&to, MountFlags::BIND | MountFlags::RDONLY | nosuid, c"")
            .map_err(|e| io_err("bind ro", e))?;
    }
    Ok(())
}

/// The image's directory `at` (a read-only bind in the view under `new`)
/// made able to take new mount points, its contents as the agent sees
/// them unchanged: a small tmpfs over it, with its owner and mode, holding
/// its entries ([`mirror_entries`]). Made read-only again once the run's
/// points are mounted.
fn mirror_dir(new: &Path, at: &Path) -> std::io::Result<()> {
    // The view shows the image's own directory at the same path (the
    // image is this init's root until the pivot).
    let src = Path::new("/").join(at.strip_prefix("/").unwrap_or(at));
    let dst = under(new, at);
    let meta = std::fs::metadata(&src)?;
    let opts = format!(
        "size=1m,mode={:o},uid={},gid={}",
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
        std::os::unix::fs::MetadataExt::uid(&meta),
        std::os::unix::fs::MetadataExt::gid(&meta),
    );
    mount(
        "tmpfs",
        &dst,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        opts.as_str(),
    )
    .map_err(|e| io_err(&format!("mirror of {}", at.display()), e))?;
    mirror_entries(&src, &dst, &[])
}

/// A step of a path being resolved.
enum Step {
    Root,
    Up,
    Name(std::ffi::OsString),
}

fn steps(p: &Path) -> impl DoubleEndedIterator<Item = Step> + '_ {
    use std::path::Component;
    p.components().filter_map(|c| match c {
        Component::RootDir => Some(Step::Root),
        Component::ParentDir => Some(Step::Up),
        Component::Normal(n) => Some(Step::Name(n.to_owned())),
        Component::CurDir | Component::Prefix(_) => None,
    })
}

/// As many symbolic links as a resolution follows (Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The view's path `path` resolved as the agent will resolve it once `new`
/// is its root: a symbolic link of the image (`/var/run` → `/run`) is
/// followed inside `new`, an absolute target from `new`, never from this
/// init's root. Returns the longest part that exists, resolved (a path of
/// the view, a directory), and the names after it that do not exist.
fn resolve(new: &Path, path: &Path) -> std::io::Result<(PathBuf, Vec<std::ffi::OsString>)> {
    let what = path.display().to_string();
    let mut todo: std::collections::VecDeque<Step> = steps(path).collect();
    let mut at = PathBuf::from("/");
    let mut links = 0;
    while let Some(step) = todo.pop_front() {
        let name = match step {
            Step::Root => {
                at = PathBuf::from("/");
                continue;
            }
            Step::Up => {
                at.pop();
                continue;
            }
            Step::Name(n) => n,
        };
        let next = at.join(&name);
        match std::fs::symlink_metadata(under(new, &next)) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io_err(&what, "too many symbolic links in the guest"));
                }
                let target = std::fs::read_link(under(new, &next))?;
                for s in steps(&target).rev() {
                    todo.push_front(s);
                }
            }
            Ok(meta) if meta.is_dir() => at = next,
            Ok(_) => return Err(io_err(&what, "not a directory in the guest")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut missing = vec![name];
                for s in todo {
                    match s {
                        Step::Name(n) => missing.push(n),
                        // Nothing here exists to go back up through.
                        Step::Root | Step::Up => {
                            return Err(io_err(&what, "not a plain path"));
                        }
                    }
                }
                return Ok((at, missing));
            }
            Err(e) => return Err(io_err(&what, e)),
        }
    }
    Ok((at, vec![]))
}

/// The mount point of the view's path `path` under `new`, made: its
/// missing directories created where it resolves ([`resolve`]), which
/// must be writable (the root's tmpfs, a mirror, the workspace).
fn make_point(new: &Path, path: &Path) -> std::io::Result<PathBuf> {
    let (at, missing) = resolve(new, path)?;
    let mut point = under(new, &at);
    for name in missing {
        point.push(name);
        std::fs::create_dir(&point)
            .map_err(|e| io_err(&format!("mount point {}", path.display()), e))?;
    }
    Ok(point)
}

/// mount(2) with `data` as the filesystem's options.
fn mount(
    source: impl AsRef<Path>,
    target: impl AsRef<Path>,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> rustix::io::Result<()> {
    let data = std::ffi::CString::new(data).map_err(|_| rustix::io::Errno::INVAL)?;
    let fstype = std::ffi::CString::new(fstype).map_err(|_| rustix::io::Errno::INVAL)?;
    rustix::mount::mount(
        source.as_ref(),
        target.as_ref(),
        fstype.as_c_str(),
        flags,
        Some(data.as_c_str()),
    )
}

/// `/dev/vdX` whose virtio serial is `serial`.
fn disk_with_serial(serial: &str) -> std::io::Result<PathBuf> {
    for e in std::fs::read_dir("/sys/block")?.flatten() {
        let s = std::fs::read_to_string(e.path().join("serial")).unwrap_or_default();
        if s.trim() == serial {
            return Ok(Path::new("/dev").join(e.file_name()));
        }
    }
    Err(io_err("no disk with serial", serial))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the host sends on a stream entered by its acceptor reaches it,
    /// however soon it comes (the stream is entered before its `Open` is
    /// queued); a stream whose carrier ended is forgotten, and a frame for
    /// it or for an unknown id is dropped without harm.
    #[tokio::test]
    async fn a_stream_is_entered_before_the_host_can_answer_it() {
        let streams = Streams::default();
        let (tx, mut rx) = mpsc::channel(mux::STREAM_QUEUE);
        streams.open(1, tx);
        streams
            .route(1, Inbound::Data(Bytes::from_static(b"400")))
            .await;
        streams.route(1, Inbound::Eof).await;
        assert!(matches!(rx.recv().await, Some(Inbound::Data(d)) if &d[..] == b"400"));
        assert!(matches!(rx.recv().await, Some(Inbound::Eof)));
        drop(rx);
        streams.route(9, Inbound::Eof).await;
        let (tx2, _rx2) = mpsc::channel(mux::STREAM_QUEUE);
        streams.open(2, tx2);
        assert_eq!(streams.map().len(), 1, "an ended stream was kept");
    }

    /// A run's path is resolved as the agent will see it once the view is
    /// its root: the image's links followed inside the view (an absolute
    /// one too, never out to this init's own root), the part that exists
    /// told from what must be made; a loop of links and a file on the way
    /// are errors, not a hang or a point made elsewhere.
    #[test]
    fn a_path_resolves_inside_the_view_and_its_point_is_made_there() {
        let outside = tempfile::tempdir().unwrap();
        let view = tempfile::tempdir().unwrap();
        let new = view.path();
        for d in ["usr/lib", "var", "run"] {
            std::fs::create_dir_all(new.join(d)).unwrap();
        }
        std::os::unix::fs::symlink("usr/lib", new.join("lib")).unwrap();
        // An absolute link: "/run" is the view's, not this process's.
        std::os::unix::fs::symlink("/run", new.join("var/run")).unwrap();
        std::os::unix::fs::symlink(outside.path(), new.join("var/out")).unwrap();
        std::os::unix::fs::symlink("../var/b", new.join("var/a")).unwrap();
        std::os::unix::fs::symlink("/var/a", new.join("var/b")).unwrap();
        std::fs::write(new.join("var/file"), "x").unwrap();
        let names = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(Into::into).collect() };

        let (at, missing) = resolve(new, Path::new("/lib/x/y")).unwrap();
        assert_eq!(
            (at, missing),
            (PathBuf::from("/usr/lib"), names(&["x", "y"]))
        );
        let (at, missing) = resolve(new, Path::new("/var/run/agent")).unwrap();
        assert_eq!((at, missing), (PathBuf::from("/run"), names(&["agent"])));
        let (at, missing) = resolve(new, Path::new("/usr/lib")).unwrap();
        assert_eq!((at, missing), (PathBuf::from("/usr/lib"), vec![]));
        // A link to a host path names the view's path of that name: the
        // point is made inside the view, nothing in the host's directory.
        let point = make_point(new, Path::new("/var/out/z")).unwrap();
        assert!(
            point.starts_with(new) && point.is_dir(),
            "{}",
            point.display()
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert!(resolve(new, Path::new("/var/a/x")).is_err(), "a loop");
        assert!(resolve(new, Path::new("/var/file/x")).is_err(), "a file");
        assert!(resolve(new, Path::new("/nope/../x")).is_err());

        let point = make_point(new, Path::new("/var/run/agent/dir")).unwrap();
        assert_eq!(point, new.join("run/agent/dir"));
        assert!(point.is_dir());
        assert_eq!(
            make_point(new, Path::new("/lib/x")).unwrap(),
            new.join("usr/lib/x")
        );
    }
}
