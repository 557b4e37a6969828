//! The HTTP accept loop: hyper's HTTP/1 server around the axum router, with the limits that
//! keep slow, idle or oversized clients from holding the daemon's memory and file descriptors.
//!
//! hyper's own header-read timer restarts whenever it waits for a head, so it cannot tell a
//! slow head from an idle keep-alive connection; each connection is watched here instead (see
//! `Clock`), and dropping its future closes the socket whatever the client does.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::admit::{Admission, Room, Yield, Yielding};
use super::stats::{Closed, HttpStats};
use super::web_config::WebConfigWatch;

mod settings;
pub use settings::{HttpConfig, InvalidHttp, MIN_HEAD_BYTES};

/// The server's limits, from `[http]` in the config (`HttpConfig`).
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections open at once. One more gets in by closing the one least worth keeping (see
    /// `admit`); when every one serves a peer within its share, it is closed at once.
    pub max_connections: usize,
    /// From a new connection, or from the first byte of a later request, to its complete head.
    pub header_timeout: Duration,
    /// From the end of a response to the first byte of the next request.
    pub idle_timeout: Duration,
    /// Request line plus headers, in bytes (hyper's floor is 8192).
    pub max_head_bytes: usize,
    /// After shutdown begins, how long requests in flight may take before every connection is
    /// dropped.
    pub drain: Duration,
}

