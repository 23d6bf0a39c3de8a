//! A process's VMAs as `/proc/<pid>/smaps` shows them: what the huge-page
//! test and bench read of a restored engine.

/// One VMA: bounds, `AnonHugePages` in bytes, and whether its `VmFlags`
/// hold `hg` (advised `MADV_HUGEPAGE`).
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub huge: u64,
    pub advised: bool,
}

/// The VMAs of `pid`, in address order.
pub fn read(pid: i32) -> Vec<Vma> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                out.push(Vma {
                    start,
                    end,
                    huge: 0,
                    advised: false,
                });
                continue;
            }
        }
        let Some(v) = out.last_mut() else { continue };
        if let Some(kb) = line.strip_prefix("AnonHugePages:") {
            v.huge = kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            v.advised = flags.split_whitespace().any(|f| f == "hg");
        }
    }
    out
}
