//! The TCP rendezvous of a multi-process run: rank 0 listens on the master address, every
//! other rank connects, and each process gets every rank's blob (an NCCL unique id, the
//! address a rank's CPU transport listens on).
//!
//! Every connection first proves it knows the run's secret ([`super::auth`]); one that
//! does not — an impostor, a port scanner, an idle connection — is refused and logged
//! on its own thread, and the run goes on. The exchange is bounded by a timeout and
//! checks what the ranks tell it: ranks of one world, each once, all agreeing on the
//! world size; anything else is an error naming the rank.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::auth::{self, Secret, TOKEN_VAR};
use super::env::Placement;
use super::pending::{dial_until_greeted, Pending, HANDSHAKE};
use super::DistError;

const MAGIC: &[u8; 8] = b"RALPCRV1";
/// Blobs are small (addresses, 128-byte ids): a larger length is a stranger talking.
const MAX_BLOB: u32 = 1 << 16;

/// Every rank's blob, in rank order, once all `placement.world` ranks have joined.
///
/// `blob` is called with the address this process is reached at (the one it reached
/// rank 0 from; for rank 0, the master address).
///
/// # Errors
/// The master cannot be reached or bound, a rank is missing at the timeout, or a peer
/// sent something that is not this protocol.
pub fn all_gather(
    placement: &Placement,
    timeout: Duration,
    blob: impl FnOnce(IpAddr) -> Vec<u8>,
) -> Result<Vec<Vec<u8>>, DistError> {
    let deadline = Instant::now() + timeout;
    let master = master_addr(placement)?;
    if placement.world == 1 {
        return Ok(vec![blob(master.ip())]);
    }
    secret_of(placement)?;
    if placement.rank == 0 {
        serve(placement, master, deadline, blob(master.ip()))
    } else {
        join(placement, master, deadline, blob)
    }
}

/// The address a rank listens on: the master's own when the run is told a loopback
/// address (`127.0.0.1`, `::1`, `localhost`): a one-machine run stays unreachable from
/// others. Otherwise every interface — every connection proves the run's secret anyway,
/// and a host name can resolve differently on rank 0's machine (Debian maps its own name
/// to 127.0.1.1) than on the others.
pub fn listen_ip(p: &Placement, master: SocketAddr) -> IpAddr {
    let named_loopback =
        p.master_addr.parse::<IpAddr>().is_ok() || p.master_addr.eq_ignore_ascii_case("localhost");
    if master.ip().is_loopback() && named_loopback {
        master.ip()
    } else if master.is_ipv4() {
        IpAddr::from([0, 0, 0, 0])
    } else {
        IpAddr::from([0u16; 8])
    }
}

/// The master's socket address.
///
/// # Errors
/// The name does not resolve.
pub fn master_addr(p: &Placement) -> Result<SocketAddr, DistError> {
    (p.master_addr.as_str(), p.master_port)
        .to_socket_addrs()
        .map_err(DistError::io(format!(
            "cannot resolve MASTER_ADDR '{}'",
            p.master_addr
        )))?
        .next()
        .ok_or_else(|| {
            DistError::Environment(format!("MASTER_ADDR '{}' has no address", p.master_addr))
        })
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> DistError + '_ {
    DistError::io(format!("rendezvous: {what}"))
}

/// The run's secret, which a multi-process run must have.
fn secret_of(p: &Placement) -> Result<&Secret, DistError> {
    p.secret.as_ref().ok_or_else(|| {
        DistError::Environment(format!(
            "{TOKEN_VAR} is not set: the ranks of a run prove to each other that they know \
             this secret, so that nobody else who reaches their ports can join. `ralpc \
             launch` sets it; under torchrun, srun or mpirun export the same value to every \
             rank, e.g. {TOKEN_VAR}=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')"
        ))
    })
}

/// What a connection to rank 0 turned out to be, by the number it was accepted as.
type Joined = (
    u64,
    Result<(u32, Vec<u8>, TcpStream), (SocketAddr, DistError)>,
);

/// The handshake of one connection: the secret's challenge, then the hello. On its own
/// thread; [`Pending`] ends it at [`HANDSHAKE`] however slowly its peer drips bytes.
fn handshake(
    mut stream: TcpStream,
    from: SocketAddr,
    secret: &Secret,
    world: u32,
) -> Result<(u32, Vec<u8>, TcpStream), (SocketAddr, DistError)> {
    let fail = |e: DistError| (from, e);
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(HANDSHAKE)))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE)))
        .map_err(|e| fail(DistError::io("cannot configure the connection")(e)))?;
    auth::accept(&mut stream, secret).map_err(fail)?;
    let (rank, data) = read_hello(&mut stream, world).map_err(fail)?;
    Ok((rank, data, stream))
}

