//! A stand-in for nft in tests (the daemon's `FLEETBAN_NFT`), built by
//! `common::nft_shim` with rustc: a program, no shell. It runs the real nft
//! (`$FBT_NFT_REAL`) with its own arguments and stdin, except that, with
//! `$FBT_NFT_CTL` naming a folder:
//! - while `CTL/hang` exists it first waits (120 s at most), with its pid
//!   in `CTL/hanging` meanwhile;
//! - while `CTL/fail` exists a transaction (`-f -`) fails without running
//!   nft, and one line per refusal is appended to `CTL/failed`;
//! - while `CTL/hang-if` exists, a transaction whose text contains the
//!   file's text waits as for `hang` (120 s at most), then runs.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ctl = PathBuf::from(std::env::var_os("FBT_NFT_CTL").expect("FBT_NFT_CTL"));
    let real = std::env::var_os("FBT_NFT_REAL").expect("FBT_NFT_REAL");
    let start = Instant::now();
    if ctl.join("hang").exists() {
        let _ = std::fs::write(ctl.join("hanging"), std::process::id().to_string());
        while ctl.join("hang").exists() && start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(ctl.join("hanging"));
    }
    if args == ["-f", "-"] && ctl.join("fail").exists() {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(ctl.join("failed")) {
            let _ = writeln!(f, "refused");
        }
        eprintln!("Error: injected failure (fleetban test shim)");
        std::process::exit(1);
    }
    if args == ["-f", "-"] && ctl.join("hang-if").exists() {
        // The text is read here, so nft gets it through a pipe of ours.
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut text).expect("stdin");
        let held = |ctl: &PathBuf| {
            std::fs::read(ctl.join("hang-if"))
                .is_ok_and(|t| !t.is_empty() && text.windows(t.len()).any(|w| w == t.as_slice()))
        };
        if held(&ctl) {
            let _ = std::fs::write(ctl.join("hanging"), std::process::id().to_string());
            while held(&ctl) && start.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = std::fs::remove_file(ctl.join("hanging"));
        }
        let mut child = std::process::Command::new(real)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("nft shim: cannot run nft");
        child.stdin.take().expect("piped").write_all(&text).expect("nft's stdin");
        let status = child.wait().expect("nft shim: wait");
        std::process::exit(status.code().unwrap_or(1));
    }
    let e = std::process::Command::new(real).args(&args).exec();
    eprintln!("nft shim: cannot run nft: {e}");
    std::process::exit(127);
}
