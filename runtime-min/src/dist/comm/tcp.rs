//! The TCP transport between CPU ranks in different processes.
//!
//! Every pair of ranks shares one connection (the higher rank dials the lower, after the
//! rendezvous told everyone where each listens). A reader thread per connection decodes
//! frames into the process's mailboxes and collective slots; a connection that closes
//! before its rank said it was done fails the world at once, so a killed process stops
//! the others without waiting for the timeout.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::mailbox::{Frame, Shared};
use super::CommError;
use crate::dist::auth::{self, Secret};
use crate::dist::pending::{dial_until_greeted, Pending, HANDSHAKE};
use crate::dist::DistError;
use crate::dist::{rendezvous, Placement};

const HELLO: &[u8; 8] = b"RALPCNT1";
/// Bounds what a length field may claim before anything is allocated for it.
const MAX_VALUES: u64 = 1 << 34;

impl Frame {
    fn encode(&self) -> Vec<u8> {
        let values = |out: &mut Vec<u8>, data: &[f32]| {
            out.extend((data.len() as u64).to_le_bytes());
            out.reserve(data.len() * 4);
            for v in data {
                out.extend(v.to_le_bytes());
            }
        };
        let mut out = Vec::new();
        match self {
            Frame::Message { tag, data } => {
                out.push(0);
                out.extend(tag.to_le_bytes());
                values(&mut out, data);
            }
            Frame::Collective { members, seq, data } => {
                out.push(1);
                out.extend((members.len() as u32).to_le_bytes());
                for m in members {
                    out.extend(m.to_le_bytes());
                }
                out.extend(seq.to_le_bytes());
                values(&mut out, data);
            }
            Frame::Done => out.push(2),
            Frame::Abort(why) => {
                out.push(3);
                out.extend((why.len() as u32).to_le_bytes());
                out.extend(why.as_bytes());
            }
        }
        out
    }

    /// The next frame, `None` at a clean end of stream.
    fn decode(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
        let mut kind = [0u8];
        if r.read(&mut kind)? == 0 {
            return Ok(None);
        }
        let u32_ = |r: &mut dyn Read| -> std::io::Result<u32> {
            let mut b = [0; 4];
            r.read_exact(&mut b)?;
            Ok(u32::from_le_bytes(b))
        };
        let u64_ = |r: &mut dyn Read| -> std::io::Result<u64> {
            let mut b = [0; 8];
            r.read_exact(&mut b)?;
            Ok(u64::from_le_bytes(b))
        };
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let values = |r: &mut dyn Read| -> std::io::Result<Vec<f32>> {
            let n = u64_(r)?;
            if n > MAX_VALUES {
                return Err(bad(format!("a frame of {n} values")));
            }
            // Grown as the bytes arrive: a length claimed but never sent allocates nothing.
            let mut bytes = Vec::new();
            (&mut *r).take(n * 4).read_to_end(&mut bytes)?;
            if bytes.len() as u64 != n * 4 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        Ok(Some(match kind[0] {
            0 => Frame::Message {
                tag: u64_(r)?,
                data: values(r)?,
            },
            1 => {
                let n = u32_(r)?;
                if n > 1 << 20 {
                    return Err(bad(format!("a group of {n} ranks")));
                }
                let members = (0..n).map(|_| u32_(r)).collect::<Result<_, _>>()?;
                Frame::Collective {
                    members,
                    seq: u64_(r)?,
                    data: values(r)?,
                }
            }
            2 => Frame::Done,
            3 => {
                let n = u32_(r)?;
                let mut text = vec![0; n.min(1 << 16) as usize];
                r.read_exact(&mut text)?;
                Frame::Abort(String::from_utf8_lossy(&text).into_owned())
            }
            k => return Err(bad(format!("unknown frame kind {k}"))),
        }))
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// A call from a higher rank: its proof of the secret, then its rank.
fn answer(
    mut stream: TcpStream,
    secret: &Secret,
    me: u32,
    world: u32,
) -> Result<(u32, TcpStream), DistError> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(HANDSHAKE)))
        .and_then(|()| stream.set_write_timeout(Some(HANDSHAKE)))
        .map_err(DistError::io("cannot configure the connection"))?;
    auth::accept(&mut stream, secret)?;
    let mut hello = [0u8; 12];
    stream
        .read_exact(&mut hello)
        .map_err(DistError::io("it said nothing"))?;
    let r = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    if &hello[..8] != HELLO || r <= me || r >= world {
        return Err(DistError::Refused(
            "it is not one of this run's ranks".into(),
        ));
    }
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(None))
        .map_err(DistError::io("cannot configure the connection"))?;
    Ok((r, stream))
}

