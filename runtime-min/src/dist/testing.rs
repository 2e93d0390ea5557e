//! What the tests of ranks meeting over TCP share (this crate's and ralpc's).

use super::{Launcher, Placement};

/// A port free on the loopback interface now, below the kernel's range of ephemeral ports
/// (32768 and up on Linux), so that no connection's local port takes it before a rank binds
/// it; each call in a process starts at a new port, so parallel tests get different ones.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const PORTS: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919);
    (0..PORTS)
        .map(|_| FIRST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % PORTS)
        .find_map(|port| {
            let port = u16::try_from(port).ok()?;
            std::net::TcpListener::bind(("127.0.0.1", port)).ok()?;
            Some(port)
        })
        .expect("a free port")
}

/// Rank `rank` of `world`, meeting at `port` on the loopback interface, all on one machine
/// (`torchrun`'s variables) with a secret.
pub fn placement(rank: u32, world: u32, port: u16) -> Placement {
    Placement {
        rank,
        world,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        launcher: Launcher::Torchrun,
        secret: Some(super::auth::Secret::new("a test run's secret").expect("a secret")),
    }
}
