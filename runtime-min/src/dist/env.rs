//! A process's place in a multi-process run, read from the environment the way launchers
//! set it: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`),
//! Open MPI (`OMPI_COMM_WORLD_RANK`, `…_SIZE`, `…_LOCAL_RANK`) and Slurm (`SLURM_PROCID`,
//! `SLURM_NTASKS`, `SLURM_LOCALID`, the first host of `SLURM_JOB_NODELIST`).

use super::DistError;

/// Which launcher started the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun, `ralpc launch`, or anything else setting `RANK`/`WORLD_SIZE`.
    Torchrun,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// Slurm's `srun`.
    Slurm,
}

/// This process's rank and where the rendezvous is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The global rank.
    pub rank: u32,
    /// How many processes in all.
    pub world: u32,
    /// The rank among this node's processes: the GPU it uses.
    pub local_rank: u32,
    /// The host rank 0 listens on for the rendezvous.
    pub master_addr: String,
    /// Its port.
    pub master_port: u16,
    /// Who set the variables.
    pub launcher: Launcher,
    /// The run's secret (`RALPC_RUN_TOKEN`), which every connection between ranks proves.
    pub secret: Option<super::auth::Secret>,
}

/// Why [`Placement::read`] failed: a variable (named in the message), or the secret.
enum Unreadable {
    Variable(String),
    Secret(DistError),
}

/// A variable (named in `message`) that is malformed or missing.
fn variable(message: impl Into<String>) -> Unreadable {
    Unreadable::Variable(message.into())
}

/// The rendezvous port when the launcher names none (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

impl Placement {
    /// Reads the process's environment.
    ///
    /// # Errors
    /// A launcher's variables that are malformed or inconsistent, naming the variable.
    pub fn from_env() -> Result<Option<Placement>, DistError> {
        Placement::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the variables `get` returns: `None` when no launcher set them.
    ///
    /// # Errors
    /// As [`Placement::from_env`].
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Placement>, DistError> {
        Placement::read(get).map_err(|e| match e {
            Unreadable::Variable(m) => DistError::Environment(m),
            Unreadable::Secret(e) => e,
        })
    }

    fn read(get: impl Fn(&str) -> Option<String>) -> Result<Option<Placement>, Unreadable> {
        let number = |name: &str| -> Result<Option<u32>, Unreadable> {
            get(name)
                .map(|v| {
                    v.trim().parse::<u32>().map_err(|_| {
                        variable(format!("{name}='{v}' is not a non-negative integer"))
                    })
                })
                .transpose()
        };
        let (launcher, rank, world, local) = if get("RANK").is_some() {
            (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK")
        } else if get("OMPI_COMM_WORLD_RANK").is_some() {
            (
                Launcher::OpenMpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            )
        } else if get("SLURM_PROCID").is_some() {
            (
                Launcher::Slurm,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                "SLURM_LOCALID",
            )
        } else {
            return Ok(None);
        };
        let rank_value = number(rank)?.unwrap_or(0);
        let world_value =
            number(world)?.ok_or_else(|| variable(format!("{rank} is set but {world} is not")))?;
        if rank_value >= world_value {
            return Err(variable(format!(
                "{rank}={rank_value} is not below {world}={world_value}"
            )));
        }
        let local_rank = number(local)?.unwrap_or(0);
        let master_addr = match get("MASTER_ADDR") {
            Some(a) if !a.trim().is_empty() => a.trim().to_owned(),
            _ => match launcher {
                Launcher::Slurm => get("SLURM_JOB_NODELIST")
                    .or_else(|| get("SLURM_NODELIST"))
                    .and_then(|list| first_host(&list))
                    .ok_or_else(|| {
                        variable("SLURM_JOB_NODELIST names no host and MASTER_ADDR is not set")
                    })?,
                // One node: every process is local.
                Launcher::OpenMpi if number("OMPI_COMM_WORLD_LOCAL_SIZE")? == Some(world_value) => {
                    "127.0.0.1".to_owned()
                }
                _ => {
                    return Err(variable(format!(
                        "{rank} is set but MASTER_ADDR is not: set it to the host of rank 0"
                    )))
                }
            },
        };
        let master_port = match get("MASTER_PORT") {
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| variable(format!("MASTER_PORT='{p}' is not a port number")))?,
            None => DEFAULT_PORT,
        };
        let secret = get(super::auth::TOKEN_VAR)
            .map(|t| super::auth::Secret::new(&t))
            .transpose()
            .map_err(Unreadable::Secret)?;
        Ok(Some(Placement {
            rank: rank_value,
            world: world_value,
            local_rank,
            master_addr,
            master_port,
            launcher,
            secret,
        }))
    }
}

/// The first host of a Slurm node list: `gpu[03-07,09],cpu1` → `gpu03`.
fn first_host(list: &str) -> Option<String> {
    let first = list.trim();
    let end = first
        .char_indices()
        .find(|&(_, c)| c == ',' || c == '[')
        .map_or(first.len(), |(i, _)| i);
    let prefix = &first[..end];
    let host = if first[end..].starts_with('[') {
        let inner = &first[end + 1..];
        let digits: String = inner.chars().take_while(|c| c.is_ascii_digit()).collect();
        if digits.is_empty() {
            return None;
        }
        format!("{prefix}{digits}")
    } else {
        prefix.to_owned()
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<Placement>, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Placement::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
            .map_err(|e| {
                assert!(e.is_environment(), "{e:?}");
                e.chain()
            })
    }

    #[test]
    fn torchrun() {
        let p = read(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            p,
            Placement {
                rank: 3,
                world: 8,
                local_rank: 1,
                master_addr: "node7".into(),
                master_port: 1234,
                launcher: Launcher::Torchrun,
                secret: None,
            }
        );
    }

    #[test]
    fn slurm_takes_the_first_node() {
        let p = read(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "5"),
            ("SLURM_JOB_NODELIST", "gpu[03-07,09],cpu1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((p.rank, p.world, p.local_rank), (5, 16, 5));
        assert_eq!(p.master_addr, "gpu03");
        assert_eq!(p.master_port, DEFAULT_PORT);
        assert_eq!(first_host("a1,b2").as_deref(), Some("a1"));
        assert_eq!(first_host("[").as_deref(), None);
    }

    #[test]
    fn open_mpi_on_one_node() {
        let p = read(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((p.rank, p.world, p.launcher), (1, 2, Launcher::OpenMpi));
        assert_eq!(p.master_addr, "127.0.0.1");
    }

    #[test]
    fn bad_values_name_the_variable() {
        assert_eq!(read(&[]).unwrap(), None);
        let e = read(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.contains("RANK='x'"), "{e}");
        let e = read(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert!(e.contains("not below WORLD_SIZE=2"), "{e}");
        let e = read(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.contains("MASTER_ADDR"), "{e}");
        let e = read(&[("RANK", "0")]).unwrap_err();
        assert!(e.contains("WORLD_SIZE is not"), "{e}");
        let e = read(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "99999"),
        ])
        .unwrap_err();
        assert!(e.contains("MASTER_PORT='99999'"), "{e}");
    }
}