/// Rank `me` dials rank `r` at `addr` (again while its listener, crowded by strangers,
/// closes the connection before it greets it), proves itself and says who it is.
fn dial(
    addr: &SocketAddr,
    secret: &Secret,
    (me, r): (u32, usize),
    deadline: Instant,
) -> Result<TcpStream, DistError> {
    let mut stream = dial_until_greeted(addr, deadline).map_err(DistError::io(format!(
        "rank {me} cannot reach rank {r} at {addr}"
    )))?;
    stream
        .set_read_timeout(Some(remaining(deadline)))
        .map_err(fail("cannot configure a connection"))?;
    auth::call(&mut stream, secret)
        .map_err(|e| e.within(format!("rank {me} cannot join rank {r} at {addr}")))?;
    let mut hello = HELLO.to_vec();
    hello.extend(me.to_le_bytes());
    stream
        .write_all(&hello)
        .map_err(fail("cannot greet a rank"))?;
    stream
        .set_read_timeout(None)
        .map_err(fail("cannot configure a connection"))?;
    Ok(stream)
}

/// Rank `me` of `world` takes the calls of every higher rank on `listener` into `streams`,
/// each proving itself on its own thread: a stranger (or a silent connection) is refused
/// and logged, at most [`crate::dist::pending::MAX_PENDING`] unproven ones are held, and
/// the run goes on.
fn take_calls(
    listener: &TcpListener,
    secret: &Secret,
    (me, world): (u32, u32),
    deadline: Instant,
    streams: &mut [Option<TcpStream>],
) -> Result<(), DistError> {
    listener
        .set_nonblocking(true)
        .map_err(fail("cannot poll for the other ranks"))?;
    let (called, calls) = std::sync::mpsc::channel::<(u64, Result<(u32, TcpStream), DistError>)>();
    let mut pending = Pending::new();
    let mut expected = world.saturating_sub(me + 1) as usize;
    while expected > 0 {
        let (secret, ranks) = (secret.clone(), world);
        pending
            .accept_all(listener, &called, move |stream, from| {
                answer(stream, &secret, me, ranks)
                    .map_err(|e| e.within(format!("refused a connection from {from}")))
            })
            .map_err(fail("cannot accept a rank"))?;
        while let Ok((number, call)) = calls.try_recv() {
            pending.ended(number);
            match call {
                Ok((r, stream)) => {
                    if streams[r as usize].replace(stream).is_some() {
                        return Err(DistError::Protocol(format!("rank {r} connected twice")));
                    }
                    expected -= 1;
                }
                Err(why) => eprintln!("rank {me}: {}", why.chain()),
            }
        }
        if expected > 0 {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = (me as usize + 1..world as usize)
                    .filter(|&r| streams[r].is_none())
                    .collect();
                return Err(DistError::Timeout {
                    waiting: format!("rank {me}"),
                    missing,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(())
}

/// This process's connections to every other rank.
pub struct Net {
    rank: u32,
    /// Per rank, the writing half of its connection (none for this rank).
    peers: Vec<Option<Mutex<BufWriter<TcpStream>>>>,
}

fn fail(what: &str) -> impl FnOnce(std::io::Error) -> DistError + '_ {
    DistError::io(what)
}

impl Net {
    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Meets the other ranks and connects to each; frames from them go to `shared`.
    pub(super) fn connect(
        placement: &Placement,
        timeout: Duration,
        shared: Arc<Shared>,
    ) -> Result<Net, DistError> {
        let deadline = Instant::now() + timeout;
        let me = placement.rank;
        let ip = rendezvous::listen_ip(placement, rendezvous::master_addr(placement)?);
        let listener =
            TcpListener::bind((ip, 0)).map_err(fail("cannot listen for the other ranks"))?;
        let port = listener
            .local_addr()
            .map_err(fail("cannot listen for the other ranks"))?
            .port();
        let blobs = rendezvous::all_gather(placement, timeout, |ip| {
            SocketAddr::new(ip, port).to_string().into_bytes()
        })?;
        // The rendezvous refuses a multi-process run without one.
        let secret = placement
            .secret
            .clone()
            .ok_or_else(|| DistError::Environment(format!("{} is not set", auth::TOKEN_VAR)))?;
        let addrs: Vec<SocketAddr> = blobs
            .iter()
            .enumerate()
            .map(|(r, b)| {
                String::from_utf8_lossy(b).parse().map_err(|_| {
                    DistError::Protocol(format!("rank {r} sent no address to reach it at"))
                })
            })
            .collect::<Result<_, _>>()?;
        let world = placement.world as usize;
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        // Dial every lower rank (again while its listener, crowded by strangers, closes
        // the connection before it greets it)…
        for (r, addr) in addrs.iter().enumerate().take(me as usize) {
            streams[r] = Some(dial(addr, &secret, (me, r), deadline)?);
        }
        // …and take the calls of every higher one.
        take_calls(
            &listener,
            &secret,
            (me, placement.world),
            deadline,
            &mut streams,
        )?;
        let mut peers = Vec::with_capacity(world);
        for (r, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                peers.push(None);
                continue;
            };
            stream
                .set_read_timeout(None)
                .and_then(|()| stream.set_nodelay(true))
                .map_err(fail("cannot configure a connection"))?;
            let reader = stream
                .try_clone()
                .map_err(fail("cannot read a connection"))?;
            let shared = shared.clone();
            let from = r as u32;
            std::thread::Builder::new()
                .name(format!("ralpc-net-{from}"))
                .spawn(move || {
                    let mut reader = BufReader::with_capacity(1 << 20, reader);
                    loop {
                        match Frame::decode(&mut reader) {
                            Ok(Some(frame)) => shared.deliver(from, me, frame),
                            Ok(None) => return shared.lost(from, "closed"),
                            Err(e) => return shared.lost(from, &e.to_string()),
                        }
                    }
                })
                .map_err(fail("cannot start a reader thread"))?;
            peers.push(Some(Mutex::new(BufWriter::with_capacity(1 << 20, stream))));
        }
        Ok(Net { rank: me, peers })
    }

    /// Sends `frame` to rank `to`.
    pub(super) fn send(&self, to: u32, frame: &Frame) -> Result<(), CommError> {
        let broken = |why: String| CommError::Disconnected {
            rank: self.rank,
            peer: to,
            why,
        };
        let Some(Some(peer)) = self.peers.get(to as usize) else {
            return Err(broken("does not exist: it is not a peer".into()));
        };
        let mut peer = peer.lock().unwrap_or_else(|p| p.into_inner());
        peer.write_all(&frame.encode())
            .and_then(|()| peer.flush())
            .map_err(|e| broken(format!("broke: {e}")))
    }

    /// Sends `frame` to every other rank, ignoring broken connections (used to spread a
    /// failure: the ranks it cannot reach are gone already).
    pub(super) fn broadcast(&self, frame: &Frame) {
        for to in 0..self.peers.len() as u32 {
            if to != self.rank {
                let _ = self.send(to, frame);
            }
        }
    }
}

impl Drop for Net {
    /// Closes every connection (the reader threads hold copies of the sockets, which
    /// would keep them open): the others learn at once that this rank is gone.
    fn drop(&mut self) {
        for peer in self.peers.iter().flatten() {
            let mut peer = peer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = peer.flush();
            let _ = peer.get_ref().shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever a peer sends, decoding ends in frames or an error, never a panic or a
        /// huge allocation.
        #[test]
        fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let mut r = &bytes[..];
            for _ in 0..64 {
                match Frame::decode(&mut r) {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Message {
                tag: 7,
                data: vec![1.0, -0.0, f32::NAN, 3.5],
            },
            Frame::Collective {
                members: vec![0, 2, 5],
                seq: 9,
                data: vec![],
            },
            Frame::Done,
            Frame::Abort("rank 3 panicked".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut r = &bytes[..];
        for f in &frames {
            let got = Frame::decode(&mut r).unwrap().unwrap();
            // NaN != NaN: compare the bytes.
            assert_eq!(got.encode(), f.encode());
        }
        assert!(Frame::decode(&mut r).unwrap().is_none());
        let mut junk: &[u8] = &[9, 1, 2];
        assert!(Frame::decode(&mut junk).is_err());
        let mut huge: &[u8] = &[
            0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255,
        ];
        assert!(Frame::decode(&mut huge).is_err());
    }

    /// The rank-to-rank listener, like the rendezvous, holds a crowd of idle strangers
    /// (who learnt its port) to the shared bound on unproven connections, and its rank's
    /// call still gets through at once.
    #[test]
    fn a_crowd_of_idle_strangers_cannot_starve_the_rank_listener() {
        let secret = Secret::new("a test token of 32 characters ok").expect("a secret");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let deadline = Instant::now() + Duration::from_secs(20);
        let crowd = 600;
        std::thread::scope(|s| {
            let rank0 = s.spawn(|| {
                let mut streams: Vec<Option<TcpStream>> = vec![None, None];
                take_calls(&listener, &secret, (0, 2), deadline, &mut streams).map(|()| streams)
            });
            let (idle, _alone) = crate::dist::pending::idle_crowd(addr, crowd);
            let started = Instant::now();
            let _mine = dial(&addr, &secret, (1, 0), deadline).expect("rank 1 dials rank 0");
            let streams = rank0
                .join()
                .expect("rank 0")
                .expect("rank 0 takes the call");
            assert!(started.elapsed() < HANDSHAKE / 2, "{:?}", started.elapsed());
            assert!(streams[1].is_some());
            drop(idle);
        });
    }

    /// Sending to a rank whose connection is closed, or to no rank at all, is a typed
    /// error naming both ranks.
    #[test]
    fn a_broken_connection_names_both_ranks() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let stream = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        drop(listener.accept().expect("accept"));
        stream.shutdown(std::net::Shutdown::Both).expect("shutdown");
        let net = Net {
            rank: 0,
            peers: vec![None, Some(Mutex::new(BufWriter::new(stream)))],
        };
        let frame = Frame::Message {
            tag: 1,
            data: vec![1.0],
        };
        for to in [1, 5] {
            match net.send(to, &frame) {
                Err(CommError::Disconnected { rank: 0, peer, .. }) => assert_eq!(peer, to),
                other => panic!("sending to rank {to}: {other:?}"),
            }
        }
    }
}
