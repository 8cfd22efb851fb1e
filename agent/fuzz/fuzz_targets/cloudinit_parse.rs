//! Fuzz target: arbitrary bytes through the cloud-config parse and validate stages must never
//! panic (errors are fine). Seed corpus: tests/cases/cloudinit/*.yaml.
#![no_main]

use byoh_agent::cloudinit::{InstanceData, ValidateOptions, parse, validate};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let instance = InstanceData {
        local_hostname: "worker-1".into(),
        instance_id: "worker-1".into(),
    };
    if let Ok(doc) = parse(&text, &instance) {
        let ignore = vec!["ntp".to_string()];
        let _ = validate(
            &doc,
            &ValidateOptions {
                // Owners resolve against this empty root: no host files are read.
                root: Path::new("/nonexistent-fuzz-root"),
                host_name: "worker-1",
                ignore_modules: &ignore,
            },
        );
    }
});
