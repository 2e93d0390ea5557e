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
