//! Build script: records the git commit and build date for `byoh-agent version`.

include!("../build-support/version.rs");

fn main() {
    emit_version_env();
}
