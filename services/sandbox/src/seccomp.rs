//! The system calls a sandboxed agent never needs, refused with an error rather than by killing it (agents
//! probe for features: libuv ≥ 1.52 calls `io_uring_setup` unconditionally and must see an error, not die).
//!
//! Refused with `EPERM`: debugging or reading other processes (`ptrace`, `process_vm_*`), `io_uring` (which can
//! open sockets and files without the calls Landlock sees), new namespaces (`unshare`, `setns`, `clone` with
//! `CLONE_NEW*`: the kernel's user-namespace code is a large attack surface, and a nested namespace could hide
//! from the sandbox's own), kernel keyrings, BPF and perf, `userfaultfd`, module, mount, swap and reboot
//! calls. `clone3`, whose flags seccomp cannot read, answers `ENOSYS`, so the C library falls back to `clone`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("unsupported architecture {0}")]
    Architecture(String),
    #[error("{0}")]
    Filter(#[from] seccompiler::BackendError),
    #[error("{0}")]
    Install(#[from] seccompiler::Error),
}

/// Calls refused outright.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_open_by_handle_at,
];

/// `clone` flags that create namespaces.
const NEW_NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// The compiled filters for this machine's architecture: the calls refused with `EPERM`, and `clone3` with
/// `ENOSYS` (a seccomp filter has one action for what matches, so two filters; the kernel applies both).
pub fn programs() -> Result<[BpfProgram; 2], SeccompError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|_| SeccompError::Architecture(std::env::consts::ARCH.into()))?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|call| (*call, Vec::new())).collect();
    // clone(flags, …): refused when any namespace flag is set (one rule per flag; any rule matching refuses).
    let clone_rules = NEW_NAMESPACE_FLAGS
        .iter()
        .map(|flag| {
            let flag = *flag as u64;
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)
                .and_then(|condition| SeccompRule::new(vec![condition]))
        })
        .collect::<Result<Vec<_>, _>>()?;
    refused.insert(libc::SYS_clone, clone_rules);
    let refusing = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    Ok([refusing.try_into()?, clone3.try_into()?])
}

/// Install the filters on the calling thread (inherited by every process it starts). Needs `no_new_privs`,
/// which Landlock set before.
pub fn apply() -> Result<(), SeccompError> {
    for program in programs()? {
        seccompiler::apply_filter(&program)?;
    }
    Ok(())
}
