//! One node's hardware as a record: CPUs and NUMA nodes, PCI devices and
//! NICs, GPUs with their P2P matrix. Read from sysfs (and NVML for GPUs), or
//! loaded from a JSON fixture, so tests can stand in for machines we lack.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::node::NodeIdentity;

/// A node's hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopologyRecord {
    /// Node identity (see [`NodeIdentity`]).
    pub node_id: String,
    /// Host name.
    pub hostname: String,
    /// Where the record came from: `sysfs`, `hwloc` or `fixture`.
    pub source: String,
    /// Packages, cores and hardware threads.
    pub cpu: CpuSummary,
    /// NUMA nodes.
    pub numa: Vec<NumaNode>,
    /// PCI devices.
    pub pci: Vec<PciDevice>,
    /// Network interfaces backed by a device.
    pub nics: Vec<Nic>,
    /// GPUs, by NVML index.
    pub gpus: Vec<Gpu>,
    /// `p2p[i][j]`: what GPU `i` can do to GPU `j` (the diagonal is unused).
    pub p2p: Vec<Vec<P2p>>,
    /// Why no GPUs were found, when none were.
    pub gpu_note: Option<String>,
}

/// Counts of the CPU hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSummary {
    /// Sockets.
    pub packages: usize,
    /// Physical cores.
    pub cores: usize,
    /// Hardware threads.
    pub pus: usize,
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// Its number.
    pub id: u32,
    /// Its CPUs, as a Linux CPU list (`0-7,16-23`).
    pub cpus: String,
    /// Its memory.
    pub memory_bytes: u64,
}

/// One PCI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDevice {
    /// Bus id, `0000:17:00.0`.
    pub bus_id: String,
    /// Class code (`0x0302xx` for a 3D controller, `0x0200xx` Ethernet, `0x0207xx` InfiniBand).
    pub class: u32,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// NUMA node, when the platform says.
    pub numa_node: Option<u32>,
    /// The CPUs near it (CPU list).
    pub local_cpus: String,
    /// Its path in the PCI tree (`pci0000:00/0000:00:03.0/...`): devices with
    /// a longer common prefix are closer.
    pub path: String,
}

/// A network interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// Interface name (`eth0`, `mlx5_0`).
    pub name: String,
    /// The PCI device behind it.
    pub pci_bus_id: Option<String>,
    /// Its NUMA node.
    pub numa_node: Option<u32>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// Memory.
    pub memory_bytes: u64,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// CPUs it prefers (CPU list).
    pub cpu_affinity: String,
    /// Active NVLinks.
    pub nvlinks_active: u32,
    /// The NIC nearest to it in the PCI tree.
    pub nearest_nic: Option<String>,
}

/// What one GPU can do to another.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2p {
    /// Peer reads work.
    pub read: bool,
    /// Peer writes work.
    pub write: bool,
    /// Over NVLink.
    pub nvlink: bool,
    /// Peer atomics work.
    pub atomics: bool,
    /// The path between them: `NVLINK`, `PIX` (one PCIe switch), `PXB`
    /// (several), `PHB` (host bridge), `NODE` (same NUMA node), `SYS`
    /// (across the CPU interconnect).
    pub path: String,
}

impl P2p {
    /// Whether one GPU can map the other's memory (read and write).
    pub fn mappable(&self) -> bool {
        self.read && self.write
    }

    /// The path in words, for reasons.
    pub fn path_words(&self) -> &'static str {
        match self.path.as_str() {
            "NVLINK" => "connected by NVLink",
            "PIX" => "behind one PCIe switch",
            "PXB" => "behind several PCIe switches",
            "PHB" => "behind one host bridge",
            "NODE" => "path crosses host bridges within a NUMA node",
            "SYS" => "path crosses the CPU interconnect",
            _ => "path unknown",
        }
    }
}

impl TopologyRecord {
    /// Reads this machine: sysfs for CPUs, NUMA, PCI and NICs; NVML (loaded
    /// at run time) for GPUs. Never fails: what cannot be read is left
    /// empty, and `gpu_note` says why there are no GPUs.
    pub fn discover() -> Self {
        let node = NodeIdentity::discover();
        #[cfg(feature = "hwloc")]
        if let Some(mut r) = hwloc::read() {
            let (mut gpus, p2p, gpu_note) = nvml::gpus();
            for g in &mut gpus {
                g.nearest_nic = nearest_nic(&g.pci_bus_id, g.numa_node, &r.pci, &r.nics);
            }
            r.node_id = node.id().to_owned();
            r.hostname = node.hostname().to_owned();
            (r.gpus, r.p2p, r.gpu_note) = (gpus, p2p, gpu_note);
            return r;
        }
        let pci = sysfs::pci_devices();
        let nics = sysfs::nics();
        let (mut gpus, p2p, gpu_note) = nvml::gpus();
        for g in &mut gpus {
            g.nearest_nic = nearest_nic(&g.pci_bus_id, g.numa_node, &pci, &nics);
        }
        Self {
            node_id: node.id().to_owned(),
            hostname: node.hostname().to_owned(),
            source: "sysfs".to_owned(),
            cpu: sysfs::cpu_summary(),
            numa: sysfs::numa_nodes(),
            pci,
            nics,
            gpus,
            p2p,
            gpu_note,
        }
    }

