//! Which of a container's processes hold NVIDIA devices open (from
//! `/proc/PID/fd`), and the refusal of a tree that uses more than one GPU.

use std::path::Path;

use super::devices::{gpu_device_index, is_nvidia_path};
use super::error::CudaError;
use vsnap_host::fds::open_fds_under;

/// The processes of `pids` that hold `/dev/nvidia*` files open (read from
/// `/proc/PID/fd`), each with its sorted device paths as the process sees
/// them. Processes that exited meanwhile or hold none are left out.
pub fn cuda_holders(pids: &[i32]) -> Vec<(i32, Vec<String>)> {
    holders_in(Path::new("/proc"), pids)
}

fn holders_in(proc_root: &Path, pids: &[i32]) -> Vec<(i32, Vec<String>)> {
    let mut out = Vec::new();
    for &pid in pids {
        let mut devices: Vec<String> = open_fds_under(proc_root, pid)
            .into_iter()
            .filter_map(|f| {
                let target = f.target.to_str()?;
                is_nvidia_path(target).then(|| target.to_string())
            })
            .collect();
        if devices.is_empty() {
            continue;
        }
        devices.sort();
        devices.dedup();
        out.push((pid, devices));
    }
    out
}

/// Refuses a tree whose processes, together, hold more than one GPU device
/// (`/dev/nvidiaN`), naming each process and the devices it holds.
pub fn check_single_gpu(holders: &[(i32, Vec<String>)]) -> Result<(), CudaError> {
    let mut gpus: Vec<String> = holders
        .iter()
        .flat_map(|(_, devs)| devs.iter())
        .filter(|d| gpu_device_index(d).is_some())
        .cloned()
        .collect();
    gpus.sort_by_key(|d| gpu_device_index(d));
    gpus.dedup();
    if gpus.len() <= 1 {
        return Ok(());
    }
    let holders = holders
        .iter()
        .filter_map(|(pid, devs)| {
            let own: Vec<String> = devs
                .iter()
                .filter(|d| gpu_device_index(d).is_some())
                .cloned()
                .collect();
            (!own.is_empty()).then_some((*pid, own))
        })
        .collect();
    Err(CudaError::MultipleGpus {
        devices: gpus,
        holders,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn holders_are_read_from_proc_fd_links() {
        let me = std::process::id() as i32;
        assert!(cuda_holders(&[me, i32::MAX]).is_empty());

        // A fake /proc: fd links as the kernel shows them.
        let proc = tempfile::tempdir().unwrap();
        let links: [(i32, &[(&str, &str)]); 3] = [
            (
                41,
                &[
                    ("0", "/dev/null"),
                    ("3", "/dev/nvidiactl"),
                    ("4", "/dev/nvidia0"),
                    ("5", "/dev/nvidia-uvm"),
                    ("6", "/dev/nvidia0"),
                ],
            ),
            (42, &[("1", "pipe:[1234]"), ("7", "socket:[99]")]),
            (43, &[("9", "/dev/nvidia1")]),
        ];
        for (pid, fds) in links {
            let dir = proc.path().join(pid.to_string()).join("fd");
            fs::create_dir_all(&dir).unwrap();
            for (fd, target) in fds {
                std::os::unix::fs::symlink(target, dir.join(fd)).unwrap();
            }
        }
        let holders = holders_in(proc.path(), &[41, 42, 43, 44]);
        assert_eq!(
            holders,
            [
                (
                    41,
                    vec![
                        "/dev/nvidia-uvm".to_string(),
                        "/dev/nvidia0".into(),
                        "/dev/nvidiactl".into()
                    ]
                ),
                (43, vec!["/dev/nvidia1".to_string()]),
            ]
        );
        assert!(matches!(
            check_single_gpu(&holders),
            Err(CudaError::MultipleGpus { .. })
        ));
    }

    #[test]
    fn one_gpu_per_tree() {
        let ok = vec![
            (
                10,
                vec![
                    "/dev/nvidia-uvm".to_string(),
                    "/dev/nvidia0".into(),
                    "/dev/nvidiactl".into(),
                ],
            ),
            (11, vec!["/dev/nvidia0".into(), "/dev/nvidiactl".into()]),
            (12, vec!["/dev/nvidiactl".into()]),
        ];
        check_single_gpu(&ok).unwrap();
        check_single_gpu(&[]).unwrap();

        let two = vec![
            (
                10,
                vec!["/dev/nvidia0".to_string(), "/dev/nvidiactl".into()],
            ),
            (11, vec!["/dev/nvidia1".into(), "/dev/nvidia-uvm".into()]),
            (12, vec!["/dev/nvidiactl".into()]),
        ];
        let e = check_single_gpu(&two).unwrap_err();
        assert_eq!(
            e.to_string(),
            "preflight: the container's processes use more than one GPU (/dev/nvidia0, /dev/nvidia1): pid 10 holds /dev/nvidia0; pid 11 holds /dev/nvidia1; vsnap captures single-GPU engines only (cuda-checkpoint does not support multi-process NCCL)"
        );
        assert_eq!(gpu_device_index("/dev/nvidia10"), Some(10));
        assert_eq!(gpu_device_index("/dev/nvidiactl"), None);
        assert_eq!(gpu_device_index("/dev/nvidia"), None);
    }
}
