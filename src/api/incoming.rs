//! The accept loop: accepted sockets with TCP_NODELAY, and a pause when accepting fails for lack
//! of resources.
//!
//! tonic's `TcpIncoming` hands every accept error to the server, which logs it at trace level and
//! polls again at once. When the process is out of file descriptors (EMFILE, or ENFILE for the
//! whole system) the pending connection stays in the backlog, the listen socket stays readable,
//! and that loop burns a whole core doing nothing (9.8 s of CPU in 10 s under `ulimit -n 256` with
//! 400 sockets open). Here such an error pauses accepting with a capped exponential backoff
//! ([`FIRST_PAUSE`] doubling to [`LONGEST_PAUSE`]) while the open connections keep being served,
//! and is logged once per episode, with how long it lasted and how many errors it saw when
//! accepting works again.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::Stream;

/// First pause after an accept fails for lack of resources.
pub const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// Longest pause: a freed descriptor is picked up within this long.
pub const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Accepted connections of `listener`, with TCP_NODELAY set and accept errors handled as the
/// module doc says.
pub struct BackoffIncoming {
    listener: TcpListener,
    /// Armed while accepting is paused.
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    next_pause: Duration,
    episode: Option<Episode>,
    /// Names this listener in the log (`main`, `health`).
    name: &'static str,
}

/// An unbroken run of resource errors.
struct Episode {
    started: Instant,
    errors: u64,
}

impl BackoffIncoming {
    pub fn new(listener: TcpListener, name: &'static str) -> Self {
        Self {
            listener,
            pause: None,
            next_pause: FIRST_PAUSE,
            episode: None,
            name,
        }
    }

    fn on_accepted(&mut self) {
        self.next_pause = FIRST_PAUSE;
        if let Some(episode) = self.episode.take() {
            tracing::warn!(
                listener = self.name,
                errors = episode.errors,
                paused_ms = episode.started.elapsed().as_millis() as u64,
                "accepting connections again"
            );
        }
    }

    fn on_resource_error(&mut self, error: &io::Error) {
        match &mut self.episode {
            Some(episode) => episode.errors += 1,
            None => {
                tracing::error!(
                    listener = self.name,
                    %error,
                    open_file_limit = open_file_limit().unwrap_or(0),
                    "cannot accept connections: out of file descriptors or memory; pausing \
                     accepts (open connections are still served). Raise `ulimit -n` (see README)"
                );
                self.episode = Some(Episode {
                    started: Instant::now(),
                    errors: 1,
                });
            }
        }
        self.pause = Some(Box::pin(tokio::time::sleep(self.next_pause)));
        self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
    }
}

/// Errors that concern one connection only (the peer gave up before it was accepted): the next
/// accept may well succeed, so no pause.
fn concerns_one_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

impl Stream for BackoffIncoming {
    type Item = io::Result<TcpStream>;

    fn poll_next(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                if pause.as_mut().poll(context).is_pending() {
                    return Poll::Pending;
                }
                self.pause = None;
            }
            match self.listener.poll_accept(context) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, _))) => {
                    self.on_accepted();
                    // Without TCP_NODELAY, Nagle holds back a response's last frames for the
                    // client's delayed ACK and every unary call takes ~40 ms on Linux.
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::warn!(%error, "cannot set TCP_NODELAY");
                    }
                    return Poll::Ready(Some(Ok(stream)));
                }
                Poll::Ready(Err(error)) if concerns_one_connection(&error) => {
                    tracing::debug!(%error, listener = self.name, "a connection failed before it was accepted");
                }
                // EMFILE, ENFILE, ENOBUFS, ENOMEM and anything unexpected: pause. Polling again
                // at once would only meet the same error.
                Poll::Ready(Err(error)) => self.on_resource_error(&error),
            }
        }
    }
}

/// Warns when the open-file limit leaves too little room for what was configured: the
/// collections just opened hold the descriptors in use now, their merges and new segments may open
/// as many again, and each of up to `connections` clients holds one (the README's "File
/// descriptors" arithmetic). Says nothing on a machine whose limit is enough, however low.
pub fn check_open_file_room(connections: usize) {
    let (Some(limit), Some(in_use)) = (open_file_limit(), open_descriptors()) else {
        return;
    };
    let needed = 2 * in_use + connections as u64;
    if limit < needed {
        tracing::warn!(
            open_file_limit = limit,
            in_use,
            needed,
            "the open file limit leaves too little room: the collections hold {in_use} descriptors \
             (merges may open as many again) and each client connection holds one; raise \
             `ulimit -n` (see README, File descriptors)"
        );
    }
}

/// Descriptors this process holds now (Linux's `/proc/self/fd`), if they can be counted.
fn open_descriptors() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(entries.count() as u64)
}

/// The soft limit on open file descriptors (`ulimit -n`), if it can be read.
pub fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` only writes the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (read == 0).then_some(limit.rlim_cur)
}

/// Raises the soft limit on open file descriptors to the hard limit, as Go and the JVM do at start:
/// container runtimes and systemd often give a soft limit of 1024 under a far higher hard one, and
/// a server holds one descriptor per connection. Returns `(soft before, soft now)`.
pub fn raise_open_file_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok((before, before));
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: `setrlimit` only reads the struct it is given; raising the soft limit up to the
    // hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((before, raised.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn accepted_connections_come_with_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut incoming = BackoffIncoming::new(listener, "test");
        let _client = TcpStream::connect(address).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }

    #[test]
    fn pauses_double_up_to_the_cap_and_reset_on_success() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut incoming = BackoffIncoming::new(listener, "test");
            let error = io::Error::from_raw_os_error(24); // EMFILE
            let mut pauses = Vec::new();
            for _ in 0..10 {
                pauses.push(incoming.next_pause);
                incoming.on_resource_error(&error);
            }
            assert_eq!(pauses[0], FIRST_PAUSE);
            assert_eq!(pauses[1], FIRST_PAUSE * 2);
            assert_eq!(*pauses.last().unwrap(), LONGEST_PAUSE);
            assert_eq!(incoming.episode.as_ref().unwrap().errors, 10);
            incoming.on_accepted();
            assert_eq!(incoming.next_pause, FIRST_PAUSE);
            assert!(incoming.episode.is_none());
        });
    }

    #[test]
    fn only_per_connection_errors_skip_the_pause() {
        assert!(concerns_one_connection(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        assert!(!concerns_one_connection(&io::Error::from_raw_os_error(24)));
        assert!(!concerns_one_connection(&io::Error::from_raw_os_error(23)));
    }
}
