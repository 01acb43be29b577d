//! The system calls a sandboxed agent never needs, refused with an error rather than by killing it (agents
//! probe for features: libuv ≥ 1.52 calls `io_uring_setup` unconditionally and must see an error, not die).
//!
//! Refused with `EPERM`: debugging or reading other processes (`ptrace`, `process_vm_*`), `io_uring` (which can
//! open sockets and files without the calls Landlock sees), new namespaces (`unshare`, `setns`, `clone` with
//! `CLONE_NEW*`: the kernel's user-namespace code is a large attack surface, and a nested namespace could hide
//! from the sandbox's own), kernel keyrings, BPF and perf, `userfaultfd`, module, mount, swap and reboot
//! calls. `clone3`, whose flags seccomp cannot read, answers `ENOSYS`, so the C library falls back to `clone`.
//!
//! Landlock's TCP port rules see `connect(2)` only; two ways to open a TCP connection do without it, and are
//! refused: MPTCP sockets (`IPPROTO_MPTCP`, which fall back to plain TCP with any server) and TCP Fast Open's
//! `MSG_FASTOPEN` on `sendto`/`sendmsg`/`sendmmsg`. SCTP sockets (no port rules at all) are refused too, and
//! every address family but Unix, IPv4, IPv6 and netlink's routing protocol (`AF_VSOCK` reaches the host from a
//! VM's guest, `AF_NETLINK` sock_diag lists the host's sockets, `AF_PACKET`, `AF_ALG`, …). `ioctl` with
//! `TIOCSTI` (push input into a terminal: the shell that started the command) or `TIOCLINUX` is refused. On
//! x86-64, system call numbers of the x32 ABI (bit 30 set), which a rule for the 64-bit number would miss,
//! answer `ENOSYS`.

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
    // socket(AF_INET or AF_INET6, any type, IPPROTO_MPTCP or IPPROTO_SCTP).
    let mut socket_rules = Vec::new();
    for domain in [libc::AF_INET, libc::AF_INET6] {
        for protocol in [libc::IPPROTO_MPTCP, libc::IPPROTO_SCTP] {
            socket_rules.push(SeccompRule::new(vec![
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, domain as u64)?,
                SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, protocol as u64)?,
            ])?);
        }
    }
    // Address families an agent never needs: everything but Unix, IPv4, IPv6 and netlink (one rule: the domain
    // is none of those), and netlink but for its routing protocol (glibc's resolver and getifaddrs use that;
    // sock_diag would list the host's sockets).
    let domain = |op, value: libc::c_int| SeccompCondition::new(0, SeccompCmpArgLen::Dword, op, value as u64);
    socket_rules.push(SeccompRule::new(
        [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]
            .into_iter()
            .map(|allowed| domain(SeccompCmpOp::Ne, allowed))
            .collect::<Result<Vec<_>, _>>()?,
    )?);
    socket_rules.push(SeccompRule::new(vec![
        domain(SeccompCmpOp::Eq, libc::AF_NETLINK)?,
        SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            libc::NETLINK_ROUTE as u64,
        )?,
    ])?);
    refused.insert(libc::SYS_socket, socket_rules);
    // ioctl(fd, TIOCSTI or TIOCLINUX): typing into a terminal (another process's input) and the console's
    // selection; the request's low 32 bits are what the kernel reads.
    refused.insert(
        libc::SYS_ioctl,
        [libc::TIOCSTI, libc::TIOCLINUX]
            .into_iter()
            .map(|request| {
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                    .and_then(|condition| SeccompRule::new(vec![condition]))
            })
            .collect::<Result<Vec<_>, _>>()?,
    );
    // MSG_FASTOPEN: sendto(fd, buf, len, flags, …), sendmsg(fd, msg, flags), sendmmsg(fd, vec, n, flags).
    let fast_open = libc::MSG_FASTOPEN as u64;
    for (call, flags_arg) in [
        (libc::SYS_sendto, 3),
        (libc::SYS_sendmsg, 2),
        (libc::SYS_sendmmsg, 3),
    ] {
        refused.insert(
            call,
            vec![SeccompRule::new(vec![SeccompCondition::new(
                flags_arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(fast_open),
                fast_open,
            )?])?],
        );
    }
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

/// On x86-64: `ENOSYS` for every x32 system call (number with bit 30 set), a filter of its own (seccompiler
/// matches exact numbers only). The program: load the number; if it is at least 0x4000_0000, refuse; allow.
#[cfg(target_arch = "x86_64")]
fn x32_program() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    vec![
        // seccomp_data.nr is at offset 0.
        sock_filter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ]
}

/// Install the filters on the calling thread (inherited by every process it starts). Needs `no_new_privs`,
/// which Landlock set before.
pub fn apply() -> Result<(), SeccompError> {
    for program in programs()? {
        seccompiler::apply_filter(&program)?;
    }
    #[cfg(target_arch = "x86_64")]
    seccompiler::apply_filter(&x32_program())?;
    Ok(())
}
