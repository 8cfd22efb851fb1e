//! Throwaway gpg keys that sign the repositories tests build (apt `InRelease`, dnf
//! `repomd.xml.asc`, RPM headers through rpmsign).

use crate::apt_repo::run;
use std::path::Path;
use std::process::Command;

/// A throwaway gpg key in a home of its own (ed25519, signing, valid one day); its gpg-agent
/// is stopped when dropped.
pub struct GpgKey {
    home: tempfile::TempDir,
    name: String,
}

impl GpgKey {
    /// Generates a key for the user id `name` (e.g. `Repo <repo@byoh.invalid>`).
    ///
    /// Errors when gpg fails.
    pub fn generate(name: &str) -> anyhow::Result<GpgKey> {
        let home = tempfile::tempdir()?;
        run(Command::new("gpg").arg("--homedir").arg(home.path()).args([
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            name,
            "ed25519",
            "sign",
            "1d",
        ]))?;
        Ok(GpgKey {
            home,
            name: name.to_string(),
        })
    }

    /// The user id the key was generated for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The gpg home holding the secret key (for tools that sign through gpg themselves, e.g.
    /// rpmsign's `_gpg_path`).
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// The public key, ASCII-armored (what a repository's `keyURL` serves).
    ///
    /// Errors when gpg fails.
    pub fn armored_public_key(&self) -> anyhow::Result<Vec<u8>> {
        run(Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--batch", "--armor", "--export"]))
    }

    /// `InRelease` for `release`: the clear-signed text (SHA256 digest).
    ///
    /// Errors when gpg fails.
    pub fn clearsign(&self, release: &[u8]) -> anyhow::Result<Vec<u8>> {
        self.sign(release, &["--clearsign"])
    }

    /// An ASCII-armored detached signature of `data` (SHA256 digest), e.g. a dnf repository's
    /// `repodata/repomd.xml.asc`.
    ///
    /// Errors when gpg fails.
    pub fn detach_sign(&self, data: &[u8]) -> anyhow::Result<Vec<u8>> {
        self.sign(data, &["--armor", "--detach-sign"])
    }

    fn sign(&self, data: &[u8], mode: &[&str]) -> anyhow::Result<Vec<u8>> {
        let dir = tempfile::tempdir()?;
        let input = dir.path().join("data");
        let output = dir.path().join("signed");
        std::fs::write(&input, data)?;
        run(Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args([
                "--batch",
                "--yes",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--digest-algo",
                "SHA256",
            ])
            .args(mode)
            .arg("-o")
            .arg(&output)
            .arg(&input))?;
        Ok(std::fs::read(output)?)
    }
}

impl Drop for GpgKey {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "gpg-agent"])
            .status();
    }
}
