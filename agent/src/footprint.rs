//! The agent's resident code kept to what it runs (issue 18, docs/benchmarks.md).
//!
//! Most of an idle agent's memory is code: its own binary and the shared libraries (libc,
//! libm, libgcc_s, ld.so), mapped read-only from files. A page fault in such a mapping maps
//! the faulting page's neighbours already in the page cache too ("fault-around", 64 KiB), and
//! a fault on an uncached page reads ahead: every path the agent ever ran — start-up, TLS
//! bootstrap, registration, a claim's install and bootstrap — stays mapped, although the idle
//! loop runs a fraction of it (measured with `clear_refs` and smaps' `Referenced`: 2.3 of
//! 5.2 MiB of the binary's resident code, 0.2 of 1.9 MiB of the libraries').
//!
//! [`trim_code`] therefore drops this process's page table entries of every read-only private
//! file mapping that holds no private (anonymous) page: `MADV_DONTNEED`, after which an access
//! maps the same bytes from the page cache again, so only what runs comes back. The binary's
//! mappings are first marked `MADV_RANDOM` (no read-ahead on their faults) and its pages,
//! now unmapped, are dropped from the page cache (`POSIX_FADV_DONTNEED`), so that on kernels
//! that honour `MADV_RANDOM` for code (before 6.16, e.g. Debian 12's 6.1 and Debian 13's 6.12)
//! its code comes back a page at a time. Since Linux 6.16 a fault in executable memory reads
//! ahead whatever the advice, and fault-around maps what that read, so the binary's code comes
//! back in 64 KiB pieces; the shared libraries' pages, which other processes keep cached, too.
//!
//! Why the rule is safe: a private file mapping without write permission and without
//! anonymous pages (smaps' `Anonymous: 0 kB`) holds exactly the file's bytes, so dropping its
//! page table entries loses nothing. The mappings it excludes are the ones where that is not
//! so: writable ones (`.data`, `.bss`) and read-only ones with private copies (relocated
//! `.data.rel.ro` made read-only by RELRO, a page a debugger or uprobe wrote a breakpoint
//! into). Another process running the same binary (`byoh-agent doctor`) only reads its
//! pages again.
//!
//! Rules from madvise(2) and posix_fadvise(2): `MADV_RANDOM` sets `VM_RAND_READ` on the
//! mapping; `MADV_DONTNEED` on a private file mapping makes later accesses map the file's
//! contents again; `POSIX_FADV_DONTNEED` drops a file's clean pages that nothing maps.

use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
use nix::sys::mman::{MmapAdvise, madvise};
use procfs::process::{MMPermissions, MMapPath, Process};
use std::ffi::c_void;
use std::path::Path;
use std::ptr::NonNull;

/// What [`trim_code`] did: the mappings whose page table entries it dropped, their size and
/// what of them was resident, in bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Mappings trimmed.
    pub mappings: usize,
    /// Their total length in bytes.
    pub bytes: u64,
    /// Their resident bytes before the trim (smaps' `Rss`).
    pub resident: u64,
}

/// One mapping as [`trim_code`] chooses: address range, permissions, file and its smaps
/// `Anonymous` bytes (`None` when smaps did not say).
type Mapping<'a> = ((u64, u64), MMPermissions, &'a MMapPath, Option<u64>);

/// Drops what this process does not run from its resident code (see the module
/// documentation). Best effort: what it cannot advise stays resident.
///
/// # Errors
/// `/proc/self/smaps` or `/proc/self/exe` unreadable, or `madvise` or `posix_fadvise` refused
/// (the message names which).
pub fn trim_code() -> Result<Trimmed, String> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let maps = Process::myself()
        .and_then(|p| p.smaps())
        .map_err(|e| format!("/proc/self/smaps: {e}"))?;
    let rss = |m: &procfs::process::MemoryMap| m.extension.map.get("Rss").copied().unwrap_or(0);
    let mut trimmed = Trimmed::default();
    let chosen = maps.iter().map(|m| {
        let anonymous = m.extension.map.get("Anonymous").copied();
        ((m.address, m.perms, &m.pathname, anonymous), rss(m))
    });
    for ((start, end), own, resident) in clean_code(&exe, chosen) {
        let advice: &[MmapAdvise] = if own {
            &[MmapAdvise::MADV_RANDOM, MmapAdvise::MADV_DONTNEED]
        } else {
            &[MmapAdvise::MADV_DONTNEED]
        };
        for &advice in advice {
            advise(start, end - start, advice)
                .map_err(|e| format!("madvise({advice:?}) on {start:#x}-{end:#x}: {e}"))?;
        }
        trimmed.mappings += 1;
        trimmed.bytes += end - start;
        trimmed.resident += resident;
    }
    // The running binary itself, even if an upgrade replaced the path since.
    let binary =
        std::fs::File::open("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    posix_fadvise(&binary, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).map_err(|e| {
        format!(
            "posix_fadvise(POSIX_FADV_DONTNEED) on {}: {e}",
            exe.display()
        )
    })?;
    Ok(trimmed)
}

