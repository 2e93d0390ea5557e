//! Child processes that do not outlive ralpc: Graphviz's `dot`, and the ranks of
//! `ralpc launch`.

/// On Linux, `command`'s process gets `signal` when ralpc dies, however it dies (SIGKILL
/// included, which ralpc cannot catch to clean up). Elsewhere, nothing.
pub fn die_with_parent(command: &mut std::process::Command, signal: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe, as a pre_exec hook must be; it only asks the
        // kernel to signal the child when its parent dies.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, signal);
}

/// Leaves `socket` open in the process `command` starts, its descriptor in `var`: the
/// child takes over a socket this process bound (`ralpc launch`'s rendezvous listener).
/// Elsewhere than on Unix nothing is handed over and the child binds the port itself.
pub fn hand_over(command: &mut std::process::Command, socket: &std::net::TcpListener, var: &str) {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd as _;
        use std::os::unix::process::CommandExt as _;
        let fd = socket.as_raw_fd();
        command.env(var, fd.to_string());
        // SAFETY: fcntl is async-signal-safe, as a pre_exec hook must be; it clears the
        // close-on-exec flag std sets on every descriptor, for this child only.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (command, socket, var);
}

/// Keeps the memory freed by one tensor for the next, for the life of the process.
///
/// The host device allocates each activation and gradient afresh. glibc's malloc maps every
/// large block on its own and unmaps it on free, so each tensor paid page faults zeroing new
/// pages: a third of a ViT-B/16 forward pass on 2 cores (`benches/cpu_vs_onnxruntime.py`:
/// 1,114 → 712 ms). With mapping off and trimming at 2 GiB, freed blocks stay in the heap.
/// mimalloc and jemalloc were measured too and kept fewer pages (946 and 1,091 ms).
///
/// Call it first thing in `main`, before any thread allocates. It does nothing outside
/// glibc; a program embedding ralpc keeps its own allocator settings unless it calls this.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets two of malloc's parameters; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