    /// The record as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a record always serialises")
    }

    /// A record from JSON (a fixture, or another rank's).
    ///
    /// # Errors
    /// The parser's message when the text is not a record.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// A record from a JSON file.
    ///
    /// # Errors
    /// A message naming the file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The NIC whose PCI path shares the longest prefix with the GPU's (ties go
/// to one on the GPU's NUMA node).
pub fn nearest_nic(gpu_bus: &str, gpu_numa: Option<u32>, pci: &[PciDevice], nics: &[Nic]) -> Option<String> {
    let path_of = |bus: &str| pci.iter().find(|d| d.bus_id.eq_ignore_ascii_case(bus)).map(|d| d.path.as_str());
    let gpu_path = path_of(gpu_bus).unwrap_or("");
    let common = |a: &str, b: &str| a.split('/').zip(b.split('/')).take_while(|(x, y)| x == y).count();
    nics.iter()
        .filter_map(|n| {
            let p = path_of(n.pci_bus_id.as_deref()?)?;
            Some((common(gpu_path, p), n.numa_node == gpu_numa && gpu_numa.is_some(), &n.name))
        })
        .max_by_key(|&(c, same_numa, _)| (c, same_numa))
        .map(|(_, _, name)| name.clone())
}

#[cfg(feature = "hwloc")]
mod hwloc {
    //! CPUs, NUMA nodes and PCI devices through hwloc (hwlocality).
    use super::*;
    use hwlocality::Topology;
    use hwlocality::object::attributes::ObjectAttributes;
    use hwlocality::object::types::ObjectType;
    use hwlocality::topology::builder::TypeFilter;

    /// hwloc prints a CPU set as `CpuSet(0-3)`; records hold the list alone.
    fn cpu_list(s: String) -> String {
        s.strip_prefix("CpuSet(").and_then(|x| x.strip_suffix(')')).map_or(s.clone(), str::to_owned)
    }

    /// `None` when hwloc cannot build a topology (the caller falls back to sysfs).
    pub(super) fn read() -> Option<TopologyRecord> {
        let topo = Topology::builder().with_io_type_filter(TypeFilter::KeepAll).ok()?.build().ok()?;
        let count = |t| topo.objects_with_type(t).count();
        let cpu = CpuSummary { packages: count(ObjectType::Package), cores: count(ObjectType::Core), pus: count(ObjectType::PU) };
        let numa = topo
            .objects_with_type(ObjectType::NUMANode)
            .map(|n| NumaNode {
                id: n.os_index().unwrap_or(0) as u32,
                cpus: n.cpuset().map(|c| cpu_list(c.to_string())).unwrap_or_default(),
                memory_bytes: n.total_memory(),
            })
            .collect();
        let mut pci: Vec<PciDevice> = topo
            .pci_devices()
            .filter_map(|d| {
                let Some(ObjectAttributes::PCIDevice(a)) = d.attributes() else { return None };
                let bus_id = format!("{:04x}:{:02x}:{:02x}.{:x}", a.domain(), a.bus_id(), a.bus_device(), a.function());
                let local = d.first_non_io_ancestor();
                Some(PciDevice {
                    class: u32::from(a.class_id()) << 8,
                    vendor: a.vendor_id(),
                    device: a.device_id(),
                    numa_node: None,
                    local_cpus: local.and_then(|o| o.cpuset()).map(|c| cpu_list(c.to_string())).unwrap_or_default(),
                    path: sysfs::pci_path(&bus_id),
                    bus_id,
                })
            })
            .collect();
        pci.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        // hwloc gives no NUMA node per device; sysfs does.
        for d in &mut pci {
            d.numa_node = sysfs::pci_numa(&d.bus_id);
        }
        Some(TopologyRecord {
            node_id: String::new(),
            hostname: String::new(),
            source: "hwloc".to_owned(),
            cpu,
            numa,
            pci,
            nics: sysfs::nics(),
            gpus: Vec::new(),
            p2p: Vec::new(),
            gpu_note: None,
        })
    }
}

mod sysfs {
    //! Plain sysfs readers: the fallback when hwloc is not compiled in.
    use super::*;
    use std::collections::BTreeSet;

