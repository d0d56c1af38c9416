//! The Debian package: built with cargo-deb from the test binary
//! (`scripts/package.sh dev --no-build`), then `dpkg -i` followed by
//! `fleetban check` on a throwaway copy of this machine
//! (`scripts/deb-smoke.sh`: private mount namespace, overlay of / on a
//! tmpfs, chroot), plus the installed unit verified, the installed nginx
//! snippet through Debian's `nginx -t`, a reinstall and a purge.
//! The machine running the tests is left exactly as it was.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{require, require_root};

#[test]
fn the_deb_installs_on_a_fresh_root_and_fleetban_check_passes() {
    require_root("unshare, mount and chroot");
    for tool in ["cargo-deb", "unshare", "chroot", "dpkg", "systemd-analyze", "nginx"] {
        require(tool);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // The binary cargo already built for these tests is the one packaged.
    assert!(
        common::fleetban_bin().ends_with("target/debug/fleetban"),
        "{:?}",
        common::fleetban_bin()
    );
    let out = Command::new(repo.join("scripts/package.sh"))
        .args(["dev", "--no-build"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "package.sh failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = repo.join(stdout.lines().last().unwrap().trim());
    assert!(deb.exists(), "{deb:?}");

    let contents = Command::new(require("dpkg-deb")).arg("-c").arg(&deb).output().unwrap();
    let listing = String::from_utf8_lossy(&contents.stdout);
    for path in [
        "./usr/bin/fleetban",
        "./lib/systemd/system/fleetban.service",
        "./etc/fleetban/fleetban.yaml",
        "./etc/fleetban/rules.d/nginx-scraper.yaml",
        "./etc/fleetban/nginx/fleetban.conf",
        "./etc/fleetban/nginx/fleetban-location.conf",
        "./usr/share/fleetban/rules/nginx-php-probes.yaml",
        "./usr/share/fleetban/rules/samples/nginx-login.log",
        "./usr/share/fleetban/dashboards/fleetban.json",
        "./usr/share/man/man1/fleetban.1.gz",
        "./usr/share/zsh/vendor-completions/_fleetban",
        "./usr/share/fish/vendor_completions.d/fleetban.fish",
    ] {
        assert!(listing.lines().any(|l| l.ends_with(path)), "{path} missing:\n{listing}");
    }

    let out = Command::new(repo.join("scripts/deb-smoke.sh"))
        .arg(&deb)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "deb-smoke failed:\n{text}");
    assert!(text.contains("/etc/fleetban/fleetban.yaml: ok, 1 rule(s)"), "{text}");
    // Debian's nginx accepts the installed snippet where README.md says to
    // include it.
    assert!(text.contains("nginx.conf test is successful"), "{text}");
    assert!(text.contains("deb-smoke: ok"), "{text}");
    // Nothing installed on the machine itself.
    let q = Command::new(require("dpkg-query"))
        .args(["-W", "fleetban"])
        .output()
        .unwrap();
    assert!(
        !q.status.success(),
        "fleetban must not be installed on the test machine"
    );
}
