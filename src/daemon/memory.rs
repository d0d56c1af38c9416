//! The daemon's memory as the kernel counts it: the allocator's arenas
//! limited, its free pages given back after big loads, and the code pages
//! the start mapped let go once it is over.

/// Gives the allocator's free pages back to the kernel. glibc keeps what a
/// large load freed (the list's reply, the 100k-element transaction text)
/// in its per-thread arenas: without this, RSS after loading 100k bans
/// stays well above what is live. Called after loads, never per line.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer; it only walks glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Lets go of the code pages a start mapped. The kernel maps a file's pages
/// 64 KiB around each one touched (fault-around), and a start runs code
/// nothing runs again (the configuration's parser, the first load, the
/// records' first read): an idle daemon had 9.4 MB of its 11.8 MB of
/// machine code mapped, counted in its RSS. `MADV_DONTNEED` on a read-only
/// mapping of a file only drops the mappings: the pages stay in the page
/// cache (charged as before to the service's cgroup), and what runs again
/// maps them again on its next fault. Only mappings holding no page of
/// their own (smaps' `Anonymous: 0`), that is never written, are touched.
/// Called when a start's work is done (after `READY=1`, and after the
/// records a snapshot left are read), and once libnftables is loaded by
/// the first in-process transaction; never per line.
pub(crate) fn release_code_pages() {
    #[cfg(target_os = "linux")]
    {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return;
        };
        for (start, end) in read_only_file_mappings(&smaps) {
            // SAFETY: the range is one whole mapping of a file that this
            // process can only read, holding no private page: dropping its
            // pages' mappings loses nothing, a later access maps them again.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
}

/// The `(start, end)` of each mapping in `smaps` that maps a file read-only
/// (`r--p` or `r-xp`) and holds no private (anonymous) page.
fn read_only_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(anon) = line.strip_prefix("Anonymous:") {
            if let Some(range) = current.take() {
                if anon.trim() == "0 kB" {
                    found.push(range);
                }
            }
            continue;
        }
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else {
            continue;
        };
        // The mapping's header: range, perms, offset, device, inode, path.
        let path = fields.nth(3);
        current = match (perms, path) {
            ("r--p" | "r-xp", Some(p)) if p.starts_with('/') => Some((start, end)),
            _ => None,
        };
    }
    found
}

/// At most two malloc arenas (glibc makes up to 8 per core). The daemon's
/// big loads (100k bans: the list's reply, the nft transaction's text, the
/// view of the list) are freed right after the start, but what each thread
/// keeps live scatters over its own arena and pins partly used pages there:
/// measured with 100,000 bans, RSS 26.2-33.3 MB from start to start with the
/// default, 27.0-27.3 MB in 9 of 10 starts with two arenas (BENCHMARKS.md).
///
/// And blocks of 128 KiB and more always mapped on their own, returned
/// whole when freed: glibc's default raises that threshold to the largest
/// block freed so far, after which the start's pages of the list (160 kB
/// each) came from the heap between long-lived tables and pinned it: with
/// 1,000,000 bans 67 MB of RSS held free.
/// Called before any other thread starts.
pub(super) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers; it only sets glibc's tunables.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_mappings_of_files_without_private_pages_are_released() {
        // Abridged /proc/self/smaps: the binary's rodata and text, its
        // relocated (written, then made read-only) part, its data, the
        // heap, an anonymous read-only mapping and the vdso.
        let smaps = "\
55d0e0000000-55d0e0100000 r--p 00000000 fd:01 42 /usr/bin/fleetban
Rss:                 512 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
55d0e0100000-55d0e0900000 r-xp 00100000 fd:01 42 /usr/bin/fleetban
Rss:                6000 kB
Anonymous:             0 kB
55d0e0900000-55d0e0910000 r--p 00900000 fd:01 42 /usr/bin/fleetban
Anonymous:            64 kB
55d0e0910000-55d0e0920000 rw-p 00910000 fd:01 42 /usr/bin/fleetban
Anonymous:            16 kB
55d0e1000000-55d0e1100000 rw-p 00000000 00:00 0 [heap]
Anonymous:           800 kB
7f0000000000-7f0000001000 r--p 00000000 00:00 0
Anonymous:             0 kB
7f0000100000-7f0000200000 r-xp 00028000 fd:01 7 /usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
";
        assert_eq!(
            read_only_file_mappings(smaps),
            vec![
                (0x55d0e0000000, 0x55d0e0100000),
                (0x55d0e0100000, 0x55d0e0900000),
                (0x7f0000100000, 0x7f0000200000),
            ]
        );
    }

    /// This test binary's own code pages: released, fewer stay mapped,
    /// and the code still runs (it is mapped again as it runs).
    #[test]
    #[cfg(target_os = "linux")]
    fn released_code_pages_leave_the_resident_set_and_still_run() {
        fn rss_file_kb() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
            line.split_ascii_whitespace().nth(1).unwrap().parse().unwrap()
        }
        let before = rss_file_kb();
        release_code_pages();
        let after = rss_file_kb();
        assert!(after < before, "RssFile {before} kB before, {after} kB after");
        // Code and read-only data mapped again on use: a regex (code from
        // another crate) still compiles and matches.
        let re = regex::Regex::new(r"^(\d+)-(\d+)$").unwrap();
        assert_eq!(&re.captures("12-34").unwrap()[2], "34");
    }
}