/// Serves `router` on `listener` until `shutdown`, then drains for at most `limits.drain`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    stats: Arc<HttpStats>,
    web: Arc<WebConfigWatch>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    // The web config's reloads are part of this server's health, in /metrics beside it.
    if let Some(reloads) = web.reload_stats() {
        stats.attach_web_config(reloads);
    }
    let mut builder = http1::Builder::new();
    builder
        .max_buf_size(limits.max_head_bytes.max(MIN_HEAD_BYTES))
        // Timeouts are kept by `watch`; hyper's timer would need a Timer and misnames idleness.
        .header_read_timeout(None)
        .keep_alive(true);
    let builder = Arc::new(builder);
    let limits = Arc::new(limits);
    let tracker = TaskTracker::new();
    let hard_stop = CancellationToken::new();
    let admission = Arc::new(Admission::default());
    let mut accept_errors = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.ip().to_canonical()),
            Err(e) => {
                accept_errors += 1;
                // Out of fds (or another transient failure): the ingest socket needs them more;
                // back off instead of spinning, and log the first and then every 1000th.
                if accept_errors % 1000 == 1 {
                    tracing::warn!(error = %e, count = accept_errors, "cannot accept an HTTP connection");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        match admission.make_room(limits.max_connections, peer) {
            Room::Free => {}
            Room::Evicted(why) => stats.count_evicted(why),
            Room::Full => {
                // Every slot serves a peer within its share. Closed before anything is read:
                // the cheapest refusal, and one the client sees at once.
                drop(stream);
                stats.count_closed(Closed::OverCap);
                continue;
            }
        }
        let open = stats.opened();
        let clock = Arc::new(Clock::new());
        let (evicted, registered) = admission.register(clock.clone(), peer);
        let (builder, limits, stats) = (builder.clone(), limits.clone(), stats.clone());
        let (router, draining, hard_stop) = (router.clone(), shutdown.clone(), hard_stop.clone());
        let web = web.clone();
        tracker.spawn(async move {
            let ends = Ends {
                draining,
                hard_stop,
                evicted,
            };
            let conn = Peer { ip: peer, clock };
            let why = watch(stream, conn, &builder, router, &limits, &web, ends).await;
            drop(registered);
            stats.count_closed(why);
            drop(open);
        });
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(limits.drain, tracker.wait())
        .await
        .is_err()
    {
        tracing::info!(
            open = stats.open(),
            "HTTP drain deadline passed: closing the connections still open"
        );
        hard_stop.cancel();
        tracker.wait().await;
    }
    Ok(())
}

/// Bytes of output the kernel holds for a client that does not read (Linux doubles it for its
/// bookkeeping). Left alone it autotunes up to `net.ipv4.tcp_wmem`'s maximum, 4 MiB by default:
/// 2 GiB over 512 such clients. A 128 KiB buffer still fills a 10 MB/s link at 25 ms RTT, and
/// a /metrics page at 8 GPUs x 128 processes is 26 KB gzipped.
const SEND_BUFFER: libc::c_int = 128 * 1024;

/// Caps the connection's unread output at `SEND_BUFFER`; past it, writes stall and the
/// connection gives way first at the limit (`Yield::UnreadOutput`). A failure leaves the
/// kernel's default, and is harmless.
fn bound_send_buffer(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size = SEND_BUFFER;
    // SAFETY: the fd is the open socket `stream` owns for the duration of the call, and the
    // option value is a c_int whose size is passed with it.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// How a connection may be told to stop: gracefully (drain), then at once; or at once to make
/// room for a newer one.
struct Ends {
    draining: CancellationToken,
    hard_stop: CancellationToken,
    evicted: CancellationToken,
}

/// Runs one connection to its end and says why it ended: the TLS handshake first when the web
/// config asks for TLS (bounded by the header timeout, like a request head), then HTTP/1.
async fn watch(
    stream: TcpStream,
    peer: Peer,
    builder: &http1::Builder,
    router: Router,
    limits: &HttpLimits,
    web: &WebConfigWatch,
    ends: Ends,
) -> Closed {
    // Small responses go out at once rather than waiting on Nagle; failure changes nothing.
    let _ = stream.set_nodelay(true);
    bound_send_buffer(&stream);
    let io = Watched {
        io: stream,
        clock: peer.clock.clone(),
    };
    let Some(tls) = web.current().tls.clone() else {
        return run(TokioIo::new(io), builder, router, limits, peer, ends).await;
    };
    let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(io);
    let stream = tokio::select! {
        r = handshake => match r {
            Ok(s) => s,
            Err(_) => return Closed::TlsHandshake,
        },
        _ = tokio::time::sleep(limits.header_timeout) => return Closed::TlsHandshake,
        _ = ends.draining.cancelled() => return Closed::Shutdown,
        _ = ends.evicted.cancelled() => return Closed::Evicted,
    };
    run(TokioIo::new(stream), builder, router, limits, peer, ends).await
}

/// Serves HTTP/1 on `io` until the connection ends, is idle or slow past its limits, or the
/// daemon stops.
async fn run<I>(
    io: TokioIo<I>,
    builder: &http1::Builder,
    router: Router,
    limits: &HttpLimits,
    peer: Peer,
    ends: Ends,
) -> Closed
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ends {
        draining,
        hard_stop,
        evicted,
    } = ends;
    let clock = peer.clock.clone();
    let service = Tracked {
        inner: TowerToHyperService::new(router),
        peer,
    };
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut graceful = false;
    loop {
        let (deadline, _) = clock.deadline(limits);
        tokio::select! {
            r = conn.as_mut() => return match r {
                Ok(()) => Closed::Done,
                Err(e) if e.is_parse_too_large() => Closed::TooLarge,
                Err(e) if e.is_parse() => Closed::BadRequest,
                Err(_) => Closed::IoError,
            },
            _ = hard_stop.cancelled() => return Closed::Shutdown,
            _ = evicted.cancelled() => return Closed::Evicted,
            _ = draining.cancelled(), if !graceful => {
                // Finishes the request in flight, then closes; an idle connection closes now.
                conn.as_mut().graceful_shutdown();
                graceful = true;
            }
            _ = clock.moved.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {
                // The deadline moves with activity: close only if it still lies in the past.
                let (now_deadline, now_why) = clock.deadline(limits);
                if now_deadline <= Instant::now() {
                    return now_why;
                }
            }
        }
    }
}

/// What one connection is doing, as its reads, writes and requests show.
struct Clock {
    phase: Mutex<Phase>,
    /// Told when the deadline may have moved earlier (a write stalls, a response is ready), so
    /// the connection's watcher does not sleep on to a later deadline computed before.
    moved: Notify,
}

struct Phase {
    requests: u64,
    in_flight: u32,
    /// When the connection was accepted, or its last response was produced.
    since: Instant,
    /// The first byte of a head not yet complete.
    first_byte: Option<Instant>,
    last_write: Instant,
    /// Since when a write has waited for room in the socket: the client is not reading.
    write_blocked: Option<Instant>,
    /// A request failed basic auth (or was throttled), and none passed since.
    auth_failed: bool,
}

/// A write stalled this long means the client does not read what it asked for: its connection
/// gives way first at the connection limit.
const STALL: Duration = Duration::from_secs(1);

impl Clock {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            phase: Mutex::new(Phase {
                requests: 0,
                in_flight: 0,
                since: now,
                first_byte: None,
                last_write: now,
                write_blocked: None,
                auth_failed: false,
            }),
            moved: Notify::new(),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Phase) -> R) -> R {
        // Nothing panics while holding the lock, so poisoning cannot happen; recover anyway.
        f(&mut self.phase.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn on_read(&self) {
        self.with(|p| {
            if p.in_flight == 0 && p.first_byte.is_none() {
                p.first_byte = Some(Instant::now());
            }
        });
    }

    fn on_write(&self) {
        self.with(|p| {
            p.last_write = Instant::now();
            p.write_blocked = None;
        });
    }

    fn on_write_blocked(&self) {
        let first = self.with(|p| {
            let first = p.write_blocked.is_none();
            p.write_blocked.get_or_insert_with(Instant::now);
            first
        });
        if first {
            self.moved.notify_one();
        }
    }

    fn request_started(&self) {
        self.with(|p| {
            p.requests += 1;
            p.in_flight += 1;
            p.first_byte = None;
        });
    }

    fn request_done(&self) {
        self.with(|p| {
            p.in_flight = p.in_flight.saturating_sub(1);
            p.since = Instant::now();
        });
        self.moved.notify_one();
    }

    /// When the connection is to be closed if nothing changes, and as what. A request in flight
    /// has no deadline here (its handler bounds itself); it is looked at again an idle period on.
    fn deadline(&self, l: &HttpLimits) -> (Instant, Closed) {
        self.with(|p| {
            let now = Instant::now();
            if p.write_blocked.is_some() && p.in_flight == 0 {
                // hyper reads no further request until this response is out, so the
                // client's unread output is bounded by the socket's send buffer; held that
                // long without progress, the connection is closed.
                (p.last_write + l.idle_timeout, Closed::UnreadOutput)
            } else if p.in_flight > 0 {
                (now + l.idle_timeout, Closed::IdleTimeout)
            } else if let Some(first) = p.first_byte {
                (first + l.header_timeout, Closed::HeaderTimeout)
            } else if p.requests == 0 {
                // A connection that never sent a byte gets the header timeout, not the idle one.
                (p.since + l.header_timeout, Closed::HeaderTimeout)
            } else {
                // A slow reader of a large response is not idle while its bytes still go out.
                (
                    p.since.max(p.last_write) + l.idle_timeout,
                    Closed::IdleTimeout,
                )
            }
        })
    }
}

impl Yielding for Clock {
    fn yields(&self) -> Option<Yield> {
        self.with(|p| {
            if p.write_blocked.is_some_and(|t| t.elapsed() >= STALL) {
                return Some(Yield::UnreadOutput);
            }
            if p.auth_failed {
                return Some(Yield::AuthFailed);
            }
            Some(match (p.in_flight, p.requests) {
                (0, 0) => Yield::Unproven,
                // A head half read after a served request is as idle as no head at all.
                (0, _) => Yield::Idle,
                _ => Yield::OverShare,
            })
        })
    }
}

/// The socket, telling the clock about every read and write.
struct Watched {
    io: TcpStream,
    clock: Arc<Clock>,
}

impl Watched {
    fn saw_write(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) if *n > 0 => self.clock.on_write(),
            Poll::Pending => self.clock.on_write_blocked(),
            _ => {}
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.on_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.saw_write(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.saw_write(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The connection a request came on, in its extensions: the guard throttles auth failures by
/// `ip` and marks the connection as one that failed them.
#[derive(Clone)]
pub(super) struct Peer {
    pub ip: IpAddr,
    clock: Arc<Clock>,
}

impl Peer {
    /// Whether the connection's latest credentials failed (it gives way early) or passed.
    pub fn auth_failed(&self, failed: bool) {
        self.clock.with(|p| p.auth_failed = failed);
    }
}

/// The router, telling the clock when a request starts and when its response is ready.
struct Tracked {
    inner: TowerToHyperService<Router>,
    peer: Peer,
}

type Response = axum::response::Response;

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, mut req: hyper::Request<Incoming>) -> Self::Future {
        self.peer.clock.request_started();
        req.extensions_mut().insert(self.peer.clone());
        let done = RequestDone(self.peer.clock.clone());
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(done);
            r
        })
    }
}

/// Ends the request on the clock however its future ends, dropped (client gone) included.
struct RequestDone(Arc<Clock>);

impl Drop for RequestDone {
    fn drop(&mut self) {
        self.0.request_done();
    }
}
