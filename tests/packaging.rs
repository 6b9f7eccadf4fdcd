//! The Debian package: it builds, installs, and what it installs works.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::process::Command;

/// Removes the package however the test ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "proftap"]).output();
    }
}

#[test]
fn the_deb_builds_installs_and_runs() {
    require("dpkg-deb", "to build the .deb");
    require("dpkg", "to install the .deb");
    assert!(run_ok(Command::new("id").arg("-u")).trim().eq("0"), "installing a package needs root: run the tests as root");
    let installed = Command::new("dpkg").args(["-s", "proftap"]).output().is_ok_and(|o| o.status.success());
    assert!(!installed, "a proftap package is installed on this machine already, and this test would replace it: remove it first");
    let out = tempfile::tempdir().unwrap();
    let bin_dir = binary("proftap").parent().unwrap().to_path_buf();
    let built =
        run_ok(Command::new(repo().join("scripts/package.sh")).arg("--bin-dir").arg(&bin_dir).arg("--out").arg(out.path()).arg("--fast"));
    let deb = built.lines().last().unwrap().trim().to_string();
    assert!(deb.ends_with(".deb"), "{built}");
    let contents = run_ok(Command::new("dpkg-deb").args(["--contents", &deb]));
    for path in [
        "./usr/bin/proftap",
        "./usr/bin/proftapd",
        "./usr/share/man/man1/proftap.1.gz",
        "./usr/share/man/man1/proftap-run.1.gz",
        "./usr/share/man/man8/proftapd.8.gz",
        "./usr/share/bash-completion/completions/proftap",
        "./usr/share/zsh/vendor-completions/_proftap",
        "./usr/share/fish/vendor_completions.d/proftap.fish",
        "./lib/systemd/system/proftapd.service",
    ] {
        assert!(contents.lines().any(|l| l.ends_with(path)), "{path} missing from the package:\n{contents}");
    }

    let _installed = Installed;
    run_ok(Command::new("dpkg").args(["-i", &deb]));
    let help = run_ok(Command::new("/usr/bin/proftap").arg("--help"));
    assert!(help.contains("Usage: proftap") && help.contains("session"), "{help}");
    let version = run_ok(Command::new("/usr/bin/proftapd").arg("--version"));
    assert!(version.starts_with("proftapd "), "{version}");
    // The man page is a man page.
    let page = run_ok(Command::new("sh").args(["-c", "gzip -dc /usr/share/man/man1/proftap-run.1.gz"]));
    assert!(page.contains(".TH proftap-run 1"), "{page}");
}

#[test]
fn a_source_build_installs_its_man_pages_and_completions() {
    let dest = tempfile::tempdir().unwrap();
    let bin_dir = binary("proftap").parent().unwrap().to_path_buf();
    run_ok(Command::new(repo().join("scripts/install.sh")).arg("--destdir").arg(dest.path()).arg("--bin-dir").arg(&bin_dir));
    let root = dest.path().join("usr/local");
    for path in [
        "bin/proftap",
        "bin/proftapd",
        "share/man/man1/proftap-report.1.gz",
        "share/man/man1/proftap-top.1.gz",
        "share/man/man8/proftapd.8.gz",
        "share/bash-completion/completions/proftap",
        "share/zsh/site-functions/_proftap",
        "share/fish/vendor_completions.d/proftap.fish",
    ] {
        assert!(root.join(path).is_file(), "{path} was not installed under {}", root.display());
    }
    // The report's page explains its columns.
    let page = run_ok(Command::new("gzip").arg("-dc").arg(root.join("share/man/man1/proftap-report.1.gz")));
    assert!(page.contains("COLUMNS OF THE FLAT PROFILE") && page.contains("exclusive"), "{page}");
    // bash loads the completion.
    let script = format!("source {}; complete -p proftap", root.join("share/bash-completion/completions/proftap").display());
    let complete = run_ok(Command::new("bash").args(["-c", &script]));
    assert!(complete.contains("proftap"), "{complete}");
}