    /// A device's path in the PCI tree.
    #[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
    pub(super) fn pci_path(bus_id: &str) -> String {
        std::fs::canonicalize(Path::new("/sys/bus/pci/devices").join(bus_id))
            .map(|c| c.to_string_lossy().trim_start_matches("/sys/devices/").to_owned())
            .unwrap_or_else(|_| bus_id.to_owned())
    }

    /// A device's NUMA node.
    #[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
    pub(super) fn pci_numa(bus_id: &str) -> Option<u32> {
        read(Path::new("/sys/bus/pci/devices").join(bus_id).join("numa_node"))
            .and_then(|n| n.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok())
    }

    fn read(p: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
    }

    fn hex<T: TryFrom<u64>>(s: Option<String>) -> Option<T> {
        let s = s?;
        u64::from_str_radix(s.trim_start_matches("0x"), 16).ok().and_then(|v| T::try_from(v).ok())
    }

    pub(super) fn cpu_summary() -> CpuSummary {
        let mut packages = BTreeSet::new();
        let mut cores = BTreeSet::new();
        let mut pus = 0;
        if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
                    continue;
                }
                pus += 1;
                let t = e.path().join("topology");
                let pkg = read(t.join("physical_package_id")).unwrap_or_default();
                let core = read(t.join("core_id")).unwrap_or_else(|| name.clone());
                packages.insert(pkg.clone());
                cores.insert((pkg, core));
            }
        }
        CpuSummary { packages: packages.len(), cores: cores.len(), pus }
    }

    pub(super) fn numa_nodes() -> Vec<NumaNode> {
        let mut out = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
                let memory_bytes = read(e.path().join("meminfo"))
                    .and_then(|m| {
                        m.lines().find(|l| l.contains("MemTotal:")).and_then(|l| l.split_whitespace().rev().nth(1)?.parse::<u64>().ok())
                    })
                    .map_or(0, |kb| kb * 1024);
                out.push(NumaNode { id, cpus: read(e.path().join("cpulist")).unwrap_or_default(), memory_bytes });
            }
        }
        out.sort_by_key(|n| n.id);
        out
    }

    pub(super) fn pci_devices() -> Vec<PciDevice> {
        let mut out = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/sys/bus/pci/devices") {
            for e in dir.flatten() {
                let p = e.path();
                let bus_id = e.file_name().to_string_lossy().into_owned();
                let path = pci_path(&bus_id);
                out.push(PciDevice {
                    class: hex(read(p.join("class"))).unwrap_or(0),
                    vendor: hex(read(p.join("vendor"))).unwrap_or(0),
                    device: hex(read(p.join("device"))).unwrap_or(0),
                    numa_node: pci_numa(&bus_id),
                    local_cpus: read(p.join("local_cpulist")).unwrap_or_default(),
                    path,
                    bus_id,
                });
            }
        }
        out.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        out
    }

    pub(super) fn nics() -> Vec<Nic> {
        let mut out = Vec::new();
        for class in ["/sys/class/net", "/sys/class/infiniband"] {
            let Ok(dir) = std::fs::read_dir(class) else { continue };
            for e in dir.flatten() {
                let dev = e.path().join("device");
                let Ok(target) = std::fs::canonicalize(&dev) else { continue };
                let bus = target.file_name().map(|f| f.to_string_lossy().into_owned());
                let numa_node = read(dev.join("numa_node")).and_then(|n| n.parse::<i64>().ok()).and_then(|n| u32::try_from(n).ok());
                out.push(Nic {
                    name: e.file_name().to_string_lossy().into_owned(),
                    pci_bus_id: bus.filter(|b| b.contains(':')),
                    numa_node,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

mod nvml {
    //! GPUs through NVML, loaded at run time: no driver means no GPUs and a
    //! note saying so, never a panic.
    use super::*;
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};

    fn cpu_list(mask: &[std::os::raw::c_ulong]) -> String {
        let bits = std::mem::size_of::<std::os::raw::c_ulong>() * 8;
        let cpus: Vec<usize> = (0..mask.len() * bits).filter(|&i| mask[i / bits] >> (i % bits) & 1 == 1).collect();
        let mut parts = Vec::new();
        let mut i = 0;
        while i < cpus.len() {
            let mut j = i;
            while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
                j += 1;
            }
            parts.push(if i == j { cpus[i].to_string() } else { format!("{}-{}", cpus[i], cpus[j]) });
            i = j + 1;
        }
        parts.join(",")
    }

    pub(super) fn gpus() -> (Vec<Gpu>, Vec<Vec<P2p>>, Option<String>) {
        let nvml = match Nvml::init() {
            Ok(n) => n,
            Err(e) => return (Vec::new(), Vec::new(), Some(format!("no NVIDIA driver found (NVML: {e})"))),
        };
        let count = match nvml.device_count() {
            Ok(0) => return (Vec::new(), Vec::new(), Some("the NVIDIA driver reports no GPUs".to_owned())),
            Ok(c) => c,
            Err(e) => return (Vec::new(), Vec::new(), Some(format!("NVML cannot count GPUs: {e}"))),
        };
        let devices: Vec<_> = (0..count).filter_map(|i| nvml.device_by_index(i).ok().map(|d| (i, d))).collect();
        let gpus = devices
            .iter()
            .map(|(i, d)| Gpu {
                index: *i,
                name: d.name().unwrap_or_default(),
                memory_bytes: d.memory_info().map_or(0, |m| m.total),
                pci_bus_id: d.pci_info().map(|p| p.bus_id.to_ascii_lowercase()).unwrap_or_default(),
                numa_node: d.numa_node_id().ok(),
                cpu_affinity: d.cpu_affinity(16).map(|m| cpu_list(&m)).unwrap_or_default(),
                nvlinks_active: (0..18).filter(|&l| d.link_wrapper_for(l).is_active().unwrap_or(false)).count() as u32,
                nearest_nic: None,
            })
            .collect();
        let ok = |a: &nvml_wrapper::Device<'_>, b: &nvml_wrapper::Device<'_>, what| matches!(a.p2p_status(b, what), Ok(P2pStatus::Ok));
        let p2p = devices
            .iter()
            .map(|(i, a)| {
                devices
                    .iter()
                    .map(|(j, b)| {
                        if i == j {
                            return P2p::default();
                        }
                        let nvlink = ok(a, b, P2pCapabilitiesIndex::NvLink);
                        let path = if nvlink {
                            "NVLINK"
                        } else {
                            match nvml.device_by_index(*j).ok().and_then(|b2| a.topology_common_ancestor(b2).ok()) {
                                Some(TopologyLevel::Internal | TopologyLevel::Single) => "PIX",
                                Some(TopologyLevel::Multiple) => "PXB",
                                Some(TopologyLevel::HostBridge) => "PHB",
                                Some(TopologyLevel::Node) => "NODE",
                                Some(TopologyLevel::System) => "SYS",
                                None => "",
                            }
                        };
                        P2p {
                            read: ok(a, b, P2pCapabilitiesIndex::Read),
                            write: ok(a, b, P2pCapabilitiesIndex::Write),
                            nvlink,
                            atomics: ok(a, b, P2pCapabilitiesIndex::Atomics),
                            path: path.to_owned(),
                        }
                    })
                    .collect()
            })
            .collect();
        (gpus, p2p, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_round_trips_through_json() {
        let r = TopologyRecord::discover();
        assert!(r.cpu.pus >= 1, "{r:?}");
        if r.gpus.is_empty() {
            assert!(r.gpu_note.is_some(), "no GPUs and no reason");
        }
        assert_eq!(r.source, if cfg!(feature = "hwloc") { "hwloc" } else { "sysfs" });
        assert_eq!(r.numa.is_empty(), std::fs::read_dir("/sys/devices/system/node").is_err());
        assert_eq!(TopologyRecord::from_json(&r.to_json()).unwrap(), r);
    }

    #[cfg(feature = "hwloc")]
    #[test]
    fn hwloc_and_sysfs_agree_on_this_machine() {
        let h = hwloc::read().expect("hwloc builds a topology");
        assert_eq!(h.cpu, sysfs::cpu_summary());
        assert_eq!(h.numa, sysfs::numa_nodes());
        let buses = |v: &[PciDevice]| v.iter().map(|d| (d.bus_id.clone(), d.vendor, d.device, d.path.clone())).collect::<Vec<_>>();
        assert_eq!(buses(&h.pci), buses(&sysfs::pci_devices()));
    }

    #[test]
    fn the_nearest_nic_shares_the_longest_pci_path() {
        let dev = |bus: &str, path: &str| PciDevice {
            bus_id: bus.into(),
            class: 0,
            vendor: 0,
            device: 0,
            numa_node: None,
            local_cpus: String::new(),
            path: path.into(),
        };
        let pci = vec![
            dev("0000:17:00.0", "pci0000:16/0000:16:01.0/0000:17:00.0"),
            dev("0000:18:00.0", "pci0000:16/0000:16:01.0/0000:18:00.0"),
            dev("0000:98:00.0", "pci0000:97/0000:97:01.0/0000:98:00.0"),
        ];
        let nics = vec![
            Nic { name: "far".into(), pci_bus_id: Some("0000:98:00.0".into()), numa_node: Some(1) },
            Nic { name: "near".into(), pci_bus_id: Some("0000:18:00.0".into()), numa_node: Some(0) },
        ];
        assert_eq!(nearest_nic("0000:17:00.0", Some(0), &pci, &nics).as_deref(), Some("near"));
    }
}
