//! Which CPU flags an artifact's host identity records: the ones a
//! restored process can depend on (probed by fingerprint.rs, compared by
//! compat.rs).

use std::collections::BTreeSet;

/// The CPU flags (x86 `flags`, arm64 `Features` of /proc/cpuinfo) a
/// restored process can depend on: extended state CRIU saves and restores
/// (x87, SSE, AVX, AVX-512, MPX, PKRU, AMX), the xsave forms user space
/// runs (glibc's dynamic linker saves registers with xsavec when it may),
/// and the instruction sets engines and libraries dispatch on once at
/// start-up. Everything else /proc/cpuinfo lists (mitigations, timers,
/// virtualization, cache hints, performance-only features such as erms)
/// neither changes what runs nor fails a restore, and differs between
/// hosts of one model (microcode, hypervisors), so it is left out.
pub const RELEVANT_CPU_FLAGS: &[&str] = &[
    // x86: extended state and the xsave instructions user space uses.
    "fpu",
    "fxsr",
    "xsave",
    "xsaveopt",
    "xsavec",
    "mpx",
    "pku",
    "ospke",
    // x86: instruction sets.
    "mmx",
    "sse",
    "sse2",
    "pni",
    "ssse3",
    "sse4_1",
    "sse4_2",
    "popcnt",
    "abm",
    "bmi1",
    "bmi2",
    "adx",
    "movbe",
    "cx16",
    "aes",
    "pclmulqdq",
    "sha_ni",
    "vaes",
    "vpclmulqdq",
    "gfni",
    "rdrand",
    "rdseed",
    "rtm",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512ifma",
    "avx512vbmi",
    "avx512_vbmi2",
    "avx512_vnni",
    "avx512_bitalg",
    "avx512_vpopcntdq",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    // arm64.
    "fp",
    "asimd",
    "atomics",
    "crc32",
    "pmull",
    "sha1",
    "sha2",
    "sha3",
    "sha512",
    "fphp",
    "asimdhp",
    "asimddp",
    "asimdfhm",
    "asimdrdm",
    "lrcpc",
    "jscvt",
    "fcma",
    "sve",
    "sve2",
    "svebf16",
    "svei8mm",
    "bf16",
    "i8mm",
    "sme",
];

/// The relevant flags of a /proc/cpuinfo text, sorted and without
/// duplicates (the first processor's line: every core of a host has the
/// same).
pub fn cpu_flags(cpuinfo: &str) -> Vec<String> {
    let line = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v)
        .unwrap_or_default();
    let set: BTreeSet<&str> = line
        .split_whitespace()
        .filter(|f| RELEVANT_CPU_FLAGS.contains(f))
        .collect();
    set.into_iter().map(str::to_string).collect()
}
