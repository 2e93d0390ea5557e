//! Proving that both ends of a connection belong to the same run: a per-run secret
//! (`RALPC_RUN_TOKEN`, which `ralpc launch` generates and other launchers pass to every
//! rank) and a challenge–response over it, on the rendezvous and on every connection of
//! the CPU transport. Anyone else who can reach a rank's port — an impostor rank, a port
//! scanner, a stray HTTP request — fails the challenge and is turned away.
//!
//! The response is BLAKE3 in keyed mode (a MAC) over both ends' fresh nonces, the key
//! derived from the token; neither the token nor the key crosses the network. The
//! traffic after the handshake is not encrypted (as NCCL's and Gloo's are not).

use std::io::{Read, Write};

use super::DistError;

/// The environment variable holding a run's secret.
pub const TOKEN_VAR: &str = "RALPC_RUN_TOKEN";

/// The fewest characters a token may have.
const MIN_TOKEN: usize = 16;

/// What the accepting end sends first: this protocol and its challenge.
const GREETING: &[u8; 8] = b"RALPCAU1";

/// A run's secret, as the key its handshakes use.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret of `token`.
    ///
    /// # Errors
    /// A token shorter than 16 characters (too easy to guess).
    pub fn new(token: &str) -> Result<Secret, DistError> {
        let token = token.trim();
        if token.chars().count() < MIN_TOKEN {
            return Err(DistError::Environment(format!(
                "{TOKEN_VAR} has {} characters; a run's secret needs at least {MIN_TOKEN}",
                token.chars().count()
            )));
        }
        Ok(Secret {
            key: blake3::derive_key("ralpc 2026-11 run token", token.as_bytes()),
        })
    }

    fn proof(&self, side: &[u8], challenge: &[u8; 32], answer: &[u8; 32]) -> blake3::Hash {
        let mut mac = blake3::Hasher::new_keyed(&self.key);
        mac.update(side).update(challenge).update(answer);
        mac.finalize()
    }
}

/// A fresh token: 32 random bytes, hex.
///
/// # Errors
/// The system has no randomness to give.
pub fn new_token() -> Result<String, DistError> {
    let bytes = random()?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn random() -> Result<[u8; 32], DistError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(DistError::Randomness)?;
    Ok(bytes)
}

fn read32(r: &mut impl Read) -> std::io::Result<[u8; 32]> {
    let mut b = [0u8; 32];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// The accepting end: sends a challenge, checks the caller's answer, answers the
/// caller's. The stream's timeouts bound it.
///
/// # Errors
/// The caller does not answer, answers wrongly (it does not know the secret), or the
/// connection fails.
pub fn accept<S: Read + Write>(stream: &mut S, secret: &Secret) -> Result<(), DistError> {
    let challenge = random()?;
    let mut greeting = GREETING.to_vec();
    greeting.extend(challenge);
    stream
        .write_all(&greeting)
        .map_err(DistError::io("cannot greet it"))?;
    let theirs = read32(stream).map_err(DistError::io("it did not answer"))?;
    let proof = read32(stream).map_err(DistError::io("it did not answer"))?;
    // blake3::Hash compares in constant time.
    if secret.proof(b"caller", &challenge, &theirs) != blake3::Hash::from(proof) {
        return Err(DistError::Refused(format!(
            "it does not know the run's secret ({TOKEN_VAR})"
        )));
    }
    let ours = secret.proof(b"acceptor", &theirs, &challenge);
    stream
        .write_all(ours.as_bytes())
        .map_err(DistError::io("cannot answer it"))
}

/// The calling end: answers the acceptor's challenge and checks its answer to ours.
///
/// # Errors
/// The other end is not a rank of this run (another protocol, or it does not know the
/// secret), or the connection fails.
pub fn call<S: Read + Write>(stream: &mut S, secret: &Secret) -> Result<(), DistError> {
    let mut greeting = [0u8; 8];
    stream
        .read_exact(&mut greeting)
        .map_err(DistError::io("no greeting"))?;
    if &greeting != GREETING {
        return Err(DistError::Refused("it is not a ralpc rank".into()));
    }
    let challenge = read32(stream).map_err(DistError::io("no challenge"))?;
    let ours = random()?;
    let mut answer = ours.to_vec();
    answer.extend(secret.proof(b"caller", &challenge, &ours).as_bytes());
    stream
        .write_all(&answer)
        .map_err(DistError::io("cannot answer"))?;
    let proof = read32(stream).map_err(DistError::io("it refused this rank"))?;
    if secret.proof(b"acceptor", &ours, &challenge) != blake3::Hash::from(proof) {
        return Err(DistError::Refused(format!(
            "it does not know the run's secret ({TOKEN_VAR})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(caller: Secret, acceptor: Secret) -> (Result<(), String>, Result<(), String>) {
        let chain = |r: Result<(), DistError>| r.map_err(|e| e.chain());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::scope(|s| {
            let a = s.spawn(move || {
                let (mut stream, _) = listener.accept().unwrap();
                stream
                    .set_read_timeout(Some(std::time::Duration::from_secs(5)))
                    .unwrap();
                accept(&mut stream, &acceptor)
            });
            let mut stream = TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let c = call(&mut stream, &caller);
            drop(stream);
            (chain(c), chain(a.join().unwrap()))
        })
    }

    #[test]
    fn the_same_secret_passes_and_another_fails_both_ways() {
        let run = Secret::new("0123456789abcdef-run").unwrap();
        let other = Secret::new("0123456789abcdef-other").unwrap();
        let (c, a) = pair(run.clone(), run.clone());
        assert_eq!((c, a), (Ok(()), Ok(())));
        let (_, a) = pair(other, run);
        assert!(a.unwrap_err().contains("does not know the run's secret"));
        assert!(Secret::new("short").is_err());
        assert_eq!(new_token().unwrap().len(), 64);
        assert_ne!(new_token().unwrap(), new_token().unwrap());
    }
}
