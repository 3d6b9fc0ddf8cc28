//! How much memory this process may use: the machine's, or less where a cgroup limits it.
//! What the token loader sizes itself by (huge pages for maps that fit, batches that fit).

/// The memory this process may use: the machine's (`MemTotal`), or less where a memory limit
/// of its cgroup or of one above it (a job's, a slice's; v2 `memory.max`, v1
/// `memory.limit_in_bytes`) says so. `None` where none can be read.
pub(crate) fn memory_bytes() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| meminfo_total(&m));
    let limit = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| {
        cgroup_limit_files(&c)
            .into_iter()
            .filter_map(|f| std::fs::read_to_string(f).ok().and_then(|v| v.trim().parse::<u64>().ok()))
            .min()
    });
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
fn meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The files that may hold a memory limit on the cgroup a `/proc/self/cgroup` names (v2's
/// unified line `0::PATH`, v1's memory controller's `N:memory:PATH`), under the usual mount:
/// its own and every one above it up to the mount's root (which is also where a container
/// that sees the host's path finds its own).
fn cgroup_limit_files(cgroup: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (mount, name) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = std::path::Path::new(mount).join(path.trim_start_matches('/'));
        loop {
            files.push(dir.join(name));
            if dir == std::path::Path::new(mount) || !dir.pop() {
                break;
            }
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_the_machines_or_a_cgroup_limit_above_this_process() {
        let meminfo = "MemTotal:       24683792 kB\nMemFree:        1000 kB\n";
        assert_eq!(meminfo_total(meminfo), Some(24_683_792 * 1024));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(meminfo_total("MemTotal: lots kB\n"), None);
        // v1's memory controller and v2's unified hierarchy, as /proc/self/cgroup lists them:
        // its own cgroup's limit and every one above it (a job's, a slice's), up to the root.
        let paths = |v: Vec<std::path::PathBuf>| v.into_iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
        let v1 = "9:name=systemd:/\n4:memory:/jobs/a1\n1:cpu:/\n";
        assert_eq!(
            paths(cgroup_limit_files(v1)),
            [
                "/sys/fs/cgroup/memory/jobs/a1/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            ]
        );
        assert_eq!(
            paths(cgroup_limit_files("0::/user.slice/x\n")),
            [
                "/sys/fs/cgroup/user.slice/x/memory.max",
                "/sys/fs/cgroup/user.slice/memory.max",
                "/sys/fs/cgroup/memory.max",
            ]
        );
        assert_eq!(paths(cgroup_limit_files("0::/\n")), ["/sys/fs/cgroup/memory.max"]);
        assert!(cgroup_limit_files("garbage\n1:cpu,cpuacct:/\n").is_empty());
        // The process's own reading gives some memory on Linux, and never panics.
        #[cfg(target_os = "linux")]
        assert!(memory_bytes().is_some_and(|m| m > 0));
    }
}
