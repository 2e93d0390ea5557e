//! What the tests of ranks meeting over TCP share.

use super::{Launcher, Placement};

/// A port free on the loopback interface now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Rank `rank` of `world`, meeting at `port` on the loopback interface, all on one machine
/// (`torchrun`'s variables) with a secret.
pub(crate) fn placement(rank: u32, world: u32, port: u16) -> Placement {
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
