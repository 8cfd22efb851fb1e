//! The agent's resident code kept to what it runs (issue 18, docs/benchmarks.md).
//!
//! A page fault in the binary's code makes the kernel read ahead (128 KiB and more on a page
//! cache miss) and map the faulting page's neighbours already in the page cache
//! ("fault-around", 64 KiB): every path the agent ever ran — start-up, TLS bootstrap,
//! registration, a claim's install and bootstrap — stays mapped, about 9 MiB of a binary whose
//! idle loop runs a fraction of it. [`trim_code`] marks the binary's file mappings
//! `MADV_RANDOM` (later faults read only their own 4 KiB page: no read-ahead, so no cached
//! neighbours to fault around) and pages them out (`MADV_PAGEOUT`, Linux ≥ 5.4): what the agent
//! runs afterwards comes back a page at a time, the rest stays on disk. Nothing else changes:
//! the mappings are the binary's read-only and executable file pages, which the kernel reads
//! back unchanged. The writable mappings (relocated `.data.rel.ro`, `.data`, `.bss`) are left
//! alone: paging them out would only move them to swap.
//!
//! Rules from madvise(2): `MADV_RANDOM` sets `VM_RAND_READ` on the mapping (no read-ahead on
//! faults); `MADV_PAGEOUT` reclaims the range's pages that no other process maps.

use nix::sys::mman::{MmapAdvise, madvise};
use procfs::process::{MMPermissions, MMapPath, Process};
use std::ffi::c_void;
use std::path::PathBuf;
use std::ptr::NonNull;

/// What [`trim_code`] did: the binary's read-only file mappings it advised, and their size in
/// bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Mappings advised.
    pub mappings: usize,
    /// Their total length in bytes.
    pub bytes: u64,
}

/// Advises the kernel to keep only the pages of this process's own binary that it touches
/// from now on (see the module documentation). Best effort: a kernel without
/// `MADV_PAGEOUT` (< 5.4) or a binary replaced since the start (an upgrade) leaves things as
/// they were.
///
/// # Errors
/// `/proc/self/maps` or `/proc/self/exe` unreadable, or `madvise` refused (the message names
/// which).
pub fn trim_code() -> Result<Trimmed, String> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let maps = Process::myself()
        .and_then(|p| p.maps())
        .map_err(|e| format!("/proc/self/maps: {e}"))?;
    let mut trimmed = Trimmed::default();
    for (start, end) in code_ranges(&exe, maps.iter().map(|m| (m.address, m.perms, &m.pathname))) {
        for advice in [MmapAdvise::MADV_RANDOM, MmapAdvise::MADV_PAGEOUT] {
            advise(start, end - start, advice)
                .map_err(|e| format!("madvise({advice:?}) on {start:#x}-{end:#x}: {e}"))?;
        }
        trimmed.mappings += 1;
        trimmed.bytes += end - start;
    }
    Ok(trimmed)
}

/// [`trim_code`] once `what` is done (start-up, a claim's clean-up), its outcome logged; a
/// refusal (an old kernel) only costs memory, so it is not a warning.
pub fn trim_after(what: &str) {
    match trim_code() {
        Ok(t) => tracing::debug!(
            mappings = t.mappings,
            bytes = t.bytes,
            "after {what}: the binary's pages left memory; what runs comes back a page at a time"
        ),
        Err(e) => tracing::info!("after {what}: the binary's pages stay resident: {e}"),
    }
}

/// The address ranges `[start, end)` of `exe`'s mappings that are file pages only read or
/// executed (not writable: those hold relocated or written data).
fn code_ranges<'a>(
    exe: &PathBuf,
    maps: impl Iterator<Item = ((u64, u64), MMPermissions, &'a MMapPath)>,
) -> Vec<(u64, u64)> {
    maps.filter(|(_, perms, path)| {
        matches!(path, MMapPath::Path(p) if p == exe) && !perms.contains(MMPermissions::WRITE)
    })
    .map(|(address, _, _)| address)
    .filter(|(start, end)| end > start)
    .collect()
}

/// `madvise(2)` on `[start, start + len)`, a whole read-only file mapping of this process.
#[allow(unsafe_code)]
fn advise(start: u64, len: u64, advice: MmapAdvise) -> nix::Result<()> {
    let (Ok(addr), Ok(len)) = (usize::try_from(start), usize::try_from(len)) else {
        return Err(nix::errno::Errno::EINVAL);
    };
    let Some(ptr) = NonNull::new(addr as *mut c_void) else {
        return Err(nix::errno::Errno::EINVAL);
    };
    // SAFETY: the range is exactly one mapping listed in /proc/self/maps for this process's
    // own binary, without write permission: a read-only private file mapping. MADV_RANDOM
    // changes only read-ahead; MADV_PAGEOUT drops pages that the next access reads back from
    // the file unchanged (no private copy exists, the mapping was never writable). No Rust
    // object's memory changes.
    unsafe { madvise(ptr, len, advice) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_binarys_read_only_file_mappings_are_chosen() {
        let exe = PathBuf::from("/usr/bin/byoh-agent");
        let bin = MMapPath::Path(exe.clone());
        let libc = MMapPath::Path("/usr/lib/x86_64-linux-gnu/libc.so.6".into());
        let heap = MMapPath::Heap;
        let r = MMPermissions::READ | MMPermissions::PRIVATE;
        let rx = r | MMPermissions::EXECUTE;
        let rw = r | MMPermissions::WRITE;
        let maps = [
            ((0x1000, 0x2000), r, &bin),
            ((0x2000, 0x9000), rx, &bin),
            ((0x9000, 0xa000), rw, &bin),
            ((0xa000, 0xb000), rx, &libc),
            ((0xb000, 0xc000), rw, &heap),
        ];
        assert_eq!(
            code_ranges(&exe, maps.into_iter()),
            [(0x1000, 0x2000), (0x2000, 0x9000)]
        );
    }

    #[test]
    fn trimming_this_process_keeps_its_code_running() {
        // The test binary trims itself and goes on running code and reading constants.
        let t = trim_code().unwrap();
        assert!(t.mappings >= 2 && t.bytes > 0, "{t:?}");
        let v: Vec<String> = (0..100).map(|i| format!("{i}")).collect();
        assert_eq!(v.join("").len(), 190);
    }
}