/// The variable by which `ralpc launch` hands rank 0 the socket it bound for the
/// rendezvous, a file descriptor left open across `exec`. A port picked, released and bound
/// again by rank 0 could be taken in between (any connection's local port comes from the
/// same range); a socket handed over cannot.
pub const LISTENER_FD_VAR: &str = "RALPC_RENDEZVOUS_FD";

/// The listening socket [`LISTENER_FD_VAR`] hands over, if it listens on `port`: taken at
/// most once per process. A variable naming anything else (a closed descriptor, a file, a
/// socket that does not listen, or listens on another port) is ignored and what it names
/// left open: rank 0 binds the port itself.
fn inherited_listener(port: u16) -> Option<TcpListener> {
    #[cfg(unix)]
    {
        use std::os::fd::FromRawFd as _;
        use std::sync::atomic::{AtomicBool, Ordering};
        static TAKEN: AtomicBool = AtomicBool::new(false);
        let fd: i32 = std::env::var(LISTENER_FD_VAR).ok()?.trim().parse().ok()?;
        if fd <= 2 || !listens(fd) || TAKEN.swap(true, Ordering::SeqCst) {
            return None;
        }
        // SAFETY: `fd` is an open listening socket (`listens`), which the launcher left
        // open for this process alone and closed on its side; the swap above takes it
        // once. Not dropped (closed) unless it is the one asked for.
        let listener = std::mem::ManuallyDrop::new(unsafe { TcpListener::from_raw_fd(fd) });
        match listener.local_addr() {
            Ok(at) if at.port() == port => Some(std::mem::ManuallyDrop::into_inner(listener)),
            _ => None,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = port;
        None
    }
}

/// Whether descriptor `fd` is an open socket that accepts connections.
#[cfg(unix)]
fn listens(fd: i32) -> bool {
    let mut accepting: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `accepting`; on a descriptor that
    // is not an open socket it fails (EBADF, ENOTSOCK) and writes nothing.
    let got = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut accepting as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    got == 0 && accepting != 0
}

fn serve(
    p: &Placement,
    master: SocketAddr,
    deadline: Instant,
    own: Vec<u8>,
) -> Result<Vec<Vec<u8>>, DistError> {
    let secret = secret_of(p)?;
    let listener = match inherited_listener(master.port()) {
        Some(listener) => listener,
        None => TcpListener::bind((listen_ip(p, master), master.port())).map_err(DistError::io(
            format!(
                "rendezvous: rank 0 cannot listen on {master} (another run using MASTER_PORT {}?)",
                master.port()
            ),
        ))?,
    };
    listener
        .set_nonblocking(true)
        .map_err(io("cannot poll the listener"))?;
    let world = p.world as usize;
    let mut blobs: Vec<Option<Vec<u8>>> = vec![None; world];
    blobs[0] = Some(own);
    let mut peers = Vec::with_capacity(world - 1);
    let (joined, arrivals) = std::sync::mpsc::channel::<Joined>();
    let mut pending = Pending::new();
    let mut refused = 0u64;
    while peers.len() < world - 1 {
        let (secret, ranks) = (secret.clone(), p.world);
        pending
            .accept_all(&listener, &joined, move |stream, from| {
                handshake(stream, from, &secret, ranks)
            })
            .map_err(io("accept failed"))?;
        while let Ok((id, arrival)) = arrivals.try_recv() {
            pending.ended(id);
            match arrival {
                Ok((rank, data, stream)) => {
                    let slot = &mut blobs[rank as usize];
                    if slot.is_some() {
                        return Err(DistError::Protocol(format!(
                            "rendezvous: rank {rank} joined twice"
                        )));
                    }
                    *slot = Some(data);
                    peers.push(stream);
                }
                // A stranger is turned away; the run goes on. The first few are named,
                // then every thousandth, so that a flood does not flood the log too.
                Err((from, why)) => {
                    refused += 1;
                    if refused <= 8 || refused % 1000 == 0 {
                        eprintln!(
                            "rendezvous: refused a connection from {from} ({refused} so far): {why}"
                        );
                    }
                }
            }
        }
        if peers.len() < world - 1 {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = (0..world).filter(|&r| blobs[r].is_none()).collect();
                return Err(DistError::Timeout {
                    waiting: "rendezvous".into(),
                    missing,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let blobs: Vec<Vec<u8>> = blobs.into_iter().map(Option::unwrap_or_default).collect();
    let mut reply = MAGIC.to_vec();
    reply.extend((blobs.len() as u32).to_le_bytes());
    for b in &blobs {
        reply.extend((b.len() as u32).to_le_bytes());
        reply.extend(b);
    }
    for mut peer in peers {
        peer.write_all(&reply).map_err(io("cannot answer a rank"))?;
    }
    Ok(blobs)
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_blob(r: &mut impl Read) -> Result<Vec<u8>, DistError> {
    let len = read_u32(r).map_err(DistError::io("no blob's length"))?;
    if len > MAX_BLOB {
        return Err(DistError::Protocol(format!(
            "a blob of {len} bytes is not this protocol"
        )));
    }
    let mut data = vec![0; len as usize];
    r.read_exact(&mut data)
        .map_err(DistError::io("a blob cut short"))?;
    Ok(data)
}

fn read_magic(r: &mut impl Read) -> Result<(), DistError> {
    let mut magic = [0; 8];
    r.read_exact(&mut magic)
        .map_err(DistError::io("no greeting"))?;
    if &magic != MAGIC {
        return Err(DistError::Protocol(
            "not a ralpc rendezvous (wrong magic)".into(),
        ));
    }
    Ok(())
}

/// `magic, world, rank, blob`.
fn read_hello(r: &mut impl Read, world: u32) -> Result<(u32, Vec<u8>), DistError> {
    read_magic(r)?;
    let their_world = read_u32(r).map_err(DistError::io("no world size"))?;
    let rank = read_u32(r).map_err(DistError::io("no rank"))?;
    if their_world != world {
        return Err(DistError::Protocol(format!(
            "rank {rank} says the world has {their_world} ranks, rank 0 says {world}"
        )));
    }
    if rank == 0 || rank >= world {
        return Err(DistError::Protocol(format!(
            "rank {rank} is not a rank of 1..{world}"
        )));
    }
    Ok((rank, read_blob(r)?))
}

fn join(
    p: &Placement,
    master: SocketAddr,
    deadline: Instant,
    blob: impl FnOnce(IpAddr) -> Vec<u8>,
) -> Result<Vec<Vec<u8>>, DistError> {
    // Rank 0 may not be listening yet, or may close a connection before it greets it when
    // strangers crowd its handshakes (`Pending`): both are tried again until the deadline.
    // A refusal after the greeting (a wrong secret) is final.
    let mut stream = dial_until_greeted(&master, deadline).map_err(DistError::io(format!(
        "rendezvous: rank {} cannot reach rank 0 at {master}",
        p.rank
    )))?;
    auth::call(&mut stream, secret_of(p)?).map_err(|e| {
        e.within(format!(
            "rendezvous: rank {} cannot join rank 0 at {master}",
            p.rank
        ))
    })?;
    let own_ip = stream.local_addr().map_err(io("no local address"))?.ip();
    let own = blob(own_ip);
    let mut hello = MAGIC.to_vec();
    hello.extend(p.world.to_le_bytes());
    hello.extend(p.rank.to_le_bytes());
    hello.extend((own.len() as u32).to_le_bytes());
    hello.extend(&own);
    stream
        .write_all(&hello)
        .map_err(io("cannot send to rank 0"))?;
    stream
        .set_read_timeout(Some(remaining(deadline)))
        .map_err(io("cannot configure the connection"))?;
    let answer = (|| {
        read_magic(&mut stream)?;
        let n = read_u32(&mut stream).map_err(DistError::io("no world size"))?;
        if n != p.world {
            return Err(DistError::Protocol(format!(
                "rank 0 answered for {n} ranks, not {}",
                p.world
            )));
        }
        (0..n).map(|_| read_blob(&mut stream)).collect()
    })();
    answer.map_err(|e| {
        e.within(format!(
            "rendezvous: rank {} got no answer from rank 0 (other ranks missing?)",
            p.rank
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::testing::{free_port, placement};

    /// Only a listening socket is taken from the launcher's variable: a file, a socket
    /// that does not listen and a closed descriptor are not.
    #[cfg(unix)]
    #[test]
    fn only_a_listening_socket_is_taken() {
        use std::os::fd::AsRawFd as _;
        let listener = TcpListener::bind("127.0.0.1:0").expect("a socket");
        assert!(listens(listener.as_raw_fd()));
        let stream = std::net::TcpStream::connect(listener.local_addr().expect("its address"))
            .expect("a connection");
        assert!(!listens(stream.as_raw_fd()));
        let file = tempfile::tempfile().expect("a file");
        assert!(!listens(file.as_raw_fd()));
        assert!(!listens(i32::MAX));
    }

    proptest::proptest! {
        /// A hello of any bytes is a rank and a blob or an error, never a panic.
        #[test]
        fn any_hello_is_parsed_or_refused(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut with_magic = MAGIC.to_vec();
            with_magic.extend(&bytes);
            for input in [&bytes[..], &with_magic[..]] {
                let mut r = input;
                if let Ok((rank, _)) = read_hello(&mut r, 4) {
                    proptest::prop_assert!((1..4).contains(&rank));
                }
            }
        }
    }

    #[test]
    fn every_rank_gets_every_blob() {
        let port = free_port();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u32)
                .rev() // rank 0 last: the others wait for it
                .map(|r| {
                    s.spawn(move || {
                        all_gather(&placement(r, 4, port), Duration::from_secs(10), |_| {
                            vec![r as u8; r as usize + 1]
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected: Vec<Vec<u8>> = (0..4u8).map(|r| vec![r; r as usize + 1]).collect();
        for r in results {
            assert_eq!(r.unwrap(), expected);
        }
    }

    #[test]
    fn a_missing_rank_is_named_at_the_timeout() {
        let port = free_port();
        let e = std::thread::scope(|s| {
            let joiner = s.spawn(move || {
                all_gather(
                    &placement(1, 3, port),
                    Duration::from_millis(800),
                    |_| vec![],
                )
            });
            let e = all_gather(
                &placement(0, 3, port),
                Duration::from_millis(500),
                |_| vec![],
            )
            .unwrap_err();
            assert!(joiner.join().unwrap().is_err());
            e
        });
        assert!(
            matches!(&e, DistError::Timeout { missing, .. } if missing == &[2]),
            "{e:?}"
        );
        assert!(e.chain().contains("ranks [2] did not join"), "{e}");
    }

    /// Strangers are turned away and the run goes on: an impostor rank that does not
    /// know the secret, an HTTP request, random bytes, and a connection that says nothing.
    #[test]
    fn strangers_are_refused_and_the_run_goes_on() {
        let port = free_port();
        let results = std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                let _idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let mut http = TcpStream::connect(("127.0.0.1", port)).unwrap();
                http.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
                let mut noise = TcpStream::connect(("127.0.0.1", port)).unwrap();
                noise.write_all(&[0xa5; 100_000]).unwrap_or(());
                let mut impostor = placement(1, 2, port);
                impostor.secret = Some(Secret::new("not the run's secret at all").unwrap());
                let e = all_gather(&impostor, Duration::from_secs(2), |_| b"evil".to_vec());
                assert!(e.is_err(), "the impostor is refused");
                std::thread::sleep(Duration::from_secs(3));
            });
            let rank1 = s.spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                all_gather(&placement(1, 2, port), Duration::from_secs(10), |_| {
                    b"one".to_vec()
                })
            });
            let rank0 = all_gather(&placement(0, 2, port), Duration::from_secs(10), |_| {
                b"zero".to_vec()
            });
            (rank0, rank1.join().unwrap())
        });
        let want = vec![b"zero".to_vec(), b"one".to_vec()];
        assert_eq!(results.0.unwrap(), want);
        assert_eq!(results.1.unwrap(), want);
    }

    /// A crowd of idle connections (each a descriptor and a thread on rank 0) neither
    /// exhausts rank 0's descriptors nor keeps the rank from joining: at most
    /// `MAX_PENDING` are held, the oldest closed for newer ones.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_crowd_of_idle_strangers_cannot_starve_the_rendezvous() {
        let port = free_port();
        let crowd = 600;
        let results = std::thread::scope(|s| {
            let rank0 = s.spawn(move || {
                all_gather(&placement(0, 2, port), Duration::from_secs(20), |_| {
                    b"zero".to_vec()
                })
            });
            std::thread::sleep(Duration::from_millis(100));
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let (idle, _alone) = crate::dist::pending::idle_crowd(addr, crowd);
            let started = Instant::now();
            let rank1 = all_gather(&placement(1, 2, port), Duration::from_secs(20), |_| {
                b"one".to_vec()
            });
            // Well before any stranger's handshake runs out.
            assert!(started.elapsed() < HANDSHAKE / 2, "{:?}", started.elapsed());
            drop(idle);
            (rank0.join().unwrap(), rank1)
        });
        let want = vec![b"zero".to_vec(), b"one".to_vec()];
        assert_eq!(results.0.unwrap(), want);
        assert_eq!(results.1.unwrap(), want);
    }

    #[test]
    fn a_run_without_a_secret_is_refused() {
        let mut p = placement(1, 2, free_port());
        p.secret = None;
        let e = all_gather(&p, Duration::from_secs(1), |_| vec![]).unwrap_err();
        assert!(e.is_environment(), "{e:?}");
        assert!(e.chain().contains("RALPC_RUN_TOKEN is not set"), "{e}");
    }
}
