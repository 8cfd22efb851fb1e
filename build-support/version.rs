// Shared by the agent's and the controller's build scripts (`include!`d): exports
// BYOH_GIT_COMMIT and BYOH_BUILD_DATE for `version` output.
fn emit_version_env() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = std::env::var("BYOH_GIT_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Reproducible builds set BYOH_BUILD_EPOCH (packaging/build-packages, build-image: the last
    // commit's time, kept out of SOURCE_DATE_EPOCH in cargo's environment because cc-built
    // dependencies rebuild whenever that changes) or SOURCE_DATE_EPOCH; otherwise the build
    // time is used.
    let epoch = std::env::var("BYOH_BUILD_EPOCH").or_else(|_| std::env::var("SOURCE_DATE_EPOCH"));
    let date_args: Vec<String> = match epoch {
        Ok(epoch) => vec!["-u".into(), "-d".into(), format!("@{epoch}"), "+%Y-%m-%dT%H:%M:%SZ".into()],
        Err(_) => vec!["-u".into(), "+%Y-%m-%dT%H:%M:%SZ".into()],
    };
    let date = std::process::Command::new("date")
        .args(&date_args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BYOH_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=BYOH_BUILD_DATE={date}");
    println!("cargo:rerun-if-env-changed=BYOH_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=BYOH_BUILD_EPOCH");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        println!("cargo:rerun-if-changed={git_dir}/refs/heads");
    }
}
