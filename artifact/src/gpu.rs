//! A GPU's identity (`Gpu`: model name, UUID, driver version): read from
//! nvidia-smi's one query ([`NVIDIA_SMI_ARGS`]) by the one parser
//! ([`parse_nvidia_smi`]) the shim and the hooks share, and written into a
//! manifest's `host.gpus` as its `name uuid driver` entry ([`fmt::Display`],
//! [`FromStr`]; [`entries`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What nvidia-smi is asked for: one `name, uuid, driver_version` CSV line
/// per GPU.
pub const NVIDIA_SMI_ARGS: [&str; 2] = [
    "--query-gpu=name,uuid,driver_version",
    "--format=csv,noheader",
];

/// One GPU as nvidia-smi names it. Valid ([`Gpu::new`]): a name without
/// surrounding whitespace, a `GPU-` UUID and a driver version with a numeric
/// major, neither of the last two holding whitespace, so that its
/// `name uuid driver` entry reads back as the same GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// e.g. `NVIDIA H200`.
    pub name: String,
    /// e.g. `GPU-5f1c...`.
    pub uuid: String,
    /// The driver version, e.g. `570.124.06`.
    pub driver: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// A line of nvidia-smi's answer that names no GPU.
    #[error("nvidia-smi output line {line:?} is not `name, uuid, driver_version`")]
    Row { line: String },
    /// nvidia-smi answered without a single GPU.
    #[error("nvidia-smi lists no GPU")]
    NoGpu,
    /// A manifest entry that is not a GPU's `name uuid driver`.
    #[error("GPU entry {entry:?} is not `name uuid driver`")]
    Entry { entry: String },
}

impl Gpu {
    /// The GPU these fields name, when they are a valid one (see [`Gpu`]).
    pub fn new(name: &str, uuid: &str, driver: &str) -> Option<Gpu> {
        let has_space = |s: &str| s.chars().any(char::is_whitespace);
        let valid = !name.is_empty()
            && name.trim() == name
            && uuid.starts_with("GPU-")
            && !has_space(uuid)
            && !has_space(driver)
            && driver_major(driver).is_some();
        valid.then(|| Gpu {
            name: name.to_string(),
            uuid: uuid.to_string(),
            driver: driver.to_string(),
        })
    }

    /// What the GPU is (model and driver), not which one it is: what a
    /// restore on another GPU of the host must match.
    pub fn model_and_driver(&self) -> String {
        format!("{} {}", self.name, self.driver)
    }
}

/// The manifest's entry: `name uuid driver`.
impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.name, self.uuid, self.driver)
    }
}

/// Reads a manifest's `name uuid driver` entry back: the name holds spaces,
/// the UUID and the driver are the last two words.
impl FromStr for Gpu {
    type Err = GpuError;

    fn from_str(entry: &str) -> Result<Gpu, GpuError> {
        let mut words = entry.rsplitn(3, ' ');
        let (Some(driver), Some(uuid), Some(name)) = (words.next(), words.next(), words.next())
        else {
            return Err(GpuError::Entry {
                entry: entry.to_string(),
            });
        };
        Gpu::new(name, uuid, driver).ok_or_else(|| GpuError::Entry {
            entry: entry.to_string(),
        })
    }
}

/// Parses nvidia-smi's answer to [`NVIDIA_SMI_ARGS`]: `name, uuid,
/// driver_version` lines (empty lines ignored; the name is everything before
/// the last two commas, so it may hold commas). Every line must be a valid
/// [`Gpu`], and there must be one.
pub fn parse_nvidia_smi(output: &str) -> Result<Vec<Gpu>, GpuError> {
    let mut gpus = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut fields = line.rsplitn(3, ',').map(str::trim);
        let gpu = match (fields.next(), fields.next(), fields.next()) {
            (Some(driver), Some(uuid), Some(name)) => Gpu::new(name, uuid, driver),
            _ => None,
        };
        gpus.push(gpu.ok_or_else(|| GpuError::Row {
            line: line.to_string(),
        })?);
    }
    if gpus.is_empty() {
        return Err(GpuError::NoGpu);
    }
    Ok(gpus)
}

/// The major version of a driver version string: `570` for `570.124.06`.
pub fn driver_major(version: &str) -> Option<u32> {
    let major = version.split('.').next()?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    major.parse().ok()
}

