//! Connections proving themselves, bounded: what the rendezvous and the CPU transport's
//! listener accept before a peer has shown it knows the run's secret.
//!
//! Each connection in its handshake holds a descriptor and a thread. Unbounded, about a
//! thousand idle strangers exhaust a process's descriptors and stop the run; so at most
//! [`MAX_PENDING`] are held, the oldest is closed when a newer one needs its place (a rank
//! proves itself in milliseconds: the oldest is the likeliest stranger), and none lives
//! past [`HANDSHAKE`] however slowly its peer drips bytes (each read's own timeout would
//! restart with every byte). A rank whose connection was closed before it was greeted
//! dials again ([`dial_until_greeted`]).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

/// The longest a connection may take to prove itself and say which rank it is.
pub(crate) const HANDSHAKE: Duration = Duration::from_secs(10);

/// The most connections held in their handshake at once.
pub(crate) const MAX_PENDING: usize = 64;

/// Held while a crowd's descriptors are counted ([`idle_crowd`]), so that two crowds (the
/// rendezvous's, the rank listener's tests) are not counted together.
#[cfg(test)]
static COUNTING_DESCRIPTORS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `crowd` idle connections to the listener at `addr`, once they have grown the process's
/// descriptors by at most their own ends, two per unproven connection held
/// ([`MAX_PENDING`]) and some slack; and the guard under which they were counted, held
/// while the test goes on.
#[cfg(test)]
pub(crate) fn idle_crowd(
    addr: std::net::SocketAddr,
    crowd: usize,
) -> (Vec<std::net::TcpStream>, std::sync::MutexGuard<'static, ()>) {
    let alone = COUNTING_DESCRIPTORS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let descriptors = || std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    let before = descriptors();
    let idle: Vec<std::net::TcpStream> = (0..crowd)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect();
    assert_eq!(idle.len(), crowd);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let grown = descriptors() - before;
    assert!(
        grown <= crowd + 2 * MAX_PENDING + 32,
        "{grown} descriptors for {crowd} idle connections"
    );
    (idle, alone)
}

/// Connections in their handshake, oldest first, each with a handle to end it.
pub(crate) struct Pending {
    connections: VecDeque<(u64, TcpStream, Instant)>,
    accepted: u64,
}

impl Pending {
    pub(crate) fn new() -> Pending {
        Pending {
            connections: VecDeque::new(),
            accepted: 0,
        }
    }

    /// Takes every connection `listener` (non-blocking) has waiting, each handshake on a
    /// thread of its own that sends `(number, handshake(stream, from))` to `done`.
    ///
    /// # Errors
    /// An `accept` error that leaves the listener unusable.
    pub(crate) fn accept_all<T: Send + 'static>(
        &mut self,
        listener: &TcpListener,
        done: &Sender<(u64, T)>,
        handshake: impl Fn(TcpStream, SocketAddr) -> T + Clone + Send + 'static,
    ) -> std::io::Result<()> {
        loop {
            match listener.accept() {
                Ok((stream, from)) => self.start(stream, from, done, handshake.clone()),
                Err(e) if can_go_on(&e) => break,
                Err(e) => return Err(e),
            }
        }
        self.expire();
        Ok(())
    }

    fn start<T: Send + 'static>(
        &mut self,
        stream: TcpStream,
        from: SocketAddr,
        done: &Sender<(u64, T)>,
        handshake: impl FnOnce(TcpStream, SocketAddr) -> T + Send + 'static,
    ) {
        if self.connections.len() >= MAX_PENDING {
            if let Some((_, oldest, _)) = self.connections.pop_front() {
                let _ = oldest.shutdown(std::net::Shutdown::Both);
            }
        }
        let Ok(handle) = stream.try_clone() else {
            // No descriptor for the handle: turned away (closed) like a stranger.
            return;
        };
        let number = self.accepted;
        self.accepted += 1;
        self.connections.push_back((number, handle, Instant::now()));
        let done = done.clone();
        std::thread::spawn(move || {
            let _ = done.send((number, handshake(stream, from)));
        });
    }

    /// The handshake numbered `number` ended.
    pub(crate) fn ended(&mut self, number: u64) {
        self.connections.retain(|(n, _, _)| *n != number);
    }

    /// Ends the handshakes older than [`HANDSHAKE`]: their threads see the connection
    /// closed and report it refused.
    fn expire(&mut self) {
        while let Some((_, oldest, at)) = self.connections.front() {
            if at.elapsed() < HANDSHAKE {
                break;
            }
            let _ = oldest.shutdown(std::net::Shutdown::Both);
            self.connections.pop_front();
        }
    }
}

/// Whether an `accept` error leaves the listener usable: nothing waiting, out of
/// descriptors for now (they come back as handshakes end), a connection reset before it
/// was taken, a signal.
fn can_go_on(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted, WouldBlock};
    // EMFILE and ENFILE, which std names no kind for.
    matches!(
        e.kind(),
        WouldBlock | Interrupted | ConnectionAborted | ConnectionReset
    ) || matches!(e.raw_os_error(), Some(23 | 24))
}

/// A connection to `addr` whose listener has greeted it (sent its first bytes), dialled
/// again until `deadline` while the listener is not there yet or closes the connection
/// unread ([`Pending`] crowded by strangers). At the deadline, the last connection as it
/// is, for the handshake to fail on with its own words.
///
/// # Errors
/// `addr` cannot be reached by the deadline.
pub(crate) fn dial_until_greeted(
    addr: &SocketAddr,
    deadline: Instant,
) -> std::io::Result<TcpStream> {
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(addr, left.min(Duration::from_secs(1))) {
            Ok(stream) => {
                stream.set_read_timeout(Some(left))?;
                let greeted = stream.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0);
                if greeted || Instant::now() >= deadline {
                    return Ok(stream);
                }
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