/// [`trim_code`] once `what` is done (start-up, a claim's clean-up), its outcome logged; a
/// refusal only costs memory, so it is not a warning.
pub fn trim_after(what: &str) {
    match trim_code() {
        Ok(t) => tracing::debug!(
            mappings = t.mappings,
            bytes = t.bytes,
            resident = t.resident,
            "after {what}: code pages left this process; what runs comes back"
        ),
        Err(e) => tracing::info!("after {what}: the code pages stay resident: {e}"),
    }
}

/// The mappings whose page table entries may be dropped: `[start, end)`, whether they map
/// `exe` (this binary), and the resident bytes that came with them. Chosen: private file
/// mappings, readable, not writable, with smaps' `Anonymous` known to be 0.
fn clean_code<'a>(
    exe: &Path,
    maps: impl Iterator<Item = (Mapping<'a>, u64)>,
) -> Vec<((u64, u64), bool, u64)> {
    maps.filter(|((_, perms, path, anonymous), _)| {
        matches!(path, MMapPath::Path(_))
            && perms.contains(MMPermissions::READ | MMPermissions::PRIVATE)
            && !perms.contains(MMPermissions::WRITE)
            && *anonymous == Some(0)
    })
    .filter(|(((start, end), ..), _)| end > start)
    .map(|((address, _, path, _), resident)| {
        let own = matches!(path, MMapPath::Path(p) if p == exe);
        (address, own, resident)
    })
    .collect()
}

/// `madvise(2)` on `[start, start + len)`, one whole mapping chosen by [`clean_code`].
#[allow(unsafe_code)]
fn advise(start: u64, len: u64, advice: MmapAdvise) -> nix::Result<()> {
    let (Ok(addr), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else {
        return Err(nix::errno::Errno::EINVAL);
    };
    let Some(ptr) = NonNull::new(addr as *mut c_void) else {
        return Err(nix::errno::Errno::EINVAL);
    };
    // SAFETY: the range is exactly one mapping listed in /proc/self/smaps for this process: a
    // private file mapping without write permission and without anonymous pages, so every
    // page in it holds the file's bytes. MADV_RANDOM changes only read-ahead; MADV_DONTNEED
    // drops page table entries, and the next access maps the same bytes from the file. No
    // Rust object's memory changes. (Nothing in the agent makes these mappings writable: only
    // the dynamic loader does, for a library it is loading, whose mapping is then writable or
    // holds anonymous pages and so is not chosen.)
    unsafe { madvise(ptr, len, advice) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_private_file_mappings_without_private_copies_are_chosen() {
        let exe = Path::new("/usr/bin/byoh-agent");
        let bin = MMapPath::Path(exe.into());
        let libc = MMapPath::Path("/usr/lib/x86_64-linux-gnu/libc.so.6".into());
        let heap = MMapPath::Heap;
        let anon = MMapPath::Anonymous;
        let r = MMPermissions::READ | MMPermissions::PRIVATE;
        let rx = r | MMPermissions::EXECUTE;
        let rw = r | MMPermissions::WRITE;
        let shared = MMPermissions::READ | MMPermissions::SHARED;
        let maps: [(Mapping, u64); 10] = [
            (((0x1000, 0x2000), r, &bin, Some(0)), 1),
            (((0x2000, 0x9000), rx, &bin, Some(0)), 2),
            // RELRO: read-only now, relocated by the loader (private copies).
            (((0x9000, 0xa000), r, &bin, Some(4096)), 3),
            (((0xa000, 0xb000), rw, &bin, Some(4096)), 4),
            (((0xb000, 0xc000), rx, &libc, Some(0)), 5),
            // A breakpoint written into library code.
            (((0xc000, 0xd000), rx, &libc, Some(4096)), 6),
            (((0xd000, 0xe000), rx, &libc, None), 7),
            (((0xe000, 0xf000), shared, &libc, Some(0)), 8),
            (((0xf000, 0x10000), rw, &heap, Some(4096)), 9),
            (((0x10000, 0x11000), r, &anon, Some(0)), 10),
        ];
        assert_eq!(
            clean_code(exe, maps.into_iter()),
            [
                ((0x1000, 0x2000), true, 1),
                ((0x2000, 0x9000), true, 2),
                ((0xb000, 0xc000), false, 5)
            ]
        );
    }

    #[test]
    fn trimming_this_process_keeps_its_code_running() {
        // The test binary trims itself and goes on running code and reading constants.
        let t = trim_code().unwrap();
        assert!(t.mappings >= 3 && t.bytes > 0 && t.resident > 0, "{t:?}");
        let v: Vec<String> = (0..100).map(|i| format!("{i}")).collect();
        assert_eq!(v.join("").len(), 190);
    }
}