/// The manifest's `host.gpus` entries of `gpus`, in order.
pub fn entries(gpus: &[Gpu]) -> Vec<String> {
    gpus.iter().map(Gpu::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200(uuid: &str) -> Gpu {
        Gpu {
            name: "NVIDIA H200".into(),
            uuid: uuid.into(),
            driver: "570.124.06".into(),
        }
    }

    #[test]
    fn good_rows_are_every_gpu_in_order() {
        let out = "NVIDIA H200, GPU-aaaaaaaa-0000-1111-2222-333344445555, 570.124.06\n\
                   \n\
                   NVIDIA H200, GPU-bbbbbbbb-0000-1111-2222-333344445555, 570.124.06\n";
        assert_eq!(
            parse_nvidia_smi(out).unwrap(),
            [
                h200("GPU-aaaaaaaa-0000-1111-2222-333344445555"),
                h200("GPU-bbbbbbbb-0000-1111-2222-333344445555"),
            ]
        );
        // The name is everything before the last two commas, trimmed.
        let acme = parse_nvidia_smi(" Acme, Model 9, GPU-1, 575.51.03 \n\n").unwrap();
        assert_eq!(
            acme,
            [Gpu {
                name: "Acme, Model 9".into(),
                uuid: "GPU-1".into(),
                driver: "575.51.03".into(),
            }]
        );
    }

    #[test]
    fn a_malformed_row_is_refused_naming_it() {
        for line in [
            "No devices were found",
            "NVIDIA H200, 570.124.06",
            "NVIDIA H200, GPU-1, [N/A]",
            "NVIDIA H200, 5f1c2a3b, 570.124.06",
            ", GPU-1, 570.124.06",
            "NVIDIA H200, GPU-1 x, 570.124.06",
        ] {
            let out = format!("NVIDIA H200, GPU-1, 570.124.06\n{line}\n");
            assert_eq!(
                parse_nvidia_smi(&out),
                Err(GpuError::Row {
                    line: line.to_string()
                }),
                "{line}"
            );
        }
        assert_eq!(
            GpuError::Row {
                line: "No devices were found".into()
            }
            .to_string(),
            "nvidia-smi output line \"No devices were found\" is not `name, uuid, driver_version`"
        );
    }

    #[test]
    fn an_empty_answer_lists_no_gpu() {
        assert_eq!(parse_nvidia_smi(""), Err(GpuError::NoGpu));
        assert_eq!(parse_nvidia_smi("\n  \n"), Err(GpuError::NoGpu));
        assert_eq!(GpuError::NoGpu.to_string(), "nvidia-smi lists no GPU");
    }

    #[test]
    fn an_entry_reads_back_as_its_gpu() {
        let gpus = parse_nvidia_smi(
            "NVIDIA H100 80GB HBM3, GPU-5f1c2a3b-0000-1111-2222-333344445555, 570.124.06\n\
             Acme, Model 9, GPU-1, 575.51.03",
        )
        .unwrap();
        assert_eq!(
            entries(&gpus),
            [
                "NVIDIA H100 80GB HBM3 GPU-5f1c2a3b-0000-1111-2222-333344445555 570.124.06",
                "Acme, Model 9 GPU-1 575.51.03",
            ]
        );
        for gpu in &gpus {
            assert_eq!(gpu.to_string().parse::<Gpu>().as_ref(), Ok(gpu));
        }
        assert_eq!(
            gpus[0].model_and_driver(),
            "NVIDIA H100 80GB HBM3 570.124.06"
        );
        for entry in [
            "x",
            "NVIDIA H200 570.124.06",
            "NVIDIA H200 aaaa 570.124.06",
            " GPU-1 570",
        ] {
            assert_eq!(
                entry.parse::<Gpu>(),
                Err(GpuError::Entry {
                    entry: entry.to_string()
                }),
                "{entry}"
            );
        }
    }

    #[test]
    fn driver_majors_are_numeric() {
        assert_eq!(driver_major("575.51.03"), Some(575));
        assert_eq!(driver_major("570"), Some(570));
        assert_eq!(driver_major("[N/A]"), None);
        assert_eq!(driver_major(""), None);
        assert_eq!(driver_major(".1"), None);
    }
}
