//! A bounded, deterministic fuzz test of parse + validate (no libFuzzer needed, runs in
//! `make test`): mutations of every case file and of arbitrary bytes must never panic. The
//! coverage-guided target for `cargo fuzz` is in `agent/fuzz/` and calls [`check_one`]'s twin.

use super::tests::{CASES, data, temp_root};
use super::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// xorshift64*: a tiny deterministic generator (the seed is printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const TOKENS: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "#}",
    "{{ v1.local_hostname }}",
    "!!binary ",
    "!tag ",
    "&a ",
    "*a",
    ": ",
    "- ",
    "\n",
    "\n  ",
    "'",
    "\"",
    "[",
    "]",
    "{",
    "}",
    "#cloud-config\n",
    "## template: jinja\n",
    "encoding: gz\n",
    "encoding: b64\n",
    "permissions: 99999\n",
    "owner: x:y\n",
    "append: true\n",
    "defer: true\n",
    "path: ../x\n",
    "bootcmd: [a]\n",
    "runcmd:\n- [a, 1]\n",
    "\u{feff}",
    "\0",
    "é",
    "H4sIAAAAAAAC/8tIzcnJ5wIAIDA6NgYAAAA=",
    "- path: /x\n  content: !!binary AAAA\n",
];

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let pos = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            1 if !v.is_empty() => {
                let end = (pos + rng.below(16)).min(v.len());
                v.drain(pos.min(end)..end);
            }
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                v.splice(pos..pos, t.iter().copied());
            }
            3 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + rng.below(64)).min(v.len());
                let chunk = v[a..b].to_vec();
                v.splice(pos..pos, chunk);
            }
            4 => v.truncate(pos),
            _ => v.insert(pos, b" \t\n:-#!&*|>"[rng.below(11)]),
        }
    }
    v
}

/// One input through parse + validate (what the cargo-fuzz target does).
fn check_one(bytes: &[u8], root: &Path) {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(doc) = parse(&text, &data()) {
        let ignore = vec!["ntp".to_string()];
        let _ = validate(
            &doc,
            &ValidateOptions {
                root,
                host_name: "worker-1",
                ignore_modules: &ignore,
            },
        );
    }
}

#[test]
fn mutated_cases_and_random_bytes_never_panic() {
    let root = temp_root();
    let seed = std::env::var("BYOH_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_c10d_u64);
    let budget = Duration::from_secs(3);
    let start = Instant::now();
    let mut rng = Rng(seed);
    let mut n = 0u64;
    while start.elapsed() < budget && n < 20_000 {
        let input = if n % 10 == 9 {
            (0..rng.below(256)).map(|_| rng.next() as u8).collect()
        } else {
            let (_, case) = CASES[rng.below(CASES.len())];
            mutate(&mut rng, case.as_bytes())
        };
        let result = std::panic::catch_unwind(|| check_one(&input, root.path()));
        assert!(
            result.is_ok(),
            "panic on input #{n} (seed {seed}): {:?}",
            String::from_utf8_lossy(&input)
        );
        n += 1;
    }
    assert!(n > 100, "only {n} inputs in {budget:?}");
}
